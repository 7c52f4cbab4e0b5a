/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The few kernel types the inspector reads, declared by hand instead of a
 * generated vmlinux.h: with preserve_access_index every field access is a CO-RE
 * relocation resolved by name against the running kernel's BTF at load time,
 * so only the fields used need to exist here, at any offset.
 */
#ifndef CRAB_KERNEL_H
#define CRAB_KERNEL_H

typedef signed char __s8;
typedef unsigned char __u8;
typedef short __s16;
typedef unsigned short __u16;
typedef int __s32;
typedef unsigned int __u32;
typedef long long __s64;
typedef unsigned long long __u64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;
typedef _Bool bool;
#define true 1
#define false 0

enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_LRU_HASH = 9,
	BPF_MAP_TYPE_TASK_STORAGE = 29,
};

enum {
	BPF_ANY = 0,
	BPF_NOEXIST = 1,
	BPF_EXIST = 2,
};

#define BPF_F_NO_PREALLOC (1U << 0)
#define BPF_LOCAL_STORAGE_GET_F_CREATE (1ULL << 0)

struct pt_regs {
	unsigned long di;
	unsigned long si;
	unsigned long dx;
	unsigned long r10;
	unsigned long r8;
	unsigned long r9;
	unsigned long orig_ax;
} __attribute__((preserve_access_index));

struct super_block {
	unsigned int s_dev;
} __attribute__((preserve_access_index));

struct inode {
	unsigned short i_mode;
	unsigned long i_ino;
	struct super_block *i_sb;
	unsigned int __i_nlink;
} __attribute__((preserve_access_index));

struct qstr {
	unsigned int len;
	const unsigned char *name;
} __attribute__((preserve_access_index));

struct dentry {
	struct dentry *d_parent;
	struct qstr d_name;
	struct inode *d_inode;
	struct super_block *d_sb;
} __attribute__((preserve_access_index));

struct vfsmount {
	struct dentry *mnt_root;
	struct super_block *mnt_sb;
} __attribute__((preserve_access_index));

struct mount {
	struct mount *mnt_parent;
	struct dentry *mnt_mountpoint;
	struct vfsmount mnt;
} __attribute__((preserve_access_index));

struct path {
	struct vfsmount *mnt;
	struct dentry *dentry;
} __attribute__((preserve_access_index));

struct file {
	struct path f_path;
	struct inode *f_inode;
	unsigned int f_mode;
} __attribute__((preserve_access_index));

/* Any kernel struct whose first member is a pointer: lets a pointer slot of an
 * array be read with a plain load (see file_of). */
struct list_head {
	struct list_head *next;
} __attribute__((preserve_access_index));

struct fdtable {
	unsigned int max_fds;
	struct file **fd;
} __attribute__((preserve_access_index));

struct files_struct {
	struct fdtable *fdt;
} __attribute__((preserve_access_index));

struct fs_struct {
	struct path root;
	struct path pwd;
} __attribute__((preserve_access_index));

struct kernfs_node {
	__u64 id;
} __attribute__((preserve_access_index));

struct cgroup {
	struct kernfs_node *kn;
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	int tgid;
	char comm[16];
	struct fs_struct *fs;
	struct files_struct *files;
} __attribute__((preserve_access_index));

#define S_IFMT 00170000
#define S_IFREG 0100000
#define S_IFDIR 0040000
#define S_ISREG(m) (((m) & S_IFMT) == S_IFREG)

#define MAY_WRITE 0x00000002
#define MAY_APPEND 0x00000008
#define FMODE_WRITE (1U << 1)
#define PROT_WRITE 0x2
#define MAP_SHARED 0x01
#define MAP_SHARED_VALIDATE 0x03
#define MAP_TYPE 0x0f

#endif
