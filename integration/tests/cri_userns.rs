//! A `hostUsers: false` pod through containerd's CRI plugin, as kubelet asks for
//! one: a user namespace of the pod's (its sandbox makes it, each container
//! joins it by path), its image remapped to the pod's ids, and on containerd 2.x
//! every mount idmapped with the pod's maps (containerd's own `/etc/hosts`,
//! `/etc/hostname`, `/etc/resolv.conf`, and a volume given as kubelet gives it).
//! The pod runs on the handler `crab-userns`, the crab runtime without runtime
//! options: containerd 2.x sets the owner of a userns container's fifos in
//! runc's option type, and refuses a handler whose options are of another
//! (`ConfigPath`'s) type (containerd/containerd#11091).
//! Those binds' sources are below directories only the host's root may pass,
//! which libcontainer cannot reach from inside the namespace: the runtime stages
//! them (`crab_runtime::userns::staged_binds`). `hack/test.sh compat` runs this
//! file against containerd 2.x.

// Needs root and the CRI containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::os::unix::fs::MetadataExt;

use crab_integration::cri::{self, api, Cri, Pod, CRAB_USERNS_HANDLER};
use crab_integration::{unique_id, BUSYBOX};

/// Where the pod's ids start on the host (a range no other test maps).
const HOST_ID: u32 = 300_000;

/// A volume's host directory, owned by the host's root (mode 0755).
struct Volume(std::path::PathBuf);

impl Drop for Volume {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_host_users_false_pod_runs_in_its_namespace_with_idmapped_mounts_and_rolls_back_its_files() {
    let cri = Cri::connect();
    let pod = Pod::run_in_user_namespace(&cri, CRAB_USERNS_HANDLER, HOST_ID)
        .unwrap_or_else(|e| panic!("RunPodSandbox of a hostUsers: false pod: {e:?}"));
    let volume = Volume(std::env::temp_dir().join(unique_id("crab-volume")));
    std::fs::create_dir(&volume.0).unwrap();
    std::fs::write(volume.0.join("config"), "from the host\n").unwrap();
    let map = api::IdMapping {
        host_id: HOST_ID,
        container_id: 0,
        length: 65536,
    };
    let mut config = pod.container_config("main", BUSYBOX, &["sleep", "100000"]);
    config.mounts.push(api::Mount {
        container_path: "/data".into(),
        host_path: volume.0.display().to_string(),
        // containerd 1.7 refuses a mount with maps ("idmap mounts not yet
        // supported"); kubelet sends none to it.
        uid_mappings: if cri.containerd_major() >= 2 {
            vec![map]
        } else {
            vec![]
        },
        gid_mappings: if cri.containerd_major() >= 2 {
            vec![map]
        } else {
            vec![]
        },
        ..Default::default()
    });
    let c = pod.start(&config);

    // The pod's namespace: root inside, HOST_ID outside, the image its own.
    let out = pod.exec_ok(
        &c,
        &["sh", "-c", "id -u; cat /proc/self/uid_map; stat -c %u /bin"],
    );
    let words: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(
        words,
        ["0", "0", &HOST_ID.to_string(), "65536", "0"],
        "{out}"
    );
    let spec = cri::runtime_spec(&cri, &c);
    let user_ns = spec["linux"]["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["type"] == "user")
        .cloned();
    assert!(
        user_ns.as_ref().and_then(|n| n["path"].as_str()).is_some(),
        "the container joins the pod's namespace: {user_ns:?}"
    );
    // containerd's files and the volume are the host root's. containerd 2.x asks
    // for every mount idmapped with the pod's maps: they are root's inside, and
    // what the pod's root writes in the volume is the host root's on disk.
    // containerd 1.7 asks for none (it refuses a mount with maps): they are
    // nobody's inside, and the volume is read-only to the pod's root.
    let idmapped = cri.containerd_major() >= 2;
    let owner = if idmapped { "0:0 " } else { "65534:65534 " };
    let out = pod.exec_ok(
        &c,
        &[
            "stat",
            "-c",
            "%u:%g %n",
            "/etc/hosts",
            "/etc/hostname",
            "/etc/resolv.conf",
            "/data/config",
        ],
    );
    assert_eq!(out.lines().count(), 4, "{out}");
    for line in out.lines() {
        assert!(line.starts_with(owner), "{out}");
    }
    let write = cri
        .exec_sync(&c, &["sh", "-c", "echo from the pod > /data/written"], 30)
        .unwrap();
    if idmapped {
        assert_eq!(write.exit_code, 0, "{write:?}");
        let meta = std::fs::metadata(volume.0.join("written")).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (0, 0));
    } else {
        assert_ne!(write.exit_code, 0, "{write:?}");
        assert!(!volume.0.join("written").exists());
    }

    // Its files roll back (its processes cannot be checkpointed in a joined
    // namespace: CRIU restores only into one it makes).
    pod.exec_ok(&c, &["sh", "-c", "echo before > /f"]);
    cri::crabctl_ok(&["checkpoint", "--kind", "fs-only", "--name", "files", &c]);
    pod.exec_ok(&c, &["sh", "-c", "echo after > /f"]);
    let out = cri::crabctl_ok(&["rollback", &c, "files"]);
    assert!(out.contains("files restored, processes kept"), "{out}");
    assert_eq!(pod.exec_ok(&c, &["cat", "/f"]).trim(), "before");
    assert_eq!(
        pod.exec_ok(&c, &["stat", "-c", "%u:%g ", "/data/config"])
            .trim_end(),
        owner.trim_end()
    );
    let out = cri::crabctl(&["checkpoint", &c]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("joins the user namespace"),
        "{out:?}"
    );
    pod.remove();
    assert!(
        volume.0.join("config").exists(),
        "the volume keeps its files"
    );
}
