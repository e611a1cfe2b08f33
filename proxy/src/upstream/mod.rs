//! The upstream HTTP clients: hyper's pooled client (HTTP/1.1 keep-alive, HTTP/2
//! by ALPN over TLS) over rustls with the platform's certificate verifier.
//!
//! Built on hyper-util directly rather than reqwest: per request, reqwest re-parsed
//! the URL and ran redirect and retry layers the proxy does not want (retries and
//! failover are the pipeline's, and a provider's redirect is its answer);
//! callgrind put that at ~26k instructions, a fifth of a proxied request.
//!
//! `http://` upstreams go over the serving thread's own HTTP/1 connections (`pool`),
//! each driven by the request and the body that use it. `https://` ones go over one
//! hyper-util client per serving thread (a *lane*): hyper-util drives each connection
//! in a task spawned where the connection was made, so a pool shared by threads would
//! hand requests from one thread to a connection task on another, a wake-up each way.
//! Either way a connection is made, driven and reused by the thread that serves the
//! request, as in nginx's workers.
//!
//! It knows how to reach a host (pool, TLS, the private-network guard in
//! `netguard`), never what is sent there: requests are made by the pipeline and
//! the providers.

mod h1;
pub mod netguard;
mod pool;

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http::Response;
use http_body_util::{BodyDataStream, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client as Pooled;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::upstream::netguard::Resolver;

pub use pool::Incoming;

/// Request bodies are always whole (the client's body, maybe translated).
pub type Body = Full<Bytes>;

/// One serving thread's upstream client: `http://` URLs over the thread's own
/// connections, `https://` ones over hyper-util's pooled client.
#[derive(Clone, Debug)]
pub struct Client {
    tls: Pooled<Connector, Body>,
    plain: HttpConnector<Resolver>,
    private: bool,
}

/// An upstream request on its way: boxed, as hyper-util's own, so that a request in
/// flight can be handed to another task (`pipeline::answer::Unanswered`).
pub type ResponseFuture = Pin<Box<dyn Future<Output = Result<Response<Incoming>, Error>> + Send>>;

impl Client {
    /// Sends `request` (an absolute URL) and reads the answer's head. A request
    /// without a `Host` header gets the one hyper-util would write, from
    /// [`host_header`]'s cache (a credential's own, or a signature's, stays).
    pub fn request(&self, request: http::Request<Body>) -> ResponseFuture {
        let (mut parts, body) = request.into_parts();
        if let http::header::Entry::Vacant(v) = parts.headers.entry(http::header::HOST)
            && let Some(host) = host_header(&parts.uri)
        {
            v.insert(host);
        }
        if parts.uri.scheme() == Some(&http::uri::Scheme::HTTP) {
            return Box::pin(pool::request(self.plain.clone(), self.private, parts, body));
        }
        let sent = self.tls.request(http::Request::from_parts(parts, body));
        Box::pin(async move {
            let answer = sent.await.map_err(Error::legacy)?;
            Ok(answer.map(Incoming::tls))
        })
    }
}

/// Why an upstream request got no answer: the connection could not be made, or the
/// exchange failed. Its `source` chain has the cause (a refused private address says
/// so there).
#[derive(Debug)]
pub struct Error {
    what: &'static str,
    source: Option<BoxError>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Error {
    fn msg(what: &'static str) -> Self {
        Error { what, source: None }
    }

    fn io(e: std::io::Error) -> Self {
        Error {
            what: "the exchange failed",
            source: Some(Box::new(e)),
        }
    }

    fn connect(e: impl Into<BoxError>) -> Self {
        Error {
            what: "could not connect",
            source: Some(e.into()),
        }
    }

    fn legacy(e: hyper_util::client::legacy::Error) -> Self {
        Error {
            what: if e.is_connect() {
                "could not connect"
            } else {
                "the exchange failed"
            },
            source: Some(Box::new(e)),
        }
    }
}

impl From<hyper::Error> for Error {
    fn from(e: hyper::Error) -> Self {
        Error {
            what: "the exchange failed",
            source: Some(Box::new(e)),
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.source {
            Some(s) => write!(f, "{}: {s}", self.what),
            None => f.write_str(self.what),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

/// The two upstream clients. `public` refuses names that resolve to private
/// addresses; credentials with `allowPrivateNetwork: true` use `private`.
#[derive(Clone, Debug)]
pub struct Clients {
    pub public: Lanes,
    pub private: Lanes,
}

impl Clients {
    /// `lanes` clients of each kind (at least one); the lanes of a kind share one
    /// connector and its TLS setup. Fails only when the platform's certificate
    /// verifier cannot be set up.
    pub fn new(lanes: usize) -> std::io::Result<Clients> {
        Ok(Clients {
            public: Lanes::new(Resolver { public_only: true }, lanes)?,
            private: Lanes::new(Resolver { public_only: false }, lanes)?,
        })
    }
}

/// One pooled client per serving thread; [`Lanes::here`] picks the calling thread's.
#[derive(Clone, Debug)]
pub struct Lanes(Arc<[Client]>);

thread_local! {
    /// This thread's lane, set by [`enter_lane`]; 0 on threads that never set one (the
    /// caller's runtime when the proxy serves in-process).
    static LANE: Cell<usize> = const { Cell::new(0) };
}

/// Makes the calling thread use lane `i` from now on.
pub fn enter_lane(i: usize) {
    LANE.with(|l| l.set(i));
}

/// The calling thread's lane.
pub fn lane() -> usize {
    LANE.with(Cell::get)
}

impl Lanes {
    fn new(resolver: Resolver, lanes: usize) -> std::io::Result<Lanes> {
        let plain = http_connector(resolver);
        let tls = connector(plain.clone())?;
        let client = |_| Client {
            tls: pooled(tls.clone()),
            plain: plain.clone(),
            private: !resolver.public_only,
        };
        Ok(Lanes((0..lanes.max(1)).map(client).collect()))
    }

    /// The calling thread's client.
    #[inline]
    pub fn here(&self) -> &Client {
        &self.0[lane() % self.0.len()]
    }
}

type Connector = HttpsConnector<HttpConnector<Resolver>>;

/// The `Host` header of a request to `uri`, as hyper-util writes it when a request
/// has none (the host, and the port unless it is the scheme's own), from a small
/// cache per thread: hyper-util formats and allocates it for every request
/// (~2.3k instructions a proxied request, a `format!` when the port is not the
/// default: docs/benchmark.md#where-a-requests-cpu-goes). `None` without a host.
fn host_header(uri: &http::Uri) -> Option<http::HeaderValue> {
    /// Distinct upstream hosts remembered per thread; past it, each new one takes
    /// the place of the one cached longest, so that a run of one-off hosts (media
    /// fetched from the URLs clients give) cannot keep the providers' hosts out.
    const CACHED: usize = 32;
    /// Whether the scheme is secure, the authority, and its `Host` value.
    type Cached = (bool, http::uri::Authority, http::HeaderValue);
    thread_local! {
        /// The hosts, and where the next one goes once they are `CACHED`.
        static HOSTS: std::cell::RefCell<(Vec<Cached>, usize)> =
            const { std::cell::RefCell::new((Vec::new(), 0)) };
    }
    let authority = uri.authority()?;
    let secure = matches!(uri.scheme_str(), Some("https" | "wss"));
    let hit = HOSTS.with_borrow(|(hosts, _)| {
        hosts
            .iter()
            .find(|(s, a, _)| *s == secure && a.as_str() == authority.as_str())
            .map(|(_, _, v)| v.clone())
    });
    if hit.is_some() {
        return hit;
    }
    let host = authority.host();
    let value = match (authority.port_u16(), secure) {
        (Some(443), true) | (Some(80), false) | (None, _) => http::HeaderValue::from_str(host),
        (Some(port), _) => http::HeaderValue::from_str(&format!("{host}:{port}")),
    }
    .ok()?;
    HOSTS.with_borrow_mut(|(hosts, next)| {
        let entry = (secure, authority.clone(), value.clone());
        if hosts.len() < CACHED {
            hosts.push(entry);
        } else {
            hosts[*next] = entry;
            *next = (*next + 1) % CACHED;
        }
    });
    Some(value)
}

fn http_connector(resolver: Resolver) -> HttpConnector<Resolver> {
    let mut http = HttpConnector::new_with_resolver(resolver);
    // `https://` URLs go through the TLS wrapper, which needs these passed through.
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(Duration::from_secs(10)));
    http
}

fn connector(http: HttpConnector<Resolver>) -> std::io::Result<Connector> {
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_platform_verifier(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))?
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    Ok(https)
}

fn pooled(https: Connector) -> Pooled<Connector, Body> {
    Pooled::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .build(https)
}

/// Read an answer whole, cut at `cap` bytes (an error body, only classified and
/// relayed; a token endpoint's answer).
pub async fn read_cut(response: Incoming, cap: usize) -> Result<Bytes, Error> {
    let mut buf = BytesMut::new();
    let mut body = BodyDataStream::new(response);
    while let Some(chunk) = body.next().await.transpose()? {
        let room = cap.saturating_sub(buf.len());
        buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if buf.len() >= cap {
            break;
        }
    }
    Ok(buf.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `Host` an upstream request carries is what hyper-util would have written:
    /// the port only when it is not the scheme's own, the same value again from the
    /// cache, each host its own.
    #[test]
    fn host_header_is_hyper_utils() {
        let cases = [
            ("http://127.0.0.1:4000/v1/chat", Some("127.0.0.1:4000")),
            // Again, from the cache.
            ("http://127.0.0.1:4000/v1/x", Some("127.0.0.1:4000")),
            ("https://api.openai.com/v1/chat", Some("api.openai.com")),
            ("https://api.openai.com:443/v1", Some("api.openai.com")),
            (
                "https://api.openai.com:8443/v1",
                Some("api.openai.com:8443"),
            ),
            ("http://llm.internal:80/v1", Some("llm.internal")),
            ("http://llm.internal:443/v1", Some("llm.internal:443")),
            ("https://llm.internal:80/v1", Some("llm.internal:80")),
            ("http://[::1]:9000/v1", Some("[::1]:9000")),
            ("/v1/chat", None),
        ];
        for (uri, want) in cases {
            let got = host_header(&uri.parse().unwrap());
            assert_eq!(got.as_ref().map(|v| v.to_str().unwrap()), want, "{uri}");
        }
    }

    /// docs/security.md#where-the-proxies-connect: a credential the platform did not allow
    /// private networks is served through `public`, whose resolver refuses, at connection
    /// time, a name that resolves to a private address: nothing reaches a server listening
    /// there. The same request through `private` (an allowed credential's client) connects.
    #[tokio::test]
    async fn the_public_client_never_connects_to_a_private_address_by_name() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let clients = Clients::new(1).unwrap();
        let request = move || {
            hyper::Request::get(format!("http://localhost:{port}/v1/models"))
                .body(Body::default())
                .unwrap()
        };
        let err = clients.public.here().request(request()).await.unwrap_err();
        let mut chain = format!("{err}");
        let mut source = std::error::Error::source(&err);
        while let Some(e) = source {
            chain.push_str(&format!(": {e}"));
            source = e.source();
        }
        assert!(chain.contains("allowPrivateNetwork"), "{chain}");
        let accepted = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
        assert!(accepted.is_err(), "the public client connected to {port}");

        let private = tokio::spawn({
            let client = clients.private.here().clone();
            async move { client.request(request()).await }
        });
        let (mut conn, _) = tokio::time::timeout(Duration::from_secs(5), listener.accept())
            .await
            .expect("the private client connects")
            .unwrap();
        use tokio::io::AsyncWriteExt;
        conn.write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
            .await
            .unwrap();
        let answer = private.await.unwrap().unwrap();
        assert_eq!(answer.status(), 204);
    }
}
