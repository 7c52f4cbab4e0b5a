//! What a restore checks of the processes CRIU brought back: their user namespace's
//! mappings are the spec's.
//!
//! CRIU makes the user namespace again from its images (`userns-*.img`), not from
//! the spec. Images come from this host's own dumps, but also from an imported
//! archive or a directory containerd unpacked from a registry: such images could
//! map the sandbox onto host root, onto another sandbox's range, or give a spec
//! without a user namespace one of the images' choosing. The spec's mappings are
//! the ones [`super::check`] accepted (and an import's allow-list saw), so the
//! restored init's `uid_map` and `gid_map` must be exactly those (or the host's,
//! for a spec without a user namespace). A restore whose processes differ fails,
//! and the caller kills what CRIU restored before anything of it is reported
//! running.

use super::{Extent, Mappings};
use crate::{Error, Result};

/// The host's own map: every id as itself.
const IDENTITY: Extent = Extent {
    inside: 0,
    host: 0,
    count: u32::MAX,
};

/// Parses a `/proc/PID/uid_map` text.
pub fn parse_map(text: &str) -> Option<Vec<Extent>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut f = l.split_whitespace().map(|n| n.parse::<u32>().ok());
            Some(Extent {
                inside: f.next()??,
                host: f.next()??,
                count: f.next()??,
            })
        })
        .collect()
}

/// The maps of the user namespace process `pid` is in, from its `uid_map` and
/// `gid_map`. `Err` names the file that could not be read or parsed.
pub fn read_maps(pid: impl std::fmt::Display) -> std::result::Result<Mappings, String> {
    let read = |which: &str| {
        let file = format!("/proc/{pid}/{which}_map");
        let text = std::fs::read_to_string(&file).map_err(|e| format!("read {file}: {e}"))?;
        parse_map(&text).ok_or_else(|| format!("unreadable {file}: {text:?}"))
    };
    Ok(Mappings {
        uids: read("uid")?,
        gids: read("gid")?,
    })
}

/// Compares the maps read from a restored process with what the spec asked for
/// (`None`: no user namespace). `Err` names the difference.
pub fn compare(
    uid_map: &str,
    gid_map: &str,
    want: Option<&Mappings>,
) -> std::result::Result<(), String> {
    let (want_uids, want_gids) = match want {
        Some(m) => (m.uids.clone(), m.gids.clone()),
        None => (vec![IDENTITY], vec![IDENTITY]),
    };
    for (which, text, want) in [("uid", uid_map, want_uids), ("gid", gid_map, want_gids)] {
        let mut got = parse_map(text).ok_or_else(|| format!("unreadable {which}_map {text:?}"))?;
        let mut want = want;
        got.sort_by_key(|e| e.inside);
        want.sort_by_key(|e| e.inside);
        if got != want {
            return Err(format!(
                "the restored processes' {which}_map is {got:?}, the spec's {want:?}: \
                 the images carry a user namespace the spec does not give"
            ));
        }
    }
    Ok(())
}

/// [`compare`] on the restored init `pid`.
pub fn verify(pid: i32, want: Option<&Mappings>) -> Result<()> {
    let read = |f: &str| {
        let p = format!("/proc/{pid}/{f}");
        std::fs::read_to_string(&p).map_err(Error::io(format!("read {p}")))
    };
    compare(&read("uid_map")?, &read("gid_map")?, want).map_err(|message| Error::BadCheckpoint {
        path: format!("/proc/{pid}").into(),
        message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST: &str = "         0          0 4294967295\n";
    const RANGE: &str = "         0     100000      65536\n";

    fn maps(host: u32) -> Mappings {
        let e = Extent {
            inside: 0,
            host,
            count: 65_536,
        };
        Mappings {
            uids: vec![e],
            gids: vec![e],
        }
    }

    #[test]
    fn test_the_specs_mappings_pass() {
        compare(RANGE, RANGE, Some(&maps(100_000))).unwrap();
        compare(HOST, HOST, None).unwrap();
    }

    #[test]
    fn test_images_mapping_host_root_or_another_range_are_refused() {
        // The archive's images map the sandbox onto host root.
        let e = compare("0 0 65536\n", "0 0 65536\n", Some(&maps(100_000))).unwrap_err();
        assert!(e.contains("uid_map"), "{e}");
        // Onto another sandbox's range.
        compare("0 200000 65536\n", RANGE, Some(&maps(100_000))).unwrap_err();
        // Only the gids differ.
        let e = compare(RANGE, "0 200000 65536\n", Some(&maps(100_000))).unwrap_err();
        assert!(e.contains("gid_map"), "{e}");
        // A spec without a user namespace, images with one.
        compare(RANGE, RANGE, None).unwrap_err();
        // A spec with one, images without.
        compare(HOST, HOST, Some(&maps(100_000))).unwrap_err();
    }
}
