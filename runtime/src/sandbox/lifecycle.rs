//! A sandbox's birth: created afresh, or made to come back from a checkpoint (a
//! directory containerd or an import unpacked, or an entry of a history on this
//! host: a restore after a crash, or a fork), and its start and exec.

use std::path::{Path, PathBuf};

use super::Sandbox;
use crate::checkpoint::calls::RollbackFs;
use crate::checkpoint::engine::Dumped;
use crate::checkpoint::history::Entry;
use crate::checkpoint::pin::{self, PinnedImage};
use crate::config::Config;
use crate::container::{Container, CreateOpts};
use crate::helper::ChildStdio;
use crate::storage::ContainerKey;
use crate::Result;

/// Where a restored sandbox's processes come from, once its files are in place.
#[derive(Debug)]
pub struct RestoreImages {
    /// The CRIU images.
    pub images: PathBuf,
    /// What the restore needs to know about the dumped container.
    pub dumped: Dumped,
}

impl Sandbox {
    /// Creates the container on a tree already in place (its init waits for
    /// [`Sandbox::start`]); answers the sandbox and the init's pid.
    pub fn create(config: Config, opts: CreateOpts, stdio: ChildStdio) -> Result<(Sandbox, i32)> {
        let (container, pid) = Container::create(&config, opts, stdio)?;
        Ok((Sandbox::new(container, config), pid))
    }

    /// Lets the created init run.
    pub fn start(&self) -> Result<()> {
        self.container.start()
    }

    /// Adds the process the OCI `process` JSON file describes; answers its pid.
    pub fn exec(
        &self,
        process: &Path,
        console_socket: Option<PathBuf>,
        stdio: ChildStdio,
    ) -> Result<i32> {
        self.container.exec(process, console_socket, stdio)
    }

    /// Pins the process image of checkpoint `name` of `src`'s history for a
    /// restore into `restoring` ([`pin`]): what `Start` restores cannot be deleted
    /// by a retention in between.
    pub fn pin_checkpoint(
        config: &Config,
        src: &ContainerKey,
        name: &str,
        restoring: &ContainerKey,
    ) -> Result<PinnedImage> {
        pin::pin(config, src, name, restoring)
    }

    /// The first half of a restore from a checkpoint directory (containerd's
    /// `Create`), whose files are already in the tree: a sandbox whose processes
    /// come back at `Start` from the images it answers. `take_images`: the images
    /// may be moved (containerd's and an import's), else only read (a client's).
    pub fn for_dir_restore(
        config: Config,
        opts: CreateOpts,
        dir: &Path,
        take_images: bool,
    ) -> Result<(Sandbox, RestoreImages)> {
        let (container, images, manifest) =
            Container::prepare_restore(&config, opts, dir, take_images)?;
        let dumped = Dumped::from(&manifest);
        let sandbox = Sandbox::new(container, config);
        // An imported agent's exchanges (an archive's journal): its proxy
        // replays them as after a rollback. Without them it asks its LLM again,
        // so a failure is logged, not returned.
        if let Some(plan) = manifest.replay {
            let unpacked = dir.join(crate::checkpoint::journal::ARCHIVE_DIR);
            let adopted = sandbox.container.key().and_then(|key| {
                crate::checkpoint::journal::adopt(&sandbox.config, &key, &unpacked, plan)
            });
            if let Err(e) = adopted {
                tracing::warn!(id = %sandbox.container.id(), error = %e,
                    "no fast-forward plan from the archive: the agent asks its LLM again");
            }
        }
        Ok((sandbox, RestoreImages { images, dumped }))
    }

    /// The first half of a restore from `pinned`, an entry of `src`'s history (a
    /// fork, whose tree is already a clone of the entry's files; or the same
    /// container after a crash, whose tree goes back to the entry's files here).
    /// The agent, fast-forwarded, replays to the entry (a fork's from the
    /// exchanges of `src`'s journal).
    pub fn for_history_restore(
        config: Config,
        opts: CreateOpts,
        src: &ContainerKey,
        pinned: &PinnedImage,
    ) -> Result<Sandbox> {
        let sandbox = Sandbox::new(Container::for_restore(&config, opts, src.id())?, config);
        if *src == sandbox.container.key()? {
            let snapshot = pinned.entry.fs_snapshot.clone().unwrap_or_default();
            let rolled_back = sandbox
                .container
                .history(&sandbox.config, RollbackFs(snapshot));
            if let Err(e) = rolled_back {
                let _ = sandbox.container.delete();
                return Err(e);
            }
        }
        sandbox.plan_replay(src, &pinned.entry);
        Ok(sandbox)
    }

    /// Leaves the proxy the replay plan of a restore of `entry`, an entry of
    /// `src`'s history (this sandbox's own, or the one it is forked from; a
    /// fast-forwarded agent's journal); without one the agent only asks its LLM
    /// again, so a failure is logged, not returned.
    pub fn plan_replay(&self, src: &ContainerKey, entry: &Entry) {
        let planned = self.container.key().and_then(|key| {
            crate::checkpoint::journal::plan_replay(&self.config, src, &key, entry)
        });
        if let Err(e) = planned {
            tracing::warn!(id = %self.container.id(), error = %e,
                "no fast-forward plan: the agent asks its LLM again");
        }
    }
}
