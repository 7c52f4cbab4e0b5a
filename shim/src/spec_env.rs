//! Environment variables the shim adds to a container's spec before creating it, and
//! to each exec's process spec.
//!
//! Only variables the spec does not set are added: a client's own value wins.

use std::path::Path;

use crate::error::{ShimError, ShimResult};

/// The `PATH` a process gets when its spec has none, as runc and Docker use it.
/// containerd gives a Kubernetes pod's sandbox (pause) container no environment at
/// all, and libcontainer refuses a process without `PATH` even when its command is
/// an absolute path.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Adds each `(name, value)` of `vars` that the process environment of the spec in
/// `bundle` lacks (making the environment if the spec has none).
pub fn add_missing(bundle: &Path, vars: &[(String, String)]) -> ShimResult<()> {
    let file = bundle.join("config.json");
    let bad = |e: String| ShimError::Other(format!("{}: {e}", file.display()));
    let text = std::fs::read(&file).map_err(|e| bad(e.to_string()))?;
    let mut spec: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| bad(e.to_string()))?;
    let Some(process) = spec.get_mut("process") else {
        return Ok(());
    };
    if !add_to_process(process, vars).map_err(bad)? {
        return Ok(());
    }
    let out = serde_json::to_vec(&spec).map_err(|e| bad(e.to_string()))?;
    std::fs::write(&file, out).map_err(|e| bad(e.to_string()))
}

/// Adds each of `vars` that the OCI process object `process` lacks; returns whether
/// anything was added.
pub fn add_to_process(
    process: &mut serde_json::Value,
    vars: &[(String, String)],
) -> Result<bool, String> {
    let Some(process) = process.as_object_mut() else {
        return Err("process is not an object".into());
    };
    let env = process
        .entry("env")
        .or_insert_with(|| serde_json::Value::Array(Vec::new()));
    let Some(env) = env.as_array_mut() else {
        return Err("process.env is not a list".into());
    };
    let before = env.len();
    for (name, value) in vars {
        let prefix = format!("{name}=");
        if !env
            .iter()
            .any(|v| v.as_str().is_some_and(|s| s.starts_with(&prefix)))
        {
            env.push(format!("{prefix}{value}").into());
        }
    }
    Ok(env.len() != before)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn env_after(spec: serde_json::Value, vars: &[(&str, &str)]) -> serde_json::Value {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), spec.to_string()).unwrap();
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        add_missing(dir.path(), &vars).unwrap();
        let text = std::fs::read(dir.path().join("config.json")).unwrap();
        serde_json::from_slice::<serde_json::Value>(&text).unwrap()["process"]["env"].clone()
    }

    #[test]
    fn test_a_spec_without_environment_gets_the_default_path() {
        let env = env_after(
            json!({"process": {"args": ["/pause"]}}),
            &[("PATH", DEFAULT_PATH)],
        );
        assert_eq!(env, json!([format!("PATH={DEFAULT_PATH}")]));
    }

    #[test]
    fn test_a_variable_the_spec_sets_is_kept() {
        let env = env_after(
            json!({"process": {"env": ["PATH=/mine", "A=1"]}}),
            &[("PATH", DEFAULT_PATH), ("B", "2")],
        );
        assert_eq!(env, json!(["PATH=/mine", "A=1", "B=2"]));
    }
}
