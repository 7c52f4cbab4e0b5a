//! The host's device nodes inside a container with a user namespace.
//!
//! A process in a user namespace cannot `mknod`, so libcontainer bind-mounts the
//! host's nodes instead (`/dev/null`, `/dev/zero`, ..., and the spec's devices), and
//! masks files such as `/proc/keys` with a bind of that `/dev/null`. Those mounts'
//! roots are in the host's devtmpfs, outside anything CRIU dumps ("doesn't have a
//! proper root mount"): the dump names them external, keyed by their host path, and
//! the restore binds the same host nodes again. The restore's list comes from the
//! spec (libcontainer's default nodes and the spec's devices, which an import
//! already allow-lists), never from the images, so an archive cannot make a restore
//! bind a host node the spec did not give.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use oci_spec::runtime::Spec;

/// The nodes libcontainer always makes (binds, in a user namespace).
pub const DEFAULT_NODES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/tty",
    "/dev/urandom",
    "/dev/random",
];

/// For a dump of `pid`: (mount point in the container, CRIU key = the host path of
/// the node) of every mount whose file system is the host's `/dev`.
pub fn dumped(pid: i32) -> std::io::Result<Vec<(String, String)>> {
    let host_dev = std::fs::metadata("/dev")?.dev();
    let text = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))?;
    Ok(parse(&text, host_dev))
}

/// [`dumped`] over a mountinfo text, for the device number `host_dev` of `/dev`.
pub fn parse(mountinfo: &str, host_dev: u64) -> Vec<(String, String)> {
    let (major, minor) = (libc::major(host_dev), libc::minor(host_dev));
    let want = format!("{major}:{minor}");
    mountinfo
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            let (dev, root, point) = (*f.get(2)?, *f.get(3)?, *f.get(4)?);
            if dev != want || root == "/" {
                return None;
            }
            let root = unescape(root);
            Some((unescape(point), format!("/dev{root}")))
        })
        .collect()
}

/// For a restore: (CRIU key, host source) of each node the spec gives the container.
pub fn restored(spec: &Spec) -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = DEFAULT_NODES
        .iter()
        .map(|p| (p.to_string(), PathBuf::from(p)))
        .collect();
    let devices = spec
        .linux()
        .as_ref()
        .and_then(|l| l.devices().clone())
        .unwrap_or_default();
    for d in devices {
        let path = d.path();
        let key = path.to_string_lossy().into_owned();
        if path.starts_with("/dev") && !out.iter().any(|(k, _)| *k == key) && exists(path) {
            out.push((key, path.clone()));
        }
    }
    out
}

fn exists(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok()
}

/// mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
170 96 0:42 /containers/crab/u / rw,relatime - btrfs /dev/loop0 rw
172 170 0:116 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755,uid=100000
178 172 0:6 /null /dev/null rw,relatime - devtmpfs devtmpfs rw,mode=755
179 172 0:6 /zero /dev/zero rw,relatime - devtmpfs devtmpfs rw,mode=755
103 171 0:6 /null /proc/keys rw,relatime - devtmpfs devtmpfs rw,mode=755
105 171 0:6 / /host\\040dev rw,relatime - devtmpfs devtmpfs rw,mode=755
";

    #[test]
    fn test_the_host_nodes_and_masks_are_external_keyed_by_host_path() {
        let got = parse(INFO, libc::makedev(0, 6));
        assert_eq!(
            got,
            [
                ("/dev/null".to_string(), "/dev/null".to_string()),
                ("/dev/zero".to_string(), "/dev/zero".to_string()),
                ("/proc/keys".to_string(), "/dev/null".to_string()),
            ]
        );
    }

    #[test]
    fn test_the_restore_binds_only_what_the_spec_gives() {
        let spec: Spec = serde_json::from_value(serde_json::json!({
            "ociVersion": "1.0.2",
            "linux": {"devices": [
                {"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229},
                {"path": "/etc/shadow", "type": "c", "major": 1, "minor": 3}
            ]}
        }))
        .unwrap();
        let got: Vec<String> = restored(&spec).into_iter().map(|(k, _)| k).collect();
        assert!(got.starts_with(
            &DEFAULT_NODES
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
        ));
        assert!(!got.contains(&"/etc/shadow".to_string()));
        assert!(got.contains(&"/dev/fuse".to_string()) == Path::new("/dev/fuse").exists());
    }
}
