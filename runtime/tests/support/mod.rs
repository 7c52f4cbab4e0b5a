//! Shared by the store tests: a content fingerprint of a tree, and scripted changes of
//! the kinds an agent makes (create, modify, delete, rename, chmod, chown, link,
//! symlink, xattr, sparse, empty dirs, type changes).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use sha2::{Digest, Sha256};

/// One entry of a tree, with everything a restore must reproduce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub kind: &'static str,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub mtime: (i64, i64),
    pub content: String,
    pub xattrs: Vec<(String, Vec<u8>)>,
    /// Smallest path of the hard-link group, for files with more than one link.
    pub link_group: Option<String>,
}

/// Path (relative) → entry.
pub type Fingerprint = BTreeMap<String, Entry>;

fn hash_file(p: &Path) -> String {
    let mut f = fs::File::open(p).unwrap();
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    format!("{:x}", h.finalize())
}

static WHOLE_SECONDS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// From now on, fingerprints keep modification times to the second only (for stores
/// on file systems that keep no more, such as zfs-fuse).
pub fn whole_second_mtimes() {
    WHOLE_SECONDS.store(true, Ordering::Relaxed);
}

/// Fingerprints the tree under `root` (the root's own entry is "." ).
pub fn fingerprint(root: &Path) -> Fingerprint {
    let mut out = fingerprint_exact(root);
    if WHOLE_SECONDS.load(Ordering::Relaxed) {
        for e in out.values_mut() {
            e.mtime.1 = 0;
        }
    }
    out
}

fn fingerprint_exact(root: &Path) -> Fingerprint {
    let mut out = Fingerprint::new();
    let mut inodes: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    walk(root, root, &mut out, &mut inodes);
    for paths in inodes.values() {
        if paths.len() > 1 {
            let first = paths.iter().min().unwrap().clone();
            for p in paths {
                out.get_mut(p).unwrap().link_group = Some(first.clone());
            }
        }
    }
    out
}

fn walk(root: &Path, p: &Path, out: &mut Fingerprint, inodes: &mut BTreeMap<u64, Vec<String>>) {
    let md = fs::symlink_metadata(p).unwrap();
    let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
    let rel = if rel.is_empty() { ".".to_string() } else { rel };
    let ft = md.file_type();
    let (kind, content) = if ft.is_dir() {
        ("dir", String::new())
    } else if ft.is_symlink() {
        ("symlink", fs::read_link(p).unwrap().display().to_string())
    } else if ft.is_file() {
        ("file", hash_file(p))
    } else {
        (
            "special",
            format!("{:o}/{}", md.mode() & libc::S_IFMT, md.rdev()),
        )
    };
    let mut xattrs: Vec<(String, Vec<u8>)> = xattr::list(p)
        .map(|l| {
            l.filter_map(|n| {
                let v = xattr::get(p, &n).ok()??;
                Some((n.to_string_lossy().into_owned(), v))
            })
            .collect()
        })
        .unwrap_or_default();
    xattrs.sort();
    if ft.is_file() && md.nlink() > 1 {
        inodes.entry(md.ino()).or_default().push(rel.clone());
    }
    out.insert(
        rel,
        Entry {
            kind,
            mode: md.mode() & 0o7777,
            uid: md.uid(),
            gid: md.gid(),
            size: if ft.is_dir() { 0 } else { md.size() },
            mtime: if ft.is_dir() {
                (0, 0) // a directory's mtime changes with its entries; checked via them
            } else {
                (md.mtime(), md.mtime_nsec())
            },
            content,
            xattrs,
            link_group: None,
        },
    );
    if ft.is_dir() {
        let mut children: Vec<PathBuf> = fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        children.sort();
        for c in children {
            walk(root, &c, out, inodes);
        }
    }
}

/// Asserts two fingerprints are equal, naming the first difference.
pub fn assert_same(what: &str, got: &Fingerprint, want: &Fingerprint) {
    for (k, w) in want {
        match got.get(k) {
            None => panic!("{what}: {k} is missing"),
            Some(g) if g != w => panic!("{what}: {k} differs:\n got  {g:?}\n want {w:?}"),
            _ => {}
        }
    }
    for k in got.keys() {
        assert!(want.contains_key(k), "{what}: unexpected {k}");
    }
}

/// A fresh temp dir on the host (not in a pool).
pub fn temp_dir(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "crab-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    fs::create_dir_all(&d).unwrap();
    d
}

/// A unique name for keys.
pub fn unique(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn write(p: &Path, data: &[u8]) {
    fs::write(p, data).unwrap();
}

/// An image's worth of content.
pub fn populate_image(root: &Path) {
    fs::create_dir_all(root.join("etc")).unwrap();
    fs::create_dir_all(root.join("bin")).unwrap();
    fs::create_dir_all(root.join("empty")).unwrap();
    fs::create_dir_all(root.join("home/crab/.cache")).unwrap();
    write(&root.join("etc/hostname"), b"sandbox\n");
    write(&root.join("etc/config"), b"a = 1\n");
    write(&root.join("bin/tool"), b"#!/bin/sh\necho tool\n");
    fs::set_permissions(root.join("bin/tool"), fs::Permissions::from_mode(0o755)).unwrap();
    write(&root.join("home/crab/notes.txt"), b"first notes\n");
    std::os::unix::fs::lchown(root.join("home/crab"), Some(1000), Some(1000)).unwrap();
    std::os::unix::fs::lchown(root.join("home/crab/notes.txt"), Some(1000), Some(1000)).unwrap();
    std::os::unix::fs::symlink("../etc/hostname", root.join("bin/hostname-link")).unwrap();
    fs::hard_link(root.join("etc/config"), root.join("etc/config.hard")).unwrap();
    xattr::set(root.join("etc/config"), "user.crab.origin", b"image").unwrap();
    nix::unistd::mkfifo(
        &root.join("bin/fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    sparse(&root.join("home/crab/sparse.img"), 16 << 20, b"tail");
}

/// A file of `len` bytes with `data` at its end and a hole before it.
pub fn sparse(p: &Path, len: u64, data: &[u8]) {
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(p)
        .unwrap();
    f.seek(SeekFrom::Start(len - data.len() as u64)).unwrap();
    f.write_all(data).unwrap();
}

/// Bytes actually allocated to a file.
pub fn allocated(p: &Path) -> u64 {
    fs::symlink_metadata(p).unwrap().blocks() * 512
}

/// The first turn's changes.
pub fn turn_one(root: &Path) {
    write(&root.join("etc/hostname"), b"changed\n");
    fs::rename(
        root.join("home/crab/notes.txt"),
        root.join("home/crab/notes.md"),
    )
    .unwrap();
    fs::remove_file(root.join("bin/tool")).unwrap();
    write(&root.join("new-file"), b"created in turn one\n");
    fs::set_permissions(root.join("etc/config"), fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::lchown(root.join("etc/hostname"), Some(1000), Some(1000)).unwrap();
    fs::hard_link(root.join("new-file"), root.join("new-file.link")).unwrap();
    std::os::unix::fs::symlink("/new-file", root.join("abs-link")).unwrap();
    xattr::set(root.join("new-file"), "user.crab.turn", b"1").unwrap();
    fs::remove_dir(root.join("empty")).unwrap();
    fs::create_dir_all(root.join("made/empty")).unwrap();
    sparse(&root.join("home/crab/sparse2.img"), 8 << 20, b"x");
}

/// The second turn's changes: type changes and more edits.
pub fn turn_two(root: &Path) {
    fs::remove_dir_all(root.join("made")).unwrap();
    write(&root.join("made"), b"now a file\n");
    fs::remove_file(root.join("new-file")).unwrap();
    fs::create_dir(root.join("new-file")).unwrap();
    write(&root.join("new-file/inside"), b"inside\n");
    xattr::remove(root.join("etc/config"), "user.crab.origin").unwrap();
    let mut f = OpenOptions::new()
        .append(true)
        .open(root.join("etc/config"))
        .unwrap();
    f.write_all(b"b = 2\n").unwrap();
    fs::set_permissions(root.join("home"), fs::Permissions::from_mode(0o700)).unwrap();
}

/// The third turn's changes (never snapshotted).
pub fn turn_three(root: &Path) {
    fs::remove_dir_all(root.join("home")).unwrap();
    write(&root.join("etc/hostname"), b"third\n");
    for i in 0..50 {
        write(&root.join(format!("junk-{i}")), format!("{i}").as_bytes());
    }
}
pub mod conformance;
pub mod crafted;
pub mod written;

/// A pool of its own, small enough to fill.
pub struct SmallPool {
    /// Where it is mounted.
    pub dir: std::path::PathBuf,
    file: std::path::PathBuf,
}

impl SmallPool {
    /// A btrfs file system of `size` on a loop file, mounted.
    pub fn new(size: &str) -> SmallPool {
        let file = std::env::temp_dir().join(unique("small-pool.img"));
        let dir = temp_dir("small-pool");
        let run = |c: &mut std::process::Command| {
            let out = c.output().unwrap();
            assert!(
                out.status.success(),
                "{c:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(std::process::Command::new("truncate")
            .args(["-s", size])
            .arg(&file));
        run(std::process::Command::new("mkfs.btrfs")
            .args(["-q", "-f"])
            .arg(&file));
        run(std::process::Command::new("mount")
            .args(["-o", "loop"])
            .arg(&file)
            .arg(&dir));
        SmallPool { dir, file }
    }
}

impl Drop for SmallPool {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.dir).status();
        let _ = std::fs::remove_file(&self.file);
        let _ = std::fs::remove_dir(&self.dir);
    }
}
