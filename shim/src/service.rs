//! The shim process: containerd's `start` / `delete` / serve entry points.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use containerd_shim::monitor::{monitor_subscribe, Subject, Topic};
use containerd_shim::protos::protobuf::well_known_types::timestamp::Timestamp;
use containerd_shim::publisher::RemotePublisher;
use containerd_shim::{api::DeleteResponse, spawn, Config, ExitSignal, Flags, Shim, StartOpts};
use crab_runtime::config::Config as CrabConfig;
use crab_runtime::container::Container;

use crate::events::Events;
use crate::task::{TaskService, BUNDLE_CONFIG};

/// containerd's annotation naming a pod's sandbox: containers of one pod share a shim.
const SANDBOX_ID_ANNOTATION: &str = "io.kubernetes.cri.sandbox-id";

/// The shim.
pub struct Service {
    exit: Arc<ExitSignal>,
    namespace: String,
    id: String,
    bundle: PathBuf,
    /// containerd's GRPC address.
    address: String,
}

#[async_trait]
impl Shim for Service {
    type T = TaskService;

    async fn new(_runtime_id: &str, args: &Flags, config: &mut Config) -> Self {
        config.no_setup_logger = true;
        crate::logging::init(args.action.is_empty(), args.debug);
        let bundle = if args.bundle.is_empty() {
            std::env::current_dir().unwrap_or_default()
        } else {
            PathBuf::from(&args.bundle)
        };
        Service {
            exit: Arc::new(ExitSignal::default()),
            namespace: args.namespace.clone(),
            id: args.id.clone(),
            bundle,
            address: args.address.clone(),
        }
    }

    async fn start_shim(&mut self, opts: StartOpts) -> containerd_shim::Result<String> {
        // containerd writes the task's options to `start`'s stdin. The shim crate would
        // parse them as runc's `Options` whatever their type: a config body would be
        // taken for a cgroup path, and a restore option would fail to parse. Crab
        // reads them itself: runc's shim cgroup here, the rest in `Create`.
        let mut stdin = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut stdin);
        if !stdin.is_empty() {
            let options = crate::options::any_from_bytes(&stdin)
                .and_then(|any| crate::options::RuncTaskOptions::from_any(Some(&any)))
                .map_err(containerd_shim::Error::InvalidArgument)?;
            if let Some(cgroup) = &options.shim_cgroup {
                crate::shim_cgroup::join(cgroup).map_err(containerd_shim::Error::Other)?;
            }
        }
        // A fork of a container keeping replicas for forks goes to that
        // container's shim, which holds them.
        if let Some(address) =
            crate::fork_group::source_shim(&self.bundle, &opts.namespace, &opts.id, &stdin)
        {
            std::fs::write(self.bundle.join("address"), &address)
                .map_err(|e| containerd_shim::Error::Other(format!("write address file: {e}")))?;
            return Ok(address);
        }
        let grouping = sandbox_group(&self.bundle).unwrap_or_else(|| opts.id.clone());
        if grouping == opts.id {
            // A container's own socket left by a shim that died with its host (or
            // whose cleanup never ran): the shim crate would try it for a second
            // before taking the path. A pod's shared socket is left to the crate: a
            // pod's shim may be between bind and listen. Nothing is logged: `start`'s
            // stdout is the address containerd reads, and the logger writes there.
            let socket = containerd_shim::socket_address(&opts.address, &opts.namespace, &grouping);
            let _ = crate::dead_socket::remove_if_dead(&socket);
        }
        let address = spawn(opts, &grouping, Vec::new()).await?;
        std::fs::write(self.bundle.join("address"), &address)
            .map_err(|e| containerd_shim::Error::Other(format!("write address file: {e}")))?;
        Ok(address)
    }

    /// containerd calls this (as `<shim> delete`) when the shim died: remove whatever
    /// the dead shim left of the container.
    async fn delete_shim(&mut self) -> containerd_shim::Result<DeleteResponse> {
        let config = bundle_config(&self.bundle);
        let (ns, id) = (self.namespace.clone(), self.id.clone());
        crab_runtime::storage::fault::shim_point("delete.started", config.fault_file.as_deref());
        let deleted =
            tokio::task::spawn_blocking(move || Container::remove_left(&config, &ns, &id)).await;
        match deleted {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(id = %self.id, error = %e, "cleanup of a dead shim's container")
            }
            Err(e) => tracing::warn!(error = %e, "cleanup task"),
        }
        let config = bundle_config(&self.bundle);
        let _ = std::fs::remove_file(crab_runtime::control::socket_path(
            &config,
            &self.namespace,
            &self.id,
        ));
        crate::proxy::remove_logs(&config, &self.namespace, &self.id);
        // The dead shim's ttrpc socket: the next shim of this container binds it.
        // The one `start` answered, as recorded in the bundle (a fork's is its
        // source's); else the one its grouping names.
        let recorded = std::fs::read_to_string(self.bundle.join("address"))
            .ok()
            .map(|a| a.trim().to_string())
            .filter(|a| !a.is_empty());
        let socket = recorded.unwrap_or_else(|| {
            let grouping = sandbox_group(&self.bundle).unwrap_or_else(|| self.id.clone());
            containerd_shim::socket_address(&self.address, &self.namespace, &grouping)
        });
        match crate::dead_socket::remove_if_dead(&socket) {
            crate::dead_socket::Outcome::Kept(why) => {
                tracing::warn!(id = %self.id, %why, "the dead shim's socket is left")
            }
            outcome => tracing::debug!(id = %self.id, ?outcome, "the dead shim's socket"),
        }
        let target = self.bundle.join("rootfs");
        match crab_runtime::storage::ContainerKey::new(&self.namespace, &self.id) {
            Ok(key) => crate::rootfs::release(&config, &key, &target, true).await,
            Err(_) => crate::rootfs::unmount(&target).await,
        }
        Ok(DeleteResponse {
            exit_status: 128 + libc::SIGKILL as u32,
            exited_at: Some(crate::process::timestamp(std::time::SystemTime::now())).into(),
            ..Default::default()
        })
    }

    async fn wait(&mut self) {
        self.exit.wait().await;
    }

    async fn create_task_service(&self, publisher: RemotePublisher) -> Self::T {
        let events = Events::new(publisher, &self.namespace);
        let service = TaskService::new(events, self.exit.clone(), &self.namespace, &self.address);
        let exits = service.clone();
        match monitor_subscribe(Topic::Pid).await {
            Ok(mut sub) => {
                tokio::spawn(async move {
                    while let Some(e) = sub.rx.recv().await {
                        if let Subject::Pid(pid) = e.subject {
                            exits.process_exit(pid, e.exit_code).await;
                        }
                    }
                });
            }
            Err(e) => tracing::error!(error = %e, "cannot watch process exits"),
        }
        service
    }
}

/// The configuration a container was created with (kept beside its bundle), or the
/// host's configuration when there is none.
fn bundle_config(bundle: &Path) -> CrabConfig {
    let file = bundle.join(BUNDLE_CONFIG);
    if file.exists() {
        if let Ok((c, _)) = CrabConfig::load(None, Some(&file), None) {
            return c;
        }
    }
    CrabConfig::load_with_env(None, None)
        .map(|(c, _)| c)
        .unwrap_or_default()
}

fn sandbox_group(bundle: &Path) -> Option<String> {
    let spec = crab_runtime::container::load_spec(bundle).ok()?;
    spec.annotations()
        .as_ref()?
        .get(SANDBOX_ID_ANNOTATION)
        .cloned()
}

#[allow(dead_code)]
fn _assert_timestamp(_: Timestamp) {}
