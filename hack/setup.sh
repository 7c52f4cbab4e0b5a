#!/usr/bin/env bash
# Installs everything Crab needs on a fresh Debian 12 (bookworm) host and builds the
# project. Idempotent: every step checks whether its result is already there.
#
#   hack/setup.sh            # packages, CRIU, containerd, tracefs, shim, test images,
#                            # Docker 26 in an isolated trixie root (hack/docker.sh),
#                            # mini-swe-agent in a venv (hack/mini-swe-agent.sh)
#   CRAB_SKIP_BUILD=1 ...    # everything but the cargo build and shim install
#   CRAB_BUILD_TESTS=1 ...   # the build also compiles every test (hack/test.sh)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CRIU_VERSION=4.2.1
# CRIU caches what it learns of the kernel (about 40 ms of probing, paid by every dump
# and restore without it) in <dir>/criu.kdat, and keeps that file only on a tmpfs, so
# that a reboot drops it. /run is not a tmpfs on every machine: CRIU is built to keep
# it in a tmpfs of its own, mounted here (root only).
CRIU_KDAT_DIR=/run/criu
export DEBIAN_FRONTEND=noninteractive

log() { printf '\033[1;34m[setup]\033[0m %s\n' "$*" >&2; }

need_root() {
    if [ "$(id -u)" != 0 ]; then
        echo "hack/setup.sh must run as root (it installs packages and mounts file systems)" >&2
        exit 1
    fi
}

apt_sources() {
    # trixie for containerd 1.7 (installed explicitly with -t, never by default);
    # sid as a source-only entry for CRIU's source package.
    local list=/etc/apt/sources.list.d/crab.list
    if [ ! -f "$list" ]; then
        log "adding trixie (binary, low pin) and sid (source only) apt entries"
        cat >"$list" <<'SRC'
deb http://deb.debian.org/debian trixie main
deb-src http://deb.debian.org/debian sid main
SRC
        cat >/etc/apt/preferences.d/crab-trixie <<'PIN'
Package: *
Pin: release n=trixie
Pin-Priority: 100
PIN
        rm -f /var/lib/crab-setup/apt-updated
    fi
    mkdir -p /var/lib/crab-setup
    if [ ! -f /var/lib/crab-setup/apt-updated ]; then
        apt-get update -qq
        touch /var/lib/crab-setup/apt-updated
    fi
}

install_packages() {
    local pkgs=(
        build-essential pkg-config git curl ca-certificates xz-utils jq
        clang llvm libbpf-dev bpftool libelf-dev zlib1g-dev libseccomp-dev
        btrfs-progs zfs-fuse busybox-static debootstrap iproute2 util-linux e2fsprogs
        # the CRI tests' pod network (bridge, loopback, host-local in /usr/lib/cni)
        containernetworking-plugins
        # the evaluation's plots (crab-eval draws its text with this font)
        fonts-dejavu-core
        # CRIU saves and locks a network namespace's rules with these (runc's dumps
        # fail without them; Crab locks with nftables but still saves iptables rules)
        iptables tar
        # mini-swe-agent's venv (hack/mini-swe-agent.sh)
        python3-venv
        # CRIU build dependencies (bookworm versions are fine)
        libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler
        python3-protobuf libnl-3-dev libnet1-dev libcap-dev libaio-dev
        libgnutls28-dev libbsd-dev uuid-dev libnftables-dev
        asciidoc-base xmlto
    )
    local missing=()
    for p in "${pkgs[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    # hack/build-images.sh packs Claude Code for the agent image with npm; a host
    # whose node came from elsewhere already has one.
    command -v npm >/dev/null || missing+=(npm)
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing: ${missing[*]}"
        apt-get install -y -qq --no-install-recommends "${missing[@]}"
    fi
}

install_containerd() {
    if command -v containerd >/dev/null && containerd --version | grep -q ' 1\.7\.\| v1\.7\.'; then
        return
    fi
    # Only containerd itself comes from trixie ("pkg/release" form: its dependencies are
    # resolved from bookworm). `-t trixie` would pull trixie's runc, which needs glibc
    # 2.38, and so upgrade the host's libc6: never do that.
    log "installing containerd 1.7 from trixie, runc from bookworm"
    apt-get install -y -qq --no-install-recommends runc containerd/trixie
    # The package may start a system containerd (when an init system runs); Crab's
    # demo and tests run their own instance on their own socket and never touch it.
    containerd --version
}

install_criu() {
    if command -v criu >/dev/null && criu --version | grep -q "Version: ${CRIU_VERSION}" \
        && grep -qa "${CRIU_KDAT_DIR}/criu.kdat" "$(command -v criu)"; then
        return
    fi
    log "building CRIU ${CRIU_VERSION} from Debian's source package"
    local work=/var/lib/crab-setup/criu
    mkdir -p "$work"
    (
        cd "$work"
        if [ ! -f "criu_${CRIU_VERSION}.orig.tar.xz" ]; then
            # The .debian.tar.xz of sid is not always served; only the orig tarball is needed.
            apt-get source --download-only "criu=${CRIU_VERSION}"'*' >/dev/null 2>&1 \
                || apt-get source --download-only criu >/dev/null 2>&1 || true
        fi
        local orig
        orig=$(ls criu_"${CRIU_VERSION}"*.orig.tar.* 2>/dev/null | head -n1 || true)
        if [ -z "$orig" ]; then
            echo "could not download criu_${CRIU_VERSION}.orig.tar.* from Debian's sid sources" >&2
            exit 1
        fi
        rm -rf "criu-${CRIU_VERSION}"
        tar xf "$orig"
        cd "criu-${CRIU_VERSION}"
        make -j"$(nproc)" criu RUNDIR="$CRIU_KDAT_DIR" >build.log 2>&1 || { tail -n 50 build.log >&2; exit 1; }
        install -m 0755 criu/criu /usr/local/sbin/criu
    )
    criu --version
    criu check >/dev/null 2>&1 || { criu check; exit 1; }
}

mount_kernel_fs() {
    mkdir -p "$CRIU_KDAT_DIR"
    [ "$(stat -f -c %T "$CRIU_KDAT_DIR")" = tmpfs ] \
        || mount -t tmpfs -o size=1m,mode=0700 crab-criu "$CRIU_KDAT_DIR"
    mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing
    mountpoint -q /sys/kernel/debug || mount -t debugfs nodev /sys/kernel/debug || true
    mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
}

build_shim() {
    [ "${CRAB_SKIP_BUILD:-0}" = 1 ] && return
    if [ "${CRAB_BUILD_TESTS:-0}" = 1 ]; then
        # hack/test.sh: the binaries and every test at once, with the selection and
        # features its cargo test commands use (dependencies compiled once).
        log "building the workspace and its tests"
        (cd "$ROOT" && cargo build --release --workspace --all-features --all-targets)
    else
        log "building the shim"
        (cd "$ROOT" && cargo build --release -p crab-shim -p crabctl -p crab-snapshotter)
    fi
    install -m 0755 "$ROOT/target/release/containerd-shim-crab-v2" /usr/local/bin/containerd-shim-crab-v2
    install -m 0755 "$ROOT/target/release/crabctl" /usr/local/bin/crabctl
    # Crab's snapshotter: CRI's default snapshotter of hack/containerd.sh --cri.
    install -m 0755 "$ROOT/target/release/crab-snapshotter" /usr/local/bin/crab-snapshotter
    # An upgrade leaves the previous build's eBPF programs pinned and attached,
    # and every system call on the host pays for them: detach the unused ones.
    local root
    for root in /sys/fs/bpf/crab /sys/fs/bpf/crab-test; do
        [ -d "$root" ] || continue
        /usr/local/bin/crabctl inspector prune --pin-root "$root" ||
            log "could not prune the eBPF program sets below $root"
    done
}

build_images() {
    "$ROOT/hack/build-images.sh"
}

docker_root() {
    # trixie's dockerd, CLI and docker-py in a root of their own: the host stays bookworm.
    "$ROOT/hack/docker.sh" install
}

mini_swe_agent() {
    # mini-swe-agent from PyPI in a venv of its own, for tests/mini_swe_agent.rs.
    "$ROOT/hack/mini-swe-agent.sh" install
}

storage_pools() {
    "$ROOT/hack/pool.sh"
    # ZFS for the zfs backend (the zfs-fuse daemon where the kernel has no ZFS).
    "$ROOT/hack/zfs.sh"
}

need_root
apt_sources
install_packages
install_containerd
mount_kernel_fs
install_criu
storage_pools
build_shim
build_images
docker_root
mini_swe_agent
log "done"
