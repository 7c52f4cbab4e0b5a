//! Claude Code inside the sandbox with fast-forward (`io.crab.agent.fast-forward`,
//! docs/agents.md): the turns where only the agent did something (it read files,
//! ran read-only commands, wrote its transcript) are skipped; after a crash the
//! sandbox comes back from its newest checkpoint, whose agent is older, and the
//! proxy answers the agent's repeated requests from its journal until it is
//! where it was, without asking the LLM again.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::time::Duration;

use crab_integration::anthropic::{Scripted, Step};
use crab_integration::{
    claude, crabctl_ok, kill_shim_and_init, namespace, proxy_pids, state_dir, wait_until, Guard,
};
use serde_json::{json, Value};

const TASK: &str = "Look around, then write /root/notes.md.";
const NOTES: &str = "# Notes\n\nWritten after looking around.\n";

/// The annotations of a fast-forwarded Claude Code: its stream-json output file
/// is its own state, as its transcript is.
const FAST_FORWARD: &[&str] = &[
    "--annotation",
    "io.crab.agent.fast-forward=true",
    "--annotation",
    "io.crab.agent.state-paths=/root/.claude,/tmp/claude-0,/tmp/claude.out,/tmp/claude.err",
];

fn bash(command: &str) -> Step {
    Step::Tool(
        "Bash",
        json!({"command": command, "description": "look around"}),
    )
}

/// Five read-only commands, a write, two reads, and the answer. The commands
/// before the write print nothing that moves with the clock: a replayed agent
/// runs them again, and an output holding a time (`ls -la` of a directory the
/// agent writes in, in another minute) would make its next request differ
/// from the journaled one, and the replay end there (docs/agents.md,
/// "Divergence").
fn script() -> Vec<Step> {
    vec![
        bash("cat /etc/os-release"),
        bash("ls /root /usr/local/bin"),
        bash("grep -c root /etc/passwd"),
        bash("head -3 /etc/group && wc -l /etc/services"),
        bash("find /etc -maxdepth 1 -name '*.conf' | sort | head"),
        Step::Tool(
            "Write",
            json!({"file_path": "/root/notes.md", "content": NOTES}),
        ),
        bash("cat /root/notes.md"),
        bash("ls -la /root"),
        Step::Text("Done: notes.md is written."),
    ]
}

/// The sandbox's history, as `crabctl ls --json` gives it.
fn history(g: &Guard) -> Vec<Value> {
    serde_json::from_str(&crabctl_ok(&["ls", &g.id, "--json"])).expect("crabctl ls --json")
}

/// The sandbox's history: (seq, kind) of each entry.
fn kinds(g: &Guard) -> Vec<(u64, String)> {
    history(g)
        .iter()
        .map(|e| {
            (
                e["seq"].as_u64().unwrap_or(0),
                e["kind"].as_str().unwrap_or("?").to_string(),
            )
        })
        .collect()
}

/// Claude Code, fast-forwarded, started on `llm`'s script and run until it
/// waits for the answer to `step`, which `llm` holds.
fn run_until_held(llm: &Scripted, step: usize) -> Guard {
    llm.hold_step(step);
    let g = claude::run(llm, TASK, FAST_FORWARD);
    assert!(
        llm.wait_held(Duration::from_secs(180)),
        "Claude Code never asked for step {step}: {:#?}",
        claude::requests(llm)
    );
    g
}

/// What the sandbox's proxy logged (the journal's replays and divergences).
fn proxy_log(g: &Guard) -> String {
    let path = state_dir()
        .join(namespace())
        .join(format!("{}.proxy.log", g.id));
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Main-loop requests the server saw, by step.
fn steps_seen(llm: &Scripted) -> Vec<usize> {
    llm.seen().iter().filter_map(|s| s.step).collect()
}

/// Claude Code held at step 6 with that request's turn recorded, and the entry
/// of the turn that asked for step 3: the state after step 2's command, before
/// the Write.
fn held_at_step_6(llm: &Scripted) -> (Guard, u64) {
    let g = run_until_held(llm, 6);
    let asked: Vec<usize> = steps_seen(llm);
    assert_eq!(asked, [0, 1, 2, 3, 4, 5], "{:#?}", claude::requests(llm));
    // The held request's turn is recorded first (a rollback during it would
    // be refused as busy).
    assert!(
        crab_integration::wait_until(Duration::from_secs(30), || kinds(&g).len() == 7),
        "{:?}",
        kinds(&g)
    );
    let history = history(&g);
    let entry = history
        .get(3)
        .and_then(|e| e["seq"].as_u64())
        .unwrap_or_else(|| panic!("no fourth entry: {history:?}"));
    (g, entry)
}

/// The source, let go, and `copy`, made from the entry of step 3 (a fork, an
/// import), both finish with the right file; the copy's steps 0-3 came from
/// the journal (the server answered them once, for the source), 4 on were
/// asked live by both.
fn assert_both_finish_and_the_copy_replayed(llm: &Scripted, source: &Guard, copy: &Guard) {
    llm.let_go();
    for (who, sandbox) in [("source", source), ("copy", copy)] {
        let (code, out, err) = claude::finished(sandbox, llm, Duration::from_secs(240));
        assert_eq!(code, "0", "{who}: stdout: {out}\nstderr: {err}");
        assert_eq!(sandbox.exec_ok(&["cat", "/root/notes.md"]), NOTES, "{who}");
    }
    let log = proxy_log(copy);
    let seen = steps_seen(llm);
    eprintln!("steps the server answered: {seen:?}\nthe copy's proxy log:\n{log}");
    assert!(log.contains("answers replayed"), "no replay in the copy");
    let counts: Vec<usize> = (0..=8)
        .map(|step| seen.iter().filter(|&&s| s == step).count())
        .collect();
    assert_eq!(
        counts,
        [1, 1, 1, 1, 2, 2, 2, 2, 2],
        "{:#?}",
        claude::requests(llm)
    );
}

#[test]
fn claude_codes_read_only_turns_are_skipped_and_its_writes_are_full() {
    let llm = Scripted::start(script());
    let g = claude::run(&llm, TASK, FAST_FORWARD);
    let (code, out, err) = claude::finished(&g, &llm, Duration::from_secs(240));
    assert_eq!(code, "0", "stdout: {out}\nstderr: {err}");
    assert_eq!(g.exec_ok(&["cat", "/root/notes.md"]), NOTES);
    assert_eq!(steps_seen(&llm), (0..9).collect::<Vec<_>>());
    let kinds = kinds(&g);
    eprintln!("history (seq, kind): {kinds:?}");
    let skipped = kinds.iter().filter(|(_, k)| k == "skip").count();
    eprintln!(
        "| turns | skipped | share |\n| {} | {skipped} | {:.0}% |",
        kinds.len(),
        100.0 * skipped as f64 / kinds.len() as f64
    );
    // The first turn takes everything; the read-only ones after it are skipped.
    // The write's turn (the request after the Write step) is full.
    assert!(
        skipped >= 4,
        "{skipped} of {} turns skipped: {kinds:?}",
        kinds.len()
    );
    assert!(kinds.iter().skip(1).any(|(_, k)| k == "full"), "{kinds:?}");
}

#[test]
fn after_a_crash_claude_code_is_fast_forwarded_from_the_journal_and_finishes() {
    let llm = Scripted::start(script());
    // The crash comes while the agent waits for step 5 (the Write): steps 1-4
    // were read-only turns, skipped.
    let g = run_until_held(&llm, 5);
    let before = kinds(&g);
    eprintln!("history before the crash: {before:?}");
    kill_shim_and_init(&g);
    // As in a host crash, the proxy goes too before the held answer comes: a
    // proxy still running would journal it, and the restored agent would get
    // step 5 from the journal instead of asking again.
    assert!(
        wait_until(Duration::from_secs(10), || proxy_pids(&g.id).is_empty()),
        "the proxy outlived its shim: {:?}",
        proxy_pids(&g.id)
    );
    llm.let_go();
    let out = crabctl_ok(&["restore", &g.id]);
    eprintln!("{out}");
    // The entry restored, and the turn its processes come from.
    let restored: u64 = out
        .split("restored from checkpoint ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|seq| seq.parse().ok())
        .unwrap_or_else(|| panic!("which checkpoint? {out}"));
    let history = history(&g);
    let image = history
        .iter()
        .find(|e| e["seq"] == restored)
        .and_then(|e| e["process_image"].as_u64())
        .unwrap_or_else(|| panic!("entry {restored} has no process image: {history:?}"));
    eprintln!("restored entry {restored}, its processes from entry {image}");
    assert!(
        restored - image >= 3,
        "fewer than three turns skipped before the crash: {before:?}"
    );
    let (code, out, err) = claude::finished(&g, &llm, Duration::from_secs(240));
    assert_eq!(code, "0", "stdout: {out}\nstderr: {err}");
    assert_eq!(g.exec_ok(&["cat", "/root/notes.md"]), NOTES);
    let seen = steps_seen(&llm);
    eprintln!("steps the server answered: {seen:?}");
    // Steps 0-4 once each: after the restore, their answers came from the
    // journal. Step 5 twice (its answer was never released before the crash).
    let mut expected: Vec<usize> = (0..9).collect();
    expected.insert(6, 5);
    let log = proxy_log(&g);
    assert_eq!(
        seen,
        expected,
        "{:#?}\nthe proxy's log:\n{log}",
        claude::requests(&llm)
    );
    // The proxy says so: the restored agent got the answers of the turns from
    // its image's to the crash from the journal (all but the one in flight),
    // then went live at step 5.
    let line = log
        .lines()
        .find(|l| l.contains("fast-forward: ") && l.contains("answers replayed"))
        .unwrap_or_else(|| panic!("no fast-forward line in the proxy log:\n{log}"));
    eprintln!("{line}");
    assert!(
        line.contains(&format!(
            "fast-forward: {} answers replayed",
            restored - image
        )),
        "{line}"
    );
}

#[test]
fn a_rollback_from_outside_brings_claude_code_back_to_the_entry_by_fast_forward() {
    let llm = Scripted::start(script());
    let (g, entry) = held_at_step_6(&llm);
    let out = crabctl_ok(&["rollback", &g.id, &entry.to_string()]);
    eprintln!("{out}");
    llm.let_go();
    assert!(
        !g.exec(&["test", "-e", "/root/notes.md"]).status.success()
            || g.exec_ok(&["cat", "/root/notes.md"]) == NOTES,
        "notes.md is neither absent nor whole"
    );
    let (code, out, err) = claude::finished(&g, &llm, Duration::from_secs(240));
    assert_eq!(code, "0", "stdout: {out}\nstderr: {err}");
    assert_eq!(g.exec_ok(&["cat", "/root/notes.md"]), NOTES);
    // Steps 0-3 came from the journal after the rollback; step 4 on were asked
    // again, live (the rollback went back before them).
    let seen = steps_seen(&llm);
    eprintln!("steps the server answered: {seen:?}");
    assert_eq!(
        seen,
        [0, 1, 2, 3, 4, 5, 6, 4, 5, 6, 7, 8],
        "{:#?}\nhistory (seq, kind): {:?}\nthe proxy's log:\n{}",
        claude::requests(&llm),
        kinds(&g),
        proxy_log(&g)
    );
}

#[test]
fn a_fork_of_claude_code_is_fast_forwarded_from_the_sources_journal_and_goes_its_own_way() {
    let llm = Scripted::start(script());
    let (g, entry) = held_at_step_6(&llm);
    let prefix = crab_integration::unique_id("ff");
    let fork = Guard::new(&format!("{prefix}-1"));
    let out = crabctl_ok(&[
        "fork",
        &g.id,
        &entry.to_string(),
        "--count",
        "1",
        "--prefix",
        &prefix,
    ]);
    eprintln!("{out}");
    assert_both_finish_and_the_copy_replayed(&llm, &g, &fork);
}

#[test]
fn an_exported_claude_code_is_fast_forwarded_where_it_is_imported() {
    let llm = Scripted::start(script());
    let (g, entry) = held_at_step_6(&llm);
    let archive = std::env::temp_dir().join(format!("{}.tar", crab_integration::unique_id("ffa")));
    crabctl_ok(&[
        "export",
        &g.id,
        &entry.to_string(),
        "-o",
        archive.to_str().unwrap(),
    ]);
    // The importing side's configuration allows the same LLM; the archive's
    // upstream annotation is Crab's, kept with --allow annotations.
    let config =
        crab_integration::config_with(&format!("[proxy]\nupstreams = [\"{}\"]\n", llm.url()));
    let moved = Guard::new(&crab_integration::unique_id("ffi"));
    let out = crabctl_ok(&[
        "import",
        archive.to_str().unwrap(),
        "--id",
        &moved.id,
        "--allow",
        "annotations",
        "--runtime-config-path",
        config.to_str().unwrap(),
    ]);
    eprintln!("{out}");
    let _ = std::fs::remove_file(&archive);
    assert_both_finish_and_the_copy_replayed(&llm, &g, &moved);
}
