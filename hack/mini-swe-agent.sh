#!/usr/bin/env bash
# Installs mini-swe-agent (PyPI `mini-swe-agent`, unmodified), the second real agent
# of the tests (integration/tests/mini_swe_agent.rs, docs/agents.md), in a venv of its
# own: the host's python3 (3.11 on Debian 12) and its site-packages stay as they are.
# Idempotent: a venv that already holds the pinned release is kept.
#
#   hack/mini-swe-agent.sh          install (hack/setup.sh runs it)
#   hack/mini-swe-agent.sh status   exit 0 if the venv holds the pinned release
#   hack/mini-swe-agent.sh env      print the export line the tests read
#
# Environment (defaults in brackets):
#   CRAB_MINI_SWE_AGENT_VENV   [/var/lib/crab/mini-swe-agent/venv]
#   CRAB_PYTHON                [python3]  the interpreter the venv is made from (>= 3.10)
set -euo pipefail

VENV="${CRAB_MINI_SWE_AGENT_VENV:-/var/lib/crab/mini-swe-agent/venv}"
PYTHON="${CRAB_PYTHON:-python3}"
# The newest release at the time of writing that runs on Python 3.11, and the litellm
# it was tested with (mini-swe-agent leaves litellm unpinned; its other dependencies
# are whatever pip resolves).
VERSION=2.4.6
LITELLM=1.110.2

log() { printf '\033[1;34m[mini-swe-agent]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31m[mini-swe-agent]\033[0m %s\n' "$*" >&2; exit 1; }

installed() {
    [ -x "$VENV/bin/python" ] && [ "$("$VENV/bin/python" -c \
        "import importlib.metadata as m; print(m.version('mini-swe-agent'), m.version('litellm'))" \
        2>/dev/null)" = "$VERSION $LITELLM" ]
}

install() {
    if installed; then
        log "mini-swe-agent $VERSION (litellm $LITELLM) in $VENV"
        return
    fi
    command -v "$PYTHON" >/dev/null || die "no $PYTHON: apt-get install python3 python3-venv"
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
        || die "$PYTHON is older than 3.10, which mini-swe-agent needs"
    log "installing mini-swe-agent $VERSION (litellm $LITELLM) in $VENV"
    mkdir -p "$(dirname "$VENV")"
    "$PYTHON" -m venv "$VENV" || die "$PYTHON -m venv failed: apt-get install python3-venv"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check \
        "mini-swe-agent==$VERSION" "litellm==$LITELLM"
    installed || die "the venv $VENV does not hold mini-swe-agent $VERSION after the install"
    log "done"
}

case "${1:-install}" in
    install) install ;;
    status) installed ;;
    env) echo "export CRAB_MINI_SWE_AGENT_VENV=$VENV" ;;
    *) die "usage: $0 [install|status|env]" ;;
esac
