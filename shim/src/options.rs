//! containerd runtime options for the crab runtime.
//!
//! containerd hands a non-runc runtime its options as `runtimeoptions.v1.Options`
//! (`type_url`, `config_path`, `config_body`): from `ctr run --runtime-config-path`, from
//! the CRI plugin's `ConfigPath`/`ConfigBody`, and from Docker's runtime `options`. Its
//! proto is not in the shim crate, so the three string fields are decoded here.

use std::path::Path;

use containerd_shim::protos::protobuf::well_known_types::any::Any;
use containerd_shim::protos::protobuf::CodedInputStream;
use crab_runtime::checkpoint::source::{RestoreOptions, RestoreRequest};

/// The decoded options.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RuntimeOptions {
    /// `ConfigPath`: a TOML file.
    pub config_path: Option<String>,
    /// `ConfigBody`: TOML text.
    pub config_body: Option<String>,
}

const RUNTIME_OPTIONS_TYPE: &str = "runtimeoptions.v1.Options";

impl RuntimeOptions {
    /// Whether options of type `type_url` are these.
    pub fn is_ours(type_url: &str) -> bool {
        type_url.ends_with(RUNTIME_OPTIONS_TYPE)
    }

    /// Decodes `options`; other option types (such as runc's) carry nothing for Crab.
    pub fn from_any(any: Option<&Any>) -> Result<RuntimeOptions, String> {
        let Some(any) = any else {
            return Ok(RuntimeOptions::default());
        };
        if !RuntimeOptions::is_ours(&any.type_url) {
            return Ok(RuntimeOptions::default());
        }
        let mut out = RuntimeOptions::default();
        for_each_field(&any.value, "runtime options", |field, value| {
            match (field, value) {
                (2, Field::Bytes(b)) => out.config_path = Some(string(b)),
                (3, Field::Bytes(b)) => out.config_body = Some(string(b)),
                _ => {}
            }
        })?;
        Ok(out)
    }
}

/// The restore request a `Create` names (see [`RestoreRequest`]), in runc's
/// `criu_image_path` or, from containerd 2.x, as the task's checkpoint too; any other
/// path there is a directory of CRIU images.
pub fn restore_request(
    runc: &RuncTaskOptions,
    checkpoint: &str,
    namespace: &str,
    id: &str,
) -> crab_runtime::Result<Option<RestoreOptions>> {
    let named = runc
        .criu_image_path
        .as_deref()
        .into_iter()
        .chain(Some(checkpoint).filter(|c| !c.is_empty()))
        .map(Path::new)
        .find(|p| RestoreRequest::is_request_path(p));
    named
        .map(|path| RestoreRequest::read(path, namespace, id))
        .transpose()
}

/// What Crab takes from runc's `CheckpointOptions` (containerd's Go client's
/// `WithCheckpointTaskExit` and `ctr container checkpoint` send them to every
/// runtime; `ctr task checkpoint`, Docker and the CRI plugin send them to runc's
/// runtimes only, and nothing to Crab), or from containerd's older
/// `containerd.linux.runc.CheckpointOptions`, whose fields have the same numbers.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CheckpointOptions {
    /// Stop the container after the checkpoint, when the client said (`None`: it
    /// sent no options; `[checkpoint] exit_when_unspecified` decides).
    pub exit: Option<bool>,
    /// Where to write the checkpoint (`WithCheckpointImagePath`): containerd 1.7
    /// gives the path itself only to runc's runtimes, and its own temporary
    /// directory to the others.
    pub image_path: Option<String>,
}

/// The checkpoint option types clients send (the same message, two names).
const CHECKPOINT_OPTIONS_TYPES: [&str; 2] = [
    "containerd.runc.v1.CheckpointOptions",
    "containerd.linux.runc.CheckpointOptions",
];

impl CheckpointOptions {
    /// Decodes `options` (absent or of another type: the defaults).
    pub fn from_any(any: Option<&Any>) -> Result<CheckpointOptions, String> {
        let mut out = CheckpointOptions::default();
        let known = |a: &&Any| {
            CHECKPOINT_OPTIONS_TYPES
                .iter()
                .any(|t| a.type_url.ends_with(t))
        };
        let Some(any) = any.filter(known) else {
            return Ok(out);
        };
        // proto3 leaves a false `exit` out: options that were sent say "no".
        out.exit = Some(false);
        for_each_field(&any.value, "checkpoint options", |field, value| {
            match (field, value) {
                (1, Field::Varint(v)) => out.exit = Some(v != 0),
                (8, Field::Bytes(b)) if !b.is_empty() => out.image_path = Some(string(b)),
                _ => {}
            }
        })?;
        Ok(out)
    }
}

/// What Crab takes from runc's task options, which containerd's Go client sends
/// for `WithShimCgroup` and `WithRestoreImagePath` (nerdctl's `start --checkpoint`
/// path): as `containerd.runc.v1.Options` to runc's runtimes and as
/// `containerd.linux.runc.CreateOptions` to every other, with other field numbers.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RuncTaskOptions {
    /// The cgroup the shim process is to live in (relative to each hierarchy's root).
    pub shim_cgroup: Option<String>,
    /// A directory of CRIU images (a checkpoint written to a client's
    /// `WithCheckpointImagePath`) to restore the task from.
    pub criu_image_path: Option<String>,
}

impl RuncTaskOptions {
    /// Decodes `options` (absent or of another type: nothing).
    pub fn from_any(any: Option<&Any>) -> Result<RuncTaskOptions, String> {
        let mut out = RuncTaskOptions::default();
        let Some(any) = any else { return Ok(out) };
        // (shim_cgroup, criu_image_path) field numbers of each message.
        let (cgroup_field, image_field) = if any.type_url.ends_with("containerd.runc.v1.Options") {
            (3, 10)
        } else if any
            .type_url
            .ends_with("containerd.linux.runc.CreateOptions")
        {
            (9, 13)
        } else {
            return Ok(out);
        };
        for_each_field(&any.value, "runc task options", |field, value| {
            if let Field::Bytes(b) = value {
                let text = Some(string(b)).filter(|s| !s.is_empty());
                if field == cgroup_field {
                    out.shim_cgroup = text;
                } else if field == image_field {
                    out.criu_image_path = text;
                }
            }
        })?;
        Ok(out)
    }
}

/// A `google.protobuf.Any` from its wire form: what containerd writes to the shim's
/// `start` on stdin.
pub fn any_from_bytes(bytes: &[u8]) -> Result<Any, String> {
    let mut any = Any::default();
    for_each_field(bytes, "start options", |field, value| {
        match (field, value) {
            (1, Field::Bytes(b)) => any.type_url = string(b),
            (2, Field::Bytes(b)) => any.value = b.to_vec(),
            _ => {}
        }
    })?;
    Ok(any)
}

/// One protobuf field's value.
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Other,
}

fn string(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Calls `f` with each field of a protobuf message (the option protos are not in the
/// shim crate; their few fields are read by number).
fn for_each_field(
    bytes: &[u8],
    what: &str,
    mut f: impl FnMut(u32, Field<'_>),
) -> Result<(), String> {
    let mut input = CodedInputStream::from_bytes(bytes);
    let err = |e: containerd_shim::protos::protobuf::Error| format!("bad {what}: {e}");
    while let Some(tag) = input.read_raw_tag_or_eof().map_err(err)? {
        let (field, wire) = (tag >> 3, tag & 7);
        match wire {
            0 => f(
                field,
                Field::Varint(input.read_raw_varint64().map_err(err)?),
            ),
            1 => {
                input.read_fixed64().map_err(err)?;
                f(field, Field::Other)
            }
            2 => {
                let b = input.read_bytes().map_err(err)?;
                f(field, Field::Bytes(&b))
            }
            5 => {
                input.read_fixed32().map_err(err)?;
                f(field, Field::Other)
            }
            _ => return Err(format!("bad {what}: wire type {wire}")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use containerd_shim::protos::protobuf::CodedOutputStream;

    fn encode(type_url: &str, path: &str, body: &str) -> Any {
        let mut value = Vec::new();
        {
            let mut out = CodedOutputStream::vec(&mut value);
            out.write_string(1, "io.containerd.crab.v2").unwrap();
            out.write_string(2, path).unwrap();
            out.write_string(3, body).unwrap();
            out.flush().unwrap();
        }
        Any {
            type_url: type_url.into(),
            value,
            ..Default::default()
        }
    }

    #[test]
    fn test_decodes_path_and_body() {
        let any = encode(
            "runtimeoptions.v1.Options",
            "/etc/x.toml",
            "state_dir = \"/r\"",
        );
        let o = RuntimeOptions::from_any(Some(&any)).unwrap();
        assert_eq!(o.config_path.as_deref(), Some("/etc/x.toml"));
        assert_eq!(o.config_body.as_deref(), Some("state_dir = \"/r\""));
    }

    #[test]
    fn test_other_option_types_are_ignored() {
        let any = encode("containerd.runc.v1.Options", "/x", "y");
        assert_eq!(
            RuntimeOptions::from_any(Some(&any)).unwrap(),
            RuntimeOptions::default()
        );
        assert_eq!(
            RuntimeOptions::from_any(None).unwrap(),
            RuntimeOptions::default()
        );
    }

    #[test]
    fn test_checkpoint_exit_is_read() {
        let mut value = Vec::new();
        {
            let mut out = CodedOutputStream::vec(&mut value);
            out.write_bool(1, true).unwrap();
            out.write_bool(5, true).unwrap();
            out.write_string(8, "/img").unwrap();
            out.flush().unwrap();
        }
        // runc's type, and containerd's older name for the same message.
        for type_url in [
            "containerd.runc.v1.CheckpointOptions",
            "type.googleapis.com/containerd.linux.runc.CheckpointOptions",
        ] {
            let any = Any {
                type_url: type_url.into(),
                value: value.clone(),
                ..Default::default()
            };
            let o = CheckpointOptions::from_any(Some(&any)).unwrap();
            assert_eq!(o.exit, Some(true), "{type_url}");
            assert_eq!(o.image_path.as_deref(), Some("/img"), "{type_url}");
        }
        // No options, or another type: the client did not say.
        assert_eq!(CheckpointOptions::from_any(None).unwrap().exit, None);
        let other = Any {
            type_url: "runtimeoptions.v1.Options".into(),
            value,
            ..Default::default()
        };
        assert_eq!(
            CheckpointOptions::from_any(Some(&other)).unwrap().exit,
            None
        );
        // Options with `exit` false (proto3 leaves it out) say "leave it running".
        let empty = Any {
            type_url: "containerd.runc.v1.CheckpointOptions".into(),
            ..Default::default()
        };
        assert_eq!(
            CheckpointOptions::from_any(Some(&empty)).unwrap().exit,
            Some(false)
        );
    }

    #[test]
    fn test_garbage_is_an_error() {
        let any = Any {
            type_url: "runtimeoptions.v1.Options".into(),
            value: vec![0x17, 0xff],
            ..Default::default()
        };
        assert!(RuntimeOptions::from_any(Some(&any)).is_err());
    }

    fn runc_options(type_url: &str, fields: &[(u32, &str)]) -> Any {
        let mut value = Vec::new();
        {
            let mut out = CodedOutputStream::vec(&mut value);
            out.write_bool(1, true).unwrap();
            for (n, v) in fields {
                out.write_string(*n, v).unwrap();
            }
            out.flush().unwrap();
        }
        Any {
            type_url: type_url.into(),
            value,
            ..Default::default()
        }
    }

    #[test]
    fn the_shim_cgroup_and_restore_image_path_are_read_from_both_runc_option_types() {
        let want = RuncTaskOptions {
            shim_cgroup: Some("/c/shim".into()),
            criu_image_path: Some("/img".into()),
        };
        let v1 = runc_options(
            "containerd.runc.v1.Options",
            &[(3, "/c/shim"), (10, "/img"), (7, "/root")],
        );
        assert_eq!(RuncTaskOptions::from_any(Some(&v1)).unwrap(), want);
        let linux = runc_options(
            "type.googleapis.com/containerd.linux.runc.CreateOptions",
            &[(9, "/c/shim"), (13, "/img"), (12, "/work")],
        );
        assert_eq!(RuncTaskOptions::from_any(Some(&linux)).unwrap(), want);
        let other = runc_options("runtimeoptions.v1.Options", &[(3, "/c/shim")]);
        assert_eq!(
            RuncTaskOptions::from_any(Some(&other)).unwrap(),
            RuncTaskOptions::default()
        );
    }

    #[test]
    fn an_any_is_read_back_from_its_wire_form() {
        let any = runc_options("containerd.runc.v1.Options", &[(3, "/c")]);
        let mut wire = Vec::new();
        {
            let mut out = CodedOutputStream::vec(&mut wire);
            out.write_string(1, &any.type_url).unwrap();
            out.write_bytes(2, &any.value).unwrap();
            out.flush().unwrap();
        }
        let back = any_from_bytes(&wire).unwrap();
        assert_eq!((back.type_url, back.value), (any.type_url, any.value));
        assert!(any_from_bytes(&[0xff]).is_err());
    }
}
