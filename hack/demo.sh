#!/usr/bin/env bash
# The demo: on a fresh machine, installs everything (hack/setup.sh), starts a private
# containerd on its own socket with the crab runtime available, and walks through a
# container's life under `io.containerd.crab.v2`. The host's containerd and its
# configuration are never touched; the private containerd is stopped at the end.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

step() { printf '\n\033[1;36m== %s\033[0m\n' "$*"; }
show() { printf '\033[2m$ %s\033[0m\n' "$*"; "$@"; }

"$ROOT/hack/setup.sh"

export CRAB_CONFIG=/var/lib/crab/demo/config.toml
mkdir -p "$(dirname "$CRAB_CONFIG")"
cat >"$CRAB_CONFIG" <<'TOML'
state_dir = "/run/crab/state-demo"
TOML
"$ROOT/hack/containerd.sh" stop >/dev/null 2>&1 || true
"$ROOT/hack/containerd.sh" start >/dev/null
eval "$("$ROOT/hack/containerd.sh" env)"
ID=crab-demo
C=(ctr --address "$CRAB_CONTAINERD_ADDRESS" --namespace "$CRAB_NAMESPACE")
cleanup() {
    "${C[@]}" task kill -s KILL "$ID" >/dev/null 2>&1 || true
    "${C[@]}" task rm -f "$ID" >/dev/null 2>&1 || true
    "${C[@]}" container rm "$ID" >/dev/null 2>&1 || true
    "$ROOT/hack/containerd.sh" stop >/dev/null 2>&1 || true
}
trap cleanup EXIT
cleanup_only_container() {
    "${C[@]}" task kill -s KILL "$ID" >/dev/null 2>&1 || true
    "${C[@]}" task rm -f "$ID" >/dev/null 2>&1 || true
    "${C[@]}" container rm "$ID" >/dev/null 2>&1 || true
}
cleanup_only_container

step "a private containerd at $CRAB_CONTAINERD_ADDRESS; images built locally"
show "${C[@]}" images ls -q

step "run a command under the crab runtime"
show "${C[@]}" run --rm --runtime io.containerd.crab.v2 docker.io/crab/busybox:latest hello \
    sh -c 'echo "hello from $(hostname), pid $$"; exit 3' </dev/null || echo "(exit code $?)"

step "a long-running sandbox: exec, ps, metrics"
show "${C[@]}" run -d --runtime io.containerd.crab.v2 --memory-limit 134217728 \
    docker.io/crab/python:latest "$ID" python3 -c 'import time
n = 0
while True:
    n += 1
    open("/tmp/counter", "w").write(str(n))
    time.sleep(0.1)'
sleep 1
show "${C[@]}" task exec --exec-id e1 "$ID" cat /tmp/counter; echo
show "${C[@]}" task ps "$ID"
show "${C[@]}" task metrics "$ID"

step "pause freezes the sandbox (the counter stops), resume thaws it"
BUNDLE=$(crabctl inspect -n "$CRAB_NAMESPACE" "$ID" | awk '/^bundle:/ {print $2}')
counter() { cat "$BUNDLE/rootfs/tmp/counter"; }
show "${C[@]}" task pause "$ID"
a=$(counter); sleep 1; b=$(counter)
echo "counter read from the host while paused: $a, one second later: $b"
show "${C[@]}" task resume "$ID"
sleep 1
echo "counter one second after resume: $(counter)"

step "what Crab records: the container's cgroup2 id, for the eBPF inspector"
show crabctl inspect -n "$CRAB_NAMESPACE" "$ID"

export CONTAINERD_ADDRESS="$CRAB_CONTAINERD_ADDRESS"
K=(crabctl -n "$CRAB_NAMESPACE")
step "checkpoint the sandbox (processes and files), then let the agent do damage"
show "${K[@]}" checkpoint "$ID" --name before
show "${C[@]}" task exec --exec-id e2 "$ID" sh -c 'rm -rf /usr/lib/python3* 2>/dev/null; echo broken > /etc/motd'
echo "counter now: $(counter); /etc/motd: $(cat "$BUNDLE/rootfs/etc/motd")"
step "roll back in place: same task, processes and files as they were"
show "${K[@]}" rollback "$ID" before
echo "counter right after the rollback: $(counter)"
show "${C[@]}" task exec --exec-id e3 "$ID" python3 -c 'print("python is back")'
show "${K[@]}" ls "$ID"

step "fork: three sandboxes running on from the same checkpoint"
show "${K[@]}" fork "$ID" before --count 3 --prefix "$ID-fork"
show "${C[@]}" task ls
for i in 1 2 3; do
    "${C[@]}" task kill -s KILL "$ID-fork-$i" >/dev/null 2>&1 || true
done
sleep 0.5
for i in 1 2 3; do
    "${C[@]}" task rm -f "$ID-fork-$i" >/dev/null 2>&1 || true
    "${C[@]}" container rm "$ID-fork-$i" >/dev/null 2>&1 || true
done

step "an agent's task in a crab sandbox: each turn checkpointed at its grain, a crash, and back"
echo "(a recorded trajectory: a sqlite-backed HTTP server started, written and queried through"
echo " Crab's turn proxy; the LLM's think times replayed ten times faster)"
cargo build --release -q -p crab-eval --manifest-path "$ROOT/Cargo.toml"
"$ROOT/target/release/crab-eval" --trajectories "$ROOT/eval/trajectories" --demo srv-notes --speedup 10

step "kill and clean up"
show "${C[@]}" task kill -s KILL "$ID"
sleep 0.5
show "${C[@]}" task rm "$ID" || true
show "${C[@]}" container rm "$ID"
echo
echo "demo finished"
