//! The attempt pipeline: walk a route's targets in order, skip the ones that cannot
//! take the request before anything is sent, try each with retries, backoff and
//! Retry-After inside the call's budget, and either commit one upstream answer or
//! turn the last failure into the gateway's error.
//!
//! Nothing here holds a lock; per-target facts are atomics in `TargetState`. Dropping
//! the future (the client went away) drops the in-flight upstream request with it,
//! so nothing more is sent upstream.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode, header};
use bytes::Bytes;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, sleep_until, timeout_at};

use crate::config::snapshot::{RouteRt, TargetRt};
use crate::gateway::Gateway;
use crate::http::X_REQUEST_ID;
use crate::limits::circuit::{Admit, Probe, Transition};
use crate::limits::clients::ClientUsage;
use crate::limits::concurrency::Refused;
use crate::observe::counters;
use crate::observe::telemetry::TRACE_TARGET;
use crate::pipeline::order::order;
use crate::pipeline::outcome::{
    self, Reason, attempt_deadline, classify_status, may_advance, retryable,
};
use crate::pipeline::relay::{self, LineSlot, NotCommitted, relay};
use crate::providers::translate::{self, Direction};
use crate::providers::vertex;
use crate::upstream;
use crate::wire::json;
use crate::wire::rewrite::{JsonStr, replace_model, replace_top_level_model};
use crate::wire::surface::{self, AttemptView, Surface, Wire};
use switchback_crds::config::Provider;
use tracing::Instrument;
use tracing::field::Empty;

/// Client headers passed on to providers, besides `x-request-id` (`Call::request_id`).
/// Everything else (notably `authorization` and `x-api-key`) stays with the gateway.
/// Names, not strings: a `&str` lookup parses the name again on every request.
const FORWARDED: [HeaderName; 3] = [
    HeaderName::from_static("anthropic-version"),
    HeaderName::from_static("anthropic-beta"),
    HeaderName::from_static("openai-beta"),
];

/// Error bodies bigger than this are cut: they are read only to classify and relay.
const MAX_ERROR_BODY: usize = 1 << 20;

/// One client request, as the pipeline needs it.
pub struct Call<'a> {
    pub surface: Surface,
    /// The model name the client sent, as a JSON string literal (responses get it back).
    pub client_model: &'a str,
    pub client_model_json: JsonStr,
    pub body: Bytes,
    pub stream: bool,
    pub client_headers: &'a HeaderMap,
    /// The client's `x-request-id`, or the one the gateway made up; forwarded too.
    pub request_id: &'a HeaderValue,
    /// The LLMClient the request comes from: where its usage is counted.
    pub client: Option<&'a ClientUsage>,
    /// An OpenAI stream: the client's own `stream_options.include_usage` when
    /// already read (the body may then ask the provider for usage on the client's
    /// behalf, see `server`); `None`: read from `body` when needed.
    pub include_usage: Option<bool>,
    /// The body asks for the usage chunk the client did not: strip it (OpenAI
    /// upstreams; a translated stream answers as `include_usage` says anyway).
    pub strip_usage: bool,
}

/// One line of the attempt log.
#[derive(Debug, Clone, Copy)]
pub struct AttemptLog {
    pub target: u8,
    pub status: Option<u16>,
    pub reason: Reason,
    pub duration: Duration,
    pub retry_after: Option<Duration>,
}

/// What the pipeline answers, with the facts the response headers report.
pub struct Outcome {
    pub response: Response<Body>,
    /// Upstream requests sent.
    pub attempts: u32,
    /// Targets moved past before the one that answered (or the last one considered).
    pub fallbacks: u32,
    /// The credential that answered, if one did.
    pub target: Option<HeaderValue>,
    /// Index of the target that answered (in the route's declared order), if one did.
    pub answered_by: Option<u8>,
    pub log: Vec<AttemptLog>,
    /// For a committed stream: where to leave the request's log line, which the
    /// stream writes when it ends (with its real duration and how it ended).
    pub stream_line: Option<Arc<LineSlot>>,
}

/// An upstream answer that is not a success, kept so it can be relayed unchanged.
struct UpstreamAnswer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

struct Failure {
    reason: Reason,
    status: Option<u16>,
    retry_after: Option<Duration>,
    answer: Option<UpstreamAnswer>,
}

impl Failure {
    fn bare(reason: Reason) -> Self {
        Self {
            reason,
            status: None,
            retry_after: None,
            answer: None,
        }
    }
}

enum Attempted {
    /// The response, and for a stream where its log line goes.
    Committed(Response<Body>, Option<Arc<LineSlot>>),
    Failed(Failure),
}

pub async fn run(gw: &Gateway, route: &RouteRt, call: &Call<'_>) -> Outcome {
    let started = Instant::now();
    counters::inc(&route.counters.requests);
    let mut walk = Walk {
        gw,
        route,
        call,
        budget: started + Duration::from_millis(route.spec.timeout_ms),
        log: Vec::new(),
        sent: 0,
        waited: Duration::ZERO,
        shortest_retry_after: None,
        untranslatable: None,
    };
    let order = order(route, rand::random::<f64>());
    let order = order.as_slice();
    let mut last_real: Option<Failure> = None;
    let mut position = 0u32;
    let (mut skipped, mut skipped_open, mut skipped_unserved) = (0usize, 0usize, 0usize);
    // The first target skipped for its open circuit, and its position in the order.
    let mut first_open: Option<(usize, u8)> = None;

    let outcome = 'walk: {
        for (pos, &i) in order.iter().enumerate() {
            position = pos as u32;
            let t = &route.targets[i as usize];
            let failure = match walk.target(i, false).await {
                Tried::Answered(response, line) => {
                    break 'walk walk.answered(response, line, pos as u32, i);
                }
                Tried::Skipped(reason) => {
                    skipped += 1;
                    skipped_open += usize::from(reason == Reason::CircuitOpen);
                    skipped_unserved += usize::from(reason == Reason::UnsupportedSurface);
                    if reason == Reason::CircuitOpen && first_open.is_none() {
                        first_open = Some((pos, i));
                    }
                    if pos + 1 < order.len() {
                        t.counters.fallbacks_away.inc(reason);
                    }
                    continue;
                }
                Tried::Failed(f) => f,
            };
            if !may_advance(failure.reason, failure.status, &route.spec.fallback) {
                break 'walk walk.failed(failure, pos as u32);
            }
            if pos + 1 < order.len() {
                t.counters.fallbacks_away.inc(failure.reason);
            }
            last_real = Some(failure);
            if Instant::now() >= walk.budget {
                break;
            }
        }
        // Every target that can serve the API called skipped because its circuit is
        // open: try the first of them anyway, so a recovered provider is found even
        // when no probe is due; its failure is 503. (Targets that cannot serve the API
        // at all are no reason not to.)
        if walk.sent == 0
            && let Some((pos, first)) = first_open
            && skipped_open + skipped_unserved == skipped
        {
            break 'walk match walk.target(first, true).await {
                Tried::Answered(response, line) => walk.answered(response, line, pos as u32, first),
                Tried::Failed(_) | Tried::Skipped(_) => {
                    walk.failed(Failure::bare(Reason::CircuitOpen), position)
                }
            };
        }
        let last = last_real.unwrap_or_else(|| walk.all_skipped());
        walk.failed(last, position)
    };
    let total = started.elapsed();
    route.counters.duration.observe(total);
    route
        .counters
        .overhead
        .observe(total.saturating_sub(walk.waited));
    outcome
}

/// One request's walk along its route's targets.
struct Walk<'a, 'c> {
    gw: &'a Gateway,
    route: &'a RouteRt,
    call: &'a Call<'c>,
    budget: Instant,
    log: Vec<AttemptLog>,
    /// Upstream requests sent.
    sent: u32,
    /// Time spent waiting on providers, backoff and queues: everything that is not
    /// the gateway's own work.
    waited: Duration,
    shortest_retry_after: Option<Duration>,
    /// Why a target that needed translation could not take the request.
    untranslatable: Option<translate::TranslateError>,
}

enum Tried {
    Answered(Response<Body>, Option<Arc<LineSlot>>),
    Skipped(Reason),
    Failed(Failure),
}

impl Walk<'_, '_> {
    fn skip(&mut self, i: u8, reason: Reason) -> Tried {
        self.route.targets[i as usize].counters.failures.inc(reason);
        self.log.push(AttemptLog {
            target: i,
            status: None,
            reason,
            duration: Duration::ZERO,
            retry_after: None,
        });
        Tried::Skipped(reason)
    }

    /// Try target `i` with its retries. `forced` ignores an open circuit.
    async fn target(&mut self, i: u8, forced: bool) -> Tried {
        let (gw, route, call) = (self.gw, self.route, self.call);
        let t = &route.targets[i as usize];
        counters::inc(&t.counters.requests);
        if let Some(reason) = skip_reason(gw, route, t, call.surface) {
            return self.skip(i, reason);
        }
        let breaker = &t.state.breaker;
        let mut probe = match breaker.admit(Instant::now()) {
            Admit::Yes => None,
            Admit::Probe => Some(Probe::new(breaker)),
            // Tried although open: its success closes the circuit like a probe's.
            Admit::No if forced => Some(Probe::new(breaker)),
            Admit::No => return self.skip(i, Reason::CircuitOpen),
        };
        let provider = t.credential.spec.provider;
        let dir = direction(t, call);
        let body = match dir {
            Some(d) => {
                let defaults = translate::Defaults {
                    // Azure OpenAI takes it too (the v1 API, and dated versions since
                    // 2024-09-01-preview), and its reasoning deployments need it.
                    openai_max_completion_tokens: matches!(
                        provider,
                        Provider::Openai | Provider::AzureOpenai
                    ),
                    anthropic_on_vertex: provider == Provider::Vertex,
                    ..translate::Defaults::default()
                };
                let model = t.spec.upstream_model(call.client_model);
                match translate::request(d, &call.body, model, &defaults) {
                    Ok(b) => b,
                    Err(e) => {
                        // Another target may speak the client's API natively.
                        self.untranslatable = Some(e);
                        return self.skip(i, Reason::UnsupportedParameter);
                    }
                }
            }
            // Claude on Vertex for an Anthropic client: the model is in the URL.
            None if provider == Provider::Vertex => match vertex::anthropic_body(&call.body) {
                Some(b) => b,
                None => return self.skip(i, Reason::UnsupportedParameter),
            },
            None => match t.upstream_model_json(call.client_model) {
                Some(m) => {
                    replace_top_level_model(&call.body, m).unwrap_or_else(|| call.body.clone())
                }
                None => call.body.clone(),
            },
        };
        let cb = &route.spec.circuit_breaker;
        let mut tries = 0u32;
        loop {
            tries += 1;
            if Instant::now() >= self.budget {
                return Tried::Failed(Failure::bare(Reason::Budget));
            }
            let permit = match &t.credential.limiter {
                None => None,
                Some(l) => {
                    let queued = Instant::now();
                    let got = l.acquire(self.budget).await;
                    self.waited += queued.elapsed();
                    match got {
                        Ok(p) => Some(p),
                        // A full queue moves on at once, without spending a retry.
                        Err(Refused::QueueFull) => return self.skip(i, Reason::QueueFull),
                        Err(Refused::Deadline) => {
                            return Tried::Failed(Failure::bare(Reason::Budget));
                        }
                    }
                }
            };
            let now = Instant::now();
            self.sent += 1;
            counters::inc(&route.counters.attempts);
            counters::inc(&t.counters.attempts);
            if tries > 1 {
                counters::inc(&t.counters.retries);
            }
            let deadline = attempt_deadline(now, &t.spec, self.budget);
            let span = attempt_span(t, call, tries);
            let budget = self.budget;
            let send = || {
                attempt(
                    gw,
                    t,
                    call,
                    dir,
                    body.clone(),
                    deadline,
                    budget,
                    route,
                    permit,
                    &span,
                )
            };
            // Without traces the span is disabled: skip the wrapper. The future is made
            // in each branch, not bound to a local: an awaited local is kept in this
            // future's state twice (before and after the move into `.await`).
            let result = if span.is_disabled() {
                send().await
            } else {
                send().instrument(span.clone()).await
            };
            match &result {
                Attempted::Committed(r, _) => {
                    span.record("http.response.status_code", r.status().as_u16())
                }
                Attempted::Failed(f) => span
                    .record("http.response.status_code", f.status)
                    .record("error.type", f.reason.as_str()),
            };
            let elapsed = now.elapsed();
            self.waited += elapsed;
            t.counters.attempt_duration.observe(elapsed);
            let f = match result {
                Attempted::Committed(response, line) => {
                    // A stream's verdict (success or failure, for stats and the
                    // circuit) comes at its end, see `relay::Ending`; its first
                    // content closes a half-open circuit.
                    let streamed = line.is_some();
                    let verdict = !streamed || probe.is_some();
                    if verdict && breaker.success(probe.is_some()) == Transition::Closed {
                        tracing::info!(target_credential = %t.label, model = t.model(call.client_model), "circuit closed");
                    }
                    if let Some(p) = probe.take() {
                        p.done();
                    }
                    t.state.observe_latency(elapsed);
                    t.state.latency.observe(elapsed);
                    if streamed {
                        t.counters.ttfb.observe(elapsed);
                    } else {
                        counters::inc(&t.counters.successes);
                    }
                    return Tried::Answered(response, line);
                }
                Attempted::Failed(f) => f,
            };
            t.counters.failures.inc(f.reason);
            t.state.record_failure(f.status, f.reason);
            self.log.push(AttemptLog {
                target: i,
                status: f.status,
                reason: f.reason,
                duration: elapsed,
                retry_after: f.retry_after,
            });
            tracing::debug!(route = %route.spec.id, target = %t.label, status = ?f.status,
                reason = f.reason.as_str(), try_no = tries, "attempt failed");
            if f.reason.trips_breaker(f.status) {
                let open_for = Duration::from_millis(cb.open_for_ms);
                let tr = breaker.failure(
                    Instant::now(),
                    cb.consecutive_failures,
                    open_for,
                    probe.is_some(),
                );
                if let Some(p) = probe.take() {
                    p.done();
                }
                if matches!(tr, Transition::Opened | Transition::Reopened) {
                    tracing::warn!(target_credential = %t.label, model = t.model(call.client_model), reason = f.reason.as_str(),
                        "circuit opened");
                    return Tried::Failed(f); // an open circuit advances at once
                }
            } else {
                // Says nothing about the provider's health: let another request probe.
                drop(probe.take());
            }
            // A provider's number: everything below saturates or is checked.
            let cap = Duration::from_millis(route.spec.fallback.max_retry_after_ms);
            if let Some(ra) = f.retry_after {
                if f.reason == Reason::RateLimited {
                    // Parked for later requests too, never longer than the cap.
                    let park = ra.min(cap);
                    t.state
                        .park_until(gw.now_ms().saturating_add(outcome::millis(park)));
                    self.shortest_retry_after =
                        Some(self.shortest_retry_after.map_or(park, |s| s.min(park)));
                }
                if ra > cap {
                    return Tried::Failed(f); // abandon this target at once
                }
            }
            if tries >= t.spec.retry.attempts || !retryable(f.reason, f.status, &t.spec.retry) {
                return Tried::Failed(f);
            }
            let wait = match f.retry_after {
                Some(ra) if t.spec.retry.honour_retry_after => ra,
                _ => outcome::backoff(tries, &t.spec.retry, rand::random::<f64>()),
            };
            let Some(resume) = Instant::now()
                .checked_add(wait)
                .filter(|r| *r < self.budget)
            else {
                return Tried::Failed(f); // the wait does not fit the budget: let the next target try
            };
            sleep_until(resume).await;
            self.waited += wait;
        }
    }

    fn answered(
        &mut self,
        response: Response<Body>,
        stream_line: Option<Arc<LineSlot>>,
        pos: u32,
        i: u8,
    ) -> Outcome {
        if pos > 0 {
            counters::inc(&self.route.counters.fallbacks);
        }
        Outcome {
            response,
            attempts: self.sent,
            fallbacks: pos,
            target: Some(
                self.route.targets[i as usize]
                    .credential
                    .target_header
                    .clone(),
            ),
            answered_by: Some(i),
            log: std::mem::take(&mut self.log),
            stream_line,
        }
    }

    fn failed(&mut self, failure: Failure, fallbacks: u32) -> Outcome {
        counters::inc(&self.route.counters.failed);
        // Nothing was sent and a target refused the request's parameters: that is the
        // answer (a 400 naming the parameter), not "no target available".
        if self.sent == 0
            && let Some(e) = self.untranslatable.take()
        {
            return Outcome {
                response: surface::json_response(
                    StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST),
                    e.body(self.call.surface.wire()),
                ),
                attempts: 0,
                fallbacks,
                target: None,
                answered_by: None,
                log: std::mem::take(&mut self.log),
                stream_line: None,
            };
        }
        finish_failed(
            self.route,
            self.call,
            failure,
            self.sent,
            fallbacks,
            std::mem::take(&mut self.log),
            self.shortest_retry_after,
        )
    }

    /// Nothing was sent: every target was skipped. Parked everywhere answers 429 with
    /// the soonest end of a park; no target that can serve the API called at all, a
    /// 400 saying so (see `finish_failed`).
    fn all_skipped(&mut self) -> Failure {
        let all = |reason| !self.log.is_empty() && self.log.iter().all(|l| l.reason == reason);
        if all(Reason::UnsupportedSurface) {
            return Failure::bare(Reason::UnsupportedSurface);
        }
        if !all(Reason::Parked) {
            return Failure::bare(Reason::MissingKey);
        }
        let now = self.gw.now_ms();
        let soonest = self
            .route
            .targets
            .iter()
            .map(|t| t.state.parked_until_ms().saturating_sub(now))
            .min()
            .unwrap_or(0);
        self.shortest_retry_after = Some(Duration::from_millis(soonest));
        Failure::bare(Reason::Parked)
    }
}

/// The translation a request needs on target `t`: by its provider, and on Vertex by
/// the model's publisher too.
fn direction(t: &TargetRt, call: &Call<'_>) -> Option<Direction> {
    match t.credential.spec.provider {
        Provider::Vertex => vertex::direction(call.surface, t.model(call.client_model)),
        p => Direction::for_target(call.surface, p),
    }
}

/// The trace span of one upstream attempt (disabled, and free, unless traces are on).
fn attempt_span(t: &TargetRt, call: &Call<'_>, try_no: u32) -> tracing::Span {
    let model = t.spec.upstream_model(call.client_model);
    let op = call.surface.operation();
    let provider = match t.credential.spec.provider {
        Provider::Anthropic => "anthropic",
        Provider::Openai | Provider::OpenaiCompatible => "openai",
        Provider::AzureOpenai => "azure.ai.openai",
        Provider::Gemini => "gcp.gemini",
        Provider::Vertex => "gcp.vertex_ai",
        Provider::Bedrock => "aws.bedrock",
    };
    tracing::info_span!(
        target: TRACE_TARGET,
        "attempt",
        otel.name = %format_args!("{op} {model}"),
        otel.kind = "client",
        gen_ai.operation.name = op,
        gen_ai.provider.name = provider,
        gen_ai.system = provider,
        gen_ai.request.model = model,
        server.address = t.credential.urls[call.surface.index()].host().unwrap_or(""),
        switchback.target = %t.label,
        switchback.try = try_no,
        http.response.status_code = Empty,
        error.type = Empty,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
    )
}

/// A target passed over before anything is sent to it, for a reason known without
/// asking anyone. (Open circuits and full queues are checked as the target is tried.)
fn skip_reason(gw: &Gateway, route: &RouteRt, t: &TargetRt, surface: Surface) -> Option<Reason> {
    let credential = &t.credential.spec;
    let serves = match credential.provider {
        Provider::Vertex => vertex::serves(surface),
        p => surface.served_by(credential) || Direction::for_target(surface, p).is_some(),
    };
    if !serves {
        return Some(Reason::UnsupportedSurface);
    }
    if t.credential.headers.is_none() {
        return Some(Reason::MissingKey);
    }
    if t.state
        .parked(gw.now_ms(), route.spec.fallback.max_retry_after_ms)
    {
        return Some(Reason::Parked);
    }
    None
}

#[allow(clippy::too_many_arguments)]
async fn attempt(
    gw: &Gateway,
    t: &TargetRt,
    call: &Call<'_>,
    dir: Option<Direction>,
    body: Bytes,
    deadline: Instant,
    budget: Instant,
    route: &RouteRt,
    permit: Option<OwnedSemaphorePermit>,
    span: &tracing::Span,
) -> Attempted {
    let timed_out = || {
        Attempted::Failed(Failure::bare(if Instant::now() >= budget {
            Reason::Budget
        } else {
            Reason::Timeout
        }))
    };
    let cred = &t.credential;
    let Some(auth) = &cred.headers else {
        return Attempted::Failed(Failure::bare(Reason::MissingKey));
    };
    let mut headers = auth.clone();
    let vertex = cred.spec.provider == Provider::Vertex;
    if let Some(v) = &cred.vertex {
        // Boxed: the token exchange is a large future, and held inline it would grow
        // every attempt's state (and each future above it, copied as it is built) for
        // the one provider that needs it.
        match Box::pin(vertex_bearer(v, cred, t, deadline, budget)).await {
            Ok(bearer) => headers.insert(header::AUTHORIZATION, bearer),
            Err(f) => return Attempted::Failed(f),
        };
    }
    headers.insert(X_REQUEST_ID, call.request_id.clone());
    let upstream_wire = dir.map_or(Some(call.surface.wire()), Direction::upstream_wire);
    for name in FORWARDED {
        // A provider gets only the client headers of its own API (Gemini: none;
        // Claude on Vertex takes its version in the body, see `vertex`).
        let own = match upstream_wire {
            Some(Wire::Anthropic) if vertex => name == "anthropic-beta",
            Some(Wire::Anthropic) => name != "openai-beta",
            Some(Wire::OpenAi) => !name.as_str().starts_with("anthropic-"),
            None => false,
        };
        if own && let Some(v) = call.client_headers.get(&name) {
            headers.insert(name, v.clone());
        }
    }
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    crate::observe::telemetry::propagate(span, call.client_headers, &mut headers);
    let uri = match dir.map_or(Some(call.surface), Direction::upstream_surface) {
        // Gemini and Vertex: the model and the method are in the URL.
        _ if vertex => t.model_url(call.client_model, call.stream),
        Some(surface) => t.url(surface, call.client_model),
        // Gemini, Bedrock: the model and the method are in the URL.
        None => t.model_url(call.client_model, call.stream),
    };
    let Some(uri) = uri else {
        // A deployment or model name no URL can carry: nothing was sent.
        return Attempted::Failed(Failure::bare(Reason::UnsupportedParameter));
    };
    // Bedrock: SigV4 over the final URL, headers and body, signed now (the
    // signature is valid for minutes, each retry signs anew).
    if let Some(signer) = &cred.signer
        && let Err(e) = signer.sign(&uri, &mut headers, &body, SystemTime::now())
    {
        tracing::debug!(target = %t.label, error = %e, "request not signed");
        return Attempted::Failed(Failure::bare(Reason::UnsupportedParameter));
    }
    let mut request = hyper::Request::new(upstream::Body::new(body));
    *request.method_mut() = Method::POST;
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;

    let response = match timeout_at(deadline, cred.client.here().request(request)).await {
        Err(_) => return timed_out(),
        Ok(Err(e)) => {
            tracing::debug!(target = %t.label, error = %e, "upstream transport error");
            return Attempted::Failed(Failure::bare(Reason::ConnectionError));
        }
        Ok(Ok(r)) => r,
    };
    let (parts, response) = response.into_parts();
    let (status, headers) = (parts.status, parts.headers);
    if status.is_success() {
        if relay::is_encoded(&headers) {
            // Asked for `identity` and sent something else: unusable here.
            return Attempted::Failed(Failure::bare(Reason::InvalidResponse));
        }
        // Bedrock streams in AWS event-stream framing, every other upstream in SSE.
        let stream_type = match dir {
            Some(d) if d.to_bedrock() => "application/vnd.amazon.eventstream",
            _ => "text/event-stream",
        };
        let is_sse = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with(stream_type));
        let limits = &gw.upstream_limits;
        if call.stream && is_sse {
            let stream = relay::StreamAttempt {
                target: t,
                route,
                max_event_bytes: limits.max_event_bytes,
                refused: &gw.refused,
                model: &call.client_model_json,
                surface: call.surface,
                translator: dir.map(|d| {
                    let usage = call
                        .include_usage
                        .unwrap_or_else(|| translate::include_usage(&call.body));
                    (d, call.client_model, usage)
                }),
                permit,
                client: call.client.cloned(),
                price: t.spec.price,
                strip_usage: call.strip_usage && dir.is_none(),
            };
            // Boxed for the same reason as the vertex token: the opening of a stream is
            // most of an attempt's state, and a unary call would carry it too.
            return match Box::pin(relay::start_stream(
                status, headers, response, deadline, stream,
            ))
            .await
            {
                Ok((response, line)) => Attempted::Committed(response, Some(line)),
                Err(NotCommitted::TimedOut) => timed_out(),
                Err(NotCommitted::Failed(reason, status)) => Attempted::Failed(Failure {
                    reason,
                    status,
                    retry_after: None,
                    answer: None,
                }),
            };
        }
        let (bytes, held) = match timeout_at(
            deadline,
            relay::read_capped(response, limits.max_response_bytes, &gw.answers),
        )
        .await
        {
            Err(_) => return timed_out(),
            Ok(Err(_)) => return Attempted::Failed(Failure::bare(Reason::ConnectionError)),
            Ok(Ok(relay::Capped::TooLarge)) => {
                gw.refused.responses.fetch_add(1, Ordering::Relaxed);
                return Attempted::Failed(Failure::bare(Reason::ResponseTooLarge));
            }
            Ok(Ok(relay::Capped::OverBudget)) => {
                gw.refused.over_budget.fetch_add(1, Ordering::Relaxed);
                return Attempted::Failed(Failure::bare(Reason::Overloaded));
            }
            Ok(Ok(relay::Capped::Whole(bytes, held))) => (bytes, held),
        };
        return unary_answer(t, call, dir, status, headers, bytes, held);
    }

    let body = match timeout_at(deadline, relay::read_cut(response, MAX_ERROR_BODY)).await {
        Err(_) => return timed_out(),
        Ok(Err(_)) => return Attempted::Failed(Failure::bare(Reason::ConnectionError)),
        // A body the proxy cannot read is not relayed as if it were plain: the
        // status alone answers.
        Ok(Ok(_)) if relay::is_encoded(&headers) => Bytes::new(),
        // Some providers echo the key they refused: never relayed to the client.
        Ok(Ok(b)) => match &cred.key {
            Some(key) => relay::mask_key(b, key.expose()),
            None => b,
        },
    };
    let code = status.as_u16();
    // Bedrock names the error in a header: written into the body, and the status
    // it classes as (a model still loading is overload, not a rate limit).
    let (class_code, body) = match dir {
        Some(d) if d.to_bedrock() => translate::bedrock_error(
            code,
            headers
                .get("x-amzn-errortype")
                .and_then(|v| v.to_str().ok()),
            &body,
        ),
        _ => (code, body),
    };
    let reason = classify_status(class_code, &body);
    Attempted::Failed(Failure {
        reason,
        status: Some(code),
        retry_after: if code == 429 || code == 503 {
            // The header, else Google's RetryInfo in the body.
            outcome::retry_after(&headers, SystemTime::now())
                .or_else(|| outcome::retry_delay(&body))
        } else {
            None
        },
        answer: Some(UpstreamAnswer {
            status,
            headers,
            // Classified on the provider's own words; relayed in the client's shape.
            body: match dir {
                Some(d) => translate::error(d, code, &body),
                // Claude on Vertex: the platform's refusals are Google-shaped.
                None if vertex => translate::anthropic_error(code, &body).unwrap_or(body),
                None => body,
            },
        }),
    })
}

/// A vertex request's `authorization`: the credential's token, cached or exchanged
/// (through the credential's own client, so its network guard) before `deadline`.
/// Any failure to get one is an `authError` (SPEC §10), logged without key material;
/// only the call's budget running out is not.
async fn vertex_bearer(
    auth: &vertex::Auth,
    cred: &crate::config::snapshot::CredentialRt,
    t: &TargetRt,
    deadline: Instant,
    budget: Instant,
) -> Result<HeaderValue, Failure> {
    let error = match timeout_at(deadline, auth.bearer(cred.client.here())).await {
        Ok(Ok(bearer)) => return Ok(bearer),
        Ok(Err(e)) => e.to_string(),
        Err(_) if Instant::now() >= budget => return Err(Failure::bare(Reason::Budget)),
        Err(_) => "no token before the attempt's deadline".to_owned(),
    };
    tracing::warn!(target_credential = %t.label, error = %error, "vertex token exchange failed");
    Err(Failure::bare(Reason::AuthError))
}

/// A unary 2xx, read whole: usage counted, then given the client's `model` or
/// translated into the client's API. One the client could not use (truncated, HTML,
/// not JSON, not translatable) is the provider's failure, before anything is
/// committed.
fn unary_answer(
    t: &TargetRt,
    call: &Call<'_>,
    dir: Option<Direction>,
    status: StatusCode,
    headers: HeaderMap,
    bytes: Bytes,
    held: relay::AnswerHeld,
) -> Attempted {
    // A translation parses the answer anyway; only a relayed one needs the check.
    // Is it one whole JSON object (what every unary answer of both APIs is)? A scan
    // that builds nothing: see `json`.
    if dir.is_none() && !json::is_object(&bytes) {
        return Attempted::Failed(Failure::bare(Reason::InvalidResponse));
    }
    let usage = match dir {
        Some(d) if d.to_gemini() => counters::gemini_usage(&bytes),
        Some(d) if d.to_bedrock() => counters::bedrock_usage(&bytes),
        _ => counters::usage(&bytes),
    };
    if let Some(u) = usage {
        t.counters.add_usage(u);
        if let Some(c) = call.client {
            c.record(u, t.spec.price.as_ref());
        }
        tracing::Span::current()
            .record("gen_ai.usage.input_tokens", u.input_tokens)
            .record("gen_ai.usage.output_tokens", u.output_tokens);
    }
    // A Gemini prompt blocked by its safety filters is a 200 without an answer: the
    // request's fault, like Azure's content filter, answered (translated: no content,
    // stopped as a refusal) unless the route fails over on `contentFilter`.
    let blocked = dir.is_some_and(|d| translate::is_blocked(d, &bytes));
    let bytes = match dir {
        None => replace_model(&bytes, &call.client_model_json).unwrap_or(bytes),
        Some(d) => match translate::response(d, &bytes, call.client_model) {
            Ok(b) => b,
            Err(e) => {
                tracing::debug!(target = %t.label, error = %e, "untranslatable upstream answer");
                return Attempted::Failed(Failure::bare(Reason::InvalidResponse));
            }
        },
    };
    if blocked {
        return Attempted::Failed(Failure {
            reason: Reason::ContentFilter,
            status: Some(status.as_u16()),
            retry_after: None,
            answer: Some(UpstreamAnswer {
                status,
                headers,
                body: bytes,
            }),
        });
    }
    // The reservation goes with the answer until its last byte is handed on.
    let body = Body::new(relay::HeldAnswer::new(bytes, held));
    Attempted::Committed(relay(status, headers, body), None)
}

fn finish_failed(
    route: &RouteRt,
    call: &Call<'_>,
    failure: Failure,
    sent: u32,
    fallbacks: u32,
    log: Vec<AttemptLog>,
    shortest_retry_after: Option<Duration>,
) -> Outcome {
    let wire = call.surface.wire();
    if failure.reason.returns_upstream_answer()
        && let Some(a) = failure.answer
    {
        let last_target = log.last().map(|l| {
            route.targets[l.target as usize]
                .credential
                .target_header
                .clone()
        });
        return Outcome {
            response: relay(a.status, a.headers, Body::from(a.body)),
            attempts: sent,
            fallbacks,
            target: last_target,
            answered_by: None,
            log,
            stream_line: None,
        };
    }
    let (status, code, message): (_, _, std::borrow::Cow<'_, str>) = match failure.reason {
        // Nothing but targets that cannot serve the API called: still SPEC §3's 503
        // for "all skipped", but the message says which targets and why.
        Reason::UnsupportedSurface if log.iter().all(|l| l.reason == failure.reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "no_available_target",
            unsupported_surface(route, call.surface, &log).into(),
        ),
        Reason::RateLimited | Reason::Parked => (
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            "every target of this route is rate limited".into(),
        ),
        Reason::Timeout | Reason::Budget => (
            StatusCode::GATEWAY_TIMEOUT,
            "upstream_timeout",
            "no target answered within the time allowed".into(),
        ),
        Reason::Status5xx
        | Reason::ConnectionError
        | Reason::InvalidResponse
        | Reason::ResponseTooLarge
        | Reason::EventTooLarge => (
            StatusCode::BAD_GATEWAY,
            "all_providers_failed",
            "every target that was tried failed".into(),
        ),
        // Every target skipped: missing keys, open circuits, full queues (some of them
        // perhaps also unable to serve the API called).
        Reason::MissingKey
        | Reason::UnsupportedSurface
        | Reason::CircuitOpen
        | Reason::QueueFull
        | Reason::UnsupportedParameter => (
            StatusCode::SERVICE_UNAVAILABLE,
            "no_available_target",
            "no target of this route can take the request".into(),
        ),
        // No answer to relay: Vertex's token exchange failed.
        Reason::AuthError if failure.answer.is_none() && failure.status.is_none() => (
            StatusCode::BAD_GATEWAY,
            "upstream_auth_error",
            "the gateway could not get an access token for the provider".into(),
        ),
        // A 4xx class that came without an answer to relay (an in-band stream error).
        Reason::ContextLength | Reason::AuthError | Reason::ClientError | Reason::ContentFilter => {
            (
                StatusCode::BAD_GATEWAY,
                "upstream_error",
                "the provider rejected the request in its stream".into(),
            )
        }
        // The answer came but this replica may hold no more answers now: the same
        // answer as for a body over the in-flight budget.
        Reason::Overloaded => (
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            "the gateway holds as many provider answers as it may; retry in a second".into(),
        ),
    };
    let views: Vec<AttemptView<'_>> = log
        .iter()
        .map(|l| {
            let t = &route.targets[l.target as usize];
            AttemptView {
                target: &t.label,
                model: t.spec.upstream_model(call.client_model),
                status: l.status,
                reason: l.reason.as_str(),
                duration_ms: l.duration.as_millis() as u64,
            }
        })
        .collect();
    let body = surface::error_body(wire, status.as_u16(), code, &message, &views);
    let mut response = surface::json_response(status, body);
    if status == StatusCode::TOO_MANY_REQUESTS
        && let Some(ra) = shortest_retry_after
    {
        // Round up: a client that waits the whole seconds given must not be early.
        let secs = outcome::millis(ra).div_ceil(1000);
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    if failure.reason == Reason::Overloaded {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    Outcome {
        response,
        attempts: sent,
        fallbacks,
        target: None,
        answered_by: None,
        log,
        stream_line: None,
    }
}

/// Why no target of the route can serve the API the client called (the Responses
/// API on a route of Anthropic targets, embeddings on one of Anthropic targets):
/// each target and what it is.
fn unsupported_surface(route: &RouteRt, surface: Surface, log: &[AttemptLog]) -> String {
    let why: Vec<String> = log
        .iter()
        .map(|l| {
            let t = &route.targets[l.target as usize];
            format!("{} is {}", t.label, surface.refusal(&t.credential.spec))
        })
        .collect();
    format!(
        "no target of route {} can serve {}: {}",
        route.spec.id,
        surface.endpoint(),
        why.join("; ")
    )
}
