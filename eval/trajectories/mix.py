#!/usr/bin/env python3
"""Measures the mix of the hand-written trajectories (eval/trajectories/*.json).

Run: python3 eval/trajectories/mix.py [--per-trajectory]
Prints a markdown table: per category and overall, turns per trajectory
(median, min, max), think time per turn (median, p90), and the share of turns
that are read-only commands, file writes, server starts and package installs.
Python 3 standard library only; reads the JSON files, not gen.py.

Heuristic (per turn; a turn is one tool call):

- write: a `write_file` turn, or a shell command with an output redirection to
  a file (`>`, `>>`, `tee`; `>/dev/null` and `2>&1` do not count) or a heredoc.
  A turn can be both a write and a server start; write turns are never
  read-only.
- read-only: a shell command none of whose pipeline stages can change
  anything: every stage (split at `&&`, `||`, `;`, `|`, newlines; `cd` and
  variable assignments skipped) runs a reading program (READ_PROGRAMS: ls,
  cat, grep, head, tail, wc, find without -delete/-exec, sort, diff, ...),
  `sed` without `-i`, `git` with a reading subcommand (log, status, diff,
  show, ...), `sqlite3 -readonly` or a bare SELECT, `pip list/show/check`,
  `python3 -c CODE` whose CODE has no writing call (open for writing,
  write, remove, sockets, subprocess, ...) or `python3 --version`/`-m zipfile
  -l`, any program asked only for its version (`tcc -v`), or a local
  client script (`python3 x.py`, `./x`) whose first argument
  is a query verb (GET, KEYS, DUMP, LIST, STATS, ...), and has no redirection
  to a file. Everything else counts as changing state (running make, a test,
  a script, a daemon command), so the read-only share is a lower bound.
- server: a command that starts a process in the background: `nohup`, a
  trailing `&`, `setsid`, `daemon`, `--daemon`, `docker run -d`, `serve`.
- install: `pip install`, `apt-get install`/`apt install`, `npm install`,
  `cargo install`, `go install`, `gem install`, `uv pip install`.

gen.py also tags turns read-only where it writes them (the README table);
this script does not use those tags, so it can be applied to any trajectory
in the same format, e.g. one converted from a public agent log.
"""
import glob
import json
import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

READ_PROGRAMS = {
    "ls", "cat", "grep", "egrep", "fgrep", "rg", "head", "tail", "wc", "find",
    "file", "stat", "du", "df", "pwd", "which", "type", "echo", "printf",
    "sort", "uniq", "cut", "tr", "awk", "diff", "cmp", "sha256sum", "md5sum",
    "tree", "less", "more", "env", "true", "test", "[", "column", "nl", "od",
    "xxd", "hexdump", "readlink", "realpath", "basename", "dirname", "date",
    "id", "uname", "ps", "jq", "strings", "comm", "join", "paste", "expr",
    "seq", "tac", "zcat", "unzip", "tar", "curl", "wget", "nm", "objdump",
    "ldd", "python3 --version", "python --version", "exit", "sleep",
}
GIT_READ = {"log", "status", "diff", "show", "branch", "tag", "rev-parse",
            "ls-files", "grep", "blame", "shortlog", "describe", "reflog",
            "cat-file", "ls-tree", "remote", "config", "stash"}
QUERY_VERBS = {"GET", "KEYS", "DUMP", "LIST", "STATS", "SHOW", "HEALTH",
               "COUNT", "QUERY", "PING", "SUMMARY", "REPORT", "SERIES",
               "MEAN", "STAT", "VARS", "EVAL?"}
PY_WRITES = re.compile(
    r"""\.write|open\([^)]*['"][wax+]|remove|unlink|mkdir|rename|rmtree|"""
    r"""shutil|subprocess|os\.system|socket|commit|INSERT|UPDATE|DELETE|"""
    r"""urlopen\([^)]*data|\.send|setattr|dump\(""")
INSTALL = re.compile(
    r"\b(pip3?|uv pip) install\b|\bapt(-get)? install\b|\bnpm (i|install)\b|"
    r"\b(cargo|go|gem) install\b|-m pip install\b")
SERVER = re.compile(r"\bnohup\b|\bsetsid\b|\bdaemon\b|--daemon\b|\bserve\b|"
                    r"\b(docker|podman|ctr|nerdctl) run\b[^\n]*\s-d\b|(^|[^&])&\s*($|\n)")


def strip_heredocs(cmd):
    """Drops heredoc bodies; returns (command, had_heredoc)."""
    out, lines, had = [], cmd.split("\n"), False
    i = 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        m = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
        i += 1
        if m:
            had = True
            while i < len(lines) and lines[i].strip() != m.group(1):
                i += 1
            i += 1
    return "\n".join(out), had


def split_stages(cmd):
    """Splits at unquoted &&, ||, ;, |, & and newlines; keeps quoted text."""
    stages, cur, q, i = [], "", None, 0
    while i < len(cmd):
        c = cmd[i]
        if q:
            cur += c
            if c == q:
                q = None
            elif c == "\\" and q == '"' and i + 1 < len(cmd):
                cur += cmd[i + 1]
                i += 1
        elif c in "'\"":
            q = c
            cur += c
        elif c in ";|\n" or (c == "&" and cmd[i + 1:i + 2] != ">" and cmd[i - 1:i] not in (">", "<")):
            stages.append(cur)
            cur = ""
            if cmd[i + 1:i + 2] in ("&", "|"):
                i += 1
        else:
            cur += c
        i += 1
    stages.append(cur)
    return [s.strip() for s in stages if s.strip()]


def unquoted(s):
    return re.sub(r"'[^']*'|\"(\\.|[^\"\\])*\"", "''", s)


def redirects_to_file(stage):
    u = unquoted(stage)
    for m in re.finditer(r"(\d?)>>?\s*(&?\S*)", u):
        target = m.group(2)
        if target.startswith("&") or target == "/dev/null":
            continue
        return True
    return bool(re.search(r"\btee\b", u))


def words(stage):
    w = re.findall(r"'[^']*'|\"(?:\\.|[^\"\\])*\"|\S+", stage)
    while w and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w[0]):
        w = w[1:]
    return w


def stage_reads(stage):
    w = words(stage)
    while w and w[0] in ("do", "then", "else", "!"):
        w = w[1:]  # a loop's or an if's body is judged by its command
    if not w or w[0] in ("cd", "set", "done", "fi", "esac"):
        return True
    prog = os.path.basename(w[0])
    args = w[1:]
    if prog in ("for", "while", "if", "read"):
        return True  # loop headers; their bodies are stages of their own
    if len(args) == 1 and args[0] in ("--version", "-v", "-V", "version"):
        return True  # a version query
    if prog == "dpkg":
        return args[:1] in (["-S"], ["-l"], ["-L"], ["-s"])
    if prog == "command" or prog == "apt-cache":
        return True
    if prog == "find":
        return not any(a in ("-delete", "-exec", "-execdir") for a in args)
    if prog == "sed":
        return not any(a.startswith("-i") for a in args)
    if prog == "git":
        sub = next((a for a in args if not a.startswith("-")), "")
        if sub in ("branch", "tag", "stash", "remote", "config"):
            return sub != "stash" and all(a.startswith("-") and a not in ("-d", "-D", "-m", "-M", "-f") for a in args[1:]) or args[1:2] == ["list"]
        return sub in GIT_READ
    if prog == "sqlite3":
        sql = " ".join(args).upper()
        return "-READONLY" in sql or (re.search(r"\bSELECT\b", sql) and not re.search(r"\b(INSERT|UPDATE|DELETE|CREATE|DROP|ALTER)\b", sql))
    if prog in ("pip", "pip3") or (prog == "python3" and args[:2] == ["-m", "pip"]):
        rest = args[2:] if prog == "python3" else args
        sub = next((a for a in rest if not a.startswith("-")), "")
        return sub in ("list", "show", "check", "freeze") or rest[:1] == ["--version"]
    if prog.startswith("python"):
        if args[:1] in (["--version"], ["-V"]):
            return True
        if args[:1] == ["-c"] and len(args) > 1:
            return not PY_WRITES.search(args[1])
        if args[:3] == ["-m", "zipfile", "-l"] or args[:2] == ["-m", "json.tool"]:
            return True
        script = next((a for a in args if not a.startswith("-")), None)
        if script and script.endswith(".py"):
            i = args.index(script)
            return args[i + 1:i + 2] != [] and args[i + 1].strip("'\"") in QUERY_VERBS
        return False
    if w[0].startswith("./"):
        return bool(args) and args[0].strip("'\"") in QUERY_VERBS
    return prog in READ_PROGRAMS


def classify(turn):
    """Returns a set of labels for one turn: read-only / write / server / install."""
    if turn["tool"] == "write_file":
        return {"write"}
    cmd, heredoc = strip_heredocs(turn["command"])
    labels = set()
    stages = split_stages(cmd)
    if heredoc or any(redirects_to_file(s) for s in stages):
        labels.add("write")
    if INSTALL.search(cmd):
        labels.add("install")
    if SERVER.search(unquoted(cmd)):
        labels.add("server")
    if "write" not in labels and "server" not in labels and all(stage_reads(s) for s in stages):
        labels.add("read-only")
    return labels


def pct(xs, p):
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    f = int(k)
    c = min(f + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


def load():
    out = []
    for f in sorted(glob.glob(os.path.join(HERE, "*.json"))):
        with open(f) as fh:
            t = json.load(fh)
        if isinstance(t, dict) and "turns" in t:
            out.append(t)
    return out


def row(name, trajs):
    turns = [len(t["turns"]) for t in trajs]
    think = [u["think_ms"] / 1000 for t in trajs for u in t["turns"]]
    labels = [classify(u) for t in trajs for u in t["turns"]]
    n = len(labels)

    def share(l):
        return f"{100 * sum(l in x for x in labels) / n:.0f}%"

    def count(l):
        return str(sum(l in x for x in labels))

    return [name, str(len(trajs)),
            f"{statistics.median(turns):g} ({min(turns)}-{max(turns)})",
            f"{statistics.median(think):.1f} / {pct(think, 90):.1f}",
            share("read-only"), share("write"), count("server"), count("install")]


def main():
    trajs = load()
    cats = sorted({t["category"] for t in trajs})
    head = ["category", "trajectories", "turns median (min-max)",
            "think s median / p90", "read-only turns", "write turns",
            "server starts", "package installs"]
    rows = [row(c, [t for t in trajs if t["category"] == c]) for c in cats]
    rows.append(row("**all**", trajs))
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    if "--per-trajectory" in sys.argv:
        print()
        print("| name | turns | read-only | write | server | install |")
        print("|---|---|---|---|---|---|")
        for t in trajs:
            labels = [classify(u) for u in t["turns"]]
            n = len(labels)
            print(f"| {t['name']} | {n} | {100 * sum('read-only' in x for x in labels) / n:.0f}% | "
                  f"{100 * sum('write' in x for x in labels) / n:.0f}% | "
                  f"{sum('server' in x for x in labels)} | {sum('install' in x for x in labels)} |")
    if "--explain" in sys.argv:
        for t in trajs:
            for u in t["turns"]:
                what = u.get("command", "WRITE " + u.get("path", ""))
                print(f"{t['name']:20} {','.join(sorted(classify(u))) or '-':16} {what[:90]!r}")


if __name__ == "__main__":
    main()
