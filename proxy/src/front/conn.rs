//! Client connections: the data port's accept loop (at most
//! [`ClientLimits::max_connections`](super::ClientLimits) open; past it the loop stops
//! accepting and new connections wait in the kernel's accept queue), the admin port's
//! ([`serve_admin`]: past its cap the connection quiet the longest is closed to make
//! room, so a probe always gets in), the head size limit (hyper's read buffer is
//! capped at `max_header_bytes`: a longer head is answered 431 and the connection
//! closed), and the connection-level timeouts, kept by [`ClientIo`] around each
//! socket:
//!
//! * idle: from the connection's start, or the end of the previous answer, to the
//!   first byte of the next request;
//! * header read: from that first byte to the end of the request's headers, and the
//!   bytes of a head that did not arrive in one read held in the replica's
//!   `max_inflight_header_bytes` budget until it is complete (one that does not fit
//!   closes the connection: slow heads cannot hold more memory than that, however
//!   many connections there are; a head that arrives whole costs nothing);
//! * client write: an answer's bytes the socket has not taken for that long (the
//!   client stopped reading). The connection fails, hyper drops the answer's body,
//!   and with it what the request held (answer bytes in the in-flight budget, the
//!   client's concurrency slot).
//!
//! (The body-read timeout is the handler's, see [`super::intake`].) All close the
//! connection. hyper's own `header_read_timeout` is not used: it runs from the end of
//! the previous answer, so it would cut every keep-alive connection idle for longer
//! than the header timeout.
//!
//! The timer costs nothing per request: a phase's deadline is fixed (one clock read)
//! at the phase's first read that would wait, which is microseconds after the phase
//! began, and never when a request arrives whole; the timer is only polled then, and
//! only moved when it fires before the real deadline (then once per idle period, not
//! per request). The write timer likewise: made and polled only when a write waits.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll, ready};

use axum::Router;
use axum::body::Body;
use http::{Request, Response};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::{Front, Refusals};
use crate::gateway::Gateway;

/// Serves the data router on `listener` until the gateway stops accepting; with
/// `direct`, the data port's own endpoints skip the router ([`crate::http::direct`]).
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    direct: Option<Arc<Gateway>>,
    front: Arc<Front>,
) {
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
        let (app, direct, front) = (app.clone(), direct.clone(), front.clone());
        tokio::spawn(async move {
            serve_connection(tcp, App { app, direct }, front, Arc::default()).await;
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
#[cfg(test)]
pub(crate) async fn connection<T>(io: T, app: Router, front: Arc<Front>)
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let app = App { app, direct: None };
    serve_connection(io, app, front, Arc::default()).await;
}

/// A port's router, and for the data port the gateway its endpoints are served from
/// without the router.
struct App {
    app: Router,
    direct: Option<Arc<Gateway>>,
}

/// [`connection`], with its [`Shared`] made by the caller (the admin port lists it in
/// its roster as it accepts it).
async fn serve_connection<T>(io: T, app: App, front: Arc<Front>, shared: Arc<Shared>)
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = ClientIo::new(io, shared.clone(), front.clone());
    let App { app, direct } = app;
    let service = Service {
        app,
        direct,
        shared,
    };
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    // The head is read into hyper's buffer, which never grows past this: a longer
    // one is answered 431 and the connection closed.
    let head = front.limits.max_header_bytes.max(MIN_HEADER_BYTES);
    builder.http1().max_buf_size(head);
    builder
        .http2()
        .max_header_list_size(u32::try_from(head).unwrap_or(u32::MAX));
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
        if e.downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_parse_too_large)
        {
            Refusals::count(&front.refusals.header_too_large);
        }
        tracing::debug!(error = %e, "client connection ended");
    }
}

/// hyper's smallest read buffer: `--max-header-bytes` may not be lower.
pub const MIN_HEADER_BYTES: usize = 8 << 10;

/// How long a connection let in past the admin cap waits for the one closed to make
/// room for it (microseconds, normally); past it, it is closed too.
const ROOM_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Serves the admin router on `listener` for the rest of the process's life. At the
/// cap (`front.limits.max_connections`) the connection quiet the longest (no request
/// in progress: idle, or still sending its head) is closed to make room, and the new
/// one takes its slot; the accept loop waits for that (microseconds) before it accepts
/// another, so a flood cannot take the room it makes. When none is quiet (every one
/// is busy) the new one waits up to a second for a slot, then is closed. Each
/// connection closed so (the quiet one, or the new one) is counted.
pub(crate) async fn serve_admin(listener: tokio::net::TcpListener, app: Router, front: Arc<Front>) {
    let Some(roster) = front.roster.as_ref() else {
        return tracing::error!("the admin port needs a roster");
    };
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                accept_error(e).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let permit = match front.slots.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                Refusals::count(&front.refusals.evictions);
                roster.evict_quietest();
                let slot = tokio::time::timeout(ROOM_WAIT, front.slots.clone().acquire_owned());
                match slot.await {
                    Ok(Ok(permit)) => permit,
                    // Every connection stayed busy: this one is closed (counted above).
                    _ => continue,
                }
            }
        };
        let (app, front) = (app.clone(), front.clone());
        let (shared, listed) = roster.list(&front);
        tokio::spawn(async move {
            serve_connection(tcp, App { app, direct: None }, front, shared).await;
            drop((listed, permit));
        });
    }
}

/// The open connections of a port that makes room at its cap (the admin port).
#[derive(Debug, Default)]
pub(crate) struct Roster {
    open: std::sync::Mutex<Vec<Arc<Shared>>>,
    epoch: std::sync::OnceLock<Instant>,
}

/// A connection's place in its port's [`Roster`], given up when dropped.
pub(crate) struct Listed {
    front: Arc<Front>,
    shared: Arc<Shared>,
}

impl Drop for Listed {
    fn drop(&mut self) {
        if let Some(roster) = &self.front.roster {
            let mut open = roster.open.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = open.iter().position(|s| Arc::ptr_eq(s, &self.shared)) {
                open.swap_remove(i);
            }
        }
    }
}

impl Roster {
    /// Milliseconds since the roster's first use (never 0: 0 is "not yet quiet").
    fn now_ms(&self) -> u64 {
        let epoch = *self.epoch.get_or_init(Instant::now);
        epoch.elapsed().as_millis() as u64 + 1
    }

    /// A new connection of `front`'s port, listed (quiet since now).
    fn list(&self, front: &Arc<Front>) -> (Arc<Shared>, Listed) {
        let shared = Arc::new(Shared::default());
        shared.quiet_since.store(self.now_ms(), Ordering::Relaxed);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.push(shared.clone());
        let listed = Listed {
            front: front.clone(),
            shared: shared.clone(),
        };
        (shared, listed)
    }

    /// Closes the connection with no request in progress that has been so the
    /// longest; false when every connection is busy.
    pub(crate) fn evict_quietest(&self) -> bool {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let quietest = open
            .iter()
            .filter(|s| s.active.load(Ordering::Relaxed) == 0 && !s.evicted.load(Ordering::Relaxed))
            .min_by_key(|s| s.quiet_since.load(Ordering::Relaxed));
        match quietest {
            Some(s) => {
                s.evicted.store(true, Ordering::Relaxed);
                s.reader.wake();
                true
            }
            None => false,
        }
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
    /// woken when the request ends, to start the idle deadline. On the admin port,
    /// any read that waits: woken to close the connection when it is evicted.
    reader: futures_util::task::AtomicWaker,
    /// Admin port: when the connection last had no request in progress ([`Roster`]
    /// milliseconds), and whether it was chosen to make room at the cap.
    quiet_since: AtomicU64,
    evicted: AtomicBool,
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
    direct: Option<Arc<Gateway>>,
    shared: Arc<Shared>,
}

impl hyper::service::Service<Request<Incoming>> for Service {
    type Response = Response<Tracked>;
    type Error = Infallible;
    type Future = Respond;

    fn call(&self, req: Request<Incoming>) -> Respond {
        self.shared.active.fetch_add(1, Ordering::Relaxed);
        let active = Some(Active(self.shared.clone()));
        if let Some(gw) = &self.direct
            && let Some(surface) = crate::http::direct_surface(&req)
        {
            return Respond {
                inner: Answer::Direct {
                    answer: crate::http::direct(gw, surface, req),
                },
                active,
            };
        }
        let mut app = self.app.clone();
        Respond {
            inner: Answer::Routed {
                routed: tower_service::Service::call(&mut app, req),
            },
            active,
        }
    }
}

pin_project_lite::pin_project! {
    struct Respond {
        #[pin]
        inner: Answer,
        active: Option<Active>,
    }
}

pin_project_lite::pin_project! {
    /// The answer being made: by the router, or by the data port's endpoint directly
    /// (the router's matching, extractors and layers cost ~3k instructions a request:
    /// docs/benchmark.md#where-a-requests-cpu-goes).
    #[project = AnswerProj]
    enum Answer {
        Routed { #[pin] routed: axum::routing::future::RouteFuture<Infallible> },
        Direct { answer: crate::http::DirectAnswer },
    }
}

impl Future for Answer {
    type Output = Response<Body>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Response<Body>> {
        match self.project() {
            AnswerProj::Routed { routed } => routed.poll(cx).map(|Ok(r)| r),
            AnswerProj::Direct { answer } => answer.as_mut().poll(cx),
        }
    }
}

impl Future for Respond {
    type Output = Result<Response<Tracked>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = ready!(this.inner.poll(cx));
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
    /// A write waits: when the client must have taken a byte by (the client-write
    /// timeout from the first write that waited since the last progress), and its
    /// timer, made on the first write that ever waits.
    write_deadline: Option<Instant>,
    write_timer: Option<Pin<Box<Sleep>>>,
    /// Bytes read of the head in progress, and their reservation in the replica's
    /// head budget, made when the head first waits for more bytes.
    head_len: usize,
    head_held: Option<crate::limits::bytes::Held<Arc<crate::limits::bytes::Budget>>>,
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
            write_deadline: None,
            write_timer: None,
            head_len: 0,
            head_held: None,
        }
    }

    /// Brings the phase up to date with the requests the service has seen.
    #[inline]
    fn update_phase(&mut self) {
        if self.shared.active.load(Ordering::Relaxed) > 0 {
            self.phase = Phase::Busy;
            self.head_held = None; // the head is complete: given back
            return;
        }
        let finished = self.shared.finished.load(Ordering::Relaxed);
        if self.phase == Phase::Busy || finished != self.seen {
            self.seen = finished;
            self.phase = Phase::Idle;
            self.deadline = None;
            self.head_held = None;
            if let Some(roster) = &self.front.roster {
                self.shared
                    .quiet_since
                    .store(roster.now_ms(), Ordering::Relaxed);
            }
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
        if this.phase != Phase::Busy && this.shared.evicted.load(Ordering::Relaxed) {
            return Poll::Ready(Ok(())); // made room for a new admin connection
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
                        this.head_len = got.len();
                    } else if this.phase == Phase::Head {
                        this.head_len += got.len();
                        if !this.head_fits() {
                            return Poll::Ready(Err(this.heads_full()));
                        }
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
            Poll::Pending => {
                if this.front.roster.is_some() {
                    this.shared.reader.register(cx.waker());
                    if this.shared.evicted.load(Ordering::Relaxed) {
                        return Poll::Ready(Ok(()));
                    }
                }
                // A head that waits for more bytes holds what it has in the budget.
                if this.phase == Phase::Head {
                    let heads = &this.front.heads;
                    this.head_held
                        .get_or_insert_with(|| crate::limits::bytes::Held::new(heads.clone()));
                    if !this.head_fits() {
                        return Poll::Ready(Err(this.heads_full()));
                    }
                }
                this.poll_deadline(cx)
            }
        }
    }
}

impl<T> ClientIo<T> {
    /// The head read so far fits in its reservation (grown to it), or nothing is
    /// reserved yet (the head has not waited).
    #[inline]
    fn head_fits(&mut self) -> bool {
        let len = self.head_len;
        self.head_held.as_mut().is_none_or(|h| h.grow_to(len))
    }

    /// The head budget is spent: the connection is closed (counted).
    fn heads_full(&mut self) -> std::io::Error {
        self.head_held = None;
        Refusals::count(&self.front.refusals.heads_over_budget);
        std::io::Error::other(
            "the replica holds as many unfinished request heads as it may \
             (--max-inflight-header-bytes)",
        )
    }
}

impl<T> ClientIo<T> {
    /// After a write (or flush) that made progress: the client is reading.
    #[inline]
    fn wrote(&mut self) {
        if self.write_deadline.is_some() {
            self.write_deadline = None;
        }
    }

    /// A write that waits: `Ready(Err)` once the client has taken nothing for the
    /// client-write timeout.
    fn poll_write_deadline(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Error> {
        let timeout = self.front.limits.client_write_timeout;
        let deadline = *self
            .write_deadline
            .get_or_insert_with(|| Instant::now() + timeout);
        let timer = self
            .write_timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if timer.deadline() != deadline {
            timer.as_mut().reset(deadline);
        }
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        Refusals::count(&self.front.refusals.write_timeouts);
        Poll::Ready(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the client did not read its answer",
        ))
    }

    /// A write's result, its wait bounded by the client-write timeout.
    #[inline]
    fn bounded<R>(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<std::io::Result<R>>,
    ) -> Poll<std::io::Result<R>> {
        match r {
            Poll::Pending => self.poll_write_deadline(cx).map(Err),
            Poll::Ready(r) => {
                self.wrote();
                Poll::Ready(r)
            }
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
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        self.bounded(cx, r)
    }

    #[inline]
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.bounded(cx, r)
    }

    #[inline]
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    #[inline]
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_flush(cx);
        self.bounded(cx, r)
    }

    #[inline]
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_shutdown(cx);
        self.bounded(cx, r)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::routing::get;
    use futures_util::StreamExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    use super::*;
    use crate::front::ClientLimits;

    fn front() -> Arc<Front> {
        Arc::new(Front::new(ClientLimits::default(), 1))
    }

    /// Dropped with the answer body that holds it: says when the body is let go.
    struct Dropped(Arc<std::sync::atomic::AtomicBool>);

    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }

    /// `/`: `ok`; `/slow`: `ok` after 200 s; `/big`: 1 MiB, then a body that never
    /// ends, holding `released`'s guard (as an answer holds its budget bytes) until
    /// the connection lets it go.
    fn app(released: Arc<std::sync::atomic::AtomicBool>) -> Router {
        Router::new()
            .route("/", get(|| async { "ok" }))
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(200)).await;
                    "ok"
                }),
            )
            .route(
                "/big",
                get(move || {
                    let released = released.clone();
                    async move {
                        let chunks = (0..16).map(|_| {
                            Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b'x'; 64 << 10]))
                        });
                        let chunks: Vec<_> = chunks.collect();
                        let guard = Dropped(released.clone());
                        let endless = futures_util::stream::pending().map(move |b| {
                            let _held = &guard;
                            b
                        });
                        Body::from_stream(futures_util::stream::iter(chunks).chain(endless))
                    }
                }),
            )
    }

    /// A connection served in the background; the test holds the client's end.
    fn open(front: &Arc<Front>) -> DuplexStream {
        open_with(front, Arc::default())
    }

    fn open_with(front: &Arc<Front>, released: Arc<std::sync::atomic::AtomicBool>) -> DuplexStream {
        let (client, server) = tokio::io::duplex(1 << 16);
        tokio::spawn(connection(server, app(released), front.clone()));
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

    /// A connection that asked for `/big`; the flag its answer sets when let go.
    async fn big(f: &Arc<Front>) -> (DuplexStream, Arc<std::sync::atomic::AtomicBool>) {
        let released = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut c = open_with(f, released.clone());
        c.write_all(b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        (c, released)
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_reading_is_disconnected_and_its_answer_let_go() {
        let f = front();
        let (mut c, released) = big(&f).await;
        // The client reads nothing: the answer fills the pipe and waits.
        tokio::time::sleep(Duration::from_secs(59)).await;
        assert_eq!(count(&f.refusals.write_timeouts), 0);
        assert!(
            !released.load(Ordering::Relaxed),
            "held while within the timeout"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(count(&f.refusals.write_timeouts), 1);
        assert!(released.load(Ordering::Relaxed), "the answer was let go");
        let mut rest = Vec::new();
        let _ = c.read_to_end(&mut rest).await;
        assert!(rest.len() < 1 << 20, "cut short: {}", rest.len());
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_reads_slowly_is_not_disconnected() {
        let f = front();
        let (mut c, released) = big(&f).await;
        // 64 KiB every 50 s: never 60 s without taking a byte, 17 minutes in all.
        let mut got = 0usize;
        let mut buf = vec![0u8; 64 << 10];
        while got < 1 << 20 {
            tokio::time::sleep(Duration::from_secs(50)).await;
            match c.read(&mut buf).await.unwrap() {
                0 => break,
                n => got += n,
            }
        }
        assert!(got >= 1 << 20, "{got}");
        assert_eq!(count(&f.refusals.write_timeouts), 0);
        // Then waiting for the rest of an answer is no write that waits: still open.
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert_eq!(count(&f.refusals.write_timeouts), 0);
        assert!(!released.load(Ordering::Relaxed));
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_over_max_header_bytes_gets_431_and_the_connection_closes() {
        let f = front();
        let mut c = open(&f);
        let big = format!(
            "GET / HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
            "a".repeat(100 << 10)
        );
        let _ = c.write_all(big.as_bytes()).await;
        let mut refused = Vec::new();
        let _ = c.read_to_end(&mut refused).await;
        let text = String::from_utf8_lossy(&refused);
        assert!(text.starts_with("HTTP/1.1 431"), "{text}");
        assert_eq!(count(&f.refusals.header_too_large), 1);
        // Just under the limit is served.
        let mut c = open(&f);
        let fits = format!(
            "GET / HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
            "a".repeat(60 << 10)
        );
        c.write_all(fits.as_bytes()).await.unwrap();
        assert!(answer(&mut c).await.starts_with("HTTP/1.1 200"));
    }

    #[tokio::test(start_paused = true)]
    async fn unfinished_heads_hold_their_bytes_and_one_that_does_not_fit_is_closed() {
        let f = Arc::new(Front::new(
            ClientLimits {
                max_inflight_header_bytes: 10 << 10,
                ..ClientLimits::default()
            },
            1,
        ));
        let part = format!(
            "GET / HTTP/1.1\r\nhost: x\r\nx-pad: {}",
            "a".repeat(6 << 10)
        );
        let mut first = open(&f);
        first.write_all(part.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            f.header_bytes_held() >= 6 << 10,
            "{}",
            f.header_bytes_held()
        );
        // A second unfinished head of 6 KiB does not fit beside it: closed.
        let mut second = open(&f);
        second.write_all(part.as_bytes()).await.unwrap();
        assert_eq!(closed(&mut second).await, Duration::ZERO);
        assert_eq!(count(&f.refusals.heads_over_budget), 1);
        // The first one finishes its head: answered, and its bytes given back.
        first.write_all(b"\r\n\r\n").await.unwrap();
        answer(&mut first).await;
        assert_eq!(f.header_bytes_held(), 0);
        // A head that arrives whole never waits, so it never counts.
        let mut whole = open(&f);
        whole
            .write_all(format!("{part}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        answer(&mut whole).await;
        assert_eq!(count(&f.refusals.heads_over_budget), 1);
    }

    /// The admin port on loopback with a cap of 2, on the real clock.
    async fn admin_port() -> (Arc<Front>, std::net::SocketAddr) {
        let f = Arc::new(Front::admin(&ClientLimits {
            admin_max_connections: 2,
            ..ClientLimits::default()
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve_admin(listener, app(Arc::default()), f.clone()));
        (f, addr)
    }

    async fn fetch(tcp: &mut tokio::net::TcpStream, path: &str) -> String {
        tcp.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        while !got.ends_with(b"ok") {
            match tcp.read(&mut buf).await.unwrap() {
                0 => break,
                n => got.extend_from_slice(&buf[..n]),
            }
        }
        String::from_utf8_lossy(&got).into_owned()
    }

    #[tokio::test]
    async fn at_the_admin_cap_the_quietest_connection_makes_room() {
        let (f, addr) = admin_port().await;
        let connect = || tokio::net::TcpStream::connect(addr);
        let mut oldest = connect().await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut used = connect().await.unwrap();
        assert!(fetch(&mut used, "/").await.starts_with("HTTP/1.1 200"));
        // A third: the oldest quiet one is closed for it, the others served.
        let mut third = connect().await.unwrap();
        assert!(fetch(&mut third, "/").await.starts_with("HTTP/1.1 200"));
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(5), oldest.read_to_end(&mut rest));
        assert!(closed.await.is_ok() && rest.is_empty());
        assert_eq!(count(&f.refusals.evictions), 1);
        assert!(fetch(&mut third, "/").await.starts_with("HTTP/1.1 200"));
        assert_eq!(f.open_connections(), 2);
    }

    #[tokio::test]
    async fn at_the_admin_cap_with_every_connection_busy_the_new_one_is_closed() {
        let (f, addr) = admin_port().await;
        let mut busy = Vec::new();
        for _ in 0..2 {
            let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            tcp.write_all(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n")
                .await
                .unwrap();
            busy.push(tcp);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut late = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(5), late.read_to_end(&mut rest));
        assert!(closed.await.is_ok(), "closed after the room wait");
        assert!(rest.is_empty());
        assert_eq!(count(&f.refusals.evictions), 1);
        assert_eq!(f.open_connections(), 2, "the busy ones are untouched");
    }
}
