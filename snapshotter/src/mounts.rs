//! The mounts of a snapshot, as containerd's overlay snapshotter gives them: a bind
//! mount of the layer when it has no parent (or a view of a single layer), else an
//! overlay of the parents' layers (topmost first) under the active layer's upper dir.

use containerd_client::types::Mount;

use crate::error::Result;
use crate::meta::{Kind, Meta};
use crate::snapshotter::Snapshotter;

impl Snapshotter {
    /// The mounts of snapshot `key`.
    pub(crate) fn mounts_of(&self, meta: &Meta, key: &str) -> Result<Vec<Mount>> {
        let rec = meta.get(key)?;
        // A committed layer's own files are the top of what it shows.
        let own = (rec.kind == Kind::Committed).then_some(rec);
        let lowers: Vec<String> = own
            .into_iter()
            .chain(meta.ancestors(key)?)
            .map(|r| self.fs(r.id).display().to_string())
            .collect();
        let bind = |source: String, rw: bool| Mount {
            r#type: "bind".into(),
            source,
            target: String::new(),
            options: vec![if rw { "rw" } else { "ro" }.into(), "rbind".into()],
        };
        let overlay = |mut options: Vec<String>| {
            if std::path::Path::new("/sys/module/overlay/parameters/index").exists() {
                options.insert(0, "index=off".into());
            }
            Mount {
                r#type: "overlay".into(),
                source: "overlay".into(),
                target: String::new(),
                options,
            }
        };
        Ok(match (rec.kind, lowers.len()) {
            (Kind::Active, 0) => vec![bind(self.fs(rec.id).display().to_string(), true)],
            (Kind::Active, _) => vec![overlay(vec![
                format!("workdir={}", self.work(rec.id).display()),
                format!("upperdir={}", self.fs(rec.id).display()),
                format!("lowerdir={}", lowers.join(":")),
            ])],
            // A view of nothing: its own (empty) directory.
            (_, 0) => vec![bind(self.fs(rec.id).display().to_string(), false)],
            (_, 1) => vec![bind(lowers[0].clone(), false)],
            (_, _) => vec![overlay(vec![format!("lowerdir={}", lowers.join(":"))])],
        })
    }
}
