//! Client connections on the data port: the accept loop (at most
//! [`ClientLimits::max_connections`](super::ClientLimits) open; past it the loop stops
//! accepting and new connections wait in the kernel's accept queue), and the two
//! connection-level timeouts, kept by [`ClientIo`] around each socket:
//!
//! * idle: from the connection's start, or the end of the previous answer, to the
//!   first byte of the next request;
//! * header read: from that first byte to the end of the request's headers.
//!
//! (The body-read timeout is the handler's, see [`super::intake`].) Both close the
//! connection. hyper's own `header_read_timeout` is not used: it runs from the end of
//! the previous answer, so it would cut every keep-alive connection idle for longer
//! than the header timeout.
//!
//! The timer costs nothing per request: a phase's deadline is fixed (one clock read)
//! at the phase's first read that would wait, which is microseconds after the phase
//! began, and never when a request arrives whole; the timer is only polled then, and
//! only moved when it fires before the real deadline (then once per idle period, not
//! per request).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll, ready};

use axum::Router;
use axum::body::Body;
use http::{Request, Response};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::{Front, Refusals};

/// Serves the data router on `listener` until the gateway stops accepting.
pub(crate) async fn serve(listener: tokio::net::TcpListener, app: Router, front: Arc<Front>) {
    let mut stop = front.stop_accepting.notified();
    loop {
        if front.stop_accepting.is_set() {
            break;
        }
        // Taken before accepting: at the cap, connections stay in the accept queue.
        let permit = match front.slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                Refusals::count(&front.refusals.connection_waits);
                tokio::select! {
                    p = front.slots.clone().acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => break,
                    },
                    () = stop.as_mut() => break,
                }
            }
        };
        let tcp = tokio::select! {
            r = listener.accept() => match r {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    accept_error(e).await;
                    continue;
                }
            },
            () = stop.as_mut() => break,
        };
        // Small writes (SSE events, short JSON) go out at once.
        let _ = tcp.set_nodelay(true);
        let (app, front) = (app.clone(), front.clone());
        tokio::spawn(async move {
            connection(tcp, app, front).await;
            drop(permit);
        });
    }
}

async fn accept_error(e: std::io::Error) {
    use std::io::ErrorKind::*;
    if matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    ) {
        return;
    }
    // Out of file descriptors, most likely: wait for some to close (as axum::serve).
    tracing::error!(error = %e, "accept error");
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
}

/// Serves one connection (HTTP/1.1, or HTTP/2 with prior knowledge) to its end. Once
/// the gateway stops accepting, the connection finishes the request it is on and
/// closes.
pub(crate) async fn connection<T>(io: T, app: Router, front: Arc<Front>)
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let shared = Arc::new(Shared::default());
    let io = ClientIo::new(io, shared.clone(), front.clone());
    let service = Service { app, shared };
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    let conn = builder.serve_connection(TokioIo::new(io), service);
    let mut conn = std::pin::pin!(conn);
    let mut shutting = false;
    let served = std::future::poll_fn(|cx| {
        if !shutting && front.stop_accepting.is_set() {
            shutting = true;
            conn.as_mut().graceful_shutdown();
        }
        conn.as_mut().poll(cx)
    })
    .await;
    if let Err(e) = served {
        tracing::debug!(error = %e, "client connection ended");
    }
}

/// What the service tells the socket wrapper: requests in progress, and answers
/// finished (so the wrapper knows when the connection went idle). One connection's
/// pieces all run in its one task, so these are never contended.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    active: AtomicU32,
    finished: AtomicU32,
    /// A read that waited while a request was in progress (so without a deadline):
    /// woken when the request ends, to start the idle deadline.
    reader: futures_util::task::AtomicWaker,
}

/// Held by a request from its head to the end of its answer's body.
struct Active(Arc<Shared>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
        self.0.finished.fetch_add(1, Ordering::Relaxed);
        self.0.reader.wake();
    }
}

#[derive(Clone)]
struct Service {
    app: Router,
    shared: Arc<Shared>,
}

impl hyper::service::Service<Request<Incoming>> for Service {
    type Response = Response<Tracked>;
    type Error = Infallible;
    type Future = Respond;

    fn call(&self, req: Request<Incoming>) -> Respond {
        self.shared.active.fetch_add(1, Ordering::Relaxed);
        let active = Active(self.shared.clone());
        let mut app = self.app.clone();
        Respond {
            inner: tower_service::Service::call(&mut app, req),
            active: Some(active),
        }
    }
}

pin_project_lite::pin_project! {
    struct Respond {
        #[pin]
        inner: axum::routing::future::RouteFuture<Infallible>,
        active: Option<Active>,
    }
}

impl Future for Respond {
    type Output = Result<Response<Tracked>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Ok(response) = ready!(this.inner.poll(cx));
        let active = this.active.take();
        Poll::Ready(Ok(response.map(|body| Tracked {
            body,
            _active: active,
        })))
    }
}

/// An answer's body, holding the request's [`Active`] until hyper drops it.
pub(crate) struct Tracked {
    body: Body,
    _active: Option<Active>,
}

impl hyper::body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    #[inline]
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// No request in progress, no byte of the next one yet.
    Idle,
    /// Bytes of a request came, its headers are not complete.
    Head,
    /// A request is being handled or answered: no connection-level deadline.
    Busy,
}

/// A client socket that closes itself (a read fails with `TimedOut`) when a deadline
/// of its [`Phase`] passes, and reads as closed when idle once the gateway stops
/// accepting.
pub(crate) struct ClientIo<T> {
    io: T,
    shared: Arc<Shared>,
    front: Arc<Front>,
    phase: Phase,
    /// `finished` as last seen.
    seen: u32,
    /// The phase's deadline, fixed by its first read that waits (see the module doc).
    deadline: Option<Instant>,
    /// Made on the first read that waits outside a request; its deadline is never
    /// later than `deadline`'s first value, and moved on when it fires early.
    timer: Option<Pin<Box<Sleep>>>,
    stop: Option<Pin<Box<tokio::sync::futures::OwnedNotified>>>,
    /// HTTP/2 (prior knowledge): no header phase; a stream's headers are one frame.
    h2: bool,
    first_read: bool,
}

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0";

impl<T> ClientIo<T> {
    pub(crate) fn new(io: T, shared: Arc<Shared>, front: Arc<Front>) -> Self {
        Self {
            io,
            shared,
            front,
            phase: Phase::Idle,
            seen: 0,
            deadline: None,
            timer: None,
            stop: None,
            h2: false,
            first_read: true,
        }
    }

    /// Brings the phase up to date with the requests the service has seen.
    #[inline]
    fn update_phase(&mut self) {
        if self.shared.active.load(Ordering::Relaxed) > 0 {
            self.phase = Phase::Busy;
            return;
        }
        let finished = self.shared.finished.load(Ordering::Relaxed);
        if self.phase == Phase::Busy || finished != self.seen {
            self.seen = finished;
            self.phase = Phase::Idle;
            self.deadline = None;
        }
    }

    /// Waits for the phase's deadline (or, when idle, for the stop signal); `Ready`
    /// when the connection must end: `Err` for a timeout, `Ok` to read as closed.
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.phase == Phase::Idle {
            if self.front.stop_accepting.is_set() {
                return Poll::Ready(Ok(()));
            }
            let stop = self
                .stop
                .get_or_insert_with(|| self.front.stop_accepting.notified());
            if stop.as_mut().poll(cx).is_ready() || self.front.stop_accepting.is_set() {
                return Poll::Ready(Ok(()));
            }
        }
        let limits = &self.front.limits;
        let phase_timeout = match self.phase {
            Phase::Head => limits.header_read_timeout,
            _ => limits.idle_timeout,
        };
        let deadline = *self
            .deadline
            .get_or_insert_with(|| Instant::now() + phase_timeout);
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if timer.deadline() > deadline {
            timer.as_mut().reset(deadline);
        }
        while timer.as_mut().poll(cx).is_ready() {
            if Instant::now() >= deadline {
                let counter = match self.phase {
                    Phase::Head => &self.front.refusals.header_timeouts,
                    _ => &self.front.refusals.idle_timeouts,
                };
                Refusals::count(counter);
                let what = match self.phase {
                    Phase::Head => "the request headers took too long",
                    _ => "the connection was idle too long",
                };
                return Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::TimedOut, what)));
            }
            timer.as_mut().reset(deadline);
        }
        Poll::Pending
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ClientIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        this.update_phase();
        if this.phase == Phase::Idle && this.front.stop_accepting.is_set() {
            return Poll::Ready(Ok(())); // reads as closed: hyper ends the connection
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let got = &buf.filled()[before..];
                if !got.is_empty() {
                    if this.first_read {
                        this.first_read = false;
                        this.h2 = got.starts_with(&H2_PREFACE[..got.len().min(H2_PREFACE.len())]);
                    }
                    if this.phase == Phase::Idle && !this.h2 {
                        this.phase = Phase::Head;
                        this.deadline = None;
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending if this.phase == Phase::Busy => {
                this.shared.reader.register(cx.waker());
                // The request may have ended just now, with no one to wake.
                if this.shared.active.load(Ordering::Relaxed) == 0 {
                    cx.waker().wake_by_ref();
                }
                Poll::Pending
            }
            Poll::Pending => this.poll_deadline(cx),
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ClientIo<T> {
    #[inline]
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    #[inline]
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    #[inline]
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    #[inline]
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    #[inline]
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    use super::*;
    use crate::front::ClientLimits;

    fn front() -> Arc<Front> {
        Arc::new(Front::new(ClientLimits::default(), 1))
    }

    /// A connection served in the background; the test holds the client's end.
    fn open(front: &Arc<Front>) -> DuplexStream {
        let app = Router::new().route("/", get(|| async { "ok" })).route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(200)).await;
                "ok"
            }),
        );
        let (client, server) = tokio::io::duplex(1 << 16);
        tokio::spawn(connection(server, app, front.clone()));
        client
    }

    /// Reads one answer whose body is `ok`; returns its head.
    async fn answer(c: &mut DuplexStream) -> String {
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        while !got.ends_with(b"\r\n\r\nok") {
            let n = c.read(&mut buf).await.unwrap();
            assert_ne!(
                n,
                0,
                "closed before the answer: {}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
        }
        String::from_utf8(got).unwrap()
    }

    /// Waits for the server to close the connection; returns how long that took.
    async fn closed(c: &mut DuplexStream) -> Duration {
        let started = Instant::now();
        let mut rest = Vec::new();
        let _ = c.read_to_end(&mut rest).await;
        started.elapsed()
    }

    fn count(c: &std::sync::atomic::AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    #[tokio::test(start_paused = true)]
    async fn headers_sent_too_slowly_close_the_connection() {
        let f = front();
        let mut c = open(&f);
        c.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n").await.unwrap();
        // Drip a header byte now and then: bytes arriving do not extend the deadline.
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            c.write_all(b"x").await.unwrap();
        }
        let took = closed(&mut c).await;
        assert_eq!(took, Duration::from_secs(5), "10 s from the first byte");
        assert_eq!(count(&f.refusals.header_timeouts), 1);
        assert_eq!(count(&f.refusals.idle_timeouts), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_is_closed_after_the_idle_timeout_not_the_header_one() {
        let f = front();
        let mut c = open(&f);
        c.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        answer(&mut c).await;
        // Idle for longer than the header timeout: still served.
        tokio::time::sleep(Duration::from_secs(60)).await;
        c.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        answer(&mut c).await;
        assert_eq!(closed(&mut c).await, Duration::from_secs(90));
        assert_eq!(count(&f.refusals.idle_timeouts), 1);
        assert_eq!(count(&f.refusals.header_timeouts), 0);
        // A connection that never sends a byte is idle too.
        let mut silent = open(&f);
        assert_eq!(closed(&mut silent).await, Duration::from_secs(90));
        assert_eq!(count(&f.refusals.idle_timeouts), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_progress_is_never_cut_by_the_connection_timeouts() {
        let f = front();
        let mut c = open(&f);
        let started = Instant::now();
        c.write_all(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        answer(&mut c).await;
        assert_eq!(started.elapsed(), Duration::from_secs(200));
        assert_eq!(count(&f.refusals.idle_timeouts), 0);
        assert_eq!(count(&f.refusals.header_timeouts), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn when_accepting_stops_idle_connections_close_and_busy_ones_finish_first() {
        let f = front();
        let mut idle = open(&f);
        let mut busy = open(&f);
        busy.write_all(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        f.stop_accepting.set();
        assert_eq!(closed(&mut idle).await, Duration::ZERO);
        let head = answer(&mut busy).await;
        assert!(head.contains("connection: close"), "{head}");
        assert_eq!(closed(&mut busy).await, Duration::ZERO);
        assert_eq!(count(&f.refusals.idle_timeouts), 0);
    }
}
