//! Idmapped mounts (a mount's `uidMappings` / `gidMappings`, or its `idmap` and
//! `ridmap` options): refused, not mounted with the host's ids.
//!
//! libcontainer 0.7 parses the options and drops them, and never sets
//! `MOUNT_ATTR_IDMAP`: the mount would be made plain, its files seen inside with
//! their host owners (host root's as `nobody` in a user namespace) and written as
//! the container's host ids, not the ones the client asked for. containerd 2.x
//! asks the shim first (`-info` reports idmapped mounts unsupported) and refuses
//! such a task itself; containerd 1.7 and other clients do not, so the runtime
//! refuses it at create and restore, naming the mount.

use std::path::Path;

use oci_spec::runtime::Spec;

/// `Err` names the first mount of `spec` that asks for an idmapped mount.
pub fn refuse(bundle: &Path, spec: &Spec) -> crate::Result<()> {
    for m in spec.mounts().iter().flatten() {
        let by_option = m
            .options()
            .iter()
            .flatten()
            .find(|o| *o == "idmap" || *o == "ridmap");
        let by_maps = m.uid_mappings().as_ref().is_some_and(|v| !v.is_empty())
            || m.gid_mappings().as_ref().is_some_and(|v| !v.is_empty());
        if by_option.is_some() || by_maps {
            let how = by_option.map_or("uidMappings/gidMappings".to_string(), |o| {
                format!("option {o:?}")
            });
            return Err(crate::Error::InvalidSpec {
                bundle: bundle.to_path_buf(),
                message: format!(
                    "mount {} asks for an idmapped mount ({how}), which this runtime \
                     does not make (libcontainer 0.7): refused rather than mounted \
                     with the host's ids",
                    m.destination().display()
                ),
            });
        }
    }
    Ok(())
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

    #[test]
    fn test_idmapped_mounts_are_refused_by_option_or_maps() {
        let b = Path::new("/b");
        let plain = spec(serde_json::json!({"destination": "/data", "type": "bind",
            "source": "/srv", "options": ["rbind", "rro"]}));
        refuse(b, &plain).unwrap();
        for options in [["rbind", "idmap"], ["rbind", "ridmap"]] {
            let s = spec(serde_json::json!({"destination": "/data", "type": "bind",
                "source": "/srv", "options": options}));
            let e = refuse(b, &s).unwrap_err().to_string();
            assert!(e.contains("/data") && e.contains("idmap"), "{e}");
        }
        let by_maps = spec(serde_json::json!({"destination": "/data", "type": "bind",
            "source": "/srv", "options": ["rbind"],
            "uidMappings": [{"containerID": 0, "hostID": 100000, "size": 65536}],
            "gidMappings": [{"containerID": 0, "hostID": 100000, "size": 65536}]}));
        let e = refuse(b, &by_maps).unwrap_err().to_string();
        assert!(e.contains("uidMappings"), "{e}");
    }
}
