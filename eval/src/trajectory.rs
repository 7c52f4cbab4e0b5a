//! Recorded agent trajectories: the tool calls of a task, each after the LLM's
//! think time, with the script that decides whether the task was done and the
//! state a recovered run must end with. Format: `eval/trajectories/README.md`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The format version this crate reads.
pub const FORMAT: u32 = 1;

/// One task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trajectory {
    /// Format version.
    pub format: u32,
    /// Its name (the file name without `.json`).
    pub name: String,
    /// What the task is.
    pub title: String,
    /// build, venv, server, git, data, repl, read-heavy or mixed.
    pub category: String,
    /// The sandbox's image.
    pub image: String,
    /// Where the agent works.
    pub workdir: String,
    /// The recorded turns.
    pub turns: Vec<Turn>,
    /// Shell script run in `workdir` at the end: exit 0 means the task is done.
    pub verify: String,
    /// What a recovered run must end with.
    pub state: State,
}

/// One turn: the LLM thinks, then calls a tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    /// The LLM's think time before this call, in milliseconds.
    pub think_ms: u64,
    /// The call.
    #[serde(flatten)]
    pub call: Call,
}

/// A tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "tool", rename_all = "snake_case", deny_unknown_fields)]
pub enum Call {
    /// `sh -c command` in the workdir.
    Shell {
        /// The command.
        command: String,
    },
    /// Write a file (parents created).
    WriteFile {
        /// Relative to the workdir, or absolute.
        path: String,
        /// Its content.
        content: String,
        /// Octal mode (default 0644).
        #[serde(default)]
        mode: Option<String>,
    },
}

impl Call {
    /// One line saying what it does (for progress displays).
    pub fn summary(&self) -> String {
        let text = match self {
            Call::Shell { command } => format!("$ {}", command.lines().next().unwrap_or("")),
            Call::WriteFile { path, content, .. } => {
                format!("write {path} ({} lines)", content.lines().count())
            }
        };
        if text.chars().count() > 60 {
            format!("{}…", text.chars().take(59).collect::<String>())
        } else {
            text
        }
    }
}

/// The state compared with a fault-free run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct State {
    /// Directories (and files) whose contents and modes are compared.
    pub paths: Vec<String>,
    /// Globs, relative to each path, left out.
    #[serde(default)]
    pub volatile: Vec<String>,
    /// A command whose output captures what live processes hold.
    #[serde(default)]
    pub probe: Option<String>,
}

/// What is wrong with a trajectory file.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// It cannot be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It is not a trajectory.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
}

impl Trajectory {
    /// Reads and checks one file.
    pub fn load(path: &Path) -> Result<Trajectory, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.into(),
            source,
        })?;
        let invalid = |message: String| Error::Invalid {
            path: path.into(),
            message,
        };
        let t: Trajectory = serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
        if t.format != FORMAT {
            return Err(invalid(format!(
                "format {} (this reads {FORMAT})",
                t.format
            )));
        }
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        if t.name != stem {
            return Err(invalid(format!("name {:?} is not the file's name", t.name)));
        }
        if t.turns.is_empty() {
            return Err(invalid("no turns".into()));
        }
        if !t.workdir.starts_with('/') {
            return Err(invalid(format!("workdir {:?} is not absolute", t.workdir)));
        }
        Ok(t)
    }

    /// Every `*.json` trajectory in `dir`, by name.
    pub fn load_dir(dir: &Path) -> Result<Vec<Trajectory>, Error> {
        let entries = std::fs::read_dir(dir).map_err(|source| Error::Read {
            path: dir.into(),
            source,
        })?;
        let mut paths: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        paths.sort();
        paths.iter().map(|p| Trajectory::load(p)).collect()
    }

    /// The think time before turn `i`, divided by `speedup`.
    pub fn think(&self, i: usize, speedup: f64) -> Duration {
        let ms = self.turns.get(i).map(|t| t.think_ms).unwrap_or(0) as f64;
        Duration::from_secs_f64(ms / 1000.0 / speedup.max(1e-6))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trajectory_round_trips_and_is_checked() {
        let dir = std::env::temp_dir().join(format!("traj-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let json = r#"{"format":1,"name":"t","title":"x","category":"build",
            "image":"img","workdir":"/sandbox/t",
            "turns":[{"think_ms":1500,"tool":"shell","command":"ls"},
                     {"think_ms":2000,"tool":"write_file","path":"a","content":"b","mode":"0755"}],
            "verify":"true","state":{"paths":["/sandbox/t"]}}"#;
        std::fs::write(dir.join("t.json"), json).unwrap();
        let t = Trajectory::load(&dir.join("t.json")).unwrap();
        assert_eq!(t.turns.len(), 2);
        assert!(matches!(t.turns[1].call, Call::WriteFile { .. }));
        assert_eq!(t.think(0, 10.0), Duration::from_millis(150));
        std::fs::write(dir.join("u.json"), json).unwrap();
        let e = Trajectory::load(&dir.join("u.json")).unwrap_err();
        assert!(e.to_string().contains("not the file's name"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
