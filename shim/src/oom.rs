//! Publishing containerd's OOM event when the kernel's OOM killer hits a container.

use containerd_shim::protos::events::task::TaskOOM;
use crab_runtime::container::Container;
use crab_runtime::oom::OomWatch;
use tokio::io::unix::AsyncFd;
use tokio::task::JoinHandle;

use crate::events::Events;

/// Starts watching `container`'s memory cgroup (v1's memory controller, or v2's
/// `memory.events` on a cgroup v2-only host); `None` where there is no memory
/// controller to watch (the watch is best-effort and never fails a create).
pub fn watch(container: &Container, events: Events) -> Option<JoinHandle<()>> {
    let path = container.cgroup_path().ok()?;
    let watch = match OomWatch::register(&path) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(id = container.id(), error = %e, "no OOM notifications");
            return None;
        }
    };
    let id = container.id().to_string();
    Some(tokio::spawn(async move {
        // SAFETY: `OomWatch` owns its eventfd or inotify fd for its whole life and
        // always returns the same fd from `as_raw_fd`; the AsyncFd owns the watch.
        let Ok(fd) = (unsafe { AsyncFd::register(watch) }) else {
            return;
        };
        loop {
            let Ok(mut guard) = fd.readable().await else {
                return;
            };
            let count = guard.get_inner().drain();
            guard.clear_ready();
            // The fd also wakes when the cgroup is removed: the watch is over.
            if !guard.get_inner().cgroup_exists() {
                return;
            }
            if count == 0 {
                continue;
            }
            tracing::info!(%id, "OOM");
            events
                .publish(TaskOOM {
                    container_id: id.clone(),
                    ..Default::default()
                })
                .await;
        }
    }))
}
