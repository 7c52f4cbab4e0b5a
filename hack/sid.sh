#!/usr/bin/env bash
# The compatibility stack of `hack/test.sh compat`: Debian sid's containerd 2.1 and
# Docker 28, beside (never instead of) the test suite's containerd 1.7 and Docker 26.
# Nothing from sid is installed on the host: containerd 2.1, its ctr and runc's shim
# come from an isolated sid root made by debootstrap (they need only glibc 2.34, so
# they run on the host as the root holds them: their mounts and shims are the host's,
# as with containerd 1.7); dockerd 28, the docker CLI and docker-py run inside that
# root, as hack/docker.sh runs Docker 26 in its trixie root. runc is the host's.
#
# Three daemons, each with its own root, state, socket (and network):
#   containerd 2.1          /var/lib/crab/containerd2, /run/crab/containerd2
#                           (ctr's and Docker's; the CRI plugin off)
#   containerd 2.1 with CRI /var/lib/crab/containerd2-cri, /run/crab/containerd2-cri
#                           (handlers crab and runc, pod bridge crab-cri2, 10.88.214.0/24)
#   dockerd 28              /var/lib/crab/docker2, /run/crab/docker2, on the first
#                           containerd, with its own bridge crab-docker2 (10.88.228.1/24)
#                           and iptables off (the host's Docker 26 keeps docker0 and
#                           its rules)
#
#   hack/sid.sh install   make the sid root (debootstrap) with docker.io, docker-cli,
#                         python3-docker and containerd in it; kept and re-used
#   hack/sid.sh start     start the three (each only if not already running) and load
#                         the images built by hack/build-images.sh into them
#   hack/sid.sh stop      stop them (Docker's containers removed first)
#   hack/sid.sh status    exit 0 if all three answer
#   hack/sid.sh env       export lines for the integration tests: the same variables
#                         hack/containerd.sh env, --cri env and hack/docker.sh env
#                         print, pointed at this stack, and PATH with containerd 2.1's
#                         ctr first
#
# Environment: CRAB_SID_ROOTFS [/var/lib/crab/sid-root]; CRAB_CONFIG (the shims'
# configuration and the crab handlers' ConfigPath, as for hack/containerd.sh);
# CRAB_IMAGE_DIR, CRAB_DEBIAN_MIRROR as for the other scripts.
set -euo pipefail

HACK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOTFS="${CRAB_SID_ROOTFS:-/var/lib/crab/sid-root}"
# containerd 2.1's binaries, linked from the root; first on PATH.
BIN="$ROOTFS/opt/crab/bin"
LINKS=(containerd ctr containerd-shim-runc-v2)

log() { printf '\033[1;34m[sid]\033[0m %s\n' "$*" >&2; }
die() { echo "sid.sh: $*" >&2; exit 1; }

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit "${1:-2}"
}

# The variables of each daemon's script (exported in a subshell by `with`).
plain_env=(CRAB_CONTAINERD_ROOT=/var/lib/crab/containerd2
           CRAB_CONTAINERD_STATE=/run/crab/containerd2)
cri_env=(CRAB_CONTAINERD_ROOT=/var/lib/crab/containerd2-cri
         CRAB_CONTAINERD_STATE=/run/crab/containerd2-cri
         CRAB_CNI_BRIDGE=crab-cri2
         CRAB_CNI_SUBNET=10.88.214.0/24)
docker_env=(CRAB_DOCKER_ROOTFS="$ROOTFS"
            CRAB_DOCKER_SUITE=sid
            CRAB_DOCKER_EXTRA_PACKAGES=containerd
            CRAB_DOCKER_DATA=/var/lib/crab/docker2
            CRAB_DOCKER_STATE=/run/crab/docker2
            CRAB_DOCKER_BRIDGE=crab-docker2
            CRAB_DOCKER_BRIDGE_CIDR=10.88.228.1/24
            "${plain_env[@]}")

# Runs a command with containerd 2.1 first on PATH and the given variables.
with() {
    local vars=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do vars+=("$1"); shift; done
    shift
    env PATH="$BIN:$PATH" "${vars[@]}" "$@"
}

linked() {
    local b
    for b in "${LINKS[@]}"; do [ -x "$BIN/$b" ] || return 1; done
}

install() {
    with "${docker_env[@]}" -- "$HACK/docker.sh" install
    mkdir -p "$BIN"
    local b src
    for b in "${LINKS[@]}"; do
        src=$(find "$ROOTFS/usr/bin" "$ROOTFS/usr/sbin" -maxdepth 1 -name "$b" -print -quit)
        [ -n "$src" ] || die "no $b in $ROOTFS (apt-get install containerd inside it)"
        ln -sfn "../../..${src#"$ROOTFS"}" "$BIN/$b"
    done
    # They must run with the host's libc; say so now rather than at the first start.
    "$BIN/containerd" --version >/dev/null 2>&1 ||
        die "$BIN/containerd does not run on this host: $("$BIN/containerd" --version 2>&1 | head -n 3)"
    log "$("$BIN/containerd" --version) and $(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin chroot "$ROOTFS" dockerd --version)"
}

start() {
    linked || die "no containerd 2.x in $BIN (run hack/sid.sh install)"
    with "${plain_env[@]}" -- "$HACK/containerd.sh" start >/dev/null
    with "${cri_env[@]}" -- "$HACK/containerd.sh" --cri start >/dev/null
    with "${docker_env[@]}" -- "$HACK/docker.sh" start >/dev/null
    log "running: $("$BIN/containerd" --version | awk '{print $3}'), $(status_line)"
}

stop() {
    with "${docker_env[@]}" -- "$HACK/docker.sh" stop || true
    with "${plain_env[@]}" -- "$HACK/containerd.sh" stop || true
    with "${cri_env[@]}" -- "$HACK/containerd.sh" --cri stop || true
}

status_line() {
    with "${docker_env[@]}" -- "$HACK/docker.sh" status
}

status() {
    local ok=0
    with "${plain_env[@]}" -- "$HACK/containerd.sh" status || ok=1
    with "${cri_env[@]}" -- "$HACK/containerd.sh" --cri status || ok=1
    with "${docker_env[@]}" -- "$HACK/docker.sh" status || ok=1
    return $ok
}

print_env() {
    with "${plain_env[@]}" -- "$HACK/containerd.sh" env
    with "${cri_env[@]}" -- "$HACK/containerd.sh" --cri env
    with "${docker_env[@]}" -- "$HACK/docker.sh" env
    printf 'export PATH=%q\n' "$BIN:$PATH"
}

[ $# -eq 1 ] || usage
case "$1" in
    install|start|stop)
        [ "$(id -u)" = 0 ] || die "must run as root" ;;
esac
case "$1" in
    install) install ;;
    start) start ;;
    stop) stop ;;
    status) status ;;
    env) print_env ;;
    -h|--help|help) usage 0 ;;
    *) usage ;;
esac
