//! Program sets of other builds, as an upgrade leaves them pinned: kept while
//! they watch a cgroup or another process holds their maps, unpinned once
//! unused. Needs root and bpffs.

// Needs root and eBPF in the kernel: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

use crab_bpf::{stale_sets, PIN_VERSION};
use libbpf_rs::{libbpf_sys, MapCore, MapFlags, MapHandle, MapType};

/// A pin root of its own, removed at the end.
struct Root(PathBuf);

impl Drop for Root {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An "other build" below `root`: a pinned `cgroups` map like the real one.
fn other_build(root: &Root, name: &str) -> MapHandle {
    let dir = root.0.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let opts = libbpf_sys::bpf_map_create_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as _,
        ..Default::default()
    };
    let mut map = MapHandle::create(MapType::Hash, Some("cgroups"), 8, 8, 16, &opts).unwrap();
    map.pin(dir.join("map-cgroups")).unwrap();
    map
}

#[test]
fn an_old_set_is_kept_while_it_watches_or_is_held_and_unpinned_once_unused() {
    let root = Root(PathBuf::from(format!(
        "/sys/fs/bpf/crab-stale-test-{}",
        std::process::id()
    )));
    std::fs::create_dir_all(&root.0).expect("bpffs at /sys/fs/bpf");
    // The current build's directory is never judged.
    std::fs::create_dir_all(root.0.join(PIN_VERSION)).unwrap();
    let map = other_build(&root, "v-old");
    let old = root.0.join("v-old");

    // Watching a cgroup: kept.
    map.update(&7u64.to_ne_bytes(), &[0; 8], MapFlags::ANY)
        .unwrap();
    let sets = stale_sets(&root.0, true).unwrap();
    assert_eq!(sets.len(), 1, "{sets:?}");
    assert_eq!((sets[0].watched, sets[0].removed), (1, false));
    assert!(old.join("map-cgroups").exists());

    // Watching nothing, but held open by another process: kept.
    map.delete(&7u64.to_ne_bytes()).unwrap();
    let fd = map.as_fd().as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and only calls
    // fcntl, which is async-signal-safe.
    let mut holder = unsafe {
        Command::new("sleep")
            .arg("30")
            .pre_exec(move || {
                if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
            .spawn()
            .unwrap()
    };
    let sets = stale_sets(&root.0, true).unwrap();
    assert_eq!(sets[0].holders, vec![holder.id() as i32], "{sets:?}");
    assert!(!sets[0].removed && old.exists());

    // Unused (this process's own fd does not count): unpinned.
    holder.kill().unwrap();
    holder.wait().unwrap();
    let dry = stale_sets(&root.0, false).unwrap();
    assert!(!dry[0].removed && old.exists(), "a dry run removes nothing");
    let sets = stale_sets(&root.0, true).unwrap();
    assert!(sets[0].removed, "{sets:?}");
    assert!(!old.exists());
    assert!(root.0.join(PIN_VERSION).exists());
    assert!(stale_sets(&root.0, true).unwrap().is_empty());
}
