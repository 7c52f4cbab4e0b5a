// SPDX-License-Identifier: GPL-2.0
/*
 * Crab's inspector: the net effect of a container's turn on its file systems
 * and its process set, per container (keyed by the cgroup2 id that
 * bpf_get_current_cgroup_id() reports for its tasks).
 *
 * Loaded once per host and shared by all containers. Every program first looks
 * up the current task's cgroup in `cgroups` and returns at once when it is not
 * watched, so the rest of the host pays one hash lookup per syscall.
 *
 * Only tracepoints: kernels this must run on have no kprobes, and some refuse
 * BPF trampolines (fentry, LSM). File system effects are taken at the syscall
 * boundary (raw sys_enter / sys_exit, BTF-typed), as paths seen from the task's
 * root: a path from an open file is exact (the kernel resolved it); a path from
 * a syscall argument is its directory's path plus the argument as written.
 *
 * Net semantics: one entry per path. A name that did not exist before (an open
 * that created the file, mkdir, mknod, symlink, link, rename with NOREPLACE) and
 * is removed again leaves no entry. Anything else stays an entry. Operations on
 * names apply at sys_exit and only when the syscall succeeded; writes through a
 * file descriptor count at sys_enter, whatever their outcome.
 */
#include "kernel.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "inspector.h"

char LICENSE[] SEC("license") = "GPL";

/* kfunc (kernel 6.2 and later): lets the verifier type a pointer read from
 * memory as a kernel struct, whose fields are then read with plain loads (a
 * fault reads as 0). Weak: where the kernel lacks it (Debian 12's 6.1), libbpf
 * leaves it unresolved and the programs read through bpf_probe_read_kernel()
 * instead (KREAD). */
extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym __weak;

/* Set by the loader from the kernel's BTF: whether bpf_rdonly_cast exists.
 * Read-only data: the verifier knows its value, follows only the branch it
 * selects and drops the other (with its unresolved kfunc call) as dead code. */
const volatile bool have_rdonly_cast = true;

/* Member `...` (a path such as f_path.mnt) of the kernel struct `type` at
 * address `addr` (an integer), as a __u64: a plain load through
 * bpf_rdonly_cast() where the kernel has it (no helper call: these run at every
 * write of a watched container), else bpf_probe_read_kernel() at the member's
 * offset in the running kernel (CO-RE). */
#define KREAD(type, addr, ...)                                                               \
	({                                                                                    \
		/* outside the CO-RE access: `addr` may read a local struct */                \
		__u64 __kaddr = (__u64)(addr);                                                \
		have_rdonly_cast                                                              \
			? (__u64)((type *)bpf_rdonly_cast((void *)__kaddr,                    \
							  bpf_core_type_id_kernel(type)))     \
				  ->__VA_ARGS__                                               \
			: (__u64)BPF_CORE_READ((type *)__kaddr, __VA_ARGS__);                 \
	})

#define AT_FDCWD -100
#define AT_REMOVEDIR 0x200
#define RENAME_NOREPLACE 1
#define RENAME_EXCHANGE 2
#define MAX_DEPTH 32
#define BUF_MASK (2 * PATH_KEY - 1)

/* x86_64 syscall numbers */
enum {
	NR_write = 1, NR_open = 2, NR_mmap = 9, NR_pwrite64 = 18, NR_writev = 20,
	NR_sendfile = 40, NR_truncate = 76, NR_ftruncate = 77, NR_rename = 82,
	NR_mkdir = 83, NR_rmdir = 84, NR_creat = 85, NR_link = 86, NR_unlink = 87,
	NR_symlink = 88, NR_chmod = 90, NR_fchmod = 91, NR_chown = 92, NR_fchown = 93,
	NR_lchown = 94, NR_utime = 132, NR_mknod = 133, NR_pivot_root = 155,
	NR_mount = 165, NR_umount2 = 166, NR_setxattr = 188, NR_lsetxattr = 189,
	NR_fsetxattr = 190, NR_removexattr = 197, NR_lremovexattr = 198,
	NR_fremovexattr = 199, NR_io_setup = 206, NR_utimes = 235, NR_openat = 257,
	NR_mkdirat = 258, NR_mknodat = 259, NR_fchownat = 260, NR_futimesat = 261,
	NR_unlinkat = 263, NR_renameat = 264, NR_linkat = 265, NR_symlinkat = 266,
	NR_fchmodat = 268, NR_splice = 275, NR_utimensat = 280, NR_fallocate = 285,
	NR_pwritev = 296, NR_renameat2 = 316, NR_copy_file_range = 326,
	NR_pwritev2 = 328, NR_io_uring_setup = 425, NR_open_tree = 428,
	NR_move_mount = 429, NR_fsmount = 432, NR_openat2 = 437, NR_fchmodat2 = 452,
	NR_setxattrat = 463, NR_removexattrat = 466,
};

/* A name as the walks build it: the path, zero-padded (so that it can be
 * hashed and compared a word at a time), and whose it is. */
struct fs_path {
	__u64 cgid;
	char path[PATH_KEY];
};

/* What a pending name operation does at sys_exit. */
enum { OP_NOTE = 1, OP_REMOVE, OP_RENAME, OP_EXCHANGE };

struct pending {
	__u32 op;
	__u32 flags; /* for OP_NOTE; FS_CREATED for a rename target that cannot exist */
	struct fs_path a;
	struct fs_path b;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_CGROUPS);
	__type(key, struct cg_key);
	__type(value, struct cg_state);
} cgroups SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_FS_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct fs_key);
	__type(value, struct fs_val);
} fs_entries SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PROC_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct proc_key);
	__type(value, struct proc_val);
} proc_entries SEC(".maps");

/* A name operation between its sys_enter and its sys_exit, in the thread's own
 * storage: no hashing, and no allocation after the thread's first (a hash keyed
 * by thread id allocated and freed an entry per unlink, rename or mkdir).
 * op == 0: none. */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct pending);
} pendings SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config);
} configs SEC(".maps");

/* Names already recorded, by dentry: repeated writes to the same file skip
 * the path walk and the entry update. A hit needs the same generation (none
 * forgotten since), the same inode behind the dentry, the same flags, and the
 * same "has no link" state (a name removed since makes the file unlinked). */
struct seen_key {
	__u64 cgid;
	__u64 dentry;
};

struct seen_val {
	__u64 gen;
	__u64 inode;
	__u32 flags;
	__u32 unlinked;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct seen_key);
	__type(value, struct seen_val);
} seen SEC(".maps");

/* The last file found or created recorded on this CPU: a write loop hits it
 * without hashing into `seen`. Same fields and same validation as a `seen`
 * entry: a copy of what `seen` said, or of a creation just recorded. Only
 * sys_enter and sys_exit use it, and neither runs nested in itself or in the
 * other on one CPU (no syscall starts or ends inside a program; a nested run
 * of the same program is skipped and counted as a miss), so no run can see it
 * half-written. */
struct last_file {
	__u64 cgid;
	__u64 dentry;
	struct seen_val v;
};

/* Per-CPU scratch: none of this fits the 512-byte stack. Each key is followed
 * by PATH_KEY spare bytes, so that a string of up to PATH_KEY bytes read at any
 * offset inside the key's path stays inside the record (verifier bounds). */
struct scratch {
	struct pending pend;
	char spill_b[PATH_KEY];
	struct fs_path key;
	char spill_k[PATH_KEY];
	char buf[2 * PATH_KEY + 256];
	struct fs_val val;
	struct last_file last;
	__u64 addr; /* see addr_of */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} scratches SEC(".maps");

static __always_inline struct cg_state *watched(__u64 cgid)
{
	struct cg_key k = {.cgid = cgid};
	struct cg_state *st = bpf_map_lookup_elem(&cgroups, &k);
	/* Until the next full checkpoint nothing recorded would be used: the
	 * container was just created or rolled back, or a checkpoint failed. */
	if (st && (st->opaque & OPAQUE_UNTRACKED))
		return 0;
	return st;
}

static __always_inline struct scratch *get_scratch(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&scratches, &zero);
}

/* The address of the open file behind `fd` of the current task (0: none); its
 * members are read with KREAD. */
static __always_inline __u64 file_of(int fd)
{
	struct task_struct *t = bpf_get_current_task_btf();
	struct fdtable *fdt = t->files->fdt;
	if (fd < 0 || fd >= fdt->max_fds)
		return 0;
	/* fdt->fd[fd]: the verifier types no load from an array of pointers, so
	 * the slot is read as a struct whose first member is a pointer. */
	return KREAD(struct list_head, (__u64)fdt->fd + fd * sizeof(void *), next);
}

/* A kernel pointer as the integer a global function takes (it takes no
 * untrusted pointers): a pointer stored in map memory reads back as a plain
 * number. A copy through memory costs next to nothing; reading the field with
 * bpf_probe_read_kernel() instead costs a helper call. */
static __always_inline __u64 addr_of(struct scratch *s, __u64 p)
{
	*(volatile __u64 *)&s->addr = p;
	return *(volatile __u64 *)&s->addr;
}

/* Where a path is built: the two keys of a pending operation, or the scratch key. */
enum { SLOT_A = 0, SLOT_B = 1, SLOT_KEY = 2 };

static __always_inline struct fs_path *slot_key(struct scratch *s, __u32 slot)
{
	if (slot == SLOT_A)
		return &s->pend.a;
	if (slot == SLOT_B)
		return &s->pend.b;
	return &s->key;
}

/* State of a path walk, one step per bpf_loop() iteration. Kernel pointers
 * are kept as integers and read through KREAD at each step: plain loads where
 * the kernel has bpf_rdonly_cast (a path walk runs at every open for writing
 * of a new file and at every name operation). */
struct walk {
	struct scratch *s;
	__u64 vmnt;
	__u64 dentry;
	__u64 root_d;
	__u64 root_m;
	__u32 off;
};

/* One step up: a name, or a jump from a mount's root to its mount point.
 * Returns 1 when the walk is done. */
static long walk_step(__u32 i, void *arg)
{
	struct walk *w = arg;
	struct scratch *s = w->s;
	if (!s)
		return 1;
	if (w->dentry == w->root_d && w->vmnt == w->root_m)
		return 1;
	if (KREAD(struct vfsmount, w->vmnt, mnt_root) == w->dentry) {
		/* container_of, with the offset relocated for the running kernel */
		__u64 mnt_addr = w->vmnt - bpf_core_field_offset(struct mount, mnt);
		__u64 parent = KREAD(struct mount, mnt_addr, mnt_parent);
		if (parent == mnt_addr)
			return 1;
		w->dentry = KREAD(struct mount, mnt_addr, mnt_mountpoint);
		w->vmnt = parent + bpf_core_field_offset(struct mount, mnt);
		return 0;
	}
	__u64 up = KREAD(struct dentry, w->dentry, d_parent);
	if (up == w->dentry)
		return 1;
	__u32 len = KREAD(struct dentry, w->dentry, d_name.len) & 255;
	__u32 off = w->off;
	if (len + 1 > off)
		return 1;
	off -= len;
	/* the one copy left: a name of any length */
	bpf_probe_read_kernel(&s->buf[off & BUF_MASK], len,
			      (const void *)KREAD(struct dentry, w->dentry, d_name.name));
	off -= 1;
	s->buf[off & BUF_MASK] = '/';
	w->off = off;
	w->dentry = up;
	return 0;
}

/*
 * Writes the path of (vmnt, dentry) as seen from the current task's root into
 * the key in `slot` (whose path must be zeroed). Returns its length, or -1.
 * The walk is d_path's: up the dentries, across mount points, to the root,
 * run by bpf_loop() so that the verifier checks one step, not every path
 * through MAX_DEPTH of them.
 *
 * A global (not inlined) function: the verifier checks it once, not once per
 * call site. Kernel pointers come in as integers, as global functions take no
 * untrusted pointers.
 */
__noinline int path_into(struct scratch *s, __u32 slot, __u64 vmnt_addr, __u64 dentry_addr)
{
	if (!s)
		return -1;
	struct task_struct *t = bpf_get_current_task_btf();
	struct fs_struct *fs = t->fs;
	struct walk w = {
		.s = s,
		.vmnt = vmnt_addr,
		.dentry = dentry_addr,
		.root_d = (__u64)fs->root.dentry,
		.root_m = (__u64)fs->root.mnt,
		.off = 2 * PATH_KEY - 1,
	};
	s->buf[w.off & BUF_MASK] = 0;
	bpf_loop(MAX_DEPTH, walk_step, &w, 0);
	__u32 off = w.off;
	if (off == 2 * PATH_KEY - 1) {
		off -= 1;
		s->buf[off & BUF_MASK] = '/';
	}
	struct fs_path *k = slot_key(s, slot);
	long n = bpf_probe_read_kernel_str(k->path, PATH_KEY, &s->buf[off & BUF_MASK]);
	return n > 0 ? n - 1 : -1;
}

static __always_inline void clear_key(struct fs_path *k, __u64 cgid)
{
	k->cgid = cgid;
	__builtin_memset(k->path, 0, PATH_KEY);
}

/* The key of an open file; returns the FS_* flags it implies (KEEP), or -1. */
static __always_inline long key_of_file(struct scratch *s, __u64 cgid, __u64 f, __u32 *dev)
{
	struct fs_path *k = &s->key;
	clear_key(k, cgid);
	if (path_into(s, SLOT_KEY, addr_of(s, KREAD(struct file, f, f_path.mnt)),
		      addr_of(s, KREAD(struct file, f, f_path.dentry))) < 0)
		return -1;
	__u64 ino = KREAD(struct file, f, f_inode);
	__u64 sb = KREAD(struct inode, ino, i_sb);
	*dev = KREAD(struct super_block, sb, s_dev);
	/* Other hard links share what is written here: never cancel this name.
	 * No link at all: an O_TMPFILE or deleted-but-open file, whose content is
	 * process state (CRIU keeps it as a ghost file) if anyone still holds it. */
	__u32 nlink = KREAD(struct inode, ino, __i_nlink);
	return nlink > 1 ? FS_KEEP : nlink == 0 ? FS_UNLINKED : 0;
}

/* The key (in `slot`) of a syscall's path argument relative to `dirfd`; returns
 * the FS_* flags it implies (KEEP when truncated), or -1. Global, as path_into. */
__noinline int key_of_arg(struct scratch *s, __u32 slot, __u64 cgid, int dirfd, __u64 upath_addr)
{
	if (!s)
		return -1;
	const char *upath = (const char *)upath_addr;
	struct fs_path *k = slot_key(s, slot);
	char head[2] = {};
	clear_key(k, cgid);
	if (!upath || bpf_probe_read_user(head, sizeof(head), upath) < 0)
		return -1;
	__u32 base = 0;
	if (head[0] != '/') {
		__u64 m;
		__u64 d;
		if (dirfd == AT_FDCWD) {
			struct task_struct *t = bpf_get_current_task_btf();
			m = (__u64)t->fs->pwd.mnt;
			d = (__u64)t->fs->pwd.dentry;
		} else {
			__u64 f = file_of(dirfd);
			if (!f)
				return -1;
			m = KREAD(struct file, f, f_path.mnt);
			d = KREAD(struct file, f, f_path.dentry);
		}
		long n = path_into(s, slot, addr_of(s, m), addr_of(s, d));
		if (n < 0)
			return -1;
		k = slot_key(s, slot);
		base = n;
		if (base > 1) {
			k->path[base & (PATH_KEY - 1)] = '/';
			base++;
		}
		if (head[0] == '.' && head[1] == '/')
			upath += 2;
		if (head[0] == '.' && head[1] == 0) {
			/* "." itself: the directory. */
			if (base > 1)
				k->path[(base - 1) & (PATH_KEY - 1)] = 0;
			return 0;
		}
	}
	if (base >= PATH_KEY)
		return FS_KEEP;
	long n = bpf_probe_read_user_str(&k->path[base & (PATH_KEY - 1)], PATH_KEY, upath);
	if (n <= 0)
		return -1;
	__u32 total = base + n - 1;
	if (total >= PATH_KEY)
		return FS_KEEP;
	if (total > 1 && k->path[(total - 1) & (PATH_KEY - 1)] == '/')
		k->path[(total - 1) & (PATH_KEY - 1)] = 0;
	return 0;
}

/* The map key of a name: its cgroup, and a hash of its path a word at a time
 * (the path is zero-padded, and no word inside it is zero, so the first zero
 * word ends it). Mixing as in splitmix64's finaliser. */
static __always_inline void key_of_path(struct fs_key *k, const struct fs_path *p)
{
	const __u64 *w = (const __u64 *)p->path;
	__u64 h = p->cgid ^ 0x9e3779b97f4a7c15ULL;
	for (int i = 0; i < PATH_KEY / 8; i++) {
		__u64 x = w[i];
		if (!x)
			break;
		h = (h ^ x) * 0xbf58476d1ce4e5b9ULL;
		h ^= h >> 31;
	}
	h = (h ^ (h >> 30)) * 0x94d049bb133111ebULL;
	k->cgid = p->cgid;
	k->hash = h ^ (h >> 31);
}

/* Whether an entry is the name's and not another with the same hash. */
static __always_inline bool same_path(const struct fs_val *v, const struct fs_path *p)
{
	const __u64 *a = (const __u64 *)v->path, *b = (const __u64 *)p->path;
	for (int i = 0; i < PATH_KEY / 8; i++) {
		if (a[i] != b[i])
			return false;
		if (!a[i])
			break;
	}
	return true;
}

/* Records `flags` for the name `p`, whose map key is `k`. Most names are new
 * when they get here (the `seen` cache filters repeated writes), so the insert
 * comes first: one walk of a hash bucket instead of a lookup and then the
 * insert's own. A name already there gets the new flags (never "created"). */
static __always_inline void note_at(struct cg_state *st, struct scratch *s, struct fs_key *k,
				    struct fs_path *p, __u32 flags, __u32 dev)
{
	s->val.flags = flags;
	s->val.dev = dev;
	s->val.pid = bpf_get_current_pid_tgid() >> 32;
	s->val.pad = 0;
	s->val.first_ns = bpf_ktime_get_ns();
	__builtin_memcpy(s->val.path, p->path, PATH_KEY);
	/* At its budget a container may still mark a name it holds; a new one is
	 * an overflow of its own (the host's table stays open to the others). */
	long err = st->fs_entries >= FS_BUDGET
		       ? -17 /* EEXIST: look it up below */
		       : bpf_map_update_elem(&fs_entries, k, &s->val, BPF_NOEXIST);
	if (err == 0) {
		__sync_fetch_and_add(&st->fs_entries, 1);
		return;
	}
	struct fs_val *v = err == -17 /* EEXIST */ ? bpf_map_lookup_elem(&fs_entries, k) : 0;
	if (v && same_path(v, p))
		__sync_fetch_and_or(&v->flags, flags & ~FS_CREATED);
	else
		__sync_fetch_and_add(&st->overflow, 1);
}

static __always_inline void note(struct cg_state *st, struct scratch *s, struct fs_path *p,
				 __u32 flags, __u32 dev)
{
	struct fs_key k;
	key_of_path(&k, p);
	note_at(st, s, &k, p, flags, dev);
}

/* A name went away: one created since recording began cancels out. */
static __always_inline void removed(struct cg_state *st, struct scratch *s, struct fs_path *p)
{
	struct fs_key k;
	key_of_path(&k, p);
	struct fs_val *v = bpf_map_lookup_elem(&fs_entries, &k);
	if (v && same_path(v, p) && (v->flags & FS_CREATED) && !(v->flags & FS_KEEP)) {
		if (bpf_map_delete_elem(&fs_entries, &k) == 0)
			__sync_fetch_and_add(&st->fs_entries, -1);
		return;
	}
	note_at(st, s, &k, p, FS_REMOVED, 0);
}

static __always_inline bool seen_hit(struct seen_val *sv, struct cg_state *st, __u64 ino,
				     __u32 unlinked, __u32 flags)
{
	return sv->gen == st->gen && sv->inode == ino && sv->unlinked == unlinked &&
	       (sv->flags & flags) == flags;
}

/* Records `flags` for an open file, unless `seen` says they already are.
 * Returns 1 when nothing was new. The outcome is kept in this CPU's last_file. */
static __always_inline int note_file(struct cg_state *st, struct scratch *s, __u64 cgid,
				     __u64 f, __u32 flags)
{
	__u64 d = KREAD(struct file, f, f_path.dentry);
	__u64 ino = KREAD(struct file, f, f_inode);
	__u32 unlinked = KREAD(struct inode, ino, __i_nlink) == 0;
	struct last_file *last = &s->last;
	if (last->cgid == cgid && last->dentry == d &&
	    seen_hit(&last->v, st, ino, unlinked, flags))
		return 1;
	/* A file this open created is only remembered on this CPU, not in
	 * `seen`: its writes, owner, mode and times follow at once, from the
	 * same task (tar, pip, a compiler's output). An LRU insert per created
	 * file cost more than the walks it saved. Its dentry is fresh, or a
	 * negative one made positive, so `seen` holds nothing valid for it. */
	bool created = flags & FS_CREATED;
	struct seen_key sk = {.cgid = cgid, .dentry = d};
	struct seen_val *sv = created ? 0 : bpf_map_lookup_elem(&seen, &sk);
	struct seen_val nv = {.gen = st->gen, .inode = ino, .unlinked = unlinked};
	/* same: the entry is this file's, still valid; hit: with these flags too */
	bool same = sv && seen_hit(sv, st, ino, unlinked, 0);
	bool hit = same && (sv->flags & flags) == flags;
	if (hit) {
		nv.flags = sv->flags;
	} else {
		__u32 dev = 0;
		long extra = key_of_file(s, cgid, f, &dev);
		if (extra < 0) {
			__sync_fetch_and_add(&st->overflow, 1);
			return 0;
		}
		note(st, s, &s->key, flags | FS_RESOLVED | extra, dev);
		nv.flags = (same ? sv->flags : 0) | (flags & ~FS_CREATED);
		/* A file this open created: what is later written to it or done to
		 * its metadata is part of a creation already recorded (tar and
		 * pip set times, owner and mode of each file they make). */
		if (created)
			nv.flags |= FS_WRITTEN | FS_META;
		else
			bpf_map_update_elem(&seen, &sk, &nv, BPF_ANY);
	}
	last->cgid = cgid;
	last->dentry = d;
	last->v = nv;
	return hit;
}

/* As note_file, for the regular file behind `fd`; returns 1 when nothing was new. */
static __always_inline int note_fd(struct cg_state *st, struct scratch *s, __u64 cgid, int fd,
				   __u32 flags)
{
	__u64 f = file_of(fd);
	if (!f)
		return 1;
	__u64 ino = KREAD(struct file, f, f_inode);
	if (!S_ISREG(KREAD(struct inode, ino, i_mode)))
		return 1;
	return note_file(st, s, cgid, f, flags);
}

/* Prepares a name operation for sys_exit. */
static __always_inline void pend(struct cg_state *st, struct scratch *s, __u64 cgid, __u32 op,
				 __u32 flags, int dfd_a, const char *a, int dfd_b, const char *b)
{
	__builtin_memset(&s->pend, 0, sizeof(s->pend));
	s->pend.op = op;
	long fa = key_of_arg(s, SLOT_A, cgid, dfd_a, (__u64)a);
	if (fa < 0) {
		__sync_fetch_and_add(&st->overflow, 1);
		return;
	}
	s->pend.flags = flags | fa;
	if (b) {
		long fb = key_of_arg(s, SLOT_B, cgid, dfd_b, (__u64)b);
		if (fb < 0) {
			__sync_fetch_and_add(&st->overflow, 1);
			return;
		}
		s->pend.flags |= fb;
	}
	struct pending *p = bpf_task_storage_get(&pendings, bpf_get_current_task_btf(), 0,
						 BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!p) {
		__sync_fetch_and_add(&st->overflow, 1);
		return;
	}
	__builtin_memcpy(p, &s->pend, sizeof(*p));
}

static __always_inline void pend1(struct cg_state *st, struct scratch *s, __u64 cgid, __u32 op,
				  __u32 flags, int dfd, const char *p)
{
	pend(st, s, cgid, op, flags, dfd, p, 0, 0);
}

static __always_inline bool enter_relevant(long id)
{
	switch (id) {
	case NR_write: case NR_pwrite64: case NR_writev: case NR_pwritev: case NR_pwritev2:
	case NR_ftruncate: case NR_fallocate: case NR_sendfile: case NR_splice:
	case NR_copy_file_range: case NR_mmap: case NR_fchmod: case NR_fchown:
	case NR_fsetxattr: case NR_fremovexattr: case NR_truncate: case NR_chmod:
	case NR_chown: case NR_lchown: case NR_utime: case NR_utimes: case NR_setxattr:
	case NR_lsetxattr: case NR_removexattr: case NR_lremovexattr: case NR_fchmodat:
	case NR_fchmodat2: case NR_fchownat: case NR_futimesat: case NR_setxattrat:
	case NR_removexattrat: case NR_utimensat: case NR_mkdir: case NR_mkdirat:
	case NR_mknodat: case NR_mknod: case NR_symlink: case NR_symlinkat: case NR_link:
	case NR_linkat: case NR_unlink: case NR_rmdir: case NR_unlinkat: case NR_rename:
	case NR_renameat: case NR_renameat2: case NR_io_setup: case NR_io_uring_setup:
	case NR_mount: case NR_umount2: case NR_pivot_root: case NR_move_mount:
	case NR_fsmount: case NR_open_tree:
		return true;
	}
	return false;
}

/* Whether sys_enter left a pending operation for this syscall. */
static __always_inline bool exit_pending(long id)
{
	switch (id) {
	case NR_truncate: case NR_chmod: case NR_chown: case NR_lchown: case NR_utime:
	case NR_utimes: case NR_setxattr: case NR_lsetxattr: case NR_removexattr:
	case NR_lremovexattr: case NR_fchmodat: case NR_fchmodat2: case NR_fchownat:
	case NR_futimesat: case NR_setxattrat: case NR_removexattrat: case NR_utimensat:
	case NR_mkdir: case NR_mkdirat: case NR_mknodat: case NR_mknod: case NR_symlink:
	case NR_symlinkat: case NR_link: case NR_linkat: case NR_unlink: case NR_rmdir:
	case NR_unlinkat: case NR_rename: case NR_renameat: case NR_renameat2:
		return true;
	}
	return false;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(sys_enter, struct pt_regs *regs, long id)
{
	/* Most syscalls are not ours: decide that before any map lookup. */
	if (!enter_relevant(id))
		return 0;
	__u64 cgid = bpf_get_current_cgroup_id();
	struct cg_state *st = watched(cgid);
	if (!st)
		return 0;
	struct scratch *s = get_scratch();
	if (!s)
		return 0;
	/* tp_btf: regs is a BTF pointer, read with plain loads */
	unsigned long a0 = regs->di, a1 = regs->si, a2 = regs->dx, a3 = regs->r10;
	unsigned long a4 = regs->r8;

	switch (id) {
	/* content through a file descriptor */
	case NR_write: case NR_pwrite64: case NR_writev: case NR_pwritev: case NR_pwritev2:
	case NR_ftruncate: case NR_fallocate: case NR_sendfile:
		/* A file already recorded: nothing to do, not even the count. */
		if (note_fd(st, s, cgid, a0, FS_WRITTEN))
			return 0;
		break;
	case NR_splice: case NR_copy_file_range:
		if (note_fd(st, s, cgid, a2, FS_WRITTEN))
			return 0;
		break;
	case NR_mmap: {
		__u32 type = a3 & MAP_TYPE;
		if ((a2 & PROT_WRITE) && (type == MAP_SHARED || type == MAP_SHARED_VALIDATE))
			note_fd(st, s, cgid, a4, FS_WRITTEN | FS_MMAP);
		break;
	}
	case NR_fchmod: case NR_fchown: case NR_fsetxattr: case NR_fremovexattr:
		note_fd(st, s, cgid, a0, FS_META);
		break;
	/* content and metadata by name */
	case NR_truncate:
		pend1(st, s, cgid, OP_NOTE, FS_WRITTEN, AT_FDCWD, (const char *)a0);
		break;
	case NR_chmod: case NR_chown: case NR_lchown: case NR_utime: case NR_utimes:
	case NR_setxattr: case NR_lsetxattr: case NR_removexattr: case NR_lremovexattr:
		pend1(st, s, cgid, OP_NOTE, FS_META, AT_FDCWD, (const char *)a0);
		break;
	case NR_fchmodat: case NR_fchmodat2: case NR_fchownat: case NR_futimesat:
	case NR_setxattrat: case NR_removexattrat:
		pend1(st, s, cgid, OP_NOTE, FS_META, a0, (const char *)a1);
		break;
	case NR_utimensat:
		if (a1)
			pend1(st, s, cgid, OP_NOTE, FS_META, a0, (const char *)a1);
		else
			note_fd(st, s, cgid, a0, FS_META);
		break;
	/* names */
	case NR_mkdir:
		pend1(st, s, cgid, OP_NOTE, FS_CREATED | FS_WRITTEN, AT_FDCWD, (const char *)a0);
		break;
	case NR_mkdirat: case NR_mknodat:
		pend1(st, s, cgid, OP_NOTE, FS_CREATED | FS_WRITTEN, a0, (const char *)a1);
		break;
	case NR_mknod:
		pend1(st, s, cgid, OP_NOTE, FS_CREATED | FS_WRITTEN, AT_FDCWD, (const char *)a0);
		break;
	case NR_symlink:
		pend1(st, s, cgid, OP_NOTE, FS_CREATED | FS_WRITTEN, AT_FDCWD, (const char *)a1);
		break;
	case NR_symlinkat:
		pend1(st, s, cgid, OP_NOTE, FS_CREATED | FS_WRITTEN, a1, (const char *)a2);
		break;
	/* A new link to an existing inode: what is later written through it lands
	 * in the other names too, so the new name is never cancelled. */
	case NR_link:
		pend1(st, s, cgid, OP_NOTE, FS_CREATED | FS_WRITTEN | FS_KEEP, AT_FDCWD,
		      (const char *)a1);
		break;
	case NR_linkat:
		pend1(st, s, cgid, OP_NOTE, FS_CREATED | FS_WRITTEN | FS_KEEP, a2, (const char *)a3);
		break;
	case NR_unlink: case NR_rmdir:
		pend1(st, s, cgid, OP_REMOVE, 0, AT_FDCWD, (const char *)a0);
		break;
	case NR_unlinkat:
		pend1(st, s, cgid, OP_REMOVE, 0, a0, (const char *)a1);
		break;
	case NR_rename:
		pend(st, s, cgid, OP_RENAME, 0, AT_FDCWD, (const char *)a0, AT_FDCWD,
		     (const char *)a1);
		break;
	case NR_renameat:
		pend(st, s, cgid, OP_RENAME, 0, a0, (const char *)a1, a2, (const char *)a3);
		break;
	case NR_renameat2:
		pend(st, s, cgid, (a4 & RENAME_EXCHANGE) ? OP_EXCHANGE : OP_RENAME,
		     (a4 & RENAME_NOREPLACE) ? FS_CREATED : 0, a0, (const char *)a1, a2,
		     (const char *)a3);
		break;
	/* effects the inspector cannot follow */
	case NR_io_setup: case NR_io_uring_setup:
		__sync_fetch_and_or(&st->opaque, OPAQUE_ASYNC_IO);
		break;
	case NR_mount: case NR_umount2: case NR_pivot_root: case NR_move_mount:
	case NR_fsmount: case NR_open_tree:
		__sync_fetch_and_or(&st->opaque, OPAQUE_MOUNT);
		break;
	default:
		return 0;
	}
	__sync_fetch_and_add(&st->events, 1);
	return 0;
}

static __always_inline void opened(struct cg_state *st, struct scratch *s, __u64 cgid, long fd)
{
	__u64 f = file_of(fd);
	if (!f)
		return;
	__u32 mode = KREAD(struct file, f, f_mode);
	__u64 ino = KREAD(struct file, f, f_inode);
	__u32 zero = 0;
	struct config *cfg = bpf_map_lookup_elem(&configs, &zero);
	if (!cfg)
		return;
	if (cfg->created_mask && (mode & cfg->created_mask)) {
		/* A fresh dentry, or a negative one made positive: never a cache hit
		 * with the same inode, so the creation is always recorded. */
		note_file(st, s, cgid, f, FS_CREATED | FS_WRITTEN);
	} else if ((mode & FMODE_WRITE) && S_ISREG(KREAD(struct inode, ino, i_mode))) {
		note_file(st, s, cgid, f, FS_WRITTEN);
	}
}

/* The loader opens files of known fate; their f_mode tells which bit is
 * FMODE_CREATED on this kernel. */
static __always_inline void calibrate(long fd)
{
	__u32 zero = 0;
	struct config *cfg = bpf_map_lookup_elem(&configs, &zero);
	if (!cfg || !cfg->calib_tid || cfg->calib_tid != (__u32)bpf_get_current_pid_tgid())
		return;
	__u64 f = file_of(fd);
	if (!f)
		return;
	__u64 i = __sync_fetch_and_add(&cfg->calib_count, 1);
	if (i < 4)
		cfg->calib_mode[i & 3] = KREAD(struct file, f, f_mode);
}

SEC("tp_btf/sys_exit")
int BPF_PROG(sys_exit, struct pt_regs *regs, long ret)
{
	long id = regs->orig_ax;
	bool is_open = id == NR_open || id == NR_openat || id == NR_openat2 || id == NR_creat;
	if (!is_open && !exit_pending(id))
		return 0;
	if (is_open && ret >= 0)
		calibrate(ret);
	__u64 cgid = bpf_get_current_cgroup_id();
	struct cg_state *st = watched(cgid);
	if (!st)
		return 0;
	struct scratch *s = get_scratch();
	if (!s)
		return 0;
	if (is_open) {
		if (ret >= 0)
			opened(st, s, cgid, ret);
		return 0;
	}
	struct pending *p = bpf_task_storage_get(&pendings, bpf_get_current_task_btf(), 0, 0);
	if (!p || !p->op)
		return 0;
	if (ret != 0) {
		p->op = 0;
		return 0;
	}
	switch (p->op) {
	case OP_NOTE:
		note(st, s, &p->a, p->flags, 0);
		break;
	case OP_REMOVE:
		removed(st, s, &p->a);
		break;
	case OP_RENAME:
		/* The target may have existed: only NOREPLACE proves it did not. */
		note(st, s, &p->b, FS_WRITTEN | (p->flags & (FS_CREATED | FS_KEEP)), 0);
		removed(st, s, &p->a);
		break;
	case OP_EXCHANGE:
		note(st, s, &p->a, FS_WRITTEN, 0);
		note(st, s, &p->b, FS_WRITTEN, 0);
		break;
	}
	p->op = 0;
	return 0;
}

/* ---- processes ---- */

static __always_inline void proc_born(__u64 cgid, struct task_struct *t)
{
	struct cg_state *st = watched(cgid);
	if (!st)
		return;
	struct proc_key k = {.cgid = cgid};
	k.pid = t->pid;
	struct proc_val v = {.flags = PROC_BORN, .ns = bpf_ktime_get_ns()};
	v.tgid = t->tgid;
	BPF_CORE_READ_STR_INTO(&v.comm, t, comm);
	if (st->births + st->deaths >= PROC_BUDGET) {
		__sync_fetch_and_add(&st->overflow, 1);
		return;
	}
	long err = bpf_map_update_elem(&proc_entries, &k, &v, BPF_NOEXIST);
	if (err == 0)
		__sync_fetch_and_add(&st->births, 1);
	else if (err != -17)
		__sync_fetch_and_add(&st->overflow, 1);
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(process_fork, struct task_struct *parent, struct task_struct *child)
{
	proc_born(bpf_get_current_cgroup_id(), child);
	return 0;
}

/* A task moved into a watched cgroup (an exec'd process's helper, say) is a
 * birth too: its later exit then cancels out instead of counting as a death. */
SEC("tp_btf/cgroup_attach_task")
int BPF_PROG(cgroup_attach, struct cgroup *dst, const char *path, struct task_struct *task)
{
	proc_born(dst->kn->id, task);
	return 0;
}

/* A born task's name is its parent's until it execs: keep the report readable. */
SEC("tp_btf/sched_process_exec")
int BPF_PROG(process_exec, struct task_struct *p)
{
	__u64 cgid = bpf_get_current_cgroup_id();
	if (!watched(cgid))
		return 0;
	struct proc_key k = {.cgid = cgid};
	k.pid = p->pid;
	struct proc_val *v = bpf_map_lookup_elem(&proc_entries, &k);
	if (v)
		BPF_CORE_READ_STR_INTO(&v->comm, p, comm);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(process_exit, struct task_struct *p)
{
	__u64 cgid = bpf_get_current_cgroup_id();
	struct cg_state *st = watched(cgid);
	if (!st)
		return 0;
	struct proc_key k = {.cgid = cgid};
	k.pid = p->pid;
	struct proc_val *v = bpf_map_lookup_elem(&proc_entries, &k);
	if (v && (v->flags & PROC_BORN)) {
		if (bpf_map_delete_elem(&proc_entries, &k) == 0) {
			__sync_fetch_and_add(&st->births, -1);
			__sync_fetch_and_add(&st->transient, 1);
		}
		return 0;
	}
	struct proc_val nv = {.flags = PROC_DIED, .ns = bpf_ktime_get_ns()};
	nv.tgid = p->tgid;
	BPF_CORE_READ_STR_INTO(&nv.comm, p, comm);
	if (st->births + st->deaths >= PROC_BUDGET) {
		if (!v)
			__sync_fetch_and_add(&st->overflow, 1);
		return 0;
	}
	if (bpf_map_update_elem(&proc_entries, &k, &nv, BPF_NOEXIST) == 0)
		__sync_fetch_and_add(&st->deaths, 1);
	else if (!v)
		__sync_fetch_and_add(&st->overflow, 1);
	return 0;
}
