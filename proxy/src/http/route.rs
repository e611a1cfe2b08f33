//! One routed request: its body peeked (`model`, `stream`), its route picked among
//! those the client may call, its client admitted (limits and budgets, before
//! anything is sent upstream), the call handed to the pipeline in the request's
//! trace span, its log line left (a stream's written when it ends), and the
//! `x-switchback-*` headers stamped on the answer.

use std::borrow::Cow;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

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
use crate::limits::clients::{Admitted, ClientUsage, HeldReservation, Need};
use crate::observe::telemetry::{self, TRACE_TARGET};
use crate::pipeline::{self, Call, Outcome, StreamEnd};
use crate::providers::translate;
use crate::wire::headers::{X_ATTEMPTS, X_FALLBACKS, X_GENERATION, X_MODEL, X_ROUTE, X_TARGET};
use crate::wire::rewrite;
use crate::wire::surface::{Surface, Wire};

/// The fields the proxy reads from a request body (`model`, `stream`, and the output
/// caps a budget's reservation counts); everything else is forwarded untouched.
#[derive(Deserialize)]
struct Peek<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    max_tokens: Cap,
    #[serde(default)]
    max_completion_tokens: Cap,
    #[serde(default)]
    max_output_tokens: Cap,
}

/// An output cap as a client wrote it: a number of tokens (a fraction rounded up, a
/// negative one as 0), or anything else (a string, `null`, an object: the provider
/// refuses those, and the reservation falls back to the client's default).
#[derive(Default, Clone, Copy)]
struct Cap(Option<u64>);

impl<'de> Deserialize<'de> for Cap {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Cap;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_u64<E>(self, n: u64) -> Result<Cap, E> {
                Ok(Cap(Some(n)))
            }
            fn visit_i64<E>(self, n: i64) -> Result<Cap, E> {
                Ok(Cap(Some(n.max(0) as u64)))
            }
            fn visit_f64<E>(self, n: f64) -> Result<Cap, E> {
                // `as` saturates: NaN is 0, an absurd one u64::MAX.
                Ok(Cap(Some(n.ceil() as u64)))
            }
            fn visit_str<E>(self, _: &str) -> Result<Cap, E> {
                Ok(Cap(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Cap, E> {
                Ok(Cap(None))
            }
            fn visit_unit<E>(self) -> Result<Cap, E> {
                Ok(Cap(None))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Cap, A::Error> {
                while a.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(Cap(None))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Cap, A::Error> {
                while a
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(Cap(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// What the body says of itself: its `model`, whether it streams, its output cap.
struct Peeked<'a> {
    model: Cow<'a, str>,
    stream: bool,
    /// The largest output cap set (the API reads one of them; the reservation takes
    /// the largest), and its field.
    cap: Option<(&'static str, u64)>,
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
    let Peeked { model, stream, cap } = match peek(&body) {
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
    let mut admitted = match client {
        None => None,
        Some(c) => {
            let need = need(c, route, surface, cap, body.len());
            match c.client.admit(started, &need) {
                Ok(a) => Some(a),
                Err(t) => return throttled(wire, route, &c.client, t),
            }
        }
    };
    // Settled when the answer ends: a committed stream takes it along, a
    // continuation counting an abandoned answer too; otherwise it goes with this.
    let reserved = admitted.as_mut().and_then(|a| a.reserved.take());
    let reservation = reserved.is_some().then_some(HeldReservation::new(reserved));
    let abandoned = AtomicBool::new(false);
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
        reservation: reservation.as_ref(),
        abandoned: &abandoned,
    };
    let span = request_span(route, &call, tenant);
    let left = Left {
        served,
        tenant,
        call: &call,
        started,
    };
    // Without traces the span is disabled: skip the wrapper. The future is built in
    // each branch, not bound to a local first, and awaited here, not in a function of
    // its own: an awaited local is kept in this future's state twice (before and after
    // the move into `.await`), and a nested async fn is copied into its parent's.
    let outcome = if span.is_disabled() {
        Abandonable::new(pipeline::run(gw, &served.route, &call), left).await
    } else {
        Abandonable::new(pipeline::run(gw, &served.route, &call), left)
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

/// The body's `model`, `stream` and output cap.
fn peek(body: &[u8]) -> Result<Peeked<'_>, Unreadable> {
    let peek: Peek<'_> = serde_json::from_slice(body).map_err(Unreadable::NotJson)?;
    let model = peek.model.ok_or(Unreadable::NoModel)?;
    let cap = [
        ("max_tokens", peek.max_tokens),
        ("max_completion_tokens", peek.max_completion_tokens),
        ("max_output_tokens", peek.max_output_tokens),
    ]
    .into_iter()
    .filter_map(|(field, Cap(n))| Some((field, n?)))
    .max_by_key(|(_, n)| *n);
    Ok(Peeked {
        model,
        stream: peek.stream.unwrap_or(false),
        cap,
    })
}

/// What a request of client `c` reserves of its budgets
/// (docs/tenancy.md#reserve-before-sending): nothing without a budget; else its output cap
/// (or the default reservation) and its input estimate, priced with the route's first
/// target.
fn need(
    c: &ClientUsage,
    route: &RouteRt,
    surface: Surface,
    cap: Option<(&'static str, u64)>,
    body: usize,
) -> Need {
    let Some(budget) = &c.client.budget else {
        return Need::default();
    };
    let price = route
        .targets
        .first()
        .filter(|t| t.pricing.priced)
        .map(|t| &t.pricing.price);
    Need::of(cap, body, budget, price, surface != Surface::Embeddings)
}

/// What the request log line says of a request whose client went away before its
/// answer: which, on what route, since when.
struct Left<'a, 'c> {
    served: &'a ModelRoute,
    tenant: Option<&'a Tenant>,
    call: &'a Call<'c>,
    started: Instant,
}

pin_project_lite::pin_project! {
    /// The pipeline's future, and what becomes of the request if the client goes away
    /// first (the server drops this future): `Call::abandoned` is set before anything
    /// underneath is dropped (so that a unary answer in flight is read to its end and
    /// counted, see `pipeline::answer::Unanswered`), and the request's log line is
    /// written (status 499, as nginx logs a request its client closed).
    struct Abandonable<'a, 'c, F> {
        #[pin]
        inner: F,
        left: Option<Left<'a, 'c>>,
    }

    impl<'a, 'c, F> PinnedDrop for Abandonable<'a, 'c, F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(left) = this.left.take() {
                left.call.abandoned.store(true, Ordering::Release);
                let line = RequestLine {
                    client: left.tenant.map(|t| t.label.clone()),
                    status: 499,
                    attempts: 0,
                    fallbacks: 0,
                    answered_by: None,
                    log: Vec::new(),
                    request_id: left.call.request_id.clone(),
                    resume: None,
                    usage: None,
                };
                line.write(
                    &left.served.route,
                    left.call.client_model,
                    left.started.elapsed(),
                    Some(StreamEnd::ClientGone.as_str()).filter(|_| left.call.stream),
                );
            }
        }
    }
}

impl<'a, 'c, F> Abandonable<'a, 'c, F> {
    fn new(inner: F, left: Left<'a, 'c>) -> Self {
        Self {
            inner,
            left: Some(left),
        }
    }
}

impl<F: std::future::Future> std::future::Future for Abandonable<'_, '_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<F::Output> {
        let this = self.project();
        let out = std::task::ready!(this.inner.poll(cx));
        // Answered: whatever happens to the answer now is the stream's business.
        *this.left = None;
        std::task::Poll::Ready(out)
    }
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
    model: Option<HeaderValue>,
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
        usage: None,
    };
    match outcome.stream_line {
        Some(slot) => {
            let (route, model) = (served.route.clone(), String::from(call.client_model));
            let front = gw.front.clone();
            slot.write_when_ended(Box::new(move |end, resume, estimated| {
                let how = match end {
                    // Ended by the drain at the end of the shutdown grace.
                    StreamEnd::ClientGone if front.end_streams.is_set() => "shutdown",
                    end => end.as_str(),
                };
                let mut line = line;
                if let Some(r) = resume {
                    line.resumed(r);
                }
                line.usage = estimated.then_some("estimated");
                line.write(&route, &model, started.elapsed(), Some(how));
            }));
        }
        None => line.write(&served.route, call.client_model, started.elapsed(), None),
    }
    let counts = Counts {
        attempts: outcome.attempts,
        fallbacks: outcome.fallbacks,
        target: outcome.target,
        model: outcome.model,
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
        if let Some(Admitted {
            slot: Some(slot), ..
        }) = admitted
        {
            response = response.map(|inner| Body::new(HoldingSlot { inner, _slot: slot }));
        }
    }
    let h = response.headers_mut();
    // Room for these and `x-request-id` at once, instead of growing on the way.
    h.reserve(6);
    h.insert(X_ROUTE, route.route_header.clone());
    h.insert(X_GENERATION, route.generation_header.clone());
    h.insert(X_ATTEMPTS, count_header(counts.attempts));
    h.insert(X_FALLBACKS, count_header(counts.fallbacks));
    if let Some(t) = counts.target {
        h.insert(X_TARGET, t);
    }
    if let Some(m) = counts.model {
        h.insert(X_MODEL, m);
    }
    response
}

/// A count as a header value: a small one (every request's, nearly) from the static
/// table of `x-switchback-hops`, so no allocation; a larger one written out.
fn count_header(n: u32) -> HeaderValue {
    match u8::try_from(n) {
        Ok(small) if small <= crate::wire::hops::MAX => crate::wire::hops::value(small),
        _ => HeaderValue::from(n),
    }
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

#[cfg(test)]
mod tests {
    /// `x-switchback-attempts` and `x-switchback-fallbacks` say the count, small (from
    /// the static table) or not.
    #[test]
    fn counts_are_written_whatever_their_size() {
        for n in [0u32, 1, 9, 31, 32, 33, 255, 256, 70_000] {
            assert_eq!(super::count_header(n).to_str().unwrap(), n.to_string());
        }
    }
}
