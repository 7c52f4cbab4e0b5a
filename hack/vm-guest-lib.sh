#!/bin/bash
# What the guest scripts of hack/vm-smoke.sh share (sourced, from the run disk's
# lib.sh): step reporting, waiting, the mounts a bare init leaves to them, and the
# power-off that ends a run. Not meant to run on a host.
export PATH=/smoke/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
NS=default
RT=io.containerd.crab.v2
IMG=docker.io/crab/busybox:latest
PASSED=0
FAILED=0

# Lines carry the guest's uptime: where the time goes under TCG.
info() { echo "INFO [$(cut -d' ' -f1 /proc/uptime)] $*"; }
pass() { echo "PASS $*"; PASSED=$((PASSED + 1)); }
fail() { echo "FAIL $*"; FAILED=$((FAILED + 1)); }
# check NAME CMD...: PASS when CMD succeeds.
check() {
    local name=$1
    shift
    if "$@" >/tmp/step.out 2>&1; then pass "$name"; else
        fail "$name"
        sed 's/^/  | /' /tmp/step.out | tail -n 20
    fi
}
# Waits up to $1 seconds for CMD to succeed.
wait_for() {
    local n=$(($1 * 5))
    shift
    while [ "$n" -gt 0 ]; do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.2
        n=$((n - 1))
    done
    return 1
}
finish() {
    echo "SMOKE DONE $PASSED passed, $FAILED failed"
    sync
    echo o >/proc/sysrq-trigger
    sleep 30
}

# The mounts a booted host has: /run and /tmp empty (tmpfs), cgroup2 alone, bpffs,
# tracefs, CRIU's cache directory.
guest_mounts() {
    mountpoint -q /run || mount -t tmpfs -o mode=0755 run /run
    mount -t tmpfs tmp /tmp
    mkdir -p /dev/pts /dev/shm /run/criu
    mountpoint -q /dev/pts || mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
    mountpoint -q /dev/shm || mount -t tmpfs shm /dev/shm
    mount -t tmpfs -o size=1m,mode=0700 crab-criu /run/criu
    mountpoint -q /sys/fs/cgroup || mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup
    mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
    mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null
    ip link set lo up
}

# start_with_config TOML: writes Crab's configuration (/etc/crab/config.toml, which
# the shim reads by default), then starts containerd.
start_with_config() {
    mkdir -p /etc/crab
    printf '%s\n' "$1" >/etc/crab/config.toml
    start_containerd
}

# Starts containerd (its log in /var/log/containerd.log); the run ends if it does not answer.
start_containerd() {
    containerd --log-level info >/var/log/containerd.log 2>&1 &
    wait_for 120 ctr version || { fail "containerd starts"; tail -n 20 /var/log/containerd.log; finish; }
}

# Prints the end of containerd's and the shims' log, after a failed step.
dump_logs() {
    info "containerd's and the shims' log (last lines):"
    grep -v 'libbpf' /var/log/containerd.log | tail -n "${1:-40}" | sed 's/^/  | /'
}

# run_counter ID [CTR RUN FLAGS...]: runs container ID, whose counter lives only in
# its shell's memory (USR1 writes it to /count), and whose /state says "before".
run_counter() {
    ctr -n "$NS" run -d --runtime "$RT" "${@:2}" "$IMG" "$1" sh -c \
        'i=0; trap "echo \$i > /count" USR1; echo before > /state; while :; do i=$((i+1)); sleep 0.2; done' \
        >/tmp/run.out 2>&1
}

# count_of ID N: container ID's counter, read by an exec named after N.
count_of() {
    ctr -n "$NS" task kill -s USR1 "$1" >/dev/null 2>&1
    sleep 1
    ctr -n "$NS" task exec --exec-id "cnt$2" "$1" cat /count 2>/dev/null
}
