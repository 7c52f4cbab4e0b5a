//! The spec's OCI hooks at a restore, as runc runs them: when the network of the
//! container is made by a hook (Docker attaches a container to its bridge in a
//! `prestart` hook), a checkpoint through containerd's API dumps the network
//! namespace empty (CRIU's `--empty-ns net`), and the restore has CRIU call the
//! shim binary as its action script, which runs the `prestart` and `createRuntime`
//! hooks at CRIU's `setup-namespaces` notification: the restored init's namespaces
//! exist, its processes do not run yet. Crab's own checkpoints (a history's) keep
//! the network images instead: an in-place rollback must not ask the hooks to
//! attach a container that is already attached.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use oci_spec::runtime::{Hook, Spec};

use crate::{Error, Result};

/// The bundle and id of the restored container, for the action script (CRIU runs
/// the script's path with no argument: these and CRIU's own variables say it all).
const BUNDLE_ENV: &str = "CRAB_RESTORE_BUNDLE";
const ID_ENV: &str = "CRAB_RESTORE_ID";
/// How long a hook without its own timeout may run.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Whether the spec makes part of the container's world in a hook that a restore
/// must run again: a `prestart` or `createRuntime` hook.
pub fn makes_network(spec: &Spec) -> bool {
    spec.hooks().as_ref().is_some_and(|h| {
        #[allow(deprecated)]
        let prestart = h.prestart().as_ref().is_some_and(|v| !v.is_empty());
        prestart || h.create_runtime().as_ref().is_some_and(|v| !v.is_empty())
    })
}

/// Whether a checkpoint for containerd's API dumps the container's network
/// namespace empty: it is the container's own and the spec's hooks make it.
pub fn dumps_network_empty(spec: &Spec) -> bool {
    crate::netns::owns_network_namespace(spec) && makes_network(spec)
}

/// Whether this process is CRIU's action script of a restore ([`action_script`]).
pub fn is_action_script() -> bool {
    std::env::var_os("CRTOOLS_SCRIPT_ACTION").is_some() && std::env::var_os(BUNDLE_ENV).is_some()
}

/// CRIU's `--action-script` (the binary `exe`, run with no argument) and the
/// environment it needs, for the restore of container `id` from `bundle`.
pub fn action_script(exe: &Path, bundle: &Path, id: &str) -> (String, Vec<(String, String)>) {
    (
        exe.display().to_string(),
        vec![
            (BUNDLE_ENV.into(), bundle.display().to_string()),
            (ID_ENV.into(), id.into()),
        ],
    )
}

/// The action script's `main`: runs the hooks at `setup-namespaces`, nothing at
/// CRIU's other notifications. Never returns.
pub fn main() -> ! {
    let action = std::env::var("CRTOOLS_SCRIPT_ACTION").unwrap_or_default();
    if action != "setup-namespaces" {
        std::process::exit(0);
    }
    let code = match run_at_setup_namespaces() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("restore hooks: {}", crate::helper::error_chain(&e));
            1
        }
    };
    std::process::exit(code)
}

fn run_at_setup_namespaces() -> Result<()> {
    let var = |name: &str| {
        std::env::var(name).map_err(|_| Error::Helper {
            operation: "run the restore's hooks",
            message: format!("{name} is not set"),
        })
    };
    let bundle = PathBuf::from(var(BUNDLE_ENV)?);
    let id = var(ID_ENV)?;
    let pid: i32 = var("CRTOOLS_INIT_PID")?
        .parse()
        .map_err(|_| Error::Helper {
            operation: "run the restore's hooks",
            message: "CRTOOLS_INIT_PID is not a pid".into(),
        })?;
    let spec = crate::container::load_spec(&bundle)?;
    let state = serde_json::json!({
        "ociVersion": spec.version(),
        "id": id,
        "status": "created",
        "pid": pid,
        "bundle": bundle,
        "annotations": spec.annotations().clone().unwrap_or_default(),
    })
    .to_string();
    let Some(hooks) = spec.hooks() else {
        return Ok(());
    };
    #[allow(deprecated)]
    let prestart = hooks.prestart().clone().unwrap_or_default();
    let create_runtime = hooks.create_runtime().clone().unwrap_or_default();
    for hook in prestart.iter().chain(&create_runtime) {
        run(hook, &state)?;
    }
    Ok(())
}

/// Runs one hook with the state on its stdin, as the runtime spec says: its own
/// `args` (the first is its `argv[0]`) and `env` only, within its timeout.
fn run(hook: &Hook, state: &str) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let path = hook.path();
    let failed = |message: String| Error::Helper {
        operation: "run a restore hook",
        message: format!("{}: {message}", path.display()),
    };
    let args = hook.args().clone().unwrap_or_default();
    let mut cmd = Command::new(path);
    if let Some((arg0, rest)) = args.split_first() {
        cmd.arg0(arg0).args(rest);
    }
    cmd.env_clear();
    for kv in hook.env().iter().flatten() {
        if let Some((k, v)) = kv.split_once('=') {
            cmd.env(k, v);
        }
    }
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let mut child = cmd.spawn().map_err(|e| failed(e.to_string()))?;
    if let Some(mut stdin) = child.stdin.take() {
        // A hook that does not read its state is not an error.
        let _ = stdin.write_all(state.as_bytes());
    }
    let timeout = hook
        .timeout()
        .and_then(|s| u64::try_from(s).ok())
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_TIMEOUT);
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => return Err(failed(format!("exited with {status}"))),
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(failed(format!(
                    "no end after {} s: killed",
                    timeout.as_secs()
                )));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(failed(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(hooks: serde_json::Value) -> Spec {
        serde_json::from_value(serde_json::json!({"ociVersion": "1.0.2", "hooks": hooks})).unwrap()
    }

    #[test]
    fn a_spec_with_a_prestart_or_create_runtime_hook_makes_its_network_by_hook() {
        let hook = serde_json::json!([{"path": "/bin/true"}]);
        assert!(makes_network(&spec(serde_json::json!({"prestart": hook}))));
        assert!(makes_network(&spec(
            serde_json::json!({"createRuntime": hook})
        )));
        assert!(!makes_network(&spec(
            serde_json::json!({"poststart": hook})
        )));
        assert!(!makes_network(&spec(serde_json::json!({}))));
    }

    #[test]
    fn a_hook_gets_the_state_on_stdin_its_args_and_only_its_env() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let hook: Hook = serde_json::from_value(serde_json::json!({
            "path": "/bin/sh",
            "args": ["sh", "-c", format!("echo \"$0 $X $HOME\" > {0}; cat >> {0}", out.display())],
            "env": ["X=1"]
        }))
        .unwrap();
        run(&hook, "{\"pid\":7}").unwrap();
        // $HOME expands to nothing: the hook has only its own environment.
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "sh 1 \n{\"pid\":7}");
        let failing: Hook =
            serde_json::from_value(serde_json::json!({"path": "/bin/false"})).unwrap();
        assert!(run(&failing, "{}").is_err());
    }
}
