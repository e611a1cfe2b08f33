//! The fleet's health view (issue 32 item 5, `docs/request-lifecycle.md#one-view-across-replicas`):
//! what the operator, having read every proxy replica's stats, tells all of them about
//! circuits and keys, in one ConfigMap of the gateway namespace ([`VIEW_NAME`]) that
//! each proxy watches by name.
//!
//! It names targets (credential + upstream model) and keys by their data-key name;
//! it never holds a key value. Times are wall-clock RFC 3339 with milliseconds, as in
//! the stats document. The whole view lapses at `expiresAt`: a replica that holds an
//! expired view (the operator or the API server gone) drops it and goes by its own
//! findings alone.

use serde::{Deserialize, Serialize};

use crate::config::ObjectId;

/// The ConfigMap's fixed name, in the gateway namespace.
pub const VIEW_NAME: &str = "switchback-health";
/// Its data key holding the JSON document.
pub const DATA_KEY: &str = "view.json";
/// Bump on an incompatible change of the document.
pub const VIEW_VERSION: u32 = 1;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetView {
    pub version: u32,
    /// RFC 3339: after this, the view is void and each replica goes by its own.
    pub expires_at: String,
    /// Targets whose circuit the replicas disagree on, or that is open somewhere.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<TargetView>,
    /// Keys set aside on some replica.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<KeyView>,
}

/// What the fleet knows of one target's circuit: the latest transition any replica
/// reports.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TargetView {
    pub credential: ObjectId,
    /// Upstream model; `None` = the name the client sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub circuit: FleetCircuit,
    /// RFC 3339: when the first replica to see the circuit in this state saw it so.
    pub since: String,
    /// RFC 3339, while open: when it is next due to be probed (the opener's end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    /// While open: the `instanceId` of the one replica that probes it; the others
    /// leave it to that one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prober: Option<String>,
}

#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub enum FleetCircuit {
    #[default]
    Open,
    /// A success closed it after it opened: replicas still open close too.
    Closed,
}

/// One key set aside somewhere: the latest ends any replica reports.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyView {
    pub credential: ObjectId,
    /// The Secret data key holding it (never its value).
    pub name: String,
    /// RFC 3339: a 429's park ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parked_until: Option<String>,
    /// RFC 3339: a 401/403's rejection ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected_until: Option<String>,
}

impl FleetView {
    /// Nothing to tell.
    pub fn is_empty(&self) -> bool {
        self.targets.is_empty() && self.keys.is_empty()
    }
}

/// Milliseconds since the Unix epoch of an RFC 3339 time (`None` if it does not read).
pub fn parse_ms(s: &str) -> Option<u64> {
    let t = humantime::parse_rfc3339_weak(s).ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as u64)
}

/// RFC 3339 with milliseconds, as the stats document writes it.
pub fn format_ms(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_at_millisecond_precision() {
        let ms = 1_780_000_000_123;
        assert_eq!(parse_ms(&format_ms(ms)), Some(ms));
        assert_eq!(parse_ms("2026-12-06T09:00:00.5Z"), Some(1_796_547_600_500));
        assert_eq!(parse_ms("yesterday"), None);
    }
}
