//! The admin port's guard (docs/proxy.md#admin-port): with `--admin-token-file`, every
//! admin request except `GET /healthz` and `GET /readyz` (the kubelet's probes, which
//! carry no token) must present the token as `Authorization: Bearer <token>`; anything
//! else is a 401 whose body says what is missing and never repeats what was sent.
//!
//! Unknown paths are guarded too: without the token a caller learns nothing of what
//! the admin port serves.
//!
//! The token file is re-read when it changes (a `stat` per guarded request, see
//! [`AdminTokenFile`]): rotating the chart's Secret takes effect once the kubelet
//! updates the mount, with no restart.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Response, StatusCode, header};
use axum::middleware::{self, Next};
use switchback_crds::admintoken::{AdminTokenFile, Refresh};

/// Paths served without the token: liveness and readiness probes.
pub const OPEN_PATHS: [&str; 2] = ["/healthz", "/readyz"];

/// `router` behind the admin token of `file` (or as it is, open, without one).
pub fn guard(router: Router, file: Option<Arc<AdminTokenFile>>) -> Router {
    match file {
        Some(file) => router.layer(middleware::from_fn_with_state(file, check)),
        None => router,
    }
}

async fn check(
    State(file): State<Arc<AdminTokenFile>>,
    request: Request,
    next: Next,
) -> Response<Body> {
    if OPEN_PATHS.contains(&request.uri().path()) {
        return next.run(request).await;
    }
    let (token, refresh) = file.current();
    match refresh {
        Refresh::Unchanged => {}
        Refresh::Reloaded => tracing::info!(
            file = %file.path().display(),
            "the admin token file changed: the new token is in use"
        ),
        Refresh::KeptLast(why) => tracing::warn!("{why}"),
    }
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| bearer(v.as_bytes()));
    match presented {
        Some(t) if token.verify(t) => next.run(request).await,
        Some(_) => {
            unauthorized("the admin token is not the one this proxy was given (--admin-token-file)")
        }
        None => unauthorized(
            "the admin port needs the admin token: send Authorization: Bearer <token> \
             (the content of the proxy's --admin-token-file)",
        ),
    }
}

/// The token of `Bearer <token>` (scheme case-insensitive, surrounding spaces trimmed).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, token) = value.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = token.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// 401 with a JSON body (`{"error": {"type": "unauthorized", "message": ...}}`) made
/// only of fixed text.
fn unauthorized(message: &'static str) -> Response<Body> {
    let body = serde_json::json!({"error": {"type": "unauthorized", "message": message}});
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = StatusCode::UNAUTHORIZED;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"switchback-admin\""),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_read_like_client_keys() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer  abc "), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bearer "), None);
        assert_eq!(bearer(b"Bear"), None);
    }
}
