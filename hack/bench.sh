#!/usr/bin/env bash
# Benchmarks, crab next to runc's shim in the same run where runc has the operation.
# Each prints a Markdown table (recorded in docs/benchmarks.md).
#
#   hack/bench.sh [start|cr|crash|ops|tree|inspector|proxy|all] [bench arguments]
#     start  container start, exec and shim memory      (crab-bench)
#     cr     checkpoint/restore through containerd, by written memory (crab-cr-bench)
#     crash  restore right after a crash (shim and init killed), to a server that answers
#            (crab-crash-bench)
#     ops    Crab's checkpoint, rollback, fork, migration (crab-ops-bench)
#     tree   a tree search's state management: checkpoint per node, rollback per child
#            (crab-tree-bench)
#     inspector  eBPF inspector overhead, classification, memory (crab-inspector-bench)
#     proxy  turn proxy: added latency, hidden checkpoints, gating at density (crab-proxy-bench;
#            --quick for smaller sizes)
#     all    all of them, with their default arguments (default)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
suite="${1:-all}"
[ $# -gt 0 ] && shift
"$ROOT/hack/setup.sh"
. "$ROOT/hack/private-containerd.sh"
cargo build --release -q -p crab-integration --bins
case "$suite" in
    start) "$ROOT/target/release/crab-bench" "$@" ;;
    cr) "$ROOT/target/release/crab-cr-bench" "$@" ;;
    crash) "$ROOT/target/release/crab-crash-bench" "$@" ;;
    ops) "$ROOT/target/release/crab-ops-bench" "$@" ;;
    tree) "$ROOT/target/release/crab-tree-bench" "$@" ;;
    inspector) "$ROOT/target/release/crab-inspector-bench" "$@" ;;
    proxy) "$ROOT/target/release/crab-proxy-bench" "$@" ;;
    all)
        for b in crab-bench crab-cr-bench crab-crash-bench crab-ops-bench crab-tree-bench crab-inspector-bench crab-proxy-bench; do
            echo "## $b"
            "$ROOT/target/release/$b"
            echo
        done
        ;;
    *) echo "usage: hack/bench.sh [start|cr|crash|ops|tree|inspector|proxy|all] [args]" >&2; exit 2 ;;
esac
