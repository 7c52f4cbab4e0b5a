//! Sandboxes through containerd's own client, `ctr` (and `crabctl` for Crab's
//! restore): create, run a tool call, crash, remove.

use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::process::Command;

/// How long one `ctr` or `crabctl` command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(300);

/// Which containerd, and which namespace in it.
#[derive(Debug, Clone)]
pub struct Ctr {
    /// containerd's socket.
    pub address: String,
    /// The namespace holding the images.
    pub namespace: String,
}

/// What a command printed, and how it ended.
#[derive(Debug)]
pub struct Output {
    /// Exit code (-1 when killed by a signal).
    pub code: i32,
    /// stdout then stderr.
    pub text: String,
}

async fn output(mut cmd: Command, what: &str) -> Result<Output> {
    cmd.stdin(Stdio::null()).kill_on_drop(true);
    let out = tokio::time::timeout(COMMAND_TIMEOUT, cmd.output())
        .await
        .with_context(|| format!("{what}: no answer in {COMMAND_TIMEOUT:?}"))?
        .with_context(|| format!("run {what}"))?;
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    Ok(Output {
        code: out.status.code().unwrap_or(-1),
        text,
    })
}

impl Ctr {
    fn ctr(&self) -> Command {
        let mut c = Command::new("ctr");
        c.args(["--address", &self.address, "--namespace", &self.namespace]);
        c
    }

    /// `ctr ARGS`, which must succeed; returns what it printed.
    pub async fn ok(&self, args: &[&str]) -> Result<String> {
        let mut c = self.ctr();
        c.args(args);
        let out = output(c, &format!("ctr {}", args.join(" "))).await?;
        if out.code != 0 {
            bail!(
                "ctr {}: exit {}: {}",
                args.join(" "),
                out.code,
                out.text.trim()
            );
        }
        Ok(out.text)
    }

    /// `crabctl ARGS` on this containerd, which must succeed.
    pub async fn crabctl(&self, args: &[&str]) -> Result<String> {
        let mut c = Command::new("crabctl");
        c.args(["--address", &self.address, "--namespace", &self.namespace])
            .args(args);
        let out = output(c, &format!("crabctl {}", args.join(" "))).await?;
        if out.code != 0 {
            bail!(
                "crabctl {}: exit {}: {}",
                args.join(" "),
                out.code,
                out.text.trim()
            );
        }
        Ok(out.text)
    }

    /// Runs `sh -c script` in container `id`; its exit code and output.
    pub async fn exec(&self, id: &str, script: &str) -> Result<Output> {
        static N: AtomicU64 = AtomicU64::new(0);
        let exec_id = format!(
            "e{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let mut c = self.ctr();
        c.args([
            "task",
            "exec",
            "--exec-id",
            &exec_id,
            id,
            "sh",
            "-c",
            script,
        ]);
        output(c, &format!("exec in {id}")).await
    }

    /// The init's pid of container `id`.
    pub async fn pid(&self, id: &str) -> Result<i32> {
        let out = self.ok(&["task", "ls"]).await?;
        out.lines()
            .find_map(|l| {
                let mut f = l.split_whitespace();
                (f.next() == Some(id)).then(|| f.next()?.parse().ok())?
            })
            .with_context(|| format!("no task {id}"))
    }

    /// SIGKILL of the container's processes and of its shim: a crash.
    pub async fn crash(&self, id: &str) -> Result<()> {
        let mut victims: Vec<i32> = self
            .ok(&["task", "ps", id])
            .await?
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().next()?.parse().ok())
            .collect();
        victims.extend(shim_pids(id));
        for pid in victims {
            // SAFETY: kill takes a pid and a signal; no memory is passed.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        // containerd notices the dead shim and marks the task stopped.
        for _ in 0..200 {
            let ls = self.ok(&["task", "ls"]).await?;
            if !ls
                .lines()
                .any(|l| l.split_whitespace().next() == Some(id) && l.contains("RUNNING"))
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("{id} still running after the crash")
    }

    /// Removes container `id` (task, container and snapshot), whatever state it is in.
    pub async fn remove(&self, id: &str) {
        let _ = self.ok(&["task", "kill", "-s", "SIGKILL", id]).await;
        for _ in 0..100 {
            if self.ok(&["task", "rm", "-f", id]).await.is_ok() {
                break;
            }
            if !self
                .ok(&["task", "ls"])
                .await
                .unwrap_or_default()
                .contains(id)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // After a crash containerd cleans the dead task up on its own, a little
        // later: until then the container cannot go, and a new one of the same
        // id would find the old task.
        for _ in 0..100 {
            match self.ok(&["container", "rm", id]).await {
                Ok(_) => break,
                Err(e) if e.to_string().contains("not found") => break,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

/// Pids of the shims (any runtime's) serving container `id`.
pub fn shim_pids(id: &str) -> Vec<i32> {
    shim_pids_of("containerd-shim", id)
}

/// Brings loopback up in the network namespace of process `pid`: runc's restore
/// leaves it down on this kernel (machine-facts), and the tasks' servers need it.
pub fn loopback_up(pid: i32) -> Result<()> {
    let status = std::process::Command::new("nsenter")
        .args([
            "-t",
            &pid.to_string(),
            "-n",
            "ip",
            "link",
            "set",
            "lo",
            "up",
        ])
        .status()
        .context("nsenter")?;
    anyhow::ensure!(
        status.success(),
        "bring loopback up in the namespace of {pid}"
    );
    Ok(())
}

/// Pids of running processes of `binary` (a part of their program's path)
/// started for container (group) `id` (their `-id` argument).
pub fn shim_pids_of(binary: &str, id: &str) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
            let is_shim = args
                .first()
                .is_some_and(|a| String::from_utf8_lossy(a).contains(binary));
            is_shim
                && args
                    .windows(2)
                    .any(|w| w[0] == b"-id" && w[1] == id.as_bytes())
        })
        .collect()
}
