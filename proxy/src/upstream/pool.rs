//! The serving thread's own plain-HTTP/1 upstream connections (`http://` base URLs:
//! model servers in the cluster, sidecars, local gateways), kept without a lock and
//! driven by the request that uses them.
//!
//! Why not hyper-util's pool for these: it runs each connection in a task of its own,
//! so every request, and every chunk of a stream, crossed a channel and a wake-up
//! between the request's task and the connection's; it locks its pool and hashes the
//! pool key on every checkout, and spawns one more task per request to put the
//! connection back once the answer's body is read. Here a connection is a value: the
//! request's future polls it until the answer's head is in, the answer's body polls it
//! for every chunk ([`Incoming`]), and once the body has ended the connection goes back
//! to this thread's idle list. Nothing polls an idle connection: one the server
//! closed meanwhile is found closed when it is next taken (polled once first) and
//! dropped; a request sent on a reused connection that closed before taking it is sent
//! again on another, as hyper-util does. docs/benchmark.md#where-a-requests-cpu-goes
//! has what it saves.
//!
//! `https://` upstreams stay on hyper-util's client (`super`): TLS, and HTTP/2 by ALPN.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::uri::{Authority, PathAndQuery};
use hyper::body::{Frame, SizeHint};
use hyper::client::conn::http1;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tower_service::Service as _;

use super::netguard::Resolver;
use super::{Body, Error};

/// An idle connection is closed after this long unused (hyper-util's pool used 90 s).
const IDLE_FOR: Duration = Duration::from_secs(90);

/// Idle connections kept per serving thread, over every host: one for each request
/// in flight at once, for a few hundred at a time per thread. Past it a connection
/// whose answer has ended is closed instead of kept.
const MAX_IDLE: usize = 512;

type Io = TokioIo<TcpStream>;

/// One HTTP/1 connection: the handle requests are sent through, and the connection
/// itself, polled by whoever is waiting on it. Kept boxed: hyper's connection state
/// is about a kilobyte, and it changes hands several times per request.
struct Conn {
    tx: http1::SendRequest<Body>,
    io: http1::Connection<Io, Body>,
}

/// Which connections may serve a request: the same host and port, made by the same
/// kind of resolver (a connection the private client made is never the public one's).
#[derive(Clone, PartialEq, Eq)]
struct Key {
    private: bool,
    authority: Authority,
}

struct Idle {
    key: Key,
    conn: Box<Conn>,
    since: Instant,
}

thread_local! {
    /// This thread's idle connections, oldest first.
    static IDLE: RefCell<VecDeque<Idle>> = const { RefCell::new(VecDeque::new()) };
}

/// Takes this thread's most recently used idle connection to `key`, if one is left
/// that is still open. Connections idle too long are closed on the way.
fn take(key: &Key) -> Option<Box<Conn>> {
    IDLE.with_borrow_mut(|idle| {
        let now = Instant::now();
        while idle.front().is_some_and(|i| now - i.since > IDLE_FOR) {
            idle.pop_front();
        }
        let at = idle.iter().rposition(|i| i.key == *key)?;
        idle.remove(at).map(|i| i.conn)
    })
}

/// Puts a connection whose exchange has ended back on this thread's idle list.
fn give_back(key: Key, conn: Box<Conn>) {
    IDLE.with_borrow_mut(|idle| {
        if idle.len() >= MAX_IDLE {
            idle.pop_front();
        }
        idle.push_back(Idle {
            key,
            conn,
            since: Instant::now(),
        });
    });
}

/// Connections idle on the calling thread (tests).
#[cfg(test)]
pub(super) fn idle_here() -> usize {
    IDLE.with_borrow(VecDeque::len)
}

/// Sends `request` (an `http://` URL with a host) over one of this thread's
/// connections to its host, or a new one made with `connector`.
pub(super) async fn request(
    connector: HttpConnector<Resolver>,
    private: bool,
    mut request: http::Request<Body>,
) -> Result<http::Response<Incoming>, Error> {
    let uri = request.uri().clone();
    let authority = uri
        .authority()
        .cloned()
        .ok_or_else(|| Error::msg("the upstream URL has no host"))?;
    let key = Key { private, authority };
    if let http::header::Entry::Vacant(v) = request.headers_mut().entry(http::header::HOST)
        && let Some(host) = super::host_header(&uri)
    {
        v.insert(host);
    }
    // HTTP/1 to an origin server: the request line carries the path only.
    let path = uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    *request.uri_mut() = http::Uri::from(path);
    loop {
        let (conn, reused) = match reusable(&key).await {
            Some(conn) => (conn, true),
            None => (connect(&connector, &uri).await?, false),
        };
        match exchange(conn, request).await {
            Ok((response, conn)) => {
                let (parts, body) = response.into_parts();
                let body = Incoming {
                    body,
                    conn: conn.map(|c| (key, c)),
                };
                return Ok(http::Response::from_parts(parts, body));
            }
            // Not sent: the connection had closed before it took the request. Only
            // a reused one can have; a new one failing so is the answer.
            Err((e, Some(unsent))) if reused => {
                tracing::trace!(error = %e, "a reused upstream connection had closed; sending again");
                request = unsent;
            }
            Err((e, _)) => return Err(Error::from(e)),
        }
    }
}

/// An idle connection to `key` that is still open: each taken is polled once, which
/// reads what the server sent while it was idle (a close, mostly).
async fn reusable(key: &Key) -> Option<Box<Conn>> {
    while let Some(mut conn) = take(key) {
        let open = poll_fn(|cx| {
            Poll::Ready(Pin::new(&mut conn.io).poll(cx).is_pending() && conn.tx.is_ready())
        })
        .await;
        if open {
            return Some(conn);
        }
    }
    None
}

async fn connect(connector: &HttpConnector<Resolver>, uri: &http::Uri) -> Result<Box<Conn>, Error> {
    let io = connector.clone().call(uri.clone()).await.map_err(Error::connect)?;
    let (tx, io) = http1::Builder::new()
        .handshake(io)
        .await
        .map_err(Error::from)?;
    Ok(Box::new(Conn { tx, io }))
}

/// The request sent and the answer's head read, polling the connection meanwhile:
/// the answer, and the connection unless it has closed already (its body was then
/// read whole with the head). On failure, the request too if it was never sent.
async fn exchange(
    mut conn: Box<Conn>,
    request: http::Request<Body>,
) -> Result<(http::Response<hyper::body::Incoming>, Option<Box<Conn>>), Unsent> {
    let mut sent = std::pin::pin!(conn.tx.try_send_request(request));
    let mut conn = Some(conn);
    let answer = poll_fn(|cx| {
        // The connection first: it writes the request and reads the answer.
        if let Some(c) = conn.as_mut()
            && Pin::new(&mut c.io).poll(cx).is_ready()
        {
            // Closed or failed: dropping it fails the request, should it wait.
            conn = None;
        }
        sent.as_mut().poll(cx)
    })
    .await;
    match answer {
        Ok(response) => Ok((response, conn)),
        Err(mut e) => {
            let unsent = e.take_message();
            Err((e.into_error(), unsent))
        }
    }
}

type Unsent = (hyper::Error, Option<http::Request<Body>>);

/// An answer's body from one of this thread's connections: reading it polls the
/// connection, and its end hands the connection back for the next request. Dropped
/// before its end, it closes the connection (what is left of the answer is not read).
pub struct Incoming {
    body: hyper::body::Incoming,
    conn: Option<(Key, Box<Conn>)>,
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Incoming")
            .field("drives_its_connection", &self.conn.is_some())
            .finish_non_exhaustive()
    }
}

impl Incoming {
    pub(super) fn plain(body: hyper::body::Incoming) -> Self {
        Incoming { body, conn: None }
    }

    /// Whether reading this body drives its own connection: a chunk the connection
    /// has read is here without another task having to run first.
    pub fn drives_its_connection(&self) -> bool {
        self.conn.is_some()
    }

    /// The body has ended: its connection, ready for another request, goes back.
    fn ended(&mut self, cx: &mut Context<'_>) {
        let Some((key, mut conn)) = self.conn.take() else {
            return;
        };
        // The connection takes the next request once it has seen the end of this
        // exchange, normally in the poll that delivered it; one more poll otherwise.
        if !conn.tx.is_ready() && Pin::new(&mut conn.io).poll(cx).is_ready() {
            return;
        }
        if conn.tx.is_ready() {
            give_back(key, conn);
        }
    }
}

impl hyper::body::Body for Incoming {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        // The body first: asking it for a frame is what lets the connection read one.
        let frame = match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(frame) => frame,
            Poll::Pending => {
                let Some((_, conn)) = this.conn.as_mut() else {
                    return Poll::Pending;
                };
                if Pin::new(&mut conn.io).poll(cx).is_ready() {
                    // Closed or failed: the body ends or fails with what it has.
                    this.conn = None;
                }
                ready!(Pin::new(&mut this.body).poll_frame(cx))
            }
        };
        match &frame {
            None => this.ended(cx),
            Some(Err(_)) => this.conn = None,
            Some(Ok(_)) => {}
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn client() -> HttpConnector<Resolver> {
        let mut c = HttpConnector::new_with_resolver(Resolver { public_only: false });
        c.set_nodelay(true);
        c
    }

    fn post(port: u16, body: &'static str) -> http::Request<Body> {
        http::Request::post(format!("http://127.0.0.1:{port}/v1/chat?x=1"))
            .body(Body::new(Bytes::from_static(body.as_bytes())))
            .unwrap()
    }

    /// Reads one request head and its `content-length` body from `tcp`; `None` at EOF.
    async fn read_request(tcp: &mut TcpStream, buf: &mut Vec<u8>) -> Option<String> {
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .map_or(0, |n| n.parse().unwrap());
                while buf.len() < end + 4 + len {
                    let mut more = [0u8; 4096];
                    let n = tcp.read(&mut more).await.unwrap();
                    buf.extend_from_slice(&more[..n]);
                }
                let body = String::from_utf8_lossy(&buf[end + 4..end + 4 + len]).into_owned();
                buf.drain(..end + 4 + len);
                return Some(format!("{head}\n\n{body}"));
            }
            let mut more = [0u8; 4096];
            let n = tcp.read(&mut more).await.unwrap();
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&more[..n]);
        }
    }

    /// Two requests in turn go over one connection, each in origin form with the
    /// `Host` hyper-util would have written; the answer's chunks arrive as the server
    /// writes them, read by the body alone (nothing else polls the connection), and
    /// the connection is idle again once the body has ended.
    #[tokio::test]
    async fn one_connection_serves_requests_in_turn_driven_by_their_bodies() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (heads_tx, mut heads) = tokio::sync::mpsc::unbounded_channel();
        let (go_tx, mut go) = tokio::sync::mpsc::unbounded_channel::<()>();
        let server = tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.unwrap();
            let mut buf = Vec::new();
            while let Some(req) = read_request(&mut tcp, &mut buf).await {
                heads_tx.send(req).unwrap();
                tcp.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
                    .await
                    .unwrap();
                go.recv().await.unwrap();
                tcp.write_all(b"6\r\n world\r\n0\r\n\r\n").await.unwrap();
            }
            // The only connection the pool made.
            assert!(tokio::time::timeout(Duration::from_millis(200), listener.accept()).await.is_err());
        });
        let connector = client();
        let before = idle_here();
        for body in ["one", "two"] {
            let answer = request(connector.clone(), true, post(port, body)).await.unwrap();
            assert_eq!(answer.status(), 200);
            let head = heads.recv().await.unwrap();
            assert!(head.starts_with("POST /v1/chat?x=1 HTTP/1.1\r\n"), "{head}");
            assert!(head.contains(&format!("host: 127.0.0.1:{port}\r\n")), "{head}");
            assert!(head.ends_with(&format!("\n\n{body}")), "{head}");
            let mut body = answer.into_body();
            assert!(body.drives_its_connection());
            let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
            assert_eq!(first, "hello");
            assert_eq!(idle_here(), before, "busy while its body is read");
            go_tx.send(()).unwrap();
            let rest = body.collect().await.unwrap().to_bytes();
            assert_eq!(rest, " world");
            assert_eq!(idle_here(), before + 1, "idle again once the body ended");
        }
        drop(go_tx);
        // The last request's connection is still idle here; closing it ends the server.
        IDLE.with_borrow_mut(VecDeque::clear);
        server.await.unwrap();
    }

    /// A server that closes an idle connection: the next request finds it closed
    /// and goes over a new one, answered.
    #[tokio::test]
    async fn a_connection_the_server_closed_while_idle_is_not_used_again() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let mut accepted = 0;
            for _ in 0..2 {
                let (mut tcp, _) = listener.accept().await.unwrap();
                accepted += 1;
                let mut buf = Vec::new();
                read_request(&mut tcp, &mut buf).await.unwrap();
                tcp.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await
                    .unwrap();
                // Closed while the client keeps it idle.
                drop(tcp);
            }
            accepted
        });
        let connector = client();
        for _ in 0..2 {
            let answer = request(connector.clone(), true, post(port, "x")).await.unwrap();
            let body = answer.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(body, "ok");
            // Let the close reach this side before the next request.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(server.await.unwrap(), 2);
        IDLE.with_borrow_mut(VecDeque::clear);
    }

    /// A body dropped before its end closes its connection: the server sees EOF, and
    /// nothing was put back.
    #[tokio::test]
    async fn a_body_dropped_before_its_end_closes_the_connection() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.unwrap();
            let mut buf = Vec::new();
            read_request(&mut tcp, &mut buf).await.unwrap();
            tcp.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
                .await
                .unwrap();
            read_request(&mut tcp, &mut buf).await
        });
        let connector = client();
        let before = idle_here();
        let answer = request(connector.clone(), true, post(port, "x")).await.unwrap();
        let mut body = answer.into_body();
        assert_eq!(body.frame().await.unwrap().unwrap().into_data().unwrap(), "hello");
        drop(body);
        assert_eq!(server.await.unwrap(), None, "the connection was closed");
        assert_eq!(idle_here(), before);
    }
}
