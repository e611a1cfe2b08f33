//! The upstream HTTP clients: hyper's pooled client (HTTP/1.1 keep-alive, HTTP/2
//! by ALPN over TLS) over rustls with the platform's certificate verifier.
//!
//! Built on hyper-util directly rather than reqwest: per request, reqwest re-parsed
//! the URL and ran redirect and retry layers the proxy does not want (retries and
//! failover are the attempt pipeline's, and a provider's redirect is its answer);
//! callgrind put that at ~26k instructions, a fifth of a proxied request.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client as Pooled;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::netguard::Resolver;

/// Request bodies are always whole (the client's body, maybe translated).
pub type Body = Full<Bytes>;
pub type Client = Pooled<HttpsConnector<HttpConnector<Resolver>>, Body>;
pub type Error = hyper_util::client::legacy::Error;

/// The two upstream clients. `public` refuses names that resolve to private
/// addresses; credentials with `allowPrivateNetwork: true` use `private`.
#[derive(Clone, Debug)]
pub struct Clients {
    pub public: Client,
    pub private: Client,
}

impl Clients {
    /// Fails only when the platform's certificate verifier cannot be set up.
    pub fn new() -> std::io::Result<Clients> {
        Ok(Clients {
            public: client(Resolver { public_only: true })?,
            private: client(Resolver { public_only: false })?,
        })
    }
}

fn client(resolver: Resolver) -> std::io::Result<Client> {
    let mut http = HttpConnector::new_with_resolver(resolver);
    // `https://` URLs go through the TLS wrapper, which needs these passed through.
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(Duration::from_secs(10)));
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_platform_verifier(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))?
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    Ok(Pooled::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .build(https))
}
