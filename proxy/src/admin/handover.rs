//! The last step of a drain (docs/tenancy.md#drains, "nothing counted is lost"): a replica that
//! shuts down waits, before it exits, until the operator has read its final client
//! counts on `/admin/v1/stats`, so that what it counted while draining reaches
//! `status.usage`. It waits only where an operator reads it (it has been scraped at
//! least once), for the continuations still counting abandoned answers, and for at
//! most `--usage-handover`.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;

use crate::gateway::Gateway;

/// What the operator last read of the clients' counters.
#[derive(Debug, Default)]
pub struct Handover {
    /// The fingerprint of the counts the last stats document reported; `None` before
    /// the first scrape (standalone, or no operator yet: nobody to hand over to).
    read: Mutex<Option<u64>>,
    scraped: Notify,
}

impl Handover {
    /// A stats document reporting counts of `fingerprint` went out.
    pub fn read(&self, fingerprint: u64) {
        *self.read.lock().unwrap_or_else(|p| p.into_inner()) = Some(fingerprint);
        self.scraped.notify_waiters();
    }

    fn last(&self) -> Option<u64> {
        *self.read.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Every client counter that reaches the operator, summed: it changes whenever one
/// of them does (they only grow).
pub fn fingerprint(gw: &Gateway) -> u64 {
    use std::sync::atomic::Ordering::Relaxed;
    gw.carried()
        .clients()
        .iter()
        .map(|(_, c)| {
            [
                &c.requests,
                &c.input_tokens,
                &c.output_tokens,
                &c.micro_usd,
                &c.rate_limited,
                &c.budget_exhausted,
            ]
            .iter()
            .fold(0u64, |sum, n| sum.wrapping_add(n.load(Relaxed)))
        })
        .fold(0u64, u64::wrapping_add)
}

/// Waits, for at most `within`, until the continuations counting abandoned answers
/// are done and the operator has read the counts they leave. Returns whether it
/// had nothing left to hand over (or nobody to hand it to).
pub async fn hand_over(gw: &Gateway, within: Duration) -> bool {
    if gw.handover.last().is_none() || within.is_zero() {
        return true;
    }
    let done = async {
        gw.settling.idle().await;
        loop {
            let scraped = gw.handover.scraped.notified();
            if gw.handover.last() == Some(fingerprint(gw)) {
                return;
            }
            scraped.await;
        }
    };
    let pending = gw.settling.pending();
    let handed = tokio::time::timeout(within, done).await.is_ok();
    if handed {
        tracing::info!("the operator has read this replica's final usage counts");
    } else {
        tracing::warn!(
            continuations = pending,
            wait_ms = within.as_millis() as u64,
            "exiting before the operator read this replica's final usage counts \
             (--usage-handover); what it counted since the last scrape is not in status.usage"
        );
    }
    handed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_replica_waits_for_the_operator_to_read_what_it_counted() {
        let gw = std::sync::Arc::new(Gateway::new(1024, "test".into(), 1).unwrap());
        // Never read by an operator (standalone): nothing to wait for.
        assert!(hand_over(&gw, Duration::from_secs(10)).await);
        // Read, then something counted (a continuation still running, here): the wait
        // ends when it is done and a scrape has read its count.
        gw.handover.read(fingerprint(&gw) + 1);
        gw.settling
            .spawn(tokio::time::sleep(Duration::from_secs(2)));
        let read = {
            let gw = gw.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(3)).await;
                gw.handover.read(fingerprint(&gw));
            })
        };
        let started = tokio::time::Instant::now();
        assert!(hand_over(&gw, Duration::from_secs(10)).await);
        assert_eq!(started.elapsed(), Duration::from_secs(3));
        read.await.unwrap();
        // Nobody reads it: the wait is bounded.
        gw.handover.read(fingerprint(&gw) + 1);
        assert!(!hand_over(&gw, Duration::from_secs(5)).await);
        assert_eq!(started.elapsed(), Duration::from_secs(8));
    }
}
