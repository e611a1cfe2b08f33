//! What a provider's failure is, in every provider's own words: the class of an
//! answer that is not a success (its status, then the wordings of context-length
//! overflow, content filters and invalid keys of each provider the proxy speaks to),
//! and how long it asks to be left alone (its Retry-After headers, or the delay
//! Google's `RetryInfo` gives in the body).
//!
//! One table for every provider, applied to every answer: an `openai-compatible`
//! credential may front any of them (vLLM, Gemini's compatibility endpoint, a
//! LiteLLM proxy), so no wording is kept from a provider it does not name.

use std::time::Duration;

use http::header::HeaderMap;

use crate::observe::reason::Reason;

/// Class of an upstream HTTP answer that is not a success.
pub(crate) fn classify_status(status: u16, body: &[u8]) -> Reason {
    match status {
        429 => Reason::RateLimited,
        408 => Reason::Timeout,
        // A gateway (Switchback's own, docs/limits.md#no-loops) found the request looping.
        508 => Reason::LoopDetected,
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
/// (a 200, reported by the Gemini dialect's stream opening as a 400).
/// Read only from 4xx bodies, already cut to a bound.
pub(crate) fn is_content_filter(body: &[u8]) -> bool {
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
pub(crate) fn retry_delay(body: &[u8]) -> Option<Duration> {
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
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::HeaderValue;

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
}
