//! `crabctl export` and `crabctl import`: a checkpoint moved to another host (another
//! containerd, with its own root and state) as one archive.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use containerd_client::services::v1::container::Runtime;
use containerd_client::services::v1::Container;
use crab_runtime::checkpoint::archive::{self, ContainerRecord};
use crab_runtime::checkpoint::archive_sign::{ArchiveKey, Trust};
use crab_runtime::checkpoint::archive_work;
use crab_runtime::checkpoint::import_spec::{self, Grant, Target};
use crab_runtime::checkpoint::source::Source;
use crab_runtime::config::Config;
use crab_runtime::error::{ErrorKind, Failure};
use crab_runtime::sandbox::Sandbox;
use crab_runtime::storage::adopt::Adopted;
use crab_runtime::storage::layers::MountSpec;
use crab_runtime::storage::{self, fault, ContainerKey, ImageSource};

use crate::containerd::Client;

/// The only runtime an import creates a container with: an archive's record could
/// otherwise name any shim binary of this host (containerd takes a path).
const CRAB_RUNTIME: &str = "io.containerd.crab.v2";

/// What the operator allows an import beyond the allow-list.
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// Kinds of spec settings kept although beyond the allow-list.
    pub allow: BTreeSet<Grant>,
    /// Kinds of spec settings beyond the allow-list left out rather than refused
    /// (only [`Grant::droppable`] ones).
    pub drop: BTreeSet<Grant>,
    /// Import an archive without a valid signature.
    pub allow_unsigned: bool,
    /// The crab configuration the new container runs with (its runtime options'
    /// `ConfigPath`); the shim's default without one.
    pub runtime_config_path: Option<PathBuf>,
    /// The image the container's files go on, instead of the archive's.
    pub image: Option<String>,
}

/// The snapshotter of an imported container whose archive names none (a Docker
/// container's root is not containerd's): containerd's default.
const DEFAULT_SNAPSHOTTER: &str = "overlayfs";

/// `crabctl export ID [CKPT] -o FILE` (a new full checkpoint when none is named).
pub fn export(
    config: &Config,
    address: &str,
    namespace: &str,
    id: &str,
    ckpt: Option<&str>,
    out: &Path,
) -> Result<()> {
    let key = ContainerKey::new(namespace, id)?;
    let started = Instant::now();
    // Before any checkpoint is taken: a host without a usable key fails here.
    let signer = ArchiveKey::load(config).context("the archive key")?;
    let name = match ckpt {
        Some(n) => n.to_string(),
        None => crate::ckpt::take_full(config, namespace, id)?,
    };
    fault::point("export.checkpointed");
    let rt = crate::containerd::runtime()?;
    let client = rt.block_on(Client::connect(address, namespace))?;
    let c = rt.block_on(client.container(id))?;
    let spec = c.spec.clone().context("the container has no spec")?;
    let record = ContainerRecord {
        image: c.image.clone(),
        runtime: c
            .runtime
            .as_ref()
            .map(|r| r.name.clone())
            .unwrap_or_default(),
        spec_type: spec.type_url.clone(),
        spec: serde_json::from_slice(&spec.value).context("the container's spec is not JSON")?,
        snapshotter: c.snapshotter.clone(),
    };
    let mut config = config.clone();
    config.storage.backend = backend_of(&config, &record)?;
    let image = if c.snapshot_key.is_empty() {
        adopted_image(&config, &key)?
    } else {
        let mounts = rt.block_on(client.mounts(&c.snapshotter, &c.snapshot_key))?;
        let specs: Vec<MountSpec> = mounts
            .iter()
            .map(|m| MountSpec {
                kind: m.r#type.clone(),
                source: m.source.clone(),
                options: m.options.clone(),
            })
            .collect();
        ImageSource::from_mounts(&specs)?
    };
    let (entry, report) = Sandbox::export(&config, &key, &name, &image, &record, out, &signer)?;
    println!(
        "{id}: checkpoint {} exported to {} ({} bytes, {} changed files) in {} ms",
        entry.name,
        out.display(),
        report.bytes,
        report.changed,
        started.elapsed().as_millis()
    );
    Ok(())
}

/// The image of a container whose client mounted its root itself (Docker's: no
/// snapshot in containerd), which the store adopted: found again from the tree's
/// owner, the client's writable layer.
fn adopted_image(config: &Config, key: &ContainerKey) -> Result<ImageSource> {
    let store = storage::open(config, config.storage.backend)?
        .context("the passthrough backend keeps no tree to export")?;
    let owner = store.owner(key)?.with_context(|| {
        format!("{key} has no snapshot in containerd and no tree adopted into the store")
    })?;
    let (mount, _) = Adopted::from_owner(&owner)?.split(false);
    Ok(ImageSource::from_mounts(&[mount])?)
}

/// The store a container uses: its spec's annotation, else the configuration's.
fn backend_of(config: &Config, record: &ContainerRecord) -> Result<crab_runtime::config::Backend> {
    match record.spec["annotations"][crab_runtime::storage::BACKEND_ANNOTATION].as_str() {
        Some(name) => serde_json::from_str(&format!("\"{name}\""))
            .with_context(|| format!("unknown backend {name}")),
        None => Ok(config.storage.backend),
    }
}

/// `crabctl import FILE --id NEWID`: the container created in this containerd and its
/// task started from the archive's checkpoint. The archive must be signed with this
/// host's archive key, and the container gets a spec rebuilt from the allow-list
/// ([`import_spec`]): nothing is created in containerd otherwise.
pub fn import(
    config: &Config,
    address: &str,
    namespace: &str,
    file: &Path,
    new_id: &str,
    options: &ImportOptions,
) -> Result<()> {
    let key = ContainerKey::new(namespace, new_id)?;
    let started = Instant::now();
    check_drop(options)?;
    let trust = if options.allow_unsigned {
        eprintln!(
            "warning: {}: importing without checking its signature (--allow-unsigned)",
            file.display()
        );
        Trust::AllowUnsigned
    } else {
        Trust::Key(ArchiveKey::load(config).context("the archive key")?)
    };
    let runtime_options = match &options.runtime_config_path {
        Some(path) => Some(runtime_options(path)?),
        None => None,
    };
    let rt = crate::containerd::runtime()?;
    let client = rt.block_on(Client::connect(address, namespace))?;
    // What dead imports and forks left (a retry of this import's included): their
    // unfinished containers, then their unpacked archives.
    let swept = rt.block_on(client.discard_abandoned())?;
    if !swept.is_empty() {
        eprintln!("discarded containers a dead fork or import left: {swept:?}");
    }
    archive_work::discard_dead(config);
    let dir = archive_work::import_dir(config, &key);
    let record = archive::unpack(file, &dir, &trust)?;
    fault::point("import.unpacked");
    let spec = match trusted_spec(&record, options, namespace, new_id) {
        Ok(spec) => spec,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
    };
    let image = options
        .image
        .clone()
        .unwrap_or_else(|| record.image.clone());
    let snapshotter = match record.snapshotter.as_str() {
        "" => DEFAULT_SNAPSHOTTER.to_string(),
        s => s.to_string(),
    };
    let result = rt.block_on(async {
        if image.is_empty() {
            anyhow::bail!(
                "the archive names no image (its container's root was not containerd's, \
                 as Docker's is not): name the image its files go on with --image"
            );
        }
        let chain = client.image_chain_id(&image).await?;
        let mut c = Container {
            id: new_id.to_string(),
            image: image.clone(),
            runtime: Some(Runtime {
                name: CRAB_RUNTIME.to_string(),
                options: runtime_options,
            }),
            spec: Some(prost_types::Any {
                type_url: record.spec_type.clone(),
                value: serde_json::to_vec(&spec)?,
            }),
            snapshotter,
            snapshot_key: new_id.to_string(),
            ..Default::default()
        };
        crate::pending::mark(&mut c);
        client.create_container(c.clone()).await?;
        fault::point("import.created");
        let made = async {
            // A sandbox with a user namespace had its root on the image's layers
            // owned by the ids its root maps to: so has the import.
            let (parent, lease) = match crate::remap::root_ids(&spec)? {
                Some(ids) => {
                    let scratch = PathBuf::from(format!("{}.remap", dir.display()));
                    let (parent, lease) = crate::remap::remapped_parent(
                        &client,
                        &c.snapshotter,
                        &chain,
                        ids,
                        &scratch,
                    )
                    .await?;
                    (parent, Some(lease))
                }
                None => (chain.clone(), None),
            };
            let mounts = client.prepare(&c.snapshotter, new_id, &parent).await;
            // The container's snapshot holds the remapped layers from now on.
            if let Some(lease) = lease {
                if let Err(e) = client.delete_lease(&lease).await {
                    tracing::warn!(%lease, error = %format!("{e:#}"), "delete the remap's lease");
                }
            }
            let mounts = mounts?;
            fault::point("import.prepared");
            let pid = client
                .start_restored(&c, mounts, Source::Dir { path: dir.clone() })
                .await?;
            fault::point("import.started");
            client.finish(new_id).await?;
            anyhow::Ok(pid)
        }
        .await;
        if made.is_err() {
            // Nothing half-made is left: the error says what failed.
            if let Err(e) = client.discard(&c).await {
                tracing::warn!(id = %new_id, error = %format!("{e:#}"), "discard a failed import");
            }
        }
        made
    });
    let pid = match result {
        Ok(pid) => pid,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
    };
    println!(
        "{new_id}: imported from {} and running in {} ms; init pid {pid}",
        file.display(),
        started.elapsed().as_millis()
    );
    Ok(())
}

/// Refuses `--drop` of a kind whose removal would give more (namespaces, masked
/// paths, ...), or of a kind also allowed.
fn check_drop(options: &ImportOptions) -> Result<()> {
    for kind in &options.drop {
        let why = if !kind.droppable() {
            "its settings cannot be left out (that would give the container more); \
             only host-mounts, hooks and annotations can"
        } else if options.allow.contains(kind) {
            "it is also allowed"
        } else {
            continue;
        };
        return Err(Failure::new(
            ErrorKind::InvalidArgument,
            format!("--drop {}: {why}", kind.name()),
        )
        .into());
    }
    Ok(())
}

/// The runtime options naming `path` as the imported container's configuration,
/// which must load: a mistake fails here, not in the shim after the unpacking.
fn runtime_options(path: &Path) -> Result<prost_types::Any> {
    let path = std::path::absolute(path)
        .with_context(|| format!("the runtime configuration {}", path.display()))?;
    Config::load(None, Some(&path), None)
        .with_context(|| format!("the runtime configuration {}", path.display()))?;
    Ok(crate::containerd::runtime_options(
        &path.display().to_string(),
    ))
}

/// The spec the imported container gets: the archive's, rebuilt from the allow-list;
/// an archive for another runtime is refused.
fn trusted_spec(
    record: &ContainerRecord,
    options: &ImportOptions,
    namespace: &str,
    id: &str,
) -> Result<serde_json::Value> {
    if record.runtime != CRAB_RUNTIME {
        return Err(crab_runtime::Error::BadCheckpoint {
            path: archive::RECORD.into(),
            message: format!(
                "runtime {:?}: an import runs only {CRAB_RUNTIME}",
                record.runtime
            ),
        }
        .into());
    }
    let target = Target { namespace, id };
    let spec = import_spec::rebuild_dropping(&record.spec, &options.allow, &options.drop, target)
        .map_err(crab_runtime::Error::from)
        .context("import refused")?;
    Ok(spec)
}
