#!/usr/bin/env bash
# The embedded default btrfs pool: a btrfs file system on a sparse loop file under the
# project's data dir, mounted where Crab's configuration points (`[storage] pool`).
# Idempotent: creates the file once, (re)mounts it when it is not mounted.
# The file is root-only (0600: it holds every container's files) and the pool is
# mounted nosuid,nodev (a container's setuid programs and device nodes in its tree
# mean nothing on the host); the runtime makes its directories 0700.
#
#   hack/pool.sh            create and mount
#   hack/pool.sh umount     unmount (the file stays)
#
# Environment: CRAB_POOL_FILE [/var/lib/crab/pool.img], CRAB_POOL_SIZE [8G],
#              CRAB_POOL_DIR [/var/lib/crab/pool]
set -euo pipefail

FILE="${CRAB_POOL_FILE:-/var/lib/crab/pool.img}"
SIZE="${CRAB_POOL_SIZE:-8G}"
DIR="${CRAB_POOL_DIR:-/var/lib/crab/pool}"

log() { printf '\033[1;34m[pool]\033[0m %s\n' "$*" >&2; }

if [ "${1:-}" = "umount" ]; then
    mountpoint -q "$DIR" && umount "$DIR"
    exit 0
fi

mkdir -p "$(dirname "$FILE")" "$DIR"
if [ -f "$FILE" ]; then
    chmod 0600 "$FILE"
fi
if mountpoint -q "$DIR"; then
    # A pool mounted by an older set-up: tighten it in place.
    mount -o remount,nosuid,nodev "$DIR"
    exit 0
fi
if [ ! -f "$FILE" ]; then
    log "creating a $SIZE btrfs pool in $FILE"
    (umask 077 && truncate -s "$SIZE" "$FILE")
    chmod 0600 "$FILE"
    mkfs.btrfs -q -f "$FILE" >/dev/null
fi
mount -o loop,nosuid,nodev "$FILE" "$DIR"
log "btrfs pool mounted at $DIR (nosuid,nodev)"
