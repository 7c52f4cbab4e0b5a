//! `containerd-shim-crab-v2 -info`: what this runtime supports, for containerd's
//! introspection.
//!
//! containerd runs a shim binary with `-info`, the runtime's options (a protobuf
//! `Any`) on stdin, and reads a `containerd.types.RuntimeInfo` from its stdout.
//! containerd 2.x asks before it creates a task whose spec has idmapped mounts,
//! and refuses the task when the runtime does not report them; its CRI plugin turns
//! the answer into the handler's features that kubelet reads (recursive read-only
//! mounts; user namespaces, which kubelet requires with idmapped mounts for a
//! `hostUsers: false` pod). The features are the OCI runtime-spec's `features.md`
//! document as JSON, under the type URL containerd registers for it.
//!
//! Every entry is what the crab runtime does, not what the spec allows: the mount
//! options are the ones libcontainer 0.7 applies, and `idmap` / `ridmap`, which
//! libcontainer parses but does not apply: the runtime makes idmapped mounts
//! itself before libcontainer runs (`crab_runtime::userns::idmapped_mounts`).

use containerd_shim::protos::protobuf::well_known_types::any::Any;
use containerd_shim::protos::protobuf::Message;
use containerd_shim::protos::types::introspection::{RuntimeInfo, RuntimeVersion};

/// The type URL containerd registers for runtime-spec's `features.Features`.
pub const FEATURES_TYPE_URL: &str =
    "types.containerd.io/opencontainers/runtime-spec/1/features/Features";

/// The mount options the runtime applies: libcontainer 0.7's mount flags, the
/// recursive attributes it sets with `mount_setattr`, then the idmapped mounts
/// the runtime makes itself.
const MOUNT_OPTIONS: &[&str] = &[
    "async",
    "atime",
    "bind",
    "defaults",
    "dev",
    "diratime",
    "dirsync",
    "exec",
    "mand",
    "noatime",
    "nodev",
    "nodiratime",
    "noexec",
    "nomand",
    "norelatime",
    "nostrictatime",
    "nosuid",
    "private",
    "rbind",
    "relatime",
    "remount",
    "ro",
    "rprivate",
    "rshared",
    "rslave",
    "runbindable",
    "rw",
    "shared",
    "slave",
    "strictatime",
    "suid",
    "sync",
    "unbindable",
    "ratime",
    "rdev",
    "rdiratime",
    "rexec",
    "rnoatime",
    "rnodev",
    "rnodiratime",
    "rnoexec",
    "rnorelatime",
    "rnostrictatime",
    "rnosuid",
    "rnosymfollow",
    "rrelatime",
    "rro",
    "rrw",
    "rstrictatime",
    "rsuid",
    "rsymfollow",
    "idmap",
    "ridmap",
];

/// The features document (runtime-spec `features.md`).
pub fn features() -> serde_json::Value {
    serde_json::json!({
        "ociVersionMin": "1.0.0",
        "ociVersionMax": "1.2.0",
        "hooks": ["prestart", "createRuntime", "createContainer", "startContainer",
                  "poststart", "poststop"],
        "mountOptions": MOUNT_OPTIONS,
        "linux": {
            "namespaces": ["cgroup", "ipc", "mount", "network", "pid", "time", "user", "uts"],
            "cgroup": {"v1": true, "v2": true, "systemd": true, "systemdUser": false},
            "seccomp": {"enabled": true},
            "apparmor": {"enabled": false},
            "selinux": {"enabled": false},
            "mountExtensions": {"idmap": {"enabled": true}},
        },
    })
}

/// The answer to `-info`, given the runtime options containerd wrote on stdin
/// (echoed back, as runc's shim does).
pub fn runtime_info(options: &[u8]) -> RuntimeInfo {
    let mut info = RuntimeInfo::new();
    info.name = crate::RUNTIME_ID.to_string();
    let mut version = RuntimeVersion::new();
    version.version = env!("CARGO_PKG_VERSION").to_string();
    info.version = Some(version).into();
    if !options.is_empty() {
        if let Ok(any) = Any::parse_from_bytes(options) {
            info.options = Some(any).into();
        }
    }
    let mut doc = Any::new();
    doc.type_url = FEATURES_TYPE_URL.to_string();
    doc.value = serde_json::to_vec(&features()).expect("a JSON value serializes");
    info.features = Some(doc).into();
    info
}

/// Runs `-info`: reads the options from stdin, writes the answer to stdout.
pub fn main() -> ! {
    use std::io::{Read, Write};
    let mut options = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut options);
    let bytes = runtime_info(&options)
        .write_to_bytes()
        .expect("a RuntimeInfo encodes");
    let mut out = std::io::stdout().lock();
    let code = if out.write_all(&bytes).and_then(|()| out.flush()).is_ok() {
        0
    } else {
        1
    };
    std::process::exit(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_the_features_parse_as_the_runtime_specs_document() {
        let info = runtime_info(&[]);
        let bytes = info.write_to_bytes().unwrap();
        let back = RuntimeInfo::parse_from_bytes(&bytes).unwrap();
        assert_eq!(back.name, "io.containerd.crab.v2");
        let any = back.features.into_option().unwrap();
        assert_eq!(any.type_url, FEATURES_TYPE_URL);
        let f: oci_spec::runtime::Features = serde_json::from_slice(&any.value).unwrap();
        let linux = f.linux().as_ref().unwrap();
        assert!(linux
            .namespaces()
            .as_ref()
            .unwrap()
            .contains(&oci_spec::runtime::LinuxNamespaceType::User));
        let idmap = linux
            .mount_extensions()
            .as_ref()
            .and_then(|m| m.idmap().as_ref())
            .and_then(|i| *i.enabled());
        assert_eq!(idmap, Some(true), "idmapped mounts are made");
        assert!(f
            .mount_options()
            .as_ref()
            .unwrap()
            .contains(&"rro".to_string()));
    }

    #[test]
    fn test_the_options_given_are_echoed() {
        let mut any = Any::new();
        any.type_url = "containerd.runc.v1.Options".into();
        any.value = vec![1, 2, 3];
        let info = runtime_info(&any.write_to_bytes().unwrap());
        assert_eq!(info.options.into_option().unwrap().type_url, any.type_url);
    }
}
