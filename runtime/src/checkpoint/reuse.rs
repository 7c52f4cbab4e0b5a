//! containerd's `Checkpoint` through the turn policy: when nothing changed
//! since the last containerd checkpoint of the container, its artifact is
//! handed out again at once, with no freeze and no dump.
//!
//! After each containerd checkpoint that leaves the task running, its files
//! are kept (hard links where the file system allows) under the container's
//! checkpoint store, with the inspector's generation at that moment. Any later
//! checkpoint, Crab's or containerd's, and any rollback, change the generation
//! or set the untracked mark, so a kept artifact is reused only if the
//! inspector still counts from that very dump and has seen nothing since.

use std::path::{Path, PathBuf};

use super::history::{self, create_private_dir};
use super::Kind;
use crate::config::Config;
use crate::container::Container;
use crate::inspect;
use crate::{Error, Result};

const KEPT: &str = "containerd-last";
const GEN_FILE: &str = ".inspector-gen";

fn kept_dir(config: &Config, c: &Container) -> Result<PathBuf> {
    let key = c.key()?;
    Ok(history::dir(config, &key).join(KEPT))
}

/// Links (or copies, across file systems) the tree `from` into `to`.
fn link_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if e.file_type()?.is_dir() {
            link_tree(&src, &dst)?;
        } else if std::fs::hard_link(&src, &dst).is_err() {
            std::fs::copy(&src, &dst)?;
        }
    }
    Ok(())
}

/// Keeps the artifact just written to `dir`, tagged with the inspector's
/// current generation. Best effort: a failure only loses the shortcut.
pub fn keep(config: &Config, c: &Container, dir: &Path) {
    let r = (|| -> Result<()> {
        let Some(pins) = &c.state().bpf_pin_root else {
            return Ok(());
        };
        let insp = crab_bpf::Inspector::open(pins)?;
        let Some(counters) = insp.counters(c.state().cgroup_id)? else {
            return Ok(());
        };
        let kept = kept_dir(config, c)?;
        let _ = std::fs::remove_dir_all(&kept);
        create_private_dir(kept.parent().unwrap_or(&kept))?;
        link_tree(dir, &kept).map_err(Error::io(format!("keep {}", kept.display())))?;
        std::fs::write(kept.join(GEN_FILE), counters.gen.to_string())
            .map_err(Error::io(format!("write {}", kept.display())))
    })();
    if let Err(e) = r {
        tracing::warn!(id = %c.id(), error = %e, "keep the checkpoint for reuse");
    }
}

/// Writes the kept artifact into `dir` if nothing changed since it was taken;
/// answers whether it did.
pub fn reuse(config: &Config, c: &Container, dir: &Path) -> Result<bool> {
    let Some(pins) = &c.state().bpf_pin_root else {
        return Ok(false);
    };
    let kept = kept_dir(config, c)?;
    let Ok(gen) = std::fs::read_to_string(kept.join(GEN_FILE)) else {
        return Ok(false);
    };
    let insp = crab_bpf::Inspector::open(pins)?;
    let Some(counters) = insp.counters(c.state().cgroup_id)? else {
        return Ok(false);
    };
    if gen.trim() != counters.gen.to_string() {
        return Ok(false);
    }
    let class = inspect::since_last_checkpoint(c, &insp)?;
    if class.kind != Kind::Skip {
        return Ok(false);
    }
    link_tree(&kept, dir).map_err(Error::io(format!(
        "copy {} to {}",
        kept.display(),
        dir.display()
    )))?;
    let _ = std::fs::remove_file(dir.join(GEN_FILE));
    Ok(true)
}
