//! The data port (default 8080): the OpenAI- and Anthropic-compatible endpoints.
//! A request that has passed through `--max-hops` gateways is refused (508
//! `loop_detected`, before anything else: `wire::hops`), then it is authenticated
//! (`auth`), its body read within the client limits
//! (`front::intake`), its route picked by the body's `model` among those the client
//! may call, its client admitted (`limits::clients`), and the call handed to the
//! pipeline (`route`); every answer carries `x-request-id` and the `x-switchback-*`
//! headers, and its request log line (`request_line`). The answers the data port
//! gives itself are `answers`; `GET /v1/models` is `models`.
//!
//! It owns client-facing HTTP: it knows no provider and no upstream.

mod answers;
pub mod auth;
mod models;
mod request_line;
mod route;
mod stamp;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Response, StatusCode};
use axum::routing::{get, post};

use crate::front::intake;
use crate::gateway::Gateway;
use crate::wire::headers::{X_GENERATION, X_REQUEST_ID};
use crate::wire::surface::{Surface, Wire};
use answers::{gateway_error, hops_refused, refusal, unauthenticated};
use stamp::{request_id, unrouted};

/// The body limit and timeout are applied by [`intake`], not by an extractor.
pub(crate) fn data_router(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/messages", post(messages))
        .route("/v1/responses", post(responses))
        .route("/v1/models", get(models::models))
        .fallback(|State(gw), headers| not_served(gw, headers, StatusCode::NOT_FOUND))
        .method_not_allowed_fallback(|State(gw), headers| {
            not_served(gw, headers, StatusCode::METHOD_NOT_ALLOWED)
        })
        .with_state(gw)
}

/// An answer of the data port made without the router.
pub(crate) type DirectAnswer =
    std::pin::Pin<Box<dyn std::future::Future<Output = Response<Body>> + Send>>;

/// The data port's POST endpoints, answered without the router: the same handler
/// the router would call, without its path match, extractors and layers
/// (docs/benchmark.md#where-a-requests-cpu-goes). Anything else (another path or
/// method, `GET /v1/models`) is `None`, for [`data_router`], which still answers
/// every route.
pub(crate) fn direct_surface(request: &http::Request<hyper::body::Incoming>) -> Option<Surface> {
    if request.method() != http::Method::POST {
        return None;
    }
    match request.uri().path() {
        "/v1/chat/completions" => Some(Surface::ChatCompletions),
        "/v1/embeddings" => Some(Surface::Embeddings),
        "/v1/messages" => Some(Surface::Messages),
        "/v1/responses" => Some(Surface::Responses),
        _ => None,
    }
}

/// The answer to a request [`direct_surface`] placed.
pub(crate) fn direct(
    gw: &Arc<Gateway>,
    surface: Surface,
    request: http::Request<hyper::body::Incoming>,
) -> DirectAnswer {
    let gw = gw.clone();
    Box::pin(async move { handle(&gw, surface, request.map(Body::new)).await })
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

async fn chat(State(gw): State<Arc<Gateway>>, request: Request) -> Response<Body> {
    handle(&gw, Surface::ChatCompletions, request).await
}

async fn embeddings(State(gw): State<Arc<Gateway>>, request: Request) -> Response<Body> {
    handle(&gw, Surface::Embeddings, request).await
}

async fn messages(State(gw): State<Arc<Gateway>>, request: Request) -> Response<Body> {
    handle(&gw, Surface::Messages, request).await
}

/// The OpenAI Responses API, passed through to the targets that serve it
/// (docs/responses-api.md#the-responses-api).
async fn responses(State(gw): State<Arc<Gateway>>, request: Request) -> Response<Body> {
    handle(&gw, Surface::Responses, request).await
}

async fn handle(gw: &Arc<Gateway>, surface: Surface, request: Request) -> Response<Body> {
    // Only the headers are kept: the rest of the head (URI, extensions) would be held
    // in this future's state, and copied with it, until the answer.
    let (http::request::Parts { headers, .. }, body) = request.into_parts();
    // Carried apart from the client's headers (which keep whatever the client sent):
    // the attempt pipeline forwards this one.
    let request_id = request_id(&headers);
    let wire = surface.wire();
    let snapshot = gw.snapshot();
    // A loop is refused before anything else: nothing read, nothing sent on.
    let hops = crate::wire::hops::incoming(&headers, gw.front.limits.max_hops);
    let mut response = match hops {
        Err(refused) => hops_refused(wire, refused, &gw.front),
        // Before the body is read: an unauthenticated caller spends no body budget.
        Ok(hops) => match auth::authenticate(&gw.auth, &snapshot, &headers) {
            Err(denied) => unauthenticated(wire, denied),
            Ok(tenant) => match intake::read(&gw.front, gw.max_body_bytes, body).await {
                Err(refused) => refusal(wire, refused, gw),
                // The body's budget bytes are held until the answer head is out.
                Ok((body, _held)) => {
                    let request = route::Request {
                        surface,
                        headers: &headers,
                        request_id: &request_id,
                        hops,
                    };
                    route::route_and_run(gw, &snapshot, tenant, request, body).await
                }
            },
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
