//! Per-credential concurrency limit (`maxConcurrency`) with a bounded wait queue
//! (`maxQueue`). A full queue fails over at once; a queued request waits no longer
//! than its budget, and leaves the queue when its client goes away (the future is
//! dropped). Permits are owned, so a committed stream keeps its slot until it ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, timeout_at};

#[derive(Debug)]
pub struct Limiter {
    slots: Arc<Semaphore>,
    max_queue: u32,
    waiting: AtomicU32,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// Every slot busy and the queue full: try the next target now.
    QueueFull,
    /// The budget ran out while waiting.
    Deadline,
}

/// Leaves the queue on drop, however the wait ends.
struct Waiting<'a>(&'a AtomicU32);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Limiter {
    pub fn new(max_concurrency: u32, max_queue: u32) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(max_concurrency as usize)),
            max_queue,
            waiting: AtomicU32::new(0),
        }
    }

    pub async fn acquire(&self, deadline: Instant) -> Result<OwnedSemaphorePermit, Refused> {
        if let Ok(p) = self.slots.clone().try_acquire_owned() {
            return Ok(p);
        }
        let max = self.max_queue;
        self.waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                (w < max).then_some(w + 1)
            })
            .map_err(|_| Refused::QueueFull)?;
        let _waiting = Waiting(&self.waiting);
        match timeout_at(deadline, self.slots.clone().acquire_owned()).await {
            Ok(Ok(p)) => Ok(p),
            // The semaphore is never closed; treat it like a full queue if it were.
            Ok(Err(_)) => Err(Refused::QueueFull),
            Err(_) => Err(Refused::Deadline),
        }
    }

    pub fn in_flight(&self, max_concurrency: u32) -> u32 {
        max_concurrency.saturating_sub(self.slots.available_permits() as u32)
    }

    pub fn waiting(&self) -> u32 {
        self.waiting.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_refuses_at_once_and_waiters_get_freed_slots() {
        let l = Arc::new(Limiter::new(1, 1));
        let far = Instant::now() + Duration::from_secs(60);
        let first = l.acquire(far).await.unwrap();
        let l2 = l.clone();
        let queued = tokio::spawn(async move { l2.acquire(far).await.map(|_| ()) });
        tokio::task::yield_now().await;
        assert_eq!(l.waiting(), 1);
        assert_eq!(l.acquire(far).await.unwrap_err(), Refused::QueueFull);
        drop(first);
        assert_eq!(queued.await.unwrap(), Ok(()));
        assert_eq!(l.waiting(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn queued_requests_respect_the_deadline_and_cancellation() {
        let l = Arc::new(Limiter::new(1, 4));
        let _busy = l
            .acquire(Instant::now() + Duration::from_secs(60))
            .await
            .unwrap();
        let started = Instant::now();
        let r = l.acquire(Instant::now() + Duration::from_secs(2)).await;
        assert_eq!(r.unwrap_err(), Refused::Deadline);
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        assert_eq!(l.waiting(), 0);
        let l2 = l.clone();
        let waiter = tokio::spawn(async move {
            l2.acquire(Instant::now() + Duration::from_secs(60))
                .await
                .map(|_| ())
        });
        tokio::task::yield_now().await;
        assert_eq!(l.waiting(), 1);
        waiter.abort();
        let _ = waiter.await;
        assert_eq!(l.waiting(), 0, "a cancelled waiter leaves the queue");
    }

    #[tokio::test]
    async fn no_queue_means_no_waiting() {
        let l = Limiter::new(1, 0);
        let far = Instant::now() + Duration::from_secs(60);
        let _p = l.acquire(far).await.unwrap();
        assert_eq!(l.acquire(far).await.unwrap_err(), Refused::QueueFull);
        assert_eq!(l.in_flight(1), 1);
    }
}
