//! Streams: `zfs send` for export, `zfs receive` for import.
//!
//! A full stream is received under a temporary name, marked `crab:tree=none` and
//! renamed into place, so the container's name never holds a half-received dataset; the
//! container must not have a dataset yet. [`Store::rollback`] then makes the tree. An
//! incremental stream is received into the container's dataset (ZFS makes the new
//! snapshot appear atomically); its parent must be the container's latest snapshot and
//! the tree unchanged since. The stream's first record is read before `zfs receive`
//! runs, for clear errors, and because zfs-fuse receives an incremental stream aimed at
//! a dataset that does not exist into the stream's source dataset if that is in the
//! pool.
//!
//! [`Store::rollback`]: crate::storage::Store::rollback

use std::io::{Read, Write};

use super::datasets::zfs;
use super::fuse::{zfs_unmounted, DaemonTurn};
use super::{ZfsStore, TREE};
use crate::storage::names::{snapshot_exists, tree_exists};
use crate::storage::{cmd, fault, ContainerKey, SnapshotInfo};
use crate::{Error, Result};

/// What the first record of a `zfs send` stream says.
#[derive(Debug, PartialEq, Eq)]
struct StreamHead {
    /// The snapshot's short name.
    name: String,
    /// Whether it is incremental (needs its parent on the receiving side).
    incremental: bool,
    /// Whether it is a compound stream (`zfs send -R` or `-p`), which carries
    /// properties and may hold several datasets.
    compound: bool,
    /// Whether it makes a clone of an origin looked up anywhere in the pool.
    clone: bool,
}

/// The size of `dmu_replay_record`, whose first instance is the `DRR_BEGIN` record.
const STREAM_HEAD_LEN: usize = 312;
/// `DMU_BACKUP_MAGIC`.
const STREAM_MAGIC: u64 = 0x2_F5BA_CBAC;
/// `DMU_COMPOUNDSTREAM`, in the two low bits of the version info
/// (`DMU_GET_STREAM_HDRTYPE`).
const COMPOUND_STREAM: u64 = 2;
/// `DRR_FLAG_CLONE`.
const FLAG_CLONE: u32 = 1;

/// Parses the `DRR_BEGIN` record: u32 type (0), u32 payload length, u64 magic, u64
/// version info, u64 creation time, u32 objset type, u32 flags, u64 to-guid, u64
/// from-guid (0 for a full stream), `char[256]` to-name (`pool/fs@snap`), in the sending
/// host's byte order (the magic tells which). This layout is the same in every ZFS.
fn parse_stream_head(b: &[u8; STREAM_HEAD_LEN]) -> Result<StreamHead> {
    let bad = |message: &str| Error::Storage {
        operation: "import",
        message: message.to_string(),
    };
    let u64_at = |off: usize, le: bool| {
        let a: [u8; 8] = b[off..off + 8].try_into().expect("8 bytes");
        if le {
            u64::from_le_bytes(a)
        } else {
            u64::from_be_bytes(a)
        }
    };
    let le = if u64_at(8, true) == STREAM_MAGIC {
        true
    } else if u64_at(8, false) == STREAM_MAGIC {
        false
    } else {
        return Err(bad("the input is not a ZFS send stream"));
    };
    let t: [u8; 4] = b[0..4].try_into().expect("4 bytes");
    let drr_type = if le {
        u32::from_le_bytes(t)
    } else {
        u32::from_be_bytes(t)
    };
    if drr_type != 0 {
        return Err(bad("the ZFS stream does not start with a BEGIN record"));
    }
    let incremental = u64_at(48, le) != 0;
    let compound = u64_at(16, le) & 3 == COMPOUND_STREAM;
    let f: [u8; 4] = b[36..40].try_into().expect("4 bytes");
    let flags = if le {
        u32::from_le_bytes(f)
    } else {
        u32::from_be_bytes(f)
    };
    let raw = &b[56..];
    let end = raw.iter().position(|&c| c == 0).unwrap_or(raw.len());
    let toname = String::from_utf8_lossy(&raw[..end]);
    let Some((_, name)) = toname.split_once('@') else {
        return Err(bad(
            "the ZFS stream names no snapshot (a replication stream?)",
        ));
    };
    Ok(StreamHead {
        name: name.to_string(),
        incremental,
        compound,
        clone: flags & FLAG_CLONE != 0,
    })
}

impl StreamHead {
    /// Refuses what a stream `zfs send` of one snapshot does not hold, and what would
    /// let it act beyond the container's dataset: properties (a `mountpoint` or
    /// `canmount` that mounts the received file system over the host's), several
    /// datasets, or a clone of another dataset's snapshot.
    fn confined(&self) -> Result<()> {
        if self.compound {
            return Err(Error::ImportRefused(format!(
                "{} is a compound ZFS stream (zfs send -R or -p: properties, several                  datasets); export one snapshot without them",
                self.name
            )));
        }
        if self.clone {
            return Err(Error::ImportRefused(format!(
                "{} is a clone stream, whose origin is looked up anywhere in the pool",
                self.name
            )));
        }
        Ok(())
    }
}

/// What `zfs receive` gets besides the target, for a full stream: never mount what
/// it makes (the store mounts it where it belongs), and, where ZFS has `-x` (kernel
/// OpenZFS; zfs-fuse has neither `-x` nor properties in the streams it accepts
/// here), ignore any property a stream might carry that places or exposes it.
fn receive_flags(fuse: bool) -> Vec<&'static str> {
    let mut flags = vec!["-u"];
    if !fuse {
        for p in [
            "mountpoint",
            "canmount",
            "sharenfs",
            "sharesmb",
            "setuid",
            "devices",
            "exec",
            "readonly",
            "zoned",
        ] {
            flags.extend(["-x", p]);
        }
    }
    flags
}

/// Reads exactly the stream's first record.
fn read_stream_head(input: &mut dyn Read) -> Result<[u8; STREAM_HEAD_LEN]> {
    let mut b = [0u8; STREAM_HEAD_LEN];
    input.read_exact(&mut b).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Error::Storage {
                operation: "import",
                message: "the input is too short to be a ZFS send stream".into(),
            }
        } else {
            Error::io("read the stream to import")(e)
        }
    })?;
    Ok(b)
}

/// Writes snapshot `snap` (a full name) as a `zfs send` stream, incremental from the
/// earlier snapshot `parent` if given.
pub(super) fn send(snap: &str, parent: Option<&str>, out: &mut dyn Write) -> Result<()> {
    let mut args = vec!["send"];
    if let Some(p) = parent {
        args.extend(["-i", p]);
    }
    args.push(snap);
    let _turn = DaemonTurn::take()?;
    cmd::run_with_output("zfs", &args, out)
}

impl ZfsStore {
    /// Receives a stream written by [`send`] as a snapshot of `key`.
    pub(super) fn receive(&self, key: &ContainerKey, input: &mut dyn Read) -> Result<SnapshotInfo> {
        let ds = self.dataset(key)?;
        let head_bytes = read_stream_head(input)?;
        let head = parse_stream_head(&head_bytes)?;
        head.confined()?;
        let snap = self.snapshot_name(key, &head.name)?;
        let mut stream = (&head_bytes[..]).chain(input);
        match (head.incremental, self.exists(&ds)?) {
            (true, true) => self.receive_incremental(key, &ds, &snap, &head.name, &mut stream),
            (true, false) => Err(refused(format!(
                "{} is an incremental stream: import its parent into {key} first",
                head.name
            ))),
            (false, false) => self.receive_full(key, &ds, &head.name, &mut stream),
            (false, true) => Err(refused(format!(
                "{} is a full stream, which makes the container's dataset, and {key} has \
                 one (destroy it, or import into another container)",
                head.name
            ))),
        }
    }

    /// Receives an incremental stream into the container's dataset `ds`, which ZFS
    /// checks is at the stream's parent.
    fn receive_incremental(
        &self,
        key: &ContainerKey,
        ds: &str,
        snap: &str,
        name: &str,
        stream: &mut dyn Read,
    ) -> Result<SnapshotInfo> {
        if self.exists(snap)? {
            return Err(snapshot_exists(key, name));
        }
        // Receiving changes the file system in place: on zfs-fuse, not under the
        // kernel's caches of a mounted tree (see `rollback_to`).
        let remount = self.fuse && self.state(ds)?.is_some_and(|st| st.mounted);
        if remount {
            zfs(&["unmount", ds]).map_err(|e| {
                refused(format!(
                    "{key}'s tree is in use, and zfs-fuse receives only into an \
                     unmounted file system ({e})"
                ))
            })?;
        }
        let received = {
            let _turn = DaemonTurn::take()?;
            cmd::run_with_input("zfs", &["receive", ds], stream)
        };
        if remount {
            zfs(&["mount", ds])?;
        }
        match received {
            Ok(_) => self.info(key, name),
            Err(Error::Command { command, message }) => Err(refused(format!(
                "{name} applies only when its parent is {key}'s latest snapshot and the \
                 tree is unchanged since ({command}: {message})"
            ))),
            Err(e) => Err(e),
        }
    }

    /// Receives a full stream under a temporary name and renames it into place as the
    /// container's dataset `ds`, marked as holding no tree yet.
    fn receive_full(
        &self,
        key: &ContainerKey,
        ds: &str,
        name: &str,
        stream: &mut dyn Read,
    ) -> Result<SnapshotInfo> {
        let work = self.tmp("receive");
        let result = (|| {
            {
                let _turn = DaemonTurn::take()?;
                let mut args = vec!["receive"];
                args.extend(receive_flags(self.fuse));
                args.push(&work);
                cmd::run_with_input("zfs", &args, stream)?;
            }
            // It holds a snapshot; the tree is made by a rollback to it.
            zfs(&["set", &format!("{TREE}=none"), &work])?;
            fault::point("zfs.import.received");
            self.ensure_parent(key)?;
            self.unmount(&work)?;
            match zfs_unmounted(&["rename", &work, ds]) {
                Ok(_) => {}
                Err(e) if !matches!(e, Error::PoolFull { .. }) && self.exists(ds)? => {
                    return Err(tree_exists(key))
                }
                Err(e) => return Err(e),
            }
            self.info(key, name)
        })();
        if result.is_err() && self.exists(&work).unwrap_or(false) {
            let _ = self.destroy_fs(&work);
        }
        result
    }
}

/// An import refused, saying why.
fn refused(message: String) -> Error {
    Error::Storage {
        operation: "import",
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(le: bool, fromguid: u64, toname: &str) -> [u8; STREAM_HEAD_LEN] {
        let mut b = [0u8; STREAM_HEAD_LEN];
        let put = |b: &mut [u8; STREAM_HEAD_LEN], off: usize, v: u64| {
            let bytes = if le { v.to_le_bytes() } else { v.to_be_bytes() };
            b[off..off + 8].copy_from_slice(&bytes);
        };
        put(&mut b, 8, STREAM_MAGIC);
        put(&mut b, 48, fromguid);
        b[56..56 + toname.len()].copy_from_slice(toname.as_bytes());
        b
    }

    #[test]
    fn test_stream_head_gives_name_and_kind_in_both_byte_orders() {
        for le in [true, false] {
            let full = parse_stream_head(&head(le, 0, "p/c/a@turn-1")).unwrap();
            assert_eq!(
                full,
                StreamHead {
                    name: "turn-1".into(),
                    incremental: false,
                    compound: false,
                    clone: false,
                }
            );
            assert!(
                parse_stream_head(&head(le, 7, "p/a@t2"))
                    .unwrap()
                    .incremental
            );
        }
    }

    #[test]
    fn test_compound_and_clone_streams_are_refused() {
        for le in [true, false] {
            let mut b = head(le, 0, "p/c/a@s");
            let v: u64 = 2 | (1 << 2);
            b[16..24].copy_from_slice(&if le { v.to_le_bytes() } else { v.to_be_bytes() });
            let e = parse_stream_head(&b).unwrap().confined().unwrap_err();
            assert!(e.to_string().contains("compound"), "{e}");
            let mut b = head(le, 9, "p/c/a@s");
            let f: u32 = FLAG_CLONE | 4;
            b[36..40].copy_from_slice(&if le { f.to_le_bytes() } else { f.to_be_bytes() });
            let e = parse_stream_head(&b).unwrap().confined().unwrap_err();
            assert!(e.to_string().contains("clone stream"), "{e}");
            let plain = parse_stream_head(&head(le, 9, "p/c/a@s")).unwrap();
            plain.confined().unwrap();
        }
    }

    #[test]
    fn test_garbage_is_not_a_stream() {
        let e = parse_stream_head(&[7u8; STREAM_HEAD_LEN]).unwrap_err();
        assert!(e.to_string().contains("not a ZFS send stream"), "{e}");
        let e = parse_stream_head(&head(true, 0, "p/fs")).unwrap_err();
        assert!(e.to_string().contains("names no snapshot"), "{e}");
    }
}
