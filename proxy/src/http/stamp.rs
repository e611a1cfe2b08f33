//! What every data-port answer carries besides the route's headers: the request id
//! the client sent (when usable) or one made for it, and, for an answer given before
//! a route was chosen, the config's generation.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Response};

use crate::config::snapshot::Snapshot;
use crate::wire::headers::{X_GENERATION, X_REQUEST_ID};

/// An answer given before a route was chosen: its `x-switchback-generation` is the
/// config's (the load count the request saw), there being no route's to give.
pub(super) fn unrouted(snapshot: &Snapshot, mut response: Response<Body>) -> Response<Body> {
    response
        .headers_mut()
        .insert(X_GENERATION, snapshot.generation.0.clone());
    response
}

/// The client's `x-request-id` when it sent a usable one, else a new one.
pub(super) fn request_id(headers: &HeaderMap) -> HeaderValue {
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
