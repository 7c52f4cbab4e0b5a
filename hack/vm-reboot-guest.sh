#!/bin/bash
# The steps of `hack/vm-smoke.sh --reboot` inside its VM: two boots of one guest
# whose third disk (/dev/vdc, ext4) keeps what a host keeps across a reboot:
# containerd's root and Crab's (/var/lib/crab: the btrfs loop-file pool made by
# hack/pool.sh, the histories). The root file system and /run start empty each boot.
#
# Boot 1 (crab.phase=1 on the kernel's command line) runs a counter container,
# takes a checkpoint Crab reports durable, changes the container after it, prints
# what boot 2 must see ("EXPECT AT LATER"), and resets the machine at once (sysrq b:
# no sync, no unmount, as a power cut: only what Crab synced is on the disk).
# Boot 2 (crab.phase=2 crab.expect=AT,LATER) mounts the pool again before containerd
# starts, as a host's boot must, restores the container with `crabctl restore`, and
# checks its file, its in-memory counter, the inspector and a rollback; then forks
# that adopt replicas, on this v2-only host.
set -u
# shellcheck source=hack/vm-guest-lib.sh
. /smoke/lib.sh

arg() { tr ' ' '\n' </proc/cmdline | sed -n "s/^crab\.$1=//p"; }
PHASE=$(arg phase)

# The data disk under /var/lib, the pool mounted by the set-up's own script, and
# Crab's configuration (the root file system is a new one each boot).
setup() {
    info "guest started, phase $PHASE"
    guest_mounts
    # The loop device and btrfs are modules in the cloud kernel; no udev loads them.
    modprobe -a loop btrfs 2>/dev/null
    mkdir -p /data
    mount /dev/vdc /data || { fail "mount the data disk"; finish; }
    mkdir -p /data/crab /data/containerd /var/lib/crab /var/lib/containerd
    mount --bind /data/crab /var/lib/crab
    mount --bind /data/containerd /var/lib/containerd
    CRAB_POOL_SIZE=2G bash /smoke/pool.sh 2>&1 | sed 's/^/INFO   /'
    # Byte quotas on the pool need btrfs simple quotas (kernel 6.7); this is 6.1.
    start_with_config 'log_level = "debug"
[quota]
sandbox_pool_bytes = "none"'
}

phase1() {
    ctr -n "$NS" images import --all-platforms /smoke/images/busybox.tar >/dev/null 2>&1 ||
        { fail "import busybox"; finish; }
    run_counter c1
    check "run" wait_for 60 bash -c "ctr -n $NS task exec --exec-id e1 c1 cat /state | grep -qx before"
    local at later
    at=$(count_of c1 1)
    if ! crabctl -n "$NS" checkpoint c1 --name durable >/tmp/ckpt.out 2>&1; then
        fail "checkpoint"
        sed 's/^/  | /' /tmp/ckpt.out | tail -n 20
        dump_logs
        finish
    fi
    sed 's/^/INFO   /' /tmp/ckpt.out
    pass "checkpoint"
    sleep 3
    ctr -n "$NS" task exec --exec-id w1 c1 sh -c 'echo after > /state' >/dev/null 2>&1
    later=$(count_of c1 2)
    info "counter: $at before the checkpoint, $later later; /state: after"
    if [ "$FAILED" != 0 ] || [ -z "$at" ] || [ -z "$later" ]; then
        fail "boot 1 read its counter"
        finish
    fi
    echo "EXPECT $at $later"
    echo "SMOKE REBOOT $PASSED passed"
    # No sync: the reset drops what is only in the page cache.
    echo b >/proc/sysrq-trigger
    sleep 30
}

phase2() {
    local expect at later
    expect=$(arg expect)
    at=${expect%,*}
    later=${expect#*,}
    info "boot 1 counted $at before its checkpoint and $later after it"
    check "the pool is mounted again before containerd" mountpoint -q /var/lib/crab/pool
    check "containerd knows c1 and has no task of it" bash -c \
        "ctr -n $NS containers ls -q | grep -qx c1 && ! ctr -n $NS task ls -q | grep -qx c1"
    check "crabctl ls reads the durable checkpoint from the store" bash -c \
        "crabctl -n $NS ls c1 | grep -q durable"
    local t0 t1
    t0=$(date +%s%N)
    if ! crabctl -n "$NS" restore c1 >/tmp/restore.out 2>&1; then
        fail "crabctl restore after the reboot"
        sed 's/^/  | /' /tmp/restore.out | tail -n 20
        dump_logs 60
        finish
    fi
    t1=$(date +%s%N)
    sed 's/^/INFO   /' /tmp/restore.out
    info "crabctl restore took $(((t1 - t0) / 1000000)) ms (TCG: not a figure)"
    pass "crabctl restore after the reboot"
    local after state
    after=$(count_of c1 3)
    state=$(ctr -n "$NS" task exec --exec-id r1 c1 cat /state 2>/dev/null)
    info "counter after the restore: $after; /state: $state"
    check "the restore brings the checkpoint's file and in-memory counter back" bash -c \
        "[ '$state' = before ] && [ -n '$after' ] && [ '$after' -ge '$at' ] && [ '$after' -lt '$later' ]"
    # The inspector's maps were pinned by boot 1's shim in a bpffs that is gone; the
    # new shim pinned them again. After a restore, recording starts at the next full
    # checkpoint (until then every turn is full: what the restore changed is unknown).
    check "a checkpoint after the reboot" crabctl -n "$NS" checkpoint c1 --name after-reboot
    ctr -n "$NS" task exec --exec-id t1 c1 sh -c 'echo x > /turn-file' >/dev/null 2>&1
    crabctl -n "$NS" turn c1 --dry-run >/tmp/turn.out 2>&1
    sed 's/^/INFO   /' /tmp/turn.out | head -n 8
    check "the eBPF inspector names a turn's write after the reboot" grep -q '/turn-file' /tmp/turn.out
    ctr -n "$NS" task exec --exec-id w2 c1 sh -c 'echo again > /state' >/dev/null 2>&1
    check "a rollback to the checkpoint from before the reboot" bash -c \
        "crabctl -n $NS rollback c1 durable && ctr -n $NS task exec --exec-id r2 c1 cat /state | grep -qx before"
    ctr -n "$NS" task kill -s KILL c1 >/dev/null 2>&1
    wait_for 60 bash -c "ctr -n $NS task ls | grep -q 'c1.*STOPPED'"
    ctr -n "$NS" task rm c1 >/dev/null 2>&1
    check "delete" ctr -n "$NS" container rm c1
    step_fork_replicas
    [ "$FAILED" = 0 ] || dump_logs 60
}

# The init pids of f0's replicas for forks, one a line (`crabctl stats`: "replicas
# for forks: N of checkpoint seq S, init pids P Q").
replica_pids() {
    crabctl -n "$NS" stats f0 2>/dev/null | sed -n 's/.*replicas for forks: .*init pids //p' |
        tr ' ' '\n' | grep .
}
two_replicas() { [ "$(replica_pids | wc -l)" = 2 ]; }

# fork_holds FORK PID LIMIT AT COUNT: the fork runs the checkpoint's file, in a
# cgroup of its own with the source's memory limit, its counter from the checkpoint's.
fork_holds() {
    ctr -n "$NS" task exec --exec-id "s$1" "$1" cat /state | grep -qx before &&
        grep -qx "0::/default/$1" "/proc/$2/cgroup" &&
        [ "$(cat "/sys/fs/cgroup/default/$1/memory.max")" = "$3" ] &&
        [ -n "$5" ] && [ "$5" -ge "$4" ]
}

# Forks that adopt replicas (`io.crab.standby.forks`; btrfs stores only) on a v2-only
# host, where the replica's one cgroup directory becomes the fork's.
step_fork_replicas() {
    local limit=268435456 at out n pid replicas fork count adopted=0
    run_counter f0 --annotation io.crab.standby.forks=2 --memory-limit "$limit"
    wait_for 60 bash -c "ctr -n $NS task exec --exec-id fe f0 cat /state | grep -qx before"
    at=$(count_of f0 f0)
    if ! crabctl -n "$NS" checkpoint f0 --name base >/tmp/ckpt.out 2>&1; then
        fail "a checkpoint of a container keeping replicas for forks"
        sed 's/^/  | /' /tmp/ckpt.out | tail -n 20
        return
    fi
    ctr -n "$NS" task exec --exec-id fw f0 sh -c 'echo after > /state' >/dev/null 2>&1
    check "two replicas for forks are made" wait_for 180 two_replicas
    crabctl -n "$NS" stats f0 2>&1 | grep replicas | sed 's/^/INFO   /'
    replicas=" $(replica_pids | tr '\n' ' ')"
    info "replicas' inits:$replicas"
    out=$(crabctl -n "$NS" fork f0 base --count 2 --prefix fk 2>&1)
    info "$out"
    for n in 1 2; do
        fork=fk-$n
        pid=$(ctr -n "$NS" task ls | awk -v id="$fork" '$1==id {print $2}')
        case "$replicas " in *" $pid "*) adopted=$((adopted + 1)) ;; esac
        count=$(count_of "$fork" "$n")
        info "$fork: init $pid, count $count (f0's was $at before the checkpoint), $(cat "/proc/$pid/cgroup" 2>&1), memory.max $(cat "/sys/fs/cgroup/default/$fork/memory.max" 2>&1)"
        check "$fork runs the checkpoint's state in a cgroup of its own" \
            fork_holds "$fork" "$pid" "$limit" "$at" "$count"
    done
    check "both forks adopted a replica" [ "$adopted" = 2 ]
    [ "$adopted" = 2 ] || grep -E 'replica|standby|adopt' /var/log/containerd.log | tail -n 30 | sed 's/^/  | /'
    for c in fk-1 fk-2 f0; do
        ctr -n "$NS" task kill -s KILL "$c" >/dev/null 2>&1
        wait_for 60 bash -c "ctr -n $NS task ls | grep -q '$c.*STOPPED'"
        ctr -n "$NS" task rm "$c" >/dev/null 2>&1
        ctr -n "$NS" container rm "$c" >/dev/null 2>&1
    done
    check "no replica's cgroup is left" bash -c '! ls -d /sys/fs/cgroup/default/*@standby* 2>/dev/null | grep -q .'
}

setup
case "$PHASE" in
    1) phase1 ;;
    2) phase2 ;;
    *) fail "no crab.phase on the kernel's command line" ;;
esac
finish
