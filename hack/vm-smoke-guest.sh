#!/bin/bash
# The steps hack/vm-smoke.sh runs inside its VM (a cgroup v2-only Debian 12 guest),
# as the child of PID 1. Every step prints one line, PASS or FAIL and its name, and
# INFO lines say what was seen; "SMOKE DONE" ends the run, then the VM powers off.
# Not meant to run on a host: it mounts, starts containerd and kills what it made.
set -u
# shellcheck source=hack/vm-guest-lib.sh
. /smoke/lib.sh

setup() {
    info "guest started"
    guest_mounts
    mkdir -p /var/lib/crab/overlay /var/lib/crab/checkpoints
    start_with_config 'log_level = "debug"
[storage]
backend = "overlay"'
    ctr -n "$NS" images import --all-platforms /smoke/images/busybox.tar >/dev/null 2>&1 ||
        { fail "import busybox"; finish; }
}

step_host() {
    info "kernel $(uname -r), /sys/fs/cgroup is $(stat -fc %T /sys/fs/cgroup), controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
    # v2 only: cgroup2 at the root and no v1 hierarchy mounted anywhere.
    check "cgroup v2 only" bash -c '[ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] && ! awk '"'"'$3 == "cgroup"'"'"' /proc/mounts | grep -q .'
    check "criu check (soft-dirty: mem_dirty_track)" bash -c 'criu check && criu check --feature mem_dirty_track'
}

step_run_exec() {
    run_counter c1
    check "run and exec" bash -c "ctr -n $NS task exec --exec-id e1 c1 echo hello | grep -qx hello"
}

step_cgroup() {
    local cg
    cg=$(crabctl -n "$NS" inspect c1 2>/dev/null | awk '/tracking cgroup:/ {print $3}')
    info "c1's cgroup: $cg"
    # The tracking cgroup is the container's own cgroup, which holds its init.
    check "the container's cgroup tracks it" bash -c "[ -d '$cg' ] && grep -qx \"\$(ctr -n $NS task ls | awk '\$1==\"c1\" {print \$2}')\" '$cg/cgroup.procs' && [ -f '$cg/memory.events' ]"
}

step_metrics() {
    ctr -n "$NS" task metrics c1 >/tmp/metrics.out 2>&1
    sed 's/^/INFO   /' /tmp/metrics.out | head -n 20
    check "task metrics are v2's" bash -c "grep -q '^memory.usage ' /tmp/metrics.out && awk '\$1==\"pids.current\" && \$2>=1 {ok=1} END {exit !ok}' /tmp/metrics.out && awk '\$1==\"cpu.usage_usec\" && \$2>0 {ok=1} END {exit !ok}' /tmp/metrics.out"
}

# After a full checkpoint the eBPF inspector's record of the container counts:
# a turn names what an exec wrote, and is taken at the grain it classifies.
step_turn() {
    ctr -n "$NS" task exec --exec-id t1 c1 sh -c 'echo x > /turn-file' >/dev/null 2>&1
    crabctl -n "$NS" turn c1 --dry-run >/tmp/turn.out 2>&1
    sed 's/^/INFO   /' /tmp/turn.out | head -n 12
    check "the eBPF inspector names a turn's write" grep -q '/turn-file' /tmp/turn.out
    crabctl -n "$NS" turn c1 >/tmp/turn.out 2>&1
    local status=$?
    sed 's/^/INFO   /' /tmp/turn.out | head -n 3
    # The shell's counter runs all along: its pages are written (soft-dirty), so
    # the turn is a full one.
    check "a turn is classified and taken" bash -c "[ $status = 0 ] && head -n 1 /tmp/turn.out | grep -Eq '^c1: (skip|fs-only|process-only|full) '"
}

step_checkpoint_rollback() {
    local at_ckpt later after
    at_ckpt=$(count_of c1 1)
    if ! crabctl -n "$NS" checkpoint c1 --name before >/tmp/ckpt.out 2>&1; then
        fail "checkpoint"
        sed 's/^/  | /' /tmp/ckpt.out | tail -n 20
        return
    fi
    pass "checkpoint"
    step_turn
    sleep 3
    ctr -n "$NS" task exec --exec-id w1 c1 sh -c 'echo after > /state' >/dev/null 2>&1
    later=$(count_of c1 2)
    if ! crabctl -n "$NS" rollback c1 before >/tmp/rb.out 2>&1; then
        fail "rollback"
        sed 's/^/  | /' /tmp/rb.out | tail -n 20
        return
    fi
    after=$(count_of c1 3)
    local state
    state=$(ctr -n "$NS" task exec --exec-id r1 c1 cat /state 2>/dev/null)
    info "counter: $at_ckpt at the checkpoint, $later later, $after after the rollback; /state: $state"
    # The counter went on from where the checkpoint took it: the shell's memory came
    # back (it counts on for the second or so until it is read again).
    check "rollback brings the file and the in-memory counter back" bash -c \
        "[ '$state' = before ] && [ -n '$at_ckpt' ] && [ -n '$later' ] && [ -n '$after' ] && [ '$after' -ge '$at_ckpt' ] && [ '$after' -lt '$later' ]"
}

step_oom() {
    ctr -n "$NS" events >/tmp/events.out 2>&1 &
    local events=$!
    sleep 1
    # 64 MiB of buffer under a 32 MiB limit (no swap in the guest).
    ctr -n "$NS" run --rm --runtime "$RT" --memory-limit 33554432 "$IMG" oom1 \
        sh -c 'dd if=/dev/zero of=/dev/null bs=64M count=1' >/tmp/oom.out 2>&1
    local status=$?
    sleep 2
    kill "$events" 2>/dev/null
    info "the OOM container exited with $status; events: $(grep -c . /tmp/events.out)"
    grep '/tasks/oom' /tmp/events.out | sed 's/^/INFO   /'
    check "an OOM kill is containerd's TaskOOM event" grep -q '/tasks/oom' /tmp/events.out
}

step_delete() {
    local cg
    cg=$(crabctl -n "$NS" inspect c1 2>/dev/null | awk '/tracking cgroup:/ {print $3}')
    ctr -n "$NS" task kill -s KILL c1 >/dev/null 2>&1
    wait_for 60 bash -c "ctr -n $NS task ls | grep -q 'c1.*STOPPED'"
    ctr -n "$NS" task rm c1 >/dev/null 2>&1
    ctr -n "$NS" container rm c1 >/dev/null 2>&1
    check "delete leaves no cgroup" bash -c "[ -n '$cg' ] && [ ! -e '$cg' ] && ! ctr -n $NS container ls -q | grep -qx c1"
}

setup
step_host
step_run_exec
step_cgroup
step_metrics
step_checkpoint_rollback
step_oom
step_delete
if [ "$FAILED" != 0 ]; then
    info "cgroups: root's subtree_control: $(cat /sys/fs/cgroup/cgroup.subtree_control);" \
        "default's: $(cat /sys/fs/cgroup/default/cgroup.subtree_control 2>&1)"
    for d in /sys/fs/cgroup/default/*/; do
        [ -d "$d" ] && info "  $d: controllers $(cat "$d/cgroup.controllers"), procs $(tr '\n' ' ' <"$d/cgroup.procs")"
    done
    info "libbpf's messages:"
    sed -n '/libbpf/,$p' /var/log/containerd.log | grep -v 'level=' | head -n 150 | sed 's/^/  | /'
    dump_logs
fi
finish
