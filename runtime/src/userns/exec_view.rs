//! How an exec joins a container's user namespace through libcontainer.
//!
//! libcontainer 0.7's exec (its tenant builder) joins the init's namespaces except
//! its user namespace, so in a container with one the exec'd process would run as
//! host root, with every capability over the host, inside the container's other
//! namespaces. The helper therefore joins the init's user namespace itself before
//! libcontainer forks: the new process is then born in it, holds capabilities
//! there only, and joins the container's other namespaces, which that namespace
//! owns.
//!
//! libcontainer then sees a caller inside a user namespace ("rootless") and, while
//! it validates the init's spec again, refuses the init's supplementary groups
//! (`additionalGids`), which an unprivileged caller could not have set up. They are
//! not what the exec'd process gets (that is its own `process.json`'s, set with
//! `setgroups` inside the namespace). So the exec runs against a view of the
//! container made for it: a copy of libcontainer's state whose bundle holds the
//! init's spec with its root made absolute and those groups left out. The view
//! lives in a directory of the helper's own, removed when the exec is done.

use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// A directory holding libcontainer's view of container `id` for one exec.
#[derive(Debug)]
pub struct ExecView {
    root: PathBuf,
}

impl ExecView {
    /// Makes the view of container `id` (libcontainer's state under `root`) in
    /// `<root>/.exec-<helper pid>`; `bundle` is the container's OCI bundle.
    pub fn make(root: &Path, id: &str, bundle: &Path) -> Result<ExecView> {
        let view = root.join(format!(".exec-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&view);
        let made = ExecView { root: view };
        let dir = made.root.join(id);
        let new_bundle = made.root.join("bundle");
        for d in [&dir, &new_bundle] {
            std::fs::create_dir_all(d).map_err(Error::io(format!("create {}", d.display())))?;
        }
        let src = root.join(id);
        for entry in
            std::fs::read_dir(&src).map_err(Error::io(format!("read {}", src.display())))?
        {
            let entry = entry.map_err(Error::io(format!("read {}", src.display())))?;
            let name = entry.file_name();
            if !entry.file_type().map(|t| t.is_file()).unwrap_or(false)
                || !name.to_string_lossy().ends_with(".json")
            {
                continue;
            }
            let text = std::fs::read(entry.path())
                .map_err(Error::io(format!("read {}", entry.path().display())))?;
            let text = if name == "state.json" {
                let mut state: serde_json::Value = serde_json::from_slice(&text)
                    .map_err(|e| Error::io("parse libcontainer's state")(e.into()))?;
                state["bundle"] = serde_json::Value::String(new_bundle.display().to_string());
                serde_json::to_vec(&state).expect("a JSON value serializes")
            } else {
                text
            };
            let to = dir.join(&name);
            std::fs::write(&to, text).map_err(Error::io(format!("write {}", to.display())))?;
        }
        let spec_path = bundle.join("config.json");
        let text = std::fs::read(&spec_path)
            .map_err(Error::io(format!("read {}", spec_path.display())))?;
        let mut spec: serde_json::Value = serde_json::from_slice(&text)
            .map_err(|e| Error::io(format!("parse {}", spec_path.display()))(e.into()))?;
        adapt_spec(&mut spec, bundle);
        let to = new_bundle.join("config.json");
        std::fs::write(
            &to,
            serde_json::to_vec(&spec).expect("a JSON value serializes"),
        )
        .map_err(Error::io(format!("write {}", to.display())))?;
        Ok(made)
    }

    /// The state root libcontainer's exec is given.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

impl Drop for ExecView {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// The init's spec as the exec's validation reads it: root absolute (the view's
/// bundle is elsewhere), no supplementary groups for the init.
pub fn adapt_spec(spec: &mut serde_json::Value, bundle: &Path) {
    if let Some(path) = spec.pointer("/root/path").and_then(|p| p.as_str()) {
        if !Path::new(path).is_absolute() {
            spec["root"]["path"] =
                serde_json::Value::String(bundle.join(path).display().to_string());
        }
    }
    if let Some(user) = spec
        .pointer_mut("/process/user")
        .and_then(|u| u.as_object_mut())
    {
        user.remove("additionalGids");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_the_view_has_an_absolute_root_and_no_init_groups() {
        let mut spec = serde_json::json!({
            "root": {"path": "rootfs"},
            "process": {"user": {"uid": 0, "gid": 0, "additionalGids": [0, 10]}, "args": ["sh"]}
        });
        adapt_spec(&mut spec, Path::new("/b/x"));
        assert_eq!(spec["root"]["path"], "/b/x/rootfs");
        assert!(spec["process"]["user"].get("additionalGids").is_none());
        assert_eq!(spec["process"]["args"][0], "sh");
    }
}
