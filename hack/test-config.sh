# Sourced by hack/test.sh and hack/private-containerd.sh: the crab configuration the
# private containerd's shims read (CRAB_CONFIG).
#
# write_test_config STATE_DIR LOG_LEVEL: writes $CRAB_CONFIG with that state dir and
# log level, and the upstreams an annotation may choose for a sandbox's turn proxy:
# 127.0.0.1:9 (the CRI and Docker tests': it never answers) and 127.0.0.1:18787 (the
# scripted LLM that mini-swe-agent reaches through the proxy's host door, in the
# tests and the evaluation: one listener answers each run by its API key).
write_test_config() {
    cat >"$CRAB_CONFIG" <<TOML
state_dir = "$1"
log_level = "$2"
[proxy]
upstreams = ["http://127.0.0.1:9", "http://127.0.0.1:18787"]
TOML
}
