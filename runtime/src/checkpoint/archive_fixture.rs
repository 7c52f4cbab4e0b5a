//! Archives as `crabctl export` writes them, and hostile variants, for the tests
//! of [`super::archive`] and [`super::archive_sign`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tar::EntryType as T;

use super::archive::{unpack, ContainerRecord};
use super::archive_sign::{self, ArchiveKey, Trust};
use super::{FsPart, Kind, Manifest, Timings, MANIFEST};
use crate::storage::work;

pub(crate) const INVENTORY: &[u8] = b"inventory bytes";
pub(crate) const DELTA: &[u8] = b"delta bytes";

pub(crate) fn manifest() -> Manifest {
    Manifest {
        version: super::VERSION,
        kind: Kind::Full,
        namespace: "default".into(),
        id: "c1".into(),
        created_ms: 1,
        stdio: Default::default(),
        fs: Some(FsPart {
            deleted: vec![],
            changed: 1,
            bytes: DELTA.len() as u64,
        }),
        process_bytes: INVENTORY.len() as u64,
        terminal: false,
        timings: Timings::default(),
        criu_files: BTreeMap::from([("inventory.img".to_string(), INVENTORY.len() as u64)]),
        network_by_hooks: false,
        replay: None,
        journal_files: Default::default(),
    }
}

pub(crate) fn record() -> Vec<u8> {
    serde_json::to_vec(&ContainerRecord {
        image: "docker.io/library/busybox:latest".into(),
        runtime: "io.containerd.crab.v2".into(),
        spec_type: "types.containerd.io/opencontainers/runtime-spec/1/Spec".into(),
        spec: serde_json::json!({}),
        snapshotter: "overlayfs".into(),
    })
    .unwrap()
}

/// A member written as given (the builder refuses `..`, absolute names).
pub(crate) fn raw(
    b: &mut tar::Builder<std::fs::File>,
    name: &[u8],
    kind: T,
    link: &[u8],
    mode: u32,
    data: &[u8],
) {
    let mut h = tar::Header::new_gnu();
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    h.as_old_mut().linkname[..link.len()].copy_from_slice(link);
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_size(data.len() as u64);
    h.set_cksum();
    b.append(&h, data).unwrap();
}

/// An archive as `crabctl export` writes it (signed with [`key`]), with `extra`
/// members before its image.
pub(crate) fn archive(
    t: &Path,
    manifest: &Manifest,
    extra: impl FnOnce(&mut tar::Builder<std::fs::File>),
) -> PathBuf {
    let p = unsigned_archive(t, manifest, extra);
    archive_sign::sign(&p, &key()).unwrap();
    p
}

/// [`archive`] without its signature, as an older export wrote it.
pub(crate) fn unsigned_archive(
    t: &Path,
    manifest: &Manifest,
    extra: impl FnOnce(&mut tar::Builder<std::fs::File>),
) -> PathBuf {
    let p = t.join(format!("a-{}.tar", work::tmp_name("t")));
    let mut b = tar::Builder::new(std::fs::File::create(&p).unwrap());
    raw(&mut b, b"./", T::Directory, b"", 0o755, b"");
    raw(&mut b, b"./criu/", T::Directory, b"", 0o755, b"");
    extra(&mut b);
    raw(
        &mut b,
        b"./criu/inventory.img",
        T::Regular,
        b"",
        0o644,
        INVENTORY,
    );
    raw(&mut b, b"./rootfs-diff.tar", T::Regular, b"", 0o644, DELTA);
    raw(
        &mut b,
        b"./container.json",
        T::Regular,
        b"",
        0o644,
        &record(),
    );
    let m = serde_json::to_vec(manifest).unwrap();
    raw(&mut b, MANIFEST.as_bytes(), T::Regular, b"", 0o644, &m);
    b.finish().unwrap();
    p
}

/// The test key ([`archive`] signs with it).
pub(crate) fn key() -> ArchiveKey {
    ArchiveKey::from_bytes(&[7; 32], Path::new("/etc/crab/archive.key"))
}

pub(crate) fn trusted() -> Trust {
    Trust::Key(key())
}

/// Unpacking `file` with the test key fails, saying `says`, and leaves nothing.
pub(crate) fn refused(t: &Path, file: &Path, says: &str) {
    refused_with(t, file, &trusted(), says)
}

pub(crate) fn refused_with(t: &Path, file: &Path, trust: &Trust, says: &str) {
    let dir = t.join(format!("in-{}", work::tmp_name("t")));
    let e = unpack(file, &dir, trust).unwrap_err();
    assert_eq!(e.kind(), crate::error::ErrorKind::InvalidArgument, "{e}");
    assert!(e.to_string().contains(says), "{e}");
    assert!(!dir.exists(), "a refused import leaves nothing");
}
