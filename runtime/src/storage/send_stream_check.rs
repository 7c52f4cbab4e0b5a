//! Checking a btrfs send stream to import, command by command, before `btrfs
//! receive` sees it.
//!
//! A stream from another host is hostile: `btrfs receive` does what its commands say,
//! with the receiving process's rights. The store runs it chrooted into the
//! container's snapshots directory (`-C`), and this check passes on a command only
//! once it has read and checked it whole, so that a stream
//! - holds exactly one subvolume, first, under a valid snapshot name, and nothing
//!   after its end command;
//! - builds on (`SNAPSHOT`) or clones from (`CLONE`) only the container's own
//!   snapshots or the subvolume it makes, never another container's;
//! - names only paths inside that subvolume: relative, without `.`, `..` or empty
//!   components, and not through a symlink the stream itself made.
//!
//! The format is described in `send_stream.rs`. Version 2 streams carry a `DATA`
//! attribute without a length: it is the rest of its command.

use std::collections::BTreeSet;
use std::io::{self, Read};

use super::names::check_snapshot_name;
use super::send_stream::MAGIC;

const HEADER_LEN: usize = 10;
/// Version 1 commands hold at most 64 KiB, version 2's encoded writes a little
/// more than 128 KiB: anything near this bound is not a stream `btrfs send` wrote.
const MAX_COMMAND: usize = 16 << 20;

const CMD_SUBVOL: u16 = 1;
const CMD_SNAPSHOT: u16 = 2;
const CMD_SYMLINK: u16 = 8;
const CMD_RENAME: u16 = 9;
const CMD_UNLINK: u16 = 11;
const CMD_CLONE: u16 = 16;
const CMD_END: u16 = 21;

const A_UUID: u16 = 1;
const A_PATH: u16 = 15;
const A_PATH_TO: u16 = 16;
const A_PATH_LINK: u16 = 17;
const A_DATA: u16 = 19;
const A_CLONE_UUID: u16 = 20;
const A_CLONE_PATH: u16 = 22;

/// Why a stream is refused, or that reading it failed.
enum Stop {
    Refused(String),
    Io(io::Error),
}

fn refused<T>(message: impl Into<String>) -> Result<T, Stop> {
    Err(Stop::Refused(message.into()))
}

enum Stage {
    Head,
    Commands,
    Ended,
}

/// A send stream read through this check: it gives its reader (`btrfs receive`)
/// only commands it has checked, and ends the stream with an error at the first it
/// refuses; [`CheckedStream::refusal`] then says why.
pub(super) struct CheckedStream<'a> {
    input: &'a mut dyn Read,
    /// UUIDs the stream may name as its parent or a clone source.
    sources: Vec<[u8; 16]>,
    checked: Vec<u8>,
    at: usize,
    stage: Stage,
    version: u32,
    name: Option<String>,
    symlinks: BTreeSet<Vec<u8>>,
    refusal: Option<String>,
}

impl<'a> CheckedStream<'a> {
    /// Checks `input`, a stream that may build on or clone from the subvolumes with
    /// UUIDs `sources` (the container's snapshots).
    pub(super) fn new(input: &'a mut dyn Read, sources: Vec<[u8; 16]>) -> CheckedStream<'a> {
        CheckedStream {
            input,
            sources,
            checked: Vec::new(),
            at: 0,
            stage: Stage::Head,
            version: 0,
            name: None,
            symlinks: BTreeSet::new(),
            refusal: None,
        }
    }

    /// The name of the subvolume the stream makes, once its first command is read.
    pub(super) fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// Why the stream was refused, if it was.
    pub(super) fn refusal(&self) -> Option<&str> {
        self.refusal.as_deref()
    }

    /// Reads exactly `n` bytes; `None` at a clean end of the input.
    fn take(&mut self, n: usize, what: &str) -> Result<Option<Vec<u8>>, Stop> {
        let mut buf = vec![0u8; n];
        let mut got = 0;
        while got < n {
            match self.input.read(&mut buf[got..]) {
                Ok(0) if got == 0 => return Ok(None),
                Ok(0) => return refused(format!("the stream ends in the middle of {what}")),
                Ok(k) => got += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Stop::Io(e)),
            }
        }
        Ok(Some(buf))
    }

    /// Reads and checks the next part of the stream into `checked`; false at its end.
    fn next(&mut self) -> Result<bool, Stop> {
        match self.stage {
            Stage::Head => {
                let Some(head) = self.take(MAGIC.len() + 4, "its header")? else {
                    return refused("the input is empty, not a btrfs send stream");
                };
                if !head.starts_with(MAGIC) {
                    return refused("the input is not a btrfs send stream");
                }
                let v = u32::from_le_bytes(head[MAGIC.len()..].try_into().expect("4 bytes"));
                if !(1..=2).contains(&v) {
                    return refused(format!("btrfs send stream version {v} is not supported"));
                }
                self.version = v;
                self.checked = head;
                self.stage = Stage::Commands;
                Ok(true)
            }
            Stage::Commands => {
                let Some(header) = self.take(HEADER_LEN, "a command")? else {
                    return refused("the stream ends before its end command");
                };
                let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
                let cmd = u16::from_le_bytes(header[4..6].try_into().expect("2 bytes"));
                if len > MAX_COMMAND {
                    return refused(format!("a command of {len} bytes"));
                }
                let body = self.take(len, "a command")?.unwrap_or_default();
                if body.len() != len {
                    return refused("the stream ends in the middle of a command");
                }
                self.check(cmd, &body)?;
                if cmd == CMD_END {
                    self.stage = Stage::Ended;
                }
                self.checked = header;
                self.checked.extend_from_slice(&body);
                Ok(true)
            }
            Stage::Ended => match self.take(1, "trailing data")? {
                None => Ok(false),
                Some(_) => refused(
                    "data follows the stream's end command (a second subvolume?): a stream \
                     must hold one snapshot",
                ),
            },
        }
    }

    fn check(&mut self, cmd: u16, body: &[u8]) -> Result<(), Stop> {
        let attrs = attributes(body, self.version)?;
        let get = |kind: u16| attrs.iter().find(|(k, _)| *k == kind).map(|(_, v)| *v);
        let is_subvolume = cmd == CMD_SUBVOL || cmd == CMD_SNAPSHOT;
        match (&self.name, is_subvolume) {
            (None, false) => return refused("the stream does not start with a subvolume"),
            (Some(first), true) => {
                return refused(format!(
                    "the stream holds a second subvolume after {first:?}: a stream must \
                     hold one snapshot"
                ))
            }
            (None, true) => {
                let name = String::from_utf8_lossy(get(A_PATH).unwrap_or_default()).into_owned();
                check_snapshot_name(&name).map_err(|e| Stop::Refused(e.to_string()))?;
                if cmd == CMD_SNAPSHOT {
                    let parent = uuid(get(A_CLONE_UUID))?;
                    if !self.sources.contains(&parent) {
                        return refused(format!(
                            "snapshot {name:?} builds on a subvolume that is not one of this \
                             container's snapshots (import its parent into this container \
                             first)"
                        ));
                    }
                }
                self.sources.push(uuid(get(A_UUID))?);
                self.name = Some(name);
                return Ok(());
            }
            (Some(_), false) => {}
        }
        if cmd == CMD_CLONE && !self.sources.contains(&uuid(get(A_CLONE_UUID))?) {
            return refused(
                "the stream clones data from a subvolume that is not one of this \
                 container's snapshots",
            );
        }
        for (kind, value) in &attrs {
            // A symlink's target is whatever the container wrote, not a name here.
            let target = cmd == CMD_SYMLINK && *kind == A_PATH_LINK;
            if matches!(*kind, A_PATH | A_PATH_TO | A_PATH_LINK | A_CLONE_PATH) && !target {
                self.check_path(value)?;
            }
        }
        self.track_symlinks(cmd, get(A_PATH).unwrap_or_default(), get(A_PATH_TO));
        Ok(())
    }

    fn check_path(&self, p: &[u8]) -> Result<(), Stop> {
        let shown = || String::from_utf8_lossy(p).into_owned();
        let inside = p.is_empty()
            || p.split(|b| *b == b'/')
                .all(|c| !c.is_empty() && c != b"." && c != b"..");
        if !inside || p.contains(&0) {
            return refused(format!(
                "the stream names {:?}, which is not a path inside its subvolume",
                shown()
            ));
        }
        let through = p
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == b'/')
            .map(|(i, _)| &p[..i])
            .find(|prefix| self.symlinks.contains(*prefix));
        if let Some(link) = through {
            return refused(format!(
                "the stream names {:?} through the symlink {:?} it made",
                shown(),
                String::from_utf8_lossy(link)
            ));
        }
        Ok(())
    }

    /// Follows the symlinks the stream makes, moves and removes.
    fn track_symlinks(&mut self, cmd: u16, path: &[u8], to: Option<&[u8]>) {
        match (cmd, to) {
            (CMD_SYMLINK, _) => {
                self.symlinks.insert(path.to_vec());
            }
            (CMD_UNLINK, _) => {
                self.symlinks.remove(path);
            }
            (CMD_RENAME, Some(to)) => {
                let mut under = path.to_vec();
                under.push(b'/');
                let moved: Vec<Vec<u8>> = self
                    .symlinks
                    .iter()
                    .filter(|s| s.as_slice() == path || s.starts_with(&under))
                    .cloned()
                    .collect();
                for s in moved {
                    self.symlinks.remove(&s);
                    let mut renamed = to.to_vec();
                    renamed.extend_from_slice(&s[path.len()..]);
                    self.symlinks.insert(renamed);
                }
            }
            _ => {}
        }
    }
}

fn uuid(value: Option<&[u8]>) -> Result<[u8; 16], Stop> {
    match value.map(<[u8; 16]>::try_from) {
        Some(Ok(u)) => Ok(u),
        _ => refused("a subvolume command without a valid UUID"),
    }
}

/// The TLV attributes of a command's body.
fn attributes(mut body: &[u8], version: u32) -> Result<Vec<(u16, &[u8])>, Stop> {
    let mut out = Vec::new();
    while !body.is_empty() {
        let (Some(k), Some(l)) = (body.get(..2), body.get(2..4)) else {
            return refused("a command with a truncated attribute");
        };
        let kind = u16::from_le_bytes(k.try_into().expect("2 bytes"));
        if version >= 2 && kind == A_DATA {
            out.push((kind, &body[2..]));
            break;
        }
        let len = usize::from(u16::from_le_bytes(l.try_into().expect("2 bytes")));
        let Some(value) = body.get(4..4 + len) else {
            return refused("a command with a truncated attribute");
        };
        out.push((kind, value));
        body = &body[4 + len..];
    }
    Ok(out)
}

impl Read for CheckedStream<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.at < self.checked.len() {
                let n = buf.len().min(self.checked.len() - self.at);
                buf[..n].copy_from_slice(&self.checked[self.at..self.at + n]);
                self.at += n;
                return Ok(n);
            }
            if self.refusal.is_some() {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "stream refused"));
            }
            self.checked.clear();
            self.at = 0;
            match self.next() {
                Ok(true) => {}
                Ok(false) => return Ok(0),
                Err(Stop::Io(e)) => return Err(e),
                Err(Stop::Refused(why)) => {
                    self.refusal = Some(why.clone());
                    return Err(io::Error::new(io::ErrorKind::InvalidData, why));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::send_stream::fixtures::{cmd, stream};

    const NEW: [u8; 16] = [1; 16];
    const OURS: [u8; 16] = [2; 16];
    const THEIRS: [u8; 16] = [3; 16];

    fn subvol(name: &[u8]) -> Vec<u8> {
        cmd(CMD_SUBVOL, &[(A_PATH, name), (A_UUID, &NEW)])
    }

    /// Reads `s` through the check; the refusal, if any.
    fn through(s: &[u8]) -> Result<Vec<u8>, String> {
        let mut input = s;
        let mut checked = CheckedStream::new(&mut input, vec![OURS]);
        let mut out = Vec::new();
        match checked.read_to_end(&mut out) {
            Ok(_) => Ok(out),
            Err(e) => Err(checked.refusal().map(String::from).unwrap_or(e.to_string())),
        }
    }

    #[test]
    fn test_a_stream_of_one_snapshot_passes_unchanged() {
        let s = stream(&[
            cmd(
                CMD_SNAPSHOT,
                &[(A_PATH, b"s2"), (A_UUID, &NEW), (A_CLONE_UUID, &OURS)],
            ),
            cmd(3, &[(A_PATH, b"o257-9-0")]),
            cmd(
                CMD_RENAME,
                &[(A_PATH, b"o257-9-0"), (A_PATH_TO, b"etc/new")],
            ),
            cmd(CMD_SYMLINK, &[(A_PATH, b"up"), (A_PATH_LINK, b"/etc")]),
            cmd(CMD_CLONE, &[(A_PATH, b"a"), (A_CLONE_UUID, &OURS)]),
            cmd(20, &[(A_PATH, b"")]),
            cmd(CMD_END, &[]),
        ]);
        assert_eq!(through(&s).unwrap(), s);
    }

    #[test]
    fn test_paths_out_of_the_subvolume_are_refused() {
        for bad in [
            &b"../escaped"[..],
            b"/etc/passwd",
            b"a/../../b",
            b"./a",
            b"a//b",
        ] {
            for kind in [A_PATH, A_PATH_TO, A_CLONE_PATH] {
                let s = stream(&[subvol(b"s"), cmd(9, &[(kind, bad)]), cmd(CMD_END, &[])]);
                let e = through(&s).unwrap_err();
                assert!(e.contains("not a path inside"), "{e}");
            }
        }
        // A hard link's target is a name in the tree.
        let s = stream(&[
            subvol(b"s"),
            cmd(10, &[(A_PATH, b"l"), (A_PATH_LINK, b"../../etc/shadow")]),
        ]);
        assert!(through(&s).unwrap_err().contains("not a path inside"));
    }

    #[test]
    fn test_a_path_through_a_symlink_the_stream_made_is_refused() {
        let s = stream(&[
            subvol(b"s"),
            cmd(CMD_SYMLINK, &[(A_PATH, b"x"), (A_PATH_LINK, b"/")]),
            cmd(CMD_RENAME, &[(A_PATH, b"x"), (A_PATH_TO, b"d/y")]),
            cmd(3, &[(A_PATH, b"d/y/pwned")]),
        ]);
        let e = through(&s).unwrap_err();
        assert!(e.contains("through the symlink \"d/y\""), "{e}");
    }

    #[test]
    fn test_another_containers_parent_or_clone_source_is_refused() {
        let s = stream(&[cmd(
            CMD_SNAPSHOT,
            &[(A_PATH, b"s"), (A_UUID, &NEW), (A_CLONE_UUID, &THEIRS)],
        )]);
        assert!(through(&s)
            .unwrap_err()
            .contains("not one of this container's"));
        let s = stream(&[
            subvol(b"s"),
            cmd(CMD_CLONE, &[(A_PATH, b"a"), (A_CLONE_UUID, &THEIRS)]),
        ]);
        assert!(through(&s)
            .unwrap_err()
            .contains("not one of this container's"));
    }

    #[test]
    fn test_a_bad_name_a_second_subvolume_or_trailing_data_is_refused() {
        for name in [&b"../x"[..], b"a/b", b".receiving-1", b""] {
            let e = through(&stream(&[subvol(name)])).unwrap_err();
            assert!(e.contains("snapshot name"), "{e}");
        }
        let e = through(&stream(&[subvol(b"a"), subvol(b"b")])).unwrap_err();
        assert!(e.contains("second subvolume"), "{e}");
        let mut s = stream(&[subvol(b"a"), cmd(CMD_END, &[])]);
        s.extend(stream(&[subvol(b"b"), cmd(CMD_END, &[])]));
        assert!(through(&s).unwrap_err().contains("data follows"));
        let e = through(&stream(&[cmd(3, &[(A_PATH, b"f")])])).unwrap_err();
        assert!(e.contains("does not start with a subvolume"), "{e}");
    }

    #[test]
    fn test_garbage_and_truncation_are_refused_before_any_command_passes() {
        assert!(through(b"not a stream at all")
            .unwrap_err()
            .contains("not a btrfs"));
        let mut s = stream(&[subvol(b"a"), cmd(CMD_END, &[])]);
        s.truncate(s.len() - 3);
        assert!(through(&s).unwrap_err().contains("ends"));
        let mut input: &[u8] = &s;
        let mut checked = CheckedStream::new(&mut input, vec![]);
        let mut out = Vec::new();
        let _ = checked.read_to_end(&mut out);
        // Only the header and the whole first command went through.
        assert_eq!(out.len(), stream(&[subvol(b"a")]).len());
    }
}
