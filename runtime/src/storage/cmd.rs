//! Running the storage tools (`btrfs`, `zfs`, `zpool`) with errors that say what failed.

use std::io::{Read, Write};
use std::process::{Child, Command, Output, Stdio};

use crate::{Error, Result};

/// Runs `program args`; returns stdout. A failure carries the command and its stderr,
/// and is [`Error::PoolFull`] when the tool reports that the pool has no space.
pub fn run(program: &str, args: &[&str]) -> Result<String> {
    let child = spawn(program, args, Stdio::null())?;
    let out = finish(program, args, child)?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `program args` with `input` copied to its stdin.
pub fn run_with_input(program: &str, args: &[&str], input: &mut dyn Read) -> Result<String> {
    let mut child = spawn(program, args, Stdio::piped())?;
    let mut stdin = child.stdin.take().expect("piped");
    let copied = std::io::copy(input, &mut stdin);
    drop(stdin);
    let out = finish(program, args, child)?;
    copied.map_err(Error::io(format!("write to {program}")))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `program args` with its stdout copied to `output`.
pub fn run_with_output(program: &str, args: &[&str], output: &mut dyn Write) -> Result<()> {
    let mut child = spawn(program, args, Stdio::null())?;
    let mut stdout = child.stdout.take().expect("piped");
    let copied = std::io::copy(&mut stdout, output);
    drop(stdout);
    finish(program, args, child)?;
    copied.map_err(Error::io(format!("read from {program}")))?;
    Ok(())
}

/// Starts `program args` with `stdin`, its stdout and stderr piped.
fn spawn(program: &str, args: &[&str], stdin: Stdio) -> Result<Child> {
    Command::new(program)
        .args(args)
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(Error::io(format!("run {program}")))
}

/// Waits for `child` (reading what is left of its output); its failure is an error
/// that carries its stderr.
fn finish(program: &str, args: &[&str], child: Child) -> Result<Output> {
    let out = child
        .wait_with_output()
        .map_err(Error::io(format!("wait for {program}")))?;
    if !out.status.success() {
        return Err(failure(
            program,
            args,
            &String::from_utf8_lossy(&out.stderr),
        ));
    }
    Ok(out)
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
