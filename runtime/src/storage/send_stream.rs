//! Reading the paths out of a btrfs send stream.
//!
//! `btrfs send --no-data -p PARENT SNAP` describes how SNAP differs from PARENT, and
//! the kernel computes it by comparing the two b-trees, skipping every block they
//! share: its cost follows the changes, not the size of the tree. The store uses the
//! paths it names to roll back only what changed.
//!
//! Format (version 1): `btrfs-stream\0`, a u32 version, then commands, each a header
//! (u32 payload length, u16 command, u32 crc) and TLV attributes (u16 type, u16 length,
//! value). All integers are little-endian.

use std::collections::BTreeSet;

/// The first bytes of every send stream.
pub(crate) const MAGIC: &[u8] = b"btrfs-stream\0";
const CMD_SUBVOL: u16 = 1;
const CMD_SNAPSHOT: u16 = 2;
const CMD_SYMLINK: u16 = 8;
const A_PATH: u16 = 15;
const A_PATH_TO: u16 = 16;
const A_PATH_LINK: u16 = 17;

/// The paths a stream changes, relative to the subvolume root (`""` is the root),
/// or `None` when the stream cannot be read (the caller then compares whole trees).
pub fn changed_paths(stream: &[u8]) -> Option<BTreeSet<String>> {
    let rest = stream.strip_prefix(MAGIC)?;
    let version = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?);
    if version != 1 && version != 2 {
        return None;
    }
    let mut at = &rest[4..];
    let mut paths = BTreeSet::new();
    while !at.is_empty() {
        let len = u32::from_le_bytes(at.get(..4)?.try_into().ok()?) as usize;
        let cmd = u16::from_le_bytes(at.get(4..6)?.try_into().ok()?);
        let mut attrs = at.get(10..10 + len)?;
        at = &at[10 + len..];
        if cmd == CMD_SUBVOL || cmd == CMD_SNAPSHOT {
            continue; // names the subvolume itself
        }
        while !attrs.is_empty() {
            let kind = u16::from_le_bytes(attrs.get(..2)?.try_into().ok()?);
            let alen = u16::from_le_bytes(attrs.get(2..4)?.try_into().ok()?) as usize;
            let value = attrs.get(4..4 + alen)?;
            attrs = &attrs[4 + alen..];
            // A symlink's PATH_LINK is its target, any string the container
            // chose ("/etc/passwd", "../../x"), not a name in either tree: taken
            // as a path, a rollback would have joined it to the store's
            // directories and reached outside them.
            let target = cmd == CMD_SYMLINK && kind == A_PATH_LINK;
            if matches!(kind, A_PATH | A_PATH_TO | A_PATH_LINK) && !target {
                let p = std::str::from_utf8(value).ok()?;
                if !within_tree(p) {
                    return None; // not a stream of this tree's names
                }
                if !p.split('/').any(is_orphan_name) {
                    paths.insert(p.to_string());
                }
            }
        }
    }
    Some(paths)
}

/// A name relative to the tree's root that stays inside it: not absolute, no
/// `..` or `.` component, no empty one (the root itself is `""`).
fn within_tree(p: &str) -> bool {
    p.is_empty() || p.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

/// btrfs send names entries it has to move out of the way `o<ino>-<gen>-<n>` until
/// they get their final names; those temporary names are not paths of either tree.
fn is_orphan_name(component: &str) -> bool {
    let Some(rest) = component.strip_prefix('o') else {
        return false;
    };
    let parts: Vec<&str> = rest.split('-').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// Hand-made send streams for the tests of this module and of the stream check.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::MAGIC;

    /// One command of type `kind` with its attributes (the CRC left 0: the parsers
    /// here do not check it).
    pub(crate) fn cmd(kind: u16, attrs: &[(u16, &[u8])]) -> Vec<u8> {
        let mut body = Vec::new();
        for (t, v) in attrs {
            body.extend(t.to_le_bytes());
            body.extend((v.len() as u16).to_le_bytes());
            body.extend(*v);
        }
        let mut out = Vec::new();
        out.extend((body.len() as u32).to_le_bytes());
        out.extend(kind.to_le_bytes());
        out.extend(0u32.to_le_bytes());
        out.extend(body);
        out
    }

    /// A version-1 stream of `cmds`.
    pub(crate) fn stream(cmds: &[Vec<u8>]) -> Vec<u8> {
        let mut s = MAGIC.to_vec();
        s.extend(1u32.to_le_bytes());
        for c in cmds {
            s.extend(c);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{cmd, stream};
    use super::*;

    #[test]
    fn test_paths_of_every_command_are_collected() {
        let s = stream(&[
            cmd(CMD_SNAPSHOT, &[(A_PATH, b"snapname")]),
            cmd(3, &[(A_PATH, b"o257-9-0")]),
            cmd(9, &[(A_PATH, b"o257-9-0"), (A_PATH_TO, b"etc/new")]),
            cmd(11, &[(A_PATH, b"etc/gone")]),
            cmd(10, &[(A_PATH, b"b"), (A_PATH_LINK, b"a")]),
            cmd(20, &[(A_PATH, b"")]),
            cmd(21, &[]),
        ]);
        let got = changed_paths(&s).unwrap();
        let want: BTreeSet<String> = ["", "a", "b", "etc/gone", "etc/new"]
            .into_iter()
            .map(String::from)
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn test_a_symlink_target_is_not_a_path() {
        let s = stream(&[
            cmd(
                CMD_SYMLINK,
                &[(A_PATH, b"up"), (A_PATH_LINK, b"../../../etc")],
            ),
            cmd(
                CMD_SYMLINK,
                &[(A_PATH, b"abs"), (A_PATH_LINK, b"/etc/passwd")],
            ),
        ]);
        let got = changed_paths(&s).unwrap();
        let want: BTreeSet<String> = ["abs", "up"].into_iter().map(String::from).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn test_a_name_outside_the_tree_is_not_a_stream_of_it() {
        for bad in [&b"/etc/passwd"[..], b"a/../../b", b"./a", b"a//b"] {
            let s = stream(&[cmd(11, &[(A_PATH, bad)])]);
            assert!(
                changed_paths(&s).is_none(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn test_garbage_is_not_a_stream() {
        assert!(changed_paths(b"not a stream").is_none());
        let mut truncated = stream(&[cmd(11, &[(A_PATH, b"x")])]);
        truncated.truncate(truncated.len() - 1);
        assert!(changed_paths(&truncated).is_none());
    }

    #[test]
    fn test_orphan_names_are_recognised() {
        assert!(is_orphan_name("o257-12-0"));
        assert!(!is_orphan_name("o257-12"));
        assert!(!is_orphan_name("output-1-2"));
        assert!(!is_orphan_name("etc"));
    }
}
