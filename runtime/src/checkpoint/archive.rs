//! Migration archives: one file holding a checkpoint for another host.
//!
//! An archive is a tar of a checkpoint directory in the layout containerd's restore
//! uses ([`crate::checkpoint`]: CRIU images, the file-system delta against the image,
//! the manifest) plus [`RECORD`], what the receiving containerd needs to create the
//! container (image, runtime, spec). The image itself is not in it: the receiving host
//! pulls or imports it, as for any container.
//!
//! Its last member is a signature ([`archive_sign`]) by the host's archive key: an
//! import refuses an archive that is unsigned, altered, or signed with another key.

use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::archive_sign::{self, ArchiveKey, Trust, Verifier, SIGNATURE};
use super::engine::Dumped;
use super::history::{self, create_private_dir, Entry};
use super::{
    dir_bytes, fs_diff, sync_path, FsPart, Kind, Manifest, Timings, CRIU_DIR, FS_DIFF, MANIFEST,
};
use crate::config::Config;
use crate::storage::{self, fault, tree, work, ContainerKey, ImageSource};
use crate::{Error, Result};

/// The container record's file name inside an archive.
pub const RECORD: &str = "container.json";

/// What containerd knows about the container, to create it again elsewhere.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerRecord {
    /// The image reference.
    pub image: String,
    /// The runtime (`io.containerd.crab.v2`).
    pub runtime: String,
    /// The spec's protobuf type URL.
    pub spec_type: String,
    /// The OCI spec (JSON).
    pub spec: serde_json::Value,
    /// The snapshotter.
    pub snapshotter: String,
}

/// What an export wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportReport {
    /// The archive's size.
    pub bytes: u64,
    /// Entries in the file-system delta.
    pub changed: usize,
    /// Milliseconds it took.
    pub ms: u64,
}

/// Writes checkpoint `entry` of container `key` (its process image, and its files as
/// a delta against `image`; with `replay`, its agent's journaled exchanges) with
/// `record` into the archive `out`, signed with `signer`.
#[allow(clippy::too_many_arguments)]
pub fn export(
    config: &Config,
    key: &ContainerKey,
    entry: &Entry,
    replay: Option<super::journal::Plan>,
    image: &ImageSource,
    record: &ContainerRecord,
    out: &Path,
    signer: &ArchiveKey,
) -> Result<ExportReport> {
    let started = Instant::now();
    let (images, dumped) =
        super::ops::process_image(config, key, entry)?.ok_or_else(|| Error::BadCheckpoint {
            path: history::dir(config, key),
            message: format!("checkpoint {} holds no processes", entry.name),
        })?;
    let snapshot = entry
        .fs_snapshot
        .clone()
        .ok_or_else(|| Error::BadCheckpoint {
            path: history::dir(config, key),
            message: format!("checkpoint {} holds no files", entry.name),
        })?;
    // What dead exports left: their staging directories and partial archives.
    super::archive_work::discard_dead(config);
    super::archive_work::discard_dead_partials(out);
    let staging = super::archive_work::export_staging(config);
    let partial = super::archive_work::partial(out);
    create_private_dir(&staging)?;
    let result = (|| -> Result<ExportReport> {
        std::fs::create_dir_all(staging.join(CRIU_DIR))
            .map_err(Error::io(format!("create {}", staging.display())))?;
        tree::copy(&images, &staging.join(CRIU_DIR))?;
        let fs = write_delta(config, key, &snapshot, image, &staging)?;
        let journal_files = stage_exchanges(config, key, replay, &staging)?;
        let manifest = Manifest {
            version: super::VERSION,
            kind: Kind::Full,
            namespace: key.namespace().to_string(),
            id: dumped_id(&dumped, key),
            created_ms: entry.created_ms,
            stdio: dumped.stdio.clone(),
            fs: Some(fs.clone()),
            process_bytes: dir_bytes(&staging.join(CRIU_DIR)),
            terminal: dumped.stdio.tty.is_some(),
            timings: Timings::default(),
            criu_files: super::engine::image_files(&staging.join(CRIU_DIR)),
            network_by_hooks: dumped.network_by_hooks,
            replay: replay.filter(|_| !journal_files.is_empty()),
            journal_files,
        };
        manifest.write(&staging, false)?;
        let json = serde_json::to_vec_pretty(record).expect("record serializes");
        std::fs::write(staging.join(RECORD), json)
            .map_err(Error::io(format!("write {}", RECORD)))?;
        fault::point("export.staged");
        // Created private: it holds process memory, secrets included.
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&partial)
            .map_err(Error::io(format!("create {}", partial.display())))?;
        run_tar(
            &[
                "-C",
                &staging.display().to_string(),
                "-cf",
                &partial.display().to_string(),
                ".",
            ],
            "write the archive",
        )?;
        archive_sign::sign(&partial, signer)?;
        sync_path(&partial)?;
        fault::point("export.written");
        std::fs::rename(&partial, out).map_err(Error::io(format!(
            "rename {} to {}",
            partial.display(),
            out.display()
        )))?;
        if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_path(parent)?;
        }
        Ok(ExportReport {
            bytes: std::fs::metadata(out).map(|m| m.len()).unwrap_or(0),
            changed: fs.changed,
            ms: started.elapsed().as_millis() as u64,
        })
    })();
    let _ = std::fs::remove_dir_all(&staging);
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result
}

/// Copies the exchanges `replay` answers into the staging directory's
/// journal; returns their sizes by name.
fn stage_exchanges(
    config: &Config,
    key: &ContainerKey,
    replay: Option<super::journal::Plan>,
    staging: &Path,
) -> Result<std::collections::BTreeMap<String, u64>> {
    use super::journal;
    let mut sizes = std::collections::BTreeMap::new();
    let Some(plan) = replay else {
        return Ok(sizes);
    };
    let exchanges = journal::exchanges(config, key, plan);
    if exchanges.is_empty() {
        return Ok(sizes);
    }
    let dir = staging.join(journal::ARCHIVE_DIR);
    std::fs::create_dir_all(&dir).map_err(Error::io(format!("create {}", dir.display())))?;
    for (name, path) in exchanges {
        let bytes = std::fs::copy(&path, dir.join(&name))
            .map_err(Error::io(format!("copy {}", path.display())))?;
        sizes.insert(name, bytes);
    }
    Ok(sizes)
}

fn dumped_id(d: &Dumped, key: &ContainerKey) -> String {
    if d.id.is_empty() {
        key.id().to_string()
    } else {
        d.id.clone()
    }
}

/// The file-system delta of `snapshot` against the image, read from a temporary clone
/// of the snapshot (every store can clone; not every store shows a snapshot as a tree).
fn write_delta(
    config: &Config,
    key: &ContainerKey,
    snapshot: &str,
    image: &ImageSource,
    staging: &Path,
) -> Result<FsPart> {
    let store = storage::open(config, config.storage.backend)?.ok_or_else(|| Error::Storage {
        operation: "export",
        message: "the passthrough backend keeps no snapshots".into(),
    })?;
    let view = ContainerKey::new(key.namespace(), &work::tmp_name("export").replace('.', "-"))?;
    let tree = store.clone_snapshot(key, snapshot, &view)?;
    let mnt = staging.join(".image");
    let result = (|| {
        std::fs::create_dir_all(&mnt).map_err(Error::io(format!("create {}", mnt.display())))?;
        let _mounted = image.mount_readonly(&mnt)?;
        let diff = fs_diff::diff(Some(&mnt), &tree)?;
        let bytes = fs_diff::write_tar(&tree, &diff, &staging.join(FS_DIFF))?;
        Ok(FsPart {
            changed: diff.changed.len(),
            deleted: diff.deleted,
            bytes,
        })
    })();
    let _ = std::fs::remove_dir(&mnt);
    let _ = store.release(&view);
    if let Err(e) = store.destroy(&view) {
        tracing::warn!(%view, error = %e, "remove the export's temporary clone");
    }
    result
}

/// Bytes the manifest, the container record and any other small member may take.
const SMALL_MAX: u64 = 16 << 20;

/// Unpacks the archive `file` into `dir` (made, mode 0700) and checks it; returns the
/// container record.
///
/// The signature is checked over the bytes extracted (see [`archive_sign`]); the
/// manifest, the record and the CRIU images are read only once it matches.
/// [`Trust::AllowUnsigned`] skips that check, and nothing else.
///
/// The archive comes from another host: only regular files and directories below
/// `dir` are accepted (no links, devices, fifos, absolute or `..` names), none keeps a
/// set-id bit, and every size is bounded by the manifest (each CRIU image the size the
/// dump wrote, the delta its size, the whole what the manifest counts). A member that
/// breaks a rule fails the import, naming it.
pub fn unpack(file: &Path, dir: &Path, trust: &Trust) -> Result<ContainerRecord> {
    if dir.exists() {
        return Err(Error::AlreadyExists(format!(
            "{} (an earlier import)",
            dir.display()
        )));
    }
    create_private_dir(dir)?;
    let result = (|| {
        let bounds = read_manifest(file)?;
        extract_checked(file, dir, &bounds, trust)?;
        let manifest = Manifest::read(dir)?;
        if manifest != bounds {
            return Err(bad_archive(
                file,
                "the archive changed while it was read".into(),
            ));
        }
        super::engine::verify_images(&dir.join(CRIU_DIR), &manifest.criu_files)?;
        let text = std::fs::read(dir.join(RECORD)).map_err(|e| Error::BadCheckpoint {
            path: file.to_path_buf(),
            message: format!("no {RECORD}: {e}"),
        })?;
        serde_json::from_slice(&text).map_err(|e| Error::BadCheckpoint {
            path: file.to_path_buf(),
            message: format!("{RECORD}: {e}"),
        })
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(dir);
    }
    result
}

fn bad_archive(file: &Path, message: String) -> Error {
    Error::BadCheckpoint {
        path: file.to_path_buf(),
        message,
    }
}

fn open_archive(file: &Path) -> Result<tar::Archive<std::io::BufReader<std::fs::File>>> {
    let f = std::fs::File::open(file).map_err(Error::io(format!("open {}", file.display())))?;
    Ok(tar::Archive::new(std::io::BufReader::new(f)))
}

/// The manifest, read from the archive before anything is written: it bounds the rest.
fn read_manifest(file: &Path) -> Result<Manifest> {
    let bad = |m: String| bad_archive(file, m);
    let mut archive = open_archive(file)?;
    for entry in archive
        .entries()
        .map_err(|e| bad(format!("the archive is unreadable: {e}")))?
    {
        let mut entry = entry.map_err(|e| bad(format!("the archive is unreadable: {e}")))?;
        let name = entry.path_bytes().into_owned();
        if super::beneath::components(&name).as_deref() != Some(&[MANIFEST.as_bytes()]) {
            continue;
        }
        if !entry.header().entry_type().is_file() || entry.size() > SMALL_MAX {
            return Err(bad(format!(
                "member {MANIFEST} is not a regular file of at most {SMALL_MAX} bytes"
            )));
        }
        let mut text = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut text)
            .map_err(|e| bad(format!("{MANIFEST}: {e}")))?;
        return serde_json::from_slice(&text).map_err(|e| bad(format!("{MANIFEST}: {e}")));
    }
    Err(bad(format!("no {MANIFEST}: not a Crab archive")))
}

/// Writes the archive's members below `dir`, checking each (see [`unpack`]), and
/// the signature over them.
fn extract_checked(file: &Path, dir: &Path, manifest: &Manifest, trust: &Trust) -> Result<()> {
    use super::beneath;
    let root = beneath::open_root(dir).map_err(Error::io(format!("open {}", dir.display())))?;
    let root = beneath::fd(&root);
    let fs_bytes = manifest.fs.as_ref().map(|f| f.bytes);
    let total_max = manifest
        .process_bytes
        .saturating_add(fs_bytes.unwrap_or(0))
        .saturating_add(
            manifest
                .journal_files
                .values()
                .fold(0u64, |a, b| a.saturating_add(*b)),
        )
        .saturating_add(4 * SMALL_MAX);
    let mut total = 0u64;
    let f = std::fs::File::open(file).map_err(Error::io(format!("open {}", file.display())))?;
    let (verifier, reader) = Verifier::new(trust, std::io::BufReader::new(f));
    let mut signature: Option<Vec<u8>> = None;
    let mut archive = tar::Archive::new(reader);
    let entries = archive
        .entries()
        .map_err(|e| bad_archive(file, format!("the archive is unreadable: {e}")))?;
    for entry in entries {
        let mut entry =
            entry.map_err(|e| bad_archive(file, format!("the archive is unreadable: {e}")))?;
        let name = entry.path_bytes().into_owned();
        let shown = format!("\"{}\"", name.escape_ascii());
        let refuse = |why: &str| bad_archive(file, format!("member {shown}: {why}"));
        if signature.is_some() {
            return Err(refuse(&format!("comes after {SIGNATURE}, the last member")));
        }
        let kind = entry.header().entry_type();
        if matches!(kind, tar::EntryType::XGlobalHeader) {
            continue;
        }
        let comps = beneath::components(&name)
            .ok_or_else(|| refuse("absolute, or climbs out with '..'"))?;
        let size = entry.size();
        if comps.as_slice() == [SIGNATURE.as_bytes()] {
            signature = Some(read_signature(&mut entry, &verifier).map_err(|m| refuse(&m))?);
            continue;
        }
        let mode = entry
            .header()
            .mode()
            .map_err(|e| refuse(&format!("bad mode: {e}")))?;
        // The owner's bits only: no set-id or sticky bit, nothing for others.
        let mode = mode & 0o700;
        let Some((last, parents)) = comps.split_last() else {
            if kind.is_dir() {
                continue;
            }
            return Err(refuse("names the top directory but is not a directory"));
        };
        let io = |e: std::io::Error| match e.raw_os_error() {
            Some(libc::ELOOP | libc::EXDEV | libc::ENOTDIR | libc::EEXIST) => refuse(&format!(
                "{e} (a symlink, a non-directory, or a name given twice)"
            )),
            _ => Error::io(format!("unpack member {shown} of {}", file.display()))(e),
        };
        let parent = beneath::dir(root, parents, false).map_err(|e| match e.raw_os_error() {
            Some(libc::ENOENT) => refuse("comes before its directory"),
            _ => io(e),
        })?;
        if kind.is_dir() {
            beneath::mkdir(beneath::fd(&parent), last, 0o700).map_err(io)?;
            continue;
        }
        if !matches!(kind, tar::EntryType::Regular | tar::EntryType::Continuous) {
            return Err(refuse(&format!(
                "a {kind:?} entry: an archive holds only regular files and directories"
            )));
        }
        // The size the manifest gives it, or the small files' bound.
        let bound = match comps.as_slice() {
            [d, img] if *d == CRIU_DIR.as_bytes() => std::str::from_utf8(img)
                .ok()
                .and_then(|n| manifest.criu_files.get(n).copied()),
            [f] if *f == FS_DIFF.as_bytes() => fs_bytes,
            [d, f] if *d == super::journal::ARCHIVE_DIR.as_bytes() => std::str::from_utf8(f)
                .ok()
                .and_then(|n| manifest.journal_files.get(n).copied()),
            _ => None,
        };
        match bound {
            Some(b) if size != b => {
                return Err(refuse(&format!("{size} bytes, the manifest says {b}")))
            }
            None if size > SMALL_MAX => {
                return Err(refuse(&format!(
                    "{size} bytes, more than the {SMALL_MAX} an unlisted member may have"
                )))
            }
            _ => {}
        }
        total = total.saturating_add(size);
        if total > total_max {
            return Err(refuse(&format!(
                "the archive holds more than the {total_max} bytes its manifest accounts for"
            )));
        }
        let f = beneath::open(
            beneath::fd(&parent),
            last,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            0o600,
        )
        .map_err(io)?;
        let mut f = std::fs::File::from(f);
        let copied = std::io::copy(&mut std::io::Read::take(&mut entry, size), &mut f)
            .map_err(Error::io(format!("unpack member {shown}")))?;
        if copied != size {
            return Err(refuse("truncated"));
        }
        f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode | 0o600))
            .map_err(io)?;
    }
    verifier
        .check(trust, signature.as_deref())
        .map_err(|m| bad_archive(file, m))
}

/// The signature member's content; ends the MAC at its header.
fn read_signature<R: std::io::Read>(
    entry: &mut tar::Entry<'_, R>,
    verifier: &Verifier,
) -> std::result::Result<Vec<u8>, String> {
    if !entry.header().entry_type().is_file() || entry.size() > 4096 {
        return Err("not a regular file of at most 4096 bytes".into());
    }
    verifier.at_signature(entry.raw_header_position())?;
    let mut body = Vec::new();
    std::io::Read::read_to_end(entry, &mut body).map_err(|e| e.to_string())?;
    Ok(body)
}

fn run_tar(args: &[&str], what: &str) -> Result<()> {
    let out = std::process::Command::new("tar")
        .args(args)
        .output()
        .map_err(Error::io(format!("{what}: run tar")))?;
    if out.status.success() {
        return Ok(());
    }
    Err(Error::Command {
        command: format!("tar ({what})"),
        message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::super::archive_fixture::*;
    use super::*;
    use tar::EntryType as T;

    #[test]
    fn a_well_formed_archive_unpacks() {
        let t = tempfile::tempdir().unwrap();
        let file = archive(t.path(), &manifest(), |_| {});
        let dir = t.path().join("in");
        unpack(&file, &dir, &trusted()).unwrap();
        assert_eq!(
            std::fs::read(dir.join("criu/inventory.img")).unwrap(),
            INVENTORY
        );
    }

    #[test]
    fn an_archive_holds_only_regular_files_and_directories() {
        let t = tempfile::tempdir().unwrap();
        let cases: Vec<(&str, T, &[u8])> = vec![
            ("./criu/pages-1.img", T::Symlink, b"/etc/shadow"),
            ("./criu/pages-1.img", T::Link, b"/etc/shadow"),
            ("./criu/pages-2.img", T::Link, b"./container.json"),
            ("./criu/tty.img", T::Char, b""),
            ("./criu/sda.img", T::Block, b""),
            ("./criu/fifo.img", T::Fifo, b""),
        ];
        for (name, kind, link) in cases {
            let file = archive(t.path(), &manifest(), |b| {
                raw(b, name.as_bytes(), kind, link, 0o644, b"")
            });
            refused(t.path(), &file, name);
        }
    }

    #[test]
    fn an_archive_member_out_of_the_directory_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let escape = t.path().join("escaped");
        for name in [
            escape.as_os_str().as_encoded_bytes().to_vec(),
            b"../escaped".to_vec(),
            b"./criu/../../escaped".to_vec(),
        ] {
            let file = archive(t.path(), &manifest(), |b| {
                raw(b, &name, T::Regular, b"", 0o644, b"x")
            });
            refused(t.path(), &file, "climbs out");
        }
        assert!(!escape.exists());
    }

    #[test]
    fn an_archive_member_through_a_symlink_member_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let host = t.path().join("host");
        std::fs::create_dir(&host).unwrap();
        let file = archive(t.path(), &manifest(), |b| {
            raw(
                b,
                b"./out",
                T::Symlink,
                host.as_os_str().as_encoded_bytes(),
                0o777,
                b"",
            );
            raw(b, b"./out/pwned", T::Regular, b"", 0o644, b"x");
        });
        refused(t.path(), &file, "./out");
        assert!(!host.join("pwned").exists());
    }

    #[test]
    fn set_id_bits_are_dropped() {
        let t = tempfile::tempdir().unwrap();
        let file = archive(t.path(), &manifest(), |b| {
            raw(b, b"./criu/suid", T::Regular, b"", 0o6755, b"#!/bin/sh\n")
        });
        let dir = t.path().join("in");
        unpack(&file, &dir, &trusted()).unwrap();
        let m = std::fs::metadata(dir.join("criu/suid")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(m.permissions().mode() & 0o7777, 0o700);
    }

    #[test]
    fn sizes_are_bounded_by_the_manifest() {
        let t = tempfile::tempdir().unwrap();
        // An image bigger than the dump wrote.
        let mut m = manifest();
        m.criu_files.insert("inventory.img".into(), 3);
        let file = archive(t.path(), &m, |_| {});
        refused(t.path(), &file, "the manifest says 3");
        // A delta bigger than the manifest says.
        let mut m = manifest();
        m.fs.as_mut().unwrap().bytes = 1;
        let file = archive(t.path(), &m, |_| {});
        refused(t.path(), &file, "the manifest says 1");
        // Members the manifest does not list: each small, all within the total.
        let big = vec![0u8; (SMALL_MAX + 1) as usize];
        let file = archive(t.path(), &manifest(), |b| {
            raw(b, b"./criu/extra", T::Regular, b"", 0o644, &big)
        });
        refused(t.path(), &file, "an unlisted member");
        let chunk = vec![0u8; SMALL_MAX as usize];
        let file = archive(t.path(), &manifest(), |b| {
            for i in 0..5 {
                let name = format!("./criu/extra{i}");
                raw(b, name.as_bytes(), T::Regular, b"", 0o644, &chunk);
            }
        });
        refused(t.path(), &file, "accounts for");
    }

    #[test]
    fn a_member_given_twice_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let file = archive(t.path(), &manifest(), |b| {
            raw(
                b,
                b"./criu/inventory.img",
                T::Regular,
                b"",
                0o644,
                INVENTORY,
            )
        });
        refused(t.path(), &file, "given twice");
    }

    #[test]
    fn a_checkpoint_directory_with_symlinks_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let file = archive(t.path(), &manifest(), |_| {});
        let dir = t.path().join("in");
        unpack(&file, &dir, &trusted()).unwrap();
        let secret = t.path().join("shadow");
        std::fs::write(&secret, "host secret").unwrap();
        // An image swapped for a symlink to a host file (as a registry's image may).
        let images = dir.join(CRIU_DIR);
        std::os::unix::fs::symlink(&secret, images.join("pages-1.img")).unwrap();
        let e = super::super::engine::verify_images(&images, &manifest().criu_files).unwrap_err();
        assert!(e.to_string().contains("pages-1.img"), "{e}");
        std::fs::remove_file(images.join("pages-1.img")).unwrap();
        super::super::engine::verify_images(&images, &manifest().criu_files).unwrap();
        // The inventory, the manifest, the delta as symlinks.
        for name in [
            format!("{CRIU_DIR}/inventory.img"),
            MANIFEST.to_string(),
            FS_DIFF.to_string(),
        ] {
            let p = dir.join(&name);
            let keep = std::fs::read(&p).unwrap();
            let moved = t.path().join("moved");
            std::fs::write(&moved, &keep).unwrap();
            std::fs::remove_file(&p).unwrap();
            std::os::unix::fs::symlink(&moved, &p).unwrap();
            let e = Manifest::read(&dir).unwrap_err();
            assert_eq!(
                e.kind(),
                crate::error::ErrorKind::InvalidArgument,
                "{name}: {e}"
            );
            std::fs::remove_file(&p).unwrap();
            std::fs::write(&p, &keep).unwrap();
            Manifest::read(&dir).unwrap();
        }
    }
}
