//! What provider answers may make one replica hold (docs/limits.md#the-limits): one SSE event
//! (`--max-event-bytes`), one unary answer (`--max-response-bytes`), and every unary
//! answer being read or on its way to the client together
//! (`--max-inflight-response-bytes`, a `crate::limits::bytes::Budget`); and the
//! count of answers each limit refused (`switchback_limit_refusals_total`).

use std::sync::atomic::AtomicU64;

use crate::wire::sse::DEFAULT_MAX_EVENT_BYTES;

/// Bounds on what one provider answer may make the proxy hold (docs/limits.md#the-limits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpstreamLimits {
    /// `--max-event-bytes`: the largest SSE event relayed.
    pub max_event_bytes: usize,
    /// `--max-response-bytes`: the largest unary answer read.
    pub max_response_bytes: usize,
    /// `--max-inflight-response-bytes`: unary answer bytes held at once, all
    /// requests together (being read, or on their way to the client).
    pub max_inflight_response_bytes: usize,
}

impl Default for UpstreamLimits {
    fn default() -> Self {
        Self {
            max_event_bytes: DEFAULT_MAX_EVENT_BYTES,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            max_inflight_response_bytes: DEFAULT_MAX_INFLIGHT_RESPONSE_BYTES,
        }
    }
}

/// The default `--max-response-bytes`.
pub(crate) const DEFAULT_MAX_RESPONSE_BYTES: usize = 32 * 1024 * 1024;

/// The default `--max-inflight-response-bytes`: with the 256 MiB of request bodies
/// (`--max-inflight-body-bytes`), the client connections and heads and the process's
/// own ~60 MiB, under the chart's 768 MiB memory limit (docs/limits.md, Memory).
pub(crate) const DEFAULT_MAX_INFLIGHT_RESPONSE_BYTES: usize = 128 * 1024 * 1024;

/// Provider answers refused by a limit, by limit (`switchback_limit_refusals_total`).
#[derive(Debug, Default)]
pub struct Refusals {
    /// SSE events over `max_event_bytes` (before or after commit).
    pub events: AtomicU64,
    /// Unary answers over `max_response_bytes`.
    pub responses: AtomicU64,
    /// Unary answers that did not fit in `max_inflight_response_bytes`.
    pub over_budget: AtomicU64,
    /// Media fetches for a target that cannot fetch a URL
    /// (docs/translation.md#documents-and-media) that took longer than
    /// `--fetch-media-timeout`.
    pub fetch_timeouts: AtomicU64,
    /// URLs not fetched because the request had fetched `--max-fetched-urls` already.
    pub fetches_over_count: AtomicU64,
}
