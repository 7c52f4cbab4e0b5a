//! Tests of [`super`]: signed, unsigned, altered and foreign archives.

use super::super::archive::unpack;
use super::super::archive_fixture::*;
use super::super::MANIFEST;
use super::*;

/// The offset in `file` of member `name`'s data.
fn data_at(file: &Path, name: &str) -> u64 {
    let mut a = tar::Archive::new(std::fs::File::open(file).unwrap());
    let e = a
        .entries()
        .unwrap()
        .map(|e| e.unwrap())
        .find(|e| e.path().unwrap().ends_with(name))
        .unwrap();
    e.raw_file_position()
}

/// `file`'s members in order, as (header, data).
fn members(file: &Path) -> Vec<(tar::Header, Vec<u8>)> {
    let mut a = tar::Archive::new(std::fs::File::open(file).unwrap());
    a.entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let mut data = Vec::new();
            e.read_to_end(&mut data).unwrap();
            (e.header().clone(), data)
        })
        .collect()
}

fn rewrite(file: &Path, members: &[(tar::Header, Vec<u8>)]) {
    let mut b = tar::Builder::new(std::fs::File::create(file).unwrap());
    for (h, data) in members {
        let mut h = h.clone();
        h.set_size(data.len() as u64);
        h.set_cksum();
        b.append(&h, data.as_slice()).unwrap();
    }
    b.finish().unwrap();
}

#[test]
fn test_a_signed_archive_unpacks_and_ends_with_its_signature() {
    let t = tempfile::tempdir().unwrap();
    let file = archive(t.path(), &manifest(), |_| {});
    let last = members(&file).pop().unwrap();
    assert!(last.0.path().unwrap().ends_with(SIGNATURE));
    unpack(&file, &t.path().join("in"), &trusted()).unwrap();
    // Nothing of the signature lands in the import directory.
    assert!(!t.path().join("in").join(SIGNATURE).exists());
}

#[test]
fn test_an_unsigned_archive_is_refused_unless_the_operator_allows_it() {
    let t = tempfile::tempdir().unwrap();
    let file = unsigned_archive(t.path(), &manifest(), |_| {});
    refused(t.path(), &file, "the archive is not signed");
    unpack(&file, &t.path().join("in"), &Trust::AllowUnsigned).unwrap();
}

#[test]
fn test_one_flipped_byte_is_refused() {
    let t = tempfile::tempdir().unwrap();
    for (name, at) in [("inventory.img", 3), ("rootfs-diff.tar", 0), (MANIFEST, 20)] {
        let file = archive(t.path(), &manifest(), |_| {});
        let mut bytes = std::fs::read(&file).unwrap();
        let i = (data_at(&file, name) + at) as usize;
        bytes[i] ^= 0x01;
        std::fs::write(&file, &bytes).unwrap();
        // The manifest's bytes no longer parse, or no longer match the MAC.
        let says = if name == MANIFEST {
            ""
        } else {
            "archive signature does not match: altered, or signed with another key"
        };
        refused(t.path(), &file, says);
    }
}

#[test]
fn test_a_changed_manifest_field_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let file = archive(t.path(), &manifest(), |_| {});
    let mut all = members(&file);
    let (_, data) = all
        .iter_mut()
        .find(|(h, _)| h.path().unwrap().ends_with(MANIFEST))
        .unwrap();
    let mut m: serde_json::Value = serde_json::from_slice(data).unwrap();
    m["id"] = "someone-else".into();
    *data = serde_json::to_vec(&m).unwrap();
    rewrite(&file, &all);
    refused(t.path(), &file, "archive signature does not match");
}

#[test]
fn test_an_archive_signed_with_another_key_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let file = archive(t.path(), &manifest(), |_| {});
    let other = Trust::Key(ArchiveKey::from_bytes(&[8; 32], Path::new("/other")));
    refused_with(t.path(), &file, &other, "signed with another key");
}

#[test]
fn test_a_member_after_the_signature_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let file = archive(t.path(), &manifest(), |_| {});
    let mut all = members(&file);
    let (mut h, _) = all[0].clone();
    h.set_path("./criu/late.img").unwrap();
    h.set_entry_type(tar::EntryType::Regular);
    all.push((h, b"late".to_vec()));
    rewrite(&file, &all);
    refused(t.path(), &file, "comes after crab-signature.json");
}

#[test]
fn test_a_generated_key_is_private_and_kept() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let mut config = Config::default();
    config.checkpoint.store = t.path().join("store");
    let first = ArchiveKey::load(&config).unwrap();
    assert!(first.generated);
    let again = ArchiveKey::load(&config).unwrap();
    assert!(!again.generated);
    assert_eq!(first.bytes, again.bytes);
    let mode = std::fs::metadata(&first.path).unwrap().mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn test_hex_round_trip() {
    assert_eq!(
        unhex(&hex(&[0, 1, 0xab, 0xff])).unwrap(),
        vec![0, 1, 0xab, 0xff]
    );
    assert!(unhex("abc").is_none());
    assert!(unhex("zz").is_none());
}

#[test]
fn test_a_key_file_must_be_private_and_long_enough() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("key");
    std::fs::write(&p, [7u8; 32]).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = read_key(&p, false).unwrap_err().to_string();
    assert!(e.contains("mode 0600"), "{e}");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    if nix::unistd::geteuid().is_root() {
        read_key(&p, false).unwrap();
    }
    std::fs::write(&p, [7u8; 8]).unwrap();
    let e = read_key(&p, false).unwrap_err().to_string();
    assert!(
        e.contains("at least 32") || e.contains("owned by root"),
        "{e}"
    );
    let link = t.path().join("link");
    std::os::unix::fs::symlink(&p, &link).unwrap();
    let e = read_key(&link, false).unwrap_err().to_string();
    assert!(e.contains("symlink"), "{e}");
}
