//! Shutdown (SIGTERM/SIGINT, docs/limits.md#shutdown): the order of the drain, and the wrapper that
//! ends a committed stream with the error event once the grace is over.
//!
//! 1. `/readyz` answers 503 at once (endpoints stop sending new clients);
//! 2. after the drain delay the listeners stop accepting; idle connections close,
//!    busy ones close after the answer they are on (HTTP/1.1 `connection: close`,
//!    HTTP/2 GOAWAY);
//! 3. when every connection has closed, or the grace is over, open streams are ended
//!    with the error event, and what is left gets a moment to be written out.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use hyper::body::{Frame, SizeHint};

use super::Front;
use crate::wire::surface::Surface;

/// How long the streams ended at the grace have to get their error event out.
const FINAL_WRITE: Duration = Duration::from_secs(2);

/// What the message of the error event that ends a stream at shutdown says.
pub const SHUTDOWN_MESSAGE: &str = "the gateway replica is shutting down; retry the request";

/// Runs the drain; returns when the process may exit.
pub async fn drain(front: &Front, delay: Duration, grace: Duration) {
    front.draining.store(true, Ordering::Release);
    tracing::info!(
        drain_delay_ms = delay.as_millis() as u64,
        shutdown_grace_ms = grace.as_millis() as u64,
        "shutting down: not ready any more; still accepting until the drain delay is over"
    );
    tokio::time::sleep(delay).await;
    front.stop_accepting.set();
    tracing::info!(
        open_connections = front.open_connections(),
        "stopped accepting; waiting for requests in flight"
    );
    if !all_closed(front, grace).await {
        tracing::info!(
            open_connections = front.open_connections(),
            "shutdown grace over: ending open streams"
        );
        front.end_streams.set();
        let _ = all_closed(front, FINAL_WRITE).await;
    }
    tracing::info!(
        open_connections = front.open_connections(),
        "drained; exiting"
    );
}

/// True when every client connection closed within `within`.
async fn all_closed(front: &Front, within: Duration) -> bool {
    let all = u32::try_from(front.slots_total()).unwrap_or(u32::MAX);
    matches!(
        tokio::time::timeout(within, front.slots.acquire_many(all)).await,
        Ok(Ok(_))
    )
}

/// `body` (a committed stream of `surface`), ended with that API's error event when
/// the shutdown grace is over.
pub fn until_shutdown(front: Arc<Front>, surface: Surface, body: Body) -> Body {
    Body::new(EndAtShutdown {
        inner: Some(body),
        front,
        surface,
        waiting: None,
    })
}

struct EndAtShutdown {
    /// `None` once ended.
    inner: Option<Body>,
    front: Arc<Front>,
    surface: Surface,
    /// Registered at the first wait, with the waker it was last polled with.
    waiting: Option<(Pin<Box<tokio::sync::futures::OwnedNotified>>, Waker)>,
}

impl EndAtShutdown {
    fn end(&mut self) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        // Dropping the upstream body here is what stops the upstream stream.
        self.inner = None;
        Poll::Ready(Some(Ok(Frame::data(crate::wire::sse::failure_event_for(
            self.surface,
            SHUTDOWN_MESSAGE,
        )))))
    }
}

impl hyper::body::Body for EndAtShutdown {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        if this.front.end_streams.is_set() {
            return this.end();
        }
        match Pin::new(inner).poll_frame(cx) {
            Poll::Pending => {
                // Registered only once the stream waits, so a stream that never
                // waits never takes the lane's lock; and polled again only when the
                // task's waker changed: polling a registered `Notified` locks its
                // list each time (~5k instructions per stream of 20 events), while
                // the waker it holds already wakes this task.
                let front = &this.front;
                let fresh = match &this.waiting {
                    Some((_, registered)) => !registered.will_wake(cx.waker()),
                    None => true,
                };
                if fresh {
                    let (notified, registered) = this
                        .waiting
                        .get_or_insert_with(|| (front.end_streams.notified(), cx.waker().clone()));
                    if !registered.will_wake(cx.waker()) {
                        *registered = cx.waker().clone();
                    }
                    if notified.as_mut().poll(cx).is_ready() {
                        return this.end();
                    }
                }
                if front.end_streams.is_set() {
                    return this.end();
                }
                Poll::Pending
            }
            done => done,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::routing::get;
    use futures_util::StreamExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
    use tokio::time::Instant;

    use super::*;
    use crate::front::{ClientLimits, conn};

    const DELAY: Duration = Duration::from_secs(5);
    const GRACE: Duration = Duration::from_secs(30);

    /// `/slow`: a unary answer after 10 s; `/stream`: one event, then nothing, ended
    /// only by the shutdown.
    fn app(front: &Arc<Front>) -> Router {
        let f = front.clone();
        Router::new()
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    "ok"
                }),
            )
            .route(
                "/stream",
                get(move || {
                    let front = f.clone();
                    async move {
                        let events = futures_util::stream::iter([Ok::<_, std::io::Error>(
                            Bytes::from_static(b"data: {\"n\":1}\n\n"),
                        )])
                        .chain(futures_util::stream::pending());
                        until_shutdown(front, Surface::ChatCompletions, Body::from_stream(events))
                    }
                }),
            )
    }

    /// A client connection holding a slot, as the accept loop gives it one.
    fn open(front: &Arc<Front>) -> DuplexStream {
        let permit = front.slots.clone().try_acquire_owned().unwrap();
        let (client, server) = tokio::io::duplex(1 << 16);
        let (app, front) = (app(front), front.clone());
        tokio::spawn(async move {
            conn::connection(server, app, front).await;
            drop(permit);
        });
        client
    }

    async fn request(c: &mut DuplexStream, path: &str) {
        c.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
    }

    /// Everything the server sends until it closes the connection.
    async fn rest(c: &mut DuplexStream) -> String {
        let mut out = Vec::new();
        let _ = c.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test(start_paused = true)]
    async fn not_ready_at_once_accepting_until_the_delay_then_streams_end_after_the_grace() {
        let front = Arc::new(Front::new(ClientLimits::default(), 1));
        let mut unary = open(&front);
        let mut stream = open(&front);
        let mut idle = open(&front);
        request(&mut unary, "/slow").await;
        request(&mut stream, "/stream").await;
        let mut first = [0u8; 512];
        let n = stream.read(&mut first).await.unwrap();
        assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));

        let started = Instant::now();
        let drained = tokio::spawn({
            let front = front.clone();
            async move {
                drain(&front, DELAY, GRACE).await;
                started.elapsed()
            }
        });
        tokio::task::yield_now().await;
        assert!(front.is_draining(), "/readyz answers 503 at once");
        assert!(!front.stop_accepting.is_set(), "still accepting");

        // The idle connection is closed when accepting stops, not before.
        assert_eq!(rest(&mut idle).await, "");
        assert_eq!(started.elapsed(), DELAY);
        assert!(front.stop_accepting.is_set());
        assert!(!front.end_streams.is_set());

        // The unary call in flight finishes (10 s), told the connection closes.
        let answer = rest(&mut unary).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.contains("connection: close"), "{answer}");
        assert!(answer.ends_with("ok"), "{answer}");

        // The stream is left alone for the grace, then ended with the error event.
        let tail = rest(&mut stream).await;
        assert_eq!(started.elapsed(), DELAY + GRACE);
        assert!(tail.contains(SHUTDOWN_MESSAGE), "{tail}");
        assert!(tail.contains("stream_interrupted"), "{tail}");
        assert!(
            tail.ends_with("0\r\n\r\n"),
            "the body ends cleanly: {tail:?}"
        );
        assert_eq!(drained.await.unwrap(), DELAY + GRACE);
        assert_eq!(front.open_connections(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_drain_ends_as_soon_as_the_last_request_is_answered() {
        let front = Arc::new(Front::new(ClientLimits::default(), 1));
        let mut unary = open(&front);
        request(&mut unary, "/slow").await;
        tokio::task::yield_now().await;
        let started = Instant::now();
        drain(&front, DELAY, GRACE).await;
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        assert!(!front.end_streams.is_set(), "nothing needed ending");
        assert!(rest(&mut unary).await.ends_with("ok"));

        // With nothing open it ends right after the delay.
        let front = Arc::new(Front::new(ClientLimits::default(), 1));
        let started = Instant::now();
        drain(&front, DELAY, GRACE).await;
        assert_eq!(started.elapsed(), DELAY);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_committed_after_the_grace_ends_at_once_in_its_wire() {
        let front = Arc::new(Front::default());
        front.end_streams.set();
        let body = until_shutdown(
            front,
            Surface::Messages,
            Body::from_stream(futures_util::stream::pending::<Result<Bytes, std::io::Error>>()),
        );
        let all = axum::body::to_bytes(body, usize::MAX).await.unwrap();
        let text = String::from_utf8_lossy(&all);
        assert!(text.starts_with("event: error\n"), "{text}");
        assert!(text.contains(SHUTDOWN_MESSAGE), "{text}");
    }

    /// A stream that waits between events many times: its `Notified` is polled once
    /// (the waker does not change), and the signal still wakes it mid-wait.
    #[tokio::test(start_paused = true)]
    async fn a_stream_that_waits_between_events_is_still_woken_by_the_grace() {
        let front = Arc::new(Front::default());
        let events = futures_util::stream::unfold(0u32, |n| async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let ev = Bytes::from(format!("data: {{\"n\":{n}}}\n\n"));
            Some((Ok::<_, std::io::Error>(ev), n + 1))
        });
        let body = until_shutdown(
            front.clone(),
            Surface::ChatCompletions,
            Body::from_stream(events),
        );
        let started = Instant::now();
        let ender = tokio::spawn({
            let front = front.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(5500)).await;
                front.end_streams.set();
            }
        });
        let all = axum::body::to_bytes(body, usize::MAX).await.unwrap();
        ender.await.unwrap();
        let text = String::from_utf8_lossy(&all);
        assert_eq!(started.elapsed(), Duration::from_millis(5500));
        assert_eq!(text.matches("data: {\"n\"").count(), 5, "{text}");
        assert!(
            text.ends_with(&*String::from_utf8_lossy(
                &crate::wire::sse::failure_event_for(Surface::ChatCompletions, SHUTDOWN_MESSAGE)
            )),
            "{text}"
        );
    }
}
