//! The agent API's per-sandbox token.
//!
//! The shim makes one for each container whose turn proxy serves the agent API, and
//! puts it into the container's environment (`CRAB_API_TOKEN`, beside the proxy's
//! base URLs, in the init's spec and in each exec's). The proxy answers `/.crab/`
//! requests only when they carry it (`Authorization: Bearer <token>`): a process
//! that merely shares the sandbox's network namespace (a sidecar) cannot drive
//! the sandbox's checkpoints, rollbacks and forks.
//!
//! The token lives in the sandbox's process memory, so it survives a checkpoint:
//! after a restore, a rollback or a fork the runtime reads it back from the
//! restored init's environment ([`from_environ`]).

use std::io::Read;

use crate::{Error, Result};

/// The annotation that turns the agent API off for one container (`false`): an
/// annotation may turn it off, never on. Forks an agent makes carry it unless the
/// host's `[quota] agent_forks_get_agent_api` allows them the API.
pub const AGENT_API_ANNOTATION: &str = "io.crab.proxy.agent-api";

/// The variable that carries the token into the sandbox.
pub const ENV: &str = "CRAB_API_TOKEN";

/// The shortest token accepted from a spec that sets its own.
pub const MIN_LEN: usize = 32;

/// A fresh token: 32 random bytes from the kernel's generator, in hex.
pub fn generate() -> Result<String> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(Error::io("read /dev/urandom for the agent API token"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Checks a token given by a container's spec: long enough, and plain enough to go
/// into an HTTP header.
pub fn check(token: &str) -> std::result::Result<(), String> {
    if token.len() < MIN_LEN {
        return Err(format!(
            "{ENV} must be at least {MIN_LEN} characters (it is {})",
            token.len()
        ));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!("{ENV} must be printable ASCII without spaces"));
    }
    Ok(())
}

/// The token among `NAME=value` entries (a spec's `process.env`, or an environ).
pub fn from_env_list<'a>(entries: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let prefix = format!("{ENV}=");
    entries
        .into_iter()
        .filter_map(|e| e.strip_prefix(prefix.as_str()))
        .last()
        .map(str::to_string)
}

/// The token in the environment of process `pid` (`/proc/<pid>/environ`), if it has
/// a valid one.
pub fn from_environ(pid: i32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let entries: Vec<&str> = raw
        .split(|b| *b == 0)
        .filter_map(|e| std::str::from_utf8(e).ok())
        .collect();
    from_env_list(entries).filter(|t| check(t).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_fresh_long_and_valid() {
        let (a, b) = (generate().unwrap(), generate().unwrap());
        assert_ne!(a, b);
        assert_eq!(a.len(), 64);
        check(&a).unwrap();
    }

    #[test]
    fn short_or_odd_tokens_are_refused() {
        assert!(check("short").is_err());
        assert!(check(&format!("{} x", "a".repeat(40))).is_err());
    }

    #[test]
    fn the_token_is_found_in_an_environment() {
        let env = ["PATH=/bin", "CRAB_API_TOKEN=abc", "X=1"];
        assert_eq!(from_env_list(env).as_deref(), Some("abc"));
        assert_eq!(from_env_list(["PATH=/bin"]), None);
    }

    #[test]
    fn the_token_of_a_process_is_read_from_its_environ() {
        let token = generate().unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .env(ENV, &token)
            .spawn()
            .unwrap();
        // Until the child has exec'd, its environ is this process's.
        let mut found = None;
        for _ in 0..100 {
            found = from_environ(child.id() as i32);
            if found.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(found, Some(token));
    }
}
