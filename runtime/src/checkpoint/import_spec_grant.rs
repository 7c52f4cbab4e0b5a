//! What an operator may grant an imported container beyond the allow-list
//! ([`Grant`]), and the refusal that names everything not granted ([`Refused`]).

use std::collections::BTreeSet;

/// The kinds of things beyond the allow-list an operator may grant an import.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Grant {
    /// Bind mounts (host paths), mounts of other file systems, shared root
    /// propagation.
    HostMounts,
    /// Capabilities beyond containerd's default set.
    Capabilities,
    /// Device nodes, and device access beyond containerd's default list.
    Devices,
    /// A namespace shared with the host (missing from the list) or joined by path.
    HostNamespaces,
    /// Masked or read-only paths removed, writable `/sys`, AppArmor unconfined,
    /// seccomp notifications to a host socket, sysctls that are not namespaced.
    Privileged,
    /// OCI hooks: programs run on the host.
    Hooks,
    /// `io.crab.*` annotations that grant something (proxy upstream, listen, ...).
    Annotations,
    /// A user namespace's id mappings (`linux.uidMappings` / `gidMappings`): they
    /// choose which host ids the sandbox's processes and files are, and the
    /// exporting host's range may be another sandbox's here. Host id 0 is refused
    /// whatever is granted (`crate::userns::check`).
    UserMappings,
    /// Spec fields this version does not know.
    Other,
}

impl Grant {
    /// Every kind, in the order of [`Grant::name`].
    pub const ALL: [Grant; 9] = [
        Grant::HostMounts,
        Grant::Capabilities,
        Grant::Devices,
        Grant::HostNamespaces,
        Grant::Privileged,
        Grant::Hooks,
        Grant::Annotations,
        Grant::UserMappings,
        Grant::Other,
    ];

    /// Whether things of this kind can be left out of the spec (`--drop`): each is
    /// one mount, hook or annotation whose absence only takes access away. Leaving
    /// out the others (namespaces, masked paths, capabilities, device rules, ...)
    /// would give more, not less.
    pub fn droppable(self) -> bool {
        matches!(self, Grant::HostMounts | Grant::Hooks | Grant::Annotations)
    }

    /// The name `crabctl import --allow` takes.
    pub fn name(self) -> &'static str {
        match self {
            Grant::HostMounts => "host-mounts",
            Grant::Capabilities => "capabilities",
            Grant::Devices => "devices",
            Grant::HostNamespaces => "host-namespaces",
            Grant::Privileged => "privileged",
            Grant::Hooks => "hooks",
            Grant::Annotations => "annotations",
            Grant::UserMappings => "user-mappings",
            Grant::Other => "other",
        }
    }
}

impl std::str::FromStr for Grant {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Grant, String> {
        Grant::ALL
            .into_iter()
            .find(|g| g.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Grant::ALL.iter().map(|g| g.name()).collect();
                format!("unknown kind {s:?} (kinds: {})", names.join(", "))
            })
    }
}

/// What an archive's spec asks for beyond the allow-list: each thing with its kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub Vec<(Grant, String)>);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kinds: BTreeSet<Grant> = self.0.iter().map(|(g, _)| *g).collect();
        write!(f, "the archive's spec asks for more than an import gives: ")?;
        for (i, (grant, what)) in self.0.iter().enumerate() {
            let sep = if i == 0 { "" } else { "; " };
            write!(f, "{sep}{}: {what}", grant.name())?;
        }
        let names: Vec<&str> = kinds.iter().map(|g| g.name()).collect();
        write!(
            f,
            " (crabctl import --allow {} grants it, if you trust the archive's origin",
            names.join(",")
        )?;
        let droppable: Vec<&str> = kinds
            .iter()
            .filter(|g| g.droppable())
            .map(|g| g.name())
            .collect();
        if !droppable.is_empty() {
            write!(f, "; --drop {} leaves it out", droppable.join(","))?;
        }
        write!(f, ")")
    }
}

impl std::error::Error for Refused {}
