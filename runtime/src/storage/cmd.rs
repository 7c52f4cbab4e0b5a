//! Running the storage tools (`btrfs`, `zfs`, `zpool`) with errors that say what failed.

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;

use crate::{Error, Result};

/// Runs `program args`; returns stdout. A failure carries the command and its stderr,
/// and is [`Error::PoolFull`] when the tool reports that the pool has no space.
pub fn run(program: &str, args: &[&str]) -> Result<String> {
    let running = spawn(program, args, Stdio::null(), true)?;
    let out = finish(program, args, running)?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Runs `program args` with `input` copied to its stdin.
pub fn run_with_input(program: &str, args: &[&str], input: &mut dyn Read) -> Result<String> {
    let mut running = spawn(program, args, Stdio::piped(), true)?;
    let mut stdin = running.child.stdin.take().expect("piped");
    let copied = std::io::copy(input, &mut stdin);
    drop(stdin);
    let out = finish(program, args, running)?;
    copied.map_err(Error::io(format!("write to {program}")))?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Runs `program args` with its stdout copied to `output`.
pub fn run_with_output(program: &str, args: &[&str], output: &mut dyn Write) -> Result<()> {
    let mut running = spawn(program, args, Stdio::null(), false)?;
    let mut stdout = running.child.stdout.take().expect("piped");
    let copied = std::io::copy(&mut stdout, output);
    drop(stdout);
    finish(program, args, running)?;
    copied.map_err(Error::io(format!("read from {program}")))?;
    Ok(())
}

/// A started tool whose output pipes are being drained.
struct Running {
    child: Child,
    /// Collects stdout, unless the caller reads it itself.
    stdout: Option<JoinHandle<Vec<u8>>>,
    /// Collects stderr.
    stderr: JoinHandle<Vec<u8>>,
}

/// Starts `program args` with `stdin`, its stdout and stderr piped. Each pipe the
/// caller does not read is drained on a thread of its own: a tool that writes more
/// than a pipe holds (64 KiB) to one stream while the caller works on another would
/// otherwise block forever.
fn spawn(program: &str, args: &[&str], stdin: Stdio, collect_stdout: bool) -> Result<Running> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(Error::io(format!("run {program}")))?;
    let stderr = drain(child.stderr.take().expect("piped"));
    let stdout = collect_stdout.then(|| drain(child.stdout.take().expect("piped")));
    Ok(Running {
        child,
        stdout,
        stderr,
    })
}

/// Reads `pipe` to its end on a thread.
fn drain(mut pipe: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut all = Vec::new();
        let _ = pipe.read_to_end(&mut all);
        all
    })
}

/// Waits for the tool and its output; returns its stdout (empty if the caller read
/// it). Its failure is an error that carries its stderr.
fn finish(program: &str, args: &[&str], mut running: Running) -> Result<Vec<u8>> {
    let status = running
        .child
        .wait()
        .map_err(Error::io(format!("wait for {program}")))?;
    let stderr = running.stderr.join().unwrap_or_default();
    let stdout = running
        .stdout
        .map(|t| t.join().unwrap_or_default())
        .unwrap_or_default();
    if !status.success() {
        return Err(failure(program, args, &String::from_utf8_lossy(&stderr)));
    }
    Ok(stdout)
}

fn failure(program: &str, args: &[&str], stderr: &str) -> Error {
    let command = format!("{program} {}", args.join(" "));
    let message = stderr.trim().to_string();
    let lower = message.to_ascii_lowercase();
    if lower.contains("no space left") || lower.contains("out of space") {
        Error::PoolFull { command, message }
    } else {
        Error::Command { command, message }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Runs `f` on a thread; fails (instead of hanging) if it has not ended in time.
    fn bounded<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(20))
            .expect("the tool's run did not end: a pipe was left undrained")
    }

    #[test]
    fn test_a_chatty_stderr_does_not_block_a_copied_stdout() {
        let out = bounded(|| {
            let mut out = Vec::new();
            run_with_output(
                "sh",
                &["-c", "head -c 300000 /dev/zero >&2; echo done"],
                &mut out,
            )
            .map(|()| out)
        })
        .unwrap();
        assert_eq!(out, b"done\n");
    }

    #[test]
    fn test_a_tool_that_writes_before_it_reads_its_input_does_not_block() {
        let out = bounded(|| {
            let mut input = std::io::Cursor::new(vec![7u8; 300_000]);
            run_with_input(
                "sh",
                &[
                    "-c",
                    "head -c 300000 /dev/zero >&2; head -c 100000 /dev/zero; wc -c",
                ],
                &mut input,
            )
        })
        .unwrap();
        assert!(
            out.trim_end().ends_with("300000"),
            "{:?}",
            &out[out.len() - 20..]
        );
        assert_eq!(out.len(), 100_000 + "300000\n".len());
    }

    #[test]
    fn test_a_failure_carries_the_tools_stderr() {
        let err = bounded(|| run("sh", &["-c", "echo boom >&2; exit 3"])).unwrap_err();
        assert!(err.to_string().contains("boom"), "{err}");
    }
}
