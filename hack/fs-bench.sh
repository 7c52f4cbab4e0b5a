#!/usr/bin/env bash
# Benchmark: file-system snapshot, rollback and clone of crab's store next to
# `ctr container checkpoint --rw` and a tar of the overlay upper dir of a runc container
# holding the same data, in the same run. Prints Markdown tables (see
# docs/benchmarks.md).
#
#   hack/fs-bench.sh [--iterations N] [--quick] [--backend NAME[,NAME...]] [--tmp-dir DIR]
#
# --quick skips the 1 GB and 10 000-file workloads. The zfs backend needs its pool
# (hack/zfs.sh, run here when a zfs backend is asked for) and a shim that has it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
"$ROOT/hack/setup.sh"
case " $* " in
    *zfs*) "$ROOT/hack/zfs.sh" ;;
esac
. "$ROOT/hack/private-containerd.sh"
cargo build --release -q -p crab-integration --bin crab-fs-bench
"$ROOT/target/release/crab-fs-bench" "$@"
