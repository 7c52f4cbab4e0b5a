//! Stat, Update (labels) and List (every snapshot).

use std::time::SystemTime;

use crate::error::{Error, Result};
use crate::meta::Record;
use crate::snapshotter::{check_key, Snapshotter};

impl Snapshotter {
    /// The record of snapshot `key`.
    pub fn stat(&self, key: &str) -> Result<Record> {
        check_key("key", key)?;
        self.lock().get(key).cloned()
    }

    /// Changes the labels of snapshot `key`: with no `paths`, or `labels`, all of
    /// them become `labels`; `labels.<name>` sets (or, absent from `labels`,
    /// removes) one. Other fields cannot change.
    pub fn update(
        &self,
        key: &str,
        labels: std::collections::BTreeMap<String, String>,
        paths: &[String],
    ) -> Result<Record> {
        check_key("key", key)?;
        let mut meta = self.lock();
        let mut rec = meta.get(key)?.clone();
        if paths.is_empty() {
            rec.labels = labels;
        } else {
            for p in paths {
                match p.strip_prefix("labels.") {
                    Some(name) => match labels.get(name) {
                        Some(v) => {
                            rec.labels.insert(name.to_string(), v.clone());
                        }
                        None => {
                            rec.labels.remove(name);
                        }
                    },
                    None if p == "labels" => rec.labels = labels.clone(),
                    None => {
                        return Err(Error::InvalidArgument(format!(
                            "cannot update field {p:?} of a snapshot"
                        )))
                    }
                }
            }
        }
        rec.updated = SystemTime::now();
        let old = meta.snapshots.insert(key.to_string(), rec.clone());
        if let Err(e) = self.save(&meta) {
            if let Some(old) = old {
                meta.snapshots.insert(key.to_string(), old);
            }
            return Err(e);
        }
        Ok(rec)
    }

    /// Every snapshot, by key.
    pub fn list(&self) -> Vec<(String, Record)> {
        self.lock()
            .snapshots
            .iter()
            .map(|(k, r)| (k.clone(), r.clone()))
            .collect()
    }
}
