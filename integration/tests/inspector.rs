//! The inspector's soundness corpus: turn scripts with known effects, run in a
//! real container (python image, crab runtime, real containerd, real eBPF).
//!
//! For every case: a full checkpoint is the starting point; the turn runs
//! through `ctr task exec`; `crabctl turn` classifies it and takes the
//! checkpoint the policy asks for. The container's state is then probed (files
//! by content and metadata, processes by their command lines, a long-lived
//! process by its in-memory counter), the container is rolled back in place to
//! the turn's checkpoint, and probed again: the two probes must be equal. A
//! skipped turn rolls back to the previous checkpoint, so a missed change shows
//! up as a difference: a false negative fails the test.
//!
//! Each case also states the ground truth (what really changed). A
//! classification above it is a false positive: counted and printed.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use crab_integration::{crabctl, crabctl_ok, text, Guard, CRAB, PYTHON};
use serde_json::Value;

/// What a turn needs: nothing, files, processes, or both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Need {
    Skip,
    Fs,
    Proc,
    Full,
}

impl Need {
    fn of(kind: &str) -> Need {
        match kind {
            "skip" => Need::Skip,
            "fs-only" => Need::Fs,
            "process-only" => Need::Proc,
            "full" => Need::Full,
            other => panic!("unknown kind {other}"),
        }
    }

    /// Whether a checkpoint of kind `self` holds everything `truth` needs.
    fn covers(self, truth: Need) -> bool {
        match (self, truth) {
            (_, Need::Skip) | (Need::Full, _) => true,
            (a, b) => a == b,
        }
    }
}

struct Case {
    name: &'static str,
    /// Runs before the starting checkpoint.
    setup: &'static str,
    /// The turn.
    turn: &'static str,
    /// What really changed.
    truth: Need,
}

const fn case(name: &'static str, setup: &'static str, turn: &'static str, truth: Need) -> Case {
    Case {
        name,
        setup,
        turn,
        truth,
    }
}

fn corpus() -> Vec<Case> {
    use Need::*;
    vec![
        // read-only work
        case("cat a file", "", "cat /etc/os-release", Skip),
        case("grep recursively", "", "grep -r root /etc >/dev/null || true", Skip),
        case("ls a tree", "", "ls -laR /usr/lib/python3.11/json >/dev/null", Skip),
        case("find from the root", "", "find / -xdev -name '*.conf' >/dev/null", Skip),
        case("a tool's --version", "", "python3 --version && git --version", Skip),
        case("python reads json", "", "python3 -c \"import json; json.load(open('/sandbox/data.json'))\"", Skip),
        case("git log and diff", "", "cd /sandbox/repo && git log --oneline && git diff HEAD~0 --stat", Skip),
        case("checksums", "", "sha256sum /usr/bin/* >/dev/null", Skip),
        // plain writes
        case("redirect to a new file", "", "echo hello > /sandbox/new.txt", Fs),
        case("append to a file", "", "echo more >> /sandbox/notes.txt", Fs),
        case("sed -i", "", "sed -i s/old/new/ /sandbox/notes.txt", Fs),
        case("tar extract", "", "mkdir -p /sandbox/x && tar -xf /sandbox/src.tar -C /sandbox/x", Fs),
        case(
            "install a package into a venv from a local wheel",
            "",
            "cd /sandbox/venv/lib/python3.11/site-packages && python3 -m zipfile -e /sandbox/pkg.whl . && /sandbox/venv/bin/python -c 'import crabpkg'",
            Fs,
        ),
        case(
            "git commit",
            "",
            "cd /sandbox/repo && echo change >> README && git commit -qam change",
            Fs,
        ),
        case("python writes a file", "", "python3 -c \"open('/sandbox/out.json','w').write('{}')\"", Fs),
        case("mkdir", "", "mkdir /sandbox/emptydir", Fs),
        case("rm an existing file", "echo x > /sandbox/old.txt", "rm /sandbox/old.txt", Fs),
        case("cp a file", "", "cp /etc/os-release /sandbox/os-release", Fs),
        // transient files
        case("mktemp then rm", "", "f=$(mktemp) && echo x > $f && rm $f", Skip),
        case(
            "a build dir created and removed",
            "",
            "mkdir -p /sandbox/build/obj && cd /sandbox/build && echo x > obj/a.o && tar -cf out.tar obj && cd / && rm -rf /sandbox/build",
            Skip,
        ),
        case(
            "a temp dir with files",
            "",
            "d=$(mktemp -d) && for i in 1 2 3; do echo $i > $d/$i; done && rm -r $d",
            Skip,
        ),
        case(
            "python TemporaryFile (O_TMPFILE)",
            "",
            "python3 -c \"import tempfile; f = tempfile.TemporaryFile(); f.write(b'x' * 4096); f.close()\"",
            Skip,
        ),
        // processes
        // http.server wakes twice a second: while it runs, every turn is
        // process-only. The next case stops it.
        case(
            "a background daemon started",
            "",
            "nohup python3 -m http.server 8000 --bind 127.0.0.1 </dev/null >/dev/null 2>&1 & echo $! > /dev/shm/http.pid",
            Proc,
        ),
        case(
            "a background daemon killed",
            "",
            "kill $(cat /dev/shm/http.pid) && sleep 0.3",
            Proc,
        ),
        case("a short-lived process tree", "", "sh -c 'sh -c \"ls / | wc -l\"' >/dev/null", Skip),
        case("python subprocess", "", "python3 -c \"import subprocess; subprocess.run(['true'])\"", Skip),
        case("a background job that ends within the turn", "", "(sleep 0.1 &) ; sleep 0.4", Skip),
        case(
            "a long-lived process's memory changes on a signal",
            "",
            "kill -USR1 $(cat /sandbox/counter.pid) && sleep 0.2",
            Proc,
        ),
        case(
            "data left queued in a daemon's fifo",
            "",
            "echo queued > /sandbox/fifo",
            Proc,
        ),
        case(
            "a write into a survivor's deleted-but-open file",
            "",
            "echo more >> /proc/$(cat /sandbox/ghost.pid)/fd/3",
            Proc,
        ),
        // tricky cases
        case(
            "write through a shared mmap",
            "",
            "python3 -c \"import mmap; f=open('/sandbox/mapped.bin','r+b'); m=mmap.mmap(f.fileno(), 4096); m[0:5]=b'HELLO'; m.flush()\"",
            Fs,
        ),
        // linkat(fd, "", AT_EMPTY_PATH): linking through /proc/self/fd fails
        // with EXDEV in these containers.
        case(
            "O_TMPFILE then linkat",
            "",
            "python3 -c \"import os, ctypes; libc = ctypes.CDLL(None, use_errno=True); fd = os.open('/sandbox', os.O_TMPFILE | os.O_WRONLY, 0o644); os.write(fd, b'tmp'); assert libc.linkat(fd, b'', -100, b'/sandbox/linked', 0x1000) == 0\"",
            Fs,
        ),
        case("rename over an existing file", "", "echo new > /sandbox/cfg.tmp && mv /sandbox/cfg.tmp /sandbox/cfg", Fs),
        case("a hard link", "", "ln /sandbox/notes.txt /sandbox/notes-link", Fs),
        case(
            "truncate to the same size",
            "",
            "truncate -s $(stat -c %s /sandbox/notes.txt) /sandbox/notes.txt",
            Fs,
        ),
        case("chmod only", "", "chmod 600 /sandbox/notes.txt", Fs),
        case(
            "xattr only",
            "",
            "python3 -c \"import os; os.setxattr('/sandbox/notes.txt', 'user.crab', b'v')\"",
            Fs,
        ),
        case("times only", "", "touch -d 2001-01-01 /sandbox/notes.txt", Fs),
        case("a symlink", "", "ln -s /etc/os-release /sandbox/link", Fs),
        case("a write to /dev/shm", "", "echo x > /dev/shm/state", Proc),
        case("a write to a bind-mounted host volume", "", "echo x > /data/out", Skip),
        case(
            "files and processes at once",
            "",
            "echo both > /sandbox/both && nohup sleep 100000 </dev/null >/dev/null 2>&1 &",
            Full,
        ),
    ]
}

/// Prepares /sandbox once: data files, a git repo, a venv, a wheel, a tarball,
/// and the long-lived processes some cases poke at.
const PREPARE: &str = r#"
set -e
mkdir -p /sandbox && cd /sandbox
echo '{"a": 1}' > data.json
printf 'old line\n' > notes.txt
echo one > cfg
head -c 4096 /dev/zero > mapped.bin
mkdir -p src && echo 'int main(void){return 0;}' > src/main.c && tar -cf src.tar src && rm -r src
git init -q repo && cd repo && git config user.email a@b && git config user.name a
echo readme > README && git add README && git commit -qm init && cd /sandbox
python3 -m venv --without-pip venv
mkdir -p wheel/crabpkg && echo 'X = 1' > wheel/crabpkg/__init__.py
(cd wheel && python3 -m zipfile -c ../pkg.whl crabpkg) && rm -r wheel
mkfifo fifo
cat > counter.py <<'EOF'
import os, signal, time
count = 0
def bump(*_):
    global count
    count += 1
def report(*_):
    with open('/sandbox/counter.report', 'w') as f:
        f.write(str(count))
signal.signal(signal.SIGUSR1, bump)
signal.signal(signal.SIGUSR2, report)
while True:
    signal.pause()
EOF
nohup python3 counter.py </dev/null >/dev/null 2>&1 & echo $! > counter.pid
nohup python3 -c "import os, time; fd = os.open('/sandbox/fifo', os.O_RDWR); time.sleep(10**6)" </dev/null >/dev/null 2>&1 &
nohup python3 -c "
import os, time
fd = os.open('/sandbox/ghost', os.O_RDWR | os.O_CREAT, 0o600)
os.dup2(fd, 3)
os.unlink('/sandbox/ghost')
time.sleep(10**6)
" </dev/null >/dev/null 2>&1 & echo $! > ghost.pid
sleep 0.5
"#;

/// Prints the container's state as JSON: files (content for everything outside
/// /usr, metadata for all; directory times are left out, as transient files
/// change them), processes by command line, and the counter process's count.
const PROBE: &str = r#"
import fcntl, hashlib, json, os, signal, stat, termios, time
me = os.getpid()
files = {}
def walk(top, skip):
    for d, dirs, names in os.walk(top):
        dirs[:] = [x for x in dirs if os.path.join(d, x) not in skip]
        for n in dirs + names:
            p = os.path.join(d, n)
            if p in skip:
                continue
            st = os.lstat(p)
            e = [stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid]
            if stat.S_ISLNK(st.st_mode):
                e.append(os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                # CRIU saves tmpfs with tar: whole-second times come back.
                mtime = st.st_mtime_ns // 10**9 if p.startswith('/dev/shm/') else st.st_mtime_ns
                e += [st.st_size, mtime, st.st_nlink]
                if not p.startswith('/usr/'):
                    with open(p, 'rb') as f:
                        e.append(hashlib.sha256(f.read()).hexdigest())
            try:
                e.append(sorted((k, os.getxattr(p, k, follow_symlinks=False).hex())
                                for k in os.listxattr(p, follow_symlinks=False)))
            except OSError:
                pass
            files[p] = e
skip = {'/proc', '/sys', '/dev', '/data', '/sandbox/counter.report'}
walk('/', skip)
walk('/dev/shm', set())
procs = []
for p in os.listdir('/proc'):
    if not p.isdigit() or int(p) == me:
        continue
    try:
        cmd = open('/proc/%s/cmdline' % p, 'rb').read().replace(b'\0', b' ').decode()
    except OSError:
        continue
    if not cmd or 'PROBE' in cmd:
        continue
    # What the process holds that no path shows: deleted files' content, and
    # bytes waiting in its pipes.
    held = []
    try:
        fds = sorted(os.listdir('/proc/%s/fd' % p), key=int)
    except OSError:
        fds = []
    for fd in fds:
        link = '/proc/%s/fd/%s' % (p, fd)
        try:
            target = os.readlink(link)
            if target.endswith(' (deleted)'):
                with open(link, 'rb') as f:
                    held.append([fd, hashlib.sha256(f.read()).hexdigest()])
            elif target.startswith('pipe:') or stat.S_ISFIFO(os.stat(link).st_mode):
                r = os.open(link, os.O_RDONLY | os.O_NONBLOCK)
                n = fcntl.ioctl(r, termios.FIONREAD, b'\0\0\0\0')
                os.close(r)
                held.append([fd, int.from_bytes(n, 'little')])
        except OSError:
            pass
    procs.append([int(p), cmd, held])
count = None
try:
    pid = int(open('/sandbox/counter.pid').read())
    os.kill(pid, signal.SIGUSR2)
    for _ in range(100):
        time.sleep(0.02)
        try:
            if os.stat('/sandbox/counter.report').st_mtime_ns > 0:
                count = open('/sandbox/counter.report').read()
                if count:
                    break
        except OSError:
            pass
    os.unlink('/sandbox/counter.report')
except (OSError, ValueError):
    pass
print(json.dumps({'files': files, 'procs': sorted(procs), 'count': count}))
# PROBE
"#;

fn probe(g: &Guard) -> Value {
    let out = g.exec_ok(&["python3", "-c", PROBE]);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("probe output: {e}: {out}"))
}

fn sh(g: &Guard, script: &str) {
    if !script.is_empty() {
        g.exec_ok(&["sh", "-c", script]);
    }
}

/// What differs between two probes, for the failure message.
fn diff(a: &Value, b: &Value) -> String {
    let mut out = Vec::new();
    let (fa, fb) = (&a["files"], &b["files"]);
    if let (Some(fa), Some(fb)) = (fa.as_object(), fb.as_object()) {
        for (k, v) in fa {
            match fb.get(k) {
                None => out.push(format!("only live: {k}")),
                Some(w) if w != v => out.push(format!("differs: {k}: {v} vs {w}")),
                _ => {}
            }
        }
        for k in fb.keys().filter(|k| !fa.contains_key(*k)) {
            out.push(format!("only restored: {k}"));
        }
    }
    if a["procs"] != b["procs"] {
        out.push(format!("processes: {} vs {}", a["procs"], b["procs"]));
    }
    if a["count"] != b["count"] {
        out.push(format!("counter: {} vs {}", a["count"], b["count"]));
    }
    out.join("\n")
}

/// `crabctl rollback`; on failure, the CRIU log's tail is in the panic message.
fn rollback(g: &Guard, entry: &str) {
    let out = crabctl(&["rollback", &g.id, entry], &[]);
    if out.status.success() {
        return;
    }
    let (o, e) = text(&out);
    let log = e
        .split("(log: ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|p| std::fs::read_to_string(p).ok())
        .map(|l| l.lines().rev().take(40).collect::<Vec<_>>().join("\n"))
        .unwrap_or_default();
    panic!(
        "rollback of {} to {entry}: {o}{e}\nlog tail (newest first):\n{log}",
        g.id
    );
}

#[test]
fn every_turn_of_the_corpus_restores_exactly_and_false_positives_are_counted() {
    let host_dir = tempfile::tempdir().unwrap();
    let bind = format!(
        "type=bind,src={},dst=/data,options=rbind:rw",
        host_dir.path().display()
    );
    let g = Guard::run_detached(CRAB, PYTHON, &["--mount", &bind], &["sleep", "infinity"]);
    sh(&g, PREPARE);
    let cases = corpus();
    assert!(cases.len() >= 40, "the corpus has {} cases", cases.len());
    let mut false_positives = Vec::new();
    let mut failures = Vec::new();
    // CRAB_CORPUS_FROM=N starts at case N (when chasing one case).
    let from: usize = std::env::var("CRAB_CORPUS_FROM")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    for (i, c) in cases.iter().enumerate().skip(from) {
        sh(&g, c.setup);
        crabctl_ok(&["checkpoint", &g.id, "--kind", "full"]);
        sh(&g, c.turn);
        let out = crabctl_ok(&["turn", &g.id, "--json"]);
        let v: Value = serde_json::from_str(&out).unwrap();
        let kind = v["classification"]["kind"].as_str().unwrap().to_string();
        let got = Need::of(&kind);
        let entry = v["entry"]["name"].as_str().unwrap().to_string();
        if !got.covers(c.truth) {
            failures.push(format!(
                "case {i} {:?}: classified {kind}, needs {:?}: {}",
                c.name, c.truth, v["classification"]
            ));
            continue;
        }
        if got != c.truth {
            false_positives.push(format!(
                "{:?}: {kind} for {:?} ({})",
                c.name, c.truth, v["classification"]["reasons"]
            ));
        }
        let live = probe(&g);
        rollback(&g, &entry);
        let restored = probe(&g);
        if live != restored {
            failures.push(format!(
                "case {i} {:?} ({kind}): the state after rollback differs:\n{}",
                c.name,
                diff(&live, &restored)
            ));
        }
        eprintln!(
            "case {i:2} {:50} {kind:12} {}",
            c.name, v["classification"]["reasons"]
        );
    }
    eprintln!(
        "inspector corpus: {} cases, {} false positives ({:.0}%), {} failures",
        cases.len(),
        false_positives.len(),
        100.0 * false_positives.len() as f64 / cases.len() as f64,
        failures.len()
    );
    for f in &false_positives {
        eprintln!("  false positive: {f}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The bind-mounted volume is outside the checkpoint: the write stays.
    assert!(host_dir.path().join("out").exists());
}

/// containerd's Checkpoint (through the shim's task API, as containerd calls
/// it) into `dir`; returns the manifest.
fn containerd_checkpoint(g: &Guard, dir: &std::path::Path) -> Value {
    use crab_integration::ttrpc::{pb_bytes, shim_call};
    let mut request = Vec::new();
    pb_bytes(&mut request, 1, g.id.as_bytes());
    pb_bytes(&mut request, 2, dir.display().to_string().as_bytes());
    let (code, message) = shim_call(&g.id, "Checkpoint", &request);
    assert_eq!(code, 0, "checkpoint failed: {message}");
    let text = std::fs::read_to_string(dir.join("crab-checkpoint.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn containerd_checkpoints_of_an_unchanged_container_reuse_the_last_one_and_a_change_dumps_again() {
    let g = Guard::run_detached(CRAB, PYTHON, &[], &["sleep", "infinity"]);
    g.exec_ok(&["sh", "-c", "echo one > /root/a"]);
    let base = tempfile::tempdir().unwrap();
    let first = containerd_checkpoint(&g, &base.path().join("1"));
    // Nothing changed: the same artifact, down to its creation time.
    let second = containerd_checkpoint(&g, &base.path().join("2"));
    assert_eq!(second["created_ms"], first["created_ms"], "{second}");
    // CRIU's images at the top, as runc's.
    assert!(base.path().join("2/inventory.img").is_file());
    // Read-only work is still no change.
    g.exec_ok(&["sh", "-c", "cat /root/a; ls -R /etc >/dev/null"]);
    let third = containerd_checkpoint(&g, &base.path().join("3"));
    assert_eq!(third["created_ms"], first["created_ms"]);
    // A write: a new dump, and the new content is in its file delta.
    g.exec_ok(&["sh", "-c", "echo two > /root/a"]);
    let fourth = containerd_checkpoint(&g, &base.path().join("4"));
    assert_ne!(fourth["created_ms"], first["created_ms"], "{fourth}");
    let out = std::process::Command::new("tar")
        .arg("-xOf")
        .arg(base.path().join("4/rootfs-diff.tar"))
        .args(["--wildcards", "*root/a"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "two\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A checkpoint in Crab's history in between makes the kept one stale.
    crabctl_ok(&["checkpoint", &g.id, "--kind", "fs-only"]);
    let fifth = containerd_checkpoint(&g, &base.path().join("5"));
    assert_ne!(fifth["created_ms"], fourth["created_ms"]);
}

#[test]
fn with_turn_on_exec_each_exec_that_ends_closes_a_turn() {
    use crab_integration::{config_with, wait_until};
    let config = config_with("[policy]\nturn_on_exec = true");
    let path = config.display().to_string();
    let g = Guard::run_detached(
        CRAB,
        PYTHON,
        &["--runtime-config-path", &path],
        &["sleep", "infinity"],
    );
    let kinds = |g: &Guard| -> Vec<String> {
        let out = crabctl_ok(&["ls", &g.id, "--json"]);
        let v: Vec<Value> = serde_json::from_str(&out).unwrap();
        v.iter()
            .map(|e| e["kind"].as_str().unwrap_or("").to_string())
            .collect()
    };
    let wait_for = |g: &Guard, n: usize| {
        assert!(
            wait_until(std::time::Duration::from_secs(20), || kinds(g).len() >= n),
            "{:?}",
            kinds(g)
        );
    };
    // The first tool call: the first checkpoint is full.
    g.exec_ok(&["sh", "-c", "echo one > /root/a"]);
    wait_for(&g, 1);
    // A read-only call: skip. A write: fs-only.
    g.exec_ok(&["cat", "/root/a"]);
    wait_for(&g, 2);
    g.exec_ok(&["sh", "-c", "echo two >> /root/a"]);
    wait_for(&g, 3);
    assert_eq!(
        kinds(&g)[..3],
        ["full", "skip", "fs-only"],
        "{:?}",
        kinds(&g)
    );
}

#[test]
fn a_file_system_rollback_through_crabctl_makes_the_next_turn_take_the_files() {
    let g = Guard::run_detached(CRAB, PYTHON, &[], &["sleep", "infinity"]);
    let kind = |g: &Guard| -> String {
        let out = crabctl_ok(&["turn", &g.id, "--dry-run", "--json"]);
        let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        v["classification"]["kind"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    crabctl_ok(&["fs", "snapshot", &g.id, "before"]);
    sh(&g, "echo kept > /root/made-after-the-snapshot");
    crabctl_ok(&["checkpoint", &g.id]);
    // Nothing changed since the checkpoint: a skip (so the check below can fail).
    assert_eq!(kind(&g), "skip");
    // The tree goes back to before the file was made: the checkpoint no longer
    // describes it, so the next turn must not be skipped.
    let out = crabctl_ok(&["fs", "rollback", &g.id, "before"]);
    assert!(out.contains("rolled back to before"), "{out}");
    let gone = g.exec(&["cat", "/root/made-after-the-snapshot"]);
    assert!(
        !gone.status.success(),
        "the rollback left the file in place"
    );
    let after = kind(&g);
    assert_ne!(
        after, "skip",
        "a turn after an fs rollback was classified skip"
    );
}

/// The classification of a turn, as `crabctl turn --dry-run` gives it: its kind
/// and its reasons.
fn classification(g: &Guard) -> (String, String) {
    let out = crabctl_ok(&["turn", &g.id, "--dry-run", "--json"]);
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let c = &v["classification"];
    // The tasks go with the reasons: a failure says which task ran.
    (
        c["kind"].as_str().unwrap_or_default().to_string(),
        format!("{} {}", c["reasons"], c["tasks"]),
    )
}

/// Issue 17 item 9: one sandbox making 70 000 files (more than the host's table
/// used to hold for every sandbox together) overflows its own budget and gets a
/// full checkpoint; another sandbox's turn that wrote one file is still fs-only.
#[test]
fn seventy_thousand_files_in_one_sandbox_leave_another_sandboxs_turn_classified() {
    let noisy = Guard::run_detached(CRAB, PYTHON, &[], &["sleep", "infinity"]);
    let quiet = Guard::run_detached(CRAB, PYTHON, &[], &["sleep", "infinity"]);
    // Recording starts at each one's first full checkpoint.
    crabctl_ok(&["checkpoint", &noisy.id]);
    crabctl_ok(&["checkpoint", &quiet.id]);
    noisy.exec_ok(&[
        "python3",
        "-c",
        "import os\nos.mkdir('/many')\nfor i in range(70000):\n    open(f'/many/f{i}', 'w').close()",
    ]);
    sh(&quiet, "echo one > /root/one-file");
    let (kind, reasons) = classification(&quiet);
    assert_eq!(kind, "fs-only", "{reasons}");
    let (kind, reasons) = classification(&noisy);
    assert_eq!(kind, "full", "{reasons}");
    println!("70 000 files: the noisy sandbox {kind} ({reasons}); the quiet one fs-only");
    // The full checkpoint lets the noisy one be classified again.
    crabctl_ok(&["checkpoint", &noisy.id]);
    sh(&noisy, "echo one > /root/after");
    let (kind, reasons) = classification(&noisy);
    assert_eq!(kind, "fs-only", "after the full checkpoint: {reasons}");
}
