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
#   zfs_dataset = "crab/crab"
set -euo pipefail

POOL="${CRAB_ZFS_POOL:-crab}"
DATASET="${CRAB_ZFS_DATASET:-$POOL/crab}"
MOUNT="${CRAB_ZFS_MOUNT:-/var/lib/crab/zfs}"
FILE="${CRAB_ZFS_FILE:-/var/lib/crab/zfs-pool.img}"
SIZE="${CRAB_ZFS_SIZE:-4G}"
PIDFILE="${CRAB_ZFS_PIDFILE:-/run/zfs-fuse.pid}"
LOG="${CRAB_ZFS_LOG:-/var/log/zfs-fuse.log}"

MOUNT_ALL=0

log() { printf '\033[1;34m[zfs]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31m[zfs]\033[0m %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "hack/zfs.sh must run as root"

# One at a time: two callers must not both start a daemon or create the pool.
LOCK="${CRAB_ZFS_LOCK:-/run/crab-zfs.lock}"
exec {lock_fd}>"$LOCK"
flock "$lock_fd"

kernel_zfs() { [ -d /sys/module/zfs ]; }

daemon_pid() {
    local pid
    [ -f "$PIDFILE" ] || return 1
    pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
    [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = zfs-fuse ] || return 1
    echo "$pid"
}

zfs_answers() { zpool list -H -o name >/dev/null 2>&1; }

# Any zfs-fuse process that is not a zombie (whoever started it).
any_daemon() { ps -C zfs-fuse -o stat= | grep -qv '^Z'; }

start_daemon() {
    kernel_zfs && return
    if zfs_answers; then
        return
    fi
    command -v zfs-fuse >/dev/null || die "neither kernel ZFS nor zfs-fuse is installed (apt-get install zfs-fuse)"
    if ! any_daemon; then
        # A daemon that died leaves its FUSE mounts behind, dead ("transport endpoint
        # is not connected"): remount would fail on them.
        awk '$3 == "fuse.zfs" { print $2 }' /proc/self/mounts | sort -r | while read -r m; do
            log "detaching stale mount $m"
            umount -l "$m" || true
        done
        # zfs-fuse refuses to start while its pid file exists, even a dead one's.
        rm -f "$PIDFILE"
        log "starting zfs-fuse (pid file $PIDFILE, log $LOG)"
        mkdir -p "$(dirname "$PIDFILE")" "$(dirname "$LOG")"
        (
            # As Debian's init script does: zfs-fuse locks memory and runs ~150 threads.
            ulimit -l unlimited 2>/dev/null || true
            ulimit -c 0
            # setsid, and no descriptor of ours: the daemon outlives this shell, holds
            # none of its pipes open (a caller reading our output must see EOF) and not
            # the lock.
            for fd in /proc/$BASHPID/fd/*; do
                fd=${fd##*/}
                [ "$fd" -gt 2 ] && eval "exec $fd>&-" 2>/dev/null
            done
            exec setsid zfs-fuse --pidfile "$PIDFILE" --enable-xattr \
                </dev/null >>"$LOG" 2>&1
        ) || die "zfs-fuse did not start (it reports to syslog, and to $LOG)"
        MOUNT_ALL=1
    fi
    local i
    for i in $(seq 1 100); do
        zfs_answers && break
        sleep 0.1
    done
    zfs_answers || die "zfs-fuse does not answer after 10 s (see syslog and $LOG)"
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
        MOUNT_ALL=1
        return
    fi
    log "creating pool $POOL on $FILE ($SIZE, sparse)"
    mkdir -p "$(dirname "$FILE")"
    truncate -s "$SIZE" "$FILE"
    zpool create -m none "$POOL" "$FILE"
}

ensure_dataset() {
    if [ "$MOUNT_ALL" = 1 ]; then
        # A fresh daemon imports the pools it knew but mounts nothing. Only now: mounting
        # everything while a store works could remount a dataset it has just unmounted
        # to rename or destroy it.
        zfs mount -a 2>/dev/null || true
    fi
    if ! zfs list -H -o name "$DATASET" >/dev/null 2>&1; then
        log "creating dataset $DATASET at $MOUNT"
        mkdir -p "$MOUNT"
        zfs create -p -o mountpoint="$MOUNT" -o atime=off -o compression=on "$DATASET"
    fi
    [ "$(zfs get -H -o value mounted "$DATASET")" = yes ] || zfs mount "$DATASET"
    local at
    at=$(zfs get -H -o value mountpoint "$DATASET")
    [ "$at" = "$MOUNT" ] || log "note: $DATASET is mounted at $at, not $MOUNT"
}

stop() {
    if kernel_zfs; then
        if pool_imported; then
            log "exporting pool $POOL"
            zpool export "$POOL"
        fi
        return
    fi
    if zfs_answers && pool_imported; then
        log "exporting pool $POOL"
        zpool export "$POOL" || die "could not export $POOL (a file system is busy?)"
    fi
    local pid
    if ! pid=$(daemon_pid); then
        any_daemon && die "zfs-fuse runs but not under $PIDFILE: stop it yourself"
        log "zfs-fuse is not running"
        rm -f "$PIDFILE"
        return
    fi
    log "stopping zfs-fuse ($pid)"
    if zfs_answers; then
        zfs unmount -a 2>/dev/null || true
    fi
    kill "$pid"
    local i
    for i in $(seq 1 150); do
        [ -d "/proc/$pid" ] || break
        sleep 0.1
    done
    if [ -d "/proc/$pid" ]; then
        # A hung daemon: its mounts die with it (the next start detaches them).
        log "zfs-fuse ($pid) did not exit within 15 s: killing it"
        kill -9 "$pid" 2>/dev/null || true
        sleep 0.5
    fi
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
