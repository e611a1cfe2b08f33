//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go does it: the
//! holder renews every `RETRY`, others take the Lease once `leaseDurationSeconds`
//! passed without a renewal. Writes use the Lease's resourceVersion (PUT), so two
//! candidates racing for an expired Lease cannot both win. Only the leader runs the
//! controllers; a leader that cannot renew within `RENEW_DEADLINE` stops (the process
//! exits and is restarted as a candidate).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::PostParams;

pub const LEASE_DURATION: Duration = Duration::from_secs(15);
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);
pub const RETRY: Duration = Duration::from_secs(2);

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

/// Pure: what `me` may do with `spec` at `now`.
pub fn decide(spec: Option<&LeaseSpec>, me: &str, now: Timestamp) -> Decision {
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
    let duration = SignedDuration::from_secs(i64::from(
        spec.lease_duration_seconds
            .unwrap_or(LEASE_DURATION.as_secs() as i32),
    ));
    match &spec.renew_time {
        Some(MicroTime(renewed)) if *renewed + duration > now => Decision::Held {
            holder: holder.to_string(),
        },
        _ => Decision::Acquire,
    }
}

pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
}

impl Elector {
    pub fn new(api: Api<Lease>, name: impl Into<String>, identity: impl Into<String>) -> Self {
        Self {
            api,
            name: name.into(),
            identity: identity.into(),
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// One attempt to acquire or renew. `Ok(true)`: we lead until at least now +
    /// the lease duration.
    pub async fn try_lead(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec(None, now, true)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let decision = decide(lease.spec.as_ref(), &self.identity, now);
        let acquiring = match decision {
            Decision::Held { .. } => return Ok(false),
            Decision::Acquire => true,
            Decision::Renew => false,
        };
        lease.spec = Some(self.spec(lease.spec.take(), now, acquiring));
        // `replace` sends metadata.resourceVersion: a concurrent writer gets 409.
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
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

    /// Gives the Lease up (on shutdown) so a standby takes over at once.
    pub async fn release(&self) {
        if let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await {
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
                let _ = self
                    .api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await;
            }
        }
    }

    /// Blocks until this replica leads.
    pub async fn acquire(&self) {
        loop {
            match self.try_lead().await {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, lease = %self.name, "leader election"),
            }
            tokio::time::sleep(RETRY).await;
        }
    }

    /// Renews until a renewal fails for longer than `RENEW_DEADLINE`; returns then
    /// (leadership is lost).
    pub async fn hold(&self) {
        let mut renewed = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(RETRY).await;
            match self.try_lead().await {
                Ok(true) => renewed = tokio::time::Instant::now(),
                Ok(false) => {
                    tracing::error!(lease = %self.name, "the Lease was taken by another replica");
                    return;
                }
                Err(e) => tracing::warn!(error = %e, lease = %self.name, "renewing the Lease"),
            }
            if renewed.elapsed() > RENEW_DEADLINE {
                tracing::error!(lease = %self.name, "could not renew the Lease in time");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: Option<&str>, renewed_secs_ago: i64, now: Timestamp) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(now - SignedDuration::from_secs(renewed_secs_ago))),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn decisions() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        assert_eq!(decide(None, "me", now), Decision::Acquire);
        assert_eq!(
            decide(Some(&spec(None, 1, now)), "me", now),
            Decision::Acquire
        );
        assert_eq!(
            decide(Some(&spec(Some("me"), 100, now)), "me", now),
            Decision::Renew
        );
        assert_eq!(
            decide(Some(&spec(Some("other"), 5, now)), "me", now),
            Decision::Held {
                holder: "other".into()
            }
        );
        assert_eq!(
            decide(Some(&spec(Some("other"), 16, now)), "me", now),
            Decision::Acquire
        );
    }
}
