#!/usr/bin/env bash
# Runs Docker Engine (Debian trixie's docker.io, Docker 26) against Crab's private
# containerd, for the tests that drive Crab with the real docker CLI and docker-py.
# bookworm's Docker (20.10) is too old for shim v2 runtimes, and trixie's docker.io
# needs trixie's libc: so dockerd, the docker CLI and docker-py live in an isolated
# trixie root made by debootstrap, and nothing from trixie is installed on the host.
# The host's /etc/docker, /var/lib/docker and /run/docker are never read or touched.
#
#   hack/docker.sh install   make the trixie root (debootstrap --variant=minbase) and
#                            install docker.io, docker-cli, procps and python3-docker in it with its
#                            own apt; kept and re-used when present
#   hack/docker.sh start     start dockerd (if not already running) against the private
#                            containerd (hack/containerd.sh start first), with the crab
#                            runtime registered as `crab`, and `docker load` the images
#                            built by hack/build-images.sh
#   hack/docker.sh stop      remove Docker's containers, stop dockerd, undo its mounts
#   hack/docker.sh status    exit 0 if dockerd answers on its socket, 1 otherwise
#   hack/docker.sh env       print export lines, e.g. eval "$(hack/docker.sh env)"
#
# The CLI and docker-py run inside the root, e.g.
#   chroot "$CRAB_DOCKER_ROOTFS" docker -H "$DOCKER_HOST" run --rm --runtime crab \
#       crab/busybox echo hi
#
# Environment (defaults in brackets):
#   CRAB_DOCKER_ROOTFS     [/var/lib/crab/docker-root]  the trixie root
#   CRAB_DOCKER_DATA       [/var/lib/crab/docker]       dockerd's data root, dockerd.log
#   CRAB_DOCKER_STATE      [/run/crab/docker]           exec root, socket, daemon.json, pid
#   CRAB_DOCKER_SNAPSHOTTER [0]  1: the containerd image store instead of overlay2
#   CRAB_CONTAINERD_ROOT, CRAB_CONTAINERD_STATE   the private containerd (as in
#                            hack/containerd.sh; its socket is in its state dir)
#   CRAB_IMAGE_DIR         [/var/lib/crab/images]       busybox.tar, python.tar
#   CRAB_CONFIG            the crab runtime's ConfigPath option, when set
#   CRAB_DEBIAN_MIRROR     [http://deb.debian.org/debian]
#   CRAB_DOCKER_SUITE      [trixie]  the Debian suite of the root (hack/sid.sh: sid,
#                            Docker 28)
#   CRAB_DOCKER_EXTRA_PACKAGES  more packages for the root (hack/sid.sh: containerd)
#   CRAB_DOCKER_BRIDGE     a bridge of its own for the containers instead of docker0
#                            (made when absent, address CRAB_DOCKER_BRIDGE_CIDR), with
#                            iptables off: a second dockerd on the host then neither
#                            shares docker0 nor rewrites the first one's rules
#   CRAB_DOCKER_BRIDGE_CIDR the bridge's address, e.g. 10.88.228.1/24
#   CRAB_DOCKER_USERNS_REMAP  dockerd's `userns-remap` (e.g. `default`: its dockremap
#                            user, made in the root with 65536 subordinate ids; Docker
#                            keeps that mapping's images below <data root>/<uid>.<gid>)
set -euo pipefail

ROOTFS="${CRAB_DOCKER_ROOTFS:-/var/lib/crab/docker-root}"
DATA_DIR="${CRAB_DOCKER_DATA:-/var/lib/crab/docker}"
STATE_DIR="${CRAB_DOCKER_STATE:-/run/crab/docker}"
EXEC_ROOT="$STATE_DIR/exec"
SOCK="$STATE_DIR/docker.sock"
DAEMON_JSON="$STATE_DIR/daemon.json"
PIDFILE="$STATE_DIR/dockerd.pid"
LOG="$DATA_DIR/dockerd.log"
CTRD_ROOT="${CRAB_CONTAINERD_ROOT:-/var/lib/crab/containerd}"
CTRD_STATE="${CRAB_CONTAINERD_STATE:-/run/crab/containerd}"
CTRD_SOCK="$CTRD_STATE/containerd.sock"
IMAGE_DIR="${CRAB_IMAGE_DIR:-/var/lib/crab/images}"
MIRROR="${CRAB_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE="${CRAB_DOCKER_SUITE:-trixie}"
BRIDGE="${CRAB_DOCKER_BRIDGE:-}"
BRIDGE_CIDR="${CRAB_DOCKER_BRIDGE_CIDR:-}"
USERNS_REMAP="${CRAB_DOCKER_USERNS_REMAP:-}"
# docker-py from Debian, inside the root: no PyPI needed.
# shellcheck disable=SC2206 # a list of package names
PACKAGES=(docker.io docker-cli procps python3-docker ${CRAB_DOCKER_EXTRA_PACKAGES:-})
IMAGES=(busybox python)
START_TIMEOUT=30
STOP_TIMEOUT=20
ROOT_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export DEBIAN_FRONTEND=noninteractive

log() { printf '\033[1;34m[docker]\033[0m %s\n' "$*" >&2; }
die() { echo "docker.sh: $*" >&2; exit 1; }

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit "${1:-2}"
}

# Runs a command inside the root with a clean environment.
in_root() { env -i PATH="$ROOT_PATH" HOME=/root LANG=C.UTF-8 chroot "$ROOTFS" "$@"; }

docker_() { in_root docker -H "unix://$SOCK" "$@"; }

answers() { [ -S "$SOCK" ] && timeout 5 env -i PATH="$ROOT_PATH" chroot "$ROOTFS" docker -H "unix://$SOCK" version >/dev/null 2>&1; }

is_mounted() { mountpoint -q "$1"; }

# Unmounts everything at or below a directory, deepest first.
unmount_below() {
    local dir mp
    dir=$(realpath -m "$1")
    awk -v d="$dir" '$5 == d || index($5, d "/") == 1 {print $5}' /proc/self/mountinfo | sort -r |
        while read -r mp; do umount -l "$mp" 2>/dev/null || true; done
}

installed() { [ -x "$ROOTFS/usr/sbin/dockerd" ] && [ "$(cat "$ROOTFS/.crab-packages" 2>/dev/null)" = "${PACKAGES[*]}" ]; }

install() {
    if installed; then
        log "$ROOTFS has ${PACKAGES[*]} ($(in_root dockerd --version))"
        return 0
    fi
    command -v debootstrap >/dev/null || die "debootstrap not found (apt-get install debootstrap)"
    local start=$SECONDS
    if [ ! -x "$ROOTFS/usr/bin/apt-get" ]; then
        local tmp="$ROOTFS.tmp"
        unmount_below "$tmp"
        rm -rf "$tmp"
        mkdir -p "$(dirname "$ROOTFS")"
        log "debootstrap --variant=minbase $SUITE $ROOTFS ($MIRROR)"
        if ! debootstrap --variant=minbase "$SUITE" "$tmp" "$MIRROR" >"$tmp.log" 2>&1; then
            tail -n 30 "$tmp.log" >&2
            tail -n 30 "$tmp/debootstrap/debootstrap.log" >&2 2>/dev/null || true
            unmount_below "$tmp"
            die "debootstrap failed (log: $tmp.log)"
        fi
        unmount_below "$tmp"
        rm -f "$tmp.log"
        [ -d "$ROOTFS" ] && { unmount_root; rm -rf "$ROOTFS"; }
        mv "$tmp" "$ROOTFS"
    fi
    # No service may start inside the root while packages install.
    printf '#!/bin/sh\nexit 101\n' >"$ROOTFS/usr/sbin/policy-rc.d"
    chmod 0755 "$ROOTFS/usr/sbin/policy-rc.d"
    cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf" 2>/dev/null || true
    # sid's Release file carries a Valid-Until date that a mirror's copy may be past.
    echo 'Acquire::Check-Valid-Until "false";' >"$ROOTFS/etc/apt/apt.conf.d/99crab-valid-until"
    mountpoint -q "$ROOTFS/proc" || mount -t proc proc "$ROOTFS/proc"
    log "installing ${PACKAGES[*]} inside the root (its own apt, $SUITE)"
    local ok=1 apt_log="$ROOTFS.apt.log"
    {
        in_root apt-get update -qq &&
            in_root apt-get install -y -qq -o Dpkg::Use-Pty=0 --no-install-recommends "${PACKAGES[@]}"
    } >"$apt_log" 2>&1 || ok=0
    in_root apt-get clean || true
    umount -l "$ROOTFS/proc" 2>/dev/null || true
    [ "$ok" = 1 ] || { tail -n 30 "$apt_log" >&2; die "apt-get install ${PACKAGES[*]} failed inside $ROOTFS (log: $apt_log)"; }
    rm -f "$apt_log"
    echo "${PACKAGES[*]}" >"$ROOTFS/.crab-packages"
    log "$(in_root dockerd --version); installed in $((SECONDS - start)) s"
}

# Is $1 a live dockerd started with our daemon.json?
is_ours() {
    local pid=$1
    [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
    local cmdline
    cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
    [[ "$cmdline" == *dockerd*"--config-file $DAEMON_JSON"* ]]
}

find_pid() {
    local pid=""
    [ -f "$PIDFILE" ] && pid=$(cat "$PIDFILE" 2>/dev/null || true)
    if is_ours "$pid"; then
        echo "$pid"
        return 0
    fi
    for d in /proc/[0-9]*; do
        pid=${d#/proc/}
        if is_ours "$pid"; then
            echo "$pid"
            return 0
        fi
    done
    return 1
}

# Makes `dir` a shared mount (a bind of itself when it is not a mount point yet) and
# binds it at the same path inside the root, in the same peer group: mounts dockerd
# makes below it inside the root (overlay2's merged dirs, the containerd image store's
# rootfs mounts) are seen at the same path by containerd and the shims outside.
share() {
    local dir=$1
    mkdir -p "$dir" "$ROOTFS$dir"
    is_mounted "$dir" || mount --bind "$dir" "$dir"
    mount --make-shared "$dir"
    is_mounted "$ROOTFS$dir" || mount --bind "$dir" "$ROOTFS$dir"
}

# Binds `dir` (with what is mounted below it) at the same path inside the root, as a
# slave: dockerd reaches containerd's socket and the snapshots the containerd image
# store mounts from, and nothing dockerd does there reaches the host. containerd's
# dirs hold the mounts of running containers (other clients' too): they are never
# re-bound on the host, and unmounting the root never propagates to them.
follow() {
    local dir=$1
    mkdir -p "$dir" "$ROOTFS$dir"
    if ! is_mounted "$ROOTFS$dir"; then
        mount --rbind "$dir" "$ROOTFS$dir"
        mount --make-rslave "$ROOTFS$dir"
    fi
}

mount_root() {
    # dockerd's chrooted archive code remounts "/": the root must be a mount point.
    if ! is_mounted "$ROOTFS"; then
        mount --bind "$ROOTFS" "$ROOTFS"
        mount --make-private "$ROOTFS"
    fi
    is_mounted "$ROOTFS/proc" || mount -t proc proc "$ROOTFS/proc"
    if ! is_mounted "$ROOTFS/sys"; then
        mount --rbind /sys "$ROOTFS/sys"
        mount --make-rslave "$ROOTFS/sys"
    fi
    if ! is_mounted "$ROOTFS/dev"; then
        mount --rbind /dev "$ROOTFS/dev"
        mount --make-rslave "$ROOTFS/dev"
    fi
    cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf" 2>/dev/null || true
    # The paths dockerd shares with containerd and the shims, at the same paths.
    share "$DATA_DIR"
    share "$STATE_DIR"
    follow "$CTRD_ROOT"
    follow "$CTRD_STATE"
}

# Undoes mount_root. Everything below the root becomes a slave first, so that no
# unmount there propagates to the host's copies (containers' mounts outside).
unmount_root() {
    is_mounted "$ROOTFS" && mount --make-rslave "$ROOTFS"
    unmount_below "$ROOTFS"
}

# The bridge of CRAB_DOCKER_BRIDGE, made when absent (dockerd only uses one that exists).
make_bridge() {
    [ -n "$BRIDGE" ] || return 0
    [ -n "$BRIDGE_CIDR" ] || die "CRAB_DOCKER_BRIDGE needs CRAB_DOCKER_BRIDGE_CIDR"
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge
        ip addr add "$BRIDGE_CIDR" dev "$BRIDGE"
    fi
    ip link set "$BRIDGE" up
}

write_daemon_json() {
    local snap=false opts='{}' net='{}' remap='{}'
    [ "${CRAB_DOCKER_SNAPSHOTTER:-0}" = 1 ] && snap=true
    [ -n "$USERNS_REMAP" ] && remap=$(jq -n --arg u "$USERNS_REMAP" '{"userns-remap": $u}')
    [ -n "${CRAB_CONFIG:-}" ] && opts=$(jq -n --arg p "$CRAB_CONFIG" '{ConfigPath: $p}')
    [ -n "$BRIDGE" ] && net=$(jq -n --arg b "$BRIDGE" '{bridge: $b, iptables: false, ip6tables: false}')
    # group root: the root's "docker" group id is some other group on the host.
    # experimental: `docker checkpoint` and `docker start --checkpoint` need it.
    jq -n --argjson snap "$snap" --argjson opts "$opts" --argjson net "$net" --argjson remap "$remap" '{
        runtimes: {crab: {runtimeType: "io.containerd.crab.v2", options: $opts}},
        group: "root",
        experimental: true,
        features: {"containerd-snapshotter": $snap}
      } + (if $snap then {} else {"storage-driver": "overlay2"} end) + $net + $remap' >"$DAEMON_JSON.tmp"
    mv "$DAEMON_JSON.tmp" "$DAEMON_JSON"
}

# Loads $IMAGE_DIR/<image>.tar unless Docker has that name with the same content (its
# id is the config's digest with overlay2, the manifest's with the containerd store).
load_images() {
    local image tar name cfg manifest have
    for image in "${IMAGES[@]}"; do
        tar="$IMAGE_DIR/$image.tar"
        [ -f "$tar" ] || die "no $tar (run hack/build-images.sh)"
        tar -tf "$tar" manifest.json >/dev/null 2>&1 ||
            die "$tar has no manifest.json, which docker load needs (hack/build-images.sh --force $image)"
        name=$(tar -xOf "$tar" manifest.json | jq -r '.[0].RepoTags[0]')
        cfg=$(tar -xOf "$tar" manifest.json | jq -r '.[0].Config | sub("^blobs/sha256/"; "sha256:")')
        manifest=$(tar -xOf "$tar" index.json | jq -r '.manifests[0].digest')
        have=$(docker_ image inspect -f '{{.Id}}' "$name" 2>/dev/null || true)
        [ "$have" = "$cfg" ] || [ "$have" = "$manifest" ] && continue
        log "loading $name"
        docker_ load <"$tar" >/dev/null
        docker_ image inspect "$name" >/dev/null || die "docker load of $tar did not create $name"
    done
}

wait_answers() {
    local deadline=$((SECONDS + START_TIMEOUT)) pid
    until answers; do
        [ $SECONDS -lt $deadline ] || return 1
        pid=$(cat "$PIDFILE" 2>/dev/null || true)
        if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
            return 1
        fi
        sleep 0.3
    done
}

start() {
    installed || die "no Docker in $ROOTFS (run hack/docker.sh install)"
    timeout 5 ctr --address "$CTRD_SOCK" version >/dev/null 2>&1 ||
        die "containerd does not answer on $CTRD_SOCK (run hack/containerd.sh start)"
    local pid
    if pid=$(find_pid); then
        if [ "$(cat "$STATE_DIR/containerd" 2>/dev/null)" = "$CTRD_SOCK" ] && wait_answers; then
            log "already running (pid $pid)"
            load_images
            echo "$SOCK"
            return 0
        fi
        log "dockerd pid $pid does not answer or uses another containerd; replacing it"
        stop
    fi
    mkdir -p "$DATA_DIR" "$STATE_DIR"
    chmod 0711 "$DATA_DIR" "$STATE_DIR"
    mount_root
    mkdir -p "$EXEC_ROOT"
    make_bridge
    write_daemon_json
    echo "$CTRD_SOCK" >"$STATE_DIR/containerd"
    rm -f "$PIDFILE" "$SOCK"
    log "starting dockerd against $CTRD_SOCK (log: $LOG)"
    printf '\n==== %s hack/docker.sh start ====\n' "$(date -Is)" >>"$LOG"
    env -i PATH="$ROOT_PATH" HOME=/root setsid nohup chroot "$ROOTFS" dockerd \
        --config-file "$DAEMON_JSON" \
        --containerd "$CTRD_SOCK" \
        --data-root "$DATA_DIR" \
        --exec-root "$EXEC_ROOT" \
        --pidfile "$PIDFILE" \
        -H "unix://$SOCK" \
        </dev/null >>"$LOG" 2>&1 &
    if ! wait_answers; then
        tail -n 30 "$LOG" >&2
        die "dockerd did not answer on $SOCK within ${START_TIMEOUT}s (log: $LOG)"
    fi
    log "running (pid $(cat "$PIDFILE"))"
    load_images
    echo "$SOCK"
}

stop() {
    local pid
    if pid=$(find_pid); then
        # Docker's containers first, so that no shim keeps a mount below the data root.
        if answers; then
            local ids
            ids=$(docker_ ps -aq 2>/dev/null || true)
            [ -z "$ids" ] || docker_ rm -f $ids >/dev/null 2>&1 || true
        fi
        log "stopping dockerd (pid $pid)"
        kill -TERM "$pid" 2>/dev/null || true
        local deadline=$((SECONDS + STOP_TIMEOUT))
        while kill -0 "$pid" 2>/dev/null; do
            if [ $SECONDS -ge $deadline ]; then
                log "still running after ${STOP_TIMEOUT}s; sending SIGKILL"
                kill -KILL "$pid" 2>/dev/null || true
                sleep 0.5
                break
            fi
            sleep 0.2
        done
    else
        log "not running"
    fi
    rm -f "$PIDFILE"
    # The mounts inside the root (the data root and the state dir stay bound on
    # themselves on the host, shared: harmless, and re-used by the next start).
    # Another dockerd running from the same root (a second instance, with its own
    # data root and state) keeps the root's mounts: only this one's binds go.
    [ -d "$ROOTFS" ] || return 0
    if other_dockerd_in_root; then
        local dir
        for dir in "$DATA_DIR" "$STATE_DIR"; do
            is_mounted "$ROOTFS$dir" && mount --make-rslave "$ROOTFS$dir"
            unmount_below "$ROOTFS$dir"
        done
    else
        unmount_root
    fi
    return 0
}

# Whether a dockerd other than this instance's runs chrooted in the root.
other_dockerd_in_root() {
    local d root
    root=$(realpath "$ROOTFS")
    for d in /proc/[0-9]*; do
        [ "$(cat "$d/comm" 2>/dev/null)" = dockerd ] || continue
        [ "$(readlink "$d/root" 2>/dev/null)" = "$root" ] && return 0
    done
    return 1
}

status() {
    if answers; then
        echo "running (pid $(find_pid || echo "?"), socket $SOCK, containerd $(cat "$STATE_DIR/containerd" 2>/dev/null || echo "?"))"
        return 0
    fi
    echo "not running"
    return 1
}

print_env() {
    printf 'export DOCKER_HOST=%q\n' "unix://$SOCK"
    printf 'export CRAB_DOCKER_ROOTFS=%q\n' "$ROOTFS"
    printf 'export CRAB_DOCKER_DATA=%q\n' "$DATA_DIR"
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
