//! The OCI spec an imported container gets: rebuilt from an allow-list, never the
//! archive's spec as it came.
//!
//! An archive may come from a host whose operator granted its container things this
//! host's operator never did: a bind mount of the host's `/`, capabilities beyond
//! containerd's default set, devices, the host's namespaces, unmasked `/proc` paths,
//! hooks (programs containerd's runtime runs on the host), `io.crab.*` annotations
//! that open the proxy or the agent API. [`rebuild`] keeps what a container made by
//! `ctr run` without flags holds (process, environment, working directory, rlimits,
//! resources, hostname, containerd's standard mounts, tmpfs mounts of its own) and
//! refuses anything beyond it, naming each thing, unless the operator allows its kind
//! ([`Grant`], `crabctl import --allow KIND,...`) or, for the kinds whose removal
//! takes away access and nothing else (host mounts, hooks, `io.crab.*`
//! annotations), has them left out (`--drop KIND,...`). The root is always the
//! import's own snapshot (`rootfs`), whatever path the archive's spec names: the
//! archive's files go there.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

#[path = "import_spec_grant.rs"]
mod grant;
pub use grant::{Grant, Refused};

/// The container the spec is for on this host (its cgroup path is its own).
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// containerd namespace.
    pub namespace: &'a str,
    /// The new container's id.
    pub id: &'a str,
}

#[path = "import_spec_lists.rs"]
mod lists;
pub use lists::DEFAULT_CAPS;
use lists::*;

/// The spec `target` gets from an archive's `spec`: the allow-list's part of it,
/// plus what `granted` allows; else every thing beyond, named.
pub fn rebuild(
    spec: &Value,
    granted: &BTreeSet<Grant>,
    target: Target<'_>,
) -> std::result::Result<Value, Refused> {
    rebuild_dropping(spec, granted, &BTreeSet::new(), target)
}

/// As [`rebuild`], with the things of the `dropped` kinds beyond the allow-list
/// left out rather than refused (only [`Grant::droppable`] kinds; the others are
/// refused as ever).
pub fn rebuild_dropping(
    spec: &Value,
    granted: &BTreeSet<Grant>,
    dropped: &BTreeSet<Grant>,
    target: Target<'_>,
) -> std::result::Result<Value, Refused> {
    let mut b = Builder {
        granted,
        dropped,
        refused: Vec::new(),
    };
    let empty = Map::new();
    let spec_map = spec.as_object().unwrap_or(&empty);
    let mut out = Map::new();
    for (key, value) in spec_map {
        match key.as_str() {
            "ociVersion" | "hostname" | "domainname" => {
                out.insert(key.clone(), value.clone());
            }
            "process" => {
                out.insert(key.clone(), b.process(value));
            }
            "root" => {
                out.insert(key.clone(), own_root(value));
            }
            "mounts" => {
                out.insert(key.clone(), b.mounts(value));
            }
            "linux" => {
                out.insert(key.clone(), b.linux(value, target));
            }
            "annotations" => {
                out.insert(key.clone(), b.annotations(value));
            }
            "hooks" => {
                let names = hook_programs(value);
                if names.is_empty() || b.allow(Grant::Hooks, format!("hooks {names}")) {
                    out.insert(key.clone(), value.clone());
                }
            }
            other => {
                if b.allow(Grant::Other, format!("field {other}")) {
                    out.insert(key.clone(), value.clone());
                }
            }
        }
    }
    if !spec_map.contains_key("linux") {
        b.linux(&Value::Null, target);
    }
    if b.refused.is_empty() {
        Ok(Value::Object(out))
    } else {
        Err(Refused(b.refused))
    }
}

/// The root an imported container gets: its own snapshot, where the archive's files
/// go (`rootfs`, in the bundle), read-only if the archive's was. A path the archive
/// names (Docker's names the exporting host's overlay) is not kept.
fn own_root(root: &Value) -> Value {
    let path = root["path"].as_str().unwrap_or("");
    if path != "rootfs" {
        tracing::warn!(%path, "import runs on its own snapshot, not the archive's root path");
    }
    let mut out = Map::new();
    out.insert("path".into(), "rootfs".into());
    if let Some(ro) = root.get("readonly") {
        out.insert("readonly".into(), ro.clone());
    }
    Value::Object(out)
}

struct Builder<'a> {
    granted: &'a BTreeSet<Grant>,
    dropped: &'a BTreeSet<Grant>,
    refused: Vec<(Grant, String)>,
}

impl Builder<'_> {
    /// Whether `what`, of kind `grant`, is kept: if granted. Else it is left out
    /// when its kind is dropped (and may be), and recorded as refused otherwise.
    /// Every caller of a droppable kind passes one thing (a mount, the hooks, an
    /// annotation), whose absence takes nothing else away.
    fn allow(&mut self, grant: Grant, what: String) -> bool {
        if self.granted.contains(&grant) {
            tracing::warn!(kind = grant.name(), %what, "import keeps, as the operator allowed");
            return true;
        }
        if grant.droppable() && self.dropped.contains(&grant) {
            tracing::warn!(kind = grant.name(), %what, "import leaves out, as the operator asked");
            return false;
        }
        self.refused.push((grant, what));
        false
    }

    fn process(&mut self, process: &Value) -> Value {
        const KEPT: &[&str] = &[
            "terminal",
            "consoleSize",
            "user",
            "args",
            "commandLine",
            "env",
            "cwd",
            "rlimits",
            "noNewPrivileges",
            "oomScoreAdj",
            "selinuxLabel",
        ];
        let mut out = Map::new();
        for (key, value) in process.as_object().into_iter().flatten() {
            let keep = match key.as_str() {
                k if KEPT.contains(&k) => true,
                "capabilities" => {
                    let extra = extra_caps(value);
                    extra.is_empty()
                        || self.allow(
                            Grant::Capabilities,
                            format!("{} beyond containerd's default set", extra.join(", ")),
                        )
                }
                "apparmorProfile" => {
                    value.as_str() != Some("unconfined")
                        || self.allow(Grant::Privileged, "AppArmor unconfined".into())
                }
                other => self.allow(Grant::Other, format!("field process.{other}")),
            };
            if keep {
                out.insert(key.clone(), value.clone());
            }
        }
        Value::Object(out)
    }

    fn mounts(&mut self, mounts: &Value) -> Value {
        let mut out = Vec::new();
        for m in mounts.as_array().into_iter().flatten() {
            let dest = m["destination"].as_str().unwrap_or("");
            let kind = m["type"].as_str().unwrap_or("");
            let source = m["source"].as_str().unwrap_or("");
            let options: Vec<&str> = m["options"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let bind = kind == "bind" || options.iter().any(|o| *o == "bind" || *o == "rbind");
            let standard = STANDARD_MOUNTS
                .iter()
                .any(|(d, types)| *d == dest && types.contains(&kind));
            let idmapped = options.iter().any(|o| *o == "idmap" || *o == "ridmap")
                || ["uidMappings", "gidMappings"]
                    .iter()
                    .any(|k| m[*k].as_array().is_some_and(|a| !a.is_empty()));
            let keep = if bind && idmapped {
                // Through an idmapped mount the sandbox's root writes the host
                // root's files: say so, not only "a bind mount".
                self.allow(
                    Grant::HostMounts,
                    format!(
                        "idmapped bind mount of the host's {source} at {dest} (the \
                         sandbox's root would write it as its owners)"
                    ),
                )
            } else if bind {
                self.allow(
                    Grant::HostMounts,
                    format!("bind mount of the host's {source} at {dest}"),
                )
            } else if standard && matches!(kind, "sysfs" | "cgroup" | "cgroup2") {
                options.contains(&"ro")
                    || self.allow(Grant::Privileged, format!("{dest} mounted writable"))
            } else if standard || kind == "tmpfs" {
                true
            } else {
                self.allow(
                    Grant::HostMounts,
                    format!("mount of {kind} {source} at {dest}"),
                )
            };
            if keep {
                out.push(m.clone());
            }
        }
        Value::Array(out)
    }

    fn linux(&mut self, linux: &Value, target: Target<'_>) -> Value {
        let mut out = Map::new();
        let mut seen_namespaces = false;
        for (key, value) in linux.as_object().into_iter().flatten() {
            let keep = match key.as_str() {
                "mountLabel" => true,
                "uidMappings" | "gidMappings" => {
                    let extents: Vec<String> = value
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|m| format!("{}:{}:{}", m["containerID"], m["hostID"], m["size"]))
                        .collect();
                    self.allow(
                        Grant::UserMappings,
                        format!(
                            "{key} {} (host ids chosen by the archive)",
                            extents.join(",")
                        ),
                    )
                }
                "cgroupsPath" => {
                    out.insert(key.clone(), Value::String(cgroups_path(value, target)));
                    false
                }
                "namespaces" => {
                    seen_namespaces = true;
                    self.namespaces(value)
                }
                "resources" => {
                    out.insert(key.clone(), self.resources(value));
                    false
                }
                "devices" => {
                    let nodes = device_paths(value);
                    nodes.is_empty() || self.allow(Grant::Devices, format!("device nodes {nodes}"))
                }
                "maskedPaths" => self.keeps_all(value, MASKED, "masked"),
                "readonlyPaths" => self.keeps_all(value, READONLY, "read-only"),
                "sysctl" => {
                    let host: Vec<&String> = value
                        .as_object()
                        .into_iter()
                        .flatten()
                        .map(|(k, _)| k)
                        .filter(|k| !NAMESPACED_SYSCTLS.iter().any(|p| k.starts_with(p)))
                        .collect();
                    host.is_empty()
                        || self.allow(
                            Grant::Privileged,
                            format!("sysctls the host shares: {host:?}"),
                        )
                }
                "seccomp" => {
                    let listener = value["listenerPath"].as_str().unwrap_or("");
                    listener.is_empty()
                        || self.allow(
                            Grant::Privileged,
                            format!("seccomp notifications to the host's {listener}"),
                        )
                }
                "rootfsPropagation" => {
                    !matches!(value.as_str(), Some("shared" | "rshared"))
                        || self.allow(
                            Grant::HostMounts,
                            format!("root propagation {value} (mounts reach the host)"),
                        )
                }
                other => self.allow(Grant::Other, format!("field linux.{other}")),
            };
            if keep {
                out.insert(key.clone(), value.clone());
            }
        }
        if !seen_namespaces {
            self.allow(
                Grant::HostNamespaces,
                "no namespaces: all the host's".into(),
            );
        }
        if !linux.is_object() {
            self.allow(Grant::Privileged, "no linux section".into());
        }
        // Masked and read-only paths absent altogether are removed as well.
        for (key, list, what) in [
            ("maskedPaths", MASKED, "masked"),
            ("readonlyPaths", READONLY, "read-only"),
        ] {
            if linux.is_object() && linux.get(key).is_none() {
                self.keeps_all(&Value::Null, list, what);
            }
        }
        Value::Object(out)
    }

    fn namespaces(&mut self, namespaces: &Value) -> bool {
        let list: Vec<&Value> = namespaces.as_array().into_iter().flatten().collect();
        let mut ok = true;
        for ns in &list {
            let kind = ns["type"].as_str().unwrap_or("");
            if let Some(path) = ns["path"].as_str().filter(|p| !p.is_empty()) {
                ok &= self.allow(
                    Grant::HostNamespaces,
                    format!("joins the {kind} namespace at {path}"),
                );
            }
        }
        for own in OWN_NAMESPACES {
            if !list.iter().any(|ns| ns["type"].as_str() == Some(own)) {
                ok &= self.allow(
                    Grant::HostNamespaces,
                    format!("shares the host's {own} namespace"),
                );
            }
        }
        ok
    }

    fn keeps_all(&mut self, paths: &Value, required: &[&str], what: &str) -> bool {
        let given: Vec<&str> = paths
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let missing: Vec<&str> = required
            .iter()
            .copied()
            .filter(|p| !given.contains(p))
            .collect();
        missing.is_empty()
            || self.allow(
                Grant::Privileged,
                format!("{} no longer {what}", missing.join(", ")),
            )
    }

    fn resources(&mut self, resources: &Value) -> Value {
        let mut out = Map::new();
        for (key, value) in resources.as_object().into_iter().flatten() {
            let keep = match key.as_str() {
                "memory" | "cpu" | "pids" | "hugepageLimits" | "blockIO" | "unified" => true,
                "devices" => {
                    let extra = extra_device_rules(value);
                    extra.is_empty() || self.allow(Grant::Devices, format!("device access {extra}"))
                }
                other => self.allow(Grant::Other, format!("field linux.resources.{other}")),
            };
            if keep {
                out.insert(key.clone(), value.clone());
            }
        }
        Value::Object(out)
    }

    fn annotations(&mut self, annotations: &Value) -> Value {
        let mut out = Map::new();
        for (key, value) in annotations.as_object().into_iter().flatten() {
            let crab = key.starts_with("io.crab.");
            if !crab
                || KEPT_CRAB_ANNOTATIONS.contains(&key.as_str())
                || self.allow(Grant::Annotations, format!("annotation {key}={value}"))
            {
                out.insert(key.clone(), value.clone());
            }
        }
        Value::Object(out)
    }
}

/// Capabilities of any set beyond [`DEFAULT_CAPS`].
fn extra_caps(caps: &Value) -> Vec<String> {
    let mut extra = BTreeSet::new();
    for (_, set) in caps.as_object().into_iter().flatten() {
        for cap in set
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            if !DEFAULT_CAPS.contains(&cap) {
                extra.insert(cap.to_string());
            }
        }
    }
    extra.into_iter().collect()
}

/// Device cgroup rules that allow more than containerd's default list.
fn extra_device_rules(rules: &Value) -> String {
    let extra: Vec<String> = rules
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["allow"].as_bool() == Some(true))
        .filter(|r| {
            let (kind, major, minor) = (
                r["type"].as_str().unwrap_or("a"),
                r["major"].as_i64(),
                r["minor"].as_i64(),
            );
            let access = r["access"].as_str().unwrap_or("rwm");
            // "m" on any char or block device (mknod only) is in the default list.
            let mknod_only = access == "m" && kind != "a";
            let listed = kind == "c"
                && DEFAULT_DEVICES
                    .iter()
                    .any(|(ma, mi)| major == Some(*ma) && (mi.is_none() || minor == *mi));
            !(mknod_only || listed)
        })
        .map(|r| {
            let num = |v: &Value| v.as_i64().map_or("*".to_string(), |n| n.to_string());
            format!(
                "{} {}:{} {}",
                r["type"].as_str().unwrap_or("a"),
                num(&r["major"]),
                num(&r["minor"]),
                r["access"].as_str().unwrap_or("rwm")
            )
        })
        .collect();
    extra.join(", ")
}

fn device_paths(devices: &Value) -> String {
    let paths: Vec<&str> = devices
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| d["path"].as_str().unwrap_or("?"))
        .collect();
    paths.join(", ")
}

fn hook_programs(hooks: &Value) -> String {
    let mut programs = Vec::new();
    for (stage, list) in hooks.as_object().into_iter().flatten() {
        for hook in list.as_array().into_iter().flatten() {
            programs.push(format!("{stage} {}", hook["path"].as_str().unwrap_or("?")));
        }
    }
    programs.join(", ")
}

/// The new container's own cgroup, in the form the archive's path had: systemd's
/// `slice:prefix:name`, or containerd's `/namespace/id`.
fn cgroups_path(old: &Value, target: Target<'_>) -> String {
    let old = old.as_str().unwrap_or("");
    let parts: Vec<&str> = old.split(':').collect();
    if parts.len() == 3 {
        return format!("{}:{}:{}", parts[0], parts[1], target.id);
    }
    format!("/{}/{}", target.namespace, target.id)
}

#[cfg(test)]
#[path = "import_spec_tests.rs"]
mod tests;
