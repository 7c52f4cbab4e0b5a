//! One recorded evaluation task (`eval/trajectories/data-sales.json`) driven
//! through both real agents, fault-free: Claude Code inside a crab sandbox
//! (`ctr`, its LLM through the shim's proxy) and mini-swe-agent outside one
//! (Docker, acting with `docker exec`). Each reaches the trajectory's checked
//! end (its `verify` script passes), and both end with the same state digest
//! (`crab_eval::state`): the trajectory means the same task to every agent.

// Needs root, the private containerd, dockerd, the agent image and
// mini-swe-agent's venv: built only with the `host-tests` feature.
#![cfg(feature = "host-tests")]

use std::time::Duration;

use crab_eval::trajectory::{Call, Trajectory};
use crab_integration::agent_eval::{fast_forward_lines, newest_seq, restored_from};
use crab_integration::crash::{assert_nothing_left_over, history_dir};
use crab_integration::docker::DOCKER_RUNTIME;
use crab_integration::mini_trajectory::Run;
use crab_integration::{
    anthropic, claude, crabctl_ok, journal_dir, kill_shim_and_init, kill_shim_of, namespace,
    proxy_pids, shim_pids, trajectory, unique_id, wait_until, Guard,
};
use serde_json::Value;

/// Data cleaning with awk and python, three files written: no server, so the
/// two agents' shells (Claude Code's bash, `docker exec`'s) see the same task.
const TASK: &str = "data-sales";

/// Claude Code's own files are its state, not the task's (docs/agents.md).
const AGENT_STATE: &[&str] = claude::STATE_PATHS;

/// Waits for Claude Code in `g` to finish the task `llm` scripts: it exited 0,
/// and no tool call failed.
fn claude_code_finishes(g: &Guard, llm: &anthropic::Scripted) {
    claude::finishes(g, llm, Duration::from_secs(900));
}

fn claude_code_does(t: &Trajectory) -> crab_eval::state::Ending {
    let steps = trajectory::claude_steps(t);
    let n = steps.len();
    let llm = anthropic::Scripted::start(steps);
    let g = claude::run(&llm, &t.title, AGENT_STATE);
    claude_code_finishes(&g, &llm);
    let asked: Vec<usize> = llm.seen().iter().filter_map(|s| s.step).collect();
    assert_eq!(
        asked,
        (0..n).collect::<Vec<_>>(),
        "{:#?}",
        claude::requests(&llm)
    );
    let ending = trajectory::ending(&namespace(), &g.id, t);
    let history: Vec<Value> =
        serde_json::from_str(&crabctl_ok(&["ls", &g.id, "--json"])).expect("crabctl ls --json");
    let skipped = history.iter().filter(|e| e["kind"] == "skip").count();
    eprintln!(
        "Claude Code inside: {} requests; of the {} entries its history keeps, {skipped} skips; {ending:?}",
        n,
        history.len()
    );
    ending
}

fn mini_swe_agent_does(t: &Trajectory) -> crab_eval::state::Ending {
    let run_args = ["--rm", "--runtime", DOCKER_RUNTIME, "--network", "none"];
    let mut run = Run::start(t, &run_args, None);
    let ending = run.finishes(t);
    eprintln!("mini-swe-agent outside: {} requests; {ending:?}", run.steps);
    ending
}

#[test]
fn one_recorded_task_ends_checked_and_the_same_under_claude_code_inside_and_mini_swe_agent_outside()
{
    let t = trajectory::load(TASK);
    let claude = claude_code_does(&t);
    assert!(claude.verified, "Claude Code: {TASK}'s verify failed");
    let mini = mini_swe_agent_does(&t);
    assert!(mini.verified, "mini-swe-agent: {TASK}'s verify failed");
    assert_eq!(claude.digest, mini.digest, "the two agents' states differ");
}

/// The step whose answer the crash test holds: after three of the task's
/// files were written and its data cleaned (turn 13 of 23).
const CRASH_AT_STEP: usize = 15;

#[test]
fn claude_code_crashed_in_the_middle_of_a_recorded_task_is_restored_and_ends_as_without_the_crash()
{
    let t = trajectory::load(TASK);
    let fault_free = claude_code_does(&t);
    assert!(fault_free.verified, "Claude Code: {TASK}'s verify failed");

    let llm = anthropic::Scripted::start(trajectory::claude_steps(&t));
    llm.hold_step(CRASH_AT_STEP);
    let g = claude::run(&llm, &t.title, AGENT_STATE);
    assert!(
        llm.wait_held(Duration::from_secs(600)),
        "Claude Code never asked for step {CRASH_AT_STEP}: {:#?}",
        claude::requests(&llm)
    );
    kill_shim_and_init(&g);
    // The whole sandbox is gone, its proxy too, before the held answer comes.
    assert!(
        wait_until(Duration::from_secs(10), || proxy_pids(&g.id).is_empty()),
        "the proxy outlived its shim"
    );
    llm.let_go();
    let out = crabctl_ok(&["restore", &g.id]);
    eprintln!("{out}");
    claude_code_finishes(&g, &llm);
    let recovered = recovered(&g, &t, &format!("the crash at step {CRASH_AT_STEP}"));
    assert_eq!(
        recovered.digest, fault_free.digest,
        "the restored run's state differs from the fault-free run's"
    );
}

/// The ending of the task in `g` once Claude Code finished after a restore,
/// which must be verified; prints it with the proxy's fast-forward lines.
fn recovered(g: &Guard, t: &Trajectory, after: &str) -> crab_eval::state::Ending {
    let recovered = trajectory::ending(&namespace(), &g.id, t);
    eprintln!(
        "after {after}: {recovered:?}\n{}",
        fast_forward_lines(g).join("\n")
    );
    assert!(
        recovered.verified,
        "{}'s verify failed after the restore",
        t.name
    );
    recovered
}

/// The proxy replayed journaled answers and went live without diverging.
fn assert_fast_forwarded(g: &Guard) {
    let lines = fast_forward_lines(g);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("answers replayed") && l.contains("then live")),
        "no replay: {lines:#?}"
    );
    assert!(
        !lines.iter().any(|l| l.contains("diverged")),
        "the replay diverged: {lines:#?}"
    );
}

/// How many times the scripted LLM was asked for each of its `n` steps.
fn times_asked(llm: &anthropic::Scripted, n: usize) -> Vec<usize> {
    let mut times = vec![0; n];
    for step in llm.seen().iter().filter_map(|s| s.step) {
        times[step] += 1;
    }
    times
}

/// The checkpoints of `id`'s history, oldest first.
fn history(id: &str) -> Vec<Value> {
    serde_json::from_str(&crabctl_ok(&["ls", id, "--json"])).expect("crabctl ls --json")
}

/// The seq of the turn whose journaled answer is the scripted LLM's step
/// `step` (the journal keeps each answer under its turn's checkpoint), if the
/// journal holds it.
fn journaled_seq_of_step(id: &str, step: usize) -> Option<u64> {
    let needle = format!("\"{}\"", anthropic::tool_use_id(step));
    std::fs::read_dir(journal_dir(id))
        .ok()?
        .flatten()
        .filter_map(|e| {
            let seq = e
                .file_name()
                .to_str()?
                .strip_suffix(".exchange")?
                .parse()
                .ok()?;
            let bytes = std::fs::read(e.path()).ok()?;
            String::from_utf8_lossy(&bytes)
                .contains(&needle)
                .then_some(seq)
        })
        .min()
}

/// The turn the long-tool-call test makes long: the `awk` that writes the
/// cleaned data, after three read-only turns.
const LONG_TURN: usize = 7;

/// What the long tool call appends to before it sleeps: in the task's tree,
/// so the state digest shows whether it ran once or twice.
const RUNS_LOG: &str = "stage/runs.log";

/// `t` with turn [`LONG_TURN`]'s command appending a line to [`RUNS_LOG`],
/// then sleeping (the tool call the crash comes in); and that command's step
/// in Claude Code's script.
fn with_a_long_tool_call(t: &Trajectory) -> (Trajectory, usize) {
    let mut t = t.clone();
    let Call::Shell { command } = &mut t.turns[LONG_TURN].call else {
        panic!("turn {LONG_TURN} of {} is not a shell command", t.name)
    };
    command.push_str(&format!("\necho ran >> {RUNS_LOG}\nsleep 6"));
    let step = trajectory::claude_steps(&t)
        .iter()
        .position(|s| {
            matches!(s, anthropic::Step::Tool("Bash", input)
                if input["command"].as_str().is_some_and(|c| c.contains(RUNS_LOG)))
        })
        .expect("the long command's step");
    (t, step)
}

/// Claude Code killed (its shim and the sandbox's processes) while a `Bash`
/// call runs, after the call appended to a file and while it sleeps. The
/// newest checkpoint is the turn that asked for that call; `crabctl restore`
/// brings it back, the proxy replays the journaled answers up to the call's
/// own, and Claude Code runs the call again, on the files as they were before
/// it: the line is appended once. What Claude Code sees is one run of the
/// call (it never saw the first one's result); the LLM is asked each step
/// exactly once.
#[test]
fn claude_code_killed_inside_a_long_tool_call_is_restored_runs_it_once_more_and_ends_as_without_the_crash(
) {
    let (t, step) = with_a_long_tool_call(&trajectory::load(TASK));
    let fault_free = claude_code_does(&t);
    assert!(fault_free.verified, "Claude Code: {TASK}'s verify failed");

    let steps = trajectory::claude_steps(&t);
    let n = steps.len();
    let llm = anthropic::Scripted::start(steps);
    let g = claude::run(&llm, &t.title, AGENT_STATE);
    let pid = g.pid();
    let runs_log = format!("{}/{RUNS_LOG}", t.workdir);
    assert!(
        wait_until(Duration::from_secs(600), || claude::read_inside(
            pid, &runs_log
        )
        .is_some()),
        "the long tool call (step {step}) never ran: {:#?}",
        claude::requests(&llm)
    );
    // Its answer is journaled under the turn that asked for it, which is the
    // newest checkpoint: nothing checkpoints while the tool runs.
    let mut asked_at = None;
    assert!(
        wait_until(Duration::from_secs(3), || {
            asked_at = journaled_seq_of_step(&g.id, step);
            asked_at.is_some()
        }),
        "the answer to step {step} is not journaled"
    );
    let asked_at = asked_at.unwrap();
    assert_eq!(newest_seq(&g.id), asked_at, "{:#?}", history(&g.id));
    assert_eq!(
        claude::read_inside(pid, "/dev/shm/claude.exit"),
        None,
        "Claude Code finished before the crash"
    );
    kill_shim_and_init(&g);
    assert!(
        wait_until(Duration::from_secs(10), || proxy_pids(&g.id).is_empty()),
        "the proxy outlived its shim"
    );
    let out = crabctl_ok(&["restore", &g.id]);
    eprintln!("{out}");
    assert_eq!(restored_from(&out), asked_at);
    claude_code_finishes(&g, &llm);
    assert_fast_forwarded(&g);
    // The call's answer came from the journal: no step was asked twice.
    assert_eq!(
        times_asked(&llm, n),
        vec![1; n],
        "{:#?}",
        claude::requests(&llm)
    );
    let recovered = recovered(&g, &t, &format!("the crash inside step {step}'s tool call"));
    assert_eq!(
        claude::read_inside(g.pid(), &runs_log).as_deref(),
        Some("ran\n"),
        "the tool call's effect before the crash survived the restore"
    );
    assert_eq!(
        recovered.digest, fault_free.digest,
        "the restored run's state differs from the fault-free run's"
    );
}

/// The step whose tool writes files after read-only ones (the `awk` that
/// writes the cleaned data): the turn asking for it is a skip, the next one,
/// which the checkpoint-crash tests crash, a full checkpoint (CRIU dumps).
const WRITES_AFTER_READS: usize = 8;

/// How the shim dies in a turn's checkpoint.
#[derive(Clone, Copy, Debug)]
enum DumpCrash {
    /// At the runtime's fault point `checkpoint.dumped`: CRIU has written the
    /// process images, not yet made durable; the helper kills the shim.
    FaultPoint,
    /// SIGKILL from outside while CRIU is writing the images: the helper and
    /// CRIU die with the shim.
    KilledWhileCriuWrites,
    /// At the fault point `checkpoint.recorded`: the turn's checkpoint is
    /// durable, its answer not yet released to the agent.
    AfterRecorded,
}

impl DumpCrash {
    /// The fault point armed for it, if any.
    fn point(self) -> Option<&'static str> {
        match self {
            DumpCrash::FaultPoint => Some("shim:checkpoint.dumped"),
            DumpCrash::KilledWhileCriuWrites => None,
            DumpCrash::AfterRecorded => Some("shim:checkpoint.recorded"),
        }
    }

    /// Whether the crashed turn's checkpoint became durable.
    fn recorded(self) -> bool {
        matches!(self, DumpCrash::AfterRecorded)
    }
}

/// The CRIU that dumps a checkpoint of container `id` (its images go under
/// the container's history), once it has written an image: its pid.
fn criu_writing_images(id: &str) -> Option<i32> {
    let history = history_dir(id);
    let history = history.to_str()?;
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let args: Vec<String> = cmd
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if !args.first()?.ends_with("criu") || args.get(1)? != "dump" {
            return None;
        }
        let at = args.iter().position(|a| a == "--images-dir")?;
        let images = args.get(at + 1).filter(|d| d.starts_with(history))?;
        let written = std::fs::read_dir(images)
            .ok()?
            .flatten()
            .any(|f| f.file_name().to_string_lossy().ends_with(".img"));
        written.then_some(pid)
    })
}

/// The shim dies (as `crash` says) during the turn checkpoint after step
/// [`WRITES_AFTER_READS`]'s tool. A checkpoint that died before it was
/// recorded leaves no entry, only its half-made images; `crabctl restore`
/// brings back the previous checkpoint, the turn that asked for that step;
/// Claude Code is fast-forwarded, runs the tool again, and asks the LLM again
/// for the step whose answer the dead checkpoint held back. The next
/// checkpoint of that seq clears what the dead one left. One that was
/// recorded is restored itself, with nothing to replay: Claude Code comes back
/// waiting for the answer it never got, and asks again. Either way the task
/// ends as without the crash.
fn shim_killed_in_a_turns_checkpoint_restores_the_newest_durable_one(crash: DumpCrash) {
    let t = trajectory::load(TASK);
    let fault_free = claude_code_does(&t);
    assert!(fault_free.verified, "Claude Code: {TASK}'s verify failed");

    let fault_file = std::env::temp_dir().join(format!("{}.fault", unique_id("f")));
    let steps = trajectory::claude_steps(&t);
    let n = steps.len();
    assert!(
        matches!(&steps[WRITES_AFTER_READS], anthropic::Step::Tool("Bash", input)
            if input["command"].as_str().is_some_and(|c| c.contains("> stage/clean.csv"))),
        "step {WRITES_AFTER_READS} is no longer the write of the cleaned data: {:?}",
        steps[WRITES_AFTER_READS]
    );
    let llm = anthropic::Scripted::start(steps);
    llm.hold_step(WRITES_AFTER_READS);
    let g = claude::run_configured(
        &llm,
        &t.title,
        AGENT_STATE,
        &format!("fault_file = \"{}\"", fault_file.display()),
    );
    assert!(
        llm.wait_held(Duration::from_secs(600)),
        "Claude Code never asked for step {WRITES_AFTER_READS}: {:#?}",
        claude::requests(&llm)
    );
    // The turn asking for it (a skip: its tools were read-only) is recorded
    // before the fault is armed, for a skip passes `checkpoint.recorded` too;
    // each Messages request is a turn, the held one included.
    let asking = llm.seen().iter().filter(|s| s.is_message()).count() as u64 + 1;
    assert!(
        wait_until(Duration::from_secs(30), || newest_seq(&g.id) == asking),
        "the turn asking for step {WRITES_AFTER_READS} is not seq {asking}: {:#?}",
        history(&g.id)
    );
    if let Some(point) = crash.point() {
        std::fs::write(&fault_file, point).expect("arm the fault");
    }
    llm.hold_step(WRITES_AFTER_READS + 1);
    // The proxy sends the turn's request on while the turn's checkpoint runs.
    assert!(
        llm.wait_held(Duration::from_secs(120)),
        "Claude Code never asked for step {}: {:#?}",
        WRITES_AFTER_READS + 1,
        claude::requests(&llm)
    );
    if let DumpCrash::KilledWhileCriuWrites = crash {
        assert!(
            wait_until(Duration::from_secs(30), || criu_writing_images(&g.id)
                .is_some()),
            "no dump of the turn after step {WRITES_AFTER_READS}"
        );
        kill_shim_of(&g.id);
        assert!(
            wait_until(Duration::from_secs(5), || criu_writing_images(&g.id)
                .is_none()),
            "CRIU outlived its shim"
        );
    }
    let crashed = wait_until(Duration::from_secs(60), || shim_pids(&g.id).is_empty());
    let _ = std::fs::remove_file(&fault_file);
    assert!(crashed, "the shim did not die in the turn's checkpoint");
    assert!(
        wait_until(Duration::from_secs(10), || proxy_pids(&g.id).is_empty()),
        "the proxy outlived its shim"
    );
    // The answer to step WRITES_AFTER_READS is journaled under the turn that
    // asked for it; the crashed turn's never reached the agent.
    let asked_at = journaled_seq_of_step(&g.id, WRITES_AFTER_READS)
        .expect("the answer to the step before the crash is journaled");
    assert_eq!(journaled_seq_of_step(&g.id, WRITES_AFTER_READS + 1), None);
    let crashed_turn = asked_at + 1;
    let newest = if crash.recorded() {
        // Durable: the crashed turn's own full checkpoint.
        let entries = history(&g.id);
        let last = entries.last().expect("a checkpoint");
        assert_eq!(last["seq"], crashed_turn, "{entries:#?}");
        assert_eq!(last["kind"], "full", "{entries:#?}");
        crashed_turn
    } else {
        // The dead checkpoint recorded nothing; what the dump wrote is left,
        // under the seq it would have had.
        assert_eq!(newest_seq(&g.id), asked_at, "{:#?}", history(&g.id));
        let half_made = history_dir(&g.id).join(format!(".{crashed_turn}.tmp"));
        assert!(
            half_made.join("criu").is_dir(),
            "no images of the dead dump at {}",
            half_made.display()
        );
        asked_at
    };
    llm.let_go();
    let out = crabctl_ok(&["restore", &g.id]);
    eprintln!("{out}");
    assert_eq!(restored_from(&out), newest);
    claude_code_finishes(&g, &llm);
    if crash.recorded() {
        // Its own image: nothing to replay.
        let lines = fast_forward_lines(&g);
        assert!(
            !lines.iter().any(|l| l.contains("answers replayed")),
            "{lines:#?}"
        );
    } else {
        assert_fast_forwarded(&g);
    }
    // Asked twice: the step whose request the dead checkpoint's turn sent
    // (its answer was held by the gate, never released), once more live.
    let mut expected = vec![1; n];
    expected[WRITES_AFTER_READS + 1] = 2;
    assert_eq!(
        times_asked(&llm, n),
        expected,
        "{:#?}",
        claude::requests(&llm)
    );
    // The dead dump's images and snapshot went when its seq was used again.
    assert_nothing_left_over(&g.id);
    let recovered = recovered(
        &g,
        &t,
        &format!("the crash in the turn's checkpoint ({crash:?})"),
    );
    assert_eq!(
        recovered.digest, fault_free.digest,
        "the restored run's state differs from the fault-free run's"
    );
}

#[test]
fn claude_codes_shim_killed_after_criu_dumped_a_turn_is_restored_from_the_previous_checkpoint_and_ends_as_without_the_crash(
) {
    shim_killed_in_a_turns_checkpoint_restores_the_newest_durable_one(DumpCrash::FaultPoint);
}

#[test]
fn claude_codes_shim_killed_while_criu_writes_a_turns_images_is_restored_from_the_previous_checkpoint_and_ends_as_without_the_crash(
) {
    shim_killed_in_a_turns_checkpoint_restores_the_newest_durable_one(
        DumpCrash::KilledWhileCriuWrites,
    );
}

#[test]
fn claude_codes_shim_killed_after_a_turns_checkpoint_is_recorded_and_before_its_answer_is_restored_from_that_checkpoint_and_ends_as_without_the_crash(
) {
    shim_killed_in_a_turns_checkpoint_restores_the_newest_durable_one(DumpCrash::AfterRecorded);
}
