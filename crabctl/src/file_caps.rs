//! File capabilities (`security.capability`) kept across a remap's chown.
//!
//! The kernel drops a file's capabilities when its owner changes, so a remapped
//! layer would lose them (`ping`'s `cap_net_raw`, for instance). And a capability
//! set written the usual way (revision 2, no root id) counts only for the host's
//! root: inside a user namespace the kernel ignores it. So each is written back as
//! revision 3 with a root id shifted like the owners: the host uid the namespace's
//! root maps to (plus the id the set named, if it named one), which is how the
//! kernel records capabilities set from inside that namespace.

use std::path::Path;

use anyhow::{bail, Context, Result};

const NAME: &str = "security.capability";
const REVISION_MASK: u32 = 0xff00_0000;
const REVISION_1: u32 = 0x0100_0000;
const REVISION_2: u32 = 0x0200_0000;
const REVISION_3: u32 = 0x0300_0000;
/// The flag bits beside the revision (the effective bit).
const FLAGS_MASK: u32 = 0x00ff_ffff;
const SIZE_1: usize = 12;
const SIZE_2: usize = 20;
const SIZE_3: usize = 24;

/// The capabilities of the file at `path` (never following a symlink), if any.
pub fn read(path: &Path) -> Result<Option<Vec<u8>>> {
    xattr::get(path, NAME).with_context(|| format!("read {NAME} of {}", path.display()))
}

/// Writes `caps` (as [`read`] gave them) back to `path` after its owner moved by
/// `uid`, with the root id moved by as much.
pub fn write_shifted(path: &Path, caps: &[u8], uid: u32) -> Result<()> {
    let shifted = shift(caps, uid).with_context(|| format!("{NAME} of {}", path.display()))?;
    xattr::set(path, NAME, &shifted).with_context(|| format!("write {NAME} of {}", path.display()))
}

/// The revision 3 form of `caps` with its root id moved by `uid`.
fn shift(caps: &[u8], uid: u32) -> Result<Vec<u8>> {
    let word = |i: usize| -> u32 {
        u32::from_le_bytes(caps[i * 4..i * 4 + 4].try_into().expect("four bytes"))
    };
    if caps.len() < 4 {
        bail!("{} bytes, no header", caps.len());
    }
    let magic = word(0);
    // permitted and inheritable, low then high words; revision 1 has low only.
    let (data, rootid) = match (magic & REVISION_MASK, caps.len()) {
        (REVISION_1, SIZE_1) => ([word(1), word(2), 0, 0], 0),
        (REVISION_2, SIZE_2) => ([word(1), word(2), word(3), word(4)], 0),
        (REVISION_3, SIZE_3) => ([word(1), word(2), word(3), word(4)], word(5)),
        (revision, len) => bail!("revision {:#x} in {len} bytes", revision >> 24),
    };
    let Some(rootid) = rootid.checked_add(uid) else {
        bail!("root id {rootid} shifted past the id range");
    };
    let mut out = Vec::with_capacity(SIZE_3);
    for w in [REVISION_3 | (magic & FLAGS_MASK)]
        .into_iter()
        .chain(data)
        .chain([rootid])
    {
        out.extend_from_slice(&w.to_le_bytes());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(ws: &[u32]) -> Vec<u8> {
        ws.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// `cap_net_raw+ep` as setcap writes it: revision 2, effective.
    const NET_RAW_V2: [u32; 5] = [REVISION_2 | 1, 1 << 13, 0, 0, 0];

    #[test]
    fn a_revision_2_set_becomes_revision_3_owned_by_the_namespaces_root() {
        let out = shift(&words(&NET_RAW_V2), 100000).unwrap();
        assert_eq!(out, words(&[REVISION_3 | 1, 1 << 13, 0, 0, 0, 100000]));
    }

    #[test]
    fn a_revision_3_root_id_moves_and_revision_1_gains_its_high_words() {
        let v3 = words(&[REVISION_3, 4, 8, 16, 32, 1000]);
        assert_eq!(
            shift(&v3, 100000).unwrap(),
            words(&[REVISION_3, 4, 8, 16, 32, 101000])
        );
        let v1 = words(&[REVISION_1 | 1, 4, 8]);
        assert_eq!(
            shift(&v1, 7).unwrap(),
            words(&[REVISION_3 | 1, 4, 8, 0, 0, 7])
        );
    }

    #[test]
    fn damaged_sets_are_refused_not_guessed() {
        assert!(shift(&[1, 2], 1).is_err());
        assert!(shift(&words(&[REVISION_2 | 1, 1, 0]), 1).is_err(), "short");
        assert!(
            shift(&words(&[0x0400_0000, 1, 0, 0, 0]), 1).is_err(),
            "revision 4"
        );
        assert!(shift(&words(&[REVISION_3, 0, 0, 0, 0, u32::MAX]), 1).is_err());
    }
}
