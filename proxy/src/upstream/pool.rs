//! The serving thread's own plain-HTTP/1 upstream connections (`http://` base URLs:
//! model servers in the cluster, sidecars, local gateways), kept without a lock and
//! read by the request that uses them.
//!
//! Why not hyper-util's pool for these: it runs each connection in a task of its own,
//! so every request, and every chunk of a stream, crossed a channel and a wake-up
//! between the request's task and the connection's; it locks its pool and hashes the
//! pool key on every checkout, and spawns one more task per request to put the
//! connection back once the answer's body is read. Here a connection is a value: the
//! request's future writes the request and reads the answer's head (`h1`), the
//! answer's body reads the rest ([`Incoming`]), and once the body has ended the
//! connection goes back to this thread's idle list. Nothing reads an idle connection:
//! one the server closed meanwhile is found closed when it is next taken (a read that
//! does not wait) and dropped; a request whose write fails on a reused connection is
//! written again on another (the server had closed it; nothing of it was answered).
//! docs/benchmark.md#where-a-requests-cpu-goes has what it saves.
//!
//! `https://` upstreams stay on hyper-util's client (`super`): TLS, and HTTP/2 by ALPN.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::uri::Authority;
use hyper::body::{Frame, SizeHint};
use hyper_util::client::legacy::connect::HttpConnector;
use tokio::time::Instant;
use tower_service::Service as _;

use super::h1::{self, Conn, Reading};
use super::netguard::Resolver;
use super::{Body, Error};

/// An idle connection is closed after this long unused (hyper-util's pool used 90 s).
const IDLE_FOR: Duration = Duration::from_secs(90);

/// Idle connections kept per serving thread, over every host: one for each request
/// in flight at once, for a few hundred at a time per thread. Past it the oldest idle
/// one is closed.
const MAX_IDLE: usize = 512;

/// Which connections may serve a request: the same host and port, made by the same
/// kind of resolver (a connection the private client made is never the public one's).
#[derive(Clone, PartialEq, Eq)]
struct Key {
    private: bool,
    authority: Authority,
}

struct Idle {
    key: Key,
    conn: Conn,
    since: Instant,
}

thread_local! {
    /// This thread's idle connections, oldest first.
    static IDLE: RefCell<VecDeque<Idle>> = const { RefCell::new(VecDeque::new()) };
}

/// Takes this thread's most recently used idle connection to `key` that is still
/// open. Connections idle too long, or found closed, are closed on the way.
fn take(key: &Key) -> Option<Conn> {
    IDLE.with_borrow_mut(|idle| {
        let now = Instant::now();
        while idle.front().is_some_and(|i| now - i.since > IDLE_FOR) {
            idle.pop_front();
        }
        while let Some(at) = idle.iter().rposition(|i| i.key == *key) {
            let conn = idle.remove(at)?.conn;
            if conn.is_open() {
                return Some(conn);
            }
        }
        None
    })
}

/// Puts a connection whose exchange has ended back on this thread's idle list.
fn give_back(key: Key, conn: Conn) {
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

/// Sends a request (an `http://` URL with a host; its `Host` header set by
/// `Client::request`) over one of this thread's connections to its host, or a new
/// one made with `connector`, and reads the answer's head.
pub(super) async fn request(
    connector: HttpConnector<Resolver>,
    private: bool,
    parts: http::request::Parts,
    body: Body,
) -> Result<http::Response<Incoming>, Error> {
    let authority = parts
        .uri
        .authority()
        .cloned()
        .ok_or_else(|| Error::msg("the upstream URL has no host"))?;
    // A request body is whole: its one frame is there at once.
    let body = futures_util::FutureExt::now_or_never(http_body_util::BodyExt::collect(body))
        .and_then(Result::ok)
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    // HTTP/1 to an origin server: the request line carries the path only.
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let head = h1::head(&parts.method, path, &parts.headers, body.len());
    let key = Key { private, authority };
    let mut conn = loop {
        let (mut conn, reused) = match take(&key) {
            Some(conn) => (conn, true),
            None => (connect(&connector, &parts.uri).await?, false),
        };
        match h1::write(&mut conn.io, &head, &body).await {
            Ok(()) => break conn,
            // Closed by the server while idle: try the next one.
            Err(e) if reused => {
                tracing::trace!(error = %e, "a reused upstream connection had closed; writing again");
            }
            Err(e) => return Err(Error::io(e)),
        }
    };
    let head = h1::read_head(&mut conn, &parts.method).await?;
    let reading = Reading::start(head.framing);
    let mut answer = http::Response::new(Incoming(Inner::Plain(Plain {
        conn: Some(conn),
        key,
        reading,
        keep_alive: head.keep_alive,
    })));
    *answer.status_mut() = head.status;
    *answer.version_mut() = head.version;
    *answer.headers_mut() = head.headers;
    Ok(answer)
}

async fn connect(connector: &HttpConnector<Resolver>, uri: &http::Uri) -> Result<Conn, Error> {
    let mut connector = connector.clone();
    std::future::poll_fn(|cx| connector.poll_ready(cx))
        .await
        .map_err(Error::connect)?;
    let io = connector.call(uri.clone()).await.map_err(Error::connect)?;
    Ok(Conn::new(io.into_inner()))
}

/// An answer's body: read from this thread's own connection (`http://`), or handed
/// over by hyper-util's connection task (`https://`). Dropped before its end, a body
/// of this thread's closes its connection (what is left of the answer is not read).
pub struct Incoming(Inner);

enum Inner {
    Tls(hyper::body::Incoming),
    Plain(Plain),
}

struct Plain {
    /// `None` once handed back.
    conn: Option<Conn>,
    key: Key,
    reading: Reading,
    keep_alive: bool,
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Incoming")
            .field("drives_its_connection", &self.drives_its_connection())
            .finish_non_exhaustive()
    }
}

impl Incoming {
    pub(super) fn tls(body: hyper::body::Incoming) -> Self {
        Incoming(Inner::Tls(body))
    }

    /// Whether reading this body reads its connection: what the connection has read
    /// is here without another task having to run first.
    pub fn drives_its_connection(&self) -> bool {
        matches!(self.0, Inner::Plain(_))
    }
}

impl hyper::body::Body for Incoming {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let plain = match &mut self.get_mut().0 {
            Inner::Tls(body) => {
                return Pin::new(body)
                    .poll_frame(cx)
                    .map(|f| f.map(|f| f.map_err(Error::from)));
            }
            Inner::Plain(plain) => plain,
        };
        let Some(conn) = plain.conn.as_mut() else {
            return Poll::Ready(None);
        };
        let next = std::task::ready!(h1::poll_data(conn, &mut plain.reading, cx));
        match &next {
            Some(Ok(_)) => {}
            // The end: the connection takes the next request, unless the answer
            // said otherwise or left bytes it did not account for.
            None => {
                if let Some(conn) = plain.conn.take()
                    && plain.keep_alive
                    && conn.buf.is_empty()
                {
                    give_back(plain.key.clone(), conn);
                }
            }
            Some(Err(_)) => plain.conn = None,
        }
        Poll::Ready(next.map(|r| r.map(Frame::data)))
    }

    fn is_end_stream(&self) -> bool {
        match &self.0 {
            Inner::Tls(body) => body.is_end_stream(),
            Inner::Plain(p) => p.reading == Reading::Done,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            Inner::Tls(body) => body.size_hint(),
            Inner::Plain(p) => match p.reading {
                Reading::Length(n) => SizeHint::with_exact(n),
                Reading::Done => SizeHint::with_exact(0),
                _ => SizeHint::default(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A loopback listener standing in for the upstream, and its port.
    async fn listen() -> (tokio::net::TcpListener, u16) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        (listener, port)
    }

    /// The upstream client a credential allowed private networks uses: `http://`
    /// URLs come here, with the `Host` header it sets.
    fn client() -> super::super::Client {
        super::super::Clients::new(1)
            .unwrap()
            .private
            .here()
            .clone()
    }

    use tokio::net::TcpStream;

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
    /// writes them, read by the body alone, and the connection is idle again once
    /// the body has ended.
    #[tokio::test]
    async fn one_connection_serves_requests_in_turn_read_by_their_bodies() {
        let (listener, port) = listen().await;
        let (heads_tx, mut heads) = tokio::sync::mpsc::unbounded_channel();
        let (go_tx, mut go) = tokio::sync::mpsc::unbounded_channel::<()>();
        let server = tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.unwrap();
            let mut buf = Vec::new();
            while let Some(req) = read_request(&mut tcp, &mut buf).await {
                heads_tx.send(req).unwrap();
                tcp.write_all(
                    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n",
                )
                .await
                .unwrap();
                go.recv().await.unwrap();
                tcp.write_all(b"6\r\n world\r\n0\r\n\r\n").await.unwrap();
            }
            // The only connection the pool made.
            assert!(
                tokio::time::timeout(Duration::from_millis(200), listener.accept())
                    .await
                    .is_err()
            );
        });
        let client = client();
        let before = idle_here();
        for body in ["one", "two"] {
            let answer = client.request(post(port, body)).await.unwrap();
            assert_eq!(answer.status(), 200);
            let head = heads.recv().await.unwrap();
            assert!(head.starts_with("POST /v1/chat?x=1 HTTP/1.1\r\n"), "{head}");
            assert!(
                head.contains(&format!("host: 127.0.0.1:{port}\r\n")),
                "{head}"
            );
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
        let (listener, port) = listen().await;
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
        let client = client();
        for _ in 0..2 {
            let answer = client.request(post(port, "x")).await.unwrap();
            let body = answer.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(body, "ok");
            // Let the close reach this side before the next request.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(server.await.unwrap(), 2);
        IDLE.with_borrow_mut(VecDeque::clear);
    }

    /// A reused connection the server reads the next request from and then closes
    /// unanswered: that request fails and is not written again on another connection
    /// (the server may have acted on it, and a model call is not idempotent). Any
    /// request written again would reach the second connection and be answered.
    #[tokio::test]
    async fn a_request_read_and_left_unanswered_is_not_sent_again() {
        let (listener, port) = listen().await;
        let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
        let server = tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.unwrap();
            let mut buf = Vec::new();
            seen_tx
                .send(read_request(&mut tcp, &mut buf).await.unwrap())
                .unwrap();
            tcp.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .await
                .unwrap();
            seen_tx
                .send(read_request(&mut tcp, &mut buf).await.unwrap())
                .unwrap();
            drop(tcp);
            loop {
                let (mut tcp, _) = listener.accept().await.unwrap();
                let mut buf = Vec::new();
                seen_tx
                    .send(read_request(&mut tcp, &mut buf).await.unwrap())
                    .unwrap();
                tcp.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nresent")
                    .await
                    .unwrap();
            }
        });
        let client = client();
        let answer = client.request(post(port, "first")).await.unwrap();
        assert_eq!(answer.into_body().collect().await.unwrap().to_bytes(), "ok");
        // Closed unanswered (or reset): either way an error, not an answer.
        client.request(post(port, "second")).await.unwrap_err();
        server.abort();
        let _ = server.await;
        let mut bodies = Vec::new();
        while let Ok(req) = seen.try_recv() {
            bodies.push(req.rsplit("\n\n").next().unwrap().to_owned());
        }
        assert_eq!(bodies, ["first", "second"]);
        IDLE.with_borrow_mut(VecDeque::clear);
    }

    /// An answer framed by both `content-length` and chunked transfer coding is read
    /// as chunked, and its connection is closed after it, not kept idle.
    #[tokio::test]
    async fn an_answer_with_both_framings_is_read_chunked_and_its_connection_closed() {
        let (listener, port) = listen().await;
        let server = tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.unwrap();
            let mut buf = Vec::new();
            read_request(&mut tcp, &mut buf).await.unwrap();
            tcp.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n\
                  5\r\nhello\r\n0\r\n\r\n",
            )
            .await
            .unwrap();
            read_request(&mut tcp, &mut buf).await
        });
        let before = idle_here();
        let answer = client().request(post(port, "x")).await.unwrap();
        assert_eq!(
            answer.into_body().collect().await.unwrap().to_bytes(),
            "hello"
        );
        assert_eq!(idle_here(), before, "not kept");
        assert_eq!(server.await.unwrap(), None, "the connection was closed");
    }

    /// An answer whose chunk-size lines, chunk data and trailers arrive cut at odd
    /// places is read whole, data handed over as it arrives; the connection then
    /// serves the next request, whose answer ends with the connection (no length).
    #[tokio::test]
    async fn chunks_cut_anywhere_and_trailers_are_read_and_the_connection_reused() {
        let (listener, port) = listen().await;
        let server = tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.unwrap();
            let mut buf = Vec::new();
            read_request(&mut tcp, &mut buf).await.unwrap();
            let pieces: [&[u8]; 7] = [
                b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ntransfer-",
                b"encoding: chunked\r\n\r\n1",
                b"0;ext=1\r\n0123456789",
                b"abcdef\r",
                b"\n3\r\nxyz\r\n0\r\n",
                b"x-trailer: y\r\n",
                b"\r\n",
            ];
            for p in pieces {
                tcp.write_all(p).await.unwrap();
                tcp.flush().await.unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            read_request(&mut tcp, &mut buf).await.unwrap();
            tcp.write_all(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nto the end")
                .await
                .unwrap();
        });
        let client = client();
        let before = idle_here();
        let answer = client.request(post(port, "x")).await.unwrap();
        assert_eq!(answer.status(), 200);
        let body = answer.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "0123456789abcdefxyz");
        assert_eq!(idle_here(), before + 1);
        let answer = client.request(post(port, "y")).await.unwrap();
        assert_eq!(idle_here(), before, "taken again");
        let body = answer.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "to the end");
        assert_eq!(idle_here(), before, "ended by the close: not kept");
        server.await.unwrap();
    }

    /// A hostile answer head (too many fields, or too long) fails the request and
    /// leaves nothing idle.
    #[tokio::test]
    async fn an_answer_head_past_its_bounds_fails_the_request() {
        for huge in [false, true] {
            let (listener, port) = listen().await;
            let server = tokio::spawn(async move {
                let (mut tcp, _) = listener.accept().await.unwrap();
                let mut buf = Vec::new();
                read_request(&mut tcp, &mut buf).await.unwrap();
                let _ = tcp.write_all(b"HTTP/1.1 200 OK\r\n").await;
                let line = if huge {
                    format!("x-big: {}\r\n", "y".repeat(8 * 1024))
                } else {
                    "x-a: b\r\n".to_owned()
                };
                for _ in 0..(h1::MAX_HEADERS + 1).max(h1::MAX_HEAD / line.len() + 1) {
                    if tcp.write_all(line.as_bytes()).await.is_err() {
                        break;
                    }
                }
            });
            let before = idle_here();
            let err = client().request(post(port, "x")).await.unwrap_err();
            let text = err.to_string();
            let want = if huge {
                "too large"
            } else {
                "too many header fields"
            };
            assert!(text.contains(want), "{text}");
            assert_eq!(idle_here(), before);
            server.await.unwrap();
        }
    }

    /// A body dropped before its end closes its connection: the server sees EOF, and
    /// nothing was put back.
    #[tokio::test]
    async fn a_body_dropped_before_its_end_closes_the_connection() {
        let (listener, port) = listen().await;
        let server = tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.unwrap();
            let mut buf = Vec::new();
            read_request(&mut tcp, &mut buf).await.unwrap();
            tcp.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
                .await
                .unwrap();
            read_request(&mut tcp, &mut buf).await
        });
        let client = client();
        let before = idle_here();
        let answer = client.request(post(port, "x")).await.unwrap();
        let mut body = answer.into_body();
        assert_eq!(
            body.frame().await.unwrap().unwrap().into_data().unwrap(),
            "hello"
        );
        drop(body);
        assert_eq!(server.await.unwrap(), None, "the connection was closed");
        assert_eq!(idle_here(), before);
    }
}
