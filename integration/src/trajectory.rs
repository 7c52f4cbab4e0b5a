//! One evaluation trajectory (`eval/trajectories/`) as the script of a real
//! agent: its turns become Claude Code's tool calls (`Bash`, `Read`, `Write`)
//! or mini-swe-agent's commands, so the same recorded task drives every agent,
//! and the run ends with the trajectory's own check and state digest
//! (`crab_eval::state`).

use std::path::PathBuf;

use base64::Engine;
use crab_eval::agent::TOOL_ENV;
use crab_eval::sandbox::Ctr;
use crab_eval::state::Ending;
use crab_eval::trajectory::{Call, Trajectory};
use serde_json::json;

use crate::{anthropic, openai};

/// The last answer of every script.
const DONE: &str = "Done: the task is complete and checked.";

/// mini-swe-agent's submission marker (its `mini` configuration's).
const SUBMIT: &str = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT";

/// Loads `eval/trajectories/<name>.json`.
pub fn load(name: &str) -> Trajectory {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../eval/trajectories")
        .join(format!("{name}.json"));
    Trajectory::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A shell turn as a command line an agent runs: the trajectory's environment,
/// the workdir made current on a line of its own (the README's rule: a command
/// may put jobs in the background), then the command.
pub fn shell_command(t: &Trajectory, command: &str) -> String {
    format!(
        "{TOOL_ENV}; mkdir -p {wd} && cd {wd} || exit 125\n{command}",
        wd = t.workdir
    )
}

/// A `write_file` turn's path, absolute.
fn absolute(t: &Trajectory, path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{}/{path}", t.workdir)
    }
}

/// The `chmod` a write needs after it, if its mode is not the default.
fn chmod(mode: &Option<String>, path: &str) -> Option<String> {
    mode.as_deref()
        .filter(|m| *m != "0644")
        .map(|m| format!("chmod {m} '{path}'"))
}

/// Claude Code's script: a shell turn is a `Bash` call; a write is a `Read`
/// of the file (Claude Code refuses to overwrite a file it has not read; for
/// a new file the read answers "does not exist") then a `Write`, and a `Bash`
/// `chmod` when the mode is not 0644; then the final answer.
pub fn claude_steps(t: &Trajectory) -> Vec<anthropic::Step> {
    claude_script(t).into_iter().map(|(_, step)| step).collect()
}

/// The think time before each of [`claude_steps`]: every step of a turn
/// waits the turn's recorded think time divided by `speedup` (each is an LLM
/// call of its own); the final answer none.
pub fn claude_think_times(t: &Trajectory, speedup: f64) -> Vec<std::time::Duration> {
    claude_script(t)
        .into_iter()
        .map(|(turn, _)| {
            turn.map_or(std::time::Duration::ZERO, |i| {
                std::time::Duration::from_secs_f64(t.turns[i].think_ms as f64 / 1000.0 / speedup)
            })
        })
        .collect()
}

/// Claude Code's script, each step with the turn it comes from.
fn claude_script(t: &Trajectory) -> Vec<(Option<usize>, anthropic::Step)> {
    let bash = |command: String| {
        anthropic::Step::Tool(
            "Bash",
            json!({"command": command, "description": "the task's next step"}),
        )
    };
    let mut steps = Vec::new();
    for (i, turn) in t.turns.iter().enumerate() {
        let mut push = |step| steps.push((Some(i), step));
        match &turn.call {
            Call::Shell { command } => push(bash(shell_command(t, command))),
            Call::WriteFile {
                path,
                content,
                mode,
            } => {
                let path = absolute(t, path);
                push(anthropic::Step::Tool("Read", json!({ "file_path": path })));
                push(anthropic::Step::Tool(
                    "Write",
                    json!({"file_path": path, "content": content}),
                ));
                if let Some(chmod) = chmod(mode, &path) {
                    push(bash(shell_command(t, &chmod)));
                }
            }
        }
    }
    steps.push((None, anthropic::Step::Text(DONE)));
    steps
}

/// mini-swe-agent's script: every turn is a command (it has no other tool); a
/// write is a quoted here-document, as an agent writes a file with a shell,
/// or base64 when the content would not survive one; then the submission.
pub fn mini_steps(t: &Trajectory) -> Vec<openai::Step> {
    let mut steps = Vec::new();
    for (i, turn) in t.turns.iter().enumerate() {
        let command = match &turn.call {
            Call::Shell { command } => command.clone(),
            Call::WriteFile {
                path,
                content,
                mode,
            } => {
                let path = absolute(t, path);
                let mut write = format!("mkdir -p \"$(dirname '{path}')\" && ");
                if content.ends_with('\n') && !content.lines().any(|l| l == "CRAB_EOF") {
                    write.push_str(&format!("cat > '{path}' <<'CRAB_EOF'\n{content}CRAB_EOF"));
                } else {
                    let b64 = base64::engine::general_purpose::STANDARD.encode(content);
                    write.push_str(&format!("echo {b64} | base64 -d > '{path}'"));
                }
                if let Some(chmod) = chmod(mode, &path) {
                    write.push_str(&format!("\n{chmod}"));
                }
                write
            }
        };
        steps.push(openai::Step::new(
            &format!("Step {} of the task.", i + 1),
            &shell_command(t, &command),
        ));
    }
    steps.push(openai::Step::new(DONE, SUBMIT));
    steps
}

/// The think time before each of [`mini_steps`]: a turn's recorded think
/// time divided by `speedup`; the submission none.
pub fn mini_think_times(t: &Trajectory, speedup: f64) -> Vec<std::time::Duration> {
    t.turns
        .iter()
        .map(|turn| std::time::Duration::from_secs_f64(turn.think_ms as f64 / 1000.0 / speedup))
        .chain([std::time::Duration::ZERO])
        .collect()
}

/// The trajectory's check and state digest, taken in container `id` of
/// containerd namespace `namespace` (a Docker container's is `moby`).
pub fn ending(namespace: &str, id: &str, t: &Trajectory) -> Ending {
    let ctr = Ctr {
        address: crate::address(),
        namespace: namespace.to_string(),
    };
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(crab_eval::state::ending(&ctr, id, t))
        .unwrap_or_else(|e| panic!("the ending of {} in {id}: {e:#}", t.name))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use serde_json::Value;

    use super::*;

    fn writes(workdir: &str) -> Trajectory {
        serde_json::from_value(json!({"format": 1, "name": "t", "title": "x",
        "category": "build", "image": "i", "workdir": workdir, "verify": "true",
        "state": {"paths": []}, "turns": [
            {"think_ms": 1000, "tool": "write_file", "path": "a/run.sh",
             "content": "#!/bin/sh\necho 'it''s $HOME'\n", "mode": "0755"},
            {"think_ms": 1000, "tool": "write_file", "path": "no-newline.txt",
             "content": "last line\nCRAB_EOF"},
            {"think_ms": 1000, "tool": "shell", "command": "cat no-newline.txt > copy.txt"}
        ]}))
        .expect("a trajectory")
    }

    #[test]
    fn mini_swe_agents_commands_write_the_exact_bytes_and_modes_in_the_workdir() {
        let dir = tempfile::tempdir().unwrap();
        let wd = dir.path().join("task");
        let t = writes(wd.to_str().unwrap());
        let steps = mini_steps(&t);
        assert_eq!(steps.len(), 4);
        assert_eq!(steps[3].command, SUBMIT);
        for step in &steps[..3] {
            let out = std::process::Command::new("bash")
                .args(["-lc", &step.command])
                .output()
                .unwrap();
            assert!(out.status.success(), "{}: {out:?}", step.command);
        }
        let run = wd.join("a/run.sh");
        assert_eq!(
            std::fs::read_to_string(&run).unwrap(),
            "#!/bin/sh\necho 'it''s $HOME'\n"
        );
        let mode = std::fs::metadata(&run).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o755);
        assert_eq!(
            std::fs::read_to_string(wd.join("copy.txt")).unwrap(),
            "last line\nCRAB_EOF"
        );
    }

    #[test]
    fn mini_swe_agents_think_times_pace_each_turns_command_and_not_the_submission() {
        let t = writes("/sandbox/t");
        let think = mini_think_times(&t, 4.0);
        assert_eq!(think.len(), mini_steps(&t).len());
        assert_eq!(think[0], std::time::Duration::from_millis(250));
        assert_eq!(think[3], std::time::Duration::ZERO);
    }

    #[test]
    fn claude_codes_write_reads_the_file_first_and_sets_a_mode_with_bash() {
        let t = writes("/sandbox/t");
        let steps = claude_steps(&t);
        let calls: Vec<(&str, Value)> = steps
            .iter()
            .filter_map(|s| match s {
                anthropic::Step::Tool(name, input) => Some((*name, input.clone())),
                anthropic::Step::Text(_) => None,
            })
            .collect();
        let names: Vec<&str> = calls.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["Read", "Write", "Bash", "Read", "Write", "Bash"]);
        assert_eq!(calls[1].1["file_path"], "/sandbox/t/a/run.sh");
        assert!(calls[2].1["command"]
            .as_str()
            .unwrap()
            .ends_with("\nchmod 0755 '/sandbox/t/a/run.sh'"));
        assert!(matches!(steps.last(), Some(anthropic::Step::Text(DONE))));
    }
}
