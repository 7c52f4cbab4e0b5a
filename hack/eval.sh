#!/usr/bin/env bash
# The evaluation: recorded agent trajectories replayed in real sandboxes, a crash
# injected, recovery by each strategy (crab, chat-only, chat+fs, scratch, runc-full; each
# must resume at the turn it promises), fault-free baselines (runc, crab-plain: Crab's
# runtime without checkpoints), end-to-end time at density. Writes docs/evaluation.md
# and its plots.
#
#   hack/eval.sh [--quick] [crab-eval arguments]
#     (full)    every trajectory, think times / 40; one crash point each recovered by
#               every strategy, three more by Crab; 1 to 32 sandboxes at think times
#               / 2: about an hour and a half on 2 cores
#     --quick   four short trajectories (build, server, repl, read-heavy), one crash
#               point each, think times / 60, 1 and 4 sandboxes: under ten minutes
#   (crab-eval --help lists the rest: --only, --strategies, --crash-points, --density...)
#
#   hack/eval.sh agents [--quick] [crab-agent-eval arguments]
#     real agents on crab sandboxes (crab-agent-eval): Claude Code inside (`ctr`) and
#     mini-swe-agent on the host acting through Docker (`--agents` picks them): skip
#     shares, overhead against crab-plain, a crash at the middle step recovered;
#     writes docs/evaluation-agents.md. Default: three read-heavy trajectories and
#     data-sales at their recorded think times (about two hours for both agents);
#     --quick: read-logs-triage at think times / 40 (a few minutes, also in the tests).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
"$ROOT/hack/setup.sh"
if [ "${1:-}" = agents ]; then
    shift
    # Claude Code's image, and the python image of mini-swe-agent's Docker sandboxes.
    "$ROOT/hack/build-images.sh" agent python >/dev/null
    . "$ROOT/hack/private-containerd.sh"
    # Docker 26 on that containerd, the crab runtime registered as `crab`.
    "$ROOT/hack/docker.sh" stop >/dev/null 2>&1 || true
    "$ROOT/hack/docker.sh" start
    eval "$("$ROOT/hack/docker.sh" env)"
    trap '"$ROOT/hack/docker.sh" stop >/dev/null 2>&1 || true
          "$ROOT/hack/containerd.sh" stop >/dev/null 2>&1 || true' EXIT
    cargo build --release -q -p crab-integration --bins
    # Not exec: the trap stops dockerd and containerd afterwards.
    "$ROOT/target/release/crab-agent-eval" --out "$ROOT/docs/evaluation-agents.md" "$@"
    exit 0
fi
. "$ROOT/hack/private-containerd.sh"
cargo build --release -q -p crab-eval
"$ROOT/target/release/crab-eval" --out "$ROOT/docs/evaluation.md" "$@"
