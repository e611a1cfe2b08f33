//! Reading one request body under the limits, before anything else looks at it:
//!
//! * a `Content-Length` over the body limit is refused before the body is polled, so
//!   hyper never sends `100 Continue` for it (it does on the first poll);
//! * the bytes are reserved in the replica's in-flight budget (the whole declared
//!   length up front, or chunk by chunk when there is none) and held until the
//!   request's answer head is out ([`Held`]); a body that does not fit is refused;
//! * the body must arrive within the body-read timeout, counted from the end of the
//!   headers (the handler starts then).
//!
//! A request that passes pays two uncontended-ish atomic adds and one timer that is
//! only registered when the body is not already there.

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;

use super::{Front, Refusals};
use crate::limits::bytes::Budget;

/// Why a body was not taken.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// Over the body limit (declared or as read): 413.
    TooLarge,
    /// The in-flight budget is spent: 503 `overloaded`, `Retry-After: 1`.
    Overloaded,
    /// Not received within the body-read timeout: 408.
    Timeout,
    /// The client's body broke off or was malformed: 400.
    Broken(String),
}

/// Budget bytes reserved by one request; given back when dropped.
pub type Held<'a> = crate::limits::bytes::Held<&'a Budget>;

/// The whole body, with its budget reservation, or why it was refused (counted in
/// [`Refusals`]).
pub async fn read<'a, B>(
    front: &'a Front,
    max_body_bytes: usize,
    body: B,
) -> Result<(Bytes, Held<'a>), Refused>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let mut held = Held::new(&front.bodies);
    let declared = body.size_hint().exact();
    if let Some(n) = declared {
        if n > max_body_bytes as u64 {
            Refusals::count(&front.refusals.too_large);
            return Err(Refused::TooLarge);
        }
        if !held.grow(n as usize) {
            Refusals::count(&front.refusals.over_budget);
            return Err(Refused::Overloaded);
        }
        if n == 0 {
            return Ok((Bytes::new(), held));
        }
    }
    let deadline = tokio::time::Instant::now() + front.limits.body_read_timeout;
    match tokio::time::timeout_at(deadline, collect(body, max_body_bytes, &mut held)).await {
        Ok(Ok(bytes)) => Ok((bytes, held)),
        Ok(Err(refused)) => {
            match refused {
                Refused::TooLarge => Refusals::count(&front.refusals.too_large),
                Refused::Overloaded => Refusals::count(&front.refusals.over_budget),
                _ => {}
            }
            Err(refused)
        }
        Err(_) => {
            Refusals::count(&front.refusals.body_timeouts);
            Err(Refused::Timeout)
        }
    }
}

/// Collects the frames; a body of one frame (the usual case) is kept without a copy.
async fn collect<B>(mut body: B, limit: usize, held: &mut Held<'_>) -> Result<Bytes, Refused>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let mut first: Option<Bytes> = None;
    let mut joined: Option<BytesMut> = None;
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Refused::Broken(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers: not part of the body
        };
        total = total.saturating_add(data.len());
        if total > limit {
            return Err(Refused::TooLarge);
        }
        if !held.grow_to(total) {
            return Err(Refused::Overloaded);
        }
        match (&mut joined, first.take()) {
            (Some(j), _) => j.extend_from_slice(&data),
            (None, None) => first = Some(data),
            (None, Some(f)) => {
                let mut j = BytesMut::with_capacity(held.bytes().max(total));
                j.extend_from_slice(&f);
                j.extend_from_slice(&data);
                joined = Some(j);
            }
        }
    }
    Ok(joined.map_or_else(|| first.unwrap_or_default(), BytesMut::freeze))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http_body_util::{Full, StreamBody};

    use std::sync::atomic::Ordering;

    use super::*;
    use crate::front::ClientLimits;

    fn front(budget: usize) -> Front {
        Front::new(
            ClientLimits {
                max_inflight_body_bytes: budget,
                body_read_timeout: Duration::from_secs(30),
                ..ClientLimits::default()
            },
            1,
        )
    }

    type Chunks = StreamBody<
        futures_util::stream::BoxStream<'static, Result<hyper::body::Frame<Bytes>, String>>,
    >;

    fn chunks(parts: &[&'static str]) -> Chunks {
        let frames: Vec<Result<_, String>> = parts
            .iter()
            .map(|p| Ok(hyper::body::Frame::data(Bytes::from_static(p.as_bytes()))))
            .collect();
        StreamBody::new(Box::pin(futures_util::stream::iter(frames)))
    }

    #[tokio::test]
    async fn a_declared_length_over_the_limit_is_refused_without_polling_the_body() {
        let f = front(1 << 20);
        // A body that panics when polled: refusing must not touch it.
        struct Untouchable;
        impl hyper::body::Body for Untouchable {
            type Data = Bytes;
            type Error = String;
            fn poll_frame(
                self: std::pin::Pin<&mut Self>,
                _: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, String>>> {
                panic!("the body was polled")
            }
            fn size_hint(&self) -> hyper::body::SizeHint {
                hyper::body::SizeHint::with_exact(100)
            }
        }
        assert_eq!(
            read(&f, 99, Untouchable).await.unwrap_err(),
            Refused::TooLarge
        );
        assert_eq!(f.refusals.too_large.load(Ordering::Relaxed), 1);
        assert_eq!(f.body_bytes_held(), 0);
    }

    #[tokio::test]
    async fn the_budget_is_held_until_the_request_is_done_and_refuses_past_it() {
        let f = front(100);
        let (a, held) = read(&f, 1000, Full::new(Bytes::from(vec![b'a'; 60])))
            .await
            .unwrap();
        assert_eq!(a.len(), 60);
        assert_eq!(f.body_bytes_held(), 60);
        // Declared: refused before reading.
        let over = read(&f, 1000, Full::new(Bytes::from(vec![b'b'; 41]))).await;
        assert_eq!(over.unwrap_err(), Refused::Overloaded);
        // Undeclared: refused when the chunk that does not fit comes.
        let over = read(
            &f,
            1000,
            chunks(&["01234567890123456789", "01234567890123456789", "x"]),
        )
        .await;
        assert_eq!(over.unwrap_err(), Refused::Overloaded);
        assert_eq!(f.body_bytes_held(), 60, "refusals give their bytes back");
        assert_eq!(f.refusals.over_budget.load(Ordering::Relaxed), 2);
        drop(held);
        assert_eq!(f.body_bytes_held(), 0);
        let (b, _held) = read(&f, 1000, chunks(&["ab", "cd", "e"])).await.unwrap();
        assert_eq!(&b[..], b"abcde");
    }

    #[tokio::test]
    async fn an_undeclared_body_over_the_limit_is_refused_as_it_is_read() {
        let f = front(1 << 20);
        let r = read(&f, 8, chunks(&["12345", "6789"])).await;
        assert_eq!(r.unwrap_err(), Refused::TooLarge);
        assert_eq!(f.body_bytes_held(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_does_not_arrive_in_time_is_refused() {
        let f = front(1 << 20);
        let stalled = StreamBody::new(futures_util::stream::pending::<
            Result<hyper::body::Frame<Bytes>, String>,
        >());
        let started = tokio::time::Instant::now();
        assert_eq!(read(&f, 1000, stalled).await.unwrap_err(), Refused::Timeout);
        assert_eq!(started.elapsed(), Duration::from_secs(30));
        assert_eq!(f.refusals.body_timeouts.load(Ordering::Relaxed), 1);
    }
}
