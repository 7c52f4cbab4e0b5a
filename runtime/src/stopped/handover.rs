//! The v1 freezer's hold on a container handed to the cgroup v2 freezer of its
//! tracking directory for a dump, and back.
//!
//! CRIU cannot seize a task that is stopped by a signal and frozen by the v1
//! freezer ([`super`]). The v2 freezer leaves a stopped task in its stop, and the
//! tracking directory holds every process of the container, so a dump that meets
//! a stopped process in a v1-frozen container freezes it there instead:
//!
//! 1. `cgroup.freeze` is set on the tracking directory. The tasks are v1-frozen,
//!    so they only take note (a freeze trap, and a wakeup their saved state
//!    keeps).
//! 2. The v1 freezer thaws them. Each one leaves the refrigerator, or its
//!    interrupted sleep, on its way back to user space, and stops in the v2
//!    freezer's trap before it runs a user instruction; a stopped task stays in
//!    its stop, which counts as frozen.
//! 3. Once the v2 freezer reports the directory frozen, CRIU dumps through it.
//!
//! And back, whatever the dump did: the v1 freezer freezes them again where they
//! are (in the trap, or stopped), then the v2 freezer lets go; its wakeup waits
//! in their saved state for the v1 thaw. So the container's client, whose pause
//! the v1 freezer holds, never sees a task of it run.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// How long each side waits for the kernel to report the tasks frozen.
const FROZEN_WITHIN: Duration = Duration::from_secs(5);

/// A container held by its tracking cgroup's v2 freezer instead of its v1 one;
/// [`Handover::end`] (or the drop) hands it back.
pub struct Handover {
    v1: PathBuf,
    v2: PathBuf,
    ended: bool,
}

impl Handover {
    /// Hands the tasks of v1 freezer cgroup `v1` (frozen) to the v2 freezer of
    /// `v2`, which holds the same tasks. On failure they are back in `v1`'s hold.
    pub fn begin(v1: &Path, v2: &Path) -> Result<Handover> {
        let started = Instant::now();
        let h = Handover {
            v1: v1.to_path_buf(),
            v2: v2.to_path_buf(),
            ended: false,
        };
        write(&h.v2.join("cgroup.freeze"), "1")?;
        write(&h.v1.join("freezer.state"), "THAWED")?;
        wait(&h.v2, "the v2 freezer", || v2_frozen(&h.v2))?;
        tracing::debug!(us = started.elapsed().as_micros() as u64, v2 = %h.v2.display(),
            "a stopped process: the freeze handed to the v2 freezer");
        Ok(h)
    }

    /// The v2 cgroup that holds the tasks now: the one CRIU freezes through.
    pub fn cgroup(&self) -> &Path {
        &self.v2
    }

    /// Hands the tasks back to the v1 freezer. Whatever fails, the v2 freezer
    /// lets go: a container left frozen there would stay so for good, since its
    /// client resumes only the v1 freezer.
    pub fn end(mut self) -> Result<()> {
        self.ended = true;
        self.hand_back()
    }

    fn hand_back(&self) -> Result<()> {
        let state = self.v1.join("freezer.state");
        let frozen = write(&state, "FROZEN").and_then(|()| {
            wait(&self.v1, "the v1 freezer", || {
                let now = std::fs::read_to_string(&state).unwrap_or_default();
                // The v1 freezer can stall in FREEZING: asked again, as CRIU does.
                if now.trim() == "FREEZING" {
                    let _ = std::fs::write(&state, "FROZEN");
                }
                now.trim() == "FROZEN"
            })
        });
        let thawed = write(&self.v2.join("cgroup.freeze"), "0");
        frozen.and(thawed)
    }
}

/// After a dump's helper died (killed, or crashed) with the freeze handed to the
/// v2 freezer of `v2`: hands it back to the v1 freezer cgroup `v1`, so that the
/// caller's usual thaw (or the client's resume) lets the tasks go. Answers
/// whether there was one to hand back. Only a hybrid host's tracking cgroup is
/// looked at: on a cgroup v2-only host `v2` is the container's own cgroup, and a
/// freeze there is its client's pause.
pub fn hand_back_if_cut(v1: &Path, v2: &Path) -> Result<bool> {
    let cut = super::v1_freezer(v1)
        && v1 != v2
        && std::fs::read_to_string(v2.join("cgroup.freeze")).is_ok_and(|f| f.trim() == "1");
    if cut {
        Handover {
            v1: v1.to_path_buf(),
            v2: v2.to_path_buf(),
            ended: false,
        }
        .end()?;
    }
    Ok(cut)
}

impl Drop for Handover {
    /// A dump that failed or panicked hands the tasks back too.
    fn drop(&mut self) {
        if !self.ended {
            if let Err(e) = self.hand_back() {
                tracing::warn!(error = %e, "hand the freeze back to the v1 freezer");
            }
        }
    }
}

fn v2_frozen(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("cgroup.events"))
        .is_ok_and(|events| events.lines().any(|l| l.trim() == "frozen 1"))
}

fn write(file: &Path, value: &str) -> Result<()> {
    std::fs::write(file, value).map_err(Error::io(format!("write {value} to {}", file.display())))
}

/// Polls `done` until it holds, at most [`FROZEN_WITHIN`].
fn wait(dir: &Path, what: &str, mut done: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + FROZEN_WITHIN;
    while !done() {
        if Instant::now() >= deadline {
            return Err(Error::io(format!(
                "freeze {} through {what}",
                dir.display()
            ))(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("not frozen within {FROZEN_WITHIN:?}"),
            )));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(())
}

#[cfg(all(test, feature = "host-tests"))]
mod tests {
    use super::*;

    fn state(pid: u32) -> char {
        crate::inspect::procs::state(pid as i32).unwrap_or('?')
    }

    /// A stopped task and a writer, v1-frozen: handed over, the writer still
    /// writes nothing and the stopped task is seen stopped again (CRIU can seize
    /// it); handed back, the v1 freezer holds both, and its thaw lets the writer
    /// go on and leaves the stopped task stopped.
    #[test]
    fn a_v1_frozen_cgroup_is_handed_to_the_v2_freezer_and_back_and_no_task_runs() {
        let name = format!("crab-handover-test-{}", std::process::id());
        let v1 = Path::new("/sys/fs/cgroup/freezer").join(&name);
        let v2 = Path::new("/sys/fs/cgroup/unified").join(&name);
        assert!(v1.parent().unwrap().is_dir() && v2.parent().unwrap().is_dir());
        std::fs::create_dir(&v1).unwrap();
        std::fs::create_dir(&v2).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("w");
        let mut writer = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "while true; do echo x >> {}; sleep 0.01; done",
                out.display()
            ))
            .spawn()
            .unwrap();
        let mut stopped = crate::stopped::tests::sleeper();
        for pid in [writer.id(), stopped.id()] {
            std::fs::write(v1.join("cgroup.procs"), pid.to_string()).unwrap();
            std::fs::write(v2.join("cgroup.procs"), pid.to_string()).unwrap();
        }
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(stopped.id() as i32),
            nix::sys::signal::Signal::SIGSTOP,
        )
        .unwrap();
        while state(stopped.id()) != 'T' {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::fs::write(v1.join("freezer.state"), "FROZEN").unwrap();
        wait(&v1, "v1", || {
            std::fs::read_to_string(v1.join("freezer.state"))
                .unwrap()
                .trim()
                == "FROZEN"
        })
        .unwrap();
        let size = || std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
        let frozen_at = size();

        let h = Handover::begin(&v1, &v2).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let handed = (
            size(),
            std::fs::read_to_string(v1.join("freezer.state")).unwrap(),
            v2_frozen(&v2),
            state(stopped.id()),
        );
        h.end().unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let back = (
            size(),
            std::fs::read_to_string(v1.join("freezer.state")).unwrap(),
            std::fs::read_to_string(v2.join("cgroup.freeze")).unwrap(),
        );
        std::fs::write(v1.join("freezer.state"), "THAWED").unwrap();
        let wrote_again = {
            let deadline = Instant::now() + Duration::from_secs(5);
            while size() == frozen_at && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            size() > frozen_at
        };
        let still_stopped = state(stopped.id());
        for c in [&mut writer, &mut stopped] {
            c.kill().unwrap();
            c.wait().unwrap();
        }
        let _ = std::fs::remove_dir(&v1);
        let _ = std::fs::remove_dir(&v2);
        assert_eq!(
            handed,
            (frozen_at, "THAWED\n".to_string(), true, 'T'),
            "handed over"
        );
        assert_eq!(
            back,
            (frozen_at, "FROZEN\n".to_string(), "0\n".to_string()),
            "back"
        );
        assert!(wrote_again, "the writer did not go on after the v1 thaw");
        assert_eq!(still_stopped, 'T');
    }
}
