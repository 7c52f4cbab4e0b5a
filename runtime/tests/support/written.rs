//! What Crab's snapshotter asks a store for a crab container's writable layer
//! (`storage::usage::Trees`): the tree made for that layer, and what it wrote,
//! without the image it was made from.

use std::io::Write;
use std::path::Path;

use crab_runtime::storage::usage::Trees;
use crab_runtime::storage::{ContainerKey, ImageSource, Store};

use super::{temp_dir, unique};

const MIB: u64 = 1 << 20;

/// Bytes that do not compress or share extents with anything.
fn noise(p: &Path, mib: u64) {
    let mut f = std::fs::File::create(p).unwrap();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut chunk = vec![0u8; MIB as usize];
    for _ in 0..mib {
        for b in chunk.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        f.write_all(&chunk).unwrap();
    }
    f.sync_all().unwrap();
}

fn sync() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
}

/// A tree written 8 MiB over a 4 MiB image reports about 8 MiB for its owner, and
/// about nothing once the file is removed; another layer has no tree.
/// `open` gives the store (twice: one for the test, one for the lookups).
pub fn written_is_found_by_owner(open: impl Fn() -> Box<dyn Store>) {
    let store = open();
    let image_dir = temp_dir("image");
    noise(&image_dir.join("in-image"), 4);
    // A writable layer of containerd's snapshotter: `<snapshots>/<n>/fs`.
    let layers = temp_dir("snapshots");
    let owner = layers.join("41/fs");
    std::fs::create_dir_all(&owner).unwrap();
    let mut image = ImageSource::from_layers(vec![image_dir.clone()]).unwrap();
    image.owner = Some(owner.clone());
    let key = ContainerKey::new("written", &unique("c")).unwrap();
    let live = store.prepare(&key, &image).unwrap();
    let trees = Trees::of(vec![open()]);

    noise(&live.join("out"), 8);
    sync();
    let found = trees
        .written_for(&owner)
        .unwrap()
        .expect("the tree of the layer");
    assert_eq!(found.key, key);
    assert!(
        (8 * MIB..9 * MIB).contains(&found.bytes),
        "8 MiB written over a 4 MiB image: {} bytes",
        found.bytes
    );
    assert_eq!(trees.written_for(&layers.join("42/fs")).unwrap(), None);

    std::fs::remove_file(live.join("out")).unwrap();
    sync();
    // ZFS frees a removed file's blocks in a later transaction group (zfs-fuse: about
    // 30 s).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    let mut after;
    loop {
        after = trees.written_for(&owner).unwrap().unwrap().bytes;
        if after < MIB || std::time::Instant::now() > deadline {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
        sync();
    }
    assert!(after < MIB, "after the removal: {after} bytes");

    store.destroy(&key).unwrap();
    assert_eq!(trees.written_for(&owner).unwrap(), None);
    let _ = std::fs::remove_dir_all(image_dir);
    let _ = std::fs::remove_dir_all(layers);
}
