/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Map layouts shared by the eBPF programs and the Rust side (the skeleton
 * generates matching #[repr(C)] types; src/abi.rs converts them). Every record is
 * laid out without padding, so its bytes can be used as a hash key as they are.
 */
#ifndef CRAB_INSPECTOR_H
#define CRAB_INSPECTOR_H

/* fs entry flags */
#define FS_CREATED 1   /* the name did not exist when recording began */
#define FS_WRITTEN 2   /* content written, truncated, or opened for writing */
#define FS_META 4      /* mode, owner, times, xattrs */
#define FS_REMOVED 8   /* unlinked or renamed away */
#define FS_KEEP 16     /* never cancelled: truncated path, or an inode with other links */
#define FS_MMAP 32     /* mapped shared and writable */
#define FS_RESOLVED 64 /* the path comes from an open file (exact), not a syscall argument */
#define FS_UNLINKED 128 /* written while it had no name (O_TMPFILE, deleted but open) */

/* cg_state.opaque bits: effects the inspector cannot follow */
#define OPAQUE_ASYNC_IO 1 /* io_uring or AIO: writes without syscalls */
#define OPAQUE_MOUNT 2    /* the mount tree changed */
#define OPAQUE_UNTRACKED 4 /* set from userspace: the next checkpoint is full anyway */

/* proc entry flags */
#define PROC_BORN 1
#define PROC_DIED 2

#define PATH_KEY 256

/* Sizes (docs/inspector.md, "Sizes"). The host's tables are shared by every
 * watched container; each container may hold at most its budget of them, so that
 * one container's flood marks only itself as overflowed (a full checkpoint), never
 * the others. Mirrored in src/abi.rs (`budget`). */
#define MAX_CGROUPS 4096      /* containers watched at once on the host */
#define MAX_FS_ENTRIES 131072 /* names with a net change, host-wide */
#define MAX_PROC_ENTRIES 131072
#define FS_BUDGET 8192        /* names per container */
#define PROC_BUDGET 8192      /* task births and deaths per container */

struct cg_key {
	__u64 cgid;
};

/* Per watched container, since recording (re)started. */
struct cg_state {
	__u64 fs_entries; /* names with a net change */
	__u64 births;     /* tasks born (or moved in) and alive */
	__u64 deaths;     /* tasks that died */
	__u64 transient;  /* tasks born and gone: no net change */
	__u64 overflow;   /* records that did not fit: the net state is unknown */
	__u64 opaque;     /* OPAQUE_* bits */
	__u64 events;     /* syscalls of interest, less writes to a file already recorded */
	__u64 gen;        /* bumped by userspace when it forgets: stales the `seen` cache */
};

/* A name's entry is keyed by a 64-bit hash of its path, not the path: a key of
 * 16 bytes hashes and compares in a fraction of the time of one of 264, and a
 * lookup touches one cache line of the element, not five. The path itself is in
 * the value; two paths with the same hash are told apart there, and the second
 * one counts as an overflow (a full checkpoint), so a collision costs time,
 * never a missed change. */
struct fs_key {
	__u64 cgid;
	__u64 hash;
};

struct fs_val {
	__u32 flags;
	__u32 dev; /* the superblock's device, for resolved paths; 0 otherwise */
	__u32 pid;
	__u32 pad;
	__u64 first_ns;
	char path[PATH_KEY]; /* as seen from the task's root, zero-padded */
};

struct proc_key {
	__u64 cgid;
	__u32 pid;
	__u32 pad;
};

struct proc_val {
	__u32 flags;
	__u32 tgid;
	__u64 ns;
	char comm[16];
};

/* Set by the loader: which f_mode bit says "this open created the file". The
 * kernel renumbered FMODE_* over time, so it is measured at load (calibration). */
struct config {
	__u32 calib_tid; /* f_modes of opens by this thread go to calib_mode[] */
	__u32 created_mask;
	__u64 calib_count;
	__u64 calib_mode[4];
};

#endif
