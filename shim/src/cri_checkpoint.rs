//! containerd 2.x's CRI `CheckpointContainer` (kubelet's checkpoint API) on Crab.
//!
//! CRI checkpoints the container through the task API (a `Checkpoint` into a
//! directory of containerd's, no options for a runtime that is not runc's: the images
//! go to that directory's top, [`crab_runtime::checkpoint::images_in`]), then builds the
//! archive from it and from CRIU's `stats-dump` and `dump.log`, which it expects in
//! CRIU's work directory: CRI names that directory only in runc's options. It is
//! `<CRI root>/containers/<id>/ctrd-checkpoint`, the directory the archive is made
//! from (containerd 2.1.9), or `<CRI root>/containers/<id>` itself, from which CRI
//! copies them and fails without `stats-dump` (2.1.0 to 2.1.8, 2.2.0). Crab finds
//! the container's directory from the spec CRI wrote, where the container's
//! `/etc/hostname` (or `/etc/hosts`, `/etc/resolv.conf`) comes from
//! `<CRI root>/sandboxes/<sandbox id>/`, and copies the two files into the first of
//! those that exists.

use std::path::{Path, PathBuf};

use oci_spec::runtime::Spec;

/// The annotation CRI marks its containers' specs with (`container` or `sandbox`).
const CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
/// The annotation naming the pod sandbox of a CRI container.
const SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";
/// The files CRI mounts into every container from the sandbox's directory.
const SANDBOX_FILES: [&str; 3] = ["/etc/hostname", "/etc/hosts", "/etc/resolv.conf"];
/// CRIU's files CRI copies from the container's directory into its archive (the
/// first is required).
pub const WORK_FILES: [&str; 2] = ["stats-dump", "dump.log"];

/// The CRI directory of container `id` whose spec is `spec`: `None` when the spec is
/// not a CRI container's, or the directory cannot be found from it.
pub fn container_dir(spec: &Spec, id: &str) -> Option<PathBuf> {
    let annotations = spec.annotations().as_ref()?;
    if annotations.get(CONTAINER_TYPE).map(String::as_str) != Some("container") {
        return None;
    }
    let sandbox = annotations.get(SANDBOX_ID)?;
    let plain = |s: &str| !s.is_empty() && s != "." && s != ".." && !s.contains('/');
    if !plain(sandbox) || !plain(id) {
        return None;
    }
    spec.mounts()
        .as_ref()?
        .iter()
        .filter(|m| {
            SANDBOX_FILES
                .iter()
                .any(|f| m.destination() == Path::new(f))
        })
        .filter_map(|m| m.source().as_ref())
        .find_map(|source| {
            let sandbox_dir = source.parent()?;
            let sandboxes = sandbox_dir.parent()?;
            (sandbox_dir.file_name()? == sandbox.as_str() && sandboxes.file_name()? == "sandboxes")
                .then(|| sandboxes.parent())
                .flatten()
                .map(|root| root.join("containers").join(id))
        })
}

/// The directory containerd 2.1.9 and later make the archive from, inside the
/// container's CRI directory.
const ARCHIVE_DIR: &str = "ctrd-checkpoint";

/// Copies CRIU's [`WORK_FILES`] from `images` into CRI's work directory of container
/// `id` (from the spec in `bundle`), when it is a CRI container's. A failure is
/// logged: CRI then says which file it missed.
pub fn hand_over(bundle: &Path, id: &str, images: &Path) {
    let spec = match Spec::load(bundle.join("config.json")) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(id, error = %e, "read the spec for CRI's checkpoint files");
            return;
        }
    };
    let Some(dir) = container_dir(&spec, id) else {
        return;
    };
    let is_dir = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir());
    if !is_dir(&dir) {
        tracing::warn!(id, dir = %dir.display(), "no CRI directory of the container");
        return;
    }
    let archive = dir.join(ARCHIVE_DIR);
    let dir = if is_dir(&archive) { archive } else { dir };
    for name in WORK_FILES {
        let from = images.join(name);
        if !from.is_file() {
            continue;
        }
        if let Err(e) = copy_no_follow(&from, &dir.join(name)) {
            tracing::warn!(id, file = name, dir = %dir.display(), error = %e,
                "copy CRIU's file for CRI's checkpoint archive");
        }
    }
}

/// Copies `from` to `to`, never writing through a symlink at `to`.
fn copy_no_follow(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut src = std::fs::File::open(from)?;
    let mut dst = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(to)?;
    std::io::copy(&mut src, &mut dst)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(annotations: &[(&str, &str)], hostname_source: &str) -> Spec {
        let json = serde_json::json!({
            "ociVersion": "1.0.2",
            "root": {"path": "rootfs"},
            "annotations": annotations.iter().map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<std::collections::HashMap<_, _>>(),
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/etc/hostname", "type": "bind", "source": hostname_source,
                 "options": ["rbind", "rw"]},
            ],
        });
        serde_json::from_value(json).unwrap()
    }

    const CRI: [(&str, &str); 2] = [(CONTAINER_TYPE, "container"), (SANDBOX_ID, "pod1")];

    #[test]
    fn a_cri_containers_directory_is_beside_its_sandboxes_directory() {
        let s = spec(
            &CRI,
            "/var/lib/c/io.containerd.grpc.v1.cri/sandboxes/pod1/hostname",
        );
        assert_eq!(
            container_dir(&s, "c1"),
            Some(PathBuf::from(
                "/var/lib/c/io.containerd.grpc.v1.cri/containers/c1"
            ))
        );
    }

    #[test]
    fn a_spec_without_cri_annotations_has_no_cri_directory() {
        let s = spec(
            &[],
            "/var/lib/c/io.containerd.grpc.v1.cri/sandboxes/pod1/hostname",
        );
        assert_eq!(container_dir(&s, "c1"), None);
        let sandbox = [(CONTAINER_TYPE, "sandbox"), (SANDBOX_ID, "pod1")];
        let s = spec(
            &sandbox,
            "/var/lib/c/io.containerd.grpc.v1.cri/sandboxes/pod1/hostname",
        );
        assert_eq!(container_dir(&s, "pod1"), None);
    }

    #[test]
    fn a_hostname_from_elsewhere_or_another_sandbox_gives_no_directory() {
        let s = spec(&CRI, "/etc/hostname");
        assert_eq!(container_dir(&s, "c1"), None);
        let s = spec(
            &CRI,
            "/var/lib/c/io.containerd.grpc.v1.cri/sandboxes/pod2/hostname",
        );
        assert_eq!(container_dir(&s, "c1"), None);
        let s = spec(
            &CRI,
            "/var/lib/c/io.containerd.grpc.v1.cri/other/pod1/hostname",
        );
        assert_eq!(container_dir(&s, "c1"), None);
    }

    #[test]
    fn an_id_that_is_not_a_plain_name_gives_no_directory() {
        let s = spec(
            &CRI,
            "/var/lib/c/io.containerd.grpc.v1.cri/sandboxes/pod1/hostname",
        );
        assert_eq!(container_dir(&s, "../../etc"), None);
        assert_eq!(container_dir(&s, ".."), None);
    }

    #[test]
    fn hand_over_copies_criu_files_and_never_writes_through_a_symlink() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("io.containerd.grpc.v1.cri");
        let sandbox = root.join("sandboxes/pod1");
        std::fs::create_dir_all(&sandbox).unwrap();
        std::fs::write(sandbox.join("hostname"), "pod1\n").unwrap();
        let cdir = root.join("containers/c1");
        std::fs::create_dir_all(&cdir).unwrap();
        let bundle = t.path().join("bundle");
        std::fs::create_dir_all(&bundle).unwrap();
        let s = spec(&CRI, sandbox.join("hostname").to_str().unwrap());
        std::fs::write(bundle.join("config.json"), serde_json::to_vec(&s).unwrap()).unwrap();
        let images = t.path().join("images");
        std::fs::create_dir_all(&images).unwrap();
        std::fs::write(images.join("stats-dump"), "stats").unwrap();
        std::fs::write(images.join("dump.log"), "log").unwrap();
        let outside = t.path().join("outside");
        std::fs::write(&outside, "kept").unwrap();
        std::os::unix::fs::symlink(&outside, cdir.join("dump.log")).unwrap();
        hand_over(&bundle, "c1", &images);
        assert_eq!(
            std::fs::read_to_string(cdir.join("stats-dump")).unwrap(),
            "stats"
        );
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "kept");
        // containerd 2.1.9 archives its own directory, CRIU's work directory for runc.
        std::fs::create_dir(cdir.join(ARCHIVE_DIR)).unwrap();
        hand_over(&bundle, "c1", &images);
        let archived = cdir.join(ARCHIVE_DIR);
        let read = |name: &str| std::fs::read_to_string(archived.join(name)).unwrap();
        assert_eq!(read("stats-dump"), "stats");
        assert_eq!(read("dump.log"), "log");
    }
}
