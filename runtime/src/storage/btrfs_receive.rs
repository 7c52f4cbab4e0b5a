//! Importing a btrfs send stream into a container's snapshots directory, confined.
//!
//! `btrfs receive` must create the snapshot where it stays: a received (read-only)
//! subvolume cannot be renamed, and a copy of it would lose the received UUID that
//! later incremental streams look their parent up by. It makes the subvolume read-only
//! as its last step, so a writable subvolume in a snapshots directory is an
//! interrupted receive; a `.receiving-<pid>` marker says whose.
//!
//! The stream is hostile (it may come from anywhere): `btrfs receive` runs chrooted
//! into the directory (`-C`), stops at the stream's end command (`-e`), and reads
//! the stream through [`CheckedStream`], which refuses a second subvolume, a bad
//! name, paths out of the subvolume and parents or clone sources that are not the
//! container's own snapshots. Whatever a refused or failed receive made in the
//! directory is removed.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::Read;
use std::path::Path;

use super::dirs::{read_dir_lossy, write_durably};
use super::send_stream_check::CheckedStream;
use super::{btrfs_ioctl as ioctl, btrfs_nested, cmd, fault};
use crate::{Error, Result};

fn entries(dir: &Path) -> BTreeSet<OsString> {
    read_dir_lossy(dir).map(|e| e.file_name()).collect()
}

/// Removes an entry a receive left in the snapshots directory.
fn remove_left(p: &Path) {
    if ioctl::is_subvolume(p) {
        let _ = btrfs_nested::delete_nested(p);
        let _ = ioctl::delete(p);
    } else if std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()) {
        let _ = std::fs::remove_dir_all(p);
    } else {
        let _ = std::fs::remove_file(p);
    }
}

/// Receives `input` into `dir` (the container's snapshots directory, which exists)
/// and returns the new snapshot's name. The stream may build on the subvolumes of
/// `dir` only.
pub(super) fn receive(dir: &Path, input: &mut dyn Read) -> Result<String> {
    let before = entries(dir);
    let mut sources = Vec::new();
    for name in &before {
        let p = dir.join(name);
        if ioctl::is_subvolume(&p) {
            sources.extend(ioctl::uuids(&p)?);
        }
    }
    let marker_name = format!(".receiving-{}", std::process::id());
    let marker = dir.join(&marker_name);
    write_durably(&marker, b"")?;
    fault::point("btrfs.import.marked");
    let d = dir.display().to_string();
    let mut stream = CheckedStream::new(input, sources);
    let received = cmd::run_with_input("btrfs", &["receive", "-q", "-C", "-e", &d], &mut stream);
    let _ = std::fs::remove_file(&marker);
    let name = stream.name().map(String::from);
    let refusal = stream.refusal().map(String::from);
    let new: Vec<OsString> = entries(dir)
        .into_iter()
        .filter(|n| !before.contains(n) && *n != *marker_name)
        .collect();
    let outcome = match (refusal, received, name) {
        (Some(why), _, _) => Err(Error::ImportRefused(why)),
        (None, Err(e), _) => Err(e),
        (None, Ok(_), None) => Err(Error::ImportRefused("the stream made no subvolume".into())),
        (None, Ok(_), Some(name)) => {
            let made = dir.join(&name);
            let only = new.len() == 1 && new[0] == *name;
            if !only {
                Err(Error::ImportRefused(format!(
                    "the stream of {name:?} left {new:?} in the snapshots directory"
                )))
            } else if !(ioctl::is_subvolume(&made) && ioctl::is_readonly(&made)?) {
                Err(Error::ImportRefused(format!(
                    "the stream did not make {name:?} a complete read-only snapshot"
                )))
            } else {
                Ok(name)
            }
        }
    };
    if outcome.is_err() {
        for n in &new {
            remove_left(&dir.join(n));
        }
    }
    outcome
}
