//! One background probe: the adapter's probe request for the target's model, made
//! the way any request to it is (its exchange, translated where the upstream answers
//! in another API, one of its keys in turn, its endpoint's URL and authorisation),
//! sent within its deadline, and its verdict told to the circuit and the counts.
//!
//! The verdict is about the provider's health, as the circuit counts it: a usable
//! 2xx is a success; a failure that trips a breaker (5xx, transport, timeout, an
//! unusable 2xx) is a failure; any other answer (a 4xx, a 429) proves the provider
//! answers and does not keep the circuit open, but is counted by its reason. A probe
//! that could not be sent (no key, no URL or body for the model, no access token) says
//! nothing of the provider: an open circuit stays open one more interval, a check
//! counts neither way. A 429 parks the key it was sent with, a 401 or 403 rejects it,
//! as for any request.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Method, StatusCode};
use tokio::time::{Instant, timeout_at};

use super::Kind;
use crate::config::snapshot::{RouteRt, TargetRt};
use crate::gateway::Gateway;
use crate::limits::circuit::Transition;
use crate::observe::counters;
use crate::observe::reason::Reason;
use crate::providers::classify::{self, classify_status};
use crate::providers::translate::{self, Translation};
use crate::providers::{Authorising, Unsigned};
use crate::upstream;
use crate::wire::headers::X_REQUEST_ID;
use crate::wire::rewrite::JsonStr;
use crate::wire::{json, surface::Surface};

/// A probe's deadline without a target timeout; a longer one is cut to [`MAX_WAIT`].
const DEFAULT_WAIT: Duration = Duration::from_secs(10);
const MAX_WAIT: Duration = Duration::from_secs(30);
/// What is read of a probe's answer: enough to classify it.
const MAX_ANSWER: usize = 64 * 1024;

/// A probe's outcome: what the provider's answer was.
type Verdict = Result<(), (Reason, Option<u16>)>;

/// Probes target `i` of `route` (the first route that uses it) for `kind`, and tells
/// its circuit, its counts and, for a health check, least-latency.
pub(super) async fn run(gw: Arc<Gateway>, route: Arc<RouteRt>, i: usize, kind: Kind) {
    let t = &route.targets[i];
    let mut turn = Turn {
        t,
        kind,
        done: false,
    };
    let started = Instant::now();
    let verdict = send(&gw, &route, t).await;
    let now = Instant::now();
    turn.done = true;
    // `None`: nothing reached the provider.
    let healthy = match verdict {
        Ok(()) => Some(true),
        Err((reason, status))
            if reason.is_skip() || (reason, status) == (Reason::AuthError, None) =>
        {
            None
        }
        Err((reason, status)) => Some(!reason.trips_breaker(status)),
    };
    t.state.probes.record(verdict.map_err(|(r, _)| r));
    if verdict.is_ok() {
        t.state.observe_latency(now - started);
    }
    let model = probed_model(&route, t);
    match kind {
        Kind::Circuit => {
            if t.state.breaker.probe_done(now, healthy == Some(true)) == Transition::Closed {
                tracing::info!(target_credential = %t.label, model, "circuit closed by a probe");
            }
        }
        Kind::Check => {
            let cb = &route.spec.circuit_breaker;
            if healthy == Some(true) {
                t.state.breaker.success(false);
            } else if healthy == Some(false)
                && t.state.breaker.failure(
                    now,
                    cb.consecutive_failures,
                    Duration::from_millis(cb.open_for_ms),
                    false,
                ) == Transition::Opened
            {
                tracing::warn!(target_credential = %t.label, model,
                    "circuit opened by failed health checks");
            }
            let every = t
                .spec
                .health_check
                .map_or(DEFAULT_WAIT, |h| Duration::from_millis(h.interval_ms));
            t.state.probes.check_done(now + every);
        }
    }
    if let Err((reason, status)) = verdict {
        tracing::debug!(target_credential = %t.label, model, reason = reason.as_str(),
            status, "probe failed");
    }
}

/// The probe's hold on the target: should the probe be dropped unfinished, the turn
/// goes back (the circuit is probed again at once, the check is due again).
struct Turn<'a> {
    t: &'a TargetRt,
    kind: Kind,
    done: bool,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let now = Instant::now();
        match self.kind {
            Kind::Circuit => self.t.state.breaker.probe_dropped(now),
            Kind::Check => self.t.state.probes.check_done(now),
        }
    }
}

/// The model a probe asks for: the target's, the first of its `modelMap`, else the
/// route's first model name (what a client sends it).
fn probed_model<'a>(route: &'a RouteRt, t: &'a TargetRt) -> &'a str {
    t.spec
        .model
        .as_deref()
        .or_else(|| t.spec.model_map.values().next().map(String::as_str))
        .or_else(|| route.spec.models.first().map(String::as_str))
        .unwrap_or_default()
}

/// The probe request, sent and read.
async fn send(gw: &Gateway, route: &RouteRt, t: &TargetRt) -> Verdict {
    let cred = &t.credential;
    let Some(k) = cred.keys.pick(gw.now_ms()) else {
        return Err((Reason::MissingKey, None));
    };
    let model = probed_model(route, t);
    let (uri, body, translation) = request(t, model)?;
    let key = cred.keys.get(k);
    counters::inc(&key.state.attempts);
    let mut headers = key.headers.clone();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(X_REQUEST_ID, HeaderValue::from_static("switchback-probe"));
    let wait = t
        .spec
        .timeout_ms
        .map_or(DEFAULT_WAIT, Duration::from_millis)
        .min(MAX_WAIT);
    let deadline = Instant::now() + wait;
    let client = cred.client.here();
    let unsigned = Unsigned {
        uri: &uri,
        headers: &mut headers,
        body: &body,
        client,
    };
    let authorised = match cred.endpoint.authorise(unsigned) {
        Authorising::Done(done) => done,
        Authorising::Pending(pending) => timeout_at(deadline, pending)
            .await
            .unwrap_or(Err(Reason::AuthError)),
    };
    authorised.map_err(|r| (r, None))?;
    let mut request = hyper::Request::new(upstream::Body::new(body));
    *request.method_mut() = Method::POST;
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;
    let response = match timeout_at(deadline, client.request(request)).await {
        Err(_) => return Err((Reason::Timeout, None)),
        Ok(Err(_)) => return Err((Reason::ConnectionError, None)),
        Ok(Ok(r)) => r,
    };
    let (parts, incoming) = response.into_parts();
    let answer = match timeout_at(deadline, upstream::read_cut(incoming, MAX_ANSWER)).await {
        Err(_) => return Err((Reason::Timeout, None)),
        Ok(Err(_)) => return Err((Reason::ConnectionError, None)),
        Ok(Ok(b)) => b,
    };
    let verdict = verdict(parts.status, &parts.headers, answer, translation);
    if let Err((reason, status)) = verdict {
        set_key_aside(gw, route, t, k, reason, status, &parts.headers);
    }
    verdict
}

/// A probe made: its URL, its body, and the translation its answer is read through.
type Made = (http::Uri, Bytes, Option<Translation>);

/// The probe's URL and body for `model`, as any request to `t` is made.
fn request(t: &TargetRt, model: &str) -> Result<Made, (Reason, Option<u16>)> {
    let cred = &t.credential;
    let adapter = cred.adapter;
    let probe = adapter.probe();
    let exchange = adapter
        .exchange(probe.surface, model, &cred.spec)
        .ok_or((Reason::UnsupportedSurface, None))?;
    let unsendable = (Reason::UnsupportedParameter, None);
    let (body, translation) = if exchange.translated {
        let tr = Translation::to(probe.surface.wire(), exchange.dialect);
        let body = translate::request(tr, probe.body.as_bytes(), model, &adapter.defaults())
            .map_err(|_| unsendable)?;
        (body, Some(tr))
    } else {
        let body = adapter
            .relay_body(
                &Bytes::from_static(probe.body.as_bytes()),
                Some(&JsonStr::new(model)),
            )
            .ok_or(unsendable)?;
        (body, None)
    };
    let surface: Surface = exchange.upstream_surface(probe.surface);
    let uri = cred
        .endpoint
        .url(surface, model, false)
        .ok_or((Reason::UnsupportedParameter, None))?;
    Ok((uri, body, translation))
}

/// A probe's answer read as any answer is: a 2xx must be a JSON object.
fn verdict(
    status: StatusCode,
    headers: &http::HeaderMap,
    answer: Bytes,
    translation: Option<Translation>,
) -> Verdict {
    if status.is_success() {
        return match json::is_object(&answer) {
            true => Ok(()),
            false => Err((Reason::InvalidResponse, Some(status.as_u16()))),
        };
    }
    let code = status.as_u16();
    let (class_code, body) = match translation {
        Some(tr) => tr.upstream().error_answer(code, headers, answer),
        None => (code, answer),
    };
    Err((classify_status(class_code, &body), Some(code)))
}

/// A probe's 429 parks the key it was sent with (its Retry-After, or a second, never
/// past the route's `maxRetryAfter`); a 401 or 403 rejects it.
fn set_key_aside(
    gw: &Gateway,
    route: &RouteRt,
    t: &TargetRt,
    k: u8,
    reason: Reason,
    status: Option<u16>,
    headers: &http::HeaderMap,
) {
    let key = &t.credential.keys.get(k).state;
    let now_ms = gw.now_ms();
    match (reason, status) {
        (Reason::RateLimited, _) => {
            let cap = Duration::from_millis(route.spec.fallback.max_retry_after_ms);
            let park = classify::retry_after(headers, std::time::SystemTime::now())
                .unwrap_or(Duration::from_secs(1))
                .min(cap);
            key.park_until(now_ms.saturating_add(classify::millis(park)));
            counters::inc(&key.rate_limited);
        }
        (Reason::AuthError, Some(401 | 403)) => {
            key.reject_until(now_ms.saturating_add(t.credential.spec.key_rejected_for_ms));
            counters::inc(&key.rejected);
        }
        _ => {}
    }
}
