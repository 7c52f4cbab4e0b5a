//! What every store shares about in-flight work and tree ownership.
//!
//! In-flight work is named `<pid>.<n>.<what>` so that `reconcile` can tell the work of a
//! live process from the leftovers of a dead one.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

static NONCE: AtomicU64 = AtomicU64::new(0);

/// A fresh name for work of this process: `<pid>.<n>.<what>`.
pub fn tmp_name(what: &str) -> String {
    let n = NONCE.fetch_add(1, Ordering::Relaxed);
    format!("{}.{n}.{what}", std::process::id())
}

/// Whether a work name (from [`tmp_name`]) belongs to a process that still runs.
pub fn owner_alive(name: &str) -> bool {
    name.split('.')
        .next()
        .and_then(|p| p.parse::<i32>().ok())
        .is_some_and(pid_alive)
}

/// The content of a rollback marker: the process rolling back and the snapshot
/// (`<pid>:<snapshot>`), so that a reconcile leaves a live rollback alone.
pub fn rollback_mark(snapshot: &str) -> String {
    format!("{}:{snapshot}", std::process::id())
}

/// The snapshot a rollback marker names, unless the process that wrote it still runs
/// (then `None`: the rollback is live). A marker without a pid (older) is dead.
pub fn dead_rollback(mark: &str) -> Option<String> {
    let mark = mark.trim();
    match mark.split_once(':') {
        Some((pid, _)) if pid.parse::<i32>().is_ok_and(pid_alive) => None,
        Some((_, name)) => Some(name.to_string()),
        None => Some(mark.to_string()),
    }
}

/// Whether process `pid` runs. A zombie does not: a process killed (a shim at a
/// crash) stays one until its parent reaps it, and a slow reaper (a container's
/// init as pid 1) leaves it seconds in `/proc`, where its work would pass for
/// live and be left behind by the next operation that clears dead work.
pub fn pid_alive(pid: i32) -> bool {
    crate::inspect::procs::state(pid).is_some_and(|s| !matches!(s, 'Z' | 'X'))
}

/// What `prepare` does with a container that already has a tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Existing {
    /// The same containerd container: hand the tree back, writes and all.
    Reuse,
    /// Its containerd container is gone: destroy the tree and make a new one.
    Replace,
    /// Another container owns it: refuse.
    Conflict,
}

/// Decides from the owner the tree recorded and the owner of the new request.
///
/// An owner is a snapshot directory of containerd's snapshotter
/// (`<root>/snapshots/<n>/fs`). A request from the same snapshotter with another
/// owner is a new container under the id of one containerd has removed (ids are
/// unique in a namespace), whose snapshot containerd has not garbage-collected
/// yet: its tree is replaced. A live owner of another snapshotter (another
/// containerd on this host) keeps its tree.
pub fn existing_tree(recorded: Option<&Path>, requested: Option<&Path>) -> Existing {
    match (recorded, requested) {
        (Some(r), Some(o)) if r == o => Existing::Reuse,
        (Some(r), _) if !r.exists() => Existing::Replace,
        (Some(r), Some(o)) if snapshotter_of(r).is_some_and(|s| Some(s) == snapshotter_of(o)) => {
            Existing::Replace
        }
        _ => Existing::Conflict,
    }
}

/// What `prepare` does with the tree at `tree`, whose owner is recorded in the file
/// `owner_file`, for a request by `requested`; `None` when there is no tree.
pub fn existing_at(tree: &Path, owner_file: &Path, requested: Option<&Path>) -> Option<Existing> {
    tree.exists()
        .then(|| existing_tree(read_owner(owner_file).as_deref(), requested))
}

/// Whether the tree of a container whose recorded owner is `owner` is the
/// collect's to remove: its owner is gone, and it belonged to the snapshotter
/// `scope` (the calling containerd's). Another containerd's trees are its own
/// business, even where this process cannot see their owners.
pub fn collectable(owner: &Path, scope: &Path) -> bool {
    owner.is_absolute() && snapshotter_of(owner) == Some(scope) && !owner.exists()
}

/// The snapshots directory an owner belongs to: `<snapshots>` for containerd's
/// `<snapshots>/<n>/fs`, and Docker's `overlay2` dir for its graph driver's
/// writable layer `<data-root>/overlay2/<layer>/diff` (adopted trees, see
/// [`super::adopt`]).
pub fn snapshotter_of(owner: &Path) -> Option<&Path> {
    let snapshot = owner.parent()?;
    let name = snapshot.file_name()?.to_str()?;
    if !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()) {
        return snapshot.parent();
    }
    let overlay2 = snapshot.parent()?;
    (owner.file_name()? == "diff" && overlay2.file_name()? == "overlay2").then_some(overlay2)
}

/// The snapshots directory an image layer belongs to: as [`snapshotter_of`],
/// and for Docker's short links `<data-root>/overlay2/l/<name>` (the form its
/// overlay's `lowerdir` names layers in), the `overlay2` dir.
pub fn layer_snapshotter(layer: &Path) -> Option<&Path> {
    snapshotter_of(layer).or_else(|| {
        let links = layer.parent()?;
        let overlay2 = links.parent()?;
        (links.file_name()? == "l" && overlay2.file_name()? == "overlay2").then_some(overlay2)
    })
}

/// The recorded owner file's content as a path, if there is one.
/// A store records it as the file's text, or as the target of a link
/// ([`super::dirs::link_owner`]), which is read, never followed.
pub fn read_owner(file: &Path) -> Option<PathBuf> {
    match std::fs::read_link(file) {
        Ok(target) => Some(target).filter(|t| !t.as_os_str().is_empty()),
        Err(_) => std::fs::read_to_string(file)
            .ok()
            .filter(|s| !s.is_empty())
            .map(PathBuf::from),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_zombie_is_not_alive() -> std::io::Result<()> {
        let mut running = std::process::Command::new("sleep").arg("30").spawn()?;
        let mut exited = std::process::Command::new("true").spawn()?;
        let zombie = |pid: u32| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                s.rsplit_once(')')
                    .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
            })
        };
        // Not reaped yet: a zombie, still in /proc.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !zombie(exited.id()) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(zombie(exited.id()));
        assert!(!pid_alive(exited.id() as i32));
        assert!(pid_alive(running.id() as i32));
        running.kill()?;
        running.wait()?;
        exited.wait()?;
        Ok(())
    }

    #[test]
    fn test_work_of_this_process_is_alive_and_of_a_dead_one_is_not() {
        assert!(owner_alive(&tmp_name("x")));
        assert!(!owner_alive("999999999.0.x"));
        assert!(!owner_alive("garbage"));
    }

    #[test]
    fn test_an_owner_is_read_from_a_link_without_following_it_or_from_a_file() {
        let dir = std::env::temp_dir().join(format!("crab-owner-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("snapshots/3/fs")).unwrap();
        let owner = dir.join("snapshots/3/fs");
        let (link, file, empty) = (
            dir.join("a.owner"),
            dir.join("b.owner"),
            dir.join("c.owner"),
        );
        crate::storage::dirs::link_owner(&link, &owner).unwrap();
        // Recorded again: replaced in one step, nothing staged left.
        crate::storage::dirs::link_owner(&link, &owner).unwrap();
        std::fs::write(&file, owner.as_os_str().as_encoded_bytes()).unwrap();
        std::fs::write(&empty, "").unwrap();
        assert_eq!(read_owner(&link), Some(owner.clone()));
        assert_eq!(read_owner(&file), Some(owner.clone()));
        assert_eq!(read_owner(&empty), None);
        assert_eq!(read_owner(&dir.join("none.owner")), None);
        assert!(!dir.join("a.owner.new").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn test_existing_tree_decisions() {
        let here = Path::new("/");
        let gone = Path::new("/nonexistent/owner");
        assert_eq!(existing_tree(Some(here), Some(here)), Existing::Reuse);
        assert_eq!(existing_tree(Some(gone), Some(here)), Existing::Replace);
        assert_eq!(existing_tree(Some(here), Some(gone)), Existing::Conflict);
        assert_eq!(existing_tree(None, Some(here)), Existing::Conflict);
        // No owner on either side (a read-only view's tree goes with its task
        // instead): a second prepare must not take a tree someone uses.
        assert_eq!(existing_tree(None, None), Existing::Conflict);
    }

    #[test]
    fn test_a_new_owner_of_the_same_snapshotter_replaces_a_tree_not_yet_collected() {
        let root = tempfile::tempdir().unwrap();
        let snapshot = |root: &Path, n: u32| {
            let p = root.join("snapshots").join(n.to_string()).join("fs");
            std::fs::create_dir_all(&p).unwrap();
            p
        };
        let (old, new) = (snapshot(root.path(), 7), snapshot(root.path(), 8));
        assert_eq!(existing_tree(Some(&old), Some(&new)), Existing::Replace);
        // Another containerd's live container keeps its tree.
        let other = tempfile::tempdir().unwrap();
        let theirs = snapshot(other.path(), 7);
        assert_eq!(existing_tree(Some(&theirs), Some(&new)), Existing::Conflict);
        // An owner that is no snapshot directory is never taken for one.
        assert_eq!(
            existing_tree(Some(root.path()), Some(&new)),
            Existing::Conflict
        );
    }

    #[test]
    fn only_gone_owners_of_the_callers_snapshotter_are_collectable() {
        let scope = Path::new("/nonexistent/a/snapshots");
        assert!(collectable(&scope.join("7/fs"), scope));
        let other = Path::new("/nonexistent/b/snapshots/7/fs");
        assert!(!collectable(other, scope), "another containerd's tree");
        let root = tempfile::tempdir().unwrap();
        let live = root.path().join("snapshots/3/fs");
        std::fs::create_dir_all(&live).unwrap();
        assert!(
            !collectable(&live, &root.path().join("snapshots")),
            "owner alive"
        );
        assert!(!collectable(
            Path::new("relative/3/fs"),
            Path::new("relative")
        ));
    }

    #[test]
    fn test_dockers_overlay2_writable_layers_are_scoped_to_their_overlay2_dir() {
        let scope = Path::new("/nonexistent/docker/overlay2");
        let upper = scope.join("6f1e0c/diff");
        assert_eq!(snapshotter_of(&upper), Some(scope));
        assert!(collectable(&upper, scope));
        let other = Path::new("/nonexistent/docker-b/overlay2/6f1e0c/diff");
        assert!(!collectable(other, scope), "another dockerd's tree");
        assert!(!collectable(&upper, Path::new("/nonexistent/docker")));
        // Neither a layer's other dirs nor a diff dir elsewhere.
        assert_eq!(snapshotter_of(&scope.join("6f1e0c/merged")), None);
        assert_eq!(snapshotter_of(Path::new("/x/layers/6f1e0c/diff")), None);
        // A new container of the same dockerd replaces a leftover tree.
        let root = tempfile::tempdir().unwrap();
        let new = root.path().join("overlay2/b/diff");
        std::fs::create_dir_all(&new).unwrap();
        let old = root.path().join("overlay2/a/diff");
        std::fs::create_dir_all(&old).unwrap();
        assert_eq!(existing_tree(Some(&old), Some(&new)), Existing::Replace);
    }
}
