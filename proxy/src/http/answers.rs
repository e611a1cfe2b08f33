//! The answers the data port gives itself, in the surface's error shape with the
//! headers every answer carries: a request refused before it was routed (508 for a
//! loop, 401, 400, 404, 405, 408, 413, 503) or a client over its limits or budget
//! (429). Nothing was sent upstream for any of them.

use axum::body::Body;
use axum::http::{HeaderValue, Response, StatusCode, header};

use super::auth;
use crate::config::snapshot::RouteRt;
use crate::front::intake::Refused;
use crate::front::{Front, Refusals};
use crate::gateway::Gateway;
use crate::limits::clients::{ClientRt, Throttled, USD_PER_MONTH, Uncovered};
use crate::wire::headers::{X_ATTEMPTS, X_FALLBACKS, X_GENERATION, X_ROUTE};
use crate::wire::hops;
use crate::wire::surface::{self, Wire};

/// 401 in the surface's shape (`invalid_api_key`). The body was not read, so the
/// connection is closed after it.
pub(super) fn unauthenticated(wire: Wire, denied: auth::Denied) -> Response<Body> {
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

/// A request whose `x-switchback-hops` refused it (counted): 508 `loop_detected`, or
/// 400 `invalid_request` for a count that is not a number. The body was not read, so
/// the connection is closed after it.
pub(super) fn hops_refused(wire: Wire, refused: hops::Refused, front: &Front) -> Response<Body> {
    Refusals::count(&front.refusals.hops);
    let (status, code) = match refused {
        hops::Refused::Loop { .. } => (StatusCode::LOOP_DETECTED, "loop_detected"),
        hops::Refused::Unreadable => (StatusCode::BAD_REQUEST, "invalid_request"),
    };
    tracing::info!(
        target: "switchback::request",
        status = status.as_u16(),
        code,
        "request refused for its x-switchback-hops: {}",
        refused.message()
    );
    let mut r = gateway_error(wire, status, code, &refused.message());
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// The answer to a body `front::intake` did not take. The connection is closed after it:
/// the rest of the body may still be on its way.
pub(super) fn refusal(wire: Wire, refused: Refused, gw: &Gateway) -> Response<Body> {
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

/// A 429 for a client over a limit (`rate_limited`) or with a spent budget
/// (`budget_exhausted`), with `Retry-After`; nothing was sent upstream.
pub(super) fn throttled(
    wire: Wire,
    route: &RouteRt,
    client: &ClientRt,
    t: Throttled,
) -> Response<Body> {
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
        Throttled::NotCovered(u) => ("budget_exhausted", u.retry_after, uncovered(client, u)),
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

/// Why a request's reservation did not fit (docs/tenancy.md#reserve-before-sending), naming
/// the output cap that makes it up when one does.
fn uncovered(client: &ClientRt, u: &Uncovered) -> String {
    let usd = u.budget == USD_PER_MONTH;
    let amount = |n: u64| {
        if usd {
            format!("{:.6} USD", n as f64 / 1e6)
        } else {
            format!("{n} tokens")
        }
    };
    let need = if usd { u.need.micro_usd } else { u.need.tokens };
    let what = match u.need.cap {
        Some((field, n)) => format!("{field} ({n}) plus the input estimate ({})", u.need.input),
        // An embeddings request reserves its input only.
        None if u.need.output == 0 => format!("the input estimate ({})", u.need.input),
        None => format!(
            "the default reservation ({}, budget.defaultReservation: the request sets no \
             max_tokens) plus the input estimate ({})",
            u.need.output, u.need.input
        ),
    };
    let left = u.share.saturating_sub(u.spent);
    if u.never_fits() {
        let advice = match u.need.cap {
            Some((field, _)) => format!("lower {field}"),
            None if u.need.output == 0 => "send less input".into(),
            None => "set a max_tokens below it (or lower budget.defaultReservation)".into(),
        };
        format!(
            "the LLMClient {} cannot reserve {} for this request ({what}): {} of \
             budget.{} is left on this replica (its share); {advice}, or retry after {} s",
            client.label,
            amount(need),
            amount(left),
            u.budget,
            u.retry_after,
        )
    } else {
        format!(
            "the LLMClient {} cannot reserve {} for this request ({what}): of the {} of \
             budget.{} left on this replica, requests in flight hold {}; retry after {} s",
            client.label,
            amount(need),
            amount(left),
            u.budget,
            amount(u.reserved),
            u.retry_after,
        )
    }
}

pub(super) fn gateway_error(
    wire: Wire,
    status: StatusCode,
    code: &str,
    message: &str,
) -> Response<Body> {
    let body = surface::error_body(wire, status.as_u16(), code, message, &[]);
    let mut r = surface::json_response(status, body);
    r.headers_mut().insert(X_ATTEMPTS, HeaderValue::from(0u32));
    r.headers_mut().insert(X_FALLBACKS, HeaderValue::from(0u32));
    r
}
