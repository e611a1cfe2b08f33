//! What one try on one target is, to the walk and to what sends it: the plan made
//! before a target's tries (how the request reaches it, its body), one try's
//! context, what it came to (committed, or a failure with what the provider said),
//! and the [`Transport`] that carries it (HTTP in `send`, a script in the walk's
//! tests).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, Response, StatusCode};
use bytes::Bytes;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tracing::field::Empty;

use super::call::Call;
use super::stream::LineSlot;
use crate::config::snapshot::{RouteRt, TargetRt};
use crate::gateway::Gateway;
use crate::observe::reason::Reason;
use crate::observe::telemetry::TRACE_TARGET;
use crate::providers::Exchange;
use crate::providers::translate::Translation;

/// How a target is reached for this request, made once before its tries.
pub(super) struct Plan {
    pub exchange: Exchange,
    /// Set when the client's API is not the upstream's.
    pub translation: Option<Translation>,
    /// The upstream body.
    pub body: Bytes,
}

/// One try, as [`Transport::attempt`] gets it.
pub(super) struct Attempt<'a, 'c> {
    pub gw: &'a Gateway,
    pub route: &'a RouteRt,
    pub target: &'a TargetRt,
    pub call: &'a Call<'c>,
    pub plan: &'a Plan,
    /// Which of the credential's keys it is sent with (`KeyPool::pick`).
    pub key: u8,
    /// This try's deadline (the target's timeout, within the budget).
    pub deadline: Instant,
    /// The whole call's.
    pub budget: Instant,
    /// When this try started (the GenAI operation's duration runs from here).
    pub started: Instant,
    /// The credential's concurrency slot, held until the answer is out.
    pub permit: Option<OwnedSemaphorePermit>,
    pub span: &'a tracing::Span,
}

/// How a try reaches its provider: HTTP (`send::Http`), or a script in the walk's
/// tests.
pub(super) trait Transport {
    async fn attempt(&self, a: Attempt<'_, '_>) -> Attempted;
}

/// What one try came to.
pub(super) enum Attempted {
    /// The response, and for a stream where its log line goes.
    Committed(Response<Body>, Option<Arc<LineSlot>>),
    Failed(Failure),
}

/// A try that failed, or a target passed over: why, and what the provider said.
pub(super) struct Failure {
    pub reason: Reason,
    pub status: Option<u16>,
    pub retry_after: Option<Duration>,
    pub answer: Option<UpstreamAnswer>,
}

impl Failure {
    pub fn bare(reason: Reason) -> Self {
        Self {
            reason,
            status: None,
            retry_after: None,
            answer: None,
        }
    }
}

/// An upstream answer that is not a success, kept so it can be relayed unchanged.
pub(super) struct UpstreamAnswer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// An attempt's deadline passed: the call's budget when that is what ran out.
pub(super) fn timed_out(budget: Instant) -> Reason {
    if Instant::now() >= budget {
        Reason::Budget
    } else {
        Reason::Timeout
    }
}

/// The trace span of one upstream attempt (disabled, and free, unless traces are on).
pub(super) fn attempt_span(t: &TargetRt, call: &Call<'_>, try_no: u32) -> tracing::Span {
    let model = t.spec.upstream_model(call.client_model);
    let op = call.surface.operation();
    let provider = t.credential.adapter.system();
    tracing::info_span!(
        target: TRACE_TARGET,
        "attempt",
        otel.name = %format_args!("{op} {model}"),
        otel.kind = "client",
        gen_ai.operation.name = op,
        gen_ai.provider.name = provider,
        gen_ai.system = provider,
        gen_ai.request.model = model,
        server.address = &*t.credential.host,
        switchback.target = %t.label,
        switchback.try = try_no,
        http.response.status_code = Empty,
        error.type = Empty,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
    )
}
