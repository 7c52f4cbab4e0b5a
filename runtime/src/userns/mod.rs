//! Sandboxes with a user namespace (OCI `linux.uidMappings` / `gidMappings`, what
//! `ctr run --uidmap`, Kubernetes' `hostUsers: false` and Docker's userns-remap ask
//! for).
//!
//! In a user namespace that the host's root creates, the container's root holds every
//! capability over the namespace's own objects and none over the host's: its
//! processes are host ids `hostID + N` ([`check`] refuses mappings that would make
//! any of them host root). That is also what lets CRIU, run by a host root without
//! `CAP_SYS_RESOURCE`, checkpoint a non-root process of the sandbox: the host's root
//! owns the namespace, so it holds every capability in it (docs/agents.md).
//!
//! - [`check`]: the mappings a spec may carry (every create and restore checks them);
//! - [`dev_binds`]: the host device nodes libcontainer binds into such a container
//!   (it cannot `mknod` there), which CRIU must be told are external;
//! - [`exec_view`]: an exec born in the container's user namespace;
//! - [`idmapped_mounts`]: the idmapped mounts a spec asks for, checked;
//! - [`staged_binds`]: copies of bind sources (idmapped ones, and all of a
//!   container with a user namespace) staged where libcontainer and CRIU, from
//!   inside that namespace, can bind them ([`mount_idmap`]: the syscalls);
//! - [`joined`]: a namespace joined by path (a pod's);
//! - [`images`]: CRIU's images, readable by the restored namespace's root;
//! - [`restored`]: the restored processes' mappings must be the spec's (CRIU takes
//!   them from the images, which an archive may have written);
//!
//! Who owns the container's files: the store copies containerd's layers as they are
//! (owners included). `ctr run --uidmap` (and `--remap-labels` on containerd's overlay
//! snapshotter) hands over layers already owned by the mapped ids, so the tree is
//! right as copied. A tree whose root is owned by host root while the spec maps the
//! container's root elsewhere would leave the container's root without its own
//! files: [`tree_owner_mismatch`] names that case and the create fails, rather than
//! running a sandbox that cannot write its own `/`.

pub mod dev_binds;
pub mod exec_view;
pub mod idmapped_mounts;
pub mod images;
pub mod joined;
pub mod mount_idmap;
pub mod restored;
pub mod staged_binds;

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use oci_spec::runtime::{LinuxIdMapping, LinuxNamespaceType, Spec};

/// The most extents the kernel takes in one `uid_map` (`UID_GID_MAP_MAX_EXTENTS`).
pub const MAX_EXTENTS: usize = 340;

/// One line of a `uid_map` / `gid_map`: ids `inside..inside+count` are host ids
/// `host..host+count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Extent {
    /// First id inside the namespace.
    pub inside: u32,
    /// First id on the host.
    pub host: u32,
    /// How many.
    pub count: u32,
}

impl Extent {
    fn from_oci(m: &LinuxIdMapping) -> Extent {
        Extent {
            inside: m.container_id(),
            host: m.host_id(),
            count: m.size(),
        }
    }

    /// The host id of `inside`, if this extent maps it.
    pub fn host_of(&self, inside: u32) -> Option<u32> {
        let off = inside.checked_sub(self.inside)?;
        (off < self.count).then(|| self.host + off)
    }
}

/// A container's id mappings.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Mappings {
    /// `uid_map`.
    pub uids: Vec<Extent>,
    /// `gid_map`.
    pub gids: Vec<Extent>,
}

impl Mappings {
    /// The host uid of the container's root (`None`: unmapped).
    pub fn root_uid(&self) -> Option<u32> {
        self.uids.iter().find_map(|e| e.host_of(0))
    }

    /// The host gid of the container's root group.
    pub fn root_gid(&self) -> Option<u32> {
        self.gids.iter().find_map(|e| e.host_of(0))
    }
}

/// Why a spec's mappings are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Mappings without a new user namespace, or the reverse.
    #[error("{0}")]
    Inconsistent(&'static str),
    /// An extent of zero ids, or one that wraps past 2^32.
    #[error("{which} extent {extent:?} is empty or wraps around")]
    BadExtent {
        /// `uidMappings` or `gidMappings`.
        which: &'static str,
        /// The extent.
        extent: Extent,
    },
    /// More extents than the kernel takes.
    #[error("{which} has {count} extents; the kernel takes at most {MAX_EXTENTS}")]
    TooMany {
        /// `uidMappings` or `gidMappings`.
        which: &'static str,
        /// How many.
        count: usize,
    },
    /// Two extents overlap inside or on the host.
    #[error("{which} extents {a:?} and {b:?} overlap")]
    Overlap {
        /// `uidMappings` or `gidMappings`.
        which: &'static str,
        /// One.
        a: Extent,
        /// The other.
        b: Extent,
    },
    /// The namespace joined by path cannot be read, or maps other ids than the
    /// spec says ([`joined`]).
    #[error("{0}")]
    Joined(String),
    /// An extent maps host root (id 0) into the namespace.
    #[error(
        "{which} extent {extent:?} maps host {kind} 0 into the sandbox: its files \
         and processes would be host root's"
    )]
    HostRoot {
        /// `uidMappings` or `gidMappings`.
        which: &'static str,
        /// uid or gid.
        kind: &'static str,
        /// The extent.
        extent: Extent,
    },
}

/// Whether the container runs in a user namespace other than the host's, one it
/// makes or one it joins ([`joined`]): libcontainer binds host devices into it
/// then (it cannot `mknod` there), which CRIU must be told about.
pub fn in_user_namespace(spec: &Spec) -> bool {
    of_spec(spec).is_some() || joined::path(spec).is_some()
}

/// The spec's own maps, whatever namespace they are for.
fn spec_maps(spec: &Spec) -> Mappings {
    let conv = |v: Option<&Vec<LinuxIdMapping>>| {
        v.into_iter()
            .flatten()
            .map(Extent::from_oci)
            .collect::<Vec<_>>()
    };
    let linux = spec.linux().as_ref();
    Mappings {
        uids: conv(linux.and_then(|l| l.uid_mappings().as_ref())),
        gids: conv(linux.and_then(|l| l.gid_mappings().as_ref())),
    }
}

/// The spec's mappings, when it asks for a new user namespace (`None`: it runs in
/// the host's, or joins one by path).
pub fn of_spec(spec: &Spec) -> Option<Mappings> {
    let linux = spec.linux().as_ref()?;
    let new_userns = linux
        .namespaces()
        .iter()
        .flatten()
        .any(|n| n.typ() == LinuxNamespaceType::User && n.path().is_none());
    new_userns.then(|| spec_maps(spec))
}

/// Checks the mappings a spec asks for: each extent non-empty and within 32 bits, at
/// most [`MAX_EXTENTS`], no two overlapping (inside or on the host), both maps given
/// together with a new user namespace, and host id 0 in neither: a sandbox whose
/// files and processes could be host root's is no sandbox. The kernel would refuse
/// the first ones at the write of `uid_map`; this names them before anything runs.
///
/// A namespace joined by path ([`joined`]) is checked the same way, on the maps
/// it really has; the spec's, if given, must be those.
pub fn check(spec: &Spec) -> Result<Option<Mappings>, Refused> {
    if let Some(path) = joined::path(spec) {
        let ns = joined::maps_of(&path).map_err(Refused::Joined)?;
        joined::spec_agrees(&spec_maps(spec), &ns).map_err(Refused::Joined)?;
        check_extents("the joined namespace's uid_map", "uid", &ns.uids)?;
        check_extents("the joined namespace's gid_map", "gid", &ns.gids)?;
        return Ok(Some(ns));
    }
    let linux = spec.linux().as_ref();
    let has_maps = linux.is_some_and(|l| {
        l.uid_mappings().as_ref().is_some_and(|m| !m.is_empty())
            || l.gid_mappings().as_ref().is_some_and(|m| !m.is_empty())
    });
    let Some(maps) = of_spec(spec) else {
        if has_maps {
            return Err(Refused::Inconsistent(
                "uidMappings/gidMappings given without a new user namespace",
            ));
        }
        return Ok(None);
    };
    if maps.uids.is_empty() || maps.gids.is_empty() {
        return Err(Refused::Inconsistent(
            "a new user namespace needs both uidMappings and gidMappings",
        ));
    }
    check_extents("uidMappings", "uid", &maps.uids)?;
    check_extents("gidMappings", "gid", &maps.gids)?;
    Ok(Some(maps))
}

fn check_extents(
    which: &'static str,
    kind: &'static str,
    extents: &[Extent],
) -> Result<(), Refused> {
    if extents.len() > MAX_EXTENTS {
        return Err(Refused::TooMany {
            which,
            count: extents.len(),
        });
    }
    let end = |start: u32, count: u32| u64::from(start) + u64::from(count);
    for e in extents {
        if e.count == 0 || end(e.inside, e.count) > 1 << 32 || end(e.host, e.count) > 1 << 32 {
            return Err(Refused::BadExtent { which, extent: *e });
        }
        if e.host == 0 {
            return Err(Refused::HostRoot {
                which,
                kind,
                extent: *e,
            });
        }
    }
    for (i, a) in extents.iter().enumerate() {
        for b in &extents[i + 1..] {
            let overlap =
                |x: u32, y: u32| u64::from(x) < end(y, b.count) && u64::from(y) < end(x, a.count);
            if overlap(a.inside, b.inside) || overlap(a.host, b.host) {
                return Err(Refused::Overlap {
                    which,
                    a: *a,
                    b: *b,
                });
            }
        }
    }
    Ok(())
}

/// The owner of the tree's root (`root_owner`: its host uid and gid) against what
/// the container's root is mapped to: `Some(reason)` when the tree was not made for
/// these mappings (its files are host root's, or another range's).
pub fn tree_owner_mismatch(maps: &Mappings, root_owner: (u32, u32)) -> Option<String> {
    let want = (maps.root_uid()?, maps.root_gid()?);
    (root_owner != want).then(|| {
        format!(
            "the container's root file system is owned by host {}:{}, but its \
             user namespace maps root to {}:{}: give it layers owned by the mapped \
             ids (ctr run --uidmap does; containerd's snapshotter remaps with \
             --remap-labels)",
            root_owner.0, root_owner.1, want.0, want.1
        )
    })
}

/// What a create or a restore checks of a bundle's ids: with a user namespace,
/// the mappings ([`check`]) and that its root file system was made for them
/// ([`tree_owner_mismatch`]); the idmapped mounts it asks for
/// ([`idmapped_mounts::requests`]). Answers the mappings (`None`: no user
/// namespace).
pub fn check_bundle(bundle: &Path, spec: &Spec) -> crate::Result<Option<Mappings>> {
    let invalid = |message: String| crate::Error::InvalidSpec {
        bundle: bundle.to_path_buf(),
        message,
    };
    let maps = check(spec).map_err(|e| invalid(e.to_string()))?;
    idmapped_mounts::requests(bundle, spec, maps.as_ref())?;
    let Some(maps) = maps else {
        return Ok(None);
    };
    let root = match spec.root().as_ref().map(|r| r.path().clone()) {
        Some(p) if p.is_absolute() => p,
        Some(p) => bundle.join(p),
        None => bundle.join("rootfs"),
    };
    let meta =
        std::fs::metadata(&root).map_err(crate::Error::io(format!("stat {}", root.display())))?;
    if let Some(why) = tree_owner_mismatch(&maps, (meta.uid(), meta.gid())) {
        return Err(invalid(why));
    }
    Ok(Some(maps))
}

#[cfg(test)]
mod tests;
