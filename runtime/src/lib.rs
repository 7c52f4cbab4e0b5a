//! Crab's container runtime: everything the shim needs to know about containers, with
//! nothing about containerd or its wire protocol.
//!
//! - [`sandbox`]: the facade over one container that Crab's operations go through
//!   (create, start, exec, checkpoint, turn, rollback of files and processes, a
//!   restore from a directory or a history with its images pinned, export), with
//!   their invariants (the host's slots, the inspector's taint, the history lock,
//!   the fast-forward plan). Modules marked *internal* below are `pub(crate)`.
//! - [`config`]: the runtime configuration (TOML) and how it is found.
//! - [`container`]: one container driven through youki's `libcontainer`.
//! - [`control`]: the control socket's requests and answers (the shim serves it).
//! - [`error`]: the crate's errors, each of one [`error::ErrorKind`].
//! - [`helper`]: the short-lived helper process in which `libcontainer` forks, so that
//!   the multithreaded shim never forks without exec.
//! - `tracking` (internal): the per-container cgroup2 directory that identifies its tasks to eBPF.
//! - `cgroup_view` (internal): the cgroup file system a container sees (read-only, its own
//!   cgroups only, external to CRIU).
//! - [`metrics`]: cgroup statistics of a container; [`oom`]: its OOM events;
//!   [`cgroup2`]: its cgroup on a cgroup v2-only host (paths, interface files).
//! - [`stopped`]: tasks stopped by a signal, which no dump can take from a frozen cgroup.
//! - `netns` (internal): network namespaces (what a restore puts back in them).
//! - [`checkpoint`]: checkpoint directories (CRIU images, the file-system delta applied
//!   beneath the tree, the manifest), a container's history
//!   ([`checkpoint::history_store`]), the host's checkpoint queue, the spec's hooks at
//!   a restore ([`checkpoint::hooks`]); [`criu`] runs CRIU.
//! - [`api_token`]: the per-sandbox token of the agent API.
//! - [`inspect`]: a turn's classification: what changed (observed) and
//!   the pure decision (`inspect::policy`).
//! - [`userns`]: sandboxes with a user namespace (the mappings a spec may ask for,
//!   the host device binds CRIU must treat as external).
//! - [`storage`]: snapshot-capable root file systems (btrfs, zfs, overlay), and the
//!   adoption of a root a client mounted itself (Docker's, [`storage::adopt`]).

// Module docs name the internal (`pub(crate)`) modules that do the work, for
// readers of the source: `cargo doc --document-private-items` renders those
// links; the public docs leave them as text.
#![allow(rustdoc::private_intra_doc_links)]

pub mod api_token;
pub mod cgroup2;
pub(crate) mod cgroup_view;
pub mod checkpoint;
pub mod config;
pub mod container;
pub mod control;
pub mod criu;
pub mod error;
pub(crate) mod file_lock;
pub mod helper;
pub mod inspect;
pub mod metrics;
pub mod netns;
pub mod oom;
pub mod peer;
pub mod pkeys;
pub mod resume;
pub mod sandbox;
pub mod socket_path;
pub mod standby;
pub mod stopped;
pub mod storage;
pub(crate) mod tracking;
pub mod userns;

pub use error::{Error, Result};
/// Re-exported so that callers build specs with the same version this crate reads.
pub use oci_spec;
