//! The attempt pipeline: walk a route's targets in order, skip the ones that cannot
//! take the request before anything is sent, try each with retries, backoff and
//! Retry-After inside the call's budget, and either commit one upstream answer or
//! turn the last failure into the gateway's error.
//!
//! Nothing here holds a lock; per-target facts are atomics in `TargetState`. Dropping
//! the future (the client went away) drops the in-flight upstream request with it,
//! so nothing more is sent upstream.

use std::convert::Infallible;
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use bytes::Bytes;
use futures_util::{Stream, StreamExt, stream};
use tokio::time::{Instant, sleep_until, timeout, timeout_at};

use crate::gateway::Gateway;
use crate::order::order;
use crate::outcome::{self, Reason, attempt_deadline, classify_status, may_advance, retryable};
use crate::rewrite::{JsonStr, replace_model};
use crate::snapshot::{RouteRt, TargetRt};
use crate::sse::{self, Framer};
use crate::surface::{self, AttemptView, Surface, Wire};

/// Client headers passed on to providers. Everything else (notably `authorization`
/// and `x-api-key`) stays with the gateway.
const FORWARDED: [&str; 4] = [
    "x-request-id",
    "anthropic-version",
    "anthropic-beta",
    "openai-beta",
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
    pub log: Vec<AttemptLog>,
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
    Committed(Response<Body>),
    Failed(Failure),
}

pub async fn run(gw: &Gateway, route: &RouteRt, call: &Call<'_>) -> Outcome {
    let started = Instant::now();
    let budget = started + Duration::from_millis(route.spec.timeout_ms);
    let order = order(route, rand::random::<f64>());
    let mut log = Vec::new();
    let mut sent = 0u32;
    let mut last_real: Option<Failure> = None;
    let mut shortest_retry_after: Option<Duration> = None;
    let mut position = 0u32;

    for (pos, &i) in order.as_slice().iter().enumerate() {
        position = pos as u32;
        let t = &route.targets[i as usize];
        if let Some(reason) = skip_reason(gw, t, call.surface) {
            log.push(AttemptLog {
                target: i,
                status: None,
                reason,
                duration: Duration::ZERO,
                retry_after: None,
            });
            continue;
        }
        let body = match &t.upstream_model_json {
            Some(m) => replace_model(&call.body, m).unwrap_or_else(|| call.body.clone()),
            None => call.body.clone(),
        };
        let mut tries = 0u32;
        let failure = loop {
            tries += 1;
            let now = Instant::now();
            if now >= budget {
                break Failure::bare(Reason::Budget);
            }
            sent += 1;
            let deadline = attempt_deadline(now, &t.spec, budget);
            let result = attempt(t, call, body.clone(), deadline, budget, route).await;
            let elapsed = now.elapsed();
            let f = match result {
                Attempted::Committed(response) => {
                    t.state.observe_latency(elapsed);
                    return Outcome {
                        response,
                        attempts: sent,
                        fallbacks: pos as u32,
                        target: Some(t.credential.target_header.clone()),
                        log,
                    };
                }
                Attempted::Failed(f) => f,
            };
            log.push(AttemptLog {
                target: i,
                status: f.status,
                reason: f.reason,
                duration: elapsed,
                retry_after: f.retry_after,
            });
            tracing::debug!(route = %route.spec.id, target = %t.label, status = ?f.status,
                reason = f.reason.as_str(), try_no = tries, "attempt failed");
            if f.reason == Reason::RateLimited
                && let Some(ra) = f.retry_after
            {
                t.state.park_until(gw.now_ms() + ra.as_millis() as u64);
                shortest_retry_after = Some(shortest_retry_after.map_or(ra, |s| s.min(ra)));
                if ra.as_millis() as u64 > route.spec.fallback.max_retry_after_ms {
                    break f; // abandon this target at once
                }
            }
            if tries >= t.spec.retry.attempts || !retryable(f.reason, f.status, &t.spec.retry) {
                break f;
            }
            let wait = match f.retry_after {
                Some(ra) if t.spec.retry.honour_retry_after => ra,
                _ => outcome::backoff(tries, &t.spec.retry, rand::random::<f64>()),
            };
            let resume = Instant::now() + wait;
            if resume >= budget {
                break f; // the wait does not fit the budget: let the next target try
            }
            sleep_until(resume).await;
        };
        if !may_advance(failure.reason, failure.status, &route.spec.fallback) {
            return finish_failed(
                route,
                call,
                failure,
                sent,
                pos as u32,
                log,
                shortest_retry_after,
            );
        }
        last_real = Some(failure);
        if Instant::now() >= budget {
            break;
        }
    }

    let last = last_real.unwrap_or_else(|| {
        let all_parked = !log.is_empty() && log.iter().all(|l| l.reason == Reason::Parked);
        if all_parked {
            let now = gw.now_ms();
            let soonest = route
                .targets
                .iter()
                .map(|t| t.state.parked_until_ms().saturating_sub(now))
                .min()
                .unwrap_or(0);
            shortest_retry_after = Some(Duration::from_millis(soonest));
            Failure::bare(Reason::Parked)
        } else {
            Failure::bare(Reason::MissingKey)
        }
    });
    finish_failed(route, call, last, sent, position, log, shortest_retry_after)
}

/// A target passed over before anything is sent to it. Circuit breakers and
/// concurrency queues add their reasons here.
fn skip_reason(gw: &Gateway, t: &TargetRt, surface: Surface) -> Option<Reason> {
    if !surface.served_by(t.credential.spec.provider) {
        return Some(Reason::UnsupportedSurface);
    }
    if t.credential.headers.is_none() {
        return Some(Reason::MissingKey);
    }
    if t.state.parked_until_ms() > gw.now_ms() {
        return Some(Reason::Parked);
    }
    None
}

async fn attempt(
    t: &TargetRt,
    call: &Call<'_>,
    body: Bytes,
    deadline: Instant,
    budget: Instant,
    route: &RouteRt,
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
    for name in FORWARDED {
        if let Some(v) = call.client_headers.get(name) {
            headers.insert(name, v.clone());
        }
    }
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let request = cred
        .client
        .post(cred.urls[call.surface.index()].clone())
        .headers(headers)
        .body(body);

    let response = match timeout_at(deadline, request.send()).await {
        Err(_) => return timed_out(),
        Ok(Err(e)) => {
            tracing::debug!(target = %t.label, error = %e, "upstream transport error");
            return Attempted::Failed(Failure::bare(Reason::ConnectionError));
        }
        Ok(Ok(r)) => r,
    };
    let status = response.status();
    let headers = response.headers().clone();
    if status.is_success() {
        let is_sse = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if call.stream && is_sse {
            let idle = Duration::from_millis(t.spec.timeout_ms.unwrap_or(route.spec.timeout_ms));
            return match timeout_at(deadline, first_event(response)).await {
                Err(_) => timed_out(),
                Ok(Err(_)) => Attempted::Failed(Failure::bare(Reason::ConnectionError)),
                Ok(Ok((first, upstream, framer))) => match sse::error_event(&first) {
                    Some(e) if !classify_status(e.status, &e.body).returns_upstream_answer() => {
                        Attempted::Failed(Failure {
                            reason: classify_status(e.status, &e.body),
                            status: Some(e.status),
                            retry_after: None,
                            answer: None,
                        })
                    }
                    _ => Attempted::Committed(commit_stream(
                        status,
                        &headers,
                        first,
                        upstream,
                        framer,
                        call.client_model_json.clone(),
                        call.surface.wire(),
                        idle,
                    )),
                },
            };
        }
        return match timeout_at(deadline, response.bytes()).await {
            Err(_) => timed_out(),
            Ok(Err(_)) => Attempted::Failed(Failure::bare(Reason::ConnectionError)),
            Ok(Ok(bytes)) => {
                let bytes = replace_model(&bytes, &call.client_model_json).unwrap_or(bytes);
                Attempted::Committed(relay(status, &headers, Body::from(bytes)))
            }
        };
    }

    let body = match timeout_at(deadline, read_capped(response, MAX_ERROR_BODY)).await {
        Err(_) => return timed_out(),
        Ok(Err(_)) => return Attempted::Failed(Failure::bare(Reason::ConnectionError)),
        Ok(Ok(b)) => b,
    };
    let code = status.as_u16();
    Attempted::Failed(Failure {
        reason: classify_status(code, &body),
        status: Some(code),
        retry_after: if code == 429 || code == 503 {
            outcome::retry_after(&headers, SystemTime::now())
        } else {
            None
        },
        answer: Some(UpstreamAnswer {
            status,
            headers,
            body,
        }),
    })
}

type Upstream = std::pin::Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

/// Read until the first complete SSE event; the rest stays in the framer/stream.
async fn first_event(response: reqwest::Response) -> reqwest::Result<(Bytes, Upstream, Framer)> {
    let mut upstream: Upstream = Box::pin(response.bytes_stream());
    let mut framer = Framer::default();
    loop {
        if let Some(ev) = framer.next_event() {
            return Ok((ev, upstream, framer));
        }
        match upstream.next().await {
            Some(chunk) => framer.push(&chunk?),
            None => {
                let rest = framer.take_rest().unwrap_or_default();
                return Ok((rest, upstream, framer));
            }
        }
    }
}

async fn read_capped(mut response: reqwest::Response, cap: usize) -> reqwest::Result<Bytes> {
    let mut buf = bytes::BytesMut::new();
    while let Some(chunk) = response.chunk().await? {
        let room = cap.saturating_sub(buf.len());
        buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if buf.len() >= cap {
            break;
        }
    }
    Ok(buf.freeze())
}

/// Hop-by-hop and framing headers are the gateway's own business.
fn relay_headers(from: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(from.len());
    for (name, value) in from {
        if matches!(
            name.as_str(),
            "connection"
                | "keep-alive"
                | "transfer-encoding"
                | "content-length"
                | "upgrade"
                | "proxy-connection"
                | "te"
                | "trailer"
                | "x-request-id"
        ) {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

fn relay(status: StatusCode, headers: &HeaderMap, body: Body) -> Response<Body> {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    *r.headers_mut() = relay_headers(headers);
    r
}

/// After commit: forward each event as soon as it is complete, with `model` set to
/// the client's name. A failure ends the stream with an error event; a stall longer
/// than the idle limit counts as a failure.
#[allow(clippy::too_many_arguments)]
fn commit_stream(
    status: StatusCode,
    headers: &HeaderMap,
    first: Bytes,
    upstream: Upstream,
    framer: Framer,
    model: JsonStr,
    wire: Wire,
    idle: Duration,
) -> Response<Body> {
    let first = replace_model(&first, &model).unwrap_or(first);
    struct State {
        upstream: Upstream,
        framer: Framer,
        model: JsonStr,
        wire: Wire,
        idle: Duration,
        done: bool,
    }
    let rest = stream::unfold(
        State {
            upstream,
            framer,
            model,
            wire,
            idle,
            done: false,
        },
        |mut st| async move {
            loop {
                if let Some(ev) = st.framer.next_event() {
                    let ev = replace_model(&ev, &st.model).unwrap_or(ev);
                    return Some((Ok::<_, Infallible>(ev), st));
                }
                if st.done {
                    return None;
                }
                match timeout(st.idle, st.upstream.next()).await {
                    Ok(Some(Ok(chunk))) => st.framer.push(&chunk),
                    Ok(None) => {
                        st.done = true;
                        let tail = st.framer.take_rest()?;
                        return Some((Ok(tail), st));
                    }
                    Ok(Some(Err(e))) => {
                        st.done = true;
                        tracing::debug!(error = %e, "upstream stream failed after commit");
                        let ev = sse::failure_event(
                            st.wire,
                            "the upstream stream failed after it had started",
                        );
                        return Some((Ok(ev), st));
                    }
                    Err(_) => {
                        st.done = true;
                        let ev = sse::failure_event(
                            st.wire,
                            "the upstream stream stalled after it had started",
                        );
                        return Some((Ok(ev), st));
                    }
                }
            }
        },
    );
    let body = stream::once(async move { Ok::<_, Infallible>(first) }).chain(rest);
    relay(status, headers, Body::from_stream(body))
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
            response: relay(a.status, &a.headers, Body::from(a.body)),
            attempts: sent,
            fallbacks,
            target: last_target,
            log,
        };
    }
    let (status, code, message) = match failure.reason {
        Reason::RateLimited | Reason::Parked => (
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            "every target of this route is rate limited",
        ),
        Reason::Timeout | Reason::Budget => (
            StatusCode::GATEWAY_TIMEOUT,
            "upstream_timeout",
            "no target answered within the time allowed",
        ),
        Reason::Status5xx | Reason::ConnectionError => (
            StatusCode::BAD_GATEWAY,
            "all_providers_failed",
            "every target that was tried failed",
        ),
        // Every target skipped (missing keys, surfaces it cannot serve), or a 4xx
        // class that came without an answer to relay (an in-band stream error).
        Reason::MissingKey | Reason::UnsupportedSurface => (
            StatusCode::SERVICE_UNAVAILABLE,
            "no_available_target",
            "no target of this route can take the request",
        ),
        Reason::ContextLength | Reason::AuthError | Reason::ClientError => (
            StatusCode::BAD_GATEWAY,
            "upstream_error",
            "the provider rejected the request in its stream",
        ),
    };
    let views: Vec<AttemptView<'_>> = log
        .iter()
        .map(|l| {
            let t = &route.targets[l.target as usize];
            AttemptView {
                target: &t.label,
                model: t.spec.model.as_deref().unwrap_or(call.client_model),
                status: l.status,
                reason: l.reason.as_str(),
                duration_ms: l.duration.as_millis() as u64,
            }
        })
        .collect();
    let body = surface::error_body(wire, status.as_u16(), code, message, &views);
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if status == StatusCode::TOO_MANY_REQUESTS
        && let Some(ra) = shortest_retry_after
    {
        // Round up: a client that waits the whole seconds given must not be early.
        let secs = ra.as_millis().div_ceil(1000) as u64;
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    Outcome {
        response,
        attempts: sent,
        fallbacks,
        target: None,
        log,
    }
}
