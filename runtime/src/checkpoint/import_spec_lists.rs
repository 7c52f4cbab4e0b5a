//! What `ctr run` gives a container by default (containerd 1.7's `oci.WithDefaultSpec`
//! and `WithDefaultUnixDevices`), against which [`super::rebuild`] checks a spec.

/// containerd's default capability set (`oci.WithDefaultSpec`, as `ctr run` gives).
pub const DEFAULT_CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// The namespaces a container must have of its own.
pub(super) const OWN_NAMESPACES: &[&str] = &["pid", "ipc", "uts", "mount", "network"];

/// Paths containerd's and Docker's default specs both mask.
pub(super) const MASKED: &[&str] = &[
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
];
/// Paths both make read-only.
pub(super) const READONLY: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// containerd's standard mounts: (destination, types).
pub(super) const STANDARD_MOUNTS: &[(&str, &[&str])] = &[
    ("/proc", &["proc"]),
    ("/dev", &["tmpfs"]),
    ("/dev/pts", &["devpts"]),
    ("/dev/shm", &["tmpfs"]),
    ("/dev/mqueue", &["mqueue"]),
    ("/sys", &["sysfs"]),
    ("/sys/fs/cgroup", &["cgroup", "cgroup2"]),
    ("/run", &["tmpfs"]),
];

/// Character devices containerd's default device list allows (`WithDefaultUnixDevices`):
/// (major, minor; None for any).
pub(super) const DEFAULT_DEVICES: &[(i64, Option<i64>)] = &[
    (1, Some(3)),
    (1, Some(5)),
    (1, Some(7)),
    (1, Some(8)),
    (1, Some(9)),
    (5, Some(0)),
    (5, Some(1)),
    (5, Some(2)),
    (10, Some(200)),
    (136, None),
];

/// Annotations of Crab's that may cross hosts: they grant nothing.
pub(super) const KEPT_CRAB_ANNOTATIONS: &[&str] = &[
    crate::storage::BACKEND_ANNOTATION,
    crate::config::CHECKPOINT_EXIT_ANNOTATION,
];

/// Sysctl prefixes the kernel scopes to a container's namespaces.
pub(super) const NAMESPACED_SYSCTLS: &[&str] = &[
    "net.",
    "kernel.shm",
    "kernel.msg",
    "kernel.sem",
    "fs.mqueue.",
    "kernel.domainname",
    "kernel.hostname",
];
