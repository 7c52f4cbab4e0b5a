//! Network images whose restore would change nothing, dropped after a dump.
//!
//! CRIU restores a network namespace's addresses, routes, rules and firewall by running
//! `ip ... restore`, `iptables-restore` and libnftables on what it saved, one process
//! each: about 30 ms for a namespace that holds nothing but `lo`. CRIU skips a step
//! whose image is absent (as for images of older versions), so an image is removed when
//! its restore is known to be a no-op on the namespace CRIU creates (a new one, whose
//! `lo` CRIU brings up from the link image, which is always kept):
//! - a dump of `ip` with no entry (routes), or an empty firewall dump;
//! - addresses that are only `lo`'s own, `127.0.0.1/8` and `::1/128`: the kernel
//!   assigns them when `lo` comes up, and `ip addr restore` of an address already
//!   there fails with EEXIST and changes nothing (CRIU ignores that failure). Only in
//!   a namespace of the container's own, where Crab brings `lo` up after every
//!   restore (see [`crate::netns`]): elsewhere `lo` may have been down at the dump,
//!   and then the restore is what puts the addresses back;
//! - rules that are exactly the three IPv4 rules of a new namespace (local, main,
//!   default), with no selector: restoring them flushes and re-adds the same rules.
//!
//! Anything else, or anything not understood, is kept: a kept image costs time, never
//! correctness.

use std::path::Path;

use crate::{Error, Result};

/// Removes from the image directory `images` the network images whose restore is a
/// no-op (see the module's comment); `own_namespace`: the dumped namespace is the
/// container's own, whose `lo` is brought up after every restore. Returns the names
/// of those removed.
pub fn prune(images: &Path, own_namespace: bool) -> Result<Vec<String>> {
    let entries =
        std::fs::read_dir(images).map_err(Error::io(format!("read {}", images.display())))?;
    let mut removed = Vec::new();
    for e in entries {
        let e = e.map_err(Error::io(format!("read {}", images.display())))?;
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(kind) = kind_of(&name) else { continue };
        if kind == Kind::Addresses && !own_namespace {
            continue;
        }
        let path = e.path();
        let bytes = std::fs::read(&path).map_err(Error::io(format!("read {}", path.display())))?;
        if restores_nothing(kind, &bytes) {
            std::fs::remove_file(&path).map_err(Error::io(format!("remove {}", path.display())))?;
            removed.push(name);
        }
    }
    removed.sort();
    Ok(removed)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `ip route save` output (IPv4 or IPv6).
    Routes,
    /// `ip addr save` output.
    Addresses,
    /// `ip rule save` output.
    Rules,
    /// `iptables-save`, `ip6tables-save` or nftables text.
    Firewall,
}

/// The kind of a network image by CRIU's file name (`<kind>-<netns id>.img`).
fn kind_of(name: &str) -> Option<Kind> {
    let stem = name.strip_suffix(".img")?;
    let (kind, id) = stem.rsplit_once('-')?;
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    match kind {
        "route" | "route6" => Some(Kind::Routes),
        "ifaddr" => Some(Kind::Addresses),
        "rule" => Some(Kind::Rules),
        "iptables" | "ip6tables" | "nftables" => Some(Kind::Firewall),
        _ => None,
    }
}

fn restores_nothing(kind: Kind, bytes: &[u8]) -> bool {
    match kind {
        Kind::Firewall => bytes.iter().all(u8::is_ascii_whitespace),
        Kind::Routes => messages(bytes).is_some_and(|m| m.is_empty()),
        Kind::Addresses => messages(bytes).is_some_and(|m| {
            !m.is_empty()
                && m.iter()
                    .all(|(ty, payload)| is_loopback_address(*ty, payload))
        }),
        Kind::Rules => messages(bytes).is_some_and(|m| are_default_rules(&m)),
    }
}

const NLMSG_HDRLEN: usize = 16;
const RTM_NEWADDR: u16 = 20;
const RTM_NEWRULE: u16 = 32;
const AF_INET: u8 = libc::AF_INET as u8;
const AF_INET6: u8 = libc::AF_INET6 as u8;
/// `lo`'s index in every network namespace.
const LOOPBACK_IFINDEX: u32 = 1;

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The netlink messages of an `ip ... save` dump (a 4-byte magic, then the messages
/// as the kernel sent them): (type, payload) each, or None if it does not parse.
fn messages(bytes: &[u8]) -> Option<Vec<(u16, &[u8])>> {
    let mut rest = bytes.get(4..)?;
    let mut out = Vec::new();
    while !rest.is_empty() {
        if rest.len() < NLMSG_HDRLEN {
            return None;
        }
        let len = u32_at(rest, 0) as usize;
        if len < NLMSG_HDRLEN || len > rest.len() {
            return None;
        }
        out.push((u16_at(rest, 4), &rest[NLMSG_HDRLEN..len]));
        rest = &rest[align4(len).min(rest.len())..];
    }
    Some(out)
}

/// The attributes (type, value) that follow a fixed header of `fixed` bytes, or None
/// if they do not parse.
fn attributes(payload: &[u8], fixed: usize) -> Option<Vec<(u16, &[u8])>> {
    let mut rest = payload.get(fixed..)?;
    let mut out = Vec::new();
    while rest.len() >= 4 {
        let len = u16_at(rest, 0) as usize;
        if len < 4 || len > rest.len() {
            return None;
        }
        // The nested-attribute and byte-order flags are not part of the type.
        out.push((u16_at(rest, 2) & 0x3fff, &rest[4..len]));
        rest = &rest[align4(len).min(rest.len())..];
    }
    rest.is_empty().then_some(out)
}

/// Whether an address message is one of the two that `lo` gets when it comes up.
fn is_loopback_address(ty: u16, payload: &[u8]) -> bool {
    const IFA_ADDRESS: u16 = 1;
    const IFA_LOCAL: u16 = 2;
    // struct ifaddrmsg: family, prefixlen, flags, scope (u8 each), index (u32).
    if ty != RTM_NEWADDR || payload.len() < 8 || u32_at(payload, 4) != LOOPBACK_IFINDEX {
        return false;
    }
    let Some(attrs) = attributes(payload, 8) else {
        return false;
    };
    let expected: &[u8] = match (payload[0], payload[1]) {
        (AF_INET, 8) => &[127, 0, 0, 1],
        (AF_INET6, 128) => &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        _ => return false,
    };
    let addresses: Vec<&[u8]> = attrs
        .iter()
        .filter(|(t, _)| matches!(*t, IFA_ADDRESS | IFA_LOCAL))
        .map(|(_, v)| *v)
        .collect();
    !addresses.is_empty() && addresses.iter().all(|a| *a == expected)
}

/// Whether the rule messages are exactly the IPv4 rules of a new namespace: priority
/// 0 to table local, 32766 to main, 32767 to default, made by the kernel, no selector.
fn are_default_rules(messages: &[(u16, &[u8])]) -> bool {
    const FRA_PRIORITY: u16 = 6;
    const FRA_SUPPRESS_PREFIXLEN: u16 = 14;
    const FRA_TABLE: u16 = 15;
    const FRA_PROTOCOL: u16 = 21;
    const FR_ACT_TO_TBL: u8 = 1;
    const RTPROT_KERNEL: u8 = 2;
    let mut seen = Vec::new();
    for (ty, payload) in messages {
        // struct fib_rule_hdr: family, dst_len, src_len, tos, table, res1, res2,
        // action (u8 each), flags (u32).
        if *ty != RTM_NEWRULE || payload.len() < 12 {
            return false;
        }
        let selectorless = payload[0] == AF_INET
            && payload[1..4] == [0, 0, 0]
            && payload[7] == FR_ACT_TO_TBL
            && u32_at(payload, 8) == 0;
        if !selectorless {
            return false;
        }
        let Some(attrs) = attributes(payload, 12) else {
            return false;
        };
        let (mut table, mut priority) = (u32::from(payload[4]), 0);
        for (t, v) in attrs {
            match (t, v.len()) {
                (FRA_TABLE, 4) => table = u32_at(v, 0),
                (FRA_PRIORITY, 4) => priority = u32_at(v, 0),
                (FRA_SUPPRESS_PREFIXLEN, 4) if u32_at(v, 0) == u32::MAX => {}
                (FRA_PROTOCOL, 1) if v[0] == RTPROT_KERNEL => {}
                _ => return false,
            }
        }
        seen.push((priority, table));
    }
    seen.sort_unstable();
    seen == [(0, 255), (32766, 254), (32767, 253)]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ifaddr-<id>.img` of a container whose namespace has only `lo`, up
    /// (CRIU 4.2 on Linux 6.18).
    const LOOPBACK_ADDRESSES: &[u8] = &[
        0x22, 0x12, 0x36, 0x47, 0x4c, 0x00, 0x00, 0x00, 0x14, 0x00, 0x02, 0x00, 0x32, 0xb3, 0x0d,
        0x6b, 0x20, 0x28, 0x00, 0x00, 0x02, 0x08, 0x80, 0xfe, 0x01, 0x00, 0x00, 0x00, 0x08, 0x00,
        0x01, 0x00, 0x7f, 0x00, 0x00, 0x01, 0x08, 0x00, 0x02, 0x00, 0x7f, 0x00, 0x00, 0x01, 0x07,
        0x00, 0x03, 0x00, 0x6c, 0x6f, 0x00, 0x00, 0x08, 0x00, 0x08, 0x00, 0x80, 0x00, 0x00, 0x00,
        0x14, 0x00, 0x06, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x22, 0xc0, 0x75,
        0x00, 0x22, 0xc0, 0x75, 0x00, 0x50, 0x00, 0x00, 0x00, 0x14, 0x00, 0x02, 0x00, 0x32, 0xb3,
        0x0d, 0x6b, 0x20, 0x28, 0x00, 0x00, 0x0a, 0x80, 0x80, 0xfe, 0x01, 0x00, 0x00, 0x00, 0x14,
        0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x01, 0x14, 0x00, 0x06, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        0xff, 0x22, 0xc0, 0x75, 0x00, 0x22, 0xc0, 0x75, 0x00, 0x08, 0x00, 0x08, 0x00, 0x80, 0x00,
        0x00, 0x00, 0x05, 0x00, 0x0b, 0x00, 0x01, 0x00, 0x00, 0x00,
    ];

    /// `rule-<id>.img` of the same namespace: the kernel's three default rules.
    const DEFAULT_RULES: &[u8] = &[
        0x86, 0x69, 0x70, 0x71, 0x34, 0x00, 0x00, 0x00, 0x20, 0x00, 0x02, 0x00, 0x32, 0xb3, 0x0d,
        0x6b, 0x23, 0x28, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0xff, 0x00, 0x00, 0x01, 0x00, 0x00,
        0x00, 0x00, 0x08, 0x00, 0x0f, 0x00, 0xff, 0x00, 0x00, 0x00, 0x08, 0x00, 0x0e, 0x00, 0xff,
        0xff, 0xff, 0xff, 0x05, 0x00, 0x15, 0x00, 0x02, 0x00, 0x00, 0x00, 0x3c, 0x00, 0x00, 0x00,
        0x20, 0x00, 0x02, 0x00, 0x32, 0xb3, 0x0d, 0x6b, 0x23, 0x28, 0x00, 0x00, 0x02, 0x00, 0x00,
        0x00, 0xfe, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x08, 0x00, 0x0f, 0x00, 0xfe, 0x00,
        0x00, 0x00, 0x08, 0x00, 0x0e, 0x00, 0xff, 0xff, 0xff, 0xff, 0x05, 0x00, 0x15, 0x00, 0x02,
        0x00, 0x00, 0x00, 0x08, 0x00, 0x06, 0x00, 0xfe, 0x7f, 0x00, 0x00, 0x3c, 0x00, 0x00, 0x00,
        0x20, 0x00, 0x02, 0x00, 0x32, 0xb3, 0x0d, 0x6b, 0x23, 0x28, 0x00, 0x00, 0x02, 0x00, 0x00,
        0x00, 0xfd, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x08, 0x00, 0x0f, 0x00, 0xfd, 0x00,
        0x00, 0x00, 0x08, 0x00, 0x0e, 0x00, 0xff, 0xff, 0xff, 0xff, 0x05, 0x00, 0x15, 0x00, 0x02,
        0x00, 0x00, 0x00, 0x08, 0x00, 0x06, 0x00, 0xff, 0x7f, 0x00, 0x00,
    ];

    /// Offset of the first address message's IPv4 address (IFA_ADDRESS) in
    /// [`LOOPBACK_ADDRESSES`], and of the first rule's action byte in [`DEFAULT_RULES`].
    const FIRST_ADDRESS: usize = 32;
    const FIRST_RULE_ACTION: usize = 27;

    #[test]
    fn a_namespace_with_only_lo_restores_nothing_from_its_addresses_and_rules() {
        assert!(restores_nothing(Kind::Addresses, LOOPBACK_ADDRESSES));
        assert!(restores_nothing(Kind::Rules, DEFAULT_RULES));
    }

    #[test]
    fn another_address_on_lo_is_kept() {
        let mut b = LOOPBACK_ADDRESSES.to_vec();
        b[FIRST_ADDRESS + 3] = 2; // 127.0.0.2
        assert!(!restores_nothing(Kind::Addresses, &b));
        let mut b = LOOPBACK_ADDRESSES.to_vec();
        b[21] = 16; // 127.0.0.1/16
        assert!(!restores_nothing(Kind::Addresses, &b));
        let mut b = LOOPBACK_ADDRESSES.to_vec();
        b[24] = 2; // on another interface
        assert!(!restores_nothing(Kind::Addresses, &b));
    }

    #[test]
    fn a_changed_missing_or_extra_rule_is_kept() {
        let mut b = DEFAULT_RULES.to_vec();
        b[FIRST_RULE_ACTION] = 2; // a goto instead of a table lookup
        assert!(!restores_nothing(Kind::Rules, &b));
        let mut b = DEFAULT_RULES.to_vec();
        b[22] = 8; // from 0.0.0.0/8
        assert!(!restores_nothing(Kind::Rules, &b));
        // Only the first two of the three rules.
        assert!(!restores_nothing(
            Kind::Rules,
            &DEFAULT_RULES[..4 + 0x34 + 0x3c]
        ));
        // The first rule twice more.
        let mut b = DEFAULT_RULES.to_vec();
        b.extend_from_slice(&DEFAULT_RULES[4..4 + 0x34]);
        assert!(!restores_nothing(Kind::Rules, &b));
    }

    #[test]
    fn empty_dumps_restore_nothing_and_any_entry_is_kept() {
        assert!(restores_nothing(Kind::Routes, &[0x24, 0x12, 0x31, 0x45]));
        assert!(!restores_nothing(Kind::Routes, LOOPBACK_ADDRESSES));
        assert!(!restores_nothing(Kind::Routes, &[]));
        assert!(restores_nothing(Kind::Firewall, b""));
        assert!(restores_nothing(Kind::Firewall, b"\n\n"));
        assert!(!restores_nothing(Kind::Firewall, b"*filter\nCOMMIT\n"));
        assert!(!restores_nothing(
            Kind::Addresses,
            &[0x22, 0x12, 0x36, 0x47]
        ));
    }

    #[test]
    fn truncated_dumps_are_kept() {
        for cut in [5, 20, 40, LOOPBACK_ADDRESSES.len() - 1] {
            assert!(!restores_nothing(
                Kind::Addresses,
                &LOOPBACK_ADDRESSES[..cut]
            ));
        }
        for cut in [5, 30, DEFAULT_RULES.len() - 2] {
            assert!(!restores_nothing(Kind::Rules, &DEFAULT_RULES[..cut]));
        }
    }

    #[test]
    fn only_network_images_are_looked_at() {
        assert_eq!(kind_of("route6-10.img"), Some(Kind::Routes));
        assert_eq!(kind_of("ifaddr-10.img"), Some(Kind::Addresses));
        assert_eq!(kind_of("nftables-3.img"), Some(Kind::Firewall));
        assert_eq!(kind_of("netdev-10.img"), None);
        assert_eq!(kind_of("route-x.img"), None);
        assert_eq!(kind_of("pages-1.img"), None);
    }

    #[test]
    fn prune_removes_what_restores_nothing_and_keeps_the_rest() {
        let dir = std::env::temp_dir().join(format!("crab-net-images-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("ifaddr-10.img"), LOOPBACK_ADDRESSES).unwrap();
        std::fs::write(dir.join("rule-10.img"), DEFAULT_RULES).unwrap();
        std::fs::write(dir.join("route-10.img"), [0x24, 0x12, 0x31, 0x45]).unwrap();
        std::fs::write(dir.join("iptables-10.img"), b"").unwrap();
        std::fs::write(dir.join("nftables-10.img"), b"table inet t {\n}\n").unwrap();
        std::fs::write(dir.join("netdev-10.img"), b"link").unwrap();
        let removed = prune(&dir, false).unwrap();
        assert_eq!(removed, ["iptables-10.img", "route-10.img", "rule-10.img"]);
        assert!(dir.join("ifaddr-10.img").exists(), "lo may have been down");
        let removed = prune(&dir, true).unwrap();
        assert_eq!(removed, ["ifaddr-10.img"]);
        assert!(dir.join("nftables-10.img").exists() && dir.join("netdev-10.img").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
