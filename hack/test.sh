#!/usr/bin/env bash
# The test command: installs and starts everything the tests need on a fresh machine
# (hack/setup.sh), runs a private containerd with the crab runtime's test
# configuration and a second one with the CRI plugin (Kubernetes' pods, tests/cri.rs),
# then runs lint, unit tests and the integration tests against them.
#
#   hack/test.sh                 everything
#   hack/test.sh -- FILTER       only integration tests whose name matches FILTER
#   hack/test.sh compat          the compatibility matrix on containerd 2.x and Docker 28
#                                (Debian sid's, hack/sid.sh), beside the default stack:
#                                the Docker, CRI and ctr tests (COMPAT_TESTS) against
#                                it; not part of the default run
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
FILTER=()
COMPAT=0
if [ "${1:-}" = "--" ]; then shift; FILTER=("$@"); fi
if [ "${1:-}" = compat ]; then COMPAT=1; shift; fi
# The test files `compat` runs against containerd 2.x and Docker 28.
COMPAT_TESTS=(docker cri cri_userns idmapped_mounts lifecycle checkpoint client_semantics restore_source fork fork_replicas crash_restore migrate)

log() { printf '\033[1;32m[test]\033[0m %s\n' "$*" >&2; }
STARTED=$(date +%s)

# Every cargo command selects the whole workspace with every feature and picks its
# tests by target: a selection of its own (-p, --exclude, other features) resolves
# the dependencies' features differently, and cargo compiles them again (it did four
# times, two thirds of a CI run). The build in hack/setup.sh compiles them once.
CARGO=(--release --workspace --all-features)
UNIT_TESTS=()
INTEGRATION_TESTS=()
for f in */tests/*.rs; do
    name=$(basename "$f" .rs)
    case "$f" in
        integration/*) INTEGRATION_TESTS+=(--test "$name") ;;
        runtime/tests/zfs_store.rs) ;;
        *) UNIT_TESTS+=(--test "$name") ;;
    esac
done
# A --test name runs that target in every package that has one.
dup=$(for f in */tests/*.rs; do basename "$f"; done | sort | uniq -d)
[ -z "$dup" ] || { echo "test file names must be unique in the workspace: $dup" >&2; exit 1; }

CRAB_BUILD_TESTS=1 "$ROOT/hack/setup.sh"

# shellcheck source=hack/test-config.sh
. "$ROOT/hack/test-config.sh"

if [ "$COMPAT" = 1 ]; then
    "$ROOT/hack/sid.sh" install
    COMPAT_DIR=/var/lib/crab/test-compat
    mkdir -p "$COMPAT_DIR"
    export CRAB_CONFIG="$COMPAT_DIR/config.toml"
    write_test_config /run/crab/state-compat debug
    "$ROOT/hack/sid.sh" stop >/dev/null 2>&1 || true
    "$ROOT/hack/sid.sh" start
    trap '"$ROOT/hack/sid.sh" stop >/dev/null 2>&1 || true' EXIT
    eval "$("$ROOT/hack/sid.sh" env)"
    log "compatibility: $(containerd --version | awk '{print $3}'), $(chroot "$CRAB_DOCKER_ROOTFS" dockerd --version)"
    : >"$COMPAT_DIR/integration.log"
    status=0
    for t in "${COMPAT_TESTS[@]}"; do
        log "tests/$t.rs against containerd 2.x"
        # In a condition, so that a failing file (set -e, pipefail) does not end the
        # matrix before the next ones run.
        if ! cargo test "${CARGO[@]}" --no-fail-fast \
            --test "$t" -- --test-threads=1 2>&1 | tee -a "$COMPAT_DIR/integration.log"; then
            status=1
        fi
    done
    awk '/^test result:/ { p += $4; f += $6; i += $8 }
         END { printf "compat: %d passed, %d failed, %d ignored\n", p, f, i }' \
        "$COMPAT_DIR/integration.log"
    elapsed=$(($(date +%s) - STARTED))
    log "took $((elapsed / 60)) min $((elapsed % 60)) s (set-up included)"
    exit "$status"
fi

# The shims of the private containerd read this configuration (CRAB_CONFIG is passed
# through containerd to them); the host's /etc/crab is never used.
TEST_DIR=/var/lib/crab/test
mkdir -p "$TEST_DIR"
export CRAB_CONFIG="$TEST_DIR/config.toml"
write_test_config /run/crab/state-test debug

"$ROOT/hack/docker.sh" stop >/dev/null 2>&1 || true
"$ROOT/hack/containerd.sh" stop >/dev/null 2>&1 || true
"$ROOT/hack/containerd.sh" --cri stop >/dev/null 2>&1 || true
"$ROOT/hack/containerd.sh" start
"$ROOT/hack/containerd.sh" --cri start
eval "$("$ROOT/hack/containerd.sh" env)"
eval "$("$ROOT/hack/containerd.sh" --cri env)"
# Docker 26 (its dockerd in an isolated trixie root) on that containerd, with the crab
# runtime registered as `crab`: tests/docker.rs drives it with the docker CLI and docker-py.
"$ROOT/hack/docker.sh" start
eval "$("$ROOT/hack/docker.sh" env)"
trap '"$ROOT/hack/docker.sh" stop >/dev/null 2>&1 || true
      "$ROOT/hack/containerd.sh" stop >/dev/null 2>&1 || true
      "$ROOT/hack/containerd.sh" --cri stop >/dev/null 2>&1 || true' EXIT

if [ ${#FILTER[@]} -eq 0 ]; then
    log "lint"
    cargo fmt --all -- --check
    # With every feature: the tests behind host-tests are linted too.
    cargo clippy --release --workspace --all-targets --all-features -- -D warnings
    log "unit tests, and the tests that need root, eBPF and the stores (host-tests)"
    cargo test "${CARGO[@]}" --lib --bins "${UNIT_TESTS[@]}"
    cargo test "${CARGO[@]}" --doc
    # zfs-fuse: one test at a time (its daemon is the slow, fragile part)
    timeout --kill-after=10 1200 cargo test "${CARGO[@]}" --test zfs_store -- --test-threads=1
fi
log "integration tests (real containerd at $CRAB_CONTAINERD_ADDRESS, CRI at $CRAB_CRI_ADDRESS)"
cargo test "${CARGO[@]}" --no-fail-fast "${INTEGRATION_TESTS[@]}" \
    -- --test-threads=1 "${FILTER[@]}" 2>&1 | tee "$TEST_DIR/integration.log"
status=${PIPESTATUS[0]}
# One closing line that counts every integration test of the run.
awk '/^test result:/ { p += $4; f += $6 } END { printf "integration: %d passed, %d failed\n", p, f }' \
    "$TEST_DIR/integration.log"
elapsed=$(($(date +%s) - STARTED))
log "took $((elapsed / 60)) min $((elapsed % 60)) s (set-up included)"
exit "$status"
