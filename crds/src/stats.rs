//! The `/admin/v1/stats` document: what one proxy replica reports about the routes it
//! serves, and what the operator scrapes and aggregates into status (docs/observability.md#stats).
//!
//! Counters are cumulative since the replica started (`instanceId`, `startedAt`); the
//! operator turns them into deltas per instance, so a restart (new instance id, counters
//! from zero) never makes totals go backwards. Field names are stable: add fields,
//! never rename them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::ObjectId;
use crate::cost::Usd;
use crate::revision::Revision;

/// Bump on an incompatible change of this document.
pub const STATS_VERSION: u32 = 1;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatsReport {
    pub version: u32,
    /// Random per process start.
    pub instance_id: String,
    /// RFC 3339.
    pub started_at: String,
    /// Configs applied since start.
    pub config_generation: u64,
    /// The last config this replica refused (it keeps serving the previous one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_error: Option<String>,
    pub routes: Vec<RouteStats>,
    /// Per LLMClient (docs/tenancy.md#usage), for every client seen since start; left out
    /// when empty (a proxy without clients reports what it did before clients existed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clients: Vec<ClientStats>,
    /// The replica is shutting down (SIGTERM): it serves what it has but takes no new
    /// clients. The operator keeps reading its counts until it exits, and leaves it
    /// out of the ready replicas (limits' and budgets' shares, `Programmed`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub draining: bool,
    /// Per ProviderCredential the replica serves: its keys
    /// (docs/request-lifecycle.md#key-pools). Left out when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<CredentialStats>,
}

/// One credential's keys as one replica sees them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CredentialStats {
    pub credential: ObjectId,
    /// In declared order; only the keys the replica holds a value for.
    pub keys: Vec<KeyStats>,
}

/// One key of a credential, by its Secret data-key name (never its value),
/// cumulative since the replica started.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyStats {
    /// The Secret data key holding it.
    pub name: String,
    pub state: KeyState,
    /// RFC 3339: when a Parked or Rejected key is used again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    /// Upstream requests sent with it (probes included).
    pub attempts: u64,
    /// Answers of 429 that parked it.
    pub rate_limited: u64,
    /// Answers of 401 or 403 that set it aside.
    pub rejected: u64,
}

/// What a key is to requests now (docs/request-lifecycle.md#key-pools).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub enum KeyState {
    /// Used in turn.
    #[default]
    Active,
    /// Answered 429: not used until its Retry-After (or backoff) ends.
    Parked,
    /// Answered 401 or 403: not used for the credential's `keyRejectedFor`.
    Rejected,
}

impl KeyState {
    pub const ALL: [KeyState; 3] = [KeyState::Active, KeyState::Parked, KeyState::Rejected];

    pub fn as_str(self) -> &'static str {
        match self {
            KeyState::Active => "Active",
            KeyState::Parked => "Parked",
            KeyState::Rejected => "Rejected",
        }
    }

    /// How much it keeps requests away, the most first: the state shown when replicas
    /// disagree.
    pub fn severity(self) -> u8 {
        match self {
            KeyState::Rejected => 2,
            KeyState::Parked => 1,
            KeyState::Active => 0,
        }
    }
}

/// What one replica saw of one LLMClient, cumulative since the replica started.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientStats {
    pub client: ObjectId,
    /// Requests authenticated as this client and let through to routing (throttled
    /// ones are counted below instead).
    pub requests: u64,
    /// Tokens from the providers' usage reports, over every route.
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Cost from the targets' prices, in millionths of a USD (an integer, so the
    /// operator's per-instance deltas are exact).
    pub micro_usd: u64,
    /// Refused with 429 `rate_limited` (requests or tokens per minute, concurrency).
    pub rate_limited: u64,
    /// Refused with 429 `budget_exhausted`.
    pub budget_exhausted: u64,
    /// RFC 3339: the last request of this client, let through or refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_request_at: Option<String>,
    /// Requests whose usage was estimated, not reported by the provider: streams the
    /// client left mid-answer (cancelled upstream at once), or whose usage did not
    /// follow their content within 10 s. Their tokens (prompt and content relayed,
    /// bytes / 4) are in the counts above, and in `estimatedTokens` too.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub estimated_requests: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub estimated_tokens: u64,
    /// Tokens reserved now by this client's requests in flight (budgets,
    /// docs/tenancy.md#reserve-before-sending).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reserved_tokens: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteStats {
    pub route: ObjectId,
    /// The LLMRoute generation this replica serves now.
    pub generation: i64,
    /// What it serves that generation with: route, credentials and keys (see
    /// [`crate::revision`]). `None` from a proxy older than the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<Revision>,
    /// Client requests routed here.
    pub requests: u64,
    /// Upstream requests sent.
    pub attempts: u64,
    /// Requests answered by a target other than the first in their order.
    pub fallbacks: u64,
    /// Requests answered with an error (gateway error or relayed upstream error).
    pub failed: u64,
    /// Streams that broke after their commit and were continued on another target
    /// (`spec.stream.resume`, docs/streaming.md#resume-after-commit). Absent (0) from a
    /// proxy older than the field.
    #[serde(default)]
    pub resumed: u64,
    /// What the requests answered on this route cost at their targets' `price`
    /// (reported and estimated usage), exact (see [`crate::cost`]). Absent: zero, or
    /// a proxy older than the field.
    #[serde(default, skip_serializing_if = "Usd::is_zero")]
    pub cost_usd: Usd,
    /// What the requests answered by a target other than the route's first (declared)
    /// cost beyond what the first would have charged for the same tokens, request by
    /// request (a cheaper answer adds nothing).
    #[serde(default, skip_serializing_if = "Usd::is_zero")]
    pub fallback_extra_usd: Usd,
    pub targets: Vec<TargetStats>,
    /// Indexes of `targets` in the order a request takes them now (skipped targets in
    /// their place): for loadbalance, by weight, heaviest first (the most likely
    /// first). Empty from a proxy older than the field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub order: Vec<u32>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TargetStats {
    pub credential: ObjectId,
    /// Upstream model; `None` = the name the client sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Requests that reached this target (tried or skipped).
    pub requests: u64,
    /// Upstream requests sent to it.
    pub attempts: u64,
    /// Attempts beyond the first on one request.
    pub retries: u64,
    /// Requests it answered.
    pub successes: u64,
    /// Failed attempts and skips, by reason (`status5xx`, `rateLimited`, `timeout`,
    /// `connectionError`, `contextLength`, `invalidResponse`, `responseTooLarge`,
    /// `authError`, `clientError`,
    /// `budgetExhausted`, `missingKey`, `unsupportedSurface`, `parked`,
    /// `circuitOpen`, `queueFull`, `overloaded`: the answer did not fit the replica's
    /// `--max-inflight-response-bytes`; `cannotResume`: passed over for resuming a
    /// stream it cannot continue; `rampingUp`: its circuit closed moments ago and the
    /// failback ramp gave this request to the next target; `hedgeLost`: a try
    /// cancelled because the other try of its hedge answered first).
    pub failures: BTreeMap<String, u64>,
    /// Requests that moved on from this target to a later one.
    pub fallbacks_away: u64,
    /// Broken streams this target continued (`spec.stream.resume`,
    /// docs/streaming.md#resume-after-commit).
    #[serde(default)]
    pub resumed: u64,
    /// Hedged attempts started on this target beside a slow one (`spec.hedge`).
    #[serde(default)]
    pub hedges: u64,
    /// Hedged attempts on this target that answered first.
    #[serde(default)]
    pub hedge_wins: u64,
    /// What the requests it answered cost at its `price`.
    #[serde(default, skip_serializing_if = "Usd::is_zero")]
    pub cost_usd: Usd,
    /// The same, by the reason the request left it (its last failure there, or why it
    /// was skipped). Left out when empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fallbacks_away_by_reason: BTreeMap<String, u64>,
    /// What a request finds at this target now (docs/troubleshooting.md#target-states).
    /// `None` from a proxy older than the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<TargetState>,
    /// RFC 3339: since when, where the replica knows it (a circuit's last change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_since: Option<String>,
    /// RFC 3339: when it ends on its own (an open circuit's next probe, a park's end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_until: Option<String>,
    pub circuit: CircuitState,
    /// RFC 3339: when the circuit entered its current state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit_since: Option<String>,
    /// Times its circuit has opened since the replica started (here or adopted from
    /// the fleet's view): a `Closed` circuit with none never opened, so its
    /// `circuitSince` is the replica's start, not a success. Left out when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub circuit_opened: u64,
    /// RFC 3339, while the target is parked after a 429.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parked_until: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<LastFailure>,
    pub latency: Latency,
    /// The replica probes this target in the background now: its circuit is open and
    /// its route probes (`circuitBreaker.probeInterval`), or it has a `healthCheck`;
    /// and the fleet's health view does not leave it to another replica.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub probing: bool,
    /// Probes sent (of an open circuit, and health checks), by outcome: `success` or
    /// the failure's reason. Left out when empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub probes: BTreeMap<String, u64>,
    /// The most recent probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe: Option<ProbeRecord>,
}

/// One probe's outcome.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProbeRecord {
    /// `success`, or the failure's reason.
    pub outcome: String,
    /// RFC 3339: when it ended.
    pub at: String,
}

/// What a request finds at a target now, as one replica sees it. Every state but
/// `Ready` makes requests skip the target before sending anything
/// (docs/request-lifecycle.md#route-and-target-order), except `HalfOpen`, which lets one
/// probe through.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub enum TargetState {
    #[default]
    Ready,
    /// Its circuit is open: skipped until `stateUntil`, then one probe.
    CircuitOpen,
    /// Its circuit lets one probe through; the rest skip it.
    HalfOpen,
    /// A 429's Retry-After parks it until `stateUntil`.
    Parked,
    /// Its credential's `maxConcurrency` is in use and its queue full.
    Saturated,
    /// Its credential's key is missing from the delivered Secret.
    NoKey,
    /// It cannot serve the API the route's clients call (derived by the operator from
    /// the window's skips; a replica does not report it).
    Unsupported,
}

impl TargetState {
    pub const ALL: [TargetState; 7] = [
        TargetState::Ready,
        TargetState::CircuitOpen,
        TargetState::HalfOpen,
        TargetState::Parked,
        TargetState::Saturated,
        TargetState::NoKey,
        TargetState::Unsupported,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TargetState::Ready => "Ready",
            TargetState::CircuitOpen => "CircuitOpen",
            TargetState::HalfOpen => "HalfOpen",
            TargetState::Parked => "Parked",
            TargetState::Saturated => "Saturated",
            TargetState::NoKey => "NoKey",
            TargetState::Unsupported => "Unsupported",
        }
    }

    /// How much it keeps requests away, the most first: the state a target is shown in
    /// when replicas disagree.
    pub fn severity(self) -> u8 {
        match self {
            TargetState::NoKey => 6,
            TargetState::Unsupported => 5,
            TargetState::CircuitOpen => 4,
            TargetState::Parked => 3,
            TargetState::Saturated => 2,
            TargetState::HalfOpen => 1,
            TargetState::Ready => 0,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum CircuitState {
    #[default]
    Closed,
    Open,
    HalfOpen,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LastFailure {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    pub reason: String,
    /// RFC 3339.
    pub at: String,
}

/// Milliseconds: time to the full answer (unary) or to the first content event (streams).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Latency {
    /// Exponentially weighted moving average; `None` until measured.
    pub smoothed_ms: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_reported_without_a_revision_still_parses() {
        let older = r#"{"route":{"namespace":"team-a","name":"smart"},"generation":4,
            "requests":0,"attempts":0,"fallbacks":0,"failed":0,"targets":[]}"#;
        let r: RouteStats = serde_json::from_str(older).unwrap();
        assert_eq!((r.generation, r.revision), (4, None));
        let newer = r#"{"route":{"namespace":"team-a","name":"smart"},"generation":4,
            "revision":"00000000000000ff","requests":0,"attempts":0,"fallbacks":0,
            "failed":0,"targets":[]}"#;
        let r: RouteStats = serde_json::from_str(newer).unwrap();
        assert_eq!(
            r.revision.map(|r| r.to_string()).as_deref(),
            Some("00000000000000ff")
        );
    }
}
