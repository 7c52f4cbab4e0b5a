#!/usr/bin/env bash
# Runs a private containerd for Crab's demo and integration tests. It has its own
# root, state, socket and config file, so the host's containerd (its config in
# /etc/containerd and its socket in /run/containerd) is never read or touched. Without
# --cri, the CRI plugin is disabled, so no CNI setup is needed.
#
# With --cri, a second private containerd (its own root, state and socket) serves
# Kubernetes' CRI as kubelet uses it: the CRI plugin on, runtime handlers `crab`
# (io.containerd.crab.v2, ConfigPath = $CRAB_CONFIG) and `runc` (io.containerd.runc.v2),
# Debian's containernetworking-plugins for a private bridge (crab-cri0, 10.88.213.0/24)
# and loopback, whose conflist is written here, pod network namespaces and CNI state
# under its own directories, `restrict_oom_score_adj` (root here lacks
# CAP_SYS_RESOURCE) and docker.io/crab/pause:latest (hack/build-images.sh) as the pod
# sandbox image. The images go into the namespace CRI uses, k8s.io. CRI's default
# snapshotter there is Crab's (crab-snapshotter, a proxy plugin started here before
# containerd and stopped after it): kubelet's view of a crab container's writable
# layer is what its tree in Crab's store wrote (docs/kubernetes.md).
#
#   hack/containerd.sh [--cri] start     start it (if not already running) and import the
#                                images built by hack/build-images.sh; prints the socket path
#   hack/containerd.sh [--cri] stop      SIGTERM containerd (SIGKILL after 10 s); shims and
#                                containers keep running
#   hack/containerd.sh [--cri] restart   stop + start
#   hack/containerd.sh [--cri] status    exit 0 if it answers on its socket, 1 otherwise
#   hack/containerd.sh [--cri] env       print export lines, e.g. eval "$(hack/containerd.sh env)"
#
# Environment (defaults in brackets; --cri's defaults second):
#   CRAB_CONTAINERD_ROOT   [/var/lib/crab/containerd, /var/lib/crab/containerd-cri]
#                          persistent data, containerd.log
#   CRAB_CONTAINERD_STATE  [/run/crab/containerd, /run/crab/containerd-cri]
#                          socket, config.toml, pid file
#   CRAB_IMAGE_DIR         [/var/lib/crab/images]      busybox.tar, python.tar, agent.tar,
#                          pause.tar
#   CRAB_NAMESPACE         [crab; always k8s.io with --cri] namespace the images go into
#   CRAB_CONFIG            passed through to containerd, hence to the crab shim; with
#                          --cri also the crab handler's ConfigPath
#   CRAB_SHIM_DIR          a directory put first on containerd's PATH, where it
#                          finds containerd-shim-crab-v2 (a build of one's own);
#                          --cri takes crab-snapshotter from there too (else PATH)
#   CRAB_CNI_BRIDGE, CRAB_CNI_SUBNET   [crab-cri0, 10.88.213.0/24] --cri's pod network
#
# The containerd run is the first on PATH; the directory it is in comes first on its
# own PATH too, so that its own shims (runc's) are the ones beside it. containerd 1.x
# gets a version 2 config file, containerd 2.x a version 3 one (hack/sid.sh runs
# Debian sid's containerd 2.1 this way).
set -euo pipefail

CRI=0
if [ "${1:-}" = --cri ]; then CRI=1; shift; fi
if [ "$CRI" = 1 ]; then
    ROOT_DIR="${CRAB_CONTAINERD_ROOT:-/var/lib/crab/containerd-cri}"
    STATE_DIR="${CRAB_CONTAINERD_STATE:-/run/crab/containerd-cri}"
    # The CRI plugin's own namespace, whatever CRAB_NAMESPACE the caller exported
    # for the other instance.
    NAMESPACE=k8s.io
    IMAGES=(busybox pause)
else
    ROOT_DIR="${CRAB_CONTAINERD_ROOT:-/var/lib/crab/containerd}"
    STATE_DIR="${CRAB_CONTAINERD_STATE:-/run/crab/containerd}"
    NAMESPACE="${CRAB_NAMESPACE:-crab}"
    IMAGES=(busybox python agent)
fi
SOCK="$STATE_DIR/containerd.sock"
CONFIG="$STATE_DIR/config.toml"
PIDFILE="$STATE_DIR/containerd.pid"
LOG="$ROOT_DIR/containerd.log"
IMAGE_DIR="${CRAB_IMAGE_DIR:-/var/lib/crab/images}"
# --cri: the pod network (a bridge private to this machine) and where CNI keeps state.
CNI_BIN_DIR=/usr/lib/cni
CNI_CONF_DIR="$ROOT_DIR/cni/net.d"
CNI_DATA_DIR="$ROOT_DIR/cni/ipam"
CNI_BRIDGE="${CRAB_CNI_BRIDGE:-crab-cri0}"
CNI_SUBNET="${CRAB_CNI_SUBNET:-10.88.213.0/24}"
# --cri: Crab's snapshotter (docs/kubernetes.md).
SNAP_ROOT="$ROOT_DIR/crab-snapshotter"
SNAP_SOCK="$STATE_DIR/crab-snapshotter/snapshotter.sock"
SNAP_PIDFILE="$STATE_DIR/crab-snapshotter.pid"
SNAP_LOG="$ROOT_DIR/crab-snapshotter.log"
START_TIMEOUT=20
STOP_TIMEOUT=10

log() { printf '\033[1;34m[containerd]\033[0m %s\n' "$*" >&2; }
die() { echo "containerd.sh: $*" >&2; exit 1; }

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit "${1:-2}"
}

ctr_() { ctr --address "$SOCK" "$@"; }

answers() { [ -S "$SOCK" ] && timeout 5 ctr --address "$SOCK" version >/dev/null 2>&1; }

# Is $1 a live containerd started with our config file?
is_ours() {
    local pid=$1
    [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
    local cmdline
    cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
    [[ "$cmdline" == *containerd*" --config $CONFIG"* ]]
}

# Prints the pid of our containerd: from the pid file, or by looking for a process
# started with our config file (the pid file may have been lost).
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
            echo "$pid" >"$PIDFILE" 2>/dev/null || true
            echo "$pid"
            return 0
        fi
    done
    return 1
}

# The major version of the containerd on PATH (1 or 2).
major_version() {
    local v
    v=$(containerd --version | awk '{print $3}')
    v=${v#v}
    case "${v%%.*}" in
        1|2) echo "${v%%.*}" ;;
        *) die "cannot tell containerd's version from: $(containerd --version)" ;;
    esac
}

write_config() {
    mkdir -p "$ROOT_DIR" "$STATE_DIR"
    chmod 0711 "$ROOT_DIR" "$STATE_DIR"
    local major disabled version=2
    major=$(major_version)
    disabled='disabled_plugins = ["io.containerd.grpc.v1.cri"]'
    if [ "$major" = 2 ]; then
        version=3
        # 2.x splits CRI into three plugins; NRI (on by default) would listen on
        # the host-wide /var/run/nri/nri.sock.
        disabled='disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images", "io.containerd.nri.v1.nri"]'
        [ "$CRI" = 1 ] && disabled='disabled_plugins = ["io.containerd.nri.v1.nri"]'
    elif [ "$CRI" = 1 ]; then
        disabled='disabled_plugins = []'
    fi
    # Top-level keys must come before the first [table].
    cat >"$CONFIG.tmp" <<EOF
# Written by hack/containerd.sh; regenerated on every start.
version = $version
root = "$ROOT_DIR"
state = "$STATE_DIR"
$disabled

[grpc]
  address = "$SOCK"

[ttrpc]
  address = "$SOCK.ttrpc"

[debug]
  address = ""
  level = "info"

[metrics]
  address = ""

$(proxy_plugins)

[plugins]
  # Default is /opt/containerd; keep everything under our own root.
  [plugins."io.containerd.internal.v1.opt"]
    path = "$ROOT_DIR/opt"
EOF
    if [ "$CRI" = 1 ]; then
        write_cni_config
        if [ "$major" = 2 ]; then write_cri_config_v3; else write_cri_config; fi
    fi
    mv "$CONFIG.tmp" "$CONFIG"
}

# --cri: Crab's snapshotter as a proxy plugin named `crab`.
proxy_plugins() {
    [ "$CRI" = 1 ] || return 0
    cat <<EOF2
[proxy_plugins]
  [proxy_plugins.crab]
    type = "snapshot"
    address = "$SNAP_SOCK"
    # Where CRI (and so kubelet) sizes the image and writable-layer file system.
    exports = { root = "$SNAP_ROOT" }
EOF2
}

# This machine's architecture as containerd names platforms.
go_arch() {
    case "$(uname -m)" in
        x86_64) echo amd64 ;;
        aarch64) echo arm64 ;;
        *) uname -m ;;
    esac
}

# The CNI network of --cri.
write_cni_config() {
    [ -x "$CNI_BIN_DIR/bridge" ] && [ -x "$CNI_BIN_DIR/loopback" ] ||
        die "no CNI plugins in $CNI_BIN_DIR (apt-get install containernetworking-plugins)"
    [ -n "${CRAB_CONFIG:-}" ] || die "--cri needs CRAB_CONFIG (the crab handler's ConfigPath)"
    mkdir -p "$CNI_CONF_DIR" "$CNI_DATA_DIR"
    # No masquerading and no route out: pods reach each other and this machine only.
    cat >"$CNI_CONF_DIR/10-crab-cri.conflist.tmp" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "crab-cri",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$CNI_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$CNI_DATA_DIR",
        "ranges": [[{ "subnet": "$CNI_SUBNET" }]]
      }
    },
    { "type": "loopback" }
  ]
}
EOF
    mv "$CNI_CONF_DIR/10-crab-cri.conflist.tmp" "$CNI_CONF_DIR/10-crab-cri.conflist"
}

# The CRI plugin's section of the --cri config (containerd 1.x: config version 2).
write_cri_config() {
    cat >>"$CONFIG.tmp" <<EOF

  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "docker.io/crab/pause:latest"
    # Root here lacks CAP_SYS_RESOURCE: without this, runc's containers fail to start.
    restrict_oom_score_adj = true
    # Pods' network namespaces under this instance's state, not /run/netns.
    netns_mounts_under_state_dir = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      # Crab's snapshotter: the only one CRI asks for writable layers' usage.
      snapshotter = "crab"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.crab]
        runtime_type = "io.containerd.crab.v2"
        # Crab's annotations (io.crab.proxy.upstream...) reach the OCI spec.
        pod_annotations = ["io.crab.*"]
        container_annotations = ["io.crab.*"]
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.crab.options]
          ConfigPath = "$CRAB_CONFIG"
      # The same runtime without options: containerd 2.x starts a container of a
      # hostUsers: false pod only on a handler whose options are runc's or none
      # (it sets the fifos' owner in runc's option type); the shim then reads
      # CRAB_CONFIG from containerd's environment.
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.crab-userns]
        runtime_type = "io.containerd.crab.v2"
        pod_annotations = ["io.crab.*"]
        container_annotations = ["io.crab.*"]
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "$CNI_BIN_DIR"
      conf_dir = "$CNI_CONF_DIR"
      max_conf_num = 1
EOF
}

# The same for containerd 2.x (config version 3: CRI's runtime and image halves are
# plugins of their own; the streaming server stays in io.containerd.grpc.v1.cri).
write_cri_config_v3() {
    cat >>"$CONFIG.tmp" <<EOF

  # containerd 2.x unpacks images (ctr's imports, CRI's pulls) through its transfer
  # service, only for the snapshotters named here.
  [plugins."io.containerd.transfer.v1.local"]
    [[plugins."io.containerd.transfer.v1.local".unpack_config]]
      platform = "linux/$(go_arch)"
      snapshotter = "crab"
    [[plugins."io.containerd.transfer.v1.local".unpack_config]]
      platform = "linux/$(go_arch)"
      snapshotter = "overlayfs"

  [plugins."io.containerd.cri.v1.images"]
    # Crab's snapshotter: the only one CRI asks for writable layers' usage.
    snapshotter = "crab"
    [plugins."io.containerd.cri.v1.images".pinned_images]
      sandbox = "docker.io/crab/pause:latest"

  [plugins."io.containerd.cri.v1.runtime"]
    # Root here lacks CAP_SYS_RESOURCE: without this, runc's containers fail to start.
    restrict_oom_score_adj = true
    # Pods' network namespaces under this instance's state, not /run/netns.
    netns_mounts_under_state_dir = true
    enable_cdi = false
    [plugins."io.containerd.cri.v1.runtime".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.crab]
        runtime_type = "io.containerd.crab.v2"
        # Crab's annotations (io.crab.proxy.upstream...) reach the OCI spec.
        pod_annotations = ["io.crab.*"]
        container_annotations = ["io.crab.*"]
        [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.crab.options]
          ConfigPath = "$CRAB_CONFIG"
      # The same runtime without options: containerd 2.x starts a container of a
      # hostUsers: false pod only on a handler whose options are runc's or none
      # (it sets the fifos' owner in runc's option type); the shim then reads
      # CRAB_CONFIG from containerd's environment.
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.crab-userns]
        runtime_type = "io.containerd.crab.v2"
        pod_annotations = ["io.crab.*"]
        container_annotations = ["io.crab.*"]
    [plugins."io.containerd.cri.v1.runtime".cni]
      bin_dirs = ["$CNI_BIN_DIR"]
      conf_dir = "$CNI_CONF_DIR"
      max_conf_num = 1

  [plugins."io.containerd.grpc.v1.cri"]
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
EOF
}

# Imports $IMAGE_DIR/<image>.tar unless the namespace already has that name with the
# same manifest digest (a rebuilt archive is imported again).
import_images() {
    local image tar name digest have
    local SNAPSHOTTER_ARGS=()
    [ "$CRI" = 1 ] && SNAPSHOTTER_ARGS=(--snapshotter crab)
    for image in "${IMAGES[@]}"; do
        tar="$IMAGE_DIR/$image.tar"
        [ -f "$tar" ] || { log "no $tar (run hack/build-images.sh); skipping"; continue; }
        name=$(tar -xOf "$tar" index.json | jq -r '.manifests[0].annotations["io.containerd.image.name"]')
        digest=$(tar -xOf "$tar" index.json | jq -r '.manifests[0].digest')
        have=$(ctr_ -n "$NAMESPACE" images ls | awk -v n="$name" '$1 == n {print $3}')
        if [ "$have" = "$digest" ]; then
            continue
        fi
        log "importing $name into namespace $NAMESPACE"
        ctr_ -n "$NAMESPACE" images import "${SNAPSHOTTER_ARGS[@]}" "$tar" >/dev/null
        ctr_ -n "$NAMESPACE" images ls -q | grep -qxF "$name" || die "import of $tar did not create $name"
    done
}

# Waits until the socket answers; fails after $START_TIMEOUT s or if $1 (pid) exits.
wait_answers() {
    local pid=$1 deadline=$((SECONDS + START_TIMEOUT))
    until answers; do
        [ $SECONDS -lt $deadline ] || return 1
        if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
            return 1
        fi
        sleep 0.2
        [ -n "$pid" ] || pid=$(cat "$PIDFILE" 2>/dev/null || true)
    done
}

start() {
    local pid=""
    if pid=$(find_pid); then
        # Ours is alive; give a concurrent start the same grace period before giving up.
        if wait_answers "$pid"; then
            log "already running (pid $pid)"
            import_images
            echo "$SOCK"
            return 0
        fi
        log "containerd pid $pid does not answer; replacing it"
        stop
    fi
    if answers; then
        die "something else answers on $SOCK; refusing to start a second containerd there"
    fi
    command -v containerd >/dev/null || die "containerd not found"
    [ "$CRI" = 1 ] && start_snapshotter
    write_config
    rm -f "$PIDFILE"
    local path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin bin
    # containerd's own shims (runc's) are the ones beside it.
    bin=$(dirname "$(command -v containerd)")
    [[ ":$path:" == *":$bin:"* ]] || path="$bin:$path"
    [ -n "${CRAB_SHIM_DIR:-}" ] && path="$CRAB_SHIM_DIR:$path"
    local env=(PATH="$path" HOME="${HOME:-/root}")
    [ -n "${CRAB_CONFIG:-}" ] && env+=(CRAB_CONFIG="$CRAB_CONFIG")
    [ -n "${RUST_LOG:-}" ] && env+=(RUST_LOG="$RUST_LOG")
    [ -n "${RUST_BACKTRACE:-}" ] && env+=(RUST_BACKTRACE="$RUST_BACKTRACE")
    log "starting containerd (log: $LOG)"
    printf '\n==== %s hack/containerd.sh start ====\n' "$(date -Is)" >>"$LOG"
    # The inner shell records its own pid and then becomes containerd (in /, so it
    # does not pin the caller's directory); the pid file is right even if setsid has
    # to fork. setsid + nohup + redirected stdio: containerd outlives the calling
    # shell and its terminal.
    env -i "${env[@]}" setsid nohup /bin/sh -c 'echo $$ >"$1"; shift; cd / && exec "$@"' sh \
        "$PIDFILE" "$(command -v containerd)" --config "$CONFIG" \
        </dev/null >>"$LOG" 2>&1 &
    if ! wait_answers ""; then
        tail -n 20 "$LOG" >&2
        die "containerd did not answer on $SOCK within ${START_TIMEOUT}s (log: $LOG)"
    fi
    log "running (pid $(cat "$PIDFILE"))"
    import_images
    echo "$SOCK"
}

# --cri: Crab's snapshotter, from the directory of the crab shim containerd uses.
start_snapshotter() {
    local bin pid
    bin="${CRAB_SHIM_DIR:+$CRAB_SHIM_DIR/}crab-snapshotter"
    [ -n "${CRAB_SHIM_DIR:-}" ] || bin=$(command -v crab-snapshotter) ||
        die "crab-snapshotter not found (cargo build --release; install it beside the shim)"
    stop_snapshotter
    mkdir -p "$SNAP_ROOT" "$STATE_DIR"
    # The wait below is for this run's socket, not the last one's.
    rm -f "$SNAP_SOCK"
    log "starting crab-snapshotter (log: $SNAP_LOG)"
    env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        RUST_LOG="${RUST_LOG:-info}" setsid nohup "$bin" --root "$SNAP_ROOT" \
        --address "$SNAP_SOCK" --config "$CRAB_CONFIG" </dev/null >>"$SNAP_LOG" 2>&1 &
    pid=$!
    echo "$pid" >"$SNAP_PIDFILE"
    local deadline=$((SECONDS + START_TIMEOUT))
    until [ -S "$SNAP_SOCK" ]; do
        kill -0 "$pid" 2>/dev/null || { tail -n 20 "$SNAP_LOG" >&2; die "crab-snapshotter exited"; }
        [ $SECONDS -lt $deadline ] || die "crab-snapshotter did not listen on $SNAP_SOCK"
        sleep 0.1
    done
}

stop_snapshotter() {
    local pid
    pid=$(cat "$SNAP_PIDFILE" 2>/dev/null) || return 0
    if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "--address $SNAP_SOCK"; then
        kill -TERM "$pid" 2>/dev/null || true
        while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    fi
    rm -f "$SNAP_PIDFILE"
}

stop() {
    local pid
    if ! pid=$(find_pid); then
        rm -f "$PIDFILE"
        [ "$CRI" = 1 ] && stop_snapshotter
        log "not running"
        return 0
    fi
    log "stopping containerd (pid $pid)"
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
    rm -f "$PIDFILE"
    [ "$CRI" = 1 ] && stop_snapshotter
    return 0
}

status() {
    if answers; then
        local pid
        pid=$(find_pid || echo "?")
        echo "running (pid $pid, socket $SOCK)"
        return 0
    fi
    echo "not running"
    return 1
}

print_env() {
    if [ "$CRI" = 1 ]; then
        # The CRI tests' own variables: the other instance's stay as they are.
        printf 'export CRAB_CRI_ADDRESS=%q\n' "$SOCK"
        printf 'export CRAB_CRI_NAMESPACE=%q\n' "$NAMESPACE"
        printf 'export CRAB_CRI_POD_SUBNET=%q\n' "$CNI_SUBNET"
        return
    fi
    printf 'export CRAB_CONTAINERD_ADDRESS=%q\n' "$SOCK"
    printf 'export CRAB_NAMESPACE=%q\n' "$NAMESPACE"
}

[ $# -eq 1 ] || usage
case "$1" in
    start|stop|restart)
        [ "$(id -u)" = 0 ] || die "must run as root" ;;
esac
case "$1" in
    start) start ;;
    stop) stop ;;
    restart) stop; start ;;
    status) status ;;
    env) print_env ;;
    -h|--help|help) usage 0 ;;
    *) usage ;;
esac
