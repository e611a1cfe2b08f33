//! The names of the headers the gateway itself sets: on every answer
//! (docs/request-lifecycle.md#on-every-answer), the request id it keeps or makes (and
//! forwards to providers), and the provider's own request id as the client sees it.

use http::HeaderName;

/// The LLMRoute that served the request (`namespace/name`).
pub const X_ROUTE: HeaderName = HeaderName::from_static("x-switchback-route");
/// Upstream requests sent.
pub const X_ATTEMPTS: HeaderName = HeaderName::from_static("x-switchback-attempts");
/// Targets moved past, skipped ones included.
pub const X_FALLBACKS: HeaderName = HeaderName::from_static("x-switchback-fallbacks");
/// The credential that answered (`namespace/name`).
pub const X_TARGET: HeaderName = HeaderName::from_static("x-switchback-target");
/// The upstream model that answered (docs/request-lifecycle.md#headers).
pub const X_MODEL: HeaderName = HeaderName::from_static("x-switchback-model");
/// The route's `metadata.generation`, or the config's load count before a route is
/// chosen.
pub const X_GENERATION: HeaderName = HeaderName::from_static("x-switchback-generation");
/// Kept from the client or made; forwarded to providers.
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// The provider's `x-request-id`, as the client sees it.
pub const X_UPSTREAM_REQUEST_ID: HeaderName = HeaderName::from_static("x-upstream-request-id");
/// Gateways passed through so far (docs/limits.md#no-loops): read from every request, set on every
/// upstream request to the count plus one (see [`super::hops`]).
pub const X_HOPS: HeaderName = HeaderName::from_static("x-switchback-hops");
