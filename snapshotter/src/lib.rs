//! Crab's containerd snapshotter, served to containerd as a proxy plugin.
//!
//! containerd's CRI plugin tells kubelet a container's writable layer from the
//! `Usage` of the container's snapshot, and it asks only the CRI's default
//! snapshotter (containerd 1.7 and 2.1 alike). A crab container writes into its
//! tree in Crab's store, so containerd's own snapshot stays empty. This snapshotter
//! is an overlay snapshotter like containerd's (runc's containers and image layers
//! behave as they do there), whose `Usage` of a layer Crab's store made a tree for
//! is what that tree wrote ([`crab_runtime::storage::usage`]). See the
//! Kubernetes page of the documentation for the configuration.

pub mod error;
pub mod meta;
mod mounts;
mod ops;
pub mod serve;
pub mod service;
pub mod snapshotter;

pub use error::{Error, Result};
pub use snapshotter::{Snapshotter, Trees};

/// The generated server half of `containerd.services.snapshots.v1.Snapshots`.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    /// `google.protobuf.Empty`, as prost has it.
    pub type Empty = ();

    include!(concat!(
        env!("OUT_DIR"),
        "/containerd.services.snapshots.v1.Snapshots.rs"
    ));
}
