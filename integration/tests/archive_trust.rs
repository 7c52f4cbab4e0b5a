//! Archives from another host (issue 17 item 1): `crabctl import` refuses an archive
//! that is unsigned, altered or signed with another key, and a spec that asks for
//! more than a default `ctr run` container has, unless the operator allows it; a
//! normal export and import still restores memory and files.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use crab_integration::*;

/// An archive file, removed when dropped.
struct Archive(PathBuf);

impl Drop for Archive {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn export(g: &Guard, extra: &[&str]) -> Archive {
    let file = std::env::temp_dir().join(format!("{}.tar", unique_id("trust")));
    let path = file.display().to_string();
    let mut args = vec!["export", &g.id, "-o", &path];
    args.extend_from_slice(extra);
    let out = crabctl(&args, &[]);
    let (o, e) = text(&out);
    assert!(out.status.success(), "export: {o}{e}");
    Archive(file)
}

/// `crabctl import FILE --id ID ARGS`; the container is guarded.
fn import(file: &Path, args: &[&str]) -> (Guard, Output) {
    let id = unique_id("imported");
    let path = file.display().to_string();
    let mut all = vec!["import", &path, "--id", &id];
    all.extend_from_slice(args);
    let out = crabctl(&all, &[]);
    (Guard::new(&id), out)
}

/// Whether containerd holds a container `id`.
fn in_containerd(id: &str) -> bool {
    ctr_ok(&["container", "ls", "-q"])
        .lines()
        .any(|l| l.trim() == id)
}

/// The import failed with the invalid-argument code, saying `says`, and left
/// nothing in containerd.
fn refused(g: &Guard, out: &Output, says: &str) {
    let (o, e) = text(out);
    assert_eq!(out.status.code(), Some(6), "import: {o}{e}");
    assert!(e.contains(says), "wanted {says:?}: {e}");
    assert!(!in_containerd(&g.id), "a refused import created {}", g.id);
}

/// A container counting in memory (a shell variable) and writing the count to a file.
fn counter(flags: &[&str]) -> Guard {
    let g = Guard::run_detached(
        CRAB,
        BUSYBOX,
        flags,
        &[
            "sh",
            "-c",
            "echo kept > /tmp/file; i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; \
             mv /tmp/count.new /tmp/count; sleep 0.2; done",
        ],
    );
    assert!(wait_until(Duration::from_secs(10), || g
        .exec(&["cat", "/tmp/count"])
        .status
        .success()));
    g
}

/// A root-owned 0600 key file of 32 random bytes.
fn other_key() -> PathBuf {
    let path = std::env::temp_dir().join(format!("{}.key", unique_id("key")));
    let mut key = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut key)
        .unwrap();
    std::fs::write(&path, key).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

fn config_with_key(key: &Path) -> PathBuf {
    config_with(&format!(
        "[archive]\nkey_file = {:?}\n",
        key.display().to_string()
    ))
}

#[test]
fn an_archive_with_a_bind_mount_of_the_host_root_is_refused_unless_allowed() {
    // `bind`, not `rbind`: CRIU cannot dump the host's submounts (slaves of shared
    // mounts outside the container).
    let g = counter(&["--mount", "type=bind,src=/,dst=/host,options=bind:ro"]);
    assert!(g.exec(&["cat", "/host/etc/shadow"]).status.success());
    let archive = export(&g, &[]);
    g.remove();

    let (imported, out) = import(&archive.0, &[]);
    refused(
        &imported,
        &out,
        "host-mounts: bind mount of the host's / at /host",
    );
    let e = text(&out).1;
    assert!(e.contains("--allow host-mounts"), "{e}");
    // Another kind granted does not grant this one.
    let (imported, out) = import(&archive.0, &["--allow", "capabilities,devices"]);
    refused(&imported, &out, "bind mount of the host's / at /host");

    let (imported, out) = import(&archive.0, &["--allow", "host-mounts"]);
    let (o, e) = text(&out);
    assert!(out.status.success(), "import --allow host-mounts: {o}{e}");
    assert!(in_containerd(&imported.id));
    assert_eq!(imported.exec_ok(&["cat", "/tmp/file"]).trim(), "kept");
    // What the operator granted: the host's files.
    assert!(imported.exec(&["cat", "/host/etc/shadow"]).status.success());
}

#[test]
fn an_archive_with_one_byte_flipped_is_refused_and_creates_nothing() {
    let g = counter(&[]);
    let archive = export(&g, &[]);
    g.remove();
    // A byte in the middle of the largest member's data (CRIU's memory pages).
    let (at, size) = {
        let mut a = tar::Archive::new(std::fs::File::open(&archive.0).unwrap());
        a.entries()
            .unwrap()
            .map(|e| e.unwrap())
            .map(|e| (e.raw_file_position(), e.size()))
            .max_by_key(|(_, size)| *size)
            .unwrap()
    };
    let mut bytes = std::fs::read(&archive.0).unwrap();
    bytes[(at + size / 2) as usize] ^= 0x01;
    std::fs::write(&archive.0, &bytes).unwrap();

    let (imported, out) = import(&archive.0, &[]);
    refused(
        &imported,
        &out,
        "archive signature does not match: altered, or signed with another key",
    );
}

#[test]
fn an_archive_with_a_manifest_field_changed_is_refused() {
    let g = counter(&[]);
    let archive = export(&g, &[]);
    g.remove();
    // The tar rewritten, member by member, with the manifest's id changed.
    let mut members = Vec::new();
    {
        let mut a = tar::Archive::new(std::fs::File::open(&archive.0).unwrap());
        for e in a.entries().unwrap() {
            let mut e = e.unwrap();
            let mut data = Vec::new();
            e.read_to_end(&mut data).unwrap();
            if e.path().unwrap().ends_with("crab-checkpoint.json") {
                let mut m: serde_json::Value = serde_json::from_slice(&data).unwrap();
                assert!(m["id"].is_string(), "{m}");
                m["id"] = "someone-else".into();
                data = serde_json::to_vec(&m).unwrap();
            }
            members.push((e.header().clone(), data));
        }
    }
    let mut b = tar::Builder::new(std::fs::File::create(&archive.0).unwrap());
    for (mut h, data) in members {
        h.set_size(data.len() as u64);
        h.set_cksum();
        b.append(&h, data.as_slice()).unwrap();
    }
    b.finish().unwrap();

    let (imported, out) = import(&archive.0, &[]);
    refused(&imported, &out, "archive signature does not match");
}

#[test]
fn an_archive_signed_with_another_key_or_unsigned_is_refused() {
    let key = other_key();
    let config = config_with_key(&key);
    let g = counter(&[]);
    let archive = export(&g, &["--config", &config.display().to_string()]);
    g.remove();

    let (imported, out) = import(&archive.0, &[]);
    refused(&imported, &out, "signed with another key");
    // The importer with the exporter's key accepts it.
    let (imported, out) = import(&archive.0, &["--config", &config.display().to_string()]);
    let (o, e) = text(&out);
    assert!(out.status.success(), "import with the same key: {o}{e}");
    assert_eq!(imported.exec_ok(&["cat", "/tmp/file"]).trim(), "kept");
    imported.remove();

    // Without its signature (the tar cut before it): refused, unless allowed.
    let end = {
        let mut a = tar::Archive::new(std::fs::File::open(&archive.0).unwrap());
        a.entries()
            .unwrap()
            .map(|e| e.unwrap())
            .find(|e| e.path().unwrap().ends_with("crab-signature.json"))
            .unwrap()
            .raw_header_position()
    };
    let mut bytes = std::fs::read(&archive.0).unwrap();
    bytes.truncate(end as usize);
    bytes.extend_from_slice(&[0u8; 1024]);
    std::fs::write(&archive.0, &bytes).unwrap();
    let (imported, out) = import(&archive.0, &[]);
    refused(&imported, &out, "the archive is not signed");
    let (imported, out) = import(&archive.0, &["--allow-unsigned"]);
    let (o, e) = text(&out);
    assert!(out.status.success(), "import --allow-unsigned: {o}{e}");
    assert!(in_containerd(&imported.id));
    let _ = std::fs::remove_file(&key);
    let _ = std::fs::remove_file(&config);
}

#[test]
fn a_signed_archive_round_trip_restores_memory_and_files() {
    let g = counter(&[]);
    std::thread::sleep(Duration::from_secs(1));
    let archive = export(&g, &[]);
    let mode = std::fs::metadata(&archive.0).unwrap().permissions().mode();
    assert_eq!(
        mode & 0o077,
        0,
        "the archive is readable by others: {mode:o}"
    );
    let at = g.number("/tmp/count");
    g.remove();

    let (imported, out) = import(&archive.0, &[]);
    let (o, e) = text(&out);
    assert!(out.status.success(), "import: {o}{e}");
    assert_eq!(imported.exec_ok(&["cat", "/tmp/file"]).trim(), "kept");
    // The count goes on from where the exported memory had it, not from 0.
    let first = imported.number("/tmp/count");
    assert!(
        first + 5 >= at && first < at + 30,
        "count {first}, {at} at export"
    );
    assert!(wait_until(Duration::from_secs(5), || imported
        .number("/tmp/count")
        > first));
    // Its cgroup is its own, named after the new id.
    let spec = ctr_ok(&["container", "info", &imported.id]);
    assert!(
        spec.contains(&format!(
            "\"cgroupsPath\": \"/{}/{}\"",
            namespace(),
            imported.id
        )),
        "{spec}"
    );
}
