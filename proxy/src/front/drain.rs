//! Shutdown (SIGTERM/SIGINT, SPEC §8): the order of the drain, and the wrapper that
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
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use hyper::body::{Frame, SizeHint};

use super::Front;
use crate::surface::Wire;

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

/// `body` (a committed stream in `wire`'s format), ended with the error event when
/// the shutdown grace is over.
pub fn until_shutdown(front: Arc<Front>, wire: Wire, body: Body) -> Body {
    Body::new(EndAtShutdown {
        inner: Some(body),
        front,
        wire,
        waiting: None,
    })
}

struct EndAtShutdown {
    /// `None` once ended.
    inner: Option<Body>,
    front: Arc<Front>,
    wire: Wire,
    waiting: Option<Pin<Box<tokio::sync::futures::OwnedNotified>>>,
}

impl EndAtShutdown {
    fn end(&mut self) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        // Dropping the upstream body here is what stops the upstream stream.
        self.inner = None;
        Poll::Ready(Some(Ok(Frame::data(crate::sse::failure_event(
            self.wire,
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
                // waits never takes the lane's lock.
                let front = &this.front;
                let waiting = this
                    .waiting
                    .get_or_insert_with(|| front.end_streams.notified());
                if waiting.as_mut().poll(cx).is_ready() || front.end_streams.is_set() {
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
