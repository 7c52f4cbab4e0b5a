#!/usr/bin/env python3
"""Validate Crab evaluation trajectories (eval/trajectories/*.json) for real.

For each trajectory: check the format, start a fresh container from its image
with the private containerd, run every turn in order the way the in-sandbox
agent does, run `verify`, then compute a state digest (sha256 over the sorted
(relative path, mode, content) of state.paths minus state.volatile, plus the
stdout of state.probe) and print it.

  python3 hack/check-trajectories.py                 # all trajectories, once
  python3 hack/check-trajectories.py --twice         # two fresh containers each; digests must match
  python3 hack/check-trajectories.py --format-only   # only the static checks, no containers
  python3 hack/check-trajectories.py c-calc git-rebase -v

Every turn must exit 0 in a fault-free run (a failure that is part of the
story is written as `make; echo "exit=$?"`). Must run as root on the host
(needs `ctr` and /run/crab/containerd/containerd.sock). Containers are named
traj-<name>-<pid>-<n> and are always removed at the end.
"""
import argparse
import base64
import concurrent.futures
import glob
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAJ_DIR = os.path.join(ROOT, "eval", "trajectories")
SOCK = "/run/crab/containerd/containerd.sock"
NS = "crab"
CTR = ["ctr", "-a", SOCK, "-n", NS]

ENV = {
    "HOME": "/root",
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LC_ALL": "C.UTF-8",
    "TZ": "UTC",
    "SOURCE_DATE_EPOCH": "0",
    "PYTHONHASHSEED": "0",
    "PYTHONDONTWRITEBYTECODE": "1",
    "GIT_AUTHOR_NAME": "agent",
    "GIT_AUTHOR_EMAIL": "agent@example.com",
    "GIT_COMMITTER_NAME": "agent",
    "GIT_COMMITTER_EMAIL": "agent@example.com",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}
ENV_ARGS = ["env", "-i"] + ["%s=%s" % kv for kv in ENV.items()]
CMD_TIMEOUT = 60
CATEGORIES = {"build", "venv", "server", "git", "data", "repl", "read-heavy", "mixed"}

# Writes a file the way the agent's write_file tool does: path relative to
# the workdir (or absolute), parent dirs created, mode applied.
WRITE_PY = r"""
import base64, os, sys
wd, path, mode, data = sys.argv[1], sys.argv[2], int(sys.argv[3], 8), base64.b64decode(sys.argv[4])
os.makedirs(wd, exist_ok=True)
p = path if os.path.isabs(path) else os.path.join(wd, path)
d = os.path.dirname(p)
if d:
    os.makedirs(d, exist_ok=True)
with open(p, "wb") as f:
    f.write(data)
os.chmod(p, mode)
"""

# Runs inside the container: lists (relpath, mode, sha256) of the files,
# symlinks and directories under state.paths minus the volatile globs. Glob
# semantics (same as eval/src/state.rs): fnmatch on the path relative to the
# state path ('*' also matches '/'), also tried on '/' + rel (so a leading
# '**/' may match nothing) and on rel + '/' (so 'dir/**' drops dir itself).
DIGEST_PY = r"""
import fnmatch, hashlib, json, os, stat, sys
paths, volatile = json.loads(sys.argv[1]), json.loads(sys.argv[2])
def vol(rel):
    return any(fnmatch.fnmatch(rel, g) or fnmatch.fnmatch('/' + rel, g) or
               fnmatch.fnmatch(rel + '/', g) for g in volatile)
out = []
def add(base, full):
    rel = os.path.relpath(full, base)
    if vol(rel):
        return False
    st = os.lstat(full)
    mode = '%o' % stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        h = 'link:' + os.readlink(full)
    elif stat.S_ISREG(st.st_mode):
        with open(full, 'rb') as f:
            h = hashlib.sha256(f.read()).hexdigest()
    elif stat.S_ISDIR(st.st_mode):
        h = 'dir'
    elif stat.S_ISSOCK(st.st_mode):
        h = 'socket'
    else:
        h = 'special'
    out.append([base, rel, mode, h])
    return True
for base in paths:
    if not os.path.lexists(base):
        out.append([base, 'MISSING', '', ''])
        continue
    for dirpath, dirs, files in os.walk(base):
        dirs.sort()
        keep = [d for d in dirs if add(base, os.path.join(dirpath, d))]
        dirs[:] = [d for d in keep if not os.path.islink(os.path.join(dirpath, d))]
        for name in sorted(files):
            add(base, os.path.join(dirpath, name))
out.sort()
print(json.dumps(out))
"""

_lock = threading.Lock()


def log(msg):
    with _lock:
        print(msg, flush=True)


def ctr(args, timeout=120, check=True):
    r = subprocess.run(CTR + args, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError("ctr %s failed: %s" % (" ".join(args[:3]), r.stderr.strip()))
    return r


# ---------------------------------------------------------------- format
def think_ok(v):
    return isinstance(v, int) and 1000 <= v <= 10000


def check_format(path, doc):
    errs = []
    base = os.path.basename(path)[:-5]

    def need(key, typ):
        if key not in doc:
            errs.append("missing field %r" % key)
            return False
        if not isinstance(doc[key], typ):
            errs.append("field %r has wrong type" % key)
            return False
        return True

    if doc.get("format") != 1:
        errs.append("format must be 1")
    if need("name", str):
        if doc["name"] != base:
            errs.append("name %r != file name %r" % (doc["name"], base))
        if not re.fullmatch(r"[a-z0-9-]+", doc["name"]):
            errs.append("name must be [a-z0-9-]")
    need("title", str)
    if need("category", str) and doc["category"] not in CATEGORIES:
        errs.append("unknown category %r" % doc["category"])
    need("image", str)
    if need("workdir", str) and not doc["workdir"].startswith("/"):
        errs.append("workdir must be absolute")
    need("verify", str)
    if need("turns", list):
        n = len(doc["turns"])
        if not 20 <= n <= 100:
            errs.append("%d turns (need 20..100)" % n)
        for i, t in enumerate(doc["turns"]):
            if not isinstance(t, dict):
                errs.append("turn %d not an object" % i)
                continue
            if not think_ok(t.get("think_ms")):
                errs.append("turn %d think_ms %r out of [1000,10000]" % (i, t.get("think_ms")))
            tool = t.get("tool")
            if tool == "shell":
                if not isinstance(t.get("command"), str) or not t["command"].strip():
                    errs.append("turn %d: shell needs a command" % i)
                extra = set(t) - {"think_ms", "tool", "command"}
            elif tool == "write_file":
                if not isinstance(t.get("path"), str) or not t["path"]:
                    errs.append("turn %d: write_file needs a path" % i)
                if not isinstance(t.get("content"), str):
                    errs.append("turn %d: write_file needs content" % i)
                if "mode" in t and not re.fullmatch(r"0?[0-7]{3,4}", str(t["mode"])):
                    errs.append("turn %d: bad mode %r" % (i, t["mode"]))
                extra = set(t) - {"think_ms", "tool", "path", "content", "mode"}
            else:
                errs.append("turn %d: unknown tool %r" % (i, tool))
                extra = set()
            if extra:
                errs.append("turn %d: unknown fields %s" % (i, sorted(extra)))
    if need("state", dict):
        st = doc["state"]
        if not isinstance(st.get("paths"), list) or not st["paths"]:
            errs.append("state.paths must be a non-empty list")
        if not isinstance(st.get("volatile", []), list):
            errs.append("state.volatile must be a list")
        if "probe" in st and not isinstance(st["probe"], str):
            errs.append("state.probe must be a string")
    extra = set(doc) - {"format", "name", "title", "category", "image", "workdir", "turns", "verify", "state"}
    if extra:
        errs.append("unknown top-level fields %s" % sorted(extra))
    return errs


# ---------------------------------------------------------------- run
class Sandbox:
    counter = 0

    def __init__(self, name, image):
        with _lock:
            Sandbox.counter += 1
            n = Sandbox.counter
        self.id = "traj-%s-%d-%d" % (name, os.getpid(), n)
        self.image = image
        self.execs = 0

    def __enter__(self):
        ctr(["run", "-d", "--runtime", "io.containerd.runc.v2", self.image, self.id, "sleep", "infinity"])
        return self

    def __exit__(self, *exc):
        ctr(["task", "kill", "-s", "KILL", self.id], check=False)
        for _ in range(50):
            r = ctr(["task", "rm", self.id], check=False)
            if r.returncode == 0 or "not found" in r.stderr:
                break
            subprocess.run(["sleep", "0.1"])
        ctr(["c", "rm", self.id], check=False)

    def exec(self, argv, timeout=CMD_TIMEOUT):
        self.execs += 1
        eid = "traj-e%d" % self.execs
        try:
            r = subprocess.run(CTR + ["task", "exec", "--exec-id", eid, self.id] + argv,
                               capture_output=True, timeout=timeout + 5)
        except subprocess.TimeoutExpired:
            ctr(["task", "kill", "-s", "KILL", "--exec-id", eid, self.id], check=False)
            return 124, b"", b"timeout after %ds" % timeout
        return r.returncode, r.stdout, r.stderr

    def shell(self, workdir, command):
        # Not "cd WD && CMD": a CMD like "server & echo $! > pid" would then
        # put the cd into the background job and run the rest elsewhere.
        script = "mkdir -p %s && cd %s || exit 125\n%s" % (shlex.quote(workdir), shlex.quote(workdir), command)
        return self.exec(ENV_ARGS + ["timeout", "-s", "KILL", str(CMD_TIMEOUT), "sh", "-c", script])

    def write(self, workdir, path, content, mode):
        b64 = base64.b64encode(content.encode()).decode()
        return self.exec(ENV_ARGS + ["python3", "-c", WRITE_PY, workdir, path, mode, b64])


def run_once(doc, verbose):
    """Returns (digest, manifest, errors)."""
    wd = doc["workdir"]
    errs = []
    with Sandbox(doc["name"], doc["image"]) as sb:
        for i, t in enumerate(doc["turns"]):
            if t["tool"] == "shell":
                rc, out, err = sb.shell(wd, t["command"])
                what = t["command"].splitlines()[0][:70]
            else:
                rc, out, err = sb.write(wd, t["path"], t["content"], str(t.get("mode", "0644")))
                what = "write_file " + t["path"]
            if verbose:
                log("[%s] turn %d rc=%d: %s" % (doc["name"], i, rc, what))
                if verbose > 1:
                    log((out + err).decode(errors="replace").rstrip())
            if rc != 0:
                errs.append("turn %d exited %d: %s\n%s" % (i, rc, what, (out + err).decode(errors="replace")[-1500:]))
                return None, None, errs
        rc, out, err = sb.shell(wd, "sh -c %s" % shlex.quote(doc["verify"]))
        if rc != 0:
            errs.append("verify exited %d:\n%s" % (rc, (out + err).decode(errors="replace")[-1500:]))
        st = doc["state"]
        probe_out = b""
        if st.get("probe"):
            rc, probe_out, perr = sb.shell(wd, st["probe"])
            if rc != 0:
                errs.append("probe exited %d: %s" % (rc, (probe_out + perr).decode(errors="replace")[-800:]))
        rc, out, err = sb.exec(ENV_ARGS + ["python3", "-c", DIGEST_PY,
                                           json.dumps(st["paths"]), json.dumps(st.get("volatile", []))])
        if rc != 0:
            errs.append("digest failed: %s" % err.decode(errors="replace"))
            return None, None, errs
        manifest = json.loads(out)
        h = hashlib.sha256()
        for base, rel, mode, fh in manifest:
            h.update(("%s\0%s\0%s\0%s\n" % (base, rel, mode, fh)).encode())
        h.update(b"probe\0")
        h.update(probe_out)
        manifest.append(["probe", probe_out.decode(errors="replace"), "", ""])
        return h.hexdigest(), manifest, errs


def check_one(path, args):
    with open(path) as f:
        doc = json.load(f)
    name = os.path.basename(path)[:-5]
    errs = check_format(path, doc)
    if errs or args.format_only:
        return name, errs, None
    runs = 2 if args.twice else 1
    digests, manifests = [], []
    for _ in range(runs):
        d, m, e = run_once(doc, args.verbose)
        if e:
            return name, e, None
        digests.append(d)
        manifests.append(m)
    if runs == 2 and digests[0] != digests[1]:
        a = {tuple(x[:2]): x for x in manifests[0]}
        b = {tuple(x[:2]): x for x in manifests[1]}
        diff = []
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                diff.append("  %s: %s | %s" % (k, a.get(k, ["-"])[2:], b.get(k, ["-"])[2:]))
        return name, ["digests differ between runs:\n" + "\n".join(diff[:40])], digests
    return name, [], digests[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="trajectory names or JSON paths (default: all)")
    ap.add_argument("--twice", action="store_true", help="run in two fresh containers and compare digests")
    ap.add_argument("--format-only", action="store_true", help="static checks only")
    ap.add_argument("-j", "--jobs", type=int, default=3, help="trajectories checked in parallel")
    ap.add_argument("-v", "--verbose", action="count", default=0)
    args = ap.parse_args()

    if args.names:
        paths = [n if n.endswith(".json") else os.path.join(TRAJ_DIR, n + ".json") for n in args.names]
    else:
        paths = sorted(glob.glob(os.path.join(TRAJ_DIR, "*.json")))
    if not paths:
        sys.exit("no trajectories found")
    if not args.format_only and os.geteuid() != 0:
        sys.exit("must run as root (needs ctr)")

    failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        futs = [ex.submit(check_one, p, args) for p in paths]
        for fut in concurrent.futures.as_completed(futs):
            try:
                name, errs, digest = fut.result()
            except Exception as e:  # noqa: BLE001
                failed += 1
                log("ERROR %s" % e)
                continue
            if errs:
                failed += 1
                log("FAIL %s\n  %s" % (name, "\n  ".join(e.replace("\n", "\n    ") for e in errs)))
            else:
                log("ok   %-24s %s" % (name, digest or "format ok"))
    total = len(paths)
    print("%d passed, %d failed" % (total - failed, failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
