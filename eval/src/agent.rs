//! The agent: a loop that asks its LLM for the next step, runs the tool call in
//! the sandbox, and sends the result back.
//!
//! It lives outside the sandbox's processes (as `docs/proxy.md` explains: an
//! agent among the checkpointed processes would change memory every turn, so
//! no turn could be skipped, and a restore would rewind its own conversation).
//! It reaches its LLM through Crab's proxy in the sandbox's network namespace
//! (or, for the baselines, directly), and acts through `exec`, as orchestrators
//! do.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

use crate::sandbox::Ctr;
use crate::trajectory::Trajectory;

/// The environment every tool call runs with: fixed names, dates and seeds,
/// so that a replay writes the same bytes every time. The verification and
/// the probe run with it too (without it, python writes bytecode caches that
/// hold times, and git stamps the time).
pub const TOOL_ENV: &str = "export HOME=/root LC_ALL=C.UTF-8 TZ=UTC SOURCE_DATE_EPOCH=0 \
PYTHONHASHSEED=0 PYTHONDONTWRITEBYTECODE=1 GIT_AUTHOR_NAME=agent \
GIT_AUTHOR_EMAIL=agent@example.com GIT_COMMITTER_NAME=agent \
GIT_COMMITTER_EMAIL=agent@example.com GIT_AUTHOR_DATE=2026-01-01T00:00:00Z \
GIT_COMMITTER_DATE=2026-01-01T00:00:00Z";
/// Longest a tool call may run.
const TOOL_TIMEOUT_S: u32 = 60;
/// How much of a tool's output goes back to the LLM.
const OUTPUT_KEPT: usize = 2000;

/// Where the agent's LLM is.
#[derive(Debug, Clone, Copy)]
pub enum Llm {
    /// A TCP address in the agent's own namespace.
    Direct(SocketAddr),
    /// An address inside the network namespace of process `pid` (Crab's proxy).
    InNetns {
        /// A process of the sandbox.
        pid: i32,
        /// The proxy's address there.
        addr: SocketAddr,
    },
}

/// A TCP connection made inside `pid`'s network namespace.
fn connect_in(pid: i32, addr: SocketAddr) -> std::io::Result<std::net::TcpStream> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
    std::thread::spawn(move || {
        // SAFETY: setns takes a namespace fd valid for the call and a type; it
        // moves only this short-lived thread.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        std::net::TcpStream::connect(addr)
    })
    .join()
    .map_err(|_| std::io::Error::other("connect thread panicked"))?
}

/// One agent's conversation.
pub struct Agent {
    run: String,
    workdir: String,
    messages: Vec<Value>,
}

impl Agent {
    /// A new conversation about `t`, as run `run` (the model name the replay
    /// LLM knows the run by).
    pub fn new(run: &str, t: &Trajectory) -> Agent {
        Agent {
            run: run.to_string(),
            workdir: t.workdir.clone(),
            messages: vec![
                json!({"role": "system", "content": "You act in a Linux sandbox with the tools shell and write_file."}),
                json!({"role": "user", "content": t.title}),
            ],
        }
    }

    /// Tool calls done so far: the turn the next request asks for.
    pub fn turn(&self) -> usize {
        self.messages.iter().filter(|m| m["role"] == "tool").count()
    }

    /// Forgets every turn from `turn` on (the sandbox went back to then).
    pub fn rewind(&mut self, turn: usize) {
        let keep = 2 + 2 * turn;
        self.messages.truncate(keep.min(self.messages.len()));
    }

    async fn ask(&self, llm: Llm) -> Result<Value> {
        let stream = match llm {
            Llm::Direct(addr) => tokio::net::TcpStream::connect(addr).await?,
            Llm::InNetns { pid, addr } => {
                let s = tokio::task::spawn_blocking(move || connect_in(pid, addr)).await??;
                s.set_nonblocking(true)?;
                tokio::net::TcpStream::from_std(s)?
            }
        };
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        let body = json!({"model": self.run, "messages": self.messages}).to_string();
        let req = http::Request::post("/v1/chat/completions")
            .header(http::header::HOST, "llm")
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))?;
        let resp = send.send_request(req).await?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        if !status.is_success() {
            bail!("LLM answered {status}: {}", String::from_utf8_lossy(&bytes));
        }
        Ok(serde_json::from_slice(&bytes)?)
    }

    /// One turn: ask, then run the call in container `id`. False once the LLM
    /// says the task is done.
    /// A refused or reset connection (the sandbox coming back) is retried, up
    /// to `tries` times, 100 ms apart.
    pub async fn step(&mut self, llm: Llm, ctr: &Ctr, id: &str, tries: u32) -> Result<bool> {
        let mut answer = self.ask(llm).await;
        for _ in 1..tries {
            if answer.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            answer = self.ask(llm).await;
        }
        let answer = answer.context("ask the LLM")?;
        let message = answer["choices"][0]["message"].clone();
        let Some(call) = message["tool_calls"].get(0).cloned() else {
            return Ok(false);
        };
        let name = call["function"]["name"].as_str().unwrap_or_default();
        let args: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap_or("{}"))
                .context("tool arguments")?;
        let script = tool_script(&self.workdir, name, &args)?;
        let out = ctr.exec(id, &script).await?;
        let mut text = format!("exit {}\n{}", out.code, out.text);
        if text.len() > OUTPUT_KEPT {
            let cut = text.len() - OUTPUT_KEPT;
            let cut = (cut..text.len())
                .find(|i| text.is_char_boundary(*i))
                .unwrap_or(0);
            text = text[cut..].to_string();
        }
        self.messages.push(message);
        self.messages
            .push(json!({"role": "tool", "tool_call_id": call["id"], "content": text}));
        Ok(true)
    }
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// The `sh -c` script that runs a tool call in `workdir`. Arguments travel
/// base64-encoded, so no quoting can break them, and no temporary file is
/// written (a read-only turn must stay read-only).
pub fn tool_script(workdir: &str, name: &str, args: &Value) -> Result<String> {
    let prologue = format!("{TOOL_ENV}; mkdir -p {workdir} && cd {workdir} || exit 125");
    match name {
        "shell" => {
            let cmd = args["command"].as_str().context("shell: no command")?;
            Ok(format!(
                "{prologue}; timeout {TOOL_TIMEOUT_S} sh -c \"$(echo {} | base64 -d)\" 2>&1",
                b64(cmd)
            ))
        }
        "write_file" => {
            let path = args["path"].as_str().context("write_file: no path")?;
            let content = args["content"].as_str().context("write_file: no content")?;
            let mode = args["mode"].as_str().unwrap_or("0644");
            if !mode.chars().all(|c| c.is_digit(8)) {
                bail!("write_file: bad mode {mode:?}");
            }
            Ok(format!(
                "{prologue}; p=\"$(echo {} | base64 -d)\"; mkdir -p \"$(dirname \"$p\")\" && \
                 echo {} | base64 -d > \"$p\" && chmod {mode} \"$p\"",
                b64(path),
                b64(content)
            ))
        }
        other => bail!("unknown tool {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a tool script with the host's sh in a scratch directory.
    fn run(script: &str) -> (bool, String) {
        let out = std::process::Command::new("sh")
            .args(["-c", script])
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    #[test]
    fn tool_calls_survive_any_quoting_and_write_files_with_their_mode() {
        let dir = std::env::temp_dir().join(format!("agent-{}", std::process::id()));
        let wd = dir.to_string_lossy().into_owned();
        let tricky = "printf '%s|' \"a b\" 'c\"d' $HOME; echo \"$(( 6 * 7 ))\"";
        let (ok, out) = run(&tool_script(&wd, "shell", &json!({"command": tricky})).unwrap());
        assert!(ok);
        assert_eq!(out, "a b|c\"d|/root|42\n");
        let content = "line 1\n'quoted' \"both\" $x `y`\n";
        let script = tool_script(
            &wd,
            "write_file",
            &json!({"path": "sub/f.sh", "content": content, "mode": "0755"}),
        )
        .unwrap();
        assert!(run(&script).0);
        let f = dir.join("sub/f.sh");
        assert_eq!(std::fs::read_to_string(&f).unwrap(), content);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
            0o755
        );
        assert!(tool_script(
            &wd,
            "write_file",
            &json!({"path": "x", "content": "", "mode": "9"})
        )
        .is_err());
        assert!(tool_script(&wd, "rm_rf", &json!({})).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rewinding_keeps_the_turns_before_the_checkpoint() {
        let t: Trajectory = serde_json::from_value(json!({"format": 1, "name": "t", "title": "x",
            "category": "build", "image": "i", "workdir": "/w", "turns": [],
            "verify": "true", "state": {"paths": []}}))
        .unwrap();
        let mut a = Agent::new("r", &t);
        for i in 0..5 {
            a.messages
                .push(json!({"role": "assistant", "tool_calls": [{"id": i}]}));
            a.messages.push(json!({"role": "tool", "content": "ok"}));
        }
        assert_eq!(a.turn(), 5);
        a.rewind(2);
        assert_eq!(a.turn(), 2);
        assert_eq!(a.messages.len(), 6);
    }
}
