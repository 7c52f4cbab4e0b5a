#!/usr/bin/env bash
# Smoke test on a cgroup v2-only host: a Debian 12 VM with Debian's own 6.1 kernel
# (cgroup2 alone at /sys/fs/cgroup, no v1 hierarchy; soft-dirty, which that kernel
# has), booted with qemu in software emulation (TCG), runs a private containerd
# 1.7 with the crab shim built from this tree, and in it: run and exec, the task's v2
# metrics, an OOM event under a memory limit, the eBPF inspector's turn, a
# checkpoint and a rollback that bring back a file and a process's in-memory
# counter, and a delete that leaves no cgroup. Each step prints PASS or FAIL; the
# script exits non-zero on any failure. Not part of hack/test.sh (it takes minutes).
#
#   hack/vm-smoke.sh             build what is missing, boot, test
#   hack/vm-smoke.sh --rebuild   make the VM's disk image again first
#   hack/vm-smoke.sh --prepare   only unpack qemu and make the disk image
#   hack/vm-smoke.sh --reboot    a real reboot instead (hack/vm-reboot-guest.sh): the
#                                guest, with a data disk and the default btrfs
#                                loop-file pool, checkpoints a container and is reset
#                                (no sync); booted again, it restores the container
#
# What it makes lives in ${CRAB_VM_DIR:-/var/lib/crab/vm}:
#   qemu/        qemu-system-x86 and the libraries it needs, unpacked from Debian's
#                packages (apt-get download + dpkg -x: the host's packages stay as
#                they are)
#   base.img     the guest's root file system (debootstrap, bookworm minbase, the
#                cloud kernel), made once; the VM only writes to a throwaway overlay
#   run.img      per run: the shim and crabctl of this tree, the host's containerd
#                and ctr (hack/setup.sh's), CRIU (hack/setup.sh's build), the busybox
#                image (hack/build-images.sh), hack/pool.sh and the guest's scripts
#   data.img     --reboot's data disk (containerd's and Crab's /var/lib), made per run
#   console.log  the guest's console of the last run (--reboot: console-1.log and
#                console-2.log, one per boot)
#
# Needs root, the host set up by hack/setup.sh (containerd 1.7, CRIU), and a route to
# a Debian mirror for the first run (CRAB_DEBIAN_MIRROR). Guest commands are slow
# under TCG: nothing here measures time.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VM="${CRAB_VM_DIR:-/var/lib/crab/vm}"
MIRROR="${CRAB_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
IMAGE_DIR="${CRAB_IMAGE_DIR:-/var/lib/crab/images}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
QEMU="$VM/qemu"
# qemu as unpacked: its libraries and firmware beside it.
QEMU_LIBS="LD_LIBRARY_PATH=$QEMU/usr/lib/x86_64-linux-gnu:$QEMU/lib/x86_64-linux-gnu"
QEMU_CMD=(env "$QEMU_LIBS" "$QEMU/usr/bin/qemu-system-x86_64"
    -L "$QEMU/usr/share/qemu" -L "$QEMU/usr/share/seabios")
# Bump when the guest's packages or its init change: the base image is made again.
BASE_RECIPE=5
GUEST_PACKAGES=linux-image-cloud-amd64,initramfs-tools,btrfs-progs,tini,bash,coreutils,procps,iproute2,iptables,nftables,util-linux,mount,kmod,tar,libseccomp2,libelf1,zlib1g
# How long the guest may take, boot included, before the run counts as failed.
VM_TIMEOUT_S="${CRAB_VM_TIMEOUT_S:-1500}"

log() { printf '\033[1;34m[vm-smoke]\033[0m %s\n' "$*" >&2; }
die() { echo "vm-smoke.sh: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (debootstrap, loop-free ext4 images, qemu)"
REBUILD=0
PREPARE=0
REBOOT=0
case "${1:-}" in
    --rebuild) REBUILD=1 ;;
    --prepare) PREPARE=1 ;;
    --reboot) REBOOT=1 ;;
    "") ;;
    *) die "unknown argument: $1 (expected --rebuild, --prepare or --reboot)" ;;
esac
STARTED=$(date +%s)
mkdir -p "$VM"

host_tools() {
    local missing=()
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    command -v mkfs.ext4 >/dev/null || missing+=(e2fsprogs)
    command -v objcopy >/dev/null || missing+=(binutils)
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing ${missing[*]}"
        apt-get install -y -qq --no-install-recommends "${missing[@]}"
    fi
    for f in /usr/bin/containerd /usr/bin/ctr /usr/local/sbin/criu; do
        [ -x "$f" ] || die "$f is missing: run hack/setup.sh first"
    done
    if [ ! -f "$IMAGE_DIR/busybox.tar" ]; then
        "$ROOT/hack/build-images.sh" busybox
    fi
}

# qemu from Debian's packages, unpacked under $QEMU: installing qemu-system-x86 on
# the host would replace packages it has (e.g. a backported qemu-utils).
install_qemu() {
    local bin="$QEMU/usr/bin/qemu-system-x86_64"
    if [ -x "$bin" ] && "${QEMU_CMD[@]}" --version >/dev/null 2>&1; then
        return
    fi
    log "unpacking qemu-system-x86 and its libraries into $QEMU"
    local debs="$VM/debs"
    rm -rf "$QEMU" "$debs"
    mkdir -p "$QEMU" "$debs"
    # apt's downloads run as _apt where it can write.
    chown _apt "$debs" 2>/dev/null || true
    # What apt would install for it beside what the host has.
    local pkgs
    pkgs=$(apt-get install -s --no-install-recommends qemu-system-x86 | awk '/^Inst / {print $2}')
    [ -n "$pkgs" ] || pkgs=qemu-system-x86
    # shellcheck disable=SC2086
    (cd "$debs" && apt-get download -qq $pkgs)
    for d in "$debs"/*.deb; do
        dpkg -x "$d" "$QEMU"
    done
    local missing
    missing=$(env "$QEMU_LIBS" ldd "$bin" | awk '/not found/ {print $1}')
    [ -z "$missing" ] || die "qemu needs libraries that are not there: $missing"
    "${QEMU_CMD[@]}" --version | head -n1 >&2
}

# The Debian packages that hold the libraries CRIU (hack/setup.sh's build) links.
criu_packages() {
    ldd /usr/local/sbin/criu | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
        dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "$lib" 2>/dev/null || true
    done | cut -d: -f1 | sort -u | paste -sd, -
}

# The guest's root: bookworm minbase with the cloud kernel (6.1, virtio, BTF,
# soft-dirty), CRIU's libraries and an init that mounts the run disk and starts its
# script.
build_base() {
    local packages recipe
    packages="$GUEST_PACKAGES,$(criu_packages)"
    recipe="$BASE_RECIPE $packages"
    if [ "$REBUILD" = 0 ] && [ -f "$VM/base.img" ] && [ -f "$VM/vmlinuz" ] &&
        [ "$(cat "$VM/base.recipe" 2>/dev/null)" = "$recipe" ]; then
        return
    fi
    log "making the guest's root file system (debootstrap bookworm, a few minutes)"
    local rootfs="$VM/rootfs"
    rm -rf "$rootfs" "$VM/base.img" "$VM/base.recipe"
    debootstrap --variant=minbase --include="$packages" bookworm "$rootfs" "$MIRROR" \
        >"$VM/debootstrap.log" 2>&1 || { tail -n 30 "$VM/debootstrap.log" >&2; die "debootstrap failed"; }
    local kernel initrd
    kernel=$(ls "$rootfs"/boot/vmlinuz-* | sort -V | tail -n1)
    initrd=$(ls "$rootfs"/boot/initrd.img-* | sort -V | tail -n1)
    [ -f "$kernel" ] && [ -f "$initrd" ] || die "the guest has no kernel or initrd in /boot"
    cp "$kernel" "$VM/vmlinuz"
    cp "$initrd" "$VM/initrd.img"
    cat >"$rootfs/sbin/crab-vm-init" <<'INIT'
#!/bin/bash
# PID 1 of the smoke VM: the run disk holds the binaries and the test script.
mountpoint -q /proc || mount -t proc proc /proc
mountpoint -q /sys || mount -t sysfs sys /sys
mountpoint -q /dev || mount -t devtmpfs dev /dev
mkdir -p /smoke
mount -o ro /dev/vdb /smoke || { echo "FAIL mount the run disk"; echo o >/proc/sysrq-trigger; }
exec /usr/bin/tini -s -- /bin/bash /smoke/guest.sh
INIT
    chmod 0755 "$rootfs/sbin/crab-vm-init"
    echo crab-vm >"$rootfs/etc/hostname"
    rm -rf "$rootfs/var/cache/apt/archives"/*.deb "$rootfs/usr/share/doc" "$rootfs/usr/share/man"
    mkfs.ext4 -q -F -L crab-vm-root -d "$rootfs" "$VM/base.img" 3G
    echo "$recipe" >"$VM/base.recipe"
    rm -rf "$rootfs"
}

build_crab() {
    log "building the shim and crabctl"
    (cd "$ROOT" && cargo build --release -q -p crab-shim -p crabctl)
}

# The run disk: this tree's binaries, the host's containerd and CRIU, the image.
build_run_disk() {
    local dir="$VM/run"
    rm -rf "$dir" "$VM/run.img"
    mkdir -p "$dir/bin" "$dir/images"
    install -m 0755 /usr/bin/containerd /usr/bin/ctr /usr/local/sbin/criu "$dir/bin/"
    # Without their line tables: a smaller disk, a quicker start under TCG.
    for b in containerd-shim-crab-v2 crabctl; do
        objcopy --strip-debug "$TARGET/release/$b" "$dir/bin/$b"
    done
    cp "$IMAGE_DIR/busybox.tar" "$dir/images/"
    install -m 0644 "$ROOT/hack/vm-guest-lib.sh" "$dir/lib.sh"
    install -m 0755 "$ROOT/hack/pool.sh" "$dir/pool.sh"
    if [ "$REBOOT" = 1 ]; then
        install -m 0755 "$ROOT/hack/vm-reboot-guest.sh" "$dir/guest.sh"
    else
        install -m 0755 "$ROOT/hack/vm-smoke-guest.sh" "$dir/guest.sh"
    fi
    mkfs.ext4 -q -F -L crab-vm-run -d "$dir" "$VM/run.img" 256M
    rm -rf "$dir"
}

# boot CONSOLE KERNEL_ARGS [QEMU ARGS...]: one boot of the guest; -no-reboot makes a
# reset or a power-off end qemu.
boot() {
    local console=$1 args=$2
    shift 2
    log "booting the guest (qemu TCG, Debian's $(basename "$(readlink -f "$VM/vmlinuz")") kernel${args:+, $args}); console in $console"
    # snapshot=on: the base image is never written. The guest's init mounts cgroup2
    # alone at /sys/fs/cgroup (what systemd does on bookworm by default).
    timeout --kill-after=10 "$VM_TIMEOUT_S" "${QEMU_CMD[@]}" \
        -accel tcg,thread=multi -machine q35 -cpu max -smp 2 -m 2048 \
        -nographic -no-reboot -nic none \
        -kernel "$VM/vmlinuz" -initrd "$VM/initrd.img" \
        -append "console=ttyS0 root=/dev/vda rw init=/sbin/crab-vm-init panic=-1 quiet loglevel=4 $args" \
        -drive "file=$VM/base.img,if=virtio,format=raw,snapshot=on" \
        -drive "file=$VM/run.img,if=virtio,format=raw,readonly=on" \
        "$@" </dev/null | tr -d '\r' | tee "$console" |
        grep --line-buffered -E '^(PASS|FAIL|INFO|SMOKE|EXPECT|  \|)' || true
}

# The reboot: boot 1 checkpoints and resets, boot 2 restores (hack/vm-reboot-guest.sh).
# Writes console.log as both boots' consoles one after the other.
reboot_run() {
    log "making the data disk"
    rm -f "$VM/data.img"
    truncate -s 4G "$VM/data.img"
    mkfs.ext4 -q -F -L crab-vm-data "$VM/data.img"
    local data=(-drive "file=$VM/data.img,if=virtio,format=raw")
    boot "$VM/console-1.log" "crab.phase=1" "${data[@]}"
    cp "$VM/console-1.log" "$VM/console.log"
    if ! grep -q '^SMOKE REBOOT' "$VM/console-1.log"; then
        tail -n 40 "$VM/console-1.log" >&2
        die "boot 1 did not reach its reset (see $VM/console-1.log)"
    fi
    local expect
    expect=$(awk '/^EXPECT / {print $2 "," $3}' "$VM/console-1.log")
    boot "$VM/console-2.log" "crab.phase=2 crab.expect=$expect" "${data[@]}"
    cat "$VM/console-2.log" >>"$VM/console.log"
}

host_tools
install_qemu
build_base
[ "$PREPARE" = 0 ] || exit 0
build_crab
build_run_disk
if [ "$REBOOT" = 1 ]; then
    reboot_run
else
    boot "$VM/console.log" ""
fi
elapsed=$(($(date +%s) - STARTED))
pass=$(grep -c '^PASS' "$VM/console.log" || true)
fail=$(grep -c '^FAIL' "$VM/console.log" || true)
log "$pass passed, $fail failed, in $elapsed s (VM included)"
if ! grep -q '^SMOKE DONE' "$VM/console.log"; then
    tail -n 40 "$VM/console.log" >&2
    die "the guest did not finish its steps (see $VM/console.log)"
fi
[ "$fail" = 0 ] && [ "$pass" -gt 0 ] || exit 1
