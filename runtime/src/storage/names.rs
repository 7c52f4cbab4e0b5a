//! Names in the pool: container keys and snapshot names.
//!
//! They become path components and dataset names, so only a safe alphabet is allowed,
//! and names starting with `.` are reserved for in-flight operations.

use std::fmt;

use crate::{Error, Result};

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
