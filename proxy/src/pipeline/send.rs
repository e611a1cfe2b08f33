//! One try on one target, sent upstream: the request made (the provider's headers,
//! the client's own few, the URL, the authorisation), sent within the attempt's
//! deadline, and its answer read: a 2xx handed to `stream` or `answer` to commit, any
//! other answer classified as the failure it is (in the provider's own words) and
//! kept in the client's shape should it be relayed.
//!
//! The walk reaches this through `attempt::Transport`, so its tests can script
//! answers.

use std::time::SystemTime;

use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use bytes::Bytes;
use hyper::body::Incoming;
use tokio::time::{Instant, timeout_at};

use super::attempt::{Attempt, Attempted, Failure, Transport, UpstreamAnswer, timed_out};
use super::stream::{self, NotCommitted, StreamAttempt};
use super::{answer, relay};
use crate::observe::reason::Reason;
use crate::observe::telemetry;
use crate::providers::classify::{self, classify_status};
use crate::providers::translate;
use crate::providers::{Authorising, Unsigned};
use crate::upstream;
use crate::wire::headers::X_REQUEST_ID;

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
pub(super) struct Http;

impl Transport for Http {
    async fn attempt(&self, a: Attempt<'_, '_>) -> Attempted {
        let timed_out = || Attempted::Failed(Failure::bare(timed_out(a.budget)));
        let request = match request(&a).await {
            Ok(r) => r,
            Err(f) => return Attempted::Failed(f),
        };
        let client = a.target.credential.client.here();
        let response = match timeout_at(a.deadline, client.request(request)).await {
            Err(_) => return timed_out(),
            Ok(Err(e)) => {
                tracing::debug!(target = %a.target.label, error = %e, "upstream transport error");
                return Attempted::Failed(Failure::bare(Reason::ConnectionError));
            }
            Ok(Ok(r)) => r,
        };
        let (parts, body) = response.into_parts();
        if parts.status.is_success() {
            success(a, parts.status, parts.headers, body).await
        } else {
            Attempted::Failed(failure(&a, parts.status, parts.headers, body).await)
        }
    }
}

/// The upstream request: the credential's headers, the request id, the client's
/// headers of the upstream's API, content type and trace context, the URL, then the
/// endpoint's authorisation over all of it.
async fn request(a: &Attempt<'_, '_>) -> Result<hyper::Request<upstream::Body>, Failure> {
    let (t, call, plan) = (a.target, a.call, a.plan);
    let cred = &t.credential;
    let Some(base) = &cred.headers else {
        return Err(Failure::bare(Reason::MissingKey));
    };
    let mut headers = base.clone();
    headers.insert(X_REQUEST_ID, call.request_id.clone());
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
        return Err(Failure::bare(Reason::UnsupportedParameter));
    };
    authorise(a, &uri, &mut headers).await?;
    let mut request = hyper::Request::new(upstream::Body::new(plan.body.clone()));
    *request.method_mut() = Method::POST;
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;
    Ok(request)
}

/// The endpoint's authorisation of the final request, within the attempt's deadline:
/// one that cannot finish by then is an `authError` (the call's budget running out
/// is not).
async fn authorise(
    a: &Attempt<'_, '_>,
    uri: &http::Uri,
    headers: &mut HeaderMap,
) -> Result<(), Failure> {
    let cred = &a.target.credential;
    let unsigned = Unsigned {
        uri,
        headers,
        body: &a.plan.body,
        client: cred.client.here(),
    };
    let done = match cred.endpoint.authorise(unsigned) {
        Authorising::Done(done) => done,
        Authorising::Pending(pending) => match timeout_at(a.deadline, pending).await {
            Ok(done) => done,
            Err(_) if Instant::now() >= a.budget => Err(Reason::Budget),
            Err(_) => {
                tracing::warn!(target_credential = %a.target.label,
                    "no authorisation before the attempt's deadline");
                Err(Reason::AuthError)
            }
        },
    };
    done.map_err(Failure::bare)
}

/// A 2xx: a stream in the upstream's stream type, when the client asked for one, is
/// opened and committed (`stream`); anything else is read whole (`answer`).
async fn success(
    a: Attempt<'_, '_>,
    status: StatusCode,
    headers: HeaderMap,
    body: Incoming,
) -> Attempted {
    let (gw, t, call, plan) = (a.gw, a.target, a.call, a.plan);
    if relay::is_encoded(&headers) {
        // Asked for `identity` and sent something else: unusable here.
        return Attempted::Failed(Failure::bare(Reason::InvalidResponse));
    }
    let stream_type = match plan.translation {
        Some(tr) => tr.upstream().stream_type(),
        None => "text/event-stream",
    };
    let streamed = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with(stream_type));
    if !(call.stream && streamed) {
        return answer::unary(&a, status, headers, body).await;
    }
    let stream = StreamAttempt {
        target: t,
        route: a.route,
        max_event_bytes: gw.upstream_limits.max_event_bytes,
        refused: &gw.refused,
        model: &call.client_model_json,
        surface: call.surface,
        translator: plan.translation.map(|tr| {
            let usage = call
                .include_usage
                .unwrap_or_else(|| translate::include_usage(&call.body));
            (tr, call.client_model, usage)
        }),
        permit: a.permit,
        client: call.client.cloned(),
        price: t.spec.price,
        strip_usage: call.strip_usage && plan.translation.is_none(),
    };
    // Boxed: the opening of a stream is most of an attempt's state, and a unary
    // call would carry it too.
    match Box::pin(stream::start_stream(
        status, headers, body, a.deadline, stream,
    ))
    .await
    {
        Ok((response, line)) => Attempted::Committed(response, Some(line)),
        Err(NotCommitted::TimedOut) => Attempted::Failed(Failure::bare(timed_out(a.budget))),
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
        Ok(Ok(b)) => match &cred.secret {
            Some(key) => relay::mask_key(b, key.expose()),
            None => b,
        },
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
