//! The request log line: one structured line per request (target
//! `switchback::request`), with the route, the client (never its key), who
//! answered, the fallback provider and model when it was not the first target, and
//! the attempt log as compact JSON. A stream's is written when the stream ends, and
//! says how (and `usage = "estimated"` when its usage was estimated).

use std::sync::Arc;

use axum::http::HeaderValue;

use crate::config::snapshot::RouteRt;
use crate::pipeline::{AttemptLog, ResumeLog};

/// One structured line per request: the route, who answered, the fallback provider
/// and model when it was not the first target, and the attempt log. A stream's is
/// written when the stream ends, and says how (`stream`).
pub(super) struct RequestLine {
    /// The LLMClient (`namespace/name`) with `--auth required`; never its key.
    pub client: Option<Arc<str>>,
    pub status: u16,
    pub attempts: u32,
    pub fallbacks: u32,
    pub answered_by: Option<u8>,
    pub log: Vec<AttemptLog>,
    /// `x-request-id`: the client's, or the one made for the request.
    pub request_id: HeaderValue,
    /// A stream whose route resumes: its resumes, who continued it last, and why its
    /// last failure was not resumed (docs/streaming.md#resume-after-commit).
    pub resume: Option<(u32, Option<u8>, Option<&'static str>)>,
    /// `estimated`: the usage was estimated (a stream its client left mid-answer,
    /// docs/tenancy.md#a-client-that-leaves-still-pays); absent when the providers reported it.
    pub usage: Option<&'static str>,
}

impl RequestLine {
    /// What the stream's resumes add: the failures after commit and the
    /// continuations' attempts in the attempt log, the upstream requests they sent.
    pub(super) fn resumed(&mut self, r: ResumeLog) {
        self.attempts += r.sent;
        self.log.extend(r.log);
        self.resume = Some((r.resumes, r.resumed_by, r.outcome.map(|o| o.as_str())));
    }

    pub(super) fn write(
        &self,
        route: &RouteRt,
        model: &str,
        took: std::time::Duration,
        stream: Option<&str>,
    ) {
        let answered = self.answered_by.map(|i| &route.targets[i as usize]);
        let fell_back = self.fallbacks > 0 && answered.is_some();
        let fallback_provider = answered.filter(|_| fell_back).map(|t| t.label.as_str());
        let fallback_model = answered
            .filter(|_| fell_back)
            .map(|t| t.spec.upstream_model(model));
        let (resumes, resumed_by, resume_outcome) = match self.resume {
            Some((n, by, outcome)) => (
                Some(n),
                by.map(|i| route.targets[i as usize].label.as_str()),
                outcome,
            ),
            None => (None, None, None),
        };
        tracing::info!(
            target: "switchback::request",
            route = %route.spec.id,
            client = self.client.as_deref(),
            generation = route.spec.generation,
            request_id = self.request_id.to_str().unwrap_or_default(),
            model,
            status = self.status,
            served_by = answered.map(|t| t.label.as_str()),
            fallback_provider,
            fallback_model,
            attempts = self.attempts,
            fallbacks = self.fallbacks,
            duration_ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
            stream,
            resumes,
            resumed_by,
            resume_outcome,
            usage = self.usage,
            attempt_log = %AttemptLogView { route, log: &self.log },
            "request"
        );
    }
}

/// The attempt log as compact JSON: `[{"target","status","reason","durationMs","retryAfterMs"}]`.
struct AttemptLogView<'a> {
    route: &'a RouteRt,
    log: &'a [AttemptLog],
}

impl std::fmt::Display for AttemptLogView<'_> {
    // Pieces written one by one: no format string to interpret, no number formatting
    // machinery, nothing allocated (this runs for every request).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut n = itoa::Buffer::new();
        f.write_str("[")?;
        for (i, l) in self.log.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(r#"{"target":""#)?;
            f.write_str(&self.route.targets[l.target as usize].label)?;
            f.write_str(r#"","status":"#)?;
            f.write_str(l.status.map_or("null", |s| n.format(s)))?;
            f.write_str(r#","reason":""#)?;
            f.write_str(l.reason.as_str())?;
            f.write_str(r#"","durationMs":"#)?;
            f.write_str(n.format(l.duration.as_millis()))?;
            if let Some(ra) = l.retry_after {
                f.write_str(r#","retryAfterMs":"#)?;
                f.write_str(n.format(ra.as_millis()))?;
            }
            f.write_str("}")?;
        }
        f.write_str("]")
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use switchback_crds::config::Strategy;

    use super::*;
    use crate::observe::reason::Reason;

    #[test]
    fn the_attempt_log_is_compact_json() {
        let route =
            crate::pipeline::order::tests::route(Strategy::Fallback, vec![(1, None), (1, None)]);
        let log = [
            AttemptLog {
                target: 0,
                status: Some(503),
                reason: Reason::Status5xx,
                duration: Duration::from_millis(12),
                retry_after: Some(Duration::from_secs(2)),
            },
            AttemptLog {
                target: 1,
                status: None,
                reason: Reason::ConnectionError,
                duration: Duration::ZERO,
                retry_after: None,
            },
        ];
        let text = AttemptLogView {
            route: &route,
            log: &log,
        }
        .to_string();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            v,
            serde_json::json!([
                {"target": "ns/c", "status": 503, "reason": Reason::Status5xx.as_str(),
                 "durationMs": 12, "retryAfterMs": 2000},
                {"target": "ns/c", "status": null, "reason": "connectionError", "durationMs": 0},
            ])
        );
        assert_eq!(
            AttemptLogView {
                route: &route,
                log: &[]
            }
            .to_string(),
            "[]"
        );
    }
}
