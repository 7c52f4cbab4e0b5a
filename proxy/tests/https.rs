//! HTTPS upstreams: a TLS stub whose certificate a test CA (made with rcgen)
//! signed, trusted through `Upstream::with_ca_file`, and refused without it.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use common::*;
use crab_proxy::{Proxy, Upstream};
use http::StatusCode;
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A CA (as PEM) and a TLS acceptor for `localhost` whose certificate it signed.
fn pki() -> (String, tokio_rustls::TlsAcceptor) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();

    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&key, &ca_cert, &ca_key)
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    (
        ca_cert.pem(),
        tokio_rustls::TlsAcceptor::from(Arc::new(config)),
    )
}

/// Starts the stub LLM behind TLS on 127.0.0.1.
async fn start_tls_stub(
    acceptor: tokio_rustls::TlsAcceptor,
) -> (SocketAddr, Arc<Mutex<Vec<Seen>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let (acceptor, s) = (acceptor.clone(), s.clone());
            tokio::spawn(async move {
                // A client that does not trust us ends the handshake: no request.
                if let Ok(tls) = acceptor.accept(tcp).await {
                    serve_stub_conn(tls, s);
                }
            });
        }
    });
    (addr, seen)
}

#[tokio::test]
async fn an_https_upstream_with_a_trusted_ca_answers() {
    let (ca_pem, acceptor) = pki();
    let (up, seen) = start_tls_stub(acceptor).await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca_pem).unwrap();

    let upstream = Upstream::parse(&format!("https://localhost:{}", up.port()))
        .unwrap()
        .with_ca_file(&ca_file)
        .unwrap();
    let boundary = TestBoundary::new(GateKind::Open);
    let proxy = listen(&Arc::new(Proxy::new(upstream, boundary.clone(), true)));

    let got = send(proxy, "POST", "/v1/chat/completions", "{\"q\":1}").await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.text());
    assert_eq!(got.text(), ANSWER);
    let got = send(proxy, "POST", "/v1/messages", "{}").await;
    let frames: Vec<&[u8]> = got.frames.iter().map(|(_, b)| b.as_ref()).collect();
    let chunks: Vec<&[u8]> = SSE.iter().map(|c| c.as_bytes()).collect();
    assert_eq!(frames, chunks, "SSE through TLS, chunk by chunk");

    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].body, "{\"q\":1}".as_bytes());
    assert_eq!(seen[0].host, format!("localhost:{}", up.port()));
    assert_eq!(boundary.turns(), 2);
}

#[tokio::test]
async fn an_untrusted_https_upstream_gives_502_saying_why() {
    let (_, acceptor) = pki();
    let (up, seen) = start_tls_stub(acceptor).await;
    // The default trust store does not know the test CA.
    let upstream = Upstream::parse(&format!("https://localhost:{}", up.port())).unwrap();
    let boundary = TestBoundary::new(GateKind::Open);
    let proxy = listen(&Arc::new(Proxy::new(upstream, boundary, true)));

    let got = send(proxy, "POST", "/v1/chat/completions", "{}").await;
    assert_eq!(got.status, StatusCode::BAD_GATEWAY);
    let text = got.text();
    assert!(
        text.contains(&format!("https://localhost:{}", up.port())),
        "{text}"
    );
    assert!(text.contains("certificate"), "{text}");
    assert!(seen.lock().unwrap().is_empty());
}
