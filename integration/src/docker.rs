//! Docker Engine for the tests: trixie's dockerd, docker CLI and docker-py run in an
//! isolated root (`hack/docker.sh`), against the private containerd. Environment (set by
//! `eval "$(hack/docker.sh env)"`, as hack/test.sh does):
//! - `DOCKER_HOST`: dockerd's socket (default `unix:///run/crab/docker/docker.sock`)
//! - `CRAB_DOCKER_ROOTFS`: the trixie root holding `docker` and `python3 -m docker`
//!   (default `/var/lib/crab/docker-root`)
//!
//! A missing root or daemon fails the test that needs it, with what to run.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::{address, text};

/// The name under which daemon.json registers the crab runtime.
pub const DOCKER_RUNTIME: &str = "crab";
/// The busybox test image, as `docker load` names it.
pub const DOCKER_BUSYBOX: &str = "crab/busybox:latest";
/// The python test image, as `docker load` names it.
pub const DOCKER_PYTHON: &str = "crab/python:latest";
/// The containerd namespace dockerd keeps its containers in.
pub const MOBY: &str = "moby";

/// dockerd's address.
pub fn docker_host() -> String {
    std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///run/crab/docker/docker.sock".into())
}

/// The trixie root with the docker CLI and docker-py.
pub fn docker_rootfs() -> String {
    std::env::var("CRAB_DOCKER_ROOTFS").unwrap_or_else(|_| "/var/lib/crab/docker-root".into())
}

/// A command run inside the trixie root, bounded by `timeout`, with a clean environment
/// whose `DOCKER_HOST` is `host`.
fn in_root(host: &str, timeout: Duration, args: &[&str]) -> Command {
    let root = docker_rootfs();
    assert!(
        std::path::Path::new(&root).join("usr/bin/docker").exists(),
        "no docker CLI in {root}: run hack/docker.sh install (hack/setup.sh does)"
    );
    let mut cmd = Command::new("timeout");
    cmd.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("LANG", "C.UTF-8")
        .env("HOME", "/root")
        .env("DOCKER_HOST", host)
        .arg("--kill-after=5")
        .arg(timeout.as_secs().to_string())
        .arg("chroot")
        .arg(&root)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn finish(mut cmd: Command, stdin: Option<&[u8]>) -> Output {
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = cmd.spawn().expect("spawn chroot");
    if let Some(data) = stdin {
        let mut w = child.stdin.take().expect("stdin");
        w.write_all(data).expect("write stdin");
    }
    child.wait_with_output().expect("wait chroot")
}

/// `docker ARGS` (the CLI of the trixie root) with `stdin`, bounded by `timeout`.
pub fn docker_run(args: &[&str], stdin: Option<&[u8]>, timeout: Duration) -> Output {
    docker_run_at(&docker_host(), args, stdin, timeout)
}

/// `docker ARGS` against the dockerd at `host` (another than the suite's).
pub fn docker_run_at(host: &str, args: &[&str], stdin: Option<&[u8]>, timeout: Duration) -> Output {
    let mut all = vec!["docker"];
    all.extend_from_slice(args);
    finish(in_root(host, timeout, &all), stdin)
}

/// `docker ARGS`, which must succeed; returns stdout.
pub fn docker_ok(args: &[&str]) -> String {
    let out = docker_run(args, None, Duration::from_secs(120));
    let (o, e) = text(&out);
    assert!(
        out.status.success(),
        "docker {args:?} failed ({:?}): {o}{e}\n(is dockerd up? hack/docker.sh start)",
        out.status.code()
    );
    o
}

/// `docker inspect -f FORMAT NAME`, trimmed.
pub fn docker_inspect(name: &str, format: &str) -> String {
    docker_ok(&["inspect", "-f", format, name])
        .trim()
        .to_string()
}

/// A python script run by the root's python3 with docker-py importable, bounded by
/// `timeout`; `docker.from_env()` reaches dockerd through `DOCKER_HOST`.
pub fn docker_py(script: &str, timeout: Duration) -> Output {
    finish(
        in_root(&docker_host(), timeout, &["python3", "-c", script]),
        None,
    )
}

/// `ctr` in dockerd's containerd namespace: what containerd (and so the shim) got.
pub fn ctr_moby(args: &[&str]) -> Output {
    Command::new("timeout")
        .arg("60")
        .arg("ctr")
        .arg("--address")
        .arg(address())
        .arg("--namespace")
        .arg(MOBY)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("ctr")
}

/// `crabctl -n moby ARGS` (Crab's operations on a Docker container).
pub fn crabctl_moby_out(args: &[&str]) -> std::process::Output {
    crabctl_in(MOBY, args)
}

/// `crabctl -n NAMESPACE ARGS` against the suite's containerd (a dockerd with
/// `userns-remap` keeps its containers in `moby-<uid>.<gid>`).
pub fn crabctl_in(namespace: &str, args: &[&str]) -> std::process::Output {
    Command::new("crabctl")
        .arg("-a")
        .arg(address())
        .args(["-n", namespace])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("crabctl")
}

/// [`crabctl_moby_out`], which must succeed; its stdout.
pub fn crabctl_moby(args: &[&str]) -> String {
    let out = crabctl_moby_out(args);
    let (o, e) = text(&out);
    assert!(out.status.success(), "crabctl {args:?}: {o}{e}");
    o
}

/// A Docker container (by name) removed with `docker rm -f` when dropped.
pub struct DockerGuard {
    /// The container's name.
    pub name: String,
}

impl DockerGuard {
    /// Guards the container named `name` (which need not exist yet).
    pub fn new(name: &str) -> DockerGuard {
        DockerGuard {
            name: name.to_string(),
        }
    }

    /// `docker run -d --runtime crab --name NAME FLAGS IMAGE ARGS`.
    pub fn run(flags: &[&str], image: &str, args: &[&str]) -> DockerGuard {
        let guard = DockerGuard::new(&crate::unique_id("d"));
        let mut all = vec![
            "run",
            "-d",
            "--runtime",
            DOCKER_RUNTIME,
            "--name",
            &guard.name,
        ];
        all.extend_from_slice(flags);
        all.push(image);
        all.extend_from_slice(args);
        docker_ok(&all);
        guard
    }

    /// The full container id (containerd's and the shim's id).
    pub fn id(&self) -> String {
        docker_inspect(&self.name, "{{.Id}}")
    }

    /// `docker exec NAME ARGS`.
    pub fn exec(&self, args: &[&str]) -> Output {
        let mut all = vec!["exec", self.name.as_str()];
        all.extend_from_slice(args);
        docker_run(&all, None, Duration::from_secs(60))
    }

    /// The state's exit code, once the container has stopped (`docker wait`).
    pub fn wait(&self) -> i32 {
        let out = docker_ok(&["wait", &self.name]);
        out.trim()
            .parse()
            .unwrap_or_else(|_| panic!("docker wait {}: {out:?}", self.name))
    }
}

impl Drop for DockerGuard {
    fn drop(&mut self) {
        let _ = docker_run(&["rm", "-f", &self.name], None, Duration::from_secs(60));
    }
}
