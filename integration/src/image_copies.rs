//! The btrfs pool's image copies, as the tests look at them, and images of a
//! test's own to make them from.

use std::path::{Path, PathBuf};

/// The test configuration's btrfs pool.
pub const POOL: &str = "/var/lib/crab/pool";

/// The pool's image copies (`<pool>/images/<key>`; records are `<key>.layers`).
pub fn image_copies() -> Vec<String> {
    std::fs::read_dir(Path::new(POOL).join("images"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.') && !n.ends_with(".layers"))
        .collect()
}

/// The copies there now that are not among `before`.
pub fn copies_since(before: &[String]) -> Vec<String> {
    image_copies()
        .into_iter()
        .filter(|c| !before.contains(c))
        .collect()
}

/// Runs `create` (a container of an image in use) twice, and fails if the
/// second made a copy: the image's copy survived the first one's collect.
pub fn assert_kept_copy(mut create: impl FnMut(), image: &str) {
    create();
    let after = image_copies();
    create();
    let new = copies_since(&after);
    assert!(new.is_empty(), "{image} was copied again: {new:?}");
}

/// The one layer the record of copy `key` names.
pub fn recorded_layer(key: &str) -> PathBuf {
    let record = Path::new(POOL).join("images").join(format!("{key}.layers"));
    let text = std::fs::read(&record).unwrap();
    PathBuf::from(
        String::from_utf8_lossy(&text)
            .trim_end_matches('\0')
            .to_string(),
    )
}

/// A one-layer image of its own (the host's busybox and a file `/name` holding
/// `name`), as an archive made by `hack/oci-image.py` that both `ctr images
/// import` and `docker load` take: no other image shares its layer.
pub fn own_image(name: &str, dir: &Path) -> PathBuf {
    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(rootfs.join("bin")).unwrap();
    let busybox = String::from_utf8(
        std::process::Command::new("sh")
            .args(["-c", "command -v busybox"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    std::fs::copy(busybox.trim(), rootfs.join("bin/busybox")).unwrap();
    for applet in ["sh", "cat", "sleep"] {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet)).unwrap();
    }
    std::fs::write(rootfs.join("name"), name).unwrap();
    let tar = dir.join("image.tar");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/oci-image.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .args(["--rootfs", rootfs.to_str().unwrap(), "--name", name])
        .args(["--cmd", "[\"sh\"]", "--output", tar.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    tar
}
