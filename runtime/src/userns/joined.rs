//! A user namespace the container joins by path instead of making one.
//!
//! A Kubernetes pod with `hostUsers: false` is one user namespace: containerd's CRI
//! makes it with the pod's sandbox (the pause container) and puts each of the pod's
//! containers in it, `/proc/<sandbox pid>/ns/user` beside the pod's mappings
//! (`ctr run --with-ns user:/proc/<pid>/ns/user --uidmap ...` gives the same spec).
//! The runtime writes no map then: the namespace has its own, and those are what
//! the container's processes and files are. So the namespace's own maps are read
//! and checked as a new one's would be ([`super::check`]: no host root, sizes), and
//! the spec's, where it gives some, must be exactly those.
//!
//! containerd 2.x pins the pod's namespace in a file of its own (an `nsfs` bind,
//! `.../pinned-namespaces/user`), in which no process may be left when the
//! sandbox is created. Two kinds of path are taken:
//! - `/proc/<pid>/ns/user`: the maps are read from that process, and the
//!   namespace file is opened first and compared after the read, so a pid
//!   reused meanwhile is noticed;
//! - any other path must open as a user namespace (`NS_GET_NSTYPE`): a child
//!   joins it through the open file and its maps are read, so they are that
//!   namespace's, whatever happens to the path meanwhile.
//!
//! The namespace libcontainer then joins is checked once more on the created
//! init ([`verify_created`]).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{LinuxNamespaceType, Spec};

use super::{restored::read_maps, Mappings};

/// The path of the user namespace the spec joins, if it joins one.
pub fn path(spec: &Spec) -> Option<PathBuf> {
    spec.linux()
        .as_ref()?
        .namespaces()
        .iter()
        .flatten()
        .find(|n| n.typ() == LinuxNamespaceType::User)?
        .path()
        .clone()
}

/// The pid in a `/proc/<pid>/ns/user` path.
fn pid_of(path: &Path) -> Option<u32> {
    let rest = path.strip_prefix("/proc").ok()?;
    let mut parts = rest.components().map(|c| c.as_os_str().to_str());
    let pid = parts.next()??.parse().ok()?;
    (parts.next()?? == "ns" && parts.next()?? == "user" && parts.next().is_none()).then_some(pid)
}

/// The maps of the user namespace at `path` (`/proc/<pid>/ns/user`, or a file
/// pinning one). `Err` says why they cannot be known.
pub fn maps_of(path: &Path) -> Result<Mappings, String> {
    let failed = |e: std::io::Error| format!("the user namespace to join, {}: {e}", path.display());
    let Some(pid) = pid_of(path) else {
        return pinned_maps(path);
    };
    let id = |m: std::fs::Metadata| (m.dev(), m.ino());
    // Held open while the maps are read: the namespace stays alive, so its inode
    // number cannot pass to another one meanwhile.
    let held = std::fs::File::open(path).map_err(failed)?;
    let first = held.metadata().map(id).map_err(failed)?;
    let maps = read_maps(pid)?;
    if std::fs::metadata(path).map(id).map_err(failed)? != first {
        return Err(format!(
            "process {pid} left the user namespace to join while its maps were read"
        ));
    }
    Ok(maps)
}

/// `NS_GET_NSTYPE` of ioctl_ns(2).
const NS_GET_NSTYPE: libc::c_ulong = 0xb703;

/// The maps of the user namespace a file pins, read from a child that joins it.
fn pinned_maps(path: &Path) -> Result<Mappings, String> {
    let failed = |e: String| format!("the user namespace to join, {}: {e}", path.display());
    let file = std::fs::File::open(path).map_err(|e| failed(e.to_string()))?;
    // SAFETY: NS_GET_NSTYPE takes no argument and answers the namespace's type
    // (or -1 for a file that is not a namespace).
    let kind = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&file), NS_GET_NSTYPE) };
    if kind != libc::CLONE_NEWUSER {
        return Err(failed(
            "not a user namespace (only a process's, /proc/<pid>/ns/user, or a file \
             pinning one is taken)"
                .into(),
        ));
    }
    let fd = std::os::fd::OwnedFd::from(file);
    super::mount_idmap::with_child_in(Some(&fd), |pid| {
        read_maps(pid).map_err(|e| crate::Error::Io {
            context: e,
            source: std::io::Error::other("maps unreadable"),
        })
    })
    .map_err(|e| failed(e.to_string()))
}

/// Compares the spec's own maps (either may be empty: the namespace's are taken)
/// with the joined namespace's.
pub fn spec_agrees(spec_maps: &Mappings, ns: &Mappings) -> Result<(), String> {
    let sorted = |v: &[super::Extent]| {
        let mut v = v.to_vec();
        v.sort_by_key(|e| e.inside);
        v
    };
    for (which, given, have) in [
        ("uidMappings", &spec_maps.uids, &ns.uids),
        ("gidMappings", &spec_maps.gids, &ns.gids),
    ] {
        if !given.is_empty() && sorted(given) != sorted(have) {
            return Err(format!(
                "the spec's {which} are {given:?}, but the user namespace it joins maps \
                 {have:?}"
            ));
        }
    }
    Ok(())
}

/// Checks the created init `pid` of the container of `bundle` is in a namespace
/// with the `maps` checked before it was made: the process whose namespace was
/// joined could have ended and its pid been reused in between.
pub fn verify_created(bundle: &Path, pid: i32, maps: &Mappings) -> crate::Result<()> {
    let invalid = |message: String| crate::Error::InvalidSpec {
        bundle: bundle.to_path_buf(),
        message: format!("the user namespace joined is not the one checked: {message}"),
    };
    let now = read_maps(pid).map_err(invalid)?;
    spec_agrees(maps, &now).map_err(invalid)
}

/// Refuses a process checkpoint of container `id` whose spec joins a user
/// namespace. CRIU (4.2) restores such processes into a user namespace of its
/// own making, not the one they joined; the root of that new namespace then has
/// no right over the pod's network namespace, which the joined one owns, and the
/// restore fails (`setns` of the network: EPERM). A dump that no restore could
/// use is not made: files-only checkpoints and rollbacks still work.
pub fn refuse_process_dump(id: &str, spec: &Spec) -> crate::Result<()> {
    match path(spec) {
        None => Ok(()),
        Some(p) => Err(crate::Error::ProcessDumpRefused {
            id: id.to_string(),
            reason: format!(
                "it joins the user namespace {} (a pod's, hostUsers: false), and CRIU \
                 restores processes only into a user namespace it makes itself; \
                 files-only checkpoints of it work",
                p.display()
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_process_namespace_path_or_a_namespace_file_is_taken() {
        assert_eq!(pid_of(Path::new("/proc/42/ns/user")), Some(42));
        for bad in [
            "/proc/42/ns/net",
            "/proc/self/ns/user",
            "/proc/42/ns/user/x",
            "/run/netns/user",
            "/proc/../proc/42/ns/user",
        ] {
            assert_eq!(pid_of(Path::new(bad)), None, "{bad}");
        }
        let e = maps_of(Path::new("/var/run/userns/pod")).unwrap_err();
        assert!(e.contains("/var/run/userns/pod"), "{e}");
        // A file that is not a namespace.
        let e = maps_of(Path::new("/proc/self/status")).unwrap_err();
        assert!(e.contains("not a user namespace"), "{e}");
    }

    #[test]
    fn test_the_host_namespace_reads_as_the_identity_map() {
        // This test runs in the host's user namespace (as root or not).
        let me = std::process::id();
        let maps = maps_of(Path::new(&format!("/proc/{me}/ns/user"))).unwrap();
        assert_eq!(maps.root_uid(), Some(0), "{maps:?}");
    }

    #[test]
    fn test_the_specs_maps_must_be_the_namespaces_own() {
        let e = |host| super::super::Extent {
            inside: 0,
            host,
            count: 65_536,
        };
        let ns = Mappings {
            uids: vec![e(100_000)],
            gids: vec![e(100_000)],
        };
        spec_agrees(&ns, &ns).unwrap();
        spec_agrees(&Mappings::default(), &ns).unwrap();
        let other = Mappings {
            uids: vec![e(100_000)],
            gids: vec![e(200_000)],
        };
        let err = spec_agrees(&other, &ns).unwrap_err();
        assert!(err.contains("gidMappings"), "{err}");
    }
}
