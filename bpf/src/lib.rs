//! Crab's host-wide eBPF inspector.
//!
//! One set of programs per host (tp_btf on system call entry and exit, process
//! fork, exec, exit and cgroup attach), loaded by the first user and
//! pinned in bpffs; every later user opens the pinned maps. Per-container state is
//! keyed by the container's cgroup2 id. See docs/inspector.md for what is recorded
//! and why it is sound.
//!
//! This crate knows the kernel side only: which names changed on which device,
//! which tasks were born or died. What that means for a checkpoint (the
//! skip / fs / process / full policy) lives in the runtime.

mod abi;
mod error;
mod maps;
mod pin;

pub use abi::{budget, kernel_dev, opaque, Counters, FsChange, FsFlags, ProcChange};
pub use error::{Error, Result};
pub use maps::Inspector;
pub use pin::{stale_sets, StaleSet, DEFAULT_PIN_ROOT, PIN_VERSION};

#[allow(
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    unsafe_op_in_unsafe_fn,
    unused_imports,
    missing_docs
)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/inspector.skel.rs"));
}
