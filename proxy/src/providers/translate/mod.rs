//! Translation between chat APIs: requests, unary responses, error bodies and
//! streams, so a route can answer an OpenAI-SDK client from an Anthropic target and
//! an Anthropic-SDK client from an OpenAI (or OpenAI-compatible) target.
//!
//! Pure functions and stream state machines: nothing here does I/O, reads the clock
//! (except `created` stamps) or knows about routes. The pipeline only needs to know
//! the [`Direction`] of a (client surface, target provider) pair.
//!
//! # Shape
//!
//! Every API is one adapter to and from one internal form (`form`: a request, an
//! answer, stream events, an error). A pairing is a decode by the client's adapter
//! and an encode by the target's for requests, and the reverse for answers, streams
//! and errors: OpenAI client → Anthropic target is `openai::decode_request` then
//! `anthropic::encode_request`, its answer `anthropic::decode_answer` then
//! `openai::encode_answer`, and so on. A new provider is one adapter, not one
//! translator per API it must serve. Only a decoder knows the client's parameter
//! paths, so it refuses what the target cannot take (`form::Target`, declared by each
//! adapter); encoders cannot fail. A target that speaks the client's API natively
//! never comes here: its bodies are relayed with only `model` rewritten.
//!
//! A provider is added as one module beside `openai` and `anthropic`: its `TARGET`,
//! `encode_request`, `decode_answer`, `decode_error` and a `StreamDecoder` (the
//! decode and encode halves of the other direction too if it is to be a client
//! surface), a `Dialect` variant, and the pairings in [`Direction`].
//!
//! # Interface
//!
//! | call | input | output |
//! |---|---|---|
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
//!   `input_audio`, `file_id` and other part types → 400.
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
//!   (base64 → data URL); base64 PDF `document` blocks → `file` parts; `thinking` /
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
//! Every top-level field is accounted for: an unknown field is a 400 naming it,
//! never silently dropped. A field that is `null` counts as absent. A field the form
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
//! | `response_format` `json_object` / `json_schema` | Anthropic | 400 | no guaranteed JSON mode; `{"type":"text"}` accepted |
//! | `audio`, `modalities` with `audio` | Anthropic | 400 | text only; `["text"]` accepted |
//! | `web_search_options` | Anthropic | 400 | OpenAI's hosted search |
//! | `functions`, `function_call` | Anthropic | 400 | deprecated; use `tools` / `tool_choice` |
//! | `tool_choice` `allowed_tools` / custom, custom tools | Anthropic | 400 | no equivalent |
//! | `seed` | Anthropic | dropped | OpenAI documents it as best effort, determinism is not guaranteed |
//! | `user`, `safety_identifier` | Anthropic | → `metadata.user_id` | same purpose |
//! | `metadata`, `store` | Anthropic | dropped | only used by OpenAI's stored completions; the answer is unchanged |
//! | `service_tier`, `prompt_cache_key`, `prompt_cache_retention`, `prediction` | Anthropic | dropped | scheduling, caching and latency hints; the answer is unchanged |
//! | `reasoning_effort`, `verbosity` | Anthropic | dropped | hints to OpenAI's reasoning models; the answer's shape is unchanged (Anthropic's own OpenAI layer ignores them too) |
//! | `tools[].function.strict` | Anthropic | dropped | schema adherence is not enforced (as in Anthropic's own OpenAI layer) |
//! | `messages[].name` | Anthropic | dropped | no per-participant names |
//! | `image_url.detail` | Anthropic | dropped | a resolution hint |
//! | `top_k` | OpenAI | 400 | no equivalent in chat completions |
//! | `thinking` enabled | OpenAI | 400 | chat completions returns no thinking blocks; `{"type":"disabled"}` accepted |
//! | `container`, `mcp_servers`, `context_management`, server tools (`tools[].type` other than `custom`) | OpenAI | 400 | Anthropic-hosted features |
//! | `service_tier` | OpenAI | dropped | scheduling hint |
//! | `cache_control` (anywhere), `citations` in history | OpenAI | dropped | prompt caching is a cost optimisation; the answer is unchanged |
//! | `tool_result.is_error` | OpenAI | dropped | tool messages have no error flag; the result's text still says what failed |
//! | images inside `tool_result` | OpenAI | 400 | tool messages carry text only |
//!
//! # Requests: either surface → Gemini ([`Direction::OpenAiToGemini`], [`Direction::AnthropicToGemini`])
//!
//! Gemini (Google AI's native `generateContent`) is a provider only. Its adapter
//! encodes the form: the system prompt → `systemInstruction`; turns → `contents`
//! (`user` / `model`, consecutive turns of one role merged, empty text parts left
//! out); text, base64 images and PDFs → `text` / `inlineData`; tool calls →
//! `functionCall {name, args}`; tool results → `functionResponse {name, response}`,
//! `response` the result itself when it is a JSON object, else `{"output": text}`
//! (`{"error": text}` when the client flagged an error), the name
//! taken from the call with the result's id earlier in the conversation; tools → one
//! `functionDeclarations` list, each schema sent as `parametersJsonSchema` (JSON
//! Schema as the client wrote it); `tool_choice` → `functionCallingConfig.mode`
//! `AUTO` / `NONE` / `ANY` (a named tool: `ANY` with `allowedFunctionNames`);
//! sampling, the output limit and stop sequences → `generationConfig`. The model and
//! whether to stream are in the URL, never the body. Its `form::Target` says what the
//! decoders refuse beyond the Anthropic-like core: images by URL (only inline bytes)
//! and tool results whose call is not in the conversation (they could not name their
//! function). `parallel_tool_calls: false` and the end-user id are dropped (no
//! equivalent); `top_k` is taken from Anthropic clients; temperatures up to 2.
//!
//! Answers: the first candidate's text and `functionCall` parts (thought parts left
//! out); `responseId` is the id; calls get ids `call_{responseId}_{n}` (Gemini gives
//! none), the same unary and streamed, so results can name them back; `finishReason`
//! `STOP` → end turn (tool use when the answer calls a function), `MAX_TOKENS` → max
//! tokens, `SAFETY` / `RECITATION` / `BLOCKLIST` / `PROHIBITED_CONTENT` / `SPII` (and
//! the image variants) → refusal; a prompt blocked before any candidate
//! (`promptFeedback.blockReason`) → an empty answer stopped as a refusal (the
//! pipeline classes it `contentFilter`, see [`is_blocked`] and [`opening`]). Usage:
//! `promptTokenCount` less `cachedContentTokenCount` in, cached tokens as cache reads,
//! `candidatesTokenCount` + `thoughtsTokenCount` out. Errors: by `error.status`
//! (`RESOURCE_EXHAUSTED` → rate limit, `UNAVAILABLE` → overloaded, `NOT_FOUND`,
//! `PERMISSION_DENIED`, `UNAUTHENTICATED`, `DEADLINE_EXCEEDED`, `INTERNAL`), with
//! Google's context-length wording and `API_KEY_INVALID` recognised first. Streams:
//! `alt=sse` chunks of whole parts, no `[DONE]`; the client's stream is completed by
//! [`StreamTranslator::finish`] once a finish reason came.
//!
//! # Requests: either surface → Bedrock ([`Direction::OpenAiToBedrock`], [`Direction::AnthropicToBedrock`])
//!
//! Bedrock (Amazon Bedrock's `Converse` / `ConverseStream`) is a provider only. Its
//! adapter encodes the form: the system prompt → `system` text blocks; turns →
//! `messages` (`user` / `assistant`, consecutive turns of one role merged, empty
//! text left out, as Converse refuses blank text); text → `text`; base64 images →
//! `image {format, source.bytes}` (the format from the media type: png, jpeg, gif,
//! webp); PDFs → `document {format, name, source.bytes}` (the name is the title
//! cleaned to what Converse allows, else `document-N`); tool calls → `toolUse
//! {toolUseId, name, input}`; tool results → `toolResult {toolUseId, content:
//! [{text}], status: "error"?}`; tools → `toolConfig.tools[].toolSpec` with the
//! client's JSON Schema as `inputSchema.json`; `tool_choice` `auto` / `required` /
//! named → `toolChoice` `auto` / `any` / `tool`; `none` → no `toolConfig` at all
//! (Converse has no "none"); `max_tokens`, `temperature`, `top_p`, stop sequences →
//! `inferenceConfig {maxTokens, temperature, topP, stopSequences}`. The model and
//! whether to stream are in the URL. Refused with a 400 naming the client's
//! parameter: `top_k` (no Converse field), temperatures above 1, images by URL, and
//! `tool_choice: none` in a conversation that holds tool calls or results (Bedrock
//! requires `toolConfig` then, and could call a tool). `parallel_tool_calls: false`
//! and the end-user id are dropped (no equivalent).
//!
//! Answers: `output.message.content` text and `toolUse` blocks (ids kept as Bedrock
//! made them); an id is made up (Converse gives none); `stopReason` `end_turn` →
//! end turn, `tool_use` → tool use, `max_tokens` → max tokens, `stop_sequence` →
//! stop sequence, `guardrail_intervened` / `content_filtered` → refusal,
//! `model_context_window_exceeded` → context window. Usage: `inputTokens` in,
//! `outputTokens` out, `cacheReadInputTokens` / `cacheWriteInputTokens` as cache reads
//! and writes. Errors: by the type the `x-amzn-errortype` header named (copied into
//! the body as `__type` by the pipeline): `ThrottlingException` → rate limit,
//! `ServiceUnavailableException` / `ModelNotReadyException` → overloaded,
//! `ValidationException` → invalid request unless it says the input is too long
//! (context length), `AccessDeniedException` → permission,
//! `UnrecognizedClientException` and the signature errors → authentication,
//! `ResourceNotFoundException` for a model → model not found. Streams: each binary
//! frame becomes one SSE event before the decoder sees it (`eventstream`); tool
//! input arrives as JSON text fragments; `metadata` (usage) after `messageStop`
//! completes the answer; an exception frame is an in-band error.
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

mod anthropic;
mod bedrock;
mod errors;
mod form;
mod gemini;
mod openai;
mod stream;
mod vocab;

#[cfg(test)]
mod round_trips;

use bytes::Bytes;
use serde_json::Value;
use switchback_crds::config::Provider;

use crate::wire::surface::{Surface, Wire};

pub use stream::StreamTranslator;

/// Which way a request is translated: client wire → upstream wire. Responses,
/// errors and streams of the same exchange flow back with the same value.
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

/// The API an adapter speaks (one module each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dialect {
    OpenAiChat,
    AnthropicMessages,
    /// Google AI's `generateContent`: a provider only, never a client surface.
    Gemini,
    /// Amazon Bedrock's `Converse`: a provider only, never a client surface.
    Bedrock,
}

/// The APIs clients speak (adapters with a decode half for requests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Client {
    OpenAiChat,
    AnthropicMessages,
}

impl Dialect {
    fn target(self) -> &'static form::Target {
        match self {
            Self::OpenAiChat => &openai::TARGET,
            Self::AnthropicMessages => &anthropic::TARGET,
            Self::Gemini => &gemini::TARGET,
            Self::Bedrock => &bedrock::TARGET,
        }
    }
}

impl Direction {
    /// The translation a target needs for this surface: `None` when the provider
    /// speaks the surface natively, or when no translation exists (embeddings on an
    /// Anthropic target).
    pub fn for_target(surface: Surface, provider: Provider) -> Option<Self> {
        match (surface, provider) {
            (Surface::ChatCompletions, Provider::Anthropic) => Some(Self::OpenAiToAnthropic),
            (Surface::ChatCompletions, Provider::Gemini) => Some(Self::OpenAiToGemini),
            (Surface::Messages, Provider::Gemini) => Some(Self::AnthropicToGemini),
            (Surface::ChatCompletions, Provider::Bedrock) => Some(Self::OpenAiToBedrock),
            (Surface::Messages, Provider::Bedrock) => Some(Self::AnthropicToBedrock),
            (
                Surface::Messages,
                Provider::Openai | Provider::OpenaiCompatible | Provider::AzureOpenai,
            ) => Some(Self::AnthropicToOpenAi),
            _ => None,
        }
    }

    /// (client's adapter, upstream's adapter).
    fn dialects(self) -> (Client, Dialect) {
        match self {
            Self::OpenAiToAnthropic => (Client::OpenAiChat, Dialect::AnthropicMessages),
            Self::AnthropicToOpenAi => (Client::AnthropicMessages, Dialect::OpenAiChat),
            Self::OpenAiToGemini => (Client::OpenAiChat, Dialect::Gemini),
            Self::AnthropicToGemini => (Client::AnthropicMessages, Dialect::Gemini),
            Self::OpenAiToBedrock => (Client::OpenAiChat, Dialect::Bedrock),
            Self::AnthropicToBedrock => (Client::AnthropicMessages, Dialect::Bedrock),
        }
    }

    pub fn client_wire(self) -> Wire {
        match self.dialects().0 {
            Client::OpenAiChat => Wire::OpenAi,
            Client::AnthropicMessages => Wire::Anthropic,
        }
    }

    /// The client-surface wire the upstream speaks; `None` for Gemini and Bedrock,
    /// which are no client surface (and take none of their headers).
    pub fn upstream_wire(self) -> Option<Wire> {
        match self.dialects().1 {
            Dialect::AnthropicMessages => Some(Wire::Anthropic),
            Dialect::OpenAiChat => Some(Wire::OpenAi),
            Dialect::Gemini | Dialect::Bedrock => None,
        }
    }

    /// The API called upstream (its URL is `credential.urls[surface.index()]`);
    /// `None` for Gemini and Bedrock, whose URLs name the model and the method
    /// (`TargetRt::model_url`).
    pub fn upstream_surface(self) -> Option<Surface> {
        match self.dialects().1 {
            Dialect::AnthropicMessages => Some(Surface::Messages),
            Dialect::OpenAiChat => Some(Surface::ChatCompletions),
            Dialect::Gemini | Dialect::Bedrock => None,
        }
    }

    /// Whether the upstream is Gemini: its streams open, and report usage, in its own
    /// shapes.
    pub fn to_gemini(self) -> bool {
        self.dialects().1 == Dialect::Gemini
    }

    /// Whether the upstream is Bedrock: its streams come in AWS event-stream framing
    /// (see `eventstream`), open and report usage in its own shapes.
    pub fn to_bedrock(self) -> bool {
        self.dialects().1 == Dialect::Bedrock
    }
}

/// Per-route (or per-credential) choices the wire formats leave open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Defaults {
    /// `max_tokens` sent to an Anthropic target when the OpenAI client set no limit
    /// (Anthropic requires one). Default 4096.
    pub max_tokens: u32,
    /// Send an Anthropic client's `max_tokens` to an OpenAI target as
    /// `max_completion_tokens` (required by OpenAI's reasoning models) instead of
    /// `max_tokens` (what OpenAI-compatible servers read). Default false; set it for
    /// `provider: openai` targets.
    pub openai_max_completion_tokens: bool,
    /// An Anthropic target on Vertex AI (`rawPredict`): the body carries
    /// `anthropic_version` and no `model` (see `vertex::to_vertex_anthropic`).
    pub anthropic_on_vertex: bool,
}

impl Default for Defaults {
    fn default() -> Self {
        Self {
            max_tokens: 4096,
            openai_max_completion_tokens: false,
            anthropic_on_vertex: false,
        }
    }
}

/// A request the target cannot serve (400), or an upstream answer that cannot be
/// expressed to the client (502).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TranslateError {
    status: u16,
    param: Option<String>,
    message: String,
}

impl TranslateError {
    pub(crate) fn unsupported(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            status: 400,
            param: Some(param.into()),
            message: message.into(),
        }
    }

    pub(crate) fn invalid(param: Option<String>, message: impl Into<String>) -> Self {
        Self {
            status: 400,
            param,
            message: message.into(),
        }
    }

    pub(crate) fn upstream(message: impl Into<String>) -> Self {
        Self {
            status: 502,
            param: None,
            message: message.into(),
        }
    }

    /// 400 for a request, 502 for an upstream answer.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The client parameter at fault (a path such as `messages[2].content[0].type`).
    pub fn param(&self) -> Option<&str> {
        self.param.as_deref()
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    /// A short machine-readable code for error bodies and logs.
    pub fn code(&self) -> &'static str {
        if self.status >= 500 {
            "untranslatable_response"
        } else {
            "unsupported_parameter"
        }
    }

    /// The error in the client's shape (OpenAI's carries `param`).
    pub fn body(&self, client: Wire) -> Bytes {
        let body = match client {
            Wire::OpenAi => openai::encode_refusal(self),
            Wire::Anthropic => anthropic::encode_refusal(self),
        };
        to_bytes(&body)
    }
}

fn to_bytes(v: &Value) -> Bytes {
    Bytes::from(serde_json::to_vec(v).unwrap_or_default())
}

/// The client's request body (its wire format) → the upstream's, with `model` set to
/// `upstream_model`.
pub fn request(
    direction: Direction,
    body: &[u8],
    upstream_model: &str,
    defaults: &Defaults,
) -> Result<Bytes, TranslateError> {
    let (client, upstream) = direction.dialects();
    let parsed = vocab::parse_object(body)?;
    let target = upstream.target();
    let form = match client {
        Client::OpenAiChat => openai::decode_request(&parsed, target)?,
        Client::AnthropicMessages => anthropic::decode_request(&parsed, target)?,
    };
    if upstream == Dialect::Bedrock
        && form.tool_choice == Some(form::ToolChoice::None)
        && form.messages.iter().any(|m| {
            m.content
                .iter()
                .any(|p| matches!(p, form::Part::ToolUse(_) | form::Part::ToolResult(_)))
        })
    {
        // Converse has no "none"; leaving the tools out is only possible without tool
        // blocks in the conversation (Bedrock then requires `toolConfig`).
        return Err(vocab::refuse(
            "tool_choice",
            "tool_choice none in a conversation with tool calls (Converse has no \"none\" and requires the tools then)",
            target,
        ));
    }
    let out = match upstream {
        Dialect::OpenAiChat => openai::encode_request(&form, upstream_model, defaults),
        Dialect::AnthropicMessages => {
            let mut out = anthropic::encode_request(&form, upstream_model, defaults);
            if defaults.anthropic_on_vertex
                && let Value::Object(body) = &mut out
            {
                crate::providers::vertex::to_vertex_anthropic(body);
            }
            out
        }
        // The model is in the URL.
        Dialect::Gemini => gemini::encode_request(&form),
        Dialect::Bedrock => bedrock::encode_request(&form),
    };
    Ok(to_bytes(&out))
}

/// Whether a chat completions body asked for the stream's usage chunk
/// (`stream_options.include_usage`). Anthropic clients always get usage.
pub fn include_usage(client_body: &[u8]) -> bool {
    openai::include_usage(client_body)
}

/// A 2xx unary upstream body → the client's, `model` = `client_model`.
pub fn response(
    direction: Direction,
    upstream_body: &[u8],
    client_model: &str,
) -> Result<Bytes, TranslateError> {
    response_at(direction, upstream_body, client_model, vocab::now())
}

/// [`response`] with a fixed `created` stamp (OpenAI clients), for reproducible output.
pub fn response_at(
    direction: Direction,
    upstream_body: &[u8],
    client_model: &str,
    created: u64,
) -> Result<Bytes, TranslateError> {
    let (client, upstream) = direction.dialects();
    let parsed = vocab::parse_answer(upstream_body)?;
    let answer = match upstream {
        Dialect::OpenAiChat => openai::decode_answer(&parsed)?,
        Dialect::AnthropicMessages => anthropic::decode_answer(&parsed),
        Dialect::Gemini => gemini::decode_answer(&parsed),
        Dialect::Bedrock => bedrock::decode_answer(&parsed),
    };
    let out = match client {
        Client::OpenAiChat => openai::encode_answer(&answer, client_model, created),
        Client::AnthropicMessages => anthropic::encode_answer(&answer, client_model),
    };
    Ok(to_bytes(&out))
}

/// A non-2xx upstream body → the client's error shape, message kept. The status is
/// unchanged (the caller keeps the upstream's).
pub fn error(direction: Direction, status: u16, upstream_error_body: &[u8]) -> Bytes {
    let (client, upstream) = direction.dialects();
    let e = match upstream {
        Dialect::OpenAiChat => openai::decode_error(status, upstream_error_body),
        Dialect::AnthropicMessages => anthropic::decode_error(status, upstream_error_body),
        Dialect::Gemini => gemini::decode_error(status, upstream_error_body),
        Dialect::Bedrock => bedrock::decode_error(status, upstream_error_body),
    };
    to_bytes(&match client {
        Client::OpenAiChat => openai::encode_error(&e),
        Client::AnthropicMessages => anthropic::encode_error(&e),
    })
}

/// A Google-shaped error body (`{"error":{"code","message","status"}}`, what Vertex
/// AI answers for its own refusals whichever publisher's model was called) in
/// Anthropic's shape, message kept; `None` when the body is not Google's (an
/// Anthropic error is relayed as it is).
pub fn anthropic_error(status: u16, upstream_error_body: &[u8]) -> Option<Bytes> {
    anthropic::is_google_error(upstream_error_body).then(|| {
        to_bytes(&anthropic::encode_error(&gemini::decode_error(
            status,
            upstream_error_body,
        )))
    })
}

/// What an event of an upstream stream's opening means for the commit, read in the
/// upstream's own shapes: Gemini's chunks (see `gemini::stream::opening`), or the
/// client surfaces' (`sse::opening`).
pub fn opening(direction: Option<Direction>, event: &[u8]) -> crate::wire::sse::Opening {
    match direction {
        Some(d) if d.to_gemini() => gemini::opening(event),
        Some(d) if d.to_bedrock() => bedrock::opening(event),
        _ => crate::wire::sse::opening(event),
    }
}

/// A Bedrock error answer as the rest of the pipeline reads it: the type the
/// `x-amzn-errortype` header named written into the body (`__type`), and the status
/// that classes it (see `bedrock::class_status`: a model still loading is overload,
/// a model's own failure a server error). Returns (status to classify by, body).
pub fn bedrock_error(status: u16, error_type_header: Option<&str>, body: &[u8]) -> (u16, Bytes) {
    let body = bedrock::with_error_type(error_type_header, body);
    let kind = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v.get("__type").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_default();
    (bedrock::class_status(status, &kind), body)
}

/// The status an event-stream exception of type `exception_type` classes as (an
/// in-band error has no HTTP status of its own).
pub fn bedrock_exception_status(exception_type: &str) -> u16 {
    bedrock::class_status(500, exception_type)
}

/// A 2xx unary answer that is a Gemini prompt blocked by its safety filters (no
/// candidate, `promptFeedback.blockReason`): class `contentFilter`.
pub fn is_blocked(direction: Direction, upstream_body: &[u8]) -> bool {
    direction.to_gemini()
        && memchr::memmem::find(upstream_body, b"blockReason").is_some()
        && vocab::parse_answer(upstream_body).is_ok_and(|a| gemini::is_blocked(&a))
}

#[cfg(test)]
mod tests {
    use super::vocab::parse_data_url;
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
