#!/usr/bin/env bash
# Builds the small OCI images Crab's demo and integration tests run, as archives that
# `ctr images import` accepts. No registry is needed (the test hosts reach none):
#
#   docker.io/crab/busybox:latest  host's busybox-static + applet links, users root/nobody/crab
#   docker.io/crab/python:latest   Debian bookworm minbase + python3, venv, git, make, tcc,
#                                  sqlite3, patch (via debootstrap)
#   docker.io/crab/agent:latest    the python image's packages + nodejs (18) and the pinned
#                                  Claude Code CLI (npm @anthropic-ai/claude-code, installed
#                                  with the host's npm into /usr/local), for tests/claude_code.rs
#   docker.io/crab/pause:latest    a Kubernetes pod's sandbox image for the CRI tests: the
#                                  host's busybox-static alone, sleeping until TERM/INT; like
#                                  the real pause image it sets no PATH
#
# Each image is one reproducible gzip layer packed by hack/oci-image.py, in an archive
# that is both an OCI layout and a `docker load` archive. Output goes to
# ${CRAB_IMAGE_DIR:-/var/lib/crab/images}/<image>.tar; an existing archive is
# kept unless --force is given. The debootstrap results and the npm package are cached
# in ${CRAB_CACHE_DIR:-/var/cache/crab} so rebuilding the python and agent images is quick.
# Nothing is imported here: hack/containerd.sh and hack/docker.sh do that when they start.
#
#   hack/build-images.sh [--force] [busybox] [python] [agent] [pause]
#
# Environment: CRAB_IMAGE_DIR, CRAB_CACHE_DIR, CRAB_DEBIAN_MIRROR,
# SOURCE_DATE_EPOCH (mtime of every file in the layers, default 0).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IMAGE_DIR="${CRAB_IMAGE_DIR:-/var/lib/crab/images}"
CACHE_DIR="${CRAB_CACHE_DIR:-/var/cache/crab}"
MIRROR="${CRAB_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE=bookworm
IMAGE_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-0}"

log() { printf '\033[1;34m[images]\033[0m %s\n' "$*" >&2; }
die() { echo "build-images.sh: $*" >&2; exit 1; }

FORCE=0
WANT=()
for arg in "$@"; do
    case "$arg" in
        --force|-f) FORCE=1 ;;
        busybox|python|agent|pause) WANT+=("$arg") ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $arg (expected --force, busybox, python, agent, pause)" ;;
    esac
done
[ ${#WANT[@]} -gt 0 ] || WANT=(busybox python agent pause)

[ "$(id -u)" = 0 ] || die "must run as root (debootstrap and file ownership need it)"
PYTHON=$(command -v python3) || die "python3 is required"
ARCH=$(dpkg --print-architecture 2>/dev/null || echo amd64)

mkdir -p "$IMAGE_DIR" "$CACHE_DIR"
WORK=$(mktemp -d "$CACHE_DIR/build.XXXXXX")

# Unmounts anything left mounted below a directory (a failed debootstrap can leave
# proc/sys mounted), so that rm -rf never descends into a live file system.
unmount_below() {
    local dir mp
    dir=$(realpath -m "$1")
    awk -v d="$dir" '$5 == d || index($5, d "/") == 1 {print $5}' /proc/self/mountinfo | sort -r |
        while read -r mp; do umount -l "$mp" || true; done
}

cleanup() {
    unmount_below "$WORK"
    rm -rf "$WORK"
}
trap cleanup EXIT

write_etc() {
    # /etc files shared by both images: users root, nobody and crab (1000:1000).
    local rootfs=$1
    if [ -f "$rootfs/etc/passwd" ]; then
        grep -q '^crab:' "$rootfs/etc/passwd" ||
            echo 'crab:x:1000:1000:crab:/home/crab:/bin/sh' >>"$rootfs/etc/passwd"
        grep -q '^crab:' "$rootfs/etc/group" || echo 'crab:x:1000:' >>"$rootfs/etc/group"
        if [ -f "$rootfs/etc/shadow" ] && ! grep -q '^crab:' "$rootfs/etc/shadow"; then
            echo 'crab:*:19000:0:99999:7:::' >>"$rootfs/etc/shadow"
        fi
    else
        cat >"$rootfs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
crab:x:1000:1000:crab:/home/crab:/bin/sh
EOF
        cat >"$rootfs/etc/group" <<'EOF'
root:x:0:
nogroup:x:65534:
crab:x:1000:
EOF
    fi
    cat >"$rootfs/etc/hosts" <<'EOF'
127.0.0.1	localhost
::1	localhost ip6-localhost ip6-loopback
EOF
    echo localhost >"$rootfs/etc/hostname"
    : >"$rootfs/etc/resolv.conf"
    chmod 0644 "$rootfs/etc/resolv.conf" "$rootfs/etc/hosts" "$rootfs/etc/hostname"
    install -d -m 0755 -o 1000 -g 1000 "$rootfs/home/crab"
}

pack() {
    local rootfs=$1 name=$2 cmd=$3 out=$4
    "$PYTHON" "$ROOT/hack/oci-image.py" --rootfs "$rootfs" --name "$name" \
        --cmd "$cmd" --env "PATH=$IMAGE_PATH" --workdir / --arch "$ARCH" --output "$out"
}

build_busybox() {
    local out="$IMAGE_DIR/busybox.tar" rootfs="$WORK/busybox" applet
    local bb
    bb=$(command -v busybox || true)
    [ -n "$bb" ] || die "busybox not found (apt-get install busybox-static)"
    # A dynamically linked busybox would need the host's libc inside the image.
    if ldd "$bb" >/dev/null 2>&1; then
        die "$bb is dynamically linked; install busybox-static"
    fi
    log "building docker.io/crab/busybox:latest from $bb"
    install -d -m 0755 "$rootfs"/{bin,sbin,usr/bin,usr/sbin,usr/local/bin,etc,dev,proc,sys,run,var,home}
    install -d -m 0700 "$rootfs/root"
    install -d -m 1777 "$rootfs/tmp" "$rootfs/var/tmp"
    install -m 0755 "$bb" "$rootfs/bin/busybox"
    "$bb" --list-full | while read -r applet; do
        case "$applet" in
            */*) ;;        # linuxrc and other bare names are not commands
            *) continue ;;
        esac
        [ "$applet" = bin/busybox ] && continue
        mkdir -p "$rootfs/$(dirname "$applet")"
        ln -sfn /bin/busybox "$rootfs/$applet"
    done
    write_etc "$rootfs"
    pack "$rootfs" docker.io/crab/busybox:latest '["sh"]' "$out"
}

# The sandbox ("pause") image of the CRI tests' pods. No registry is reachable, so
# containerd's CRI plugin is given this one as its sandbox_image. It holds nothing but
# a static busybox, sets no environment (containerd gives a sandbox no PATH either) and
# exits on TERM or INT, as Kubernetes' pause does.
build_pause() {
    local out="$IMAGE_DIR/pause.tar" rootfs="$WORK/pause" bb
    bb=$(command -v busybox || true)
    [ -n "$bb" ] || die "busybox not found (apt-get install busybox-static)"
    ldd "$bb" >/dev/null 2>&1 && die "$bb is dynamically linked; install busybox-static"
    log "building docker.io/crab/pause:latest from $bb"
    install -d -m 0755 "$rootfs"/{bin,dev,proc,sys,etc}
    install -m 0755 "$bb" "$rootfs/bin/busybox"
    "$PYTHON" "$ROOT/hack/oci-image.py" --rootfs "$rootfs" --name docker.io/crab/pause:latest \
        --entrypoint '["/bin/busybox", "sh", "-c", "trap \"exit 0\" TERM INT; while :; do /bin/busybox sleep 3600 & wait $!; done"]' \
        --cmd '[]' --workdir / --arch "$ARCH" --output "$out"
}

# The python image's extra packages: git for the inspector's corpus; venv, make, a
# small C compiler (tcc with libc6-dev), sqlite3 and patch for the evaluation's tasks.
PY_INCLUDE=python3,python3-venv,git,make,tcc,libc6-dev,sqlite3,patch

debootstrap_cached() {
    # Prints the cached minbase rootfs with the packages $1 (comma-separated), creating
    # it on first use; $2 is a file that exists once the packages are in.
    local include=$1 marker=$2
    local cached="$CACHE_DIR/rootfs/$SUITE-$ARCH-${include//,/-}"
    if [ ! -x "$cached/$marker" ]; then
        command -v debootstrap >/dev/null || die "debootstrap not found (apt-get install debootstrap)"
        local tmp="$cached.tmp"
        unmount_below "$tmp"
        rm -rf "$tmp" "$cached"
        mkdir -p "$(dirname "$cached")"
        log "debootstrap --variant=minbase --include=$include $SUITE ($MIRROR); takes a few minutes"
        if ! debootstrap --variant=minbase --include="$include" --arch="$ARCH" \
                "$SUITE" "$tmp" "$MIRROR" >"$WORK/debootstrap.log" 2>&1; then
            tail -n 30 "$WORK/debootstrap.log" >&2
            tail -n 30 "$tmp/debootstrap/debootstrap.log" >&2 2>/dev/null || true
            unmount_below "$tmp"
            die "debootstrap failed"
        fi
        unmount_below "$tmp"
        mv "$tmp" "$cached"
    fi
    echo "$cached"
}

# Strips what a test image never uses from a debootstrapped rootfs: no network inside
# the tests, so package indexes, caches, docs and locales are dead weight.
slim_rootfs() {
    local rootfs=$1
    (
        cd "$rootfs"
        rm -rf var/lib/apt/lists/* var/cache/apt/* var/cache/debconf/*-old \
            var/lib/dpkg/*-old var/cache/ldconfig/aux-cache \
            usr/share/doc/* usr/share/man/* usr/share/info/* usr/share/locale/* \
            usr/share/lintian/* usr/share/linda/* debootstrap
        find var/log -type f -delete
        find dev -mindepth 1 -delete
    )
    mkdir -p "$rootfs/var/lib/apt/lists/partial" "$rootfs/var/cache/apt/archives/partial"
    install -d -m 1777 "$rootfs/tmp"
    write_etc "$rootfs"
}

# Debian's .pyc files are timestamp-checked; with every mtime fixed by the layer they
# would all be stale, so Python would recompile the standard library on each start.
# Rewrite them as checked-hash pycs (PEP 552), which do not depend on mtimes.
RECOMPILE_PYC='
import os, py_compile, sys
n = 0
for top in sys.argv[1:]:
    for d, dirs, files in os.walk(top):
        if os.path.basename(d) != "__pycache__":
            continue
        for f in files:
            if not f.endswith(".pyc"):
                continue
            pyc = os.path.join(d, f)
            stem, tag = f[:-4].split(".", 1)
            opt = tag.split(".opt-")[1] if ".opt-" in tag else ""
            src = os.path.join(os.path.dirname(d), stem + ".py")
            if not os.path.exists(src):
                os.unlink(pyc)
                continue
            level = int(opt) if opt else 0
            py_compile.compile(src, cfile=pyc, doraise=False, optimize=level,
                invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
            n += 1
print(f"rewrote {n} pyc files", file=sys.stderr)
'

build_python() {
    local out="$IMAGE_DIR/python.tar" rootfs="$WORK/python" cached
    cached=$(debootstrap_cached "$PY_INCLUDE" usr/bin/python3)
    log "building docker.io/crab/python:latest from $cached"
    cp -a "$cached" "$rootfs"
    slim_rootfs "$rootfs"
    chroot "$rootfs" /usr/bin/python3 -c "$RECOMPILE_PYC" /usr/lib
    pack "$rootfs" docker.io/crab/python:latest '["python3"]' "$out"
    echo "$PY_INCLUDE" >"$out.include"
}

# The agent image: the real Claude Code CLI. Its last release that is plain JavaScript
# for node >= 18 (later ones need node 22 or ship a native binary); bookworm's nodejs is
# 18. Its optional dependencies (sharp, for images) are left out, as are the ripgrep
# builds for other systems. Its system is the python image's (the evaluation's
# task image: python, git, make, tcc, sqlite3) plus node, as a benchmark installs
# Claude Code into its task container: one recorded task runs under every agent.
CLAUDE_CODE_VERSION=2.1.112
AGENT_INCLUDE=$PY_INCLUDE,nodejs,ca-certificates

build_agent() {
    local out="$IMAGE_DIR/agent.tar" rootfs="$WORK/agent" cached tgz pkg
    command -v npm >/dev/null || die "npm not found on the host (apt-get install npm)"
    cached=$(debootstrap_cached "$AGENT_INCLUDE" usr/bin/node)
    tgz="$CACHE_DIR/npm/anthropic-ai-claude-code-$CLAUDE_CODE_VERSION.tgz"
    if [ ! -s "$tgz" ]; then
        log "npm pack @anthropic-ai/claude-code@$CLAUDE_CODE_VERSION"
        mkdir -p "$CACHE_DIR/npm"
        (cd "$WORK" && npm pack --silent --cache "$CACHE_DIR/npm/cache" \
            "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" >/dev/null) ||
            die "npm pack @anthropic-ai/claude-code@$CLAUDE_CODE_VERSION failed"
        mv "$WORK/anthropic-ai-claude-code-$CLAUDE_CODE_VERSION.tgz" "$tgz"
    fi
    log "building docker.io/crab/agent:latest from $cached and $tgz"
    cp -a "$cached" "$rootfs"
    slim_rootfs "$rootfs"
    npm install --global --prefix "$rootfs/usr/local" --cache "$CACHE_DIR/npm/cache" \
        --offline --omit=optional --ignore-scripts --no-audit --no-fund --silent "$tgz" ||
        die "npm install of $tgz into the image failed"
    pkg="$rootfs/usr/local/lib/node_modules/@anthropic-ai/claude-code"
    [ -f "$pkg/cli.js" ] || die "$pkg/cli.js missing after npm install"
    # vendor/{ripgrep,audio-capture}/<arch>-<os>: keep this system's only.
    find "$pkg/vendor/ripgrep" "$pkg/vendor/audio-capture" -mindepth 1 -maxdepth 1 -type d \
        ! -name "${ARCH/amd64/x64}-linux" -exec rm -rf {} +
    chown -R 0:0 "$rootfs/usr/local"
    chroot "$rootfs" /usr/local/bin/claude --version >/dev/null ||
        die "claude --version fails inside the image"
    pack "$rootfs" docker.io/crab/agent:latest '["claude", "--version"]' "$out"
    echo "$AGENT_INCLUDE claude-code@$CLAUDE_CODE_VERSION" >"$out.include"
}

for image in "${WANT[@]}"; do
    out="$IMAGE_DIR/$image.tar"
    # An archive built with another package list is stale.
    stale=0
    if [ "$image" = python ] && [ "$(cat "$out.include" 2>/dev/null)" != "$PY_INCLUDE" ]; then
        stale=1
    fi
    if [ "$image" = agent ] &&
        [ "$(cat "$out.include" 2>/dev/null)" != "$AGENT_INCLUDE claude-code@$CLAUDE_CODE_VERSION" ]; then
        stale=1
    fi
    # Archives made before they carried Docker's manifest.json (docker load needs it);
    # the rebuilt layers are the same bytes, so containerd's import is unchanged.
    if [ -s "$out" ] && ! tar -tf "$out" manifest.json >/dev/null 2>&1; then
        stale=1
    fi
    if [ -s "$out" ] && [ "$FORCE" = 0 ] && [ "$stale" = 0 ]; then
        log "$out exists (use --force to rebuild)"
        continue
    fi
    start=$SECONDS
    "build_$image"
    log "$out: $(du -h "$out" | cut -f1), built in $((SECONDS - start)) s"
done
