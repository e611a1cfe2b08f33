//! `GET /v1/models`: the model names of the routes the client may call (every route
//! with authentication off), in the OpenAI list shape, or Anthropic's when the
//! client sends `anthropic-version`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Response, StatusCode};

use super::answers::unauthenticated;
use super::auth;
use super::stamp::{request_id, unrouted};
use crate::config::snapshot::Snapshot;
use crate::gateway::Gateway;
use crate::wire::headers::X_REQUEST_ID;
use crate::wire::surface::{Wire, pretty_json};

/// `GET /v1/models`: every model name a route serves (with authentication, every one
/// the client may call), in the OpenAI list shape, or the Anthropic one when the
/// client sends `anthropic-version`.
pub(super) async fn models(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> Response<Body> {
    let snapshot = gw.snapshot();
    let mut r = model_list(&gw, &snapshot, &headers);
    r.headers_mut().insert(X_REQUEST_ID, request_id(&headers));
    unrouted(&snapshot, r)
}

fn model_list(gw: &Gateway, snapshot: &Snapshot, headers: &HeaderMap) -> Response<Body> {
    let anthropic = headers.contains_key("anthropic-version");
    let tenant = match auth::authenticate(&gw.auth, snapshot, headers) {
        Ok(t) => t,
        Err(denied) => {
            let wire = if anthropic {
                Wire::Anthropic
            } else {
                Wire::OpenAi
            };
            return unauthenticated(wire, denied);
        }
    };
    let names = tenant
        .map_or(&snapshot.route_list, |t| &t.route_list)
        .iter()
        .flat_map(|r| r.spec.models.iter());
    let body = if anthropic {
        let data: Vec<_> = names
            .map(|m| serde_json::json!({"type": "model", "id": m, "display_name": m, "created_at": "1970-01-01T00:00:00Z"}))
            .collect();
        let first = data.first().map(|d| d["id"].clone());
        let last = data.last().map(|d| d["id"].clone());
        serde_json::json!({"data": data, "has_more": false, "first_id": first, "last_id": last})
    } else {
        let data: Vec<_> = names
            .map(|m| serde_json::json!({"id": m, "object": "model", "created": 0, "owned_by": "switchback"}))
            .collect();
        serde_json::json!({"object": "list", "data": data})
    };
    pretty_json(StatusCode::OK, &body)
}
