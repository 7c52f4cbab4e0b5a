#!/usr/bin/env bash
# Starts ZFS for Crab's `zfs` storage backend and creates its embedded pool.
# Idempotent: running it again finds everything in place and changes nothing.
#
#   hack/zfs.sh          # start ZFS, create (or import) the pool, mount Crab's dataset
#   hack/zfs.sh stop     # export the pool and stop the zfs-fuse daemon
#
# Where the kernel has no ZFS module (containers, CI), ZFS runs as the zfs-fuse daemon,
# started here detached from the calling shell (pid file $CRAB_ZFS_PIDFILE, extended
# attributes enabled: images carry file capabilities). On hosts with kernel OpenZFS no
# daemon is started; the same pool layout is made with the same commands.
#
# Layout (every name can be overridden from the environment):
#   pool      $CRAB_ZFS_POOL     (crab) on the sparse file $CRAB_ZFS_FILE
#             (/var/lib/crab/zfs-pool.img) of $CRAB_ZFS_SIZE (4G); its top dataset
#             is not mounted
#   dataset   $CRAB_ZFS_DATASET  ($CRAB_ZFS_POOL/crab), Crab's root, mounted at
#             $CRAB_ZFS_MOUNT (/var/lib/crab/zfs), with atime=off and compression=on;
#             the store makes images/, containers/, tmp/ and retired/ below it
#
# The runtime's configuration then says:
#   [storage]
#   backend = "zfs"
#   pool = "crab/crab"
set -euo pipefail

POOL="${CRAB_ZFS_POOL:-crab}"
DATASET="${CRAB_ZFS_DATASET:-$POOL/crab}"
MOUNT="${CRAB_ZFS_MOUNT:-/var/lib/crab/zfs}"
FILE="${CRAB_ZFS_FILE:-/var/lib/crab/zfs-pool.img}"
SIZE="${CRAB_ZFS_SIZE:-4G}"
PIDFILE="${CRAB_ZFS_PIDFILE:-/run/zfs-fuse.pid}"
LOG="${CRAB_ZFS_LOG:-/var/log/zfs-fuse.log}"

log() { printf '\033[1;34m[zfs]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31m[zfs]\033[0m %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "hack/zfs.sh must run as root"

kernel_zfs() { [ -d /sys/module/zfs ]; }

daemon_pid() {
    local pid
    [ -f "$PIDFILE" ] || return 1
    pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
    [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = zfs-fuse ] || return 1
    echo "$pid"
}

zfs_answers() { zpool list -H -o name >/dev/null 2>&1; }

start_daemon() {
    kernel_zfs && return
    if zfs_answers; then
        return
    fi
    command -v zfs-fuse >/dev/null || die "neither kernel ZFS nor zfs-fuse is installed (apt-get install zfs-fuse)"
    if ! pgrep -x zfs-fuse >/dev/null; then
        # A daemon that died leaves its FUSE mounts behind, dead ("transport endpoint
        # is not connected"): remount would fail on them.
        awk '$3 == "fuse.zfs" { print $2 }' /proc/self/mounts | sort -r | while read -r m; do
            log "detaching stale mount $m"
            umount -l "$m" || true
        done
        log "starting zfs-fuse (pid file $PIDFILE, log $LOG)"
        mkdir -p "$(dirname "$PIDFILE")" "$(dirname "$LOG")"
        (
            # As Debian's init script does: zfs-fuse locks memory and runs ~150 threads.
            ulimit -l unlimited 2>/dev/null || true
            ulimit -c 0
            # setsid + closed stdio: the daemon outlives this shell and holds none of
            # its pipes open (a caller reading our output must see EOF).
            exec setsid zfs-fuse --pidfile "$PIDFILE" --enable-xattr \
                </dev/null >>"$LOG" 2>&1
        )
    fi
    local i
    for i in $(seq 1 100); do
        zfs_answers && break
        sleep 0.1
    done
    zfs_answers || die "zfs-fuse does not answer after 10 s (see $LOG)"
    local pid
    if pid=$(daemon_pid); then
        # Killing the daemon would take every container's file system with it.
        echo -1000 >"/proc/$pid/oom_score_adj" 2>/dev/null || true
        tr '\0' '\n' <"/proc/$pid/cmdline" | grep -qx -- '--enable-xattr\|-x' \
            || grep -q '^[[:space:]]*enable-xattr' /etc/zfs/zfsrc 2>/dev/null \
            || log "warning: the running zfs-fuse was started without --enable-xattr: images with xattrs will fail to copy"
    fi
}

pool_imported() { zpool list -H -o name "$POOL" >/dev/null 2>&1; }

ensure_pool() {
    if pool_imported; then
        return
    fi
    if [ -f "$FILE" ]; then
        log "importing pool $POOL from $FILE"
        local dir
        dir=$(dirname "$FILE")
        local out
        if ! out=$(zpool import -d "$dir" "$POOL" 2>&1); then
            # After a daemon crash the pool still looks in use (by this very host).
            if grep -q "in use\|-f" <<<"$out"; then
                zpool import -f -d "$dir" "$POOL"
            else
                printf '%s\n' "$out" >&2
                die "could not import pool $POOL from $FILE"
            fi
        fi
        return
    fi
    log "creating pool $POOL on $FILE ($SIZE, sparse)"
    mkdir -p "$(dirname "$FILE")"
    truncate -s "$SIZE" "$FILE"
    zpool create -m none "$POOL" "$FILE"
}

ensure_dataset() {
    if ! zfs list -H -o name "$DATASET" >/dev/null 2>&1; then
        log "creating dataset $DATASET at $MOUNT"
        mkdir -p "$MOUNT"
        zfs create -p -o mountpoint="$MOUNT" -o atime=off -o compression=on "$DATASET"
    fi
    # Mounts everything below as well (after an import, zfs-fuse mounts only some).
    zfs mount -a 2>/dev/null || true
    [ "$(zfs get -H -o value mounted "$DATASET")" = yes ] || zfs mount "$DATASET"
    local at
    at=$(zfs get -H -o value mountpoint "$DATASET")
    [ "$at" = "$MOUNT" ] || log "note: $DATASET is mounted at $at, not $MOUNT"
}

stop() {
    if kernel_zfs; then
        pool_imported && { log "exporting pool $POOL"; zpool export "$POOL"; }
        return
    fi
    if ! zfs_answers; then
        log "zfs-fuse is not running"
        rm -f "$PIDFILE"
        return
    fi
    if pool_imported; then
        log "exporting pool $POOL"
        zpool export "$POOL" || die "could not export $POOL (a file system is busy?)"
    fi
    local pid
    if ! pid=$(daemon_pid); then
        die "zfs-fuse runs but not under $PIDFILE: stop it yourself"
    fi
    log "stopping zfs-fuse ($pid)"
    zfs unmount -a 2>/dev/null || true
    kill "$pid"
    local i
    for i in $(seq 1 150); do
        [ -d "/proc/$pid" ] || break
        sleep 0.1
    done
    [ -d "/proc/$pid" ] && die "zfs-fuse ($pid) did not exit within 15 s"
    rm -f "$PIDFILE"
}

case "${1:-start}" in
    start)
        start_daemon
        ensure_pool
        ensure_dataset
        ;;
    stop)
        stop
        ;;
    *)
        echo "usage: $0 [start|stop]" >&2
        exit 2
        ;;
esac
