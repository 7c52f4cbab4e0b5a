//! Idmapped mounts: a bind mount whose files the container sees through an id
//! mapping (the mount's `uidMappings` / `gidMappings`, or its `idmap` / `ridmap`
//! option with the container's own maps). What containerd 2.x's CRI gives every
//! mount of a `hostUsers: false` pod: files the host's root owns are the
//! container root's inside, and what the container's root writes is the host
//! root's on disk.
//!
//! libcontainer 0.7 refuses such a spec. The runtime makes a detached copy of
//! each source with `MOUNT_ATTR_IDMAP` ([`super::mount_idmap`]) and libcontainer
//! binds that copy, staged for the length of the create or restore
//! ([`super::staged_binds`]); a bind keeps its source's mapping.
//!
//! Checked before anything is mounted: only bind mounts, both maps or neither
//! (then the container's), the extents as a namespace's are checked (no host
//! id 0), an absolute source.

use std::path::{Path, PathBuf};

use oci_spec::runtime::{LinuxIdMapping, Mount, Spec};

use super::mount_idmap::Recursion;
use super::{check_extents, Extent, Mappings};
use crate::{Error, Result};

/// One idmapped mount a spec asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Its index in the spec's mounts.
    pub index: usize,
    /// What is bound.
    pub source: PathBuf,
    /// Where, in the container.
    pub destination: PathBuf,
    /// The mount's uid mapping.
    pub uids: Vec<Extent>,
    /// The mount's gid mapping.
    pub gids: Vec<Extent>,
    /// Submounts copied and idmapped too.
    pub how: Recursion,
}

/// Whether mount `m` asks to be idmapped.
pub fn asks(m: &Mount) -> bool {
    let by_option = has_option(m, "idmap") || has_option(m, "ridmap");
    by_option || !maps_of(m.uid_mappings()).is_empty() || !maps_of(m.gid_mappings()).is_empty()
}

/// `m` without what asks for an idmapped mount (its `idmap` / `ridmap` options
/// and its maps): what libcontainer 0.7 accepts.
pub fn strip(m: &mut Mount) {
    let options = m.options().as_ref().map(|o| {
        o.iter()
            .filter(|o| *o != "idmap" && *o != "ridmap")
            .cloned()
            .collect()
    });
    m.set_options(options);
    m.set_uid_mappings(None);
    m.set_gid_mappings(None);
}

/// Whether `m` is a bind mount (its type, or a `bind` / `rbind` option).
pub fn is_bind(m: &Mount) -> bool {
    m.typ().as_deref() == Some("bind") || has_option(m, "bind") || has_option(m, "rbind")
}

pub(super) fn has_option(m: &Mount, name: &str) -> bool {
    m.options().iter().flatten().any(|o| o == name)
}

fn maps_of(v: &Option<Vec<LinuxIdMapping>>) -> Vec<Extent> {
    v.iter().flatten().map(Extent::from_oci).collect()
}

/// The idmapped mounts of `spec`, checked. `container`: the maps of the
/// container's user namespace (new or joined), which a mount asking by option
/// alone takes.
pub fn requests(bundle: &Path, spec: &Spec, container: Option<&Mappings>) -> Result<Vec<Request>> {
    let mut out = Vec::new();
    for (index, m) in spec.mounts().iter().flatten().enumerate() {
        if !asks(m) {
            continue;
        }
        let refuse = |why: String| Error::InvalidSpec {
            bundle: bundle.to_path_buf(),
            message: format!(
                "mount {} asks for an idmapped mount: {why}",
                m.destination().display()
            ),
        };
        if !is_bind(m) {
            return Err(refuse("only bind mounts are idmapped".into()));
        }
        let (mut uids, mut gids) = (maps_of(m.uid_mappings()), maps_of(m.gid_mappings()));
        match (uids.is_empty(), gids.is_empty(), container) {
            (false, false, _) => {}
            (true, true, Some(c)) => (uids, gids) = (c.uids.clone(), c.gids.clone()),
            (true, true, None) => {
                return Err(refuse(
                    "it gives no uidMappings/gidMappings and the container has no user \
                     namespace whose maps it could take"
                        .into(),
                ))
            }
            _ => return Err(refuse("it needs both uidMappings and gidMappings".into())),
        }
        check_extents("the mount's uidMappings", "uid", &uids)
            .map_err(|e| refuse(e.to_string()))?;
        check_extents("the mount's gidMappings", "gid", &gids)
            .map_err(|e| refuse(e.to_string()))?;
        let source = match m.source() {
            Some(s) if s.is_absolute() => s.clone(),
            _ => return Err(refuse("its source is not an absolute path".into())),
        };
        out.push(Request {
            index,
            source,
            destination: m.destination().clone(),
            uids,
            gids,
            how: Recursion {
                tree: has_option(m, "rbind"),
                idmap: has_option(m, "ridmap"),
            },
        });
    }
    Ok(out)
}

/// [`requests`], with the container's maps checked first (and answered).
pub fn checked_requests(bundle: &Path, spec: &Spec) -> Result<(Vec<Request>, Option<Mappings>)> {
    let maps = super::check(spec).map_err(|e| Error::InvalidSpec {
        bundle: bundle.to_path_buf(),
        message: e.to_string(),
    })?;
    Ok((requests(bundle, spec, maps.as_ref())?, maps))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(mount: serde_json::Value) -> Spec {
        serde_json::from_value(serde_json::json!({
            "ociVersion": "1.0.2",
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                mount,
            ],
        }))
        .unwrap()
    }

    fn maps() -> Mappings {
        let e = Extent {
            inside: 0,
            host: 100_000,
            count: 65_536,
        };
        Mappings {
            uids: vec![e],
            gids: vec![e],
        }
    }

    #[test]
    fn test_a_mount_asks_by_option_or_by_maps_and_takes_the_containers_maps_by_option() {
        let b = Path::new("/b");
        let plain = spec(serde_json::json!({"destination": "/data", "type": "bind",
            "source": "/srv", "options": ["rbind", "rro"]}));
        assert!(requests(b, &plain, Some(&maps())).unwrap().is_empty());
        let by_option = spec(serde_json::json!({"destination": "/data", "type": "bind",
            "source": "/srv", "options": ["rbind", "ridmap"]}));
        let r = requests(b, &by_option, Some(&maps())).unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].index, r[0].uids.clone()), (1, maps().uids));
        assert_eq!(
            r[0].how,
            Recursion {
                tree: true,
                idmap: true
            }
        );
        let e = requests(b, &by_option, None).unwrap_err().to_string();
        assert!(
            e.contains("/data") && e.contains("no user namespace"),
            "{e}"
        );
        let by_maps = spec(
            serde_json::json!({"destination": "/etc/hosts", "type": "bind",
            "source": "/srv/hosts", "options": ["rbind", "rprivate", "rw"],
            "uidMappings": [{"containerID": 0, "hostID": 200000, "size": 65536}],
            "gidMappings": [{"containerID": 0, "hostID": 200000, "size": 65536}]}),
        );
        let r = requests(b, &by_maps, None).unwrap();
        assert_eq!(r[0].uids[0].host, 200_000);
        assert!(!r[0].how.idmap);
    }

    #[test]
    fn test_bad_idmapped_mounts_are_refused_naming_the_mount() {
        let b = Path::new("/b");
        let cases = [
            (
                serde_json::json!({"destination": "/t", "type": "tmpfs", "source": "tmpfs",
                    "options": ["idmap"]}),
                "only bind mounts",
            ),
            (
                serde_json::json!({"destination": "/t", "type": "bind", "source": "/srv",
                    "uidMappings": [{"containerID": 0, "hostID": 100000, "size": 1}]}),
                "both",
            ),
            (
                serde_json::json!({"destination": "/t", "type": "bind", "source": "/srv",
                    "uidMappings": [{"containerID": 0, "hostID": 0, "size": 1}],
                    "gidMappings": [{"containerID": 0, "hostID": 0, "size": 1}]}),
                "host uid 0",
            ),
            (
                serde_json::json!({"destination": "/t", "type": "bind", "source": "srv",
                    "options": ["idmap"]}),
                "absolute",
            ),
        ];
        for (mount, needle) in cases {
            let e = requests(b, &spec(mount), Some(&maps()))
                .unwrap_err()
                .to_string();
            assert!(e.contains("/t") && e.contains(needle), "{needle}: {e}");
        }
    }
}
