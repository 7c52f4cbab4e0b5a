//! What the host runs and mounts, read from `/proc`: for the tests that kill
//! or unmount what a crash or a restart would.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Every process's pid and command line.
pub fn processes() -> Vec<(i32, Vec<String>)> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args = cmd
                .split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            Some((pid, args))
        })
        .collect()
}

/// Lazily unmounts every mount at or under `dir`, deepest first.
pub fn unmount_under(dir: &Path) -> Result<()> {
    let mountinfo =
        std::fs::read_to_string("/proc/self/mountinfo").context("read /proc/self/mountinfo")?;
    let mut points: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mount_point(p)))
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    for p in points {
        match nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH) {
            // Gone with a mount above it.
            Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => {}
            Err(e) => return Err(e).with_context(|| format!("unmount {}", p.display())),
        }
    }
    Ok(())
}

/// A mount point as mountinfo escapes it (`\040` for a space, ...).
fn unescape_mount_point(p: &str) -> String {
    let mut out = String::new();
    let mut chars = p.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let code: String = chars.by_ref().take(3).collect();
            if let Ok(b) = u8::from_str_radix(&code, 8) {
                out.push(b as char);
                continue;
            }
            out.push(c);
            out.push_str(&code);
        } else {
            out.push(c);
        }
    }
    out
}
