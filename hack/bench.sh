#!/usr/bin/env bash
# Benchmark: container start and exec latency and shim memory, crab next to runc's
# shim in the same run. Prints a Markdown table (see docs/benchmarks.md).
#
#   hack/bench.sh [--iterations N] [--containers K]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
"$ROOT/hack/setup.sh"
export CRAB_CONFIG=/var/lib/crab/test/config.toml
mkdir -p "$(dirname "$CRAB_CONFIG")"
[ -f "$CRAB_CONFIG" ] || printf 'state_dir = "/run/crab/state-test"\n' >"$CRAB_CONFIG"
"$ROOT/hack/containerd.sh" stop >/dev/null 2>&1 || true
"$ROOT/hack/containerd.sh" start >/dev/null
eval "$("$ROOT/hack/containerd.sh" env)"
trap '"$ROOT/hack/containerd.sh" stop >/dev/null 2>&1 || true' EXIT
cargo build --release -q -p crab-integration --bin crab-bench
"$ROOT/target/release/crab-bench" "$@"
