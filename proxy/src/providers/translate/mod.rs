//! Translation between chat APIs: requests, unary responses, error bodies and
//! streams, so a route can answer an OpenAI-SDK client from an Anthropic, Gemini or
//! Bedrock target and an Anthropic-SDK client from an OpenAI (or OpenAI-compatible)
//! one. It owns the pairing of a client's API with an upstream's (`Translation`),
//! never an API's shapes (each dialect's, in its provider's folder) nor anything of
//! routes, credentials or the network.
//!
//! Pure functions and stream state machines: nothing here does I/O or reads the
//! clock (except `created` stamps).
//!
//! # Shape
//!
//! Every API is one dialect to and from one internal form (`form`: a request, an
//! answer, stream events, an error; the contract is `dialect`). A pairing is a
//! decode by the client's dialect and an encode by the target's for requests, and
//! the reverse for answers, streams and errors: OpenAI client → Anthropic target is
//! `openai::decode_request` then `anthropic::encode_request`, its answer
//! `anthropic::decode_answer` then `openai::encode_answer`, and so on. A new API is
//! one dialect, not one translator per API it must serve. Only a decoder knows the
//! client's parameter paths, so it refuses what the target cannot take
//! (`form::Target`, declared by each dialect). A target that speaks the client's API
//! never comes here: its bodies are relayed with only `model` rewritten.
//!
//! [`Direction`] names the pairings (for tests, benchmarks and docs); the pipeline
//! makes its `Translation` from the client's wire and the dialect a provider
//! adapter says its upstream speaks. How each upstream API maps to the form is told
//! in its provider's folder (`gemini`, `bedrock`); the pairs of the two client APIs
//! below.
//!
//! # Interface
//!
//! | call | input | output |
//! |---|---|---|
//! | `Translation::to` | client wire, upstream dialect | the pairing |
//! | [`Direction::for_target`] | client surface, target provider | `Some(direction)` when translation is needed and possible |
//! | [`request`] | the client's body | the upstream's body, `model` set to the target's model |
//! | [`include_usage`] | the client's body | whether an OpenAI client asked for the stream's usage chunk |
//! | [`response`] | a 2xx unary upstream body | the client's body, `model` = the client's name |
//! | [`error`] | a non-2xx upstream status and body | the client's error body (same status) |
//! | [`StreamTranslator::event`] | ONE complete upstream SSE event (as `sse::Framer` yields it) | zero or more complete client SSE events, appended |
//! | [`StreamTranslator::finish`] | end of the upstream stream | what the client still needs (or an error event if the upstream stopped short) |
//!
//! A [`TranslateError`] from [`request`] is a 400 that names the parameter the target
//! cannot honour; from [`response`] it is a 502 (the upstream answered something that
//! cannot be expressed to the client). [`TranslateError::body`] renders it in the
//! client's error shape.
//!
//! # Requests: chat completions → messages ([`Direction::OpenAiToAnthropic`])
//!
//! * `system` and `developer` messages, wherever they appear, are hoisted into
//!   `system` (one message: a string; several: one text block each, in order), as
//!   Anthropic supports a single leading system prompt.
//! * `user` / `assistant` turns become messages; consecutive turns of the same role
//!   (including `tool` messages, which become user turns) are merged into one, as
//!   Anthropic requires alternation. A turn that is a single text block is sent as a
//!   plain string.
//! * Content parts: `text`; `image_url` with an `http(s)` URL → image source `url`,
//!   with a `data:<type>;base64,` URL → image source `base64` (`detail` is dropped:
//!   Anthropic has no such knob); `file` with PDF `file_data` → a `document` block.
//!   `input_audio`, `file_id` and other part types are refused.
//! * Assistant `tool_calls` → `tool_use` blocks (arguments JSON string → object; an
//!   empty string is `{}`, anything else that is not a JSON object → 400); `refusal`
//!   parts → text. `tool` messages → `tool_result` blocks.
//! * `tools[].function` → `{name, description, input_schema}` (no `parameters` →
//!   an empty object schema); `tool_choice` `auto`/`none`/`required`/named function →
//!   `auto`/`none`/`any`/`tool`; `parallel_tool_calls: false` →
//!   `disable_parallel_tool_use: true`.
//! * `max_completion_tokens`, else `max_tokens`, else [`Defaults::max_tokens`]
//!   (4096 by default) → `max_tokens`, which Anthropic requires.
//! * `stop` (string or array) → `stop_sequences`; `stream` is kept;
//!   `stream_options.include_usage` is honoured by [`StreamTranslator`] (Anthropic
//!   always reports usage).
//!
//! # Requests: messages → chat completions ([`Direction::AnthropicToOpenAi`])
//!
//! * `system` (string or text blocks) → a leading `system` message.
//! * `tool_result` blocks → `tool` messages (placed before the rest of the user
//!   turn, which becomes a `user` message if anything is left); `tool_use` blocks →
//!   `tool_calls` (input object → JSON string); `image` blocks → `image_url` parts
//!   (base64 → data URL); base64 PDF `document` blocks → `file` parts, plain-text
//!   ones → text parts, by URL → fetched by the gateway; `thinking` /
//!   `redacted_thinking` blocks in history are dropped (chat completions cannot take
//!   them back and they do not change the conversation's text).
//! * `tools` → function tools; `tool_choice` `auto`/`any`/`tool`/`none` →
//!   `auto`/`required`/named function/`none`; `disable_parallel_tool_use: true` →
//!   `parallel_tool_calls: false`.
//! * `max_tokens` → `max_tokens` (or `max_completion_tokens` when
//!   [`Defaults::openai_max_completion_tokens`] is set: OpenAI's reasoning models
//!   reject `max_tokens`, many OpenAI-compatible servers only read `max_tokens`).
//! * `stop_sequences` → `stop`; `metadata.user_id` → `user`; `stream: true` also
//!   sets `stream_options.include_usage` so the final `message_delta` can carry usage.
//!
//! # Parameters the other side cannot honour
//!
//! Every top-level field is accounted for: an unknown field is refused naming it,
//! never silently dropped. A refusal of something the target's API lacks skips the
//! target (`unsupportedFeature`, another may serve it); a 400 naming the field comes
//! only when no target of the route can (the pipeline's `failure`). JSON answers,
//! reasoning and documents are mapped per target as docs/translation.md tells. A field that is `null` counts as absent. A field the form
//! carries must have its JSON type (`temperature` and `top_p` numbers, `stream` a
//! boolean, stop sequences and tool names strings): otherwise it is a 400 naming it,
//! not relayed for the provider to refuse.
//!
//! | client field | target | decision | why |
//! |---|---|---|---|
//! | `n` > 1 | Anthropic | 400 | one answer per request; `n: 1` is accepted |
//! | `logprobs: true`, `top_logprobs` > 0 | Anthropic | 400 | no log probabilities; `false` / `0` accepted |
//! | `presence_penalty`, `frequency_penalty` ≠ 0 | Anthropic | 400 | changes sampling, no equivalent; `0` accepted |
//! | `logit_bias` non-empty | Anthropic | 400 | no equivalent; `{}` accepted |
//! | `temperature` > 1 | Anthropic | 400 | Anthropic's range is 0–1; clamping would silently change sampling |
//! | `response_format` `json_schema` | Anthropic | → `output_config.format` | structured outputs; a schema Claude cannot enforce skips the target (`schema`) |
//! | `response_format` `json_object` | Anthropic | → a forced tool whose input is the answer | Claude's structured outputs need a schema (`vocab::JSON_TOOL`) |
//! | `audio`, `modalities` with `audio` | Anthropic | 400 | text only; `["text"]` accepted |
//! | `web_search_options` | Anthropic | 400 | OpenAI's hosted search |
//! | `functions`, `function_call` | Anthropic | 400 | deprecated; use `tools` / `tool_choice` |
//! | `tool_choice` `allowed_tools` / custom, custom tools | Anthropic | 400 | no equivalent |
//! | `seed` | Anthropic | dropped | OpenAI documents it as best effort, determinism is not guaranteed |
//! | `user`, `safety_identifier` | Anthropic | → `metadata.user_id` | same purpose |
//! | `metadata`, `store` | Anthropic | dropped | only used by OpenAI's stored completions; the answer is unchanged |
//! | `service_tier`, `prompt_cache_key`, `prompt_cache_retention`, `prediction` | Anthropic | dropped | scheduling, caching and latency hints; the answer is unchanged |
//! | `reasoning_effort` | Anthropic | → `thinking.budget_tokens` | by the table of `form::Effort` (docs/translation.md#reasoning) |
//! | `verbosity` | Anthropic | dropped | a hint to OpenAI's reasoning models; the answer's shape is unchanged |
//! | `tools[].function.strict` | Anthropic | dropped | schema adherence is not enforced (as in Anthropic's own OpenAI layer) |
//! | `messages[].name` | Anthropic | dropped | no per-participant names |
//! | `image_url.detail` | Anthropic | dropped | a resolution hint |
//! | `top_k` | OpenAI | 400 | no equivalent in chat completions |
//! | `thinking`, `output_config.effort` | OpenAI | → `reasoning_effort` | by the table of `form::Effort` |
//! | `output_config.format`, `output_format` | OpenAI | → `response_format` `json_schema` | `strict` where OpenAI's strict mode takes the schema |
//! | `container`, `mcp_servers`, `context_management`, server tools (`tools[].type` other than `custom`) | OpenAI | 400 | Anthropic-hosted features |
//! | `service_tier` | OpenAI | dropped | scheduling hint |
//! | `cache_control` (anywhere), `citations` in history | OpenAI | dropped | prompt caching is a cost optimisation; the answer is unchanged |
//! | `tool_result.is_error` | OpenAI | dropped | tool messages have no error flag; the result's text still says what failed |
//! | images or documents inside `tool_result` | OpenAI | skipped (`unsupportedFeature`) | tool messages carry text only |
//! | plain-text `document` | OpenAI | → a text part | chat completions' file parts take PDFs |
//!
//! # Responses
//!
//! Text blocks are concatenated (as their stream deltas would be); `tool_use` ↔
//! `tool_calls` (object ↔ JSON string); stop reasons `end_turn`/`stop_sequence` →
//! `stop`, `max_tokens`/`model_context_window_exceeded` → `length`, `tool_use` →
//! `tool_calls`, `refusal` → `content_filter` (and back: `stop` → `end_turn`,
//! `length` → `max_tokens`, `tool_calls`/`function_call` → `tool_use`,
//! `content_filter` → `refusal`). OpenAI's `stop` cannot say which stop sequence
//! matched, so it always becomes `end_turn` with `stop_sequence: null`. Usage:
//! `prompt_tokens` = `input_tokens` + cache reads + cache writes (OpenAI counts cached
//! tokens in the prompt), `prompt_tokens_details.cached_tokens` = cache reads, and
//! back. Ids: `msg_X` ↔ `chatcmpl-X`; tool call ids are kept as they are (they must
//! round-trip through the client's next request). `model` is always the client's name.
//!
//! # Errors
//!
//! The upstream's message is kept word for word (context-length wording survives);
//! the error type follows the upstream's type or, failing that, the status. An
//! Anthropic "prompt is too long" becomes OpenAI code `context_length_exceeded`; an
//! OpenAI context-length error gets the message prefix "prompt is too long: " for
//! Anthropic clients, which look for that wording.
//!
//! # Streams
//!
//! Each upstream event produces its client events at once. The one exception: an
//! OpenAI stream reports usage in a chunk *after* the one carrying `finish_reason`,
//! while Anthropic's `message_delta` carries the stop reason and usage together, so
//! that `message_delta` is written when the usage chunk (or `[DONE]`) arrives: one
//! event later, no content held back. Anthropic's `message_start` needs input tokens
//! that OpenAI only reports at the end: it says 0, and the final `message_delta`
//! carries the real `input_tokens` (the Anthropic SDKs take them from there).
//!
//! In form terms: the upstream's adapter decodes each event into `form::Event`s that
//! the client's adapter writes as they come. The Anthropic encoder writes stop reason
//! and usage on `Event::End`, which the OpenAI decoder emits once it has seen both
//! (or `[DONE]`).

mod stream;
mod translation;

#[cfg(test)]
mod round_trips;

use bytes::Bytes;
use serde_json::Value;
use switchback_crds::config::Provider;

use super::dialect::Dialect;
use super::{anthropic, bedrock, gemini, openai, vocab};
use crate::wire::surface::{Surface, Wire};

pub use super::dialect::{Defaults, TranslateError};
pub(crate) use super::form::Fetched;
pub use stream::StreamTranslator;
pub(crate) use translation::Translation;

/// The pairings, named: client wire → upstream wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// An OpenAI chat completions client answered by an Anthropic messages target.
    OpenAiToAnthropic,
    /// An Anthropic messages client answered by an OpenAI chat completions target.
    AnthropicToOpenAi,
    /// An OpenAI chat completions client answered by a Gemini `generateContent` target.
    OpenAiToGemini,
    /// An Anthropic messages client answered by a Gemini `generateContent` target.
    AnthropicToGemini,
    /// An OpenAI chat completions client answered by a Bedrock `Converse` target.
    OpenAiToBedrock,
    /// An Anthropic messages client answered by a Bedrock `Converse` target.
    AnthropicToBedrock,
}

impl Direction {
    const ALL: [Direction; 6] = [
        Self::OpenAiToAnthropic,
        Self::AnthropicToOpenAi,
        Self::OpenAiToGemini,
        Self::AnthropicToGemini,
        Self::OpenAiToBedrock,
        Self::AnthropicToBedrock,
    ];

    /// The pairing it names.
    pub fn translation(self) -> Translation {
        let (wire, upstream): (Wire, &'static dyn Dialect) = match self {
            Self::OpenAiToAnthropic => (Wire::OpenAi, &anthropic::MESSAGES),
            Self::AnthropicToOpenAi => (Wire::Anthropic, &openai::CHAT),
            Self::OpenAiToGemini => (Wire::OpenAi, &gemini::GENERATE_CONTENT),
            Self::AnthropicToGemini => (Wire::Anthropic, &gemini::GENERATE_CONTENT),
            Self::OpenAiToBedrock => (Wire::OpenAi, &bedrock::CONVERSE),
            Self::AnthropicToBedrock => (Wire::Anthropic, &bedrock::CONVERSE),
        };
        Translation::to(wire, upstream)
    }

    /// The translation a target of `provider` needs for this surface, as its adapter
    /// says (for a vertex target: a Google model's): `None` when the provider speaks
    /// the surface natively, or when no translation exists (embeddings on an
    /// Anthropic target).
    pub fn for_target(surface: Surface, provider: Provider) -> Option<Self> {
        let upstream = super::adapter(provider).dialect("");
        if !matches!(surface, Surface::ChatCompletions | Surface::Messages)
            || upstream.surface() == Some(surface)
        {
            return None;
        }
        let name = upstream.target().name;
        Self::ALL.into_iter().find(|d| {
            let t = d.translation();
            t.client_wire() == surface.wire() && t.upstream.target().name == name
        })
    }

    pub fn client_wire(self) -> Wire {
        self.translation().client_wire()
    }

    /// Whether the upstream is Bedrock.
    pub fn to_bedrock(self) -> bool {
        matches!(self, Self::OpenAiToBedrock | Self::AnthropicToBedrock)
    }

    /// The client-surface wire the upstream speaks; `None` for APIs that are no
    /// client surface (and take none of their headers).
    pub fn upstream_wire(self) -> Option<Wire> {
        self.upstream_surface().map(Surface::wire)
    }

    /// The client surface the upstream's API is; `None` for APIs that are none
    /// (their URLs name the model and the method).
    pub fn upstream_surface(self) -> Option<Surface> {
        self.translation().upstream.surface()
    }
}

impl From<Direction> for Translation {
    fn from(d: Direction) -> Self {
        d.translation()
    }
}

fn to_bytes(v: &Value) -> Bytes {
    Bytes::from(serde_json::to_vec(v).unwrap_or_default())
}

/// The client's request body (its wire format) → the upstream's, with `model` set to
/// `upstream_model`.
pub fn request(
    translation: impl Into<Translation>,
    body: &[u8],
    upstream_model: &str,
    defaults: &Defaults,
) -> Result<Bytes, TranslateError> {
    request_with(
        translation,
        body,
        upstream_model,
        defaults,
        &Fetched::default(),
    )
}

/// [`request`], with the images and documents the gateway fetched for a target that
/// cannot fetch them itself. A URL still missing is refused naming it
/// ([`TranslateError::fetch`]): fetch it and call again.
pub(crate) fn request_with(
    translation: impl Into<Translation>,
    body: &[u8],
    upstream_model: &str,
    defaults: &Defaults,
    fetched: &Fetched,
) -> Result<Bytes, TranslateError> {
    let t = translation.into();
    let parsed = vocab::parse_object(body)?;
    let form = t
        .client
        .decode_request(&parsed, t.upstream.target(), fetched)?;
    let out = t.upstream.encode_request(&form, upstream_model, defaults)?;
    Ok(to_bytes(&out))
}

/// Whether a chat completions body asked for the stream's usage chunk
/// (`stream_options.include_usage`). Anthropic clients always get usage.
pub fn include_usage(client_body: &[u8]) -> bool {
    openai::include_usage(client_body)
}

/// A 2xx unary upstream body → the client's, `model` = `client_model`.
pub fn response(
    translation: impl Into<Translation>,
    upstream_body: &[u8],
    client_model: &str,
) -> Result<Bytes, TranslateError> {
    response_at(translation, upstream_body, client_model, vocab::now())
}

/// [`response`] with a fixed `created` stamp (OpenAI clients), for reproducible output.
pub fn response_at(
    translation: impl Into<Translation>,
    upstream_body: &[u8],
    client_model: &str,
    created: u64,
) -> Result<Bytes, TranslateError> {
    let t = translation.into();
    let parsed = vocab::parse_answer(upstream_body)?;
    let answer = t.upstream.decode_answer(&parsed)?;
    Ok(to_bytes(&t.client.encode_answer(
        &answer,
        client_model,
        created,
    )))
}

/// A non-2xx upstream body → the client's error shape, message kept. The status is
/// unchanged (the caller keeps the upstream's).
pub fn error(
    translation: impl Into<Translation>,
    status: u16,
    upstream_error_body: &[u8],
) -> Bytes {
    let t = translation.into();
    let e = t.upstream.decode_error(status, upstream_error_body);
    to_bytes(&t.client.encode_error(&e))
}

/// A 2xx unary answer that is no answer: the upstream blocked the prompt (class
/// `contentFilter`).
pub(crate) fn is_blocked(translation: impl Into<Translation>, upstream_body: &[u8]) -> bool {
    translation.into().upstream.is_blocked(upstream_body)
}

#[cfg(test)]
mod tests {
    use super::super::vocab::parse_data_url;
    use super::*;

    fn openai_id(anthropic_id: &str) -> String {
        openai::wire_id(anthropic::bare_id(anthropic_id))
    }

    fn anthropic_id(openai_id: &str) -> String {
        anthropic::wire_id(openai::bare_id(openai_id))
    }

    fn finish_reason(stop_reason: &str) -> &'static str {
        openai::finish_reason(anthropic::stop_of(stop_reason))
    }

    fn stop_reason(finish_reason: &str) -> &'static str {
        anthropic::stop_reason(openai::stop_of(finish_reason))
    }

    fn chat(body: serde_json::Value) -> serde_json::Value {
        let out = request(
            Direction::OpenAiToAnthropic,
            body.to_string().as_bytes(),
            "claude",
            &Defaults::default(),
        )
        .unwrap();
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn caching_hints_are_dropped_both_ways() {
        let out = chat(
            serde_json::json!({"model": "m", "prompt_cache_retention": "24h",
            "prompt_cache_key": "k", "messages": [{"role": "user", "content": "hi"}]}),
        );
        assert!(
            out.get("prompt_cache_retention").is_none() && out.get("prompt_cache_key").is_none()
        );
        let out = request(
            Direction::AnthropicToOpenAi,
            br#"{"model":"m","max_tokens":5,"cache_control":{"type":"ephemeral"},"messages":[{"role":"user","content":"hi"}]}"#,
            "gpt",
            &Defaults::default(),
        )
        .unwrap();
        let out: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert!(out.get("cache_control").is_none(), "{out}");
    }

    #[test]
    fn ids_and_reasons_round_trip() {
        assert_eq!(openai_id("msg_01X"), "chatcmpl-01X");
        assert_eq!(anthropic_id(&openai_id("msg_01X")), "msg_01X");
        for r in ["end_turn", "max_tokens", "tool_use", "refusal"] {
            assert_eq!(stop_reason(finish_reason(r)), r);
        }
        assert_eq!(finish_reason("stop_sequence"), "stop");
        assert_eq!(
            parse_data_url("data:image/png;base64,AAA"),
            Some(("image/png", "AAA"))
        );
        assert_eq!(parse_data_url("data:text/plain,hello"), None);
    }

    #[test]
    fn tool_results_merge_with_the_next_user_turn() {
        let v = chat(serde_json::json!({"model": "m", "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "r"},
            {"role": "user", "content": "more"},
        ]}));
        let m = v["messages"].as_array().unwrap();
        assert_eq!(m.len(), 3);
        // An empty text beside tool calls is left out (Anthropic rejects empty text).
        assert_eq!(m[1]["content"].as_array().unwrap().len(), 1);
        assert_eq!(m[1]["content"][0]["input"], serde_json::json!({}));
        assert_eq!(m[2]["content"][0]["type"], "tool_result");
        assert_eq!(m[2]["content"][1]["text"], "more");
    }

    #[test]
    fn upstream_tool_arguments_that_are_not_an_object_are_a_502() {
        let body = br#"{"id":"chatcmpl-1","object":"chat.completion","model":"gpt","choices":[{
            "index":0,"finish_reason":"tool_calls","message":{"role":"assistant","content":null,
            "tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"[1]"}}]}}]}"#;
        let err = response(Direction::AnthropicToOpenAi, body, "smart").unwrap_err();
        assert_eq!(err.status(), 502);
        assert!(err.message().contains(r#"tool "f""#), "{}", err.message());
    }

    #[test]
    fn null_parameters_count_as_absent() {
        let v = chat(
            serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "q"}],
            "n": null, "logprobs": null, "temperature": null, "tools": null}),
        );
        assert!(v.get("temperature").is_none());
        assert!(v.get("tools").is_none());
    }

    #[test]
    fn parallel_tool_calls_false_without_tool_choice() {
        let v = chat(
            serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "q"}],
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "parallel_tool_calls": false}),
        );
        assert_eq!(
            v["tool_choice"],
            serde_json::json!({"type": "auto", "disable_parallel_tool_use": true})
        );
    }
}
