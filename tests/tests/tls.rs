//! Each binary's real Kubernetes client, built as `main` builds it, completes a TLS
//! handshake with an HTTPS API server and sends it a request.
//!
//! A loopback server with a certificate made for this run stands in for the API
//! server; the binaries find it through KUBECONFIG, as they would a real one. Before
//! the workspace settled on one rustls crypto provider, both binaries panicked here
//! ("Could not automatically determine the process-level CryptoProvider") before
//! sending anything.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use switchback_tests::binaries::{self, Process};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An HTTPS server on loopback that records each request line it reads and answers
/// 503 (the clients retry; all this test needs is that they got here).
struct TlsApiServer {
    addr: SocketAddr,
    ca_pem: String,
    requests: Arc<Mutex<Vec<String>>>,
}

impl TlsApiServer {
    async fn start() -> TlsApiServer {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let leaf_key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["127.0.0.1".to_string()])
            .unwrap()
            .signed_by(&leaf_key, &issuer)
            .unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der())),
        )
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let (acceptor, seen) = (acceptor.clone(), seen.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 64 * 1024 {
                        match tls.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let line = String::from_utf8_lossy(&head)
                        .lines()
                        .next()
                        .unwrap_or_default()
                        .to_string();
                    seen.lock().unwrap().push(line);
                    let _ = tls
                        .write_all(
                            b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
                              content-length: 2\r\nconnection: close\r\n\r\n{}",
                        )
                        .await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        TlsApiServer {
            addr,
            ca_pem: ca_cert.pem(),
            requests,
        }
    }

    fn kubeconfig(&self) -> String {
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: tls\n\
             clusters: [{{ name: tls, cluster: {{ server: \"https://{}\", certificate-authority-data: {ca} }} }}]\n\
             users: [{{ name: tls, user: {{ token: not-a-real-token }} }}]\n\
             contexts: [{{ name: tls, context: {{ cluster: tls, user: tls, namespace: default }} }}]\n",
            self.addr
        )
    }

    fn take_requests(&self) -> Vec<String> {
        std::mem::take(&mut *self.requests.lock().unwrap())
    }
}

/// Runs `bin` against the server until it has sent a request over TLS, and checks it
/// is still running (a panic at the first connection ends the process).
async fn reaches_the_api_over_tls(
    server: &TlsApiServer,
    kubeconfig: &std::path::Path,
    name: &'static str,
    args: &[&str],
) {
    let bin = binaries::build().join(name);
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let mut process = Process::spawn(
        name,
        &bin,
        &args,
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
        None,
    );
    server.take_requests();
    let start = Instant::now();
    let requests = loop {
        let requests = server.take_requests();
        if !requests.is_empty() {
            break requests;
        }
        if let Some(status) = process.exited() {
            panic!("{name} exited before sending a request over TLS: {status}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{name} sent no request over TLS within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        requests.iter().all(|r| r.starts_with("GET /")
            || r.starts_with("POST /")
            || r.starts_with("PUT /")
            || r.starts_with("PATCH /")),
        "{name}: {requests:?}"
    );
    // Give a late panic (say, in a second client) the chance to show.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(process.exited().is_none(), "{name} ended after connecting");
}

#[tokio::test(flavor = "multi_thread")]
async fn both_binaries_talk_tls_to_the_api_server() {
    let server = TlsApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, server.kubeconfig()).unwrap();

    reaches_the_api_over_tls(
        &server,
        &kubeconfig,
        "switchback-proxy",
        &[
            "--namespace",
            "switchback",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ],
    )
    .await;
    reaches_the_api_over_tls(
        &server,
        &kubeconfig,
        "switchback-operator",
        &[
            "--gateway-namespace",
            "switchback",
            "--proxy-admin-url",
            "http://127.0.0.1:9",
            "--admin-listen",
            "127.0.0.1:0",
        ],
    )
    .await;
}
