//! HTTP front: the data-plane endpoints (OpenAI- and Anthropic-compatible) and the
//! admin endpoints. Handlers pick the route by the body's `model`, hand the call to
//! the attempt pipeline, and stamp the `x-switchback-*` and `x-request-id` headers
//! on every response.

pub mod auth;

use std::borrow::Cow;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use axum::routing::{get, post};
use serde::Deserialize;

use crate::admin::metrics;
use crate::config::snapshot::{RouteRt, Snapshot, Tenant};
use crate::front::intake::{self, Refused};
use crate::gateway::Gateway;
use crate::limits::clients::{Admitted, ClientRt, Throttled};
use crate::observe::telemetry::TRACE_TARGET;
use crate::pipeline::{self, AttemptLog, Call, StreamEnd};
use crate::wire::headers::{
    X_ATTEMPTS, X_FALLBACKS, X_GENERATION, X_REQUEST_ID, X_ROUTE, X_TARGET,
};
use crate::wire::surface::{self, Surface, Wire};
use tracing::Instrument;
use tracing::field::Empty;

/// The body limit and timeout are applied by [`intake`], not by an extractor.
pub fn data_router(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/messages", post(messages))
        .route("/v1/responses", post(responses))
        .route("/v1/models", get(models))
        .fallback(|State(gw), headers| not_served(gw, headers, StatusCode::NOT_FOUND))
        .method_not_allowed_fallback(|State(gw), headers| {
            not_served(gw, headers, StatusCode::METHOD_NOT_ALLOWED)
        })
        .with_state(gw)
}

/// A path (404) or method (405) the data port does not serve, in the OpenAI shape,
/// with the headers every answer carries.
async fn not_served(gw: Arc<Gateway>, headers: HeaderMap, status: StatusCode) -> Response<Body> {
    let mut r = gateway_error(
        Wire::OpenAi,
        status,
        if status == StatusCode::NOT_FOUND {
            "not_found"
        } else {
            "method_not_allowed"
        },
        "the data port serves POST /v1/chat/completions, POST /v1/embeddings, \
         POST /v1/messages, POST /v1/responses and GET /v1/models",
    );
    r.headers_mut().insert(X_REQUEST_ID, request_id(&headers));
    unrouted(&gw.snapshot(), r)
}

pub fn admin_router(gw: Arc<Gateway>) -> Router {
    let registry = Arc::new(metrics::registry(gw.clone()));
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/admin/v1/config", get(config))
        .route("/admin/v1/stats", get(stats_doc))
        .route(
            "/metrics",
            get(move || {
                let registry = registry.clone();
                async move {
                    (
                        [(
                            header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        metrics::render(&registry),
                    )
                }
            }),
        )
        .with_state(gw)
}

async fn stats_doc(State(gw): State<Arc<Gateway>>) -> Response<Body> {
    json_response(StatusCode::OK, &crate::admin::stats::report(&gw))
}

async fn chat(State(gw): State<Arc<Gateway>>, request: Request) -> Response<Body> {
    handle(&gw, Surface::ChatCompletions, request).await
}

async fn embeddings(State(gw): State<Arc<Gateway>>, request: Request) -> Response<Body> {
    handle(&gw, Surface::Embeddings, request).await
}

async fn messages(State(gw): State<Arc<Gateway>>, request: Request) -> Response<Body> {
    handle(&gw, Surface::Messages, request).await
}

/// The OpenAI Responses API, passed through to the targets that serve it (SPEC §10).
async fn responses(State(gw): State<Arc<Gateway>>, request: Request) -> Response<Body> {
    handle(&gw, Surface::Responses, request).await
}

/// The two fields the proxy reads from a request body; everything else is forwarded
/// untouched.
#[derive(Deserialize)]
struct Peek<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    stream: Option<bool>,
}

async fn handle(gw: &Gateway, surface: Surface, request: Request) -> Response<Body> {
    // Only the headers are kept: the rest of the head (URI, extensions) would be held
    // in this future's state, and copied with it, until the answer.
    let (http::request::Parts { headers, .. }, body) = request.into_parts();
    // Carried apart from the client's headers (which keep whatever the client sent):
    // the attempt pipeline forwards this one.
    let request_id = request_id(&headers);
    let wire = surface.wire();
    let snapshot = gw.snapshot();
    // Before the body is read: an unauthenticated caller spends no body budget.
    let mut response = match auth::authenticate(&gw.auth, &snapshot, &headers) {
        Err(denied) => unauthenticated(wire, denied),
        Ok(tenant) => match intake::read(&gw.front, gw.max_body_bytes, body).await {
            Err(refused) => refusal(wire, refused, gw),
            // The body's budget bytes are held until the answer head is out.
            Ok((body, _held)) => {
                route_and_run(gw, &snapshot, tenant, surface, &headers, &request_id, body).await
            }
        },
    };
    response.headers_mut().insert(X_REQUEST_ID, request_id);
    // A routed answer carries its route's generation; any other (401, 400, 404, 413,
    // 503 before routing) the config's.
    if !response.headers().contains_key(X_GENERATION) {
        response = unrouted(&snapshot, response);
    }
    response
}

/// An answer given before a route was chosen: its `x-switchback-generation` is the
/// config's (the load count the request saw), there being no route's to give.
fn unrouted(snapshot: &Snapshot, mut response: Response<Body>) -> Response<Body> {
    response
        .headers_mut()
        .insert(X_GENERATION, snapshot.generation.0.clone());
    response
}

/// 401 in the surface's shape (`invalid_api_key`). The body was not read, so the
/// connection is closed after it.
fn unauthenticated(wire: Wire, denied: auth::Denied) -> Response<Body> {
    let mut r = gateway_error(
        wire,
        StatusCode::UNAUTHORIZED,
        "invalid_api_key",
        denied.message(),
    );
    let h = r.headers_mut();
    h.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// The client's `x-request-id` when it sent a usable one, else a new one.
fn request_id(headers: &HeaderMap) -> HeaderValue {
    match headers.get(X_REQUEST_ID) {
        Some(v) if !v.is_empty() && v.len() <= 128 => v.clone(),
        _ => new_request_id(),
    }
}

/// A fresh request id: a UUID v4, formatted on the stack.
fn new_request_id() -> HeaderValue {
    let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
    let id = uuid::Uuid::new_v4();
    HeaderValue::from_bytes(id.hyphenated().encode_lower(&mut buf).as_bytes())
        .unwrap_or_else(|_| HeaderValue::from_static("unknown"))
}

/// The answer to a body [`intake`] did not take. The connection is closed after it:
/// the rest of the body may still be on its way.
fn refusal(wire: Wire, refused: Refused, gw: &Gateway) -> Response<Body> {
    let mut response = match refused {
        Refused::TooLarge => gateway_error(
            wire,
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request",
            &format!(
                "the request body is larger than the limit of {} bytes",
                gw.max_body_bytes
            ),
        ),
        Refused::Overloaded => {
            let mut r = gateway_error(
                wire,
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded",
                "the gateway holds as many request bodies as it may; retry in a second",
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            r
        }
        Refused::Timeout => gateway_error(
            wire,
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            &format!(
                "the request body was not received within {} ms",
                gw.front.limits.body_read_timeout.as_millis()
            ),
        ),
        Refused::Broken(e) => gateway_error(
            wire,
            StatusCode::BAD_REQUEST,
            "invalid_request",
            &format!("the request body could not be read: {e}"),
        ),
    };
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

async fn route_and_run(
    gw: &Gateway,
    snapshot: &Snapshot,
    tenant: Option<&Tenant>,
    surface: Surface,
    headers: &HeaderMap,
    request_id: &HeaderValue,
    body: Bytes,
) -> Response<Body> {
    let wire = surface.wire();
    let peek: Peek<'_> = match serde_json::from_slice(&body) {
        Ok(p) => p,
        Err(e) => {
            return gateway_error(
                wire,
                StatusCode::BAD_REQUEST,
                "invalid_request",
                &format!("the request body is not valid JSON: {e}"),
            );
        }
    };
    let Some(model) = peek.model else {
        return gateway_error(
            wire,
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "the request has no \"model\"",
        );
    };
    // A route the client may not call is not in its map: it reads like a model no
    // route serves.
    let models = tenant.map_or(&snapshot.routes, |t| &t.models);
    let Some(served) = models.get(model.as_ref()) else {
        return gateway_error(
            wire,
            StatusCode::NOT_FOUND,
            "model_not_found",
            &format!("no route serves the model {model:?}"),
        );
    };
    let route = &served.route;
    let client = served.client.as_ref();
    // The request's one clock read: its duration, and its client's admission.
    let started = tokio::time::Instant::now();
    // Limits and budgets before anything is sent upstream; the slot (if any) is held
    // until the answer is out (a stream's until it ends).
    let admitted = match client {
        None => None,
        Some(c) => match c.client.admit(started) {
            Ok(a) => Some(a),
            Err(t) => return throttled(wire, route, &c.client, t),
        },
    };
    let stream = surface != Surface::Embeddings && peek.stream.unwrap_or(false);
    // A client's OpenAI stream: its usage counts to its limits and budgets, so the
    // provider is asked for it even when the client did not ask (and the extra chunk
    // is stripped from what the client gets).
    let (mut upstream_body, mut include_usage, mut strip_usage) = (None, None, false);
    if client.is_some() && stream && surface == Surface::ChatCompletions {
        let asked = crate::providers::translate::include_usage(&body);
        include_usage = Some(asked);
        if !asked && let Some(b) = crate::wire::rewrite::with_include_usage(&body) {
            upstream_body = Some(b);
            strip_usage = true;
        }
    }
    let call = Call {
        surface,
        client_model: &model,
        client_model_json: served.model_json.clone(),
        stream,
        body: upstream_body.unwrap_or_else(|| body.clone()),
        client_headers: headers,
        request_id,
        client,
        include_usage,
        strip_usage,
    };
    let op = surface.operation();
    let span = tracing::info_span!(
        target: TRACE_TARGET,
        "request",
        otel.name = %format_args!("{op} {model}"),
        otel.kind = "server",
        gen_ai.operation.name = op,
        gen_ai.request.model = %model,
        switchback.route = %route.spec.id,
        switchback.client = tenant.map(|t| &*t.label),
        switchback.route.generation = route.spec.generation,
        switchback.request_id = request_id.to_str().unwrap_or_default(),
        switchback.attempts = Empty,
        switchback.fallbacks = Empty,
        http.response.status_code = Empty,
    );
    crate::observe::telemetry::continue_trace(&span, headers);
    // Without traces the span is disabled: skip the wrapper. The future is built in
    // each branch, not bound to a local first: an awaited local is kept in this
    // future's state twice (before and after the move into `.await`).
    let outcome = if span.is_disabled() {
        pipeline::run(gw, route, &call).await
    } else {
        pipeline::run(gw, route, &call)
            .instrument(span.clone())
            .await
    };
    span.record(
        "http.response.status_code",
        outcome.response.status().as_u16(),
    );
    span.record("switchback.attempts", outcome.attempts);
    span.record("switchback.fallbacks", outcome.fallbacks);
    let line = RequestLine {
        client: tenant.map(|t| t.label.clone()),
        status: outcome.response.status().as_u16(),
        attempts: outcome.attempts,
        fallbacks: outcome.fallbacks,
        answered_by: outcome.answered_by,
        log: outcome.log,
        request_id: request_id.clone(),
    };
    match outcome.stream_line {
        // A committed stream: its line is written when it ends, with its real
        // duration and how it ended.
        Some(slot) => {
            let (route, model) = (served.route.clone(), String::from(&*model));
            let front = gw.front.clone();
            slot.write_when_ended(Box::new(move |end| {
                let how = match end {
                    // Ended by the drain at the end of the shutdown grace.
                    StreamEnd::ClientGone if front.end_streams.is_set() => "shutdown",
                    end => end.as_str(),
                };
                line.write(&route, &model, started.elapsed(), Some(how));
            }));
        }
        None => line.write(route, &model, started.elapsed(), None),
    }
    let mut response = outcome.response;
    if call.stream && response.status().is_success() {
        let front = gw.front.clone();
        response = response.map(|b| crate::front::drain::until_shutdown(front, surface, b));
        // The client's concurrency slot goes with the stream.
        if let Some(Admitted(Some(slot))) = admitted {
            response = response.map(|inner| Body::new(HoldingSlot { inner, _slot: slot }));
        }
    }
    let h = response.headers_mut();
    // Room for these and `x-request-id` at once, instead of growing on the way.
    h.reserve(6);
    h.insert(X_ROUTE, route.route_header.clone());
    h.insert(X_GENERATION, route.generation_header.clone());
    h.insert(X_ATTEMPTS, HeaderValue::from(outcome.attempts));
    h.insert(X_FALLBACKS, HeaderValue::from(outcome.fallbacks));
    if let Some(t) = outcome.target {
        h.insert(X_TARGET, t);
    }
    response
}

/// A 429 for a client over a limit (`rate_limited`) or with a spent budget
/// (`budget_exhausted`), with `Retry-After`; nothing was sent upstream.
fn throttled(wire: Wire, route: &RouteRt, client: &ClientRt, t: Throttled) -> Response<Body> {
    let (code, retry_after, message) = match &t {
        Throttled::RateLimited { retry_after, limit } => (
            "rate_limited",
            *retry_after,
            format!(
                "the LLMClient {} is over its {limit} limit (this replica's share); retry after {retry_after} s",
                client.label
            ),
        ),
        Throttled::BudgetExhausted {
            retry_after,
            budget,
        } => (
            "budget_exhausted",
            *retry_after,
            format!(
                "the LLMClient {} has spent its {budget} budget; requests are refused until the period ends",
                client.label
            ),
        ),
    };
    tracing::info!(
        target: "switchback::request",
        route = %route.spec.id,
        client = &*client.label,
        status = 429u16,
        code,
        retry_after,
        "request throttled"
    );
    let mut r = gateway_error(wire, StatusCode::TOO_MANY_REQUESTS, code, &message);
    let h = r.headers_mut();
    h.insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
    h.insert(X_ROUTE, route.route_header.clone());
    h.insert(X_GENERATION, route.generation_header.clone());
    r
}

/// A client's stream body holding the client's concurrency slot until it ends.
struct HoldingSlot {
    inner: Body,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl hyper::body::Body for HoldingSlot {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, axum::Error>>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// One structured line per request: the route, who answered, the fallback provider
/// and model when it was not the first target, and the attempt log. A stream's is
/// written when the stream ends, and says how (`stream`).
struct RequestLine {
    /// The LLMClient (`namespace/name`) with `--auth required`; never its key.
    client: Option<Arc<str>>,
    status: u16,
    attempts: u32,
    fallbacks: u32,
    answered_by: Option<u8>,
    log: Vec<AttemptLog>,
    /// `x-request-id`: the client's, or the one made for the request.
    request_id: HeaderValue,
}

impl RequestLine {
    fn write(&self, route: &RouteRt, model: &str, took: std::time::Duration, stream: Option<&str>) {
        let answered = self.answered_by.map(|i| &route.targets[i as usize]);
        let fell_back = self.fallbacks > 0 && answered.is_some();
        let fallback_provider = answered.filter(|_| fell_back).map(|t| t.label.as_str());
        let fallback_model = answered
            .filter(|_| fell_back)
            .map(|t| t.spec.upstream_model(model));
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

fn gateway_error(wire: Wire, status: StatusCode, code: &str, message: &str) -> Response<Body> {
    let body = surface::error_body(wire, status.as_u16(), code, message, &[]);
    let mut r = surface::json_response(status, body);
    r.headers_mut().insert(X_ATTEMPTS, HeaderValue::from(0u32));
    r.headers_mut().insert(X_FALLBACKS, HeaderValue::from(0u32));
    r
}

/// `GET /v1/models`: every model name a route serves (with authentication, every one
/// the client may call), in the OpenAI list shape, or the Anthropic one when the
/// client sends `anthropic-version`.
async fn models(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> Response<Body> {
    let snapshot = gw.snapshot();
    let mut r = model_list(&gw, &snapshot, &headers);
    r.headers_mut().insert(X_REQUEST_ID, request_id(&headers));
    unrouted(&snapshot, r)
}

fn model_list(gw: &Gateway, snapshot: &Snapshot, headers: &HeaderMap) -> Response<Body> {
    let anthropic = headers.contains_key("anthropic-version");
    let tenant = match auth::authenticate(&gw.auth, snapshot, headers) {
        Ok(t) => t,
        Err(denied) => {
            let wire = if anthropic {
                Wire::Anthropic
            } else {
                Wire::OpenAi
            };
            return unauthenticated(wire, denied);
        }
    };
    let names = tenant
        .map_or(&snapshot.route_list, |t| &t.route_list)
        .iter()
        .flat_map(|r| r.spec.models.iter());
    let body = if anthropic {
        let data: Vec<_> = names
            .map(|m| serde_json::json!({"type": "model", "id": m, "display_name": m, "created_at": "1970-01-01T00:00:00Z"}))
            .collect();
        let first = data.first().map(|d| d["id"].clone());
        let last = data.last().map(|d| d["id"].clone());
        serde_json::json!({"data": data, "has_more": false, "first_id": first, "last_id": last})
    } else {
        let data: Vec<_> = names
            .map(|m| serde_json::json!({"id": m, "object": "model", "created": 0, "owned_by": "switchback"}))
            .collect();
        serde_json::json!({"object": "list", "data": data})
    };
    json_response(StatusCode::OK, &body)
}

fn json_response(status: StatusCode, body: &impl serde::Serialize) -> Response<Body> {
    surface::json_response(status, serde_json::to_vec_pretty(body).unwrap_or_default())
}

async fn readyz(State(gw): State<Arc<Gateway>>) -> (StatusCode, Cow<'static, str>) {
    if gw.front.is_draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n".into())
    } else if gw.is_ready() {
        (StatusCode::OK, "ready\n".into())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            not_ready_because(&gw).into(),
        )
    }
}

/// Why a gateway that serves no config yet is not ready: nothing delivered yet, or
/// what was delivered was refused (and why).
fn not_ready_because(gw: &Gateway) -> String {
    match gw.report().last_error {
        Some(refused) => {
            let mut text = String::from("no config loaded yet: the config was refused:\n");
            for p in &refused.problems {
                text.push_str("  ");
                text.push_str(&p.to_string());
                text.push('\n');
            }
            text
        }
        None => "no config loaded yet\n".into(),
    }
}

/// `GET /admin/v1/config`: the compiled config being served (no key material: keys
/// live apart from it, clients show only their key hash), which credentials have a
/// key, the `--auth` mode, and the load report.
async fn config(State(gw): State<Arc<Gateway>>) -> Response<Body> {
    let snapshot = gw.snapshot();
    let credentials: Vec<_> = snapshot
        .config
        .credentials
        .iter()
        .map(|c| {
            let mut v = serde_json::to_value(c).unwrap_or_default();
            let has_key = snapshot
                .credentials
                .get(&c.id)
                .is_some_and(|rt| rt.headers.is_some());
            v["keyPresent"] = serde_json::Value::Bool(has_key);
            v
        })
        .collect();
    let limits = &gw.front.limits;
    let body = serde_json::json!({
        "ready": gw.is_ready(),
        "load": gw.report(),
        "auth": gw.auth.mode.as_str(),
        // What the flags set (SPEC §8): lets a deployment check its values arrived.
        "settings": {
            "threads": gw.lanes,
            "maxBodyBytes": gw.max_body_bytes,
            "headerReadTimeoutMs": limits.header_read_timeout.as_millis() as u64,
            "bodyReadTimeoutMs": limits.body_read_timeout.as_millis() as u64,
            "idleTimeoutMs": limits.idle_timeout.as_millis() as u64,
            "maxConnections": limits.max_connections,
            "maxInflightBodyBytes": limits.max_inflight_body_bytes,
            "maxEventBytes": gw.upstream_limits.max_event_bytes,
            "maxResponseBytes": gw.upstream_limits.max_response_bytes,
            "maxInflightResponseBytes": gw.upstream_limits.max_inflight_response_bytes,
            "allowEmptyConfig": gw.allow_empty_config,
        },
        "routes": snapshot.config.routes,
        "credentials": credentials,
        // Key hashes only (HMACs under the cluster secret), never keys.
        "clients": snapshot.config.clients,
    });
    json_response(StatusCode::OK, &body)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use switchback_crds::config::Strategy;

    use super::*;
    use crate::observe::reason::Reason;
    use crate::pipeline::AttemptLog;

    #[tokio::test]
    async fn readyz_says_why_the_gateway_is_not_ready() {
        let gw = Arc::new(Gateway::new(1024, "test".into(), 1).unwrap());
        let (status, text) = readyz(State(gw.clone())).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(text, "no config loaded yet\n");

        let e = gw
            .apply(&switchback_crds::compile::Compiled::default(), Vec::new())
            .unwrap_err();
        assert!(matches!(e, crate::gateway::ApplyError::NoRoute), "{e}");
        gw.refuse(vec![crate::gateway::Problem {
            file: Some("switchback.yaml".into()),
            line: None,
            object: None,
            field: None,
            message: e.to_string(),
        }]);
        let (status, text) = readyz(State(gw.clone())).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            text.contains("switchback.yaml: the config has no LLMRoute"),
            "{text}"
        );
        assert!(text.contains("--allow-empty-config"), "{text}");
        assert!(!gw.is_ready());

        gw.front
            .draining
            .store(true, std::sync::atomic::Ordering::Release);
        assert_eq!(readyz(State(gw)).await.1, "shutting down\n");
    }

    /// `/admin/v1/config` shows the limits the flags set (a chart's values can be
    /// checked on a running replica) next to the config.
    #[tokio::test]
    async fn the_config_endpoint_shows_the_limits_in_effect() {
        let mut gw = Gateway::new(4096, "test".into(), 3).unwrap();
        gw.front = Arc::new(crate::front::Front::new(
            crate::front::ClientLimits {
                max_connections: 123,
                idle_timeout: Duration::from_secs(7),
                ..Default::default()
            },
            3,
        ));
        gw.set_upstream_limits(crate::limits::answers::UpstreamLimits {
            max_event_bytes: 2048,
            ..Default::default()
        });
        let response = config(State(Arc::new(gw))).await;
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let settings = &v["settings"];
        assert_eq!(settings["threads"], 3);
        assert_eq!(settings["maxBodyBytes"], 4096);
        assert_eq!(settings["maxConnections"], 123);
        assert_eq!(settings["idleTimeoutMs"], 7000);
        assert_eq!(settings["headerReadTimeoutMs"], 10_000);
        assert_eq!(settings["maxEventBytes"], 2048);
        assert_eq!(settings["maxResponseBytes"], 32 << 20);
        assert_eq!(settings["allowEmptyConfig"], false);
    }

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
