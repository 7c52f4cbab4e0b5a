//! Where requests go: an `http://` or `https://` upstream, and the connection
//! to it (TLS with rustls, the ring provider, webpki roots plus an optional
//! CA file for private upstreams).

use std::sync::Arc;
use std::time::Duration;

use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::limits::{GuardedBody, UPSTREAM_BUF};
use crate::{Error, Result};

/// A connection or TLS handshake that takes longer is given up: the agent gets
/// a 502 rather than an answer that never comes.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Where requests go: `http://host:port` or `https://host[:port]`.
#[derive(Clone)]
pub struct Upstream {
    /// As written in the URL (an IPv6 literal keeps its brackets).
    host: String,
    port: u16,
    tls: Option<Tls>,
}

#[derive(Clone)]
struct Tls {
    roots: RootCertStore,
    /// Built once, so TLS sessions resume across requests.
    config: Arc<ClientConfig>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Upstream({self})")
    }
}

impl std::fmt::Display for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        write!(f, "{scheme}://{}:{}", self.host, self.port)
    }
}

impl Upstream {
    /// Parses `http://host:port` or `https://host[:port]` (port 443 by
    /// default). A path, if any, is ignored: the agent's request path is kept.
    pub fn parse(url: &str) -> Result<Upstream> {
        let bad = || Error::BadUpstream(url.to_string());
        let (rest, tls) = if let Some(rest) = url.strip_prefix("http://") {
            (rest, false)
        } else if let Some(rest) = url.strip_prefix("https://") {
            (rest, true)
        } else {
            return Err(bad());
        };
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        // Credentials in the URL would end up in logs and error messages.
        if authority.contains('@') {
            return Err(bad());
        }
        let (host, port) = split_host_port(authority).ok_or_else(bad)?;
        let port = match (port, tls) {
            (Some(p), _) => p,
            (None, true) => 443,
            // Plain HTTP upstreams are local services: say the port.
            (None, false) => return Err(bad()),
        };
        let tls = if tls {
            let mut roots = RootCertStore::empty();
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            Some(Tls::new(roots).map_err(|reason| Error::BadUpstream(format!("{url}: {reason}")))?)
        } else {
            None
        };
        Ok(Upstream {
            host: host.to_string(),
            port,
            tls,
        })
    }

    /// Also trusts the CA certificates in the PEM file `path`, for private
    /// upstreams and tests. Only for `https://` upstreams.
    pub fn with_ca_file(mut self, path: impl AsRef<std::path::Path>) -> Result<Upstream> {
        let path = path.as_ref();
        let err = |reason: String| Error::CaFile {
            path: path.display().to_string(),
            reason,
        };
        let Some(tls) = self.tls.as_mut() else {
            return Err(err(format!("{self} is not an https upstream")));
        };
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .map_err(|e| err(e.to_string()))?
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| err(e.to_string()))?;
        if certs.is_empty() {
            return Err(err("no certificate in it".into()));
        }
        for cert in certs {
            tls.roots.add(cert).map_err(|e| err(e.to_string()))?;
        }
        *tls = Tls::new(tls.roots.clone()).map_err(err)?;
        Ok(self)
    }

    /// The `Host` header the upstream expects: the port only when it is not
    /// the scheme's default.
    pub(crate) fn host_header(&self) -> String {
        let default = if self.tls.is_some() { 443 } else { 80 };
        if self.port == default {
            self.host.clone()
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// Opens a connection (TCP, then TLS for https) and an HTTP/1 client on
    /// it. The error says what failed, for the agent's 502.
    pub(crate) async fn connect(&self) -> std::result::Result<SendRequest<GuardedBody>, String> {
        tokio::time::timeout(CONNECT_TIMEOUT, self.connect_now())
            .await
            .unwrap_or_else(|_| Err(format!("no connection within {CONNECT_TIMEOUT:?}")))
    }

    async fn connect_now(&self) -> std::result::Result<SendRequest<GuardedBody>, String> {
        let bare = self.host.trim_start_matches('[').trim_end_matches(']');
        let tcp = TcpStream::connect((bare, self.port))
            .await
            .map_err(|e| format!("cannot connect: {e}"))?;
        // A request's head and body may be written apart: no Nagle delay.
        let _ = tcp.set_nodelay(true);
        let Some(tls) = &self.tls else {
            return handshake(tcp).await;
        };
        let name = ServerName::try_from(bare.to_string())
            .map_err(|e| format!("bad TLS server name {bare:?}: {e}"))?;
        let stream = TlsConnector::from(tls.config.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS handshake failed: {e}"))?;
        handshake(stream).await
    }
}

impl Tls {
    fn new(roots: RootCertStore) -> std::result::Result<Tls, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots.clone())
            .with_no_client_auth();
        // The proxy speaks HTTP/1 only.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls {
            roots,
            config: Arc::new(config),
        })
    }
}

/// Starts an HTTP/1 client on `io`, its connection driven by a task of its own.
async fn handshake<IO>(io: IO) -> std::result::Result<SendRequest<GuardedBody>, String>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::Builder::new()
        .max_buf_size(UPSTREAM_BUF)
        .writev(false)
        .handshake(TokioIo::new(io))
        .await
        .map_err(|e| format!("HTTP handshake failed: {e}"))?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            crate::ratelimit::limited!(debug, error = %e, "upstream connection ended");
        }
    });
    Ok(sender)
}

/// Splits `host:port`, `host` or `[v6]:port`; the port, if any, must be a number.
fn split_host_port(authority: &str) -> Option<(&str, Option<u16>)> {
    let (host, port) = if authority.starts_with('[') {
        let end = authority.find(']')?;
        let (host, rest) = authority.split_at(end + 1);
        match rest {
            "" => (host, None),
            _ => (host, Some(rest.strip_prefix(':')?)),
        }
    } else {
        match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() || host == "[]" {
        return None;
    }
    let port = match port {
        Some(p) => Some(p.parse().ok().filter(|&p: &u16| p != 0)?),
        None => None,
    };
    Some((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_upstreams_need_a_host_and_port() {
        assert!(Upstream::parse("http://127.0.0.1:8000").is_ok());
        assert!(Upstream::parse("http://llm:80/v1").is_ok());
        assert!(Upstream::parse("http://nohost").is_err());
        assert!(Upstream::parse("http://:80").is_err());
        assert!(Upstream::parse("http://h:port").is_err());
        assert!(Upstream::parse("http://user:pw@h:80").is_err());
        assert!(Upstream::parse("ftp://h:21").is_err());
    }

    #[test]
    fn https_upstreams_default_to_port_443() {
        let u = Upstream::parse("https://api.example.com/v1").unwrap();
        assert_eq!(u.to_string(), "https://api.example.com:443");
        assert_eq!(u.host_header(), "api.example.com");
        let u = Upstream::parse("https://localhost:8443").unwrap();
        assert_eq!(u.host_header(), "localhost:8443");
        let u = Upstream::parse("https://[::1]:8443").unwrap();
        assert_eq!(u.host_header(), "[::1]:8443");
        assert_eq!(
            Upstream::parse("http://llm:80").unwrap().host_header(),
            "llm"
        );
        assert_eq!(
            Upstream::parse("http://llm:8000").unwrap().host_header(),
            "llm:8000"
        );
    }

    #[test]
    fn a_ca_file_is_for_https_and_must_hold_a_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let e = Upstream::parse("https://h")
            .unwrap()
            .with_ca_file(&empty)
            .unwrap_err();
        assert!(e.to_string().contains("no certificate"), "{e}");
        let e = Upstream::parse("http://h:1")
            .unwrap()
            .with_ca_file(&empty)
            .unwrap_err();
        assert!(e.to_string().contains("not an https upstream"), "{e}");
        let e = Upstream::parse("https://h")
            .unwrap()
            .with_ca_file(dir.path().join("missing.pem"))
            .unwrap_err();
        assert!(e.to_string().contains("missing.pem"), "{e}");
    }
}
