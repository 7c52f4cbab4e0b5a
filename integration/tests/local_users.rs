//! Issue 17 item 10: an unprivileged user of the host against Crab's stores, its
//! pool and its control sockets. Each attack runs as `nobody` and must fail.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crab_integration::{as_nobody, crabctl_ok, namespace, shim_pids, text, Guard, CRAB, PYTHON};
use crab_runtime::config::Config;

/// The configuration the test containerd's shims use.
fn config() -> Config {
    let path = std::env::var("CRAB_CONFIG").unwrap_or_else(|_| "/etc/crab/config.toml".into());
    Config::load(None, Some(Path::new(&path)), None).unwrap().0
}

/// A container whose tree holds a secret the user could read by its mode (0644) and
/// one it could not (0600), and a setuid-root copy of `id`.
fn planted() -> Guard {
    let g = Guard::run_detached(CRAB, PYTHON, &[], &["sleep", "infinity"]);
    g.exec_ok(&[
        "sh",
        "-c",
        "echo crab-open-secret > /srv/open && chmod 0644 /srv/open && \
         echo crab-private-secret > /srv/private && chmod 0600 /srv/private && \
         cp /usr/bin/id /srv/suid-id && chmod 4755 /srv/suid-id && sync",
    ]);
    g
}

/// The loop file behind the pool's mount.
fn pool_file(pool: &Path) -> PathBuf {
    let out = Command::new("findmnt")
        .args(["-no", "SOURCE", "--target"])
        .arg(pool)
        .output()
        .unwrap();
    let dev = text(&out).0.trim().to_string();
    let name = dev.trim_start_matches("/dev/");
    let backing = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
        .unwrap_or_else(|e| panic!("{dev} is not a loop device: {e}"));
    PathBuf::from(backing.trim())
}

#[test]
fn nobody_cannot_read_a_containers_files_through_the_pool_image_or_its_directories() {
    let c = config();
    let g = planted();
    let pool = PathBuf::from(&c.storage.pool);
    // The pool's image: root-only, so its blocks cannot be read.
    let image = pool_file(&pool);
    let mode = std::fs::metadata(&image).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{}", image.display());
    let out = as_nobody(&[
        "grep",
        "-c",
        "crab-private-secret",
        &image.to_string_lossy(),
    ]);
    assert!(
        !out.status.success(),
        "nobody read the pool image: {:?}",
        text(&out)
    );
    assert!(
        text(&out).1.contains("Permission denied"),
        "{:?}",
        text(&out)
    );
    // The trees, through the pool's directories.
    let tree = pool.join("containers").join(namespace()).join(&g.id);
    assert!(tree.join("srv/open").exists(), "{}", tree.display());
    for file in ["srv/open", "srv/private"] {
        let out = as_nobody(&["cat", &tree.join(file).to_string_lossy()]);
        assert!(
            !out.status.success(),
            "nobody read {file}: {:?}",
            text(&out)
        );
    }
    let out = as_nobody(&["ls", &pool.join("containers").to_string_lossy()]);
    assert!(
        !out.status.success(),
        "nobody listed the trees: {:?}",
        text(&out)
    );
    // A snapshot keeps the files after the container deletes them.
    crabctl_ok(&["checkpoint", &g.id, "--name", "kept"]);
    g.exec_ok(&["rm", "/srv/open", "/srv/private"]);
    let snapshots = pool.join("snapshots").join(namespace()).join(&g.id);
    let kept: Vec<PathBuf> = std::fs::read_dir(&snapshots)
        .unwrap()
        .flatten()
        .map(|e| e.path().join("srv/open"))
        .filter(|p| p.exists())
        .collect();
    assert!(!kept.is_empty(), "no snapshot holds the file");
    for p in kept {
        let out = as_nobody(&["cat", &p.to_string_lossy()]);
        assert!(
            !out.status.success(),
            "nobody read {}: {:?}",
            p.display(),
            text(&out)
        );
    }
    for area in ["containers", "snapshots", "tmp"] {
        let mode = std::fs::metadata(pool.join(area))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o700, "{area}");
    }
    // The checkpoint store (process memory) and the state dir too.
    for dir in [
        c.checkpoint.store.join(namespace()),
        c.namespace_dir(&namespace()),
    ] {
        let out = as_nobody(&["ls", &dir.to_string_lossy()]);
        assert!(!out.status.success(), "nobody listed {}", dir.display());
    }
}

#[test]
fn nobody_gains_nothing_from_a_setuid_binary_a_container_placed_in_its_tree() {
    let c = config();
    let g = planted();
    let pool = PathBuf::from(&c.storage.pool);
    let options = text(
        &Command::new("findmnt")
            .args(["-no", "OPTIONS", "--target"])
            .arg(&pool)
            .output()
            .unwrap(),
    )
    .0;
    assert!(
        options.split(',').any(|o| o.trim() == "nosuid")
            && options.split(',').any(|o| o.trim() == "nodev"),
        "{options}"
    );
    // Through the pool: not even reachable.
    let in_pool = pool
        .join("containers")
        .join(namespace())
        .join(&g.id)
        .join("srv/suid-id");
    let out = as_nobody(&[&in_pool.to_string_lossy(), "-u"]);
    assert!(!out.status.success(), "{:?}", text(&out));
    // Through the bundle's rootfs, where the container's own view is bound (suid
    // there, as runc's rootfs is): the bundle directory is root's alone (0700), so
    // a host user cannot reach it.
    let shim = shim_pids(&g.id)[0];
    let bundle = std::fs::read_link(format!("/proc/{shim}/cwd")).unwrap();
    let in_bundle = bundle.join("rootfs/srv/suid-id");
    assert!(in_bundle.exists(), "{}", in_bundle.display());
    let out = as_nobody(&[&in_bundle.to_string_lossy(), "-u"]);
    let euid = text(&out).0.trim().to_string();
    assert_ne!(euid, "0", "the setuid binary ran as root: {:?}", text(&out));
    // Inside, the container's root is mounted as runc's is (no nosuid: its own
    // setuid programs, `su` or `sudo` in an agent's sandbox, keep working where
    // the spec allows new privileges).
    let root = std::fs::read_to_string(format!("/proc/{}/mountinfo", g.pid())).unwrap();
    let line = root
        .lines()
        .find(|l| l.split(' ').nth(4) == Some("/"))
        .expect("the container's root mount");
    let options = line.split(' ').nth(5).unwrap_or("");
    assert!(!options.split(',').any(|o| o == "nosuid"), "{line}");
}

/// A control-socket request as `nobody`: what comes back.
const CONNECT: &str = r#"
import socket, sys, json
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
try:
    s.sendall((json.dumps({"op": "list", "namespace": sys.argv[2], "id": sys.argv[3]}) + "\n").encode())
except BrokenPipeError:
    pass  # refused before the request was read: the answer is already there
print(s.makefile().readline())
"#;

#[test]
fn nobody_cannot_use_a_containers_control_socket() {
    let c = config();
    let g = Guard::run_detached(CRAB, PYTHON, &[], &["sleep", "infinity"]);
    let socket = crab_runtime::control::socket_path(&c, &namespace(), &g.id);
    let args = |s: &Path| {
        vec![
            "/usr/bin/python3".to_string(),
            "-c".into(),
            CONNECT.into(),
            s.to_string_lossy().into_owned(),
            namespace(),
            g.id.clone(),
        ]
    };
    let run = |s: &Path| {
        let a = args(s);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        as_nobody(&a)
    };
    // The state dir is root-only: the socket cannot even be reached.
    let out = run(&socket);
    assert!(!out.status.success(), "{:?}", text(&out));
    assert!(
        text(&out).1.contains("Permission denied"),
        "{:?}",
        text(&out)
    );
    // Reached anyway (a loosened mode, a copy of the path elsewhere): the shim checks
    // the caller's credentials.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let link = dir.path().join("ctl");
    let bound = Command::new("mount")
        .args(["--bind"])
        .arg(&socket)
        .arg({
            std::fs::write(&link, b"").unwrap();
            &link
        })
        .status()
        .unwrap();
    assert!(bound.success());
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = run(&link);
    let _ = Command::new("umount").arg(&link).status();
    let (stdout, stderr) = text(&out);
    assert!(stdout.contains("permission denied"), "{stdout} {stderr}");
    assert!(stdout.contains("uid 65534"), "{stdout}");
    // Root still gets its answer.
    crabctl_ok(&["ls", &g.id]);
}
