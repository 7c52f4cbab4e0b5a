# Sourced (with ROOT set) by the bench and evaluation scripts: the test
# configuration, a fresh private containerd on its own socket (stopped again when
# the calling script exits), and its environment (CRAB_CONTAINERD_ADDRESS...).
export CRAB_CONFIG=/var/lib/crab/test/config.toml
mkdir -p "$(dirname "$CRAB_CONFIG")"
# shellcheck source=hack/test-config.sh
. "$ROOT/hack/test-config.sh"
# The tests' configuration, logging at info: a figure is not taken with debug logs.
write_test_config /run/crab/state-test info
"$ROOT/hack/containerd.sh" stop >/dev/null 2>&1 || true
"$ROOT/hack/containerd.sh" start >/dev/null
eval "$("$ROOT/hack/containerd.sh" env)"
trap '"$ROOT/hack/containerd.sh" stop >/dev/null 2>&1 || true' EXIT
