//! What one attempt's failure means: its class, whether the same target may be tried
//! again, and whether the chain may advance to the next target (SPEC §3's outcome
//! table). Pure functions over compiled policy, so every row is unit-tested here.

use std::time::Duration;

use http::header::HeaderMap;
use switchback_crds::config::{FailureClass, Fallback, Retry, Target};

/// Why an attempt failed (or why a target was passed over). The names are the ones
/// in `attempts` lists, logs and stats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// 5xx, or an in-band stream error that maps to one.
    Status5xx,
    RateLimited,
    /// The attempt's own timeout, or an upstream 408.
    Timeout,
    /// The whole call's budget ran out.
    Budget,
    ConnectionError,
    ContextLength,
    AuthError,
    /// Any other 4xx: the caller's mistake, returned unchanged.
    ClientError,
    /// A provider's content filter refused the request (Azure OpenAI's 400
    /// `content_filter`): the request's fault, returned unchanged unless the route
    /// lists `contentFilter` in `fallback.onFailures`.
    ContentFilter,
    /// A 2xx that cannot be used: not the surface's JSON, a stream without content.
    InvalidResponse,
    /// A unary 2xx over `--max-response-bytes` (class `invalidResponse`).
    ResponseTooLarge,
    /// An SSE event over `--max-event-bytes` (class `invalidResponse`).
    EventTooLarge,
    /// A unary 2xx that did not fit in `--max-inflight-response-bytes`: the replica
    /// holds as many answers as it may. Not the provider's failure (no class, no
    /// circuit); the chain stops and the client gets 503 `overloaded`.
    Overloaded,
    // Skipped before commitment:
    MissingKey,
    UnsupportedSurface,
    Parked,
    CircuitOpen,
    QueueFull,
    /// The request uses a parameter the target's API cannot honour (translation).
    UnsupportedParameter,
}

impl Reason {
    pub const COUNT: usize = 19;
    pub const ALL: [Reason; Self::COUNT] = [
        Self::Status5xx,
        Self::RateLimited,
        Self::Timeout,
        Self::Budget,
        Self::ConnectionError,
        Self::ContextLength,
        Self::AuthError,
        Self::ClientError,
        Self::ContentFilter,
        Self::InvalidResponse,
        Self::ResponseTooLarge,
        Self::EventTooLarge,
        Self::Overloaded,
        Self::MissingKey,
        Self::UnsupportedSurface,
        Self::Parked,
        Self::CircuitOpen,
        Self::QueueFull,
        Self::UnsupportedParameter,
    ];

    pub fn index(self) -> usize {
        self as usize
    }

    /// Failures that count towards opening the circuit: the provider looks unhealthy.
    /// Not 4xx (the request's fault), not context length, not 429 (parking handles
    /// it), not the call's own budget running out. A useless 2xx does.
    pub fn trips_breaker(self, status: Option<u16>) -> bool {
        match self {
            Self::Status5xx
            | Self::ConnectionError
            | Self::InvalidResponse
            | Self::ResponseTooLarge
            | Self::EventTooLarge => true,
            Self::Timeout => status.is_none(), // the attempt timed out; 408 is an answer
            _ => false,
        }
    }

    /// Whether the target was passed over without a request being sent.
    pub fn is_skip(self) -> bool {
        matches!(
            self,
            Self::MissingKey
                | Self::UnsupportedSurface
                | Self::Parked
                | Self::CircuitOpen
                | Self::QueueFull
                | Self::UnsupportedParameter
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Status5xx => "status5xx",
            Self::RateLimited => "rateLimited",
            Self::Timeout => "timeout",
            Self::Budget => "budgetExhausted",
            Self::ConnectionError => "connectionError",
            Self::ContextLength => "contextLength",
            Self::AuthError => "authError",
            Self::ClientError => "clientError",
            Self::ContentFilter => "contentFilter",
            Self::InvalidResponse => "invalidResponse",
            Self::ResponseTooLarge => "responseTooLarge",
            Self::EventTooLarge => "eventTooLarge",
            Self::Overloaded => "overloaded",
            Self::MissingKey => "missingKey",
            Self::UnsupportedSurface => "unsupportedSurface",
            Self::Parked => "parked",
            Self::CircuitOpen => "circuitOpen",
            Self::QueueFull => "queueFull",
            Self::UnsupportedParameter => "unsupportedParameter",
        }
    }

    /// The `fallback.onFailures` class this failure belongs to, if any.
    pub fn class(self) -> Option<FailureClass> {
        Some(match self {
            Self::Status5xx => FailureClass::Status5xx,
            Self::RateLimited => FailureClass::RateLimited,
            Self::Timeout | Self::Budget => FailureClass::Timeout,
            Self::ConnectionError => FailureClass::ConnectionError,
            Self::ContextLength => FailureClass::ContextLength,
            Self::AuthError => FailureClass::AuthError,
            Self::ContentFilter => FailureClass::ContentFilter,
            Self::InvalidResponse | Self::ResponseTooLarge | Self::EventTooLarge => {
                FailureClass::InvalidResponse
            }
            _ => return None,
        })
    }

    /// Failures whose upstream answer is handed to the client as it was when the chain
    /// stops on them: they say something about the request, not the provider.
    pub fn returns_upstream_answer(self) -> bool {
        matches!(
            self,
            Self::ContextLength | Self::AuthError | Self::ClientError | Self::ContentFilter
        )
    }
}

/// Class of an upstream HTTP answer that is not a success.
pub fn classify_status(status: u16, body: &[u8]) -> Reason {
    match status {
        429 => Reason::RateLimited,
        408 => Reason::Timeout,
        500..=599 => Reason::Status5xx,
        401 | 403 => Reason::AuthError,
        400..=499 if is_context_length(body) => Reason::ContextLength,
        // Google answers a key it does not know with 400 INVALID_ARGUMENT.
        400 if memchr::memmem::find(body, b"API_KEY_INVALID").is_some() => Reason::AuthError,
        400..=499 if is_content_filter(body) => Reason::ContentFilter,
        _ => Reason::ClientError,
    }
}

/// A content filter's refusal, as Azure OpenAI words it: an OpenAI-shaped error whose
/// `code` is `content_filter` (its `innererror.code` `ResponsibleAIPolicyViolation`);
/// or as Gemini does: a response with `promptFeedback.blockReason` and no candidate
/// (a 200, reported by the stream's opening as a 400, see `translate::opening`).
/// Read only from 4xx bodies, already cut to a bound.
pub fn is_content_filter(body: &[u8]) -> bool {
    let gemini = memchr::memmem::find(body, b"blockReason").is_some();
    if !gemini
        && memchr::memmem::find(body, b"content_filter").is_none()
        && memchr::memmem::find(body, b"ResponsibleAIPolicyViolation").is_none()
    {
        return false;
    }
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return false;
    };
    let error = &v["error"];
    error["code"] == "content_filter"
        || error["innererror"]["code"] == "ResponsibleAIPolicyViolation"
        || (gemini
            && !v["promptFeedback"]["blockReason"].is_null()
            && v["candidates"].as_array().is_none_or(Vec::is_empty))
}

/// Context-window overflow, as OpenAI (`context_length_exceeded`), Anthropic
/// ("prompt is too long"), vLLM ("maximum context length"), Gemini ("The input
/// token count (N) exceeds the maximum number of tokens allowed (M).") and Bedrock's
/// ValidationException ("Input is too long for requested model.", "too many input
/// tokens", "input length and `max_tokens` exceed context limit") word it.
pub fn is_context_length(body: &[u8]) -> bool {
    const NEEDLES: [&[u8]; 9] = [
        b"context_length_exceeded",
        b"prompt is too long",
        b"maximum context length",
        b"context length",
        b"exceeds the maximum number of tokens",
        b"Input is too long",
        b"input is too long",
        b"too many input tokens",
        b"exceed context limit",
    ];
    NEEDLES
        .iter()
        .any(|n| memchr::memmem::find(body, n).is_some())
}

/// Retry-After as a duration: `retry-after-ms` (OpenAI, Azure OpenAI) first, then
/// `x-ms-retry-after-ms` (Azure OpenAI), then `Retry-After` in seconds or as an HTTP
/// date: the millisecond forms are the more precise. A provider's number: it may be absurd
/// (`9223372036854775809`, more digits than any integer holds), so it saturates
/// instead of overflowing, and every use of it is checked or clamped by the caller
/// (to `maxRetryAfter`). A number too large for any clock is still "very long".
pub fn retry_after(headers: &HeaderMap, now: std::time::SystemTime) -> Option<Duration> {
    for name in ["retry-after-ms", "x-ms-retry-after-ms"] {
        if let Some(ms) = headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|ms| ms.is_finite() && *ms >= 0.0)
        {
            // `as` saturates: an absurd number is "very long", never a wrap.
            return Some(Duration::from_millis(ms as u64));
        }
    }
    let v = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        return Some(Duration::from_secs(v.parse::<u64>().unwrap_or(u64::MAX)));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Google's `RetryInfo.retryDelay` in an error body (`"retryDelay": "37s"`, a
/// protobuf Duration: seconds with an optional fraction), for a 429 or 503 that
/// came without a Retry-After header. Saturates like [`retry_after`].
pub fn retry_delay(body: &[u8]) -> Option<Duration> {
    let at = memchr::memmem::find(body, b"\"retryDelay\"")? + b"\"retryDelay\"".len();
    let rest = &body[at..];
    let open = memchr::memchr(b'"', rest)?;
    if !rest[..open]
        .iter()
        .all(|b| matches!(b, b' ' | b'\t' | b'\r' | b'\n' | b':'))
    {
        return None;
    }
    let value = &rest[open + 1..];
    let value = &value[..memchr::memchr(b'"', value)?];
    let secs: f64 = std::str::from_utf8(value.strip_suffix(b"s")?)
        .ok()?
        .parse()
        .ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_millis((secs * 1000.0) as u64))
}

/// Whole milliseconds of `d`, saturating (a provider's Retry-After may not fit).
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// May the same target be tried again after this failure (attempts permitting)?
pub fn retryable(reason: Reason, status: Option<u16>, retry: &Retry) -> bool {
    // A context-length or content-filter answer is never retried, even if its status
    // is listed: the same request gets the same answer.
    if matches!(reason, Reason::ContextLength | Reason::ContentFilter) {
        return false;
    }
    match (reason, status) {
        (Reason::ConnectionError, _) => true,
        // Attempt timeouts, context length and skips advance at once.
        (Reason::Timeout | Reason::Budget, None) => false,
        (_, Some(s)) => match &retry.on_status_codes {
            Some(list) => list.contains(&s),
            None => s == 408 || s == 429 || (500..=599).contains(&s),
        },
        _ => false,
    }
}

/// May the chain move on to the next target after this failure?
pub fn may_advance(reason: Reason, status: Option<u16>, fallback: &Fallback) -> bool {
    if status.is_some_and(|s| fallback.on_status_codes.contains(&s)) {
        return true;
    }
    match reason {
        // Skips always advance: nothing was sent, so nothing else could answer.
        r if r.is_skip() => true,
        other => other
            .class()
            .is_some_and(|c| fallback.on_failures.contains(&c)),
    }
}

/// Full-jitter backoff before retry number `retry` (1 = the first retry):
/// uniform in `[0, min(maxBackoff, initialBackoff * 2^(retry-1)))`.
pub fn backoff(retry: u32, policy: &Retry, unit: f64) -> Duration {
    let exp = policy
        .initial_backoff_ms
        .saturating_mul(1u64 << (retry.saturating_sub(1)).min(20));
    let cap = exp.min(policy.max_backoff_ms);
    Duration::from_micros((cap as f64 * 1000.0 * unit.clamp(0.0, 1.0)) as u64)
}

/// The per-attempt deadline: the target's timeout, never past the call's budget.
pub fn attempt_deadline(
    now: tokio::time::Instant,
    target: &Target,
    budget: tokio::time::Instant,
) -> tokio::time::Instant {
    match target
        .timeout_ms
        .and_then(|ms| now.checked_add(Duration::from_millis(ms)))
    {
        Some(at) => at.min(budget),
        None => budget,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::HeaderValue;

    fn retry_default() -> Retry {
        Retry {
            attempts: 3,
            ..Retry::default()
        }
    }

    #[test]
    fn classifies_every_row_of_the_outcome_table() {
        assert_eq!(classify_status(429, b""), Reason::RateLimited);
        assert_eq!(classify_status(408, b""), Reason::Timeout);
        for s in [500, 502, 503, 504, 529] {
            assert_eq!(classify_status(s, b""), Reason::Status5xx);
        }
        assert_eq!(classify_status(401, b""), Reason::AuthError);
        assert_eq!(classify_status(403, b""), Reason::AuthError);
        assert_eq!(classify_status(404, b"{}"), Reason::ClientError);
        assert_eq!(classify_status(422, b"{}"), Reason::ClientError);
        let openai = br#"{"error":{"message":"This model's maximum context length is 128000 tokens.","type":"invalid_request_error","code":"context_length_exceeded"}}"#;
        let anthropic = br#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#;
        let vllm = br#"{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens","type":"BadRequestError","code":400}"#;
        for body in [&openai[..], &anthropic[..], &vllm[..]] {
            assert_eq!(classify_status(400, body), Reason::ContextLength);
        }
    }

    #[test]
    fn gemini_wordings_classify() {
        let exhausted = br#"{"error":{"code":429,"message":"You exceeded your current quota, please check your plan and billing details.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"37s"}]}}"#;
        assert_eq!(classify_status(429, exhausted), Reason::RateLimited);
        assert_eq!(retry_delay(exhausted), Some(Duration::from_secs(37)));
        assert_eq!(
            retry_delay(br#"{"retryDelay" : "1.5s"}"#),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(retry_delay(br#"{"retryDelay":"soon"}"#), None);
        assert_eq!(retry_delay(br#"{"retryDelay":"-3s"}"#), None);
        assert_eq!(
            retry_delay(br#"{"retryDelay":"1e300s"}"#).map(millis),
            Some(u64::MAX)
        );
        let unavailable = br#"{"error":{"code":503,"message":"The model is overloaded. Please try again later.","status":"UNAVAILABLE"}}"#;
        assert_eq!(classify_status(503, unavailable), Reason::Status5xx);
        let context = br#"{"error":{"code":400,"message":"The input token count (1200293) exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}"#;
        assert_eq!(classify_status(400, context), Reason::ContextLength);
        let key = br#"{"error":{"code":400,"message":"API key not valid. Please pass a valid API key.","status":"INVALID_ARGUMENT","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"API_KEY_INVALID","domain":"googleapis.com"}]}}"#;
        assert_eq!(classify_status(400, key), Reason::AuthError);
        let denied = br#"{"error":{"code":403,"message":"Method doesn't allow unregistered callers.","status":"PERMISSION_DENIED"}}"#;
        assert_eq!(classify_status(403, denied), Reason::AuthError);
        let missing = br#"{"error":{"code":404,"message":"models/gemini-9 is not found for API version v1beta, or is not supported for generateContent.","status":"NOT_FOUND"}}"#;
        assert_eq!(classify_status(404, missing), Reason::ClientError);
        let blocked = br#"{"promptFeedback":{"blockReason":"SAFETY","safetyRatings":[]},"usageMetadata":{"promptTokenCount":8,"totalTokenCount":8}}"#;
        assert_eq!(classify_status(400, blocked), Reason::ContentFilter);
        let answered = br#"{"candidates":[{"content":{"parts":[{"text":"ok"}]}}],"promptFeedback":{"blockReason":"SAFETY"}}"#;
        assert!(!is_content_filter(answered));
    }

    #[test]
    fn bedrock_wordings_classify() {
        let too_long = br#"{"__type":"ValidationException","message":"Input is too long for requested model."}"#;
        assert_eq!(classify_status(400, too_long), Reason::ContextLength);
        let tokens = br#"{"__type":"ValidationException","message":"The model returned the following errors: too many input tokens"}"#;
        assert_eq!(classify_status(400, tokens), Reason::ContextLength);
        let malformed = br#"{"__type":"ValidationException","message":"Malformed input request: extraneous key [foo] is not permitted"}"#;
        assert_eq!(classify_status(400, malformed), Reason::ClientError);
        let throttled = br#"{"__type":"ThrottlingException","message":"Too many requests, please wait before trying again."}"#;
        assert_eq!(classify_status(429, throttled), Reason::RateLimited);
        let token = br#"{"__type":"UnrecognizedClientException","message":"The security token included in the request is invalid."}"#;
        assert_eq!(classify_status(403, token), Reason::AuthError);
    }

    #[test]
    fn azure_wordings_classify() {
        let filtered = br#"{"error":{"message":"The response was filtered due to the prompt triggering Azure OpenAI's content management policy.","type":null,"param":"prompt","code":"content_filter","status":400,"innererror":{"code":"ResponsibleAIPolicyViolation","content_filter_result":{"violence":{"filtered":true,"severity":"medium"}}}}}"#;
        assert_eq!(classify_status(400, filtered), Reason::ContentFilter);
        let inner_only =
            br#"{"error":{"code":"400","innererror":{"code":"ResponsibleAIPolicyViolation"}}}"#;
        assert_eq!(classify_status(400, inner_only), Reason::ContentFilter);
        // Azure words context length as OpenAI does.
        let azure_context = br#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded","status":400}}"#;
        assert_eq!(classify_status(400, azure_context), Reason::ContextLength);
        // The words alone, not as the error's code, are not a filter.
        let mentions = br#"{"error":{"message":"unknown parameter content_filter","code":null}}"#;
        assert_eq!(classify_status(400, mentions), Reason::ClientError);
        assert_eq!(classify_status(400, b"content_filter"), Reason::ClientError);
    }

    #[test]
    fn content_filter_is_returned_unless_listed_and_never_retried() {
        let r = Retry {
            on_status_codes: Some(vec![400]),
            ..retry_default()
        };
        assert!(!retryable(Reason::ContentFilter, Some(400), &r));
        assert!(!Reason::ContentFilter.trips_breaker(Some(400)));
        assert!(Reason::ContentFilter.returns_upstream_answer());
        assert!(!may_advance(
            Reason::ContentFilter,
            Some(400),
            &Fallback::default()
        ));
        let mut listed = Fallback::default();
        listed.on_failures.push(FailureClass::ContentFilter);
        assert!(may_advance(Reason::ContentFilter, Some(400), &listed));
    }

    #[test]
    fn azure_millisecond_retry_afters() {
        let now = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("30"));
        h.insert("x-ms-retry-after-ms", HeaderValue::from_static("250"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_millis(250)));
        // retry-after-ms first when both are sent.
        h.insert("retry-after-ms", HeaderValue::from_static("120"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_millis(120)));
        // An unusable one is passed over for the next form.
        h.insert("retry-after-ms", HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_millis(250)));
        h.insert("x-ms-retry-after-ms", HeaderValue::from_static("-1"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(30)));
        // Absurd numbers saturate, never wrap.
        h.insert("x-ms-retry-after-ms", HeaderValue::from_static("1e300"));
        let ra = retry_after(&h, now).expect("saturated");
        assert_eq!(millis(ra), u64::MAX);
    }

    #[test]
    fn reason_indexes_are_dense_and_ordered() {
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i, "{r:?}");
        }
    }

    #[test]
    fn only_provider_health_failures_trip_the_breaker() {
        assert!(Reason::Status5xx.trips_breaker(Some(503)));
        assert!(Reason::ConnectionError.trips_breaker(None));
        assert!(Reason::Timeout.trips_breaker(None));
        assert!(Reason::InvalidResponse.trips_breaker(None));
        assert!(Reason::ResponseTooLarge.trips_breaker(None));
        assert!(!Reason::Timeout.trips_breaker(Some(408)));
        for r in [
            Reason::RateLimited,
            Reason::ContextLength,
            Reason::AuthError,
            Reason::ClientError,
            Reason::Budget,
        ] {
            assert!(!r.trips_breaker(Some(400)), "{r:?}");
        }
        // The replica's own memory budget says nothing about the provider.
        assert!(!Reason::Overloaded.trips_breaker(None));
    }

    #[test]
    fn an_answer_the_replica_cannot_hold_stops_the_chain_without_a_retry() {
        let mut every = Fallback::default();
        every.on_failures.push(FailureClass::AuthError);
        assert!(!may_advance(Reason::Overloaded, None, &every));
        assert!(!retryable(Reason::Overloaded, None, &retry_default()));
        assert!(!Reason::Overloaded.is_skip());
    }

    #[test]
    fn default_retry_set_is_transport_408_429_and_5xx() {
        let r = retry_default();
        assert!(retryable(Reason::ConnectionError, None, &r));
        assert!(retryable(Reason::Timeout, Some(408), &r));
        assert!(retryable(Reason::RateLimited, Some(429), &r));
        assert!(retryable(Reason::Status5xx, Some(500), &r));
        assert!(
            !retryable(Reason::Timeout, None, &r),
            "attempt timeouts advance at once"
        );
        assert!(!retryable(Reason::ContextLength, Some(400), &r));
        assert!(!retryable(Reason::AuthError, Some(401), &r));
        assert!(!retryable(Reason::ClientError, Some(404), &r));
    }

    #[test]
    fn listed_statuses_replace_the_default_set() {
        let r = Retry {
            on_status_codes: Some(vec![503, 409]),
            ..retry_default()
        };
        assert!(retryable(Reason::Status5xx, Some(503), &r));
        assert!(!retryable(Reason::Status5xx, Some(500), &r));
        assert!(retryable(Reason::ClientError, Some(409), &r));
        assert!(
            retryable(Reason::ConnectionError, None, &r),
            "transport errors always retry"
        );
        let r = Retry {
            on_status_codes: Some(vec![400]),
            ..retry_default()
        };
        assert!(!retryable(Reason::ContextLength, Some(400), &r));
    }

    #[test]
    fn advancing_follows_fallback_on() {
        let f = Fallback::default();
        for r in [
            Reason::Status5xx,
            Reason::RateLimited,
            Reason::Timeout,
            Reason::Budget,
            Reason::ConnectionError,
            Reason::ContextLength,
            Reason::InvalidResponse,
            Reason::ResponseTooLarge,
            Reason::MissingKey,
            Reason::Parked,
        ] {
            assert!(may_advance(r, None, &f), "{r:?}");
        }
        assert!(
            !may_advance(Reason::AuthError, Some(401), &f),
            "authError is opt-in"
        );
        assert!(!may_advance(Reason::ClientError, Some(400), &f));
        let f = Fallback {
            on_failures: vec![FailureClass::AuthError],
            on_status_codes: vec![404],
            ..Fallback::default()
        };
        assert!(may_advance(Reason::AuthError, Some(403), &f));
        assert!(may_advance(Reason::ClientError, Some(404), &f));
        assert!(!may_advance(Reason::Status5xx, Some(500), &f));
    }

    #[test]
    fn backoff_is_full_jitter_doubling_and_capped() {
        let r = Retry {
            initial_backoff_ms: 100,
            max_backoff_ms: 250,
            ..retry_default()
        };
        assert_eq!(backoff(1, &r, 0.0), Duration::ZERO);
        assert_eq!(backoff(1, &r, 0.5), Duration::from_millis(50));
        assert_eq!(backoff(2, &r, 0.5), Duration::from_millis(100));
        assert_eq!(
            backoff(3, &r, 0.5),
            Duration::from_millis(125),
            "capped at maxBackoff"
        );
        assert_eq!(backoff(40, &r, 0.999), Duration::from_micros(249_750));
    }

    #[test]
    fn retry_after_forms() {
        let now = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h, now), None);
        h.insert("retry-after", HeaderValue::from_static("7"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(7)));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(12));
        h.insert("retry-after", HeaderValue::from_str(&later).unwrap());
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(12)));
        h.insert("retry-after-ms", HeaderValue::from_static("1500"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_millis(1500)));
        h.insert("retry-after-ms", HeaderValue::from_static("soon"));
        h.insert("retry-after", HeaderValue::from_static("garbage"));
        assert_eq!(retry_after(&h, now), None);
    }

    /// Absurd provider numbers saturate, and what is computed from them never
    /// overflows a clock (`Instant + Duration` used to panic on these).
    #[test]
    fn absurd_retry_afters_saturate() {
        let now = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let mut h = HeaderMap::new();
        for (v, secs) in [
            ("9223372036854775809", 9_223_372_036_854_775_809),
            ("18446744073709551615", u64::MAX),
            ("99999999999999999999999999", u64::MAX),
        ] {
            h.insert("retry-after", HeaderValue::from_static(v));
            let ra = retry_after(&h, now).unwrap();
            assert_eq!(ra, Duration::from_secs(secs), "{v}");
            assert_eq!(millis(ra), u64::MAX);
            assert!(tokio::time::Instant::now().checked_add(ra).is_none());
        }
        h.remove("retry-after");
        for v in ["1e400", "-5", "NaN", "inf"] {
            h.insert("retry-after-ms", HeaderValue::from_static(v));
            assert_eq!(retry_after(&h, now), None, "{v}");
        }
        h.insert("retry-after-ms", HeaderValue::from_static("1e300"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_millis(u64::MAX)));
        let target = Target {
            model_map: Default::default(),
            credential: switchback_crds::config::ObjectId::new("ns", "c"),
            model: None,
            weight: 1,
            timeout_ms: Some(u64::MAX),
            retry: Retry::default(),
            price: None,
        };
        let start = tokio::time::Instant::now();
        let budget = start + Duration::from_secs(60);
        assert_eq!(attempt_deadline(start, &target, budget), budget);
    }
}
