//! The client-facing APIs the proxy serves (OpenAI chat completions, embeddings and
//! responses, Anthropic messages): which credentials can answer each, the upstream
//! path, and the error bodies in each API's own shape.

use bytes::Bytes;
use serde::Serialize;
use switchback_crds::config::{Credential, Provider};

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
    pub fn upstream_path(self) -> &'static str {
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

    /// Whether a credential speaks this surface natively. One that does not is
    /// reached through `translate` where a translation exists (chat completions <->
    /// messages) and skipped otherwise (embeddings on an Anthropic target; the
    /// Responses API anywhere but where [`Credential::serves_responses`]).
    pub fn served_by(self, credential: &Credential) -> bool {
        let provider = credential.provider;
        match self {
            Self::ChatCompletions | Self::Embeddings => provider.speaks_openai(),
            Self::Messages => provider == Provider::Anthropic,
            Self::Responses => credential.serves_responses(),
        }
    }

    /// Why `credential` cannot serve this surface, for the error that says no target
    /// of a route can: its provider, and what would make it serve it if anything.
    pub fn refusal(self, credential: &Credential) -> String {
        let provider = credential.provider.as_str();
        match (self, credential.provider) {
            (Self::Responses, Provider::OpenaiCompatible) => {
                format!("{provider} without responsesAPI: true")
            }
            (Self::Responses, Provider::AzureOpenai) => format!(
                "{provider} on the dated apiVersion {} (the Responses API needs the v1 API)",
                credential.api_version.as_deref().unwrap_or_default()
            ),
            _ => provider.to_owned(),
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
pub fn json_response(
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

    fn credential(
        provider: Provider,
        api_version: Option<&str>,
        responses_api: bool,
    ) -> Credential {
        Credential {
            id: switchback_crds::config::ObjectId::new("team-a", "c"),
            provider,
            base_url: "https://llm.example.com/v1".into(),
            headers: Default::default(),
            max_concurrency: None,
            max_queue: None,
            allow_private_network: false,
            secret_ref: switchback_crds::config::SecretKeyRef {
                name: "k".into(),
                key: "apiKey".into(),
            },
            api_version: api_version.map(str::to_owned),
            responses_api,
            prefill: false,
            project: None,
            location: None,
            region: None,
        }
    }

    #[test]
    fn surfaces_map_to_credentials() {
        let c = |p| credential(p, None, false);
        assert!(Surface::ChatCompletions.served_by(&c(Provider::OpenaiCompatible)));
        assert!(!Surface::ChatCompletions.served_by(&c(Provider::Anthropic)));
        assert!(Surface::Messages.served_by(&c(Provider::Anthropic)));
        assert!(!Surface::Messages.served_by(&c(Provider::Openai)));
        for (i, s) in Surface::ALL.iter().enumerate() {
            assert_eq!(s.index(), i);
        }
    }

    /// The Responses API: openai, azure-openai on its v1 API, openai-compatible that
    /// declares it; the refusal says why the others cannot.
    #[test]
    fn the_responses_api_is_served_where_the_credential_says() {
        let r = Surface::Responses;
        assert!(r.served_by(&credential(Provider::Openai, None, false)));
        assert!(r.served_by(&credential(Provider::AzureOpenai, None, false)));
        assert!(r.served_by(&credential(Provider::OpenaiCompatible, None, true)));
        let dated = credential(Provider::AzureOpenai, Some("2024-10-21"), false);
        assert!(!r.served_by(&dated));
        assert!(
            r.refusal(&dated).contains("2024-10-21"),
            "{}",
            r.refusal(&dated)
        );
        let undeclared = credential(Provider::OpenaiCompatible, None, false);
        assert!(!r.served_by(&undeclared));
        assert_eq!(
            r.refusal(&undeclared),
            "openai-compatible without responsesAPI: true"
        );
        let anthropic = credential(Provider::Anthropic, None, false);
        assert!(!r.served_by(&anthropic));
        assert_eq!(r.refusal(&anthropic), "anthropic");
        let gemini = credential(Provider::Gemini, None, false);
        assert!(!r.served_by(&gemini));
        assert_eq!(r.refusal(&gemini), "gemini");
        assert_eq!(r.upstream_path(), "/responses");
        assert_eq!(r.wire(), Wire::OpenAi);
    }
}
