//! `containerd-shim-crab-v2`: containerd's task API (v2) over [`crab_runtime`].
//!
//! - [`service`]: the shim process (start, delete, serve).
//! - [`task`]: the task service, one method per RPC; [`task_impl`] is the ttrpc adapter.
//! - [`containers`]: the containers a shim serves, each behind its own lock.
//! - [`io`], [`console`]: stdio between containerd's fifos and the container.
//! - [`dead_socket`]: what a killed shim's cleanup removes so the next shim starts at once.
//! - [`events`], [`oom`], [`metrics`], [`rootfs`], [`options`]: what the names say.
//! - [`error`]: the one mapping from errors to ttrpc codes.

pub mod adopt;
pub mod checkpoint;
pub mod console;
pub mod container_options;
pub mod containers;
pub mod control;
pub mod cri_checkpoint;
pub mod dead_socket;
pub mod error;
pub mod events;
pub mod exec_wait;
pub mod fork_group;
pub mod info;
pub mod instance;
pub mod io;
pub mod log_uri;
pub mod logging;
pub mod metrics;
pub mod oom;
pub mod options;
pub mod process;
pub mod proxy;
pub mod proxy_listener;
pub mod rootfs;
pub mod service;
pub mod shim_cgroup;
pub mod spec_env;
pub mod standby;
pub mod standby_forks;
pub mod task;
pub mod task_impl;
pub mod turn;

/// The runtime name containerd knows this shim by.
pub const RUNTIME_ID: &str = "io.containerd.crab.v2";

/// The binary's entry point: the helper (before any thread exists), or the shim.
pub fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(crab_runtime::helper::HELPER_ARG) {
        crab_runtime::helper::main(&args[2..]);
    }
    if args.get(1).map(String::as_str) == Some("-info") {
        info::main();
    }
    if crab_runtime::checkpoint::hooks::is_action_script() {
        crab_runtime::checkpoint::hooks::main();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(containerd_shim::asynchronous::run::<service::Service>(
        RUNTIME_ID, None,
    ));
    // Do not wait for blocking threads that may still sit in a syscall (such as a fifo
    // open no client will complete): the shim's work is done.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
}
