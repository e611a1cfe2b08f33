//! One routed request: its body peeked (`model`, `stream`), its route picked among
//! those the client may call, its client admitted (limits and budgets, before
//! anything is sent upstream), the call handed to the pipeline in the request's
//! trace span, its log line left (a stream's written when it ends), and the
//! `x-switchback-*` headers stamped on the answer.

use std::borrow::Cow;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, Response, StatusCode};
use serde::Deserialize;
use tokio::time::Instant;
use tracing::Instrument;
use tracing::field::Empty;

use super::answers::{gateway_error, throttled};
use super::request_line::RequestLine;
use crate::config::snapshot::{ModelRoute, RouteRt, Snapshot, Tenant};
use crate::gateway::Gateway;
use crate::limits::clients::{Admitted, ClientUsage};
use crate::observe::telemetry::{self, TRACE_TARGET};
use crate::pipeline::{self, Call, Outcome, StreamEnd};
use crate::providers::translate;
use crate::wire::headers::{X_ATTEMPTS, X_FALLBACKS, X_GENERATION, X_ROUTE, X_TARGET};
use crate::wire::rewrite;
use crate::wire::surface::{Surface, Wire};

/// The two fields the proxy reads from a request body; everything else is forwarded
/// untouched.
#[derive(Deserialize)]
struct Peek<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    stream: Option<bool>,
}

/// What the handler read of a request before its body: its API, its headers, its id
/// and the gateways it has passed through (`x-switchback-hops`).
pub(super) struct Request<'a> {
    pub surface: Surface,
    pub headers: &'a HeaderMap,
    pub request_id: &'a HeaderValue,
    pub hops: u8,
}

pub(super) async fn route_and_run(
    gw: &Arc<Gateway>,
    snapshot: &Snapshot,
    tenant: Option<&Tenant>,
    request: Request<'_>,
    body: Bytes,
) -> Response<Body> {
    let Request {
        surface,
        headers,
        request_id,
        hops,
    } = request;
    let wire = surface.wire();
    let (model, stream) = match peek(&body) {
        Ok(peeked) => peeked,
        Err(why) => return why.answer(wire),
    };
    let stream = stream && surface != Surface::Embeddings;
    let Some(served) = served(snapshot, tenant, &model) else {
        return gateway_error(
            wire,
            StatusCode::NOT_FOUND,
            "model_not_found",
            &format!("no route serves the model {model:?}"),
        );
    };
    let (route, client) = (&served.route, served.client.as_ref());
    // The request's one clock read: its duration, and its client's admission.
    let started = Instant::now();
    // Limits and budgets before anything is sent upstream; the slot (if any) is held
    // until the answer is out (a stream's until it ends).
    let admitted = match client {
        None => None,
        Some(c) => match c.client.admit(started) {
            Ok(a) => Some(a),
            Err(t) => return throttled(wire, route, &c.client, t),
        },
    };
    let usage = Usage::asked(client, stream, surface, &body);
    let call = Call {
        surface,
        client_model: &model,
        client_model_json: served.model_json.clone(),
        stream,
        body: usage.body.unwrap_or_else(|| body.clone()),
        client_headers: headers,
        request_id,
        hops,
        client,
        include_usage: usage.include,
        strip_usage: usage.strip,
    };
    let span = request_span(route, &call, tenant);
    // Without traces the span is disabled: skip the wrapper. The future is built in
    // each branch, not bound to a local first, and awaited here, not in a function of
    // its own: an awaited local is kept in this future's state twice (before and after
    // the move into `.await`), and a nested async fn is copied into its parent's.
    let outcome = if span.is_disabled() {
        pipeline::run(gw, &served.route, &call).await
    } else {
        pipeline::run(gw, &served.route, &call)
            .instrument(span.clone())
            .await
    };
    record(&span, &outcome);
    let (response, counts) = log_line(gw, served, tenant, &call, started, outcome);
    finish(gw, route, &call, admitted, response, counts)
}

/// Why a body cannot be routed: a 400.
enum Unreadable {
    NotJson(serde_json::Error),
    NoModel,
}

impl Unreadable {
    fn answer(self, wire: Wire) -> Response<Body> {
        let message = match self {
            Self::NotJson(e) => format!("the request body is not valid JSON: {e}"),
            Self::NoModel => "the request has no \"model\"".to_owned(),
        };
        gateway_error(wire, StatusCode::BAD_REQUEST, "invalid_request", &message)
    }
}

/// The body's `model` and `stream`.
fn peek(body: &[u8]) -> Result<(Cow<'_, str>, bool), Unreadable> {
    let peek: Peek<'_> = serde_json::from_slice(body).map_err(Unreadable::NotJson)?;
    let model = peek.model.ok_or(Unreadable::NoModel)?;
    Ok((model, peek.stream.unwrap_or(false)))
}

/// The route serving `model` for this client. A route the client may not call is
/// not in its map: it reads like a model no route serves.
fn served<'s>(
    snapshot: &'s Snapshot,
    tenant: Option<&'s Tenant>,
    model: &str,
) -> Option<&'s ModelRoute> {
    tenant.map_or(&snapshot.routes, |t| &t.models).get(model)
}

/// Whether a client's OpenAI stream asks for usage. Its usage counts to its limits
/// and budgets, so the provider is asked for it even when the client did not ask
/// (and the extra chunk is stripped from what the client gets).
struct Usage {
    /// The body asking for it on the client's behalf.
    body: Option<Bytes>,
    /// The client's own `stream_options.include_usage`, when read.
    include: Option<bool>,
    /// Strip the usage chunk the client did not ask for.
    strip: bool,
}

impl Usage {
    fn asked(client: Option<&ClientUsage>, stream: bool, surface: Surface, body: &Bytes) -> Self {
        let mut usage = Usage {
            body: None,
            include: None,
            strip: false,
        };
        if client.is_some() && stream && surface == Surface::ChatCompletions {
            let asked = translate::include_usage(body);
            usage.include = Some(asked);
            if !asked && let Some(b) = rewrite::with_include_usage(body) {
                usage.body = Some(b);
                usage.strip = true;
            }
        }
        usage
    }
}

/// The request's trace span (disabled, and free, unless traces are on).
fn request_span(route: &RouteRt, call: &Call<'_>, tenant: Option<&Tenant>) -> tracing::Span {
    let (op, model) = (call.surface.operation(), call.client_model);
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
        switchback.request_id = call.request_id.to_str().unwrap_or_default(),
        switchback.attempts = Empty,
        switchback.fallbacks = Empty,
        http.response.status_code = Empty,
    );
    telemetry::continue_trace(&span, call.client_headers);
    span
}

/// What the walk came to, on the request's span.
fn record(span: &tracing::Span, outcome: &Outcome) {
    span.record(
        "http.response.status_code",
        outcome.response.status().as_u16(),
    );
    span.record("switchback.attempts", outcome.attempts);
    span.record("switchback.fallbacks", outcome.fallbacks);
}

/// What the answer's headers report of the walk.
struct Counts {
    attempts: u32,
    fallbacks: u32,
    target: Option<HeaderValue>,
}

/// The request's log line: written now, or for a committed stream when it ends,
/// with its real duration and how it ended.
fn log_line(
    gw: &Gateway,
    served: &ModelRoute,
    tenant: Option<&Tenant>,
    call: &Call<'_>,
    started: Instant,
    outcome: Outcome,
) -> (Response<Body>, Counts) {
    let line = RequestLine {
        client: tenant.map(|t| t.label.clone()),
        status: outcome.response.status().as_u16(),
        attempts: outcome.attempts,
        fallbacks: outcome.fallbacks,
        answered_by: outcome.answered_by,
        log: outcome.log,
        request_id: call.request_id.clone(),
        resume: None,
    };
    match outcome.stream_line {
        Some(slot) => {
            let (route, model) = (served.route.clone(), String::from(call.client_model));
            let front = gw.front.clone();
            slot.write_when_ended(Box::new(move |end, resume| {
                let how = match end {
                    // Ended by the drain at the end of the shutdown grace.
                    StreamEnd::ClientGone if front.end_streams.is_set() => "shutdown",
                    end => end.as_str(),
                };
                let mut line = line;
                if let Some(r) = resume {
                    line.resumed(r);
                }
                line.write(&route, &model, started.elapsed(), Some(how));
            }));
        }
        None => line.write(&served.route, call.client_model, started.elapsed(), None),
    }
    let counts = Counts {
        attempts: outcome.attempts,
        fallbacks: outcome.fallbacks,
        target: outcome.target,
    };
    (outcome.response, counts)
}

/// The answer on its way: a committed stream ended by the drain at shutdown and
/// holding the client's concurrency slot until it ends; the `x-switchback-*`
/// headers.
fn finish(
    gw: &Gateway,
    route: &RouteRt,
    call: &Call<'_>,
    admitted: Option<Admitted>,
    mut response: Response<Body>,
    counts: Counts,
) -> Response<Body> {
    if call.stream && response.status().is_success() {
        let front = gw.front.clone();
        let surface = call.surface;
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
    h.insert(X_ATTEMPTS, HeaderValue::from(counts.attempts));
    h.insert(X_FALLBACKS, HeaderValue::from(counts.fallbacks));
    if let Some(t) = counts.target {
        h.insert(X_TARGET, t);
    }
    response
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
