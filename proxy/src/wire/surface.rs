//! The client-facing APIs the proxy serves (OpenAI chat completions, embeddings and
//! responses, Anthropic messages): their wire (error shapes), their upstream paths,
//! and the error bodies the gateway writes in each API's own shape. Which provider
//! serves which surface is the providers' business.

use bytes::Bytes;
use serde::Serialize;

/// The error shape a client's API uses (the OpenAI Responses API answers errors
/// as chat completions do).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    OpenAi,
    Anthropic,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Surface {
    ChatCompletions,
    Embeddings,
    Messages,
    /// The OpenAI Responses API: passed through to the credentials that serve it
    /// (never translated), its stream read by its own event types.
    Responses,
}

impl Surface {
    pub fn wire(self) -> Wire {
        match self {
            Self::ChatCompletions | Self::Embeddings | Self::Responses => Wire::OpenAi,
            Self::Messages => Wire::Anthropic,
        }
    }

    /// `gen_ai.operation.name` in traces.
    pub fn operation(self) -> &'static str {
        match self {
            Self::ChatCompletions | Self::Messages | Self::Responses => "chat",
            Self::Embeddings => "embeddings",
        }
    }

    /// Appended to the credential's base URL.
    pub(crate) fn upstream_path(self) -> &'static str {
        match self {
            Self::ChatCompletions => "/chat/completions",
            Self::Embeddings => "/embeddings",
            Self::Messages => "/messages",
            Self::Responses => "/responses",
        }
    }

    /// How a client calls it, for messages that name it.
    pub fn endpoint(self) -> &'static str {
        match self {
            Self::ChatCompletions => "POST /v1/chat/completions",
            Self::Embeddings => "POST /v1/embeddings",
            Self::Messages => "POST /v1/messages",
            Self::Responses => "POST /v1/responses",
        }
    }

    pub const ALL: [Surface; 4] = [
        Self::ChatCompletions,
        Self::Embeddings,
        Self::Messages,
        Self::Responses,
    ];

    pub fn index(self) -> usize {
        self as usize
    }
}

/// One entry of the `attempts` list added to gateway error bodies.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptView<'a> {
    pub target: &'a str,
    pub model: &'a str,
    pub status: Option<u16>,
    pub reason: &'static str,
    pub duration_ms: u64,
}

/// A JSON answer the gateway writes itself (errors, admin documents).
pub(crate) fn json_response(
    status: http::StatusCode,
    body: impl Into<axum::body::Body>,
) -> http::Response<axum::body::Body> {
    let mut r = http::Response::new(body.into());
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

/// A document the gateway writes itself (`/v1/models`, the admin port's), pretty.
pub(crate) fn pretty_json(
    status: http::StatusCode,
    body: &impl Serialize,
) -> http::Response<axum::body::Body> {
    json_response(status, serde_json::to_vec_pretty(body).unwrap_or_default())
}

/// An error the gateway itself answers (as opposed to an upstream response passed
/// through), in the client's wire shape.
pub fn error_body(
    wire: Wire,
    status: u16,
    code: &str,
    message: &str,
    attempts: &[AttemptView<'_>],
) -> Bytes {
    let body = match wire {
        Wire::OpenAi => serde_json::json!({"error": {
            "message": message,
            "type": openai_type(status),
            "code": code,
            "attempts": attempts,
        }}),
        Wire::Anthropic => serde_json::json!({"type": "error", "error": {
            "type": anthropic_type(status),
            "message": message,
            "code": code,
            "attempts": attempts,
        }}),
    };
    Bytes::from(serde_json::to_vec(&body).unwrap_or_default())
}

fn openai_type(status: u16) -> &'static str {
    match status {
        429 => "rate_limit_error",
        400..=499 => "invalid_request_error",
        _ => "server_error",
    }
}

fn anthropic_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        400..=499 => "invalid_request_error",
        503 => "overloaded_error",
        504 => "timeout_error",
        _ => "api_error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_shapes_match_each_api() {
        let a = [AttemptView {
            target: "team-a/openai",
            model: "gpt-4o",
            status: Some(503),
            reason: "status5xx",
            duration_ms: 12,
        }];
        let v: serde_json::Value = serde_json::from_slice(&error_body(
            Wire::OpenAi,
            502,
            "all_providers_failed",
            "m",
            &a,
        ))
        .unwrap();
        assert_eq!(v["error"]["code"], "all_providers_failed");
        assert_eq!(v["error"]["type"], "server_error");
        assert_eq!(v["error"]["message"], "m");
        assert_eq!(v["error"]["attempts"][0]["durationMs"], 12);
        assert_eq!(v["error"]["attempts"][0]["status"], 503);
        let v: serde_json::Value = serde_json::from_slice(&error_body(
            Wire::Anthropic,
            404,
            "model_not_found",
            "m",
            &[],
        ))
        .unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "not_found_error");
        assert_eq!(v["error"]["code"], "model_not_found");
    }
}
