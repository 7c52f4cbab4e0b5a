//! Names in the pool: container keys and snapshot names.
//!
//! They become path components and dataset names, so only a safe alphabet is allowed,
//! and names starting with `.` are reserved for in-flight operations.

use std::fmt;

use crate::{Error, Result};

/// The area of a pool that holds the containers' trees.
pub(crate) const CONTAINERS: &str = "containers";
/// The area of a pool (btrfs, overlay) that holds the containers' snapshots.
pub(crate) const SNAPSHOTS: &str = "snapshots";
/// The area of a pool that holds in-flight work.
pub(crate) const TMP: &str = "tmp";
/// The area of a pool (btrfs, ZFS) that holds the images' read-only copies.
pub(crate) const IMAGES: &str = "images";

/// A container in the pool: its containerd namespace and id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ContainerKey {
    namespace: String,
    id: String,
}

impl ContainerKey {
    /// Validates both parts.
    pub fn new(namespace: &str, id: &str) -> Result<ContainerKey> {
        check("namespace", namespace)?;
        check("container id", id)?;
        Ok(ContainerKey {
            namespace: namespace.to_string(),
            id: id.to_string(),
        })
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The container id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// `<area>/<ns>/<id>`: the container's place below one of a store's areas
    /// (`containers`, `snapshots`), as a relative path or the end of a dataset name.
    pub fn place(&self, area: &str) -> String {
        format!("{area}/{}/{}", self.namespace, self.id)
    }
}

/// The container has no snapshot `name`.
pub(crate) fn snapshot_not_found(key: &ContainerKey, name: &str) -> Error {
    Error::SnapshotNotFound {
        container: key.to_string(),
        name: name.to_string(),
    }
}

/// The container has a snapshot `name` already.
pub(crate) fn snapshot_exists(key: &ContainerKey, name: &str) -> Error {
    Error::SnapshotExists {
        container: key.to_string(),
        name: name.to_string(),
    }
}

/// The container has a tree in the store already.
pub(crate) fn tree_exists(key: &ContainerKey) -> Error {
    Error::AlreadyExists(format!("{key} (its tree in the store)"))
}

impl fmt::Display for ContainerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.id)
    }
}

/// Checks a snapshot name.
pub fn check_snapshot_name(name: &str) -> Result<()> {
    check("snapshot name", name)
}

fn check(what: &'static str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(Error::BadName {
            what,
            name: name.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_good_names_pass() {
        for n in ["a", "turn-12", "ck_3.full", "k8s.io"] {
            check_snapshot_name(n).unwrap();
        }
        ContainerKey::new("k8s.io", "abc-123").unwrap();
    }

    #[test]
    fn test_place_is_below_the_area() {
        let k = ContainerKey::new("k8s.io", "abc").unwrap();
        assert_eq!(k.place("containers"), "containers/k8s.io/abc");
    }

    #[test]
    fn test_bad_names_are_rejected_with_the_name() {
        for n in [
            "",
            ".hidden",
            "-x",
            "a/b",
            "..",
            "a b",
            "x@y",
            &"n".repeat(129),
        ] {
            let e = check_snapshot_name(n).unwrap_err().to_string();
            assert!(e.contains("snapshot name"), "{n}: {e}");
        }
        assert!(ContainerKey::new("ns", "../etc").is_err());
    }
}
