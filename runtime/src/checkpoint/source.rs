//! Where a new task's processes come from when it is not started afresh: the task
//! option that `crabctl restore`, `fork` and `import` send through containerd's
//! `CreateTask` (containerd hands task options to the shim as they are).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The type URL of [`RestoreOptions`] in a task's options (the value is JSON).
pub const RESTORE_OPTIONS_TYPE: &str = "io.crab.v1.RestoreOptions";

/// Where the checkpoint is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "from", rename_all = "kebab-case")]
pub enum Source {
    /// A checkpoint in a container's history on this host: the same container (after
    /// a crash) or another one (a fork, which gets a clone of its file system).
    History {
        /// The checkpointed container's namespace.
        namespace: String,
        /// Its id.
        id: String,
        /// The checkpoint's name or seq.
        checkpoint: String,
    },
    /// An unpacked checkpoint directory (an export from another host), laid out like
    /// the ones containerd hands over ([`crate::checkpoint`]).
    Dir {
        /// The directory.
        path: PathBuf,
    },
}

/// The task option.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreOptions {
    /// Where from.
    pub source: Source,
    /// The container's runtime options, carried over (task options replace them).
    #[serde(default)]
    pub config_path: Option<String>,
    /// See `config_path`.
    #[serde(default)]
    pub config_body: Option<String>,
}

impl RestoreOptions {
    /// Decodes the option value (JSON).
    pub fn decode(value: &[u8]) -> Result<RestoreOptions, String> {
        serde_json::from_slice(value).map_err(|e| format!("bad {RESTORE_OPTIONS_TYPE}: {e}"))
    }

    /// Encodes the option value.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("options serialize")
    }
}
