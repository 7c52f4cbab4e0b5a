//! What a dead shim's cleanup left, removed by `crabctl restore` before it
//! creates the new task.
//!
//! containerd runs the dead shim's binary `delete` once, gives it 5 s
//! (`io.containerd.timeout.shim.cleanup`), and removes the task's bundle only when
//! that `delete` succeeded; it then drops the task and never tries again (until it
//! restarts). So a `delete` that was killed or crashed leaves the bundle, and the
//! next create under the same id fails in containerd ("mkdir <bundle>: file
//! exists"); one that failed inside (it logs and answers anyway) leaves Crab's
//! record of the container, and the next create fails in Crab ("already exists").
//!
//! Both are finished here the way they would have finished: with the bundle left,
//! the shim binary's own `delete` runs again with containerd's arguments, then the
//! bundle goes as containerd removes it (its rootfs unmounted and removed empty,
//! its work directory, itself). The bundle is found from Crab's record; a shim
//! killed after it removed its record but before its bundle went leaves nothing
//! to find it by (containerd's own restart cleans that up).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use crab_runtime::config::Config;
use crab_runtime::container::Container;

/// How long the shim binary's `delete` may take (containerd gives it 5 s; it
/// kills processes and removes cgroups, which can take longer on a loaded host).
const DELETE_TIMEOUT: Duration = Duration::from_secs(30);
/// The shim binary when the bundle does not name it.
const SHIM_BINARY: &str = "containerd-shim-crab-v2";

/// Removes what the dead shim of container `id` left; answers whether anything
/// was left. Only for a shim known to be dead: the caller probes it.
pub fn remove(config: &Config, address: &str, namespace: &str, id: &str) -> Result<bool> {
    let bundle = match Container::load(config, namespace, id) {
        Ok(c) => Some(c.state().bundle.clone()),
        Err(crab_runtime::Error::NotFound(_)) => None,
        Err(e) => return Err(e).context(format!("read the record of {id}")),
    };
    match bundle.filter(|b| b.is_dir()) {
        Some(bundle) => {
            run_shim_delete(&bundle, address, namespace, id)?;
            remove_bundle(&bundle, id)?;
            Ok(true)
        }
        // containerd removed the bundle: only Crab's part can be left.
        None => Container::remove_left(config, namespace, id)
            .with_context(|| format!("remove what the dead shim of {id} left")),
    }
}

/// Runs `<shim> -namespace NS -address A -id ID -bundle B delete` in the bundle,
/// as containerd does.
fn run_shim_delete(bundle: &Path, address: &str, namespace: &str, id: &str) -> Result<()> {
    let binary = std::fs::read_to_string(bundle.join("shim-binary-path"))
        .ok()
        .map(|p| PathBuf::from(p.trim()))
        .filter(|p| p.is_absolute())
        .unwrap_or_else(|| PathBuf::from(SHIM_BINARY));
    let out = Command::new("timeout")
        .arg("--kill-after=5")
        .arg(DELETE_TIMEOUT.as_secs().to_string())
        .arg(&binary)
        .args(["-namespace", namespace, "-address", address, "-id", id])
        .arg("-bundle")
        .arg(bundle)
        .arg("delete")
        // What containerd sets for every call of a shim binary.
        .env("TTRPC_ADDRESS", format!("{address}.ttrpc"))
        .env("GRPC_ADDRESS", address)
        .env("NAMESPACE", namespace)
        .current_dir(bundle)
        .output()
        .with_context(|| format!("run {} delete", binary.display()))?;
    if !out.status.success() {
        bail!(
            "{} delete for {id} failed ({}): {}",
            binary.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Removes a task's bundle as containerd does (`Bundle.Delete`): its rootfs
/// unmounted, then removed only if empty (never the container's files through a
/// mount), its work directory (where the link names it), the bundle itself.
fn remove_bundle(bundle: &Path, id: &str) -> Result<()> {
    let rootfs = bundle.join("rootfs");
    // Every mount stacked on it; EINVAL once nothing is mounted there.
    while nix::mount::umount2(&rootfs, nix::mount::MntFlags::MNT_DETACH).is_ok() {}
    match std::fs::remove_dir(&rootfs) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("remove {}", rootfs.display())),
    }
    if let Ok(work) = std::fs::read_link(bundle.join("work")) {
        // containerd's own layout: <root>/<runtime>/<namespace>/<id>.
        if work.is_absolute() && work.file_name() == Some(std::ffi::OsStr::new(id)) {
            remove_dir_if_there(&work)?;
        }
    }
    remove_dir_if_there(bundle)
}

fn remove_dir_if_there(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("remove {}", dir.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_goes_with_its_work_directory_and_a_full_rootfs_stays() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("state/ns/c1");
        let work = dir.path().join("root/ns/c1");
        std::fs::create_dir_all(bundle.join("rootfs")).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        std::fs::write(work.join("log.json"), b"{}").unwrap();
        std::os::unix::fs::symlink(&work, bundle.join("work")).unwrap();
        std::fs::write(bundle.join("config.json"), b"{}").unwrap();
        remove_bundle(&bundle, "c1").unwrap();
        assert!(!bundle.exists() && !work.exists());

        // A rootfs that still holds files (not unmounted) is never emptied.
        std::fs::create_dir_all(bundle.join("rootfs/etc")).unwrap();
        std::fs::write(bundle.join("rootfs/etc/passwd"), b"root").unwrap();
        assert!(remove_bundle(&bundle, "c1").is_err());
        assert!(bundle.join("rootfs/etc/passwd").exists());
    }

    #[test]
    fn a_work_link_to_another_containers_directory_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("c1");
        let other = dir.path().join("other");
        std::fs::create_dir_all(&bundle).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        std::os::unix::fs::symlink(&other, bundle.join("work")).unwrap();
        remove_bundle(&bundle, "c1").unwrap();
        assert!(!bundle.exists());
        assert!(other.exists());
    }
}
