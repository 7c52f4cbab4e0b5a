//! The maps' records as Rust values (the C layouts are in src/bpf/inspector.h;
//! the skeleton generates matching `#[repr(C)]` types that are converted here).

use crate::skel::types;

/// What happened to a name (bits of `fs_val.flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsFlags(pub u32);

impl FsFlags {
    /// The name did not exist when the epoch began.
    pub const CREATED: u32 = 1;
    /// Written, truncated, or opened for writing.
    pub const WRITTEN: u32 = 2;
    /// Mode, owner, times or xattrs changed.
    pub const META: u32 = 4;
    /// Unlinked or renamed away.
    pub const REMOVED: u32 = 8;
    /// Never cancelled: a truncated path, or an inode with other links.
    pub const KEEP: u32 = 16;
    /// Mapped shared and writable.
    pub const MMAP: u32 = 32;
    /// The path came from an open file (exact), not from a syscall argument.
    pub const RESOLVED: u32 = 64;
    /// Written while it had no name (O_TMPFILE, or deleted but still open).
    pub const UNLINKED: u32 = 128;

    /// Whether bit `b` is set.
    pub fn has(self, b: u32) -> bool {
        self.0 & b != 0
    }

    /// A short label for reports, such as `created+written`.
    pub fn label(self) -> String {
        let names = [
            (Self::CREATED, "created"),
            (Self::WRITTEN, "written"),
            (Self::META, "metadata"),
            (Self::REMOVED, "removed"),
            (Self::MMAP, "mmap"),
        ];
        let parts: Vec<&str> = names
            .iter()
            .filter(|(b, _)| self.has(*b))
            .map(|(_, n)| *n)
            .collect();
        parts.join("+")
    }
}

/// One changed name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsChange {
    /// The path as the container's task saw it (from its root). For a path taken
    /// from a syscall argument, it is the directory's path joined with the argument
    /// as written (not normalised, symlinks not followed).
    pub path: String,
    /// What happened.
    pub flags: FsFlags,
    /// The superblock's device (kernel encoding, major << 20 | minor) when the
    /// path came from an open file; 0 when unknown.
    pub dev: u32,
    /// The process that first touched the name.
    pub pid: u32,
}

/// One task born or gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcChange {
    /// Thread id.
    pub pid: u32,
    /// Process id.
    pub tgid: u32,
    /// The task's command name.
    pub comm: String,
    /// Born (or moved in) since recording began, and alive.
    pub born: bool,
    /// Died since recording began.
    pub died: bool,
}

/// The sizes of the inspector's tables (mirroring `src/bpf/inspector.h`).
pub mod budget {
    /// Containers watched at once on the host; past it a container is not
    /// watched and every turn of it is a full checkpoint.
    pub const MAX_CGROUPS: u64 = 4096;
    /// Names with a net change, host-wide.
    pub const MAX_FS_ENTRIES: u64 = 131_072;
    /// Names one container may hold; past it the container (alone) overflows.
    pub const FS_BUDGET: u64 = 8192;
    /// Task births and deaths one container may hold.
    pub const PROC_BUDGET: u64 = 8192;
}

/// Bits of [`Counters::opaque`].
pub mod opaque {
    /// io_uring or AIO: writes that bypass the syscalls the inspector sees.
    pub const ASYNC_IO: u64 = 1;
    /// The mount tree changed.
    pub const MOUNT: u64 = 2;
    /// Changes before recording (re)started are unknown: the container was
    /// just watched, rolled back, or a checkpoint failed half-way (set from
    /// userspace, cleared by a full checkpoint).
    pub const UNTRACKED: u64 = 4;
}

/// A container's counters since recording (re)started: one map lookup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Names with a net change.
    pub fs_entries: u64,
    /// Tasks born (or moved in) and alive.
    pub births: u64,
    /// Tasks that died.
    pub deaths: u64,
    /// Tasks born and gone again (no net change).
    pub transient: u64,
    /// Records lost to a full map: the net state is unknown.
    pub overflow: u64,
    /// Effects the inspector cannot follow ([`opaque`] bits).
    pub opaque: u64,
    /// Syscalls of interest seen from the container, less writes to a file
    /// already recorded (those return before counting).
    pub events: u64,
    /// How many times records were forgotten (checkpoints): equal generations
    /// mean no checkpoint reset the records in between.
    pub gen: u64,
}

impl Counters {
    pub(crate) fn from_state(s: &types::cg_state) -> Counters {
        Counters {
            fs_entries: s.fs_entries,
            births: s.births,
            deaths: s.deaths,
            transient: s.transient,
            overflow: s.overflow,
            opaque: s.opaque,
            events: s.events,
            gen: s.gen,
        }
    }
}

pub(crate) fn c_str(raw: &[i8]) -> String {
    let bytes: Vec<u8> = raw
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

impl FsChange {
    pub(crate) fn from_raw(v: &types::fs_val) -> FsChange {
        FsChange {
            path: c_str(&v.path),
            flags: FsFlags(v.flags),
            dev: v.dev,
            pid: v.pid,
        }
    }
}

impl ProcChange {
    pub(crate) fn from_raw(k: &types::proc_key, v: &types::proc_val) -> ProcChange {
        ProcChange {
            pid: k.pid,
            tgid: v.tgid,
            comm: c_str(&v.comm),
            born: v.flags & 1 != 0,
            died: v.flags & 2 != 0,
        }
    }
}

/// Views a map record as bytes.
pub(crate) fn bytes_of<T: Copy>(v: &T) -> &[u8] {
    // SAFETY: only used with the skeleton's #[repr(C)] map records, which are
    // plain integers and byte arrays laid out without padding (see inspector.h),
    // so every byte is initialized; the slice lives no longer than `v`.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

/// Reads a map record from bytes (None if the size is wrong).
pub(crate) fn from_bytes<T: Copy>(b: &[u8]) -> Option<T> {
    if b.len() != std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: the length matches, the records are plain integers and byte arrays
    // (any bit pattern is valid), and read_unaligned copes with the alignment.
    Some(unsafe { std::ptr::read_unaligned(b.as_ptr().cast::<T>()) })
}

/// The kernel's encoding of a device number (`MKDEV`), as in `s_dev`.
pub fn kernel_dev(major: u32, minor: u32) -> u32 {
    (major << 20) | minor
}
