//! Soft-dirty page tracking, where the kernel has it (`CONFIG_MEM_SOFT_DIRTY`).
//!
//! Writing `4` to `/proc/<pid>/clear_refs` clears the soft-dirty bit (bit 55
//! of each `/proc/<pid>/pagemap` entry) of every page of that process; the
//! kernel sets it again on the page's next write. So, cleared at each dump, the
//! bits count the pages a process wrote since: how much its memory changed.
//!
//! Kernels without it accept the clear and never set the bit, so the support is
//! probed once, on this process: clear, write a page, read its bit. Where it is
//! missing (this project's CI machines), the CPU-time test alone decides, as
//! `docs/inspector.md` argues; the count is a detail of the report either way.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::sync::OnceLock;

const SOFT_DIRTY: u64 = 1 << 55;
const PAGE: u64 = 4096;

/// Whether this kernel sets soft-dirty bits.
pub fn available() -> bool {
    static PROBED: OnceLock<bool> = OnceLock::new();
    *PROBED.get_or_init(|| probe().unwrap_or(false))
}

fn probe() -> std::io::Result<bool> {
    let mut page = vec![0u8; 2 * PAGE as usize];
    // One whole page inside the buffer.
    let addr = (page.as_ptr() as u64).div_ceil(PAGE) * PAGE;
    let offset = (addr - page.as_ptr() as u64) as usize;
    page[offset] = 1;
    std::fs::write("/proc/self/clear_refs", "4")?;
    // The write after the clear is what must set the bit.
    // SAFETY: `offset` lies inside `page`, a live allocation of this function;
    // the volatile write keeps the store from being optimised away.
    unsafe { std::ptr::write_volatile(page.as_mut_ptr().add(offset), 2) };
    let entry = entry(&File::open("/proc/self/pagemap")?, addr)?;
    Ok(entry & SOFT_DIRTY != 0)
}

fn entry(pagemap: &File, addr: u64) -> std::io::Result<u64> {
    let mut buf = [0u8; 8];
    pagemap.read_exact_at(&mut buf, addr / PAGE * 8)?;
    Ok(u64::from_le_bytes(buf))
}

/// Clears the soft-dirty bits of process `pid` (at a dump, frozen).
pub fn clear(pid: i32) -> std::io::Result<()> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "4")
}

/// Pages of process `pid`'s writable mappings written since its last
/// [`clear`]; `None` where the kernel does not track them.
pub fn dirty_pages(pid: i32) -> Option<u64> {
    if !available() {
        return None;
    }
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let mut pagemap = File::open(format!("/proc/{pid}/pagemap")).ok()?;
    let mut dirty = 0;
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        if !perms.starts_with("rw") {
            continue;
        }
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16)) else {
            continue;
        };
        let mut buf = vec![0u8; ((hi - lo) / PAGE * 8) as usize];
        if pagemap.seek(SeekFrom::Start(lo / PAGE * 8)).is_err()
            || pagemap.read_exact(&mut buf).is_err()
        {
            continue;
        }
        dirty += buf
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .filter(|e| e & SOFT_DIRTY != 0)
            .count() as u64;
    }
    Some(dirty)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_agrees_with_a_page_this_process_writes() {
        // Whatever the kernel: after a clear and a write, the count is at
        // least one page where tracking exists, and absent where it does not.
        clear(std::process::id() as i32).unwrap();
        let mut v = vec![0u8; 64 * PAGE as usize];
        for i in (0..v.len()).step_by(PAGE as usize) {
            // SAFETY: `i` is inside `v`; volatile keeps the stores.
            unsafe { std::ptr::write_volatile(v.as_mut_ptr().add(i), 1) };
        }
        match dirty_pages(std::process::id() as i32) {
            Some(n) => assert!(available() && n >= 64, "{n} dirty pages"),
            None => assert!(!available()),
        }
        drop(v);
    }
}
