//! The gateway's own answer when the walk ends without a committed one: the last
//! failure's upstream answer relayed unchanged when it speaks about the request
//! (context length, auth, another 4xx, a content filter), else an error in the
//! client's shape whose status says how the chain ended
//! (docs/request-lifecycle.md#what-each-outcome-does: 429 `rate_limited`, 504
//! `upstream_timeout`, 502 `all_providers_failed`, 503 `no_available_target`;
//! docs/limits.md#no-loops: 508 `loop_detected`), with the attempt log as `attempts`.

use std::borrow::Cow;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, Response, StatusCode, header};

use super::attempt::Failure;
use super::call::{Call, Outcome};
use super::log::AttemptLog;
use super::relay::relay;
use crate::config::snapshot::RouteRt;
use crate::observe::reason::Reason;
use crate::providers::classify;
use crate::providers::translate::TranslateError;
use crate::wire::surface::{self, AttemptView, Surface, Wire};

pub(super) fn finish_failed(
    route: &RouteRt,
    call: &Call<'_>,
    failure: Failure,
    sent: u32,
    fallbacks: u32,
    log: Vec<AttemptLog>,
    shortest_retry_after: Option<Duration>,
) -> Outcome {
    let outcome = |response, (target, model)| Outcome {
        response,
        attempts: sent,
        fallbacks,
        target,
        model,
        answered_by: None,
        log: Vec::new(),
        stream_line: None,
    };
    if failure.reason.returns_upstream_answer()
        && let Some(a) = failure.answer
    {
        // The answer is the last target's: its credential and model.
        let last = log.last().map(|l| &route.targets[l.target as usize]);
        let last_target = (
            last.map(|t| t.credential.target_header.clone()),
            last.and_then(|t| t.model_header(call.client_model)),
        );
        let response = relay(a.status, a.headers, Body::from(a.body));
        return Outcome {
            log,
            ..outcome(response, last_target)
        };
    }
    let (status, code, message) = error_for(&failure, route, call.surface, &log);
    let views = attempt_views(route, call, &log);
    let body = surface::error_body(call.surface.wire(), status.as_u16(), code, &message, &views);
    let mut response = surface::json_response(status, body);
    if status == StatusCode::TOO_MANY_REQUESTS
        && let Some(ra) = shortest_retry_after
    {
        // Round up: a client that waits the whole seconds given must not be early.
        let secs = classify::millis(ra).div_ceil(1000);
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
        log,
        ..outcome(response, (None, None))
    }
}

/// The status, code and message of the gateway's error for the failure the chain
/// ended on.
fn error_for(
    failure: &Failure,
    route: &RouteRt,
    surface: Surface,
    log: &[AttemptLog],
) -> (StatusCode, &'static str, Cow<'static, str>) {
    match failure.reason {
        // Nothing but targets that cannot serve the API called: still the 503 of
        // docs/request-lifecycle.md#when-the-chain-stops for "all skipped", but the message
        // says which targets and why.
        Reason::UnsupportedSurface if log.iter().all(|l| l.reason == failure.reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "no_available_target",
            unsupported_surface(route, surface, log).into(),
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
        | Reason::EventTooLarge
        // Never what a chain ends on (a cancelled attempt of a hedge is only logged).
        | Reason::HedgeLost => (
            StatusCode::BAD_GATEWAY,
            "all_providers_failed",
            "every target that was tried failed".into(),
        ),
        // Every target skipped: missing keys, open circuits, full queues (some of them
        // perhaps also unable to serve the API called).
        Reason::MissingKey
        | Reason::UnsupportedSurface
        | Reason::CircuitOpen
        | Reason::RampingUp
        | Reason::QueueFull
        | Reason::UnsupportedParameter
        // Only a resume's walk skips for it, and it ends in no error of its own.
        | Reason::CannotResume
        // With other skips beside it (a 400 when every target refused, see
        // `unservable_request`).
        | Reason::UnsupportedFeature => (
            StatusCode::SERVICE_UNAVAILABLE,
            "no_available_target",
            "no target of this route can take the request".into(),
        ),
        // No answer to relay: the endpoint could not authorise the request (a token
        // exchange failed).
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
        // The last target led back to a gateway: said as the gateway that refused it
        // said it, so the hop before this one does not retry it either.
        Reason::LoopDetected => (
            StatusCode::LOOP_DETECTED,
            "loop_detected",
            "loop detected: a target's credential leads back to a Switchback gateway the \
             request had passed through (x-switchback-hops reached --max-hops)"
                .into(),
        ),
        // The answer came but this replica may hold no more answers now: the same
        // answer as for a body over the in-flight budget.
        Reason::Overloaded => (
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            "the gateway holds as many provider answers as it may; retry in a second".into(),
        ),
    }
}

/// The attempt log as the error body's `attempts`.
fn attempt_views<'a>(
    route: &'a RouteRt,
    call: &'a Call<'_>,
    log: &[AttemptLog],
) -> Vec<AttemptView<'a>> {
    log.iter()
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
        .collect()
}

/// Why no target of the route can serve the API the client called (the Responses
/// API on a route of Anthropic targets, embeddings on one of Anthropic targets):
/// each target and what it is.
fn unsupported_surface(route: &RouteRt, surface: Surface, log: &[AttemptLog]) -> String {
    let why: Vec<String> = log
        .iter()
        .map(|l| {
            let t = &route.targets[l.target as usize];
            format!(
                "{} is {}",
                t.label,
                t.credential.adapter.refusal(surface, &t.credential.spec)
            )
        })
        .collect();
    format!(
        "no target of route {} can serve {}: {}",
        route.spec.id,
        surface.endpoint(),
        why.join("; ")
    )
}

/// No target of the route can serve what the request needs
/// (docs/translation.md#a-target-that-cannot-serve-a-feature): each one refused it in
/// translation (`refused`: a feature its API lacks, a malformed body) or cannot serve the
/// API called. A 400 in the client's shape naming the field (the first refusal's, OpenAI's
/// `param`) and every target tried with why, with the attempt log as `attempts`.
pub(super) fn unservable_request(
    route: &RouteRt,
    call: &Call<'_>,
    refused: &[(u8, TranslateError)],
    log: &[AttemptLog],
) -> Response<Body> {
    let why: Vec<String> = log
        .iter()
        .map(|l| {
            let t = &route.targets[l.target as usize];
            match refused.iter().find(|(i, _)| *i == l.target) {
                Some((_, e)) => match e.param() {
                    Some(p) => format!("{}: {} ({p})", t.label, e.message()),
                    None => format!("{}: {}", t.label, e.message()),
                },
                None => format!(
                    "{}: {} is {}",
                    t.label,
                    call.surface.endpoint(),
                    t.credential
                        .adapter
                        .refusal(call.surface, &t.credential.spec)
                ),
            }
        })
        .collect();
    let first = &refused[0].1;
    let message = format!(
        "no target of route {} can serve this request: {}",
        route.spec.id,
        why.join("; ")
    );
    let views = attempt_views(route, call, log);
    let body = match call.surface.wire() {
        Wire::OpenAi => serde_json::json!({"error": {
            "message": message,
            "type": "invalid_request_error",
            "param": first.param(),
            "code": first.code(),
            "attempts": views,
        }}),
        Wire::Anthropic => serde_json::json!({"type": "error", "error": {
            "type": "invalid_request_error",
            "message": message,
            "code": first.code(),
            "attempts": views,
        }}),
    };
    surface::json_response(
        StatusCode::BAD_REQUEST,
        serde_json::to_vec(&body).unwrap_or_default(),
    )
}
