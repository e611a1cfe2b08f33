//! One try on one target, sent upstream: the request made (the provider's headers,
//! the client's own few, the URL, the authorisation), sent within the attempt's
//! deadline, and its answer read: a 2xx handed to `stream` or `answer` to commit, any
//! other answer classified as the failure it is (in the provider's own words) and
//! kept in the client's shape should it be relayed.
//!
//! The walk reaches this through `attempt::Transport`, so its tests can script
//! answers.

use std::sync::Arc;
use std::time::SystemTime;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode, header};
use bytes::Bytes;
use tokio::time::{Instant, timeout_at};

use super::answer::{Capping, Unanswered};
use super::attempt::{Attempt, Attempted, Failure, Transport, UpstreamAnswer, timed_out};
use super::stream::{self, LineSlot, NotCommitted, StreamAttempt};
use super::{answer, relay};
use crate::observe::counters;
use crate::observe::reason::Reason;
use crate::observe::telemetry;
use crate::providers::classify::{self, classify_status};
use crate::providers::translate;
use crate::providers::{Authorising, Unsigned};
use crate::upstream;
use crate::upstream::Incoming;
use crate::wire::headers::{X_HOPS, X_REQUEST_ID};
use crate::wire::hops;

/// Client headers passed on to providers, besides `x-request-id` (`Call::request_id`),
/// each only to a provider of its API (see `Adapter::forwards`). Everything else
/// (notably `authorization` and `x-api-key`) stays with the gateway. Names, not
/// strings: a `&str` lookup parses the name again on every request.
const FORWARDED: [HeaderName; 3] = [
    HeaderName::from_static("anthropic-version"),
    HeaderName::from_static("anthropic-beta"),
    HeaderName::from_static("openai-beta"),
];

/// Error bodies bigger than this are cut: they are read only to classify and relay.
const MAX_ERROR_BODY: usize = 1 << 20;

/// The proxy's upstream HTTP clients.
///
/// One flat future on the request path: the steps that do not wait are plain
/// functions, and each await is made here (a nested async fn would be moved into
/// its parent's state as it is built, a copy of its size per request).
pub(super) struct Http;

impl Transport for Http {
    async fn attempt(&self, a: Attempt<'_, '_>) -> Attempted {
        let (gw, t) = (a.gw, a.target);
        let (uri, mut headers) = match request_parts(&a) {
            Ok(parts) => parts,
            Err(reason) => return Attempted::Failed(Failure::bare(reason)),
        };
        let unsigned = Unsigned {
            uri: &uri,
            headers: &mut headers,
            body: &a.plan.body,
            client: t.credential.client.here(),
        };
        let authorised = match t.credential.endpoint.authorise(unsigned) {
            Authorising::Done(done) => done,
            Authorising::Pending(pending) => match timeout_at(a.deadline, pending).await {
                Ok(done) => done,
                Err(_) => Err(authorisation_late(&a)),
            },
        };
        if let Err(reason) = authorised {
            return Attempted::Failed(Failure::bare(reason));
        }
        let mut request = hyper::Request::new(upstream::Body::new(a.plan.body.clone()));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = uri;
        *request.headers_mut() = headers;
        let client = t.credential.client.here();
        // A unary call for a billed client goes through `Unanswered`: should the
        // client go away, what is in flight is read to its end and counted.
        let mut unanswered = Unanswered::new(&a);
        let future = unanswered.response.insert(client.request(request));
        let response = match timeout_at(a.deadline, future).await {
            Err(_) => return Attempted::Failed(Failure::bare(timed_out(a.budget))),
            Ok(Err(e)) => {
                tracing::debug!(target = %t.label, error = %e, "upstream transport error");
                return Attempted::Failed(Failure::bare(Reason::ConnectionError));
            }
            Ok(Ok(r)) => r,
        };
        // Answered: from here on the read is what a client walking away leaves.
        unanswered.response = None;
        let (parts, body) = response.into_parts();
        let (status, headers) = (parts.status, parts.headers);
        if !status.is_success() {
            return Attempted::Failed(failure(&a, status, headers, body).await);
        }
        if relay::is_encoded(&headers) {
            // Asked for `identity` and sent something else: unusable here.
            return Attempted::Failed(Failure::bare(Reason::InvalidResponse));
        }
        if a.call.stream && streamed(&a, &headers) {
            let (deadline, budget) = (a.deadline, a.budget);
            // Boxed: the opening of a stream is most of an attempt's state, and a
            // unary call would carry it too.
            let opened = Box::pin(stream::start_stream(
                status,
                headers,
                body,
                deadline,
                stream_attempt(a),
            ))
            .await;
            return committed(opened, budget);
        }
        let read = match Capping::start(body, gw.upstream_limits.max_response_bytes, &gw.answers) {
            Ok(reading) => {
                let reading = unanswered.reading.insert(reading);
                let read = timeout_at(a.deadline, reading.read()).await;
                unanswered.reading = None;
                read
            }
            Err(refused) => Ok(Ok(refused)),
        };
        match answer::capped(&a, read) {
            Ok((bytes, held)) => answer::unary(&a, status, headers, bytes, held),
            Err(reason) => Attempted::Failed(Failure::bare(reason)),
        }
    }
}

/// The upstream request's URL and headers: the credential's headers, the request id,
/// the hop count (one more than the client's: over the credential's static headers
/// too, which cannot reset it), the client's headers of the upstream's API, content
/// type and trace context. The endpoint authorises them next.
fn request_parts(a: &Attempt<'_, '_>) -> Result<(http::Uri, HeaderMap), Reason> {
    let (t, call, plan) = (a.target, a.call, a.plan);
    let cred = &t.credential;
    if cred.keys.is_empty() {
        return Err(Reason::MissingKey);
    }
    let key = cred.keys.get(a.key);
    counters::inc(&key.state.attempts);
    let mut headers = key.headers.clone();
    headers.insert(X_REQUEST_ID, call.request_id.clone());
    headers.insert(X_HOPS, hops::value(call.hops + 1));
    for name in FORWARDED {
        if cred.adapter.forwards(plan.exchange.dialect, &name)
            && let Some(v) = call.client_headers.get(&name)
        {
            headers.insert(name, v.clone());
        }
    }
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    telemetry::propagate(a.span, call.client_headers, &mut headers);
    let surface = plan.exchange.upstream_surface(call.surface);
    let Some(uri) = t.url(surface, call.client_model, call.stream) else {
        // A deployment or model name no URL can carry: nothing was sent.
        return Err(Reason::UnsupportedParameter);
    };
    Ok((uri, headers))
}

/// An authorisation (a token exchange) that did not finish before the attempt's
/// deadline: an `authError`, unless the call's budget is what ran out.
fn authorisation_late(a: &Attempt<'_, '_>) -> Reason {
    if Instant::now() >= a.budget {
        return Reason::Budget;
    }
    tracing::warn!(target_credential = %a.target.label,
        "no authorisation before the attempt's deadline");
    Reason::AuthError
}

/// Is this 2xx a stream in the upstream's stream type?
fn streamed(a: &Attempt<'_, '_>, headers: &HeaderMap) -> bool {
    let stream_type = match a.plan.translation {
        Some(tr) => tr.upstream().stream_type(),
        None => "text/event-stream",
    };
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with(stream_type))
}

/// What committing a stream needs of the attempt (its slot goes with it).
fn stream_attempt<'a>(a: Attempt<'a, '_>) -> StreamAttempt<'a> {
    let (gw, t, call, plan) = (a.gw, a.target, a.call, a.plan);
    let (model_json, model) = call.answer_model(a.route, t);
    StreamAttempt {
        target: t,
        route: a.route,
        max_event_bytes: gw.upstream_limits.max_event_bytes,
        refused: &gw.refused,
        model: model_json,
        surface: call.surface,
        translator: plan.translation.map(|tr| {
            let usage = call
                .include_usage
                .unwrap_or_else(|| translate::include_usage(&call.body));
            (tr, model, usage)
        }),
        permit: a.permit,
        client: call.client.cloned(),
        pricing: t.pricing,
        strip_usage: call.strip_usage && plan.translation.is_none(),
        reservation: call.reservation,
        prompt_bytes: call.body.len(),
        started: a.started,
        genai: t
            .counters
            .genai
            .at(call.surface.operation(), t.model(call.client_model)),
    }
}

/// A stream's opening, as the try's outcome.
fn committed(
    opened: Result<(Response<Body>, Arc<LineSlot>), NotCommitted>,
    budget: Instant,
) -> Attempted {
    match opened {
        Ok((response, line)) => Attempted::Committed(response, Some(line)),
        Err(NotCommitted::TimedOut) => Attempted::Failed(Failure::bare(timed_out(budget))),
        Err(NotCommitted::Failed(reason, status)) => Attempted::Failed(Failure {
            reason,
            status,
            retry_after: None,
            answer: None,
        }),
    }
}

/// An answer that is not a success, read (cut at [`MAX_ERROR_BODY`]; without the
/// key, should the provider echo it) and classified on the provider's own words,
/// kept in the client's shape should it be relayed.
async fn failure(
    a: &Attempt<'_, '_>,
    status: StatusCode,
    headers: HeaderMap,
    body: Incoming,
) -> Failure {
    let cred = &a.target.credential;
    let body = match timeout_at(a.deadline, upstream::read_cut(body, MAX_ERROR_BODY)).await {
        Err(_) => return Failure::bare(timed_out(a.budget)),
        Ok(Err(_)) => return Failure::bare(Reason::ConnectionError),
        // A body the proxy cannot read is not relayed as if it were plain: the
        // status alone answers.
        Ok(Ok(_)) if relay::is_encoded(&headers) => Bytes::new(),
        // Some providers echo the key they refused: never relayed to the client.
        Ok(Ok(b)) => relay::mask_keys(b, cred.keys.secrets()),
    };
    let code = status.as_u16();
    let translation = a.plan.translation;
    // An API may type its errors apart from the status (a header): the status to
    // classify by, and the body with the type written in.
    let (class_code, body) = match translation {
        Some(tr) => tr.upstream().error_answer(code, &headers, body),
        None => (code, body),
    };
    let retry_after = if code == 429 || code == 503 {
        classify::retry_after(&headers, SystemTime::now()).or_else(|| classify::retry_delay(&body))
    } else {
        None
    };
    Failure {
        reason: classify_status(class_code, &body),
        status: Some(code),
        retry_after,
        answer: Some(UpstreamAnswer {
            status,
            headers,
            // Classified on the provider's own words; relayed in the client's shape.
            body: match translation {
                Some(tr) => translate::error(tr, code, &body),
                None => cred.adapter.relay_error(code, body),
            },
        }),
    }
}
