//! The turn proxy's listener for a container that joins a network namespace
//! another container made: a pod's containers share their sandbox's, and Docker's
//! `--network container:NAME` shares another's.
//!
//! Each container has a proxy of its own, and the configured address (or the
//! `io.crab.proxy.listen` annotation's) can be held already by a neighbour's proxy.
//! So the shim binds the listener itself before the container is made, at that
//! address or the first free port after it, writes the address it got into the
//! container's configuration (and so into its `OPENAI_BASE_URL` and
//! `ANTHROPIC_BASE_URL`), and hands the bound socket to the proxy when it starts.
//! A container with a namespace of its own needs none of this: its proxy binds at
//! start, in the new namespace, where nothing else listens yet.

use std::net::{SocketAddr, TcpListener};

use crab_runtime::config::Config;
use oci_spec::runtime::Spec;

use crate::error::{ShimError, ShimResult};

/// How many ports after the configured one a container may take in a shared
/// namespace (a pod with more proxied containers than this fails to create).
pub const SHARED_PORTS: u16 = 32;

/// Binds the proxy's listener now when the container joins a network namespace by
/// path and has a proxy; updates `config.proxy.listen` to the address it got.
pub fn claim(config: &mut Config, spec: &Spec) -> ShimResult<Option<TcpListener>> {
    if !config.proxy.enabled() {
        return Ok(None);
    }
    let Some((_, _, path)) = crab_runtime::netns::joined_paths(spec).into_iter().next() else {
        return Ok(None);
    };
    let wanted: SocketAddr = config
        .proxy
        .listen
        .parse()
        .map_err(|e| ShimError::InvalidArgument(format!("turn proxy: proxy.listen: {e}")))?;
    let mut last = None;
    for port in ports_from(wanted.port()) {
        let addr = SocketAddr::new(wanted.ip(), port);
        match crab_runtime::netns::bind_in(&path, addr) {
            Ok(l) => {
                config.proxy.listen = addr.to_string();
                return Ok(Some(l));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => last = Some(e),
            Err(e) => return Err(ShimError::Other(format!("turn proxy: {e}"))),
        }
    }
    Err(ShimError::FailedPrecondition(format!(
        "turn proxy: no free port from {wanted} on in the shared network namespace {} ({SHARED_PORTS} tried; last: {})",
        path.display(),
        last.map(|e| e.to_string()).unwrap_or_default()
    )))
}

/// The ports tried, in order: `first`, then the next ones (never past 65535).
fn ports_from(first: u16) -> impl Iterator<Item = u16> {
    (0..SHARED_PORTS).filter_map(move |i| first.checked_add(i))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_tried_upwards_and_stop_at_the_last_port() {
        let p: Vec<u16> = ports_from(8787).take(3).collect();
        assert_eq!(p, vec![8787, 8788, 8789]);
        assert_eq!(ports_from(8787).count(), SHARED_PORTS as usize);
        assert_eq!(ports_from(65534).collect::<Vec<_>>(), vec![65534, 65535]);
    }
}
