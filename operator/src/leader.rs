//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go does it: the
//! holder renews every `RETRY`; a candidate takes the Lease once it has seen the same
//! Lease record, unrenewed, for `leaseDurationSeconds` on its own clock (so clock skew
//! between nodes cannot shorten the wait), or at once when it is released. Writes use
//! the Lease's resourceVersion (PUT), so two candidates racing for an expired Lease
//! cannot both win.
//!
//! Only the leader runs the controllers, and never two at once
//! (docs/security.md#one-operator-acts-at-a-time): every call about the Lease has a
//! deadline ([`CALL_TIMEOUT`]; kube's client has no read timeout, so a call to an API
//! server that stopped answering would otherwise hang for ever), and a leader whose
//! renewals have not succeeded for [`RENEW_DEADLINE`], counted from the start of the last
//! one that did, stops leading ([`keep`] returns) while the Lease it last wrote still has
//! [`LEASE_DURATION`] - [`RENEW_DEADLINE`] to run. The caller then drops the controllers
//! and exits, to be restarted as a candidate.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use tokio::time::Instant;

pub const LEASE_DURATION: Duration = Duration::from_secs(15);
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);
pub const RETRY: Duration = Duration::from_secs(2);
/// Deadline of one API call about the Lease (GET, POST or PUT): shorter than the
/// renew deadline, so a renewal that hangs leaves time for another.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(4);

/// Why a leader stopped leading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lost {
    /// Another replica holds the Lease now.
    Taken,
    /// No renewal succeeded within [`RENEW_DEADLINE`] of the start of the last one
    /// that did: the Lease may expire soon, so this replica stops first.
    RenewDeadline,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("the API server did not answer within {0:?}")]
    Timeout(Duration),
}

/// What a candidate may do with the Lease as it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nobody holds it, or the holder let it expire.
    Acquire,
    /// We hold it.
    Renew,
    /// Someone else holds it and renewed in time.
    Held { holder: String },
}

/// Pure: what `me` may do with `spec`, having seen this very Lease record (same
/// resourceVersion) unchanged for `unchanged_for` on its own clock.
pub fn decide(spec: Option<&LeaseSpec>, me: &str, unchanged_for: Duration) -> Decision {
    let Some(spec) = spec else {
        return Decision::Acquire;
    };
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder.is_empty() {
        return Decision::Acquire;
    }
    if holder == me {
        return Decision::Renew;
    }
    let duration = spec
        .lease_duration_seconds
        .map(|s| Duration::from_secs(u64::try_from(s).unwrap_or(0)))
        .unwrap_or(LEASE_DURATION);
    if unchanged_for >= duration {
        Decision::Acquire
    } else {
        Decision::Held {
            holder: holder.to_string(),
        }
    }
}

/// Holds leadership, renewing with `renew` every [`RETRY`], until the Lease is taken
/// or [`RENEW_DEADLINE`] passes without a successful renewal, counted from the start
/// of the last renewal that succeeded (`since`: the start of the attempt that
/// acquired). A renewal still running at that deadline is abandoned. Since the
/// renewTime a renewal writes is no earlier than its start, and a candidate waits
/// [`LEASE_DURATION`] after it, this returns at least `LEASE_DURATION -
/// RENEW_DEADLINE` before anyone else can lead.
pub async fn keep<F, Fut>(mut renew: F, since: Instant) -> Lost
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool, Error>>,
{
    let mut renewed = since;
    loop {
        let deadline = renewed + RENEW_DEADLINE;
        tokio::select! {
            biased;
            _ = tokio::time::sleep_until(deadline) => return Lost::RenewDeadline,
            _ = tokio::time::sleep(RETRY) => {}
        }
        let started = Instant::now();
        match tokio::time::timeout_at(deadline, renew()).await {
            Err(_) => return Lost::RenewDeadline,
            Ok(Ok(true)) => renewed = started,
            Ok(Ok(false)) => return Lost::Taken,
            Ok(Err(e)) => tracing::warn!(error = %e, "renewing the Lease"),
        }
    }
}

/// The Lease record (resourceVersion and holder) a candidate saw last, and since
/// when on its own clock: what [`decide`] measures expiry by, as client-go does.
#[derive(Debug, Default)]
pub struct Seen(Option<(String, Instant)>);

impl Seen {
    /// Records that `record` is what the Lease is `now`; how long it has been so.
    pub fn observe(&mut self, record: String, now: Instant) -> Duration {
        match &self.0 {
            Some((r, since)) if *r == record => now - *since,
            _ => {
                self.0 = Some((record, now));
                Duration::ZERO
            }
        }
    }
}

pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    seen: Mutex<Seen>,
}

/// `call`, or [`Error::Timeout`] after [`CALL_TIMEOUT`].
async fn bounded<T>(call: impl Future<Output = Result<T, kube::Error>>) -> Result<T, Error> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(Error::Timeout(CALL_TIMEOUT)),
    }
}

impl Elector {
    pub fn new(api: Api<Lease>, name: impl Into<String>, identity: impl Into<String>) -> Self {
        Self {
            api,
            name: name.into(),
            identity: identity.into(),
            seen: Mutex::new(Seen::default()),
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// How long this replica has seen `lease` as it is now.
    fn unchanged_for(&self, lease: &Lease) -> Duration {
        let record = format!(
            "{}/{}",
            lease
                .metadata
                .resource_version
                .as_deref()
                .unwrap_or_default(),
            lease
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref())
                .unwrap_or_default()
        );
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.observe(record, Instant::now())
    }

    /// One attempt to acquire or renew, each API call bounded by [`CALL_TIMEOUT`].
    /// `Ok(true)`: we lead until at least the start of this attempt + the lease
    /// duration.
    pub async fn try_lead(&self) -> Result<bool, Error> {
        let now = Timestamp::now();
        let Some(mut lease) = bounded(self.api.get_opt(&self.name)).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec(None, now, true)),
            };
            return match bounded(self.api.create(&PostParams::default(), &lease)).await {
                Ok(_) => Ok(true),
                Err(Error::Kube(kube::Error::Api(s))) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let unchanged_for = self.unchanged_for(&lease);
        let acquiring = match decide(lease.spec.as_ref(), &self.identity, unchanged_for) {
            Decision::Held { .. } => return Ok(false),
            Decision::Acquire => true,
            Decision::Renew => false,
        };
        lease.spec = Some(self.spec(lease.spec.take(), now, acquiring));
        // `replace` sends metadata.resourceVersion: a concurrent writer gets 409.
        match bounded(self.api.replace(&self.name, &PostParams::default(), &lease)).await {
            Ok(_) => Ok(true),
            Err(Error::Kube(kube::Error::Api(s))) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn spec(&self, old: Option<LeaseSpec>, now: Timestamp, acquiring: bool) -> LeaseSpec {
        let old = old.unwrap_or_default();
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(LEASE_DURATION.as_secs() as i32),
            acquire_time: if acquiring {
                Some(MicroTime(now))
            } else {
                old.acquire_time
            },
            renew_time: Some(MicroTime(now)),
            lease_transitions: if acquiring {
                Some(old.lease_transitions.unwrap_or(0) + i32::from(old.holder_identity.is_some()))
            } else {
                old.lease_transitions
            },
            ..old
        }
    }

    /// Gives the Lease up (on shutdown) so a standby takes over at once; each call
    /// bounded by [`CALL_TIMEOUT`], so a shutdown never waits for an API server that
    /// does not answer.
    pub async fn release(&self) {
        if let Ok(Some(mut lease)) = bounded(self.api.get_opt(&self.name)).await {
            let ours = lease
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref())
                == Some(self.identity.as_str());
            if ours {
                if let Some(spec) = lease.spec.as_mut() {
                    spec.holder_identity = None;
                    spec.lease_duration_seconds = Some(1);
                }
                match bounded(self.api.replace(&self.name, &PostParams::default(), &lease)).await {
                    Ok(_) => tracing::info!(lease = %self.name, "released the leader Lease"),
                    Err(e) => {
                        tracing::warn!(lease = %self.name, error = %e, "releasing the leader Lease")
                    }
                }
            }
        }
    }

    /// Blocks until this replica leads; returns when the attempt that won started
    /// (what [`Elector::hold`] counts its first renew deadline from).
    pub async fn acquire(&self) -> Instant {
        loop {
            let started = Instant::now();
            match self.try_lead().await {
                Ok(true) => return started,
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, lease = %self.name, "leader election"),
            }
            tokio::time::sleep(RETRY).await;
        }
    }

    /// Renews until leadership is lost ([`keep`]); says why, and returns then.
    pub async fn hold(&self, since: Instant) -> Lost {
        let lost = keep(|| self.try_lead(), since).await;
        match lost {
            Lost::Taken => {
                tracing::error!(lease = %self.name, "the Lease was taken by another replica")
            }
            Lost::RenewDeadline => tracing::error!(
                lease = %self.name,
                deadline = ?RENEW_DEADLINE,
                "could not renew the Lease within the renew deadline"
            ),
        }
        lost
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn spec(holder: Option<&str>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            lease_duration_seconds: Some(15),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn decisions() {
        let secs = Duration::from_secs;
        assert_eq!(decide(None, "me", secs(0)), Decision::Acquire);
        assert_eq!(decide(Some(&spec(None)), "me", secs(0)), Decision::Acquire);
        assert_eq!(
            decide(Some(&spec(Some("me"))), "me", secs(100)),
            Decision::Renew
        );
        assert_eq!(
            decide(Some(&spec(Some("other"))), "me", secs(14)),
            Decision::Held {
                holder: "other".into()
            }
        );
        assert_eq!(
            decide(Some(&spec(Some("other"))), "me", secs(15)),
            Decision::Acquire
        );
    }

    /// A candidate's wait starts when it first sees a record, and again whenever the
    /// record changes (a renewal): never from the renewTime another node's clock wrote.
    #[tokio::test(start_paused = true)]
    async fn expiry_is_measured_on_the_candidates_clock_from_the_last_change_seen() {
        let mut seen = Seen::default();
        let t0 = Instant::now();
        let s = Duration::from_secs;
        assert_eq!(seen.observe("7/leader".into(), t0), s(0));
        assert_eq!(seen.observe("7/leader".into(), t0 + s(2)), s(2));
        // Renewed: a new resourceVersion starts the wait again.
        assert_eq!(seen.observe("8/leader".into(), t0 + s(4)), s(0));
        assert_eq!(seen.observe("8/leader".into(), t0 + s(19)), s(15));
        let held = decide(Some(&spec(Some("leader"))), "me", s(14));
        assert!(matches!(held, Decision::Held { .. }));
        assert_eq!(
            decide(
                Some(&spec(Some("leader"))),
                "me",
                seen.observe("8/leader".into(), t0 + s(19))
            ),
            Decision::Acquire
        );
    }

    /// One scripted renewal: how long it takes, then what it answers (`None`: it
    /// never answers).
    type Step = (Duration, Option<Result<bool, ()>>);

    /// A renew function playing `steps` in order (the last one for ever), counting
    /// the calls.
    fn scripted(
        steps: Vec<Step>,
        calls: Arc<AtomicUsize>,
    ) -> impl FnMut() -> std::pin::Pin<Box<dyn Future<Output = Result<bool, Error>> + Send>> {
        move || {
            let i = calls.fetch_add(1, Ordering::SeqCst);
            let (takes, answer) = steps[i.min(steps.len() - 1)];
            Box::pin(async move {
                tokio::time::sleep(takes).await;
                match answer {
                    None => std::future::pending().await,
                    Some(Ok(b)) => Ok(b),
                    Some(Err(())) => Err(Error::Timeout(CALL_TIMEOUT)),
                }
            })
        }
    }

    const NOW: Duration = Duration::ZERO;

    /// The defect this module had: a renewal that never answers kept the leader
    /// leading for ever. Now it stops at the renew deadline of the last renewal that
    /// succeeded, before the Lease that renewal wrote can expire.
    #[tokio::test(start_paused = true)]
    async fn a_renewal_that_hangs_stops_the_leader_before_the_lease_expires() {
        let start = Instant::now();
        let calls = Arc::new(AtomicUsize::new(0));
        let renew = scripted(
            vec![(NOW, Some(Ok(true))), (NOW, Some(Ok(true))), (NOW, None)],
            calls.clone(),
        );
        let lost = keep(renew, start).await;
        assert_eq!(lost, Lost::RenewDeadline);
        // Renewed at 2 s and 4 s; the third, at 6 s, hangs: stopped at 4 s + 10 s.
        let last_renewal = start + 2 * RETRY;
        assert_eq!(Instant::now(), last_renewal + RENEW_DEADLINE);
        assert!(Instant::now() < last_renewal + LEASE_DURATION);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    /// A slow renewal that succeeds counts from its start (the renewTime it wrote),
    /// not from when its answer came.
    #[tokio::test(start_paused = true)]
    async fn a_slow_renewal_counts_from_when_it_started() {
        let start = Instant::now();
        let calls = Arc::new(AtomicUsize::new(0));
        let renew = scripted(
            vec![(Duration::from_secs(7), Some(Ok(true))), (NOW, None)],
            calls.clone(),
        );
        assert_eq!(keep(renew, start).await, Lost::RenewDeadline);
        // Started at 2 s, answered at 9 s; the next hangs from 11 s: stopped at 12 s.
        assert_eq!(Instant::now(), start + RETRY + RENEW_DEADLINE);
        // One slower than what is left of the deadline is abandoned at the deadline.
        let start = Instant::now();
        let renew = scripted(vec![(Duration::from_secs(9), Some(Ok(true)))], calls);
        assert_eq!(keep(renew, start).await, Lost::RenewDeadline);
        assert_eq!(Instant::now(), start + RENEW_DEADLINE);
    }

    /// Failed renewals are retried every RETRY until the deadline, then the leader
    /// stops; a renewal that succeeds in between starts a new deadline.
    #[tokio::test(start_paused = true)]
    async fn failures_are_retried_until_the_deadline() {
        let start = Instant::now();
        let calls = Arc::new(AtomicUsize::new(0));
        let renew = scripted(vec![(Duration::from_secs(1), Some(Err(())))], calls.clone());
        assert_eq!(keep(renew, start).await, Lost::RenewDeadline);
        assert_eq!(Instant::now(), start + RENEW_DEADLINE);
        // Tries at 2, 5, 8 s (each failing after 1 s), the fourth at 11 s is past it.
        assert_eq!(calls.load(Ordering::SeqCst), 3);

        let start = Instant::now();
        let calls = Arc::new(AtomicUsize::new(0));
        let renew = scripted(
            vec![
                (NOW, Some(Err(()))),
                (NOW, Some(Err(()))),
                (NOW, Some(Ok(true))),
                (NOW, Some(Err(()))),
            ],
            calls,
        );
        assert_eq!(keep(renew, start).await, Lost::RenewDeadline);
        assert_eq!(Instant::now(), start + 3 * RETRY + RENEW_DEADLINE);
    }

    /// A Lease found taken ends leadership at once.
    #[tokio::test(start_paused = true)]
    async fn a_lease_taken_ends_leadership_at_once() {
        let start = Instant::now();
        let calls = Arc::new(AtomicUsize::new(0));
        let renew = scripted(vec![(NOW, Some(Ok(true))), (NOW, Some(Ok(false)))], calls);
        assert_eq!(keep(renew, start).await, Lost::Taken);
        assert_eq!(Instant::now(), start + 2 * RETRY);
    }
}
