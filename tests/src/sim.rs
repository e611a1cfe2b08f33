//! Simulated LLM providers: in-process HTTP servers speaking the OpenAI or Anthropic
//! wire format, scripted per request.
//!
//! This module owns the provider side of every Switchback test, demo and benchmark:
//! what a provider answers (including the ways real providers fail), and a record of
//! what it was sent. Each [`SimProvider`] binds `127.0.0.1:0`, keeps its state in
//! its own handle (no globals, so tests run in parallel), and only ever waits with
//! tokio timers or on futures that never complete, so it works under a paused clock
//! (`#[tokio::test(start_paused = true)]`).
//!
//! Scripting: every request takes the next [`Behavior`] from a queue ([`SimProvider::push`])
//! and falls back to a default ([`SimProvider::set_default`], initially
//! [`Behavior::Answer`]) when the queue is empty. A request presenting a key given its
//! own behaviour ([`SimProvider::set_key_behavior`]) takes that one instead: the
//! provider tells keys apart, as one account's rate limits and revocations do. Requests are recorded on arrival,
//! before their behaviour runs.
//!
//! Continuing: a request whose final message is the assistant's (a prefill, as a
//! proxy resuming a broken stream sends it) is continued by the flavors whose real
//! services do (see `continuation`): their answers say only what is left of their
//! text after the prefill, under another id ([`CONTINUED_OPENAI_ID`],
//! [`CONTINUED_ANTHROPIC_ID`]), and [`Received::prefill`] shows what was asked.
//!
//! Bodies follow the providers' real shapes; the pure functions that render them
//! ([`openai_completion`], [`anthropic_message`], [`openai_stream_events`], …) are
//! public so tests can build expected values. Identifiers and timestamps are fixed so
//! that whole bodies can be compared.
//!
//! Routes: OpenAI flavor serves `POST /v1/chat/completions`, `POST /v1/embeddings`,
//! `POST /v1/responses` (the Responses API, see [`responses`]), `GET /v1/models`; Anthropic flavor serves `POST /v1/messages`, `GET /v1/models`;
//! Azure flavor serves Azure OpenAI's paths under `/openai` and is strict, see
//! [`Flavor::Azure`]; Gemini flavor serves Google AI's `generateContent` under
//! `/v1beta` and is strict too, see [`Flavor::Gemini`]; Vertex flavor serves Vertex
//! AI's Claude and Gemini endpoints and an OAuth token endpoint, strict too, see
//! [`Flavor::Vertex`]; Bedrock flavor serves Converse / ConverseStream (SigV4
//! checked, AWS event-stream framing) and is strict too, see [`Flavor::Bedrock`].
//! Any other path still consumes a behaviour; answering behaviours turn into a 404 in
//! the flavor's error shape there, failure behaviours fail as scripted.

use std::collections::VecDeque;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{AbortHandle, JoinSet};

/// A Vertex request is rendered as its publisher's flavor (see [`Flavor::Vertex`]):
/// `ctx.flavor` is never `Vertex`.
const RENDERED_AS_PUBLISHER: &str = "sim: a Vertex request renders as Anthropic or Gemini";

/// Fixed `created` timestamp (seconds) in every OpenAI object, for comparable bodies.
pub const CREATED: u64 = 1_700_000_000;
/// Fixed id of every OpenAI chat completion (and of its stream chunks).
pub const OPENAI_ID: &str = "chatcmpl-switchback-sim";
/// Fixed id of every Anthropic message.
pub const ANTHROPIC_ID: &str = "msg_switchback_sim";
/// Id of an OpenAI stream that continues a prefilled answer (see [`Received::prefill`]):
/// not [`OPENAI_ID`], so a test sees whether a proxy kept the first stream's id.
pub const CONTINUED_OPENAI_ID: &str = "chatcmpl-switchback-sim-continued";
/// Id of an Anthropic message that continues a prefilled answer.
pub const CONTINUED_ANTHROPIC_ID: &str = "msg_switchback_sim_continued";
/// Anthropic's refusal of a prefill (a final assistant message) that ends in
/// whitespace; Bedrock words it its own way ([`BEDROCK_TRAILING_WHITESPACE`]).
pub const TRAILING_WHITESPACE: &str =
    "messages: final assistant content cannot end with trailing whitespace";
/// vLLM's refusal of `continue_final_message` without `add_generation_prompt: false`.
pub const CONTINUE_WITH_GENERATION_PROMPT: &str =
    "continue_final_message and add_generation_prompt cannot both be true";
/// `prompt_tokens` / `input_tokens` reported in every usage block.
pub const PROMPT_TOKENS: u64 = 10;
/// Model ids listed by `GET /v1/models`.
pub const SIM_MODELS: [&str; 2] = ["sim-chat", "sim-embedding"];
/// Dimensions of every simulated embedding vector.
pub const EMBEDDING_DIMS: usize = 8;
/// Model echoed when the request names none (e.g. a body that is not JSON).
pub const DEFAULT_MODEL: &str = "sim-model";
/// Fixed id of the tool call in every OpenAI [`Behavior::ToolCall`] answer.
pub const OPENAI_TOOL_CALL_ID: &str = "call_switchback_sim";
/// Fixed id of the `tool_use` block in every Anthropic [`Behavior::ToolCall`] answer.
pub const ANTHROPIC_TOOL_USE_ID: &str = "toolu_switchback_sim";
/// Longest piece (in characters) a streamed tool call's arguments are cut into, see
/// [`argument_fragments`].
pub const ARGUMENT_FRAGMENT_CHARS: usize = 8;

/// Wire format a simulated provider speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    OpenAi,
    Anthropic,
    /// Azure OpenAI, strict: refuses what the real service refuses, before any
    /// behaviour is taken from the queue (the request is still recorded and counted):
    ///
    /// * paths: `/openai/deployments/{deployment}/chat/completions` and
    ///   `.../embeddings` with `?api-version=` one of [`AZURE_API_VERSIONS`] (missing
    ///   or unknown: 404 `Resource not found`), or the v1 API's
    ///   `/openai/v1/chat/completions` and `/openai/v1/embeddings` (the deployment is
    ///   the body's `model`); anything else 404;
    /// * auth: the key in `api-key`; none is 401, an `Authorization` header instead
    ///   of it is the 401 Azure gives a bad Entra ID token;
    /// * the deployment must be one of [`SimProvider::set_deployments`] (default
    ///   [`AZURE_DEPLOYMENTS`]): 404 `DeploymentNotFound` otherwise.
    ///
    /// Answers are OpenAI's with what Azure adds: `prompt_filter_results`,
    /// `content_filter_results` per choice, a stream that opens with a chunk whose
    /// `choices` is empty (the prompt's filter results) and carries a filter
    /// annotation chunk before its finish; errors in Azure's shapes (see
    /// [`azure_error`]).
    Azure,
    /// Google AI's native Gemini API, strict (see the `gemini` module for what it
    /// refuses): `POST /v1beta/models/{model}:generateContent` and
    /// `:streamGenerateContent?alt=sse`, the key in `x-goog-api-key`, the model in
    /// the path. Answers are `GenerateContentResponse`s ([`gemini_response`]),
    /// streams `data:` chunks with CRLF framing and no `[DONE]`, errors Google's
    /// `{"error":{"code","message","status"}}` (a 429 `RESOURCE_EXHAUSTED` with a
    /// `RetryInfo`). [`Behavior::ContentFilter`] is a prompt blocked by the safety
    /// filters (a 200 without candidates), [`Behavior::FilteredAnswer`] an answer
    /// stopped for `SAFETY`.
    Gemini,
    /// Google Cloud Vertex AI, strict (see the `vertex` module): an OAuth token
    /// endpoint (`POST /token`, the JWT bearer grant, verified against the key of
    /// [`SimProvider::service_account_json`]) and the model endpoints under
    /// `/v1/projects/{VERTEX_PROJECT}/locations/{VERTEX_LOCATION}/publishers/`:
    /// `anthropic/models/{model}:rawPredict` / `:streamRawPredict` (the Anthropic
    /// wire with `anthropic_version` and no `model`) and
    /// `google/models/{model}:generateContent` / `:streamGenerateContent?alt=sse`
    /// (the Gemini wire), each refusing a missing, unknown or expired bearer token.
    /// Answers render as [`Flavor::Anthropic`] or [`Flavor::Gemini`] by publisher;
    /// errors are Google's ([`vertex_error_body`]).
    Vertex,
    /// Amazon Bedrock's runtime Converse API, strict (see the `bedrock` module for
    /// what it refuses, the SigV4 check included): `POST /model/{modelId}/converse`
    /// and `/converse-stream`, answers `ConverseResponse`s ([`bedrock_response`]),
    /// streams real AWS event-stream frames, errors `{"message"}` with
    /// `x-amzn-errortype`. Its behaviours are those the `bedrock` module lists.
    Bedrock,
}

/// API versions the Azure flavor accepts on its classic (deployment) paths.
pub const AZURE_API_VERSIONS: [&str; 5] = [
    "2024-02-01",
    "2024-06-01",
    "2024-10-21",
    "2024-12-01-preview",
    "2025-04-01-preview",
];

/// Deployments an Azure flavor simulator has until told otherwise.
pub const AZURE_DEPLOYMENTS: [&str; 3] = ["gpt-4o", "gpt-4o-mini", "text-embedding-3-small"];

/// How a provider words a context-length overflow (the proxy must recognise all three).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContextWording {
    /// OpenAI: `code: "context_length_exceeded"`.
    OpenAi,
    /// Anthropic: `"prompt is too long: … tokens > … maximum"`.
    Anthropic,
    /// vLLM (OpenAI-compatible): "maximum context length" in the message, no string code.
    Vllm,
    /// Gemini: 400 `INVALID_ARGUMENT`, "The input token count (N) exceeds the maximum
    /// number of tokens allowed (M)."
    Gemini,
}

/// What the simulator does with one request.
#[derive(Clone, Debug, PartialEq)]
pub enum Behavior {
    /// 200 with a well-formed response in the flavor's shape: chat completion /
    /// message (text [`answer_text`]), embeddings list, or models list, by path. A
    /// request with `"stream": true` gets the same text as a stream, one word per delta.
    /// `model` echoes the request's model.
    Answer,
    /// Like [`Behavior::Answer`] with the given text.
    AnswerText(String),
    /// 200 in which the model calls one tool, `name` with `arguments` (a JSON object),
    /// optionally saying `text` first, in the flavor's real shape, unary or streamed
    /// as the request asks:
    ///
    /// * OpenAI: `message.tool_calls[0]` with id [`OPENAI_TOOL_CALL_ID`] and the
    ///   arguments as a JSON *string*, `content: null` (or the text),
    ///   `finish_reason: "tool_calls"`; streamed as a tool-call delta with `index`,
    ///   `id`, `type` and `function.name` (arguments `""`), then one delta per
    ///   [`argument_fragments`] piece, then the finish chunk.
    /// * Anthropic: a `tool_use` block with id [`ANTHROPIC_TOOL_USE_ID`] and the
    ///   arguments as the `input` *object* (after a text block when `text` is set),
    ///   `stop_reason: "tool_use"`; streamed as `content_block_start` (tool_use,
    ///   `input: {}`), an empty `input_json_delta`, then one `input_json_delta` per
    ///   fragment.
    ///
    /// See [`openai_tool_call_completion`], [`anthropic_tool_use_message`] and their
    /// stream counterparts. Endpoints other than chat completions / messages behave
    /// as [`Behavior::Answer`]. Push it, then let the default answer the follow-up
    /// request that carries the tool result ([`Received::tool_results`]).
    ToolCall {
        name: String,
        arguments: Value,
        text: Option<String>,
    },
    /// A streamed [`Behavior::ToolCall`] cut after its first `events` events (the
    /// connection aborted): a tool call in progress when the stream breaks, if
    /// `events` ends inside it. Unary calls get the whole tool call; Bedrock does not
    /// know it.
    BrokenToolCall {
        name: String,
        arguments: Value,
        text: Option<String>,
        events: usize,
    },
    /// 200 `text/event-stream` whose content is [`stream_pieces`]`(name, chunks)`, one
    /// event per body chunk, `interval` between events (none before the first).
    Stream { chunks: usize, interval: Duration },
    /// Arbitrary status; `body` defaults to [`error_body`] for the status (JSON), a
    /// given body is sent as is (`application/json` when it parses as JSON).
    Status {
        status: u16,
        body: Option<String>,
        retry_after: Option<String>,
    },
    /// 429 with `retry-after: <secs>` and a rate-limit error body.
    RateLimited { retry_after_secs: u64 },
    /// 429 as Azure OpenAI sends it: `header` (`retry-after-ms` or
    /// `x-ms-retry-after-ms`) set to `ms`, and `retry-after` to `secs` (Azure rounds
    /// up; a test may set it apart to see which one is read).
    RateLimitedMs {
        ms: u64,
        header: &'static str,
        secs: u64,
    },
    /// 400 with Azure OpenAI's content-filter error: `code: "content_filter"`, the
    /// prompt's filter results in `innererror` (see [`azure_content_filter_error`]).
    ContentFilter,
    /// 200 whose answer was cut by the output filter: `finish_reason:
    /// "content_filter"` (unary, or the stream's finish chunk) after [`answer_text`].
    FilteredAnswer,
    /// The given 5xx (or any) status with the flavor's error body for it.
    ServerError(u16),
    /// Never answers. When the client goes away the handler is dropped and
    /// [`SimProvider::cancelled`] counts it.
    Hang,
    /// Waits (tokio timer), then behaves.
    Delay(Duration, Box<Behavior>),
    /// Closes the connection without any response: a transport error for the client.
    Reset,
    /// 200 stream that sends its first `chunks` events, then nothing, forever, without
    /// closing.
    StallMidStream { chunks: usize },
    /// 200 stream that sends its first `chunks` events, then aborts the connection.
    BreakMidStream { chunks: usize },
    /// 400 context-length overflow in the given provider's wording.
    ContextLength(ContextWording),
    /// 200 `text/event-stream` whose first (and only) event is an overload error
    /// (Responses API: the `error` event, then `response.failed`).
    StreamErrorFirst,
    /// 200 stream: the first `events` events of the answer, then bytes without an
    /// event boundary (`data: {"x":"yyyy…`), 64 KiB a chunk, until the client goes
    /// or [`ENDLESS_LINE_BYTES`] were sent (then the stream ends): far past any event
    /// limit, so that a proxy without one fails a test instead of exhausting memory.
    EndlessLine { events: usize },
    /// 200 `text/event-stream` with an empty body.
    EmptyStream,
    /// 200 stream holding only events without content (OpenAI: the role-only chunk
    /// and `[DONE]`; Anthropic: `message_start`, empty `content_block_start`, `ping`;
    /// both: an SSE comment).
    StreamWithoutContent,
    /// 200 stream whose events without content are followed by an in-band overload
    /// error (Anthropic: `message_start` then `event: error` `overloaded_error`;
    /// Responses API: `response.created` ... `response.content_part.added`, then the
    /// `error` event `server_error` and `response.failed`).
    OpeningThenError,
    /// 200 stream: the events without content of [`Behavior::StreamWithoutContent`]
    /// (without `[DONE]`), then this SSE event verbatim (an in-band error of one's
    /// choosing, e.g. [`anthropic_sse`]`("error", &`[`anthropic_error`]`(..))`).
    OpeningThen(String),
    /// 200 stream: the answer's first `chunks` events (content among them, so a
    /// proxy commits), then this SSE event verbatim (an in-band error after commit),
    /// then the end.
    StreamThen { chunks: usize, event: String },
    /// 200 `application/json` whose body the client cannot use.
    Unusable(Unusable),
    /// 200 `application/json`: a well-formed answer of at least `bytes` bytes (its
    /// text is that long), produced 64 KiB a chunk as it is sent.
    HugeBody { bytes: usize },
    /// [`Behavior::HugeBody`] that waits `pause` (tokio timer) before its last chunk,
    /// the answer's closing JSON: the proxy holds all but that tail meanwhile.
    HugeBodyPaused { bytes: usize, pause: Duration },
    /// 429 with this `Retry-After` value, verbatim (e.g. a number no clock can add).
    RateLimitedRaw(String),
    /// 200 with [`Behavior::Answer`]'s answer (unary, or the stream's events as one
    /// body) in `content-encoding: gzip`, as a provider does for a client that did not
    /// say which codings it takes: unless the request's `accept-encoding` leaves gzip
    /// out (`identity`), then plainly. With `always`, gzip whatever was asked.
    Gzip { always: bool },
    /// 200 with the answer's headers (JSON, or an event stream when asked for one),
    /// then not one byte of body, forever, without closing.
    HeadersThenStall,
    /// 200 with [`Behavior::Answer`]'s answer (unary, or the stream's events), sent
    /// one byte every `every`.
    SlowDrip { every: Duration },
    /// 200 with the first `after` bytes of [`Behavior::Answer`]'s answer (unary, or
    /// the stream's events), then the connection aborted.
    ResetMidBody { after: usize },
    /// 200 stream of `text` (default [`answer_text`]), one word per content event as
    /// [`Behavior::Answer`] streams it, that fails after its first `content` content
    /// events (the opening's events without content are sent first and not counted):
    /// [`StreamFault::Cut`] aborts the connection, [`StreamFault::Stall`] sends
    /// nothing more, ever, [`StreamFault::Error`] sends the flavor's in-band overload
    /// error and ends. Continuing a prefill (see [`Received::prefill`]), `text` is
    /// what is left of it after the prefill, as for [`Behavior::Answer`].
    FailAfter {
        text: Option<String>,
        content: usize,
        fault: StreamFault,
    },
    /// A slow first token: 200 stream (when the request asks for one) whose opening
    /// events without content are sent at once, then, after this long, the answer's
    /// content as [`Behavior::Answer`] streams it; a unary request gets its answer
    /// after this long. A client that leaves meanwhile is counted by
    /// [`SimProvider::cancelled`] and timed by [`SimProvider::cancelled_at`]. (Not
    /// Bedrock's streams.)
    FirstTokenAfter(Duration),
    /// 200 stream of [`Behavior::Answer`]'s answer whose content ends (OpenAI: the
    /// `finish_reason` chunk; Anthropic: `content_block_stop`) at once, and whose
    /// usage follows after this long (OpenAI: the usage chunk, asked for or not, then
    /// `[DONE]`; Anthropic: `message_delta`, `message_stop`): what a client that
    /// leaves after the last content chunk walks away from. A client that leaves
    /// during the wait is counted by [`SimProvider::cancelled`]. (OpenAI and
    /// Anthropic flavors; others stream as [`Behavior::Answer`].)
    UsageAfter(Duration),
    /// Each request takes the next behaviour of the list, round and round: a default
    /// of `Cycle(vec![ServerError(503), Answer])` is a provider that fails every other
    /// request. An empty list answers.
    Cycle(Vec<Behavior>),
    /// A recorded answer, replayed: `unary` as the 200 body of a unary request, or,
    /// when the request streams, `events` in the flavor's framing: SSE `data:` lines
    /// (named `event: <type>` after each event's `type` for Anthropic), or for
    /// Bedrock one event-stream frame per event, its `:event-type` the event's one key
    /// (`{"contentBlockDelta": {...}}`). Tests write them after the providers' real
    /// shapes: thinking blocks, thought parts, reasoning content, JSON answers.
    Replay { unary: Value, events: Vec<Value> },
}

/// How a [`Behavior::FailAfter`] stream fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamFault {
    /// The connection is aborted: a transport error for the client.
    Cut,
    /// Nothing more is sent, and the connection stays open.
    Stall,
    /// An in-band error event (overloaded), then the end of the stream.
    Error,
}

/// Kinds of 200 body that are not the API's JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unusable {
    /// The answer cut in the middle.
    Truncated,
    /// An HTML page (a captive portal, a load balancer's error page).
    Html,
    /// Text that is not JSON at all.
    NotJson,
}

impl Behavior {
    /// `Delay(after, Box::new(self))`, for readable scripts.
    pub fn after(self, after: Duration) -> Behavior {
        Behavior::Delay(after, Box::new(self))
    }

    /// [`Behavior::FailAfter`] of the default answer.
    pub fn fail_after(content: usize, fault: StreamFault) -> Behavior {
        Behavior::FailAfter {
            text: None,
            content,
            fault,
        }
    }

    /// [`Behavior::ToolCall`] without any text before the call.
    pub fn tool_call(name: impl Into<String>, arguments: Value) -> Behavior {
        Behavior::ToolCall {
            name: name.into(),
            arguments,
            text: None,
        }
    }
}

/// A tool call found in a request's conversation history (an assistant turn), in
/// either wire format: OpenAI `tool_calls[]` (arguments parsed from their JSON
/// string; kept as a string if they do not parse) or an Anthropic `tool_use` block.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolUse {
    pub id: String,
    pub name: String,
    pub arguments: Value,
}

/// A tool result sent back to the model, in either wire format: an OpenAI `tool`
/// message (`tool_call_id`, `content`) or an Anthropic `tool_result` block
/// (`tool_use_id`, `content`).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolResult {
    /// `tool_call_id` / `tool_use_id`: the id of the call this answers.
    pub id: String,
    /// The content as sent: a string or a list of parts / blocks (absent: `null`).
    pub content: Value,
    /// Anthropic's `is_error`, when present.
    pub is_error: Option<bool>,
}

impl ToolResult {
    /// The content's text: the string itself, or the `text` of every part joined.
    pub fn text(&self) -> String {
        match &self.content {
            Value::String(s) => s.clone(),
            Value::Array(parts) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect(),
            _ => String::new(),
        }
    }
}

/// One request as the simulator received it.
#[derive(Clone, Debug)]
pub struct Received {
    pub method: Method,
    /// Path and query, as sent (e.g. `/v1/chat/completions`).
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The body parsed as JSON, when it is JSON.
    pub json: Option<Value>,
    /// The client's address: requests on one reused connection share it.
    pub peer: SocketAddr,
    /// `HTTP/1.1` or `HTTP/2.0`.
    pub version: axum::http::Version,
}

impl Received {
    /// The `model` field of the JSON body, if any.
    pub fn model(&self) -> Option<&str> {
        self.json.as_ref()?.get("model")?.as_str()
    }

    /// A header's value as text, if present and visible ASCII.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name)?.to_str().ok()
    }

    /// The API key the request presented, in whichever header its API carries it
    /// (`Authorization: Bearer`, `x-api-key`, `api-key`, `x-goog-api-key`).
    pub fn key(&self) -> Option<&str> {
        presented_key(&self.headers)
    }

    /// `messages` of the JSON body (empty when absent).
    fn messages(&self) -> &[Value] {
        self.json
            .as_ref()
            .and_then(|j| j.get("messages"))
            .and_then(Value::as_array)
            .map_or(&[], Vec::as_slice)
    }

    /// The answer the request asks the model to continue: the text of its final
    /// message when that is the assistant's (a prefill), in any wire format (a
    /// string, or the `text` of its parts or blocks joined). Whether the provider
    /// continues it or starts a new answer is its own rule (see the flavors).
    pub fn prefill(&self) -> Option<String> {
        prefill_of(self.json.as_ref()?)
    }

    /// Names of the tools the request declares, in order, in either wire format
    /// (`tools[].function.name` or `tools[].name`).
    pub fn tool_names(&self) -> Vec<String> {
        let Some(tools) = self
            .json
            .as_ref()
            .and_then(|j| j.get("tools"))
            .and_then(Value::as_array)
        else {
            return Vec::new();
        };
        tools
            .iter()
            .filter_map(|t| {
                t.pointer("/function/name")
                    .or_else(|| t.get("name"))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .collect()
    }

    /// Tool calls in the conversation history (assistant turns), in order.
    pub fn tool_uses(&self) -> Vec<ToolUse> {
        let mut out = Vec::new();
        let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("").to_owned();
        for m in self.messages() {
            if m.get("role").and_then(Value::as_str) != Some("assistant") {
                continue;
            }
            for call in m
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let raw = text(call.pointer("/function/arguments"));
                out.push(ToolUse {
                    id: text(call.get("id")),
                    name: text(call.pointer("/function/name")),
                    arguments: serde_json::from_str(&raw).unwrap_or(Value::String(raw)),
                });
            }
            for block in m
                .get("content")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if block.get("type").and_then(Value::as_str) == Some("tool_use") {
                    out.push(ToolUse {
                        id: text(block.get("id")),
                        name: text(block.get("name")),
                        arguments: block.get("input").cloned().unwrap_or(Value::Null),
                    });
                }
            }
        }
        out
    }

    /// Tool results the request sends back to the model, in order.
    pub fn tool_results(&self) -> Vec<ToolResult> {
        let mut out = Vec::new();
        for m in self.messages() {
            match m.get("role").and_then(Value::as_str) {
                Some("tool") => out.push(ToolResult {
                    id: m
                        .get("tool_call_id")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned(),
                    content: m.get("content").cloned().unwrap_or(Value::Null),
                    is_error: None,
                }),
                Some("user") => {
                    let blocks = m.get("content").and_then(Value::as_array);
                    for block in blocks.into_iter().flatten() {
                        if block.get("type").and_then(Value::as_str) == Some("tool_result") {
                            out.push(ToolResult {
                                id: block
                                    .get("tool_use_id")
                                    .and_then(Value::as_str)
                                    .unwrap_or("")
                                    .to_owned(),
                                content: block.get("content").cloned().unwrap_or(Value::Null),
                                is_error: block.get("is_error").and_then(Value::as_bool),
                            });
                        }
                    }
                }
                _ => {}
            }
        }
        out
    }
}

/// The final assistant message's text of a chat, messages or Converse body.
fn prefill_of(json: &Value) -> Option<String> {
    let last = json.get("messages")?.as_array()?.last()?;
    if last.get("role").and_then(Value::as_str) != Some("assistant") {
        return None;
    }
    match last.get("content")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => Some(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect(),
        ),
        _ => None,
    }
}

/// What a provider of `flavor` makes of a final assistant message on `endpoint`: the
/// text it continues, or the refusal (status, body) it answers. Anthropic (Claude on
/// Vertex too) continues any prefill but refuses one ending in whitespace; Bedrock's
/// Converse likewise (its refusal is made by the caller); an OpenAI-compatible server
/// continues only when asked with `continue_final_message: true` (vLLM's convention)
/// and refuses that with `add_generation_prompt` left at its default, `true`; without
/// it, a prefill is just history and a new answer starts.
fn continuation(
    flavor: Flavor,
    endpoint: Endpoint,
    json: Option<&Value>,
) -> (Option<String>, Option<(u16, Value)>) {
    let Some(json) = json else {
        return (None, None);
    };
    let Some(prefill) = prefill_of(json) else {
        return (None, None);
    };
    let flag = |k: &str| json.get(k).and_then(Value::as_bool);
    match (flavor, endpoint) {
        (Flavor::Anthropic, Endpoint::Messages) | (Flavor::Bedrock, Endpoint::Converse) => {
            if prefill.ends_with(char::is_whitespace) {
                let refusal = anthropic_error("invalid_request_error", TRAILING_WHITESPACE);
                return (None, Some((400, refusal)));
            }
            (Some(prefill), None)
        }
        (Flavor::OpenAi, Endpoint::Chat) if flag("continue_final_message") == Some(true) => {
            if flag("add_generation_prompt") != Some(false) {
                let refusal =
                    openai_error(CONTINUE_WITH_GENERATION_PROMPT, "BadRequestError", None);
                return (None, Some((400, refusal)));
            }
            (Some(prefill), None)
        }
        _ => (None, None),
    }
}

/// What is left of `text` to say after `prefill`, when `text` starts with it; all of
/// `text` otherwise (a model continues with something; a test comparing the whole
/// answer sees the repetition).
fn rest_after(text: &str, prefill: Option<&str>) -> String {
    match prefill {
        Some(p) if text.starts_with(p) => text[p.len()..].to_owned(),
        _ => text.to_owned(),
    }
}

/// Handle to a running simulated provider. Clones share the server; it stops when the
/// last clone is dropped or on [`SimProvider::shutdown`].
#[derive(Clone)]
pub struct SimProvider {
    inner: Arc<Inner>,
}

struct Inner {
    state: Arc<State>,
    addr: SocketAddr,
    server: AbortHandle,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Aborting the accept loop drops its JoinSet, which aborts every connection.
        self.server.abort();
    }
}

struct State {
    name: String,
    flavor: Flavor,
    /// Vertex flavor: its token endpoint.
    vertex: Option<vertex::VertexState>,
    /// Azure flavor: the deployments that exist.
    deployments: Mutex<Vec<String>>,
    queue: Mutex<VecDeque<Behavior>>,
    default: Mutex<Behavior>,
    /// Behaviours of requests presenting a given key, before the queue.
    by_key: Mutex<Vec<(String, Behavior)>>,
    received: Mutex<Vec<Received>>,
    recording: AtomicBool,
    /// Position in a [`Behavior::Cycle`].
    cycle: AtomicUsize,
    // Counters live in watch channels so tests can await them instead of polling,
    // which also keeps them deterministic under a paused clock.
    hits: watch::Sender<usize>,
    cancelled: watch::Sender<usize>,
    /// When each cancellation happened (tokio's clock: paused in tests).
    cancelled_at: Mutex<Vec<tokio::time::Instant>>,
}

// A poisoned lock only means another test thread panicked; the data is still usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl fmt::Debug for SimProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimProvider")
            .field("name", &self.inner.state.name)
            .field("flavor", &self.inner.state.flavor)
            .field("addr", &self.inner.addr)
            .finish()
    }
}

impl SimProvider {
    /// Starts a provider named `"sim"`.
    pub async fn start(flavor: Flavor) -> SimProvider {
        Self::start_named("sim", flavor).await
    }

    /// Starts a provider whose answers say `name` (see [`answer_text`]).
    ///
    /// Panics when no loopback port can be bound: this is test support.
    pub async fn start_named(name: impl Into<String>, flavor: Flavor) -> SimProvider {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("sim: bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("sim: local_addr");
        let state = Arc::new(State {
            name: name.into(),
            flavor,
            vertex: (flavor == Flavor::Vertex).then(|| vertex::VertexState::new(addr)),
            deployments: Mutex::new(AZURE_DEPLOYMENTS.map(String::from).to_vec()),
            queue: Mutex::new(VecDeque::new()),
            default: Mutex::new(Behavior::Answer),
            by_key: Mutex::new(Vec::new()),
            received: Mutex::new(Vec::new()),
            recording: AtomicBool::new(true),
            cycle: AtomicUsize::new(0),
            hits: watch::Sender::new(0),
            cancelled: watch::Sender::new(0),
            cancelled_at: Mutex::new(Vec::new()),
        });
        let server = tokio::spawn(serve(listener, state.clone())).abort_handle();
        SimProvider {
            inner: Arc::new(Inner {
                state,
                addr,
                server,
            }),
        }
    }

    pub fn name(&self) -> &str {
        &self.inner.state.name
    }

    pub fn flavor(&self) -> Flavor {
        self.inner.state.flavor
    }

    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// `http://127.0.0.1:PORT/v1`, the form a provider base URL takes; for the Azure
    /// flavor `http://127.0.0.1:PORT/openai` (a resource's
    /// `https://RESOURCE.openai.azure.com/openai`).
    pub fn base_url(&self) -> String {
        match self.flavor() {
            Flavor::Azure => format!("http://{}/openai", self.inner.addr),
            Flavor::Gemini => format!("http://{}/v1beta", self.inner.addr),
            Flavor::Bedrock => format!("http://{}", self.inner.addr),
            // Vertex AI's `https://{location}-aiplatform.googleapis.com/v1`.
            _ => format!("http://{}/v1", self.inner.addr),
        }
    }

    /// Full URL of the flavor's generation endpoint (`/v1/chat/completions` or
    /// `/v1/messages`; Azure: the v1 API's chat completions).
    pub fn endpoint(&self) -> String {
        match self.flavor() {
            Flavor::OpenAi => format!("{}/chat/completions", self.base_url()),
            Flavor::Anthropic => format!("{}/messages", self.base_url()),
            Flavor::Azure => format!("{}/v1/chat/completions", self.base_url()),
            Flavor::Gemini => format!(
                "{}/models/gemini-2.5-flash:generateContent",
                self.base_url()
            ),
            Flavor::Vertex => format!(
                "{}/projects/{VERTEX_PROJECT}/locations/{VERTEX_LOCATION}/publishers/google/models/gemini-2.5-flash:generateContent",
                self.base_url()
            ),
            Flavor::Bedrock => format!(
                "{}/model/anthropic.claude-sonnet-4-v1%3A0/converse",
                self.base_url()
            ),
        }
    }

    fn vertex(&self) -> &vertex::VertexState {
        self.inner
            .state
            .vertex
            .as_ref()
            .expect("sim: a Vertex flavor simulator")
    }

    /// Vertex flavor: a service-account JSON key file whose `token_uri` is this
    /// simulator's token endpoint and whose key it verifies JWTs against.
    pub fn service_account_json(&self) -> String {
        self.vertex().service_account_json()
    }

    /// Vertex flavor: `http://127.0.0.1:PORT/token`.
    pub fn token_uri(&self) -> String {
        self.vertex().token_uri().to_owned()
    }

    /// Vertex flavor: queues what the token endpoint does with the next valid grant.
    pub fn push_token(&self, b: TokenBehavior) {
        self.vertex().push(b);
    }

    /// Vertex flavor: what the token endpoint does when its queue is empty
    /// (initially [`TokenBehavior::Issue`]).
    pub fn set_token_default(&self, b: TokenBehavior) {
        self.vertex().set_default(b);
    }

    /// Vertex flavor: `expires_in` of the tokens issued from now on (seconds).
    pub fn set_token_lifetime(&self, secs: u64) {
        self.vertex().set_lifetime(secs);
    }

    /// Vertex flavor: requests to the token endpoint so far (not counted as hits).
    pub fn token_requests(&self) -> usize {
        self.vertex().requests()
    }

    /// Vertex flavor: every access token issued so far.
    pub fn issued_tokens(&self) -> Vec<String> {
        self.vertex().issued()
    }

    /// Azure flavor: the deployments that exist from now on (others get 404
    /// `DeploymentNotFound`).
    pub fn set_deployments(&self, names: &[&str]) {
        *lock(&self.inner.state.deployments) = names.iter().map(|n| n.to_string()).collect();
    }

    /// Queues a behaviour for the next request that finds the queue non-empty.
    pub fn push(&self, b: Behavior) {
        lock(&self.inner.state.queue).push_back(b);
    }

    /// Behaviour for requests that find the queue empty (initially [`Behavior::Answer`]).
    pub fn set_default(&self, b: Behavior) {
        *lock(&self.inner.state.default) = b;
    }

    /// Every request presenting `key` behaves as `b` from now on, queue or not;
    /// `None` takes the key's own behaviour away.
    pub fn set_key_behavior(&self, key: &str, b: Option<Behavior>) {
        let mut by_key = lock(&self.inner.state.by_key);
        by_key.retain(|(k, _)| k != key);
        if let Some(b) = b {
            by_key.push((key.to_owned(), b));
        }
    }

    /// Queued behaviours not consumed yet.
    pub fn queued(&self) -> usize {
        lock(&self.inner.state.queue).len()
    }

    /// Requests received so far, in arrival order (empty while recording is off).
    pub fn received(&self) -> Vec<Received> {
        lock(&self.inner.state.received).clone()
    }

    /// Returns and forgets the recorded requests.
    pub fn take_received(&self) -> Vec<Received> {
        std::mem::take(&mut *lock(&self.inner.state.received))
    }

    /// Turns request recording on or off (on by default); benchmarks turn it off so
    /// memory stays flat. [`SimProvider::hits`] counts either way.
    pub fn set_recording(&self, on: bool) {
        self.inner.state.recording.store(on, Ordering::Relaxed);
    }

    /// Requests received so far.
    pub fn hits(&self) -> usize {
        *self.inner.state.hits.borrow()
    }

    /// Requests abandoned by the client before the simulator finished answering: the
    /// handler was dropped (e.g. [`Behavior::Hang`], a pending [`Behavior::Delay`]) or
    /// a stream body was dropped before its end (e.g. [`Behavior::StallMidStream`]).
    pub fn cancelled(&self) -> usize {
        *self.inner.state.cancelled.borrow()
    }

    /// When each request counted by [`SimProvider::cancelled`] was abandoned (tokio's
    /// clock), in order.
    pub fn cancelled_at(&self) -> Vec<tokio::time::Instant> {
        lock(&self.inner.state.cancelled_at).clone()
    }

    /// Waits until at least `n` requests have arrived. Wrap in a timeout.
    pub async fn wait_hits(&self, n: usize) {
        wait_at_least(&self.inner.state.hits, n).await;
    }

    /// Waits until at least `n` requests were abandoned by their client. Wrap in a
    /// timeout.
    pub async fn wait_cancelled(&self, n: usize) {
        wait_at_least(&self.inner.state.cancelled, n).await;
    }

    /// Stops serving now: open connections are dropped and new ones refused, so the
    /// provider looks down (connection refused). Other clones see the same.
    pub fn shutdown(&self) {
        self.inner.server.abort();
    }
}

async fn wait_at_least(counter: &watch::Sender<usize>, n: usize) {
    let mut rx = counter.subscribe();
    // The sender lives as long as `counter`, which the caller borrows: never closed.
    let _ = rx.wait_for(|v| *v >= n).await;
}

/// Accept loop. Connections run in a JoinSet owned by this task, so aborting the task
/// ends every connection with it.
async fn serve(listener: TcpListener, state: Arc<State>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((tcp, peer)) = accepted else {
                    // Out of file descriptors and the like: back off rather than spin.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let _ = tcp.set_nodelay(true);
                let state = state.clone();
                conns.spawn(async move {
                    let svc = hyper::service::service_fn(move |req| handle(state.clone(), peer, req));
                    // HTTP/1.1, and h2c for prior-knowledge clients. Errors are expected
                    // (Reset, BreakMidStream, clients going away) and carry no information.
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
            // Reap finished connections so the set does not grow over a benchmark.
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// The API key in `headers`, in whichever header an API carries it.
fn presented_key(headers: &HeaderMap) -> Option<&str> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    text("authorization")
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| text("x-api-key"))
        .or_else(|| text("api-key"))
        .or_else(|| text("x-goog-api-key"))
}

/// Returned by the service to make hyper close the connection without a response.
#[derive(Debug)]
struct ResetConnection;

impl fmt::Display for ResetConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("simulated connection reset")
    }
}

impl std::error::Error for ResetConnection {}

/// Counts a request as cancelled if dropped before [`CancelGuard::finish`].
struct CancelGuard {
    state: Option<Arc<State>>,
}

impl CancelGuard {
    fn finish(mut self) {
        self.state = None;
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if let Some(state) = self.state.take() {
            lock(&state.cancelled_at).push(tokio::time::Instant::now());
            state.cancelled.send_modify(|n| *n += 1);
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Endpoint {
    Chat,
    Messages,
    /// Gemini's `generateContent` / `streamGenerateContent`.
    Generate,
    /// Bedrock's `converse` / `converse-stream`.
    Converse,
    Embeddings,
    /// The OpenAI Responses API.
    Responses,
    Models,
    Unknown,
}

/// What the renderers need to know about the request.
struct Ctx {
    /// How answers are rendered (Vertex: its publisher's flavor).
    flavor: Flavor,
    /// Whose error bodies failing behaviours answer with (Vertex: its own).
    errors: Flavor,
    name: String,
    endpoint: Endpoint,
    model: String,
    stream: bool,
    include_usage: bool,
    inputs: usize,
    request_id: String,
    /// The request takes gzip: its `accept-encoding` is absent (any coding) or names
    /// gzip or `*`.
    takes_gzip: bool,
    /// The answer this request asks to continue, when the provider continues it (see
    /// `continuation`): answers say what is left after it, under another id.
    prefill: Option<String>,
}

async fn handle(
    state: Arc<State>,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Result<Response<Body>, ResetConnection> {
    let (parts, body) = req.into_parts();
    // The whole body is read before anything else: recording it is the point. A client
    // that goes away mid-body never arrived.
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Err(ResetConnection),
    };
    let json: Option<Value> = serde_json::from_slice(&body).ok();
    let path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_owned(), |pq| pq.as_str().to_owned());
    let mut flavor = state.flavor;
    if let Some(v) = &state.vertex
        && parts.uri.path() == "/token"
    {
        // The token endpoint: counted apart, no behaviour taken.
        return Ok(v.token(&parts.method, &parts.headers, &body).await);
    }
    // Gemini, Vertex and Bedrock name the model and whether to stream in the path.
    let mut from_path = None;
    let mut bedrock_refusal = None;
    let (endpoint, refusal) = if flavor == Flavor::Azure {
        azure_route(&state, &parts, json.as_ref())
    } else if let Some(v) = &state.vertex {
        let r = vertex::route(v, &parts, json.as_ref());
        from_path = Some((r.model, r.stream));
        // Answers render as the publisher's API does.
        flavor = r.render;
        (r.endpoint, r.refusal)
    } else if flavor == Flavor::Gemini {
        let (endpoint, model, stream, refusal) = gemini::route(&parts, json.as_ref());
        from_path = Some((model, stream));
        (endpoint, refusal)
    } else if flavor == Flavor::Bedrock {
        let (endpoint, model, stream, refusal) = bedrock::route(&parts, &body, json.as_ref());
        from_path = Some((model, stream));
        bedrock_refusal = refusal;
        (endpoint, None)
    } else {
        let endpoint = match (flavor, &parts.method, parts.uri.path()) {
            (Flavor::OpenAi, &Method::POST, "/v1/chat/completions") => Endpoint::Chat,
            (Flavor::OpenAi, &Method::POST, "/v1/embeddings") => Endpoint::Embeddings,
            (Flavor::OpenAi, &Method::POST, "/v1/responses") => Endpoint::Responses,
            (Flavor::Anthropic, &Method::POST, "/v1/messages") => Endpoint::Messages,
            (_, &Method::GET, "/v1/models") => Endpoint::Models,
            _ => Endpoint::Unknown,
        };
        // Strict like OpenAI: a malformed Responses request takes no behaviour.
        let refusal = (endpoint == Endpoint::Responses)
            .then(|| responses::refusal(json.as_ref(), |m| RESPONSES_MODELS.contains(&m)))
            .flatten();
        (endpoint, refusal)
    };
    let field = |k: &str| json.as_ref().and_then(|j| j.get(k));
    let inputs = match field("input") {
        // A list of strings (or of token lists) is several inputs; a list of token ids
        // is one.
        Some(Value::Array(items)) if items.iter().all(|i| !i.is_number()) => items.len(),
        _ => 1,
    };
    let mut ctx = Ctx {
        flavor,
        errors: state.flavor,
        name: state.name.clone(),
        endpoint,
        model: field("model")
            .and_then(Value::as_str)
            .unwrap_or(DEFAULT_MODEL)
            .to_owned(),
        stream: field("stream").and_then(Value::as_bool).unwrap_or(false),
        include_usage: field("stream_options")
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool)
            .unwrap_or(false),
        inputs,
        request_id: String::new(),
        takes_gzip: parts
            .headers
            .get(header::ACCEPT_ENCODING)
            .and_then(|v| v.to_str().ok())
            .is_none_or(|v| v.contains("gzip") || v.contains('*')),
        prefill: None,
    };
    let (prefill, prefill_refusal) = continuation(flavor, endpoint, json.as_ref());
    ctx.prefill = prefill;
    let (refusal, bedrock_refusal) = match prefill_refusal {
        Some(_) if bedrock_refusal.is_some() || refusal.is_some() => (refusal, bedrock_refusal),
        Some(_) if flavor == Flavor::Bedrock => (
            None,
            Some((
                400,
                "ValidationException",
                BEDROCK_TRAILING_WHITESPACE.to_string(),
            )),
        ),
        Some(r) => (Some(r), None),
        None => (refusal, bedrock_refusal),
    };

    if let Some((model, stream)) = from_path {
        ctx.model = model;
        ctx.stream = stream;
    }

    // Arrival: record, count, and take this request's behaviour, all before it runs.
    // A request the strict Azure flavor refuses takes none.
    let own = presented_key(&parts.headers).and_then(|k| {
        lock(&state.by_key)
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, b)| b.clone())
    });
    let behavior = if refusal.is_some() || bedrock_refusal.is_some() {
        Behavior::Answer
    } else if let Some(b) = own {
        b
    } else {
        let mut queue = lock(&state.queue);
        queue
            .pop_front()
            .unwrap_or_else(|| lock(&state.default).clone())
    };
    let behavior = match behavior {
        Behavior::Cycle(list) if !list.is_empty() => {
            list[state.cycle.fetch_add(1, Ordering::Relaxed) % list.len()].clone()
        }
        other => other,
    };
    if state.recording.load(Ordering::Relaxed) {
        lock(&state.received).push(Received {
            peer,
            version: parts.version,
            method: parts.method,
            path,
            headers: parts.headers,
            body,
            json,
        });
    }
    let mut index = 0;
    state.hits.send_modify(|n| {
        *n += 1;
        index = *n;
    });
    ctx.request_id = format!("req_sim_{index}");

    if let Some((status, body)) = refusal {
        return Ok(json_response(&ctx, status, &body));
    }
    if let Some(r) = &bedrock_refusal {
        return Ok(bedrock::error_response(&ctx, r));
    }
    let guard = CancelGuard { state: Some(state) };
    if flavor == Flavor::Bedrock {
        return bedrock::respond(&ctx, behavior, guard).await;
    }
    respond(&ctx, behavior, guard).await
}

/// Azure flavor: which endpoint a request is for, and the refusal (status, body) the
/// real service would answer it with, if any. See [`Flavor::Azure`].
fn azure_route(
    state: &State,
    parts: &axum::http::request::Parts,
    json: Option<&Value>,
) -> (Endpoint, Option<(u16, Value)>) {
    let not_found = || {
        (
            404,
            json!({"error": {"code": "404", "message": "Resource not found"}}),
        )
    };
    let path = parts.uri.path();
    let api_version = parts.uri.query().and_then(|q| {
        q.split('&')
            .find_map(|kv| kv.strip_prefix("api-version="))
            .map(str::to_owned)
    });
    let post = parts.method == Method::POST;
    let (endpoint, deployment) = if let Some(rest) = path.strip_prefix("/openai/deployments/") {
        let Some((deployment, op)) = rest.split_once('/') else {
            return (Endpoint::Unknown, Some(not_found()));
        };
        let endpoint = match (post, op) {
            (true, "chat/completions") => Endpoint::Chat,
            (true, "embeddings") => Endpoint::Embeddings,
            _ => return (Endpoint::Unknown, Some(not_found())),
        };
        if !api_version
            .as_deref()
            .is_some_and(|v| AZURE_API_VERSIONS.contains(&v))
        {
            return (endpoint, Some(not_found()));
        }
        (endpoint, Some(percent_decode(deployment)))
    } else {
        let endpoint = match (post, path) {
            (true, "/openai/v1/chat/completions") => Endpoint::Chat,
            (true, "/openai/v1/embeddings") => Endpoint::Embeddings,
            (true, "/openai/v1/responses") => Endpoint::Responses,
            (false, "/openai/v1/models") => Endpoint::Models,
            _ => return (Endpoint::Unknown, Some(not_found())),
        };
        let model = json
            .and_then(|j| j.get("model"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        (
            endpoint,
            model.or_else(|| (endpoint == Endpoint::Models).then(String::new)),
        )
    };
    let key = parts.headers.get("api-key").and_then(|v| v.to_str().ok());
    if key.is_none_or(str::is_empty) {
        let body = if parts.headers.contains_key(header::AUTHORIZATION) {
            azure_error(
                "401",
                "Unauthorized. Access token is missing, invalid, audience is incorrect (https://cognitiveservices.azure.com), or have expired.",
            )
        } else {
            azure_error(
                "401",
                "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key for an active subscription and use a correct regional API endpoint for your resource.",
            )
        };
        return (endpoint, Some((401, body)));
    }
    if endpoint == Endpoint::Models {
        return (endpoint, None);
    }
    let known = deployment
        .as_deref()
        .is_some_and(|d| lock(&state.deployments).iter().any(|k| k == d));
    if !known {
        return (
            endpoint,
            Some((
                404,
                azure_error(
                    "DeploymentNotFound",
                    "The API deployment for this resource does not exist. If you created the deployment within the last 5 minutes, please wait a moment and try again.",
                ),
            )),
        );
    }
    if endpoint == Endpoint::Responses {
        // The deployment exists; the body must still be a Responses request.
        return (endpoint, responses::refusal(json, |_| true));
    }
    (endpoint, None)
}

/// `%XX` escapes decoded (a deployment name as it was sent in a path segment).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Some(v) = std::str::from_utf8(&b[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn respond(
    ctx: &Ctx,
    mut behavior: Behavior,
    guard: CancelGuard,
) -> Result<Response<Body>, ResetConnection> {
    while let Behavior::Delay(wait, next) = behavior {
        tokio::time::sleep(wait).await;
        behavior = *next;
    }
    let flavor = ctx.flavor;
    let response = match behavior {
        Behavior::Delay(..) => unreachable!("unwrapped above"),
        Behavior::Answer | Behavior::Cycle(_) => {
            let text = rest_after(&answer_text(&ctx.name), ctx.prefill.as_deref());
            answer(ctx, &text, guard)
        }
        Behavior::AnswerText(text) => {
            answer(ctx, &rest_after(&text, ctx.prefill.as_deref()), guard)
        }
        Behavior::FailAfter {
            text,
            content,
            fault,
        } => {
            let text = text.unwrap_or_else(|| answer_text(&ctx.name));
            let pieces = split_words(&rest_after(&text, ctx.prefill.as_deref()));
            let pieces = &pieces[..content.min(pieces.len())];
            let mut events = stream_events(ctx, pieces);
            events.truncate(opening_len(ctx) + pieces.len());
            let end = match fault {
                StreamFault::Cut => StreamEnd::Break,
                StreamFault::Stall => StreamEnd::Stall,
                StreamFault::Error => {
                    events.push(overloaded_event(ctx));
                    StreamEnd::Finish
                }
            };
            sse(ctx, events, Duration::ZERO, end, guard)
        }
        Behavior::ToolCall {
            name,
            arguments,
            text,
        } => tool_call(ctx, text.as_deref(), &name, &arguments, None, guard),
        Behavior::BrokenToolCall {
            name,
            arguments,
            text,
            events,
        } => tool_call(ctx, text.as_deref(), &name, &arguments, Some(events), guard),
        Behavior::Stream { chunks, interval } => {
            let events = stream_events(ctx, &stream_pieces(&ctx.name, chunks));
            sse(ctx, events, interval, StreamEnd::Finish, guard)
        }
        Behavior::FirstTokenAfter(delay)
            if ctx.stream
                && matches!(
                    ctx.endpoint,
                    Endpoint::Chat | Endpoint::Messages | Endpoint::Responses | Endpoint::Generate
                ) =>
        {
            let text = rest_after(&answer_text(&ctx.name), ctx.prefill.as_deref());
            let events = stream_events(ctx, &split_words(&text));
            first_token_after(ctx, events, delay, guard)
        }
        Behavior::UsageAfter(delay)
            if ctx.stream && matches!(ctx.endpoint, Endpoint::Chat | Endpoint::Messages) =>
        {
            let events = stream_events(ctx, &split_words(&answer_text(&ctx.name)));
            // The usage, and what follows it, come after the pause.
            let end_of_content = events
                .iter()
                .position(|e| {
                    e.contains("\"finish_reason\":\"") || e.starts_with("event: content_block_stop")
                })
                .map_or(events.len(), |i| i + 1);
            paused_at(ctx, events, end_of_content, delay, guard)
        }
        Behavior::UsageAfter(_) => answer(ctx, &answer_text(&ctx.name), guard),
        Behavior::FirstTokenAfter(delay) => {
            tokio::time::sleep(delay).await;
            let text = rest_after(&answer_text(&ctx.name), ctx.prefill.as_deref());
            answer(ctx, &text, guard)
        }
        Behavior::StallMidStream { chunks } | Behavior::BreakMidStream { chunks } => {
            let end = if matches!(behavior, Behavior::StallMidStream { .. }) {
                StreamEnd::Stall
            } else {
                StreamEnd::Break
            };
            // A stream with `chunks` deltas has more than `chunks` events, so cutting
            // it at `chunks` always leaves it unfinished.
            let mut events = stream_events(ctx, &stream_pieces(&ctx.name, chunks));
            events.truncate(chunks);
            sse(ctx, events, Duration::ZERO, end, guard)
        }
        Behavior::StreamErrorFirst if ctx.endpoint == Endpoint::Responses => {
            let events = responses_overloaded(ctx, 0);
            sse(ctx, events, Duration::ZERO, StreamEnd::Finish, guard)
        }
        Behavior::StreamErrorFirst => {
            let event = match flavor {
                Flavor::Vertex => unreachable!("{RENDERED_AS_PUBLISHER}"),
                Flavor::OpenAi | Flavor::Azure => openai_sse(&openai_error(
                    "The server is overloaded. Please try again later.",
                    "server_error",
                    None,
                )),
                Flavor::Anthropic => {
                    anthropic_sse("error", &anthropic_error("overloaded_error", "Overloaded"))
                }
                Flavor::Gemini => gemini_sse(&gemini_error_body(503)),
                Flavor::Bedrock => unreachable!("sim: bedrock answers in sim::bedrock"),
            };
            sse(ctx, vec![event], Duration::ZERO, StreamEnd::Finish, guard)
        }
        Behavior::EndlessLine { events } => endless_line(ctx, events, guard),
        Behavior::EmptyStream => sse(ctx, Vec::new(), Duration::ZERO, StreamEnd::Finish, guard),
        Behavior::StreamWithoutContent => {
            let mut events = opening_events(ctx);
            if matches!(flavor, Flavor::OpenAi | Flavor::Azure)
                && ctx.endpoint != Endpoint::Responses
            {
                events.push("data: [DONE]\n\n".into());
            }
            sse(ctx, events, Duration::ZERO, StreamEnd::Finish, guard)
        }
        Behavior::OpeningThenError if ctx.endpoint == Endpoint::Responses => {
            let mut events = opening_events(ctx);
            events.extend(responses_overloaded(ctx, events.len()));
            sse(ctx, events, Duration::ZERO, StreamEnd::Finish, guard)
        }
        Behavior::OpeningThenError => {
            let mut events = opening_events(ctx);
            events.push(match flavor {
                Flavor::Vertex => unreachable!("{RENDERED_AS_PUBLISHER}"),
                Flavor::OpenAi | Flavor::Azure => openai_sse(&openai_error(
                    "The server is overloaded. Please try again later.",
                    "server_error",
                    None,
                )),
                Flavor::Anthropic => {
                    anthropic_sse("error", &anthropic_error("overloaded_error", "Overloaded"))
                }
                Flavor::Gemini => gemini_sse(&gemini_error_body(503)),
                Flavor::Bedrock => unreachable!("sim: bedrock answers in sim::bedrock"),
            });
            sse(ctx, events, Duration::ZERO, StreamEnd::Finish, guard)
        }
        Behavior::Replay { unary, events } => {
            if !ctx.stream {
                guard.finish();
                return Ok(json_response(ctx, 200, &unary));
            }
            let events = events
                .iter()
                .map(|e| match flavor {
                    Flavor::Anthropic => anthropic_sse(e["type"].as_str().unwrap_or(""), e),
                    _ => openai_sse(e),
                })
                .collect();
            sse(ctx, events, Duration::ZERO, StreamEnd::Finish, guard)
        }
        Behavior::OpeningThen(event) => {
            let mut events = opening_events(ctx);
            events.push(event);
            sse(ctx, events, Duration::ZERO, StreamEnd::Finish, guard)
        }
        Behavior::StreamThen { chunks, event } => {
            let mut events = stream_events(ctx, &stream_pieces(&ctx.name, chunks));
            events.truncate(chunks);
            events.push(event);
            sse(ctx, events, Duration::ZERO, StreamEnd::Finish, guard)
        }
        Behavior::Unusable(kind) => {
            guard.finish();
            let whole = match flavor {
                Flavor::Vertex => unreachable!("{RENDERED_AS_PUBLISHER}"),
                _ if ctx.endpoint == Endpoint::Responses => {
                    responses::response_object(&ctx.model, Some(&answer_text(&ctx.name)))
                }
                Flavor::OpenAi => openai_completion(&ctx.model, &answer_text(&ctx.name)),
                Flavor::Azure => azure_completion(&ctx.model, &answer_text(&ctx.name), "stop"),
                Flavor::Anthropic => anthropic_message(&ctx.model, &answer_text(&ctx.name)),
                Flavor::Gemini => gemini_response(&ctx.model, &answer_text(&ctx.name), "STOP"),
                Flavor::Bedrock => unreachable!("sim: bedrock answers in sim::bedrock"),
            }
            .to_string();
            let body = match kind {
                Unusable::Truncated => whole[..whole.len() / 2].to_owned(),
                Unusable::Html => "<html><body><h1>502 Bad Gateway</h1></body></html>".into(),
                Unusable::NotJson => "OK".into(),
            };
            let mut resp = plain(ctx, 200, body, false);
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            resp
        }
        Behavior::HugeBody { bytes } => huge_body(ctx, bytes, Duration::ZERO, guard),
        Behavior::HugeBodyPaused { bytes, pause } => huge_body(ctx, bytes, pause, guard),
        Behavior::HeadersThenStall | Behavior::SlowDrip { .. } | Behavior::ResetMidBody { .. } => {
            wire_fault(ctx, behavior, guard)
        }
        Behavior::Gzip { always } => {
            let (content_type, body) = answer_body(ctx);
            guard.finish();
            let response = base_response(ctx, 200).header(header::CONTENT_TYPE, content_type);
            if always || ctx.takes_gzip {
                response
                    .header(header::CONTENT_ENCODING, "gzip")
                    .body(Body::from(gzip(body.as_bytes())))
            } else {
                response.body(Body::from(body))
            }
            .expect("sim: valid response")
        }
        Behavior::RateLimitedRaw(value) => {
            guard.finish();
            let mut resp = json_response(ctx, 429, &error_body(ctx.errors, 429));
            let value = HeaderValue::from_str(&value).expect("sim: Retry-After header value");
            resp.headers_mut().insert(header::RETRY_AFTER, value);
            resp
        }
        Behavior::Status {
            status,
            body,
            retry_after,
        } => {
            guard.finish();
            let (body, json) = match body {
                Some(b) => {
                    let is_json = serde_json::from_str::<Value>(&b).is_ok();
                    (b, is_json)
                }
                None => (error_body(ctx.errors, status).to_string(), true),
            };
            let mut resp = plain(ctx, status, body, json);
            if let Some(ra) = retry_after {
                let value = HeaderValue::from_str(&ra).expect("sim: Retry-After header value");
                resp.headers_mut().insert(header::RETRY_AFTER, value);
            }
            resp
        }
        Behavior::RateLimited { retry_after_secs } => {
            guard.finish();
            let mut resp = json_response(ctx, 429, &error_body(ctx.errors, 429));
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
            resp
        }
        Behavior::ServerError(status) => {
            guard.finish();
            json_response(ctx, status, &error_body(ctx.errors, status))
        }
        Behavior::RateLimitedMs { ms, header, secs } => {
            guard.finish();
            let mut resp = json_response(ctx, 429, &error_body(ctx.errors, 429));
            resp.headers_mut().insert(header, HeaderValue::from(ms));
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
            resp
        }
        // Gemini blocks a prompt with a 200 that holds no candidate.
        Behavior::ContentFilter if flavor == Flavor::Gemini && ctx.stream => {
            let events = vec![gemini_sse(&gemini_blocked_prompt(&ctx.model))];
            sse(ctx, events, Duration::ZERO, StreamEnd::Finish, guard)
        }
        Behavior::ContentFilter if flavor == Flavor::Gemini => {
            guard.finish();
            json_response(ctx, 200, &gemini_blocked_prompt(&ctx.model))
        }
        Behavior::ContentFilter => {
            guard.finish();
            json_response(ctx, 400, &azure_content_filter_error())
        }
        Behavior::FilteredAnswer => {
            let text = answer_text(&ctx.name);
            match ctx.endpoint {
                Endpoint::Generate if ctx.stream => {
                    let mut events = stream_events(ctx, &split_words(&text));
                    for e in &mut events {
                        *e = e.replace(r#""finishReason":"STOP""#, r#""finishReason":"SAFETY""#);
                    }
                    sse(ctx, events, Duration::ZERO, StreamEnd::Finish, guard)
                }
                Endpoint::Generate => {
                    guard.finish();
                    json_response(ctx, 200, &gemini_response(&ctx.model, &text, "SAFETY"))
                }
                Endpoint::Chat if ctx.stream => {
                    let mut events = stream_events(ctx, &split_words(&text));
                    for e in &mut events {
                        *e = e.replace(
                            r#""finish_reason":"stop""#,
                            r#""finish_reason":"content_filter""#,
                        );
                    }
                    sse(ctx, events, Duration::ZERO, StreamEnd::Finish, guard)
                }
                Endpoint::Chat => {
                    guard.finish();
                    let body = match flavor {
                        Flavor::Azure => azure_completion(&ctx.model, &text, "content_filter"),
                        _ => {
                            let mut v = openai_completion(&ctx.model, &text);
                            v["choices"][0]["finish_reason"] = json!("content_filter");
                            v
                        }
                    };
                    json_response(ctx, 200, &body)
                }
                _ => answer(ctx, &text, guard),
            }
        }
        Behavior::ContextLength(wording) => {
            guard.finish();
            json_response(ctx, 400, &context_length_error(wording))
        }
        Behavior::Hang => {
            // No timer: under a paused clock a far-future sleep would make tokio jump
            // the clock to it.
            std::future::pending::<()>().await;
            unreachable!("pending never completes")
        }
        Behavior::Reset => {
            guard.finish();
            return Err(ResetConnection);
        }
    };
    Ok(response)
}

/// How many events of [`stream_events`] come before the first content event.
fn opening_len(ctx: &Ctx) -> usize {
    match ctx.flavor {
        Flavor::Vertex => unreachable!("{RENDERED_AS_PUBLISHER}"),
        _ if ctx.endpoint == Endpoint::Responses => 4,
        Flavor::OpenAi => 1,
        Flavor::Azure => 2,
        Flavor::Anthropic => 3,
        Flavor::Gemini => 0,
        Flavor::Bedrock => unreachable!("sim: bedrock answers in sim::bedrock"),
    }
}

/// The flavor's in-band overload error, as one SSE event.
fn overloaded_event(ctx: &Ctx) -> String {
    match ctx.flavor {
        Flavor::Vertex => unreachable!("{RENDERED_AS_PUBLISHER}"),
        _ if ctx.endpoint == Endpoint::Responses => responses_overloaded(ctx, 0).concat(),
        Flavor::OpenAi | Flavor::Azure => openai_sse(&openai_error(
            "The server is overloaded. Please try again later.",
            "server_error",
            None,
        )),
        Flavor::Anthropic => {
            anthropic_sse("error", &anthropic_error("overloaded_error", "Overloaded"))
        }
        Flavor::Gemini => gemini_sse(&gemini_error_body(503)),
        Flavor::Bedrock => unreachable!("sim: bedrock answers in sim::bedrock"),
    }
}

/// The events of a stream's opening that carry no content. OpenAI: the role-only
/// chunk; Anthropic: `message_start`, the empty text `content_block_start`, `ping`;
/// an SSE comment (a keep-alive) after the first for both.
fn opening_events(ctx: &Ctx) -> Vec<String> {
    if ctx.flavor == Flavor::Gemini {
        return vec![gemini_empty_chunk(&ctx.model), ": keep-alive\n\n".into()];
    }
    let mut events = stream_events(ctx, &[]);
    events.truncate(match ctx.flavor {
        Flavor::Vertex => unreachable!("{RENDERED_AS_PUBLISHER}"),
        // Created, in progress, the empty message and its empty text part.
        _ if ctx.endpoint == Endpoint::Responses => 4,
        Flavor::OpenAi => 1,
        // The prompt's filter results, then the role chunk.
        Flavor::Azure => 2,
        Flavor::Anthropic | Flavor::Gemini => 3,
        Flavor::Bedrock => unreachable!("sim: bedrock answers in sim::bedrock"),
    });
    events.insert(1, ": keep-alive\n\n".into());
    events
}

/// A Responses API stream's overload, from event number `first` on: the `error`
/// event, then `response.failed`, as OpenAI ends such a stream.
fn responses_overloaded(ctx: &Ctx, first: usize) -> Vec<String> {
    const MESSAGE: &str = "The server is overloaded. Please try again later.";
    vec![
        responses::error_event(first, "server_error", MESSAGE),
        responses::failed_event(&ctx.model, first + 1, "server_error", MESSAGE),
    ]
}

/// How much of its line [`Behavior::EndlessLine`] sends at most: 128 MiB.
pub const ENDLESS_LINE_BYTES: usize = 128 << 20;

/// Bytes of each chunk [`Behavior::EndlessLine`] and [`Behavior::HugeBody`] send.
const FLOOD_CHUNK: usize = 64 * 1024;

/// [`Behavior::EndlessLine`]: `events` real events, then one event that never ends.
fn endless_line(ctx: &Ctx, events: usize, guard: CancelGuard) -> Response<Body> {
    let mut first = stream_events(ctx, &stream_pieces(&ctx.name, events.max(1)));
    first.truncate(events);
    let head = futures_util::stream::iter(
        first
            .into_iter()
            .map(Bytes::from)
            .chain([Bytes::from_static(b"data: {\"x\":\"")]),
    );
    let filler = Bytes::from(vec![b'y'; FLOOD_CHUNK]);
    // The guard goes with the stream: the client dropping it counts as a cancel.
    let tail = futures_util::stream::repeat_with(move || {
        let _ = &guard;
        filler.clone()
    });
    let tail = futures_util::StreamExt::take(tail, ENDLESS_LINE_BYTES / FLOOD_CHUNK);
    let body = futures_util::StreamExt::map(
        futures_util::StreamExt::chain(head, tail),
        Ok::<_, std::io::Error>,
    );
    base_response(ctx, 200)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(Body::from_stream(body))
        .expect("sim: valid response")
}

/// [`Behavior::HugeBody`]: a valid answer whose text is `bytes` long, made as sent,
/// its last chunk `pause` after the others.
fn huge_body(ctx: &Ctx, bytes: usize, pause: Duration, guard: CancelGuard) -> Response<Body> {
    guard.finish();
    let whole = match ctx.flavor {
        Flavor::Vertex => unreachable!("{RENDERED_AS_PUBLISHER}"),
        Flavor::OpenAi | Flavor::Azure => openai_completion(&ctx.model, "@@TEXT@@"),
        Flavor::Anthropic => anthropic_message(&ctx.model, "@@TEXT@@"),
        Flavor::Gemini => gemini_response(&ctx.model, "@@TEXT@@", "STOP"),
        Flavor::Bedrock => unreachable!("sim: bedrock answers in sim::bedrock"),
    }
    .to_string();
    let (before, after) = whole.split_once("@@TEXT@@").expect("sim: placeholder");
    let chunks = bytes.div_ceil(FLOOD_CHUNK);
    let filler = Bytes::from(vec![b'y'; FLOOD_CHUNK]);
    let after = Bytes::from(after.to_owned());
    let tail = futures_util::stream::once(async move {
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        after
    });
    let body = futures_util::StreamExt::map(
        futures_util::StreamExt::chain(
            futures_util::stream::iter(
                std::iter::once(Bytes::from(before.to_owned()))
                    .chain(std::iter::repeat_n(filler, chunks)),
            ),
            tail,
        ),
        Ok::<_, std::io::Error>,
    );
    base_response(ctx, 200)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(body))
        .expect("sim: valid response")
}

/// [`Behavior::Answer`]'s answer as one body: its content type and bytes (a stream's
/// events concatenated).
fn answer_body(ctx: &Ctx) -> (&'static str, String) {
    let text = answer_text(&ctx.name);
    match ctx.endpoint {
        Endpoint::Chat | Endpoint::Messages | Endpoint::Responses | Endpoint::Generate
            if ctx.stream =>
        {
            (
                "text/event-stream",
                stream_events(ctx, &split_words(&text)).concat(),
            )
        }
        Endpoint::Generate => (
            "application/json",
            gemini_response(&ctx.model, &text, "STOP").to_string(),
        ),
        Endpoint::Messages => (
            "application/json",
            anthropic_message(&ctx.model, &text).to_string(),
        ),
        Endpoint::Responses => (
            "application/json",
            responses::response_object(&ctx.model, Some(&text)).to_string(),
        ),
        _ => (
            "application/json",
            openai_completion(&ctx.model, &text).to_string(),
        ),
    }
}

/// [`Behavior::HeadersThenStall`], [`Behavior::SlowDrip`], [`Behavior::ResetMidBody`]:
/// the head at once, then the body misbehaves. The guard goes with the body, so a
/// client that gives up is counted as cancelled.
fn wire_fault(ctx: &Ctx, behavior: Behavior, guard: CancelGuard) -> Response<Body> {
    let (content_type, body) = answer_body(ctx);
    let body = Bytes::from(body);
    type Chunks =
        std::pin::Pin<Box<dyn futures_util::Stream<Item = std::io::Result<Bytes>> + Send>>;
    let chunks: Chunks = match behavior {
        Behavior::HeadersThenStall => Box::pin(futures_util::stream::once(async move {
            let _guard = guard;
            std::future::pending::<()>().await;
            unreachable!("pending never completes")
        })),
        Behavior::SlowDrip { every } => Box::pin(futures_util::stream::unfold(
            (body, 0, Some(guard)),
            move |(body, at, mut guard)| async move {
                if at == body.len() {
                    if let Some(g) = guard.take() {
                        g.finish();
                    }
                    return None;
                }
                if at > 0 {
                    tokio::time::sleep(every).await;
                }
                Some((Ok(body.slice(at..at + 1)), (body, at + 1, guard)))
            },
        )),
        Behavior::ResetMidBody { after } => {
            let head = body.slice(..after.min(body.len()));
            Box::pin(futures_util::stream::unfold(
                (Some(head), Some(guard)),
                |(head, mut guard)| async move {
                    if let Some(head) = head {
                        return Some((Ok(head), (None, guard)));
                    }
                    let g = guard.take()?;
                    // Let hyper flush what was sent before the abort (see `sse`).
                    tokio::task::yield_now().await;
                    g.finish();
                    Some((
                        Err(std::io::Error::other("sim: ResetMidBody")),
                        (None, None),
                    ))
                },
            ))
        }
        other => unreachable!("not a wire fault: {other:?}"),
    };
    base_response(ctx, 200)
        .header(header::CONTENT_TYPE, content_type)
        .body(Body::from_stream(chunks))
        .expect("sim: valid response")
}

/// `data` as a gzip member (RFC 1952) of stored deflate blocks: a valid gzip body any
/// decoder reads, without a compression library.
pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
    let mut blocks = data.chunks(0xffff).peekable();
    if blocks.peek().is_none() {
        out.extend_from_slice(&[1, 0, 0, 0xff, 0xff]);
    }
    while let Some(block) = blocks.next() {
        out.push(u8::from(blocks.peek().is_none()));
        let len = block.len() as u16;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(block);
    }
    out.extend_from_slice(&crc32(data).to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out
}

/// CRC-32 (IEEE), bit by bit: only the simulator's gzip bodies need it.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xedb8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

/// Answering behaviours: shape by endpoint, stream when the request asked for it.
fn answer(ctx: &Ctx, text: &str, guard: CancelGuard) -> Response<Body> {
    let body = match ctx.endpoint {
        Endpoint::Chat | Endpoint::Messages | Endpoint::Responses | Endpoint::Generate
            if ctx.stream =>
        {
            let events = stream_events(ctx, &split_words(text));
            return sse(ctx, events, Duration::ZERO, StreamEnd::Finish, guard);
        }
        Endpoint::Generate => gemini_response(&ctx.model, text, "STOP"),
        Endpoint::Converse => bedrock_response(text, "end_turn"),
        Endpoint::Chat if ctx.flavor == Flavor::Azure => azure_completion(&ctx.model, text, "stop"),
        Endpoint::Chat => openai_completion(&ctx.model, text),
        Endpoint::Messages => anthropic_message(&ctx.model, text),
        Endpoint::Responses => responses::response_object(&ctx.model, Some(text)),
        Endpoint::Embeddings => openai_embeddings(&ctx.model, ctx.inputs),
        Endpoint::Models => models_list(ctx.flavor, &SIM_MODELS),
        Endpoint::Unknown => {
            guard.finish();
            return json_response(ctx, 404, &error_body(ctx.errors, 404));
        }
    };
    guard.finish();
    json_response(ctx, 200, &body)
}

/// [`Behavior::ToolCall`]: a tool call on the generation endpoints, else an answer.
fn tool_call(
    ctx: &Ctx,
    text: Option<&str>,
    name: &str,
    arguments: &Value,
    cut: Option<usize>,
    guard: CancelGuard,
) -> Response<Body> {
    let body = match (ctx.endpoint, ctx.flavor) {
        (Endpoint::Chat | Endpoint::Messages | Endpoint::Generate, _) if ctx.stream => {
            let events = match ctx.flavor {
                Flavor::Vertex => unreachable!("{RENDERED_AS_PUBLISHER}"),
                Flavor::OpenAi => openai_tool_call_stream_events(
                    &ctx.model,
                    text,
                    name,
                    arguments,
                    ctx.include_usage,
                ),
                Flavor::Azure => azure_stream(openai_tool_call_stream_events(
                    &ctx.model,
                    text,
                    name,
                    arguments,
                    ctx.include_usage,
                )),
                Flavor::Anthropic => {
                    anthropic_tool_use_stream_events(&ctx.model, text, name, arguments)
                }
                Flavor::Gemini => gemini_tool_call_stream_events(&ctx.model, text, name, arguments),
                Flavor::Bedrock => unreachable!("sim: bedrock answers in sim::bedrock"),
            };
            return match cut {
                Some(n) => {
                    let mut events = events;
                    events.truncate(n);
                    sse(ctx, events, Duration::ZERO, StreamEnd::Break, guard)
                }
                None => sse(ctx, events, Duration::ZERO, StreamEnd::Finish, guard),
            };
        }
        (Endpoint::Chat, _) => openai_tool_call_completion(&ctx.model, text, name, arguments),
        (Endpoint::Messages, _) => anthropic_tool_use_message(&ctx.model, text, name, arguments),
        (Endpoint::Generate, _) => gemini_tool_call_response(&ctx.model, text, name, arguments),
        _ => return answer(ctx, &answer_text(&ctx.name), guard),
    };
    guard.finish();
    json_response(ctx, 200, &body)
}

fn stream_events(ctx: &Ctx, pieces: &[String]) -> Vec<String> {
    let mut events = flavor_stream_events(ctx, pieces);
    if ctx.prefill.is_some() {
        // A continuation is another answer: another id.
        for e in &mut events {
            *e = e
                .replace(OPENAI_ID, CONTINUED_OPENAI_ID)
                .replace(ANTHROPIC_ID, CONTINUED_ANTHROPIC_ID);
        }
    }
    events
}

fn flavor_stream_events(ctx: &Ctx, pieces: &[String]) -> Vec<String> {
    if ctx.endpoint == Endpoint::Responses {
        return responses::stream_events(&ctx.model, pieces);
    }
    match ctx.flavor {
        Flavor::Vertex => unreachable!("{RENDERED_AS_PUBLISHER}"),
        Flavor::OpenAi => openai_stream_events(&ctx.model, pieces, ctx.include_usage),
        Flavor::Anthropic => anthropic_stream_events(&ctx.model, pieces),
        Flavor::Azure => azure_stream(openai_stream_events(&ctx.model, pieces, ctx.include_usage)),
        Flavor::Gemini => gemini_stream_events(&ctx.model, pieces),
        Flavor::Bedrock => unreachable!("sim: bedrock answers in sim::bedrock"),
    }
}

/// Response headers real providers send that tests may look at, and some the
/// proxy must not relay.
fn base_response(ctx: &Ctx, status: u16) -> axum::http::response::Builder {
    let id_header = match ctx.flavor {
        Flavor::Vertex => unreachable!("{RENDERED_AS_PUBLISHER}"),
        Flavor::OpenAi | Flavor::Azure => "x-request-id",
        Flavor::Anthropic => "request-id",
        // Google sends no request id header of its own; a debug id stands in.
        Flavor::Gemini => "x-goog-sim-request-id",
        Flavor::Bedrock => "x-amzn-requestid",
    };
    let status = StatusCode::from_u16(status).expect("sim: status must be in 100..=999");
    Response::builder()
        .status(status)
        .header(id_header, &ctx.request_id)
        // What a client of the proxy must never see
        // (docs/request-lifecycle.md#of-a-providers-answer lists what it may).
        .header(header::SET_COOKIE, "__sim_session=1; Path=/; HttpOnly")
        .header(header::SERVER, "sim")
}

fn json_response(ctx: &Ctx, status: u16, body: &Value) -> Response<Body> {
    plain(ctx, status, body.to_string(), true)
}

fn plain(ctx: &Ctx, status: u16, body: String, json: bool) -> Response<Body> {
    let content_type = if json {
        "application/json"
    } else {
        "text/plain; charset=utf-8"
    };
    base_response(ctx, status)
        .header(header::CONTENT_TYPE, content_type)
        .body(Body::from(body))
        .expect("sim: valid response")
}

#[derive(Clone, Copy)]
enum StreamEnd {
    Finish,
    Stall,
    Break,
}

/// A 200 SSE response: one body chunk per event, `interval` between events.
fn sse(
    ctx: &Ctx,
    events: Vec<String>,
    interval: Duration,
    end: StreamEnd,
    guard: CancelGuard,
) -> Response<Body> {
    let body = chunked(
        events.into_iter().map(Bytes::from).collect(),
        interval,
        end,
        guard,
    );
    let content_type = match ctx.flavor {
        Flavor::Vertex => unreachable!("{RENDERED_AS_PUBLISHER}"),
        Flavor::OpenAi | Flavor::Azure => "text/event-stream; charset=utf-8",
        Flavor::Anthropic | Flavor::Gemini => "text/event-stream",
        Flavor::Bedrock => unreachable!("sim: bedrock answers in sim::bedrock"),
    };
    base_response(ctx, 200)
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .expect("sim: valid response")
}

/// [`Behavior::FirstTokenAfter`]'s stream: the opening's events without content at
/// once, one chunk each, then `delay`, then the rest.
fn first_token_after(
    ctx: &Ctx,
    events: Vec<String>,
    delay: Duration,
    guard: CancelGuard,
) -> Response<Body> {
    paused_at(ctx, events, opening_len(ctx), delay, guard)
}

/// A 200 SSE stream of `events`, one chunk each, with a pause of `delay` before
/// event `at` ([`Behavior::FirstTokenAfter`], [`Behavior::UsageAfter`]).
fn paused_at(
    ctx: &Ctx,
    events: Vec<String>,
    at: usize,
    delay: Duration,
    guard: CancelGuard,
) -> Response<Body> {
    let chunks: VecDeque<Bytes> = events.into_iter().map(Bytes::from).collect();
    let init = (chunks, at, Some(delay), Some(guard));
    let body = futures_util::stream::unfold(
        init,
        |(mut chunks, left, mut delay, mut guard)| async move {
            if left == 0
                && let Some(d) = delay.take()
            {
                tokio::time::sleep(d).await;
            }
            match chunks.pop_front() {
                Some(chunk) => Some((
                    Ok::<_, std::io::Error>(chunk),
                    (chunks, left.saturating_sub(1), delay, guard),
                )),
                None => {
                    if let Some(g) = guard.take() {
                        g.finish();
                    }
                    None
                }
            }
        },
    );
    base_response(ctx, 200)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .expect("sim: valid response")
}

/// A streamed body: one chunk per item of `chunks`, `interval` between them, then
/// `end` (finish, stall, or break the connection). Shared by the SSE flavors and
/// Bedrock's event-stream frames.
fn chunked(
    chunks: Vec<Bytes>,
    interval: Duration,
    end: StreamEnd,
    guard: CancelGuard,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    struct S {
        chunks: std::vec::IntoIter<Bytes>,
        first: bool,
        guard: Option<CancelGuard>,
    }
    let init = S {
        chunks: chunks.into_iter(),
        first: true,
        guard: Some(guard),
    };
    futures_util::stream::unfold(init, move |mut s| async move {
        // `guard: None` marks a stream that already ended (after a Break error).
        s.guard.as_ref()?;
        if let Some(chunk) = s.chunks.next() {
            if !s.first && !interval.is_zero() {
                tokio::time::sleep(interval).await;
            }
            s.first = false;
            return Some((Ok(chunk), s));
        }
        match end {
            StreamEnd::Finish => {
                if let Some(guard) = s.guard.take() {
                    guard.finish();
                }
                None
            }
            StreamEnd::Stall => {
                std::future::pending::<()>().await;
                unreachable!("pending never completes")
            }
            StreamEnd::Break => {
                // Give hyper one Pending so it flushes the head and the chunks sent so
                // far; an error in the same poll would discard them unsent.
                tokio::task::yield_now().await;
                if let Some(guard) = s.guard.take() {
                    guard.finish();
                }
                let err = std::io::Error::other("sim: BreakMidStream");
                Some((Err(err), s))
            }
        }
    })
}

// ---------------------------------------------------------------------------------
// Pure renderers: the bodies and events the simulator sends, for building expectations.
// ---------------------------------------------------------------------------------

/// Text of [`Behavior::Answer`] from provider `name`.
pub fn answer_text(name: &str) -> String {
    format!("Hello from {name}.")
}

/// Content deltas of [`Behavior::Stream`] from provider `name`: `"{name}-{i} "`.
pub fn stream_pieces(name: &str, chunks: usize) -> Vec<String> {
    (0..chunks).map(|i| format!("{name}-{i} ")).collect()
}

/// How an answering behaviour splits its text when streamed: words, each keeping its
/// trailing space, so the pieces concatenate back to `text`.
pub fn split_words(text: &str) -> Vec<String> {
    text.split_inclusive(' ').map(str::to_owned).collect()
}

fn completion_tokens(text: &str) -> u64 {
    text.split_whitespace().count() as u64
}

/// OpenAI `chat.completion` object answering `text`.
pub fn openai_completion(model: &str, text: &str) -> Value {
    let out = completion_tokens(text);
    json!({
        "id": OPENAI_ID,
        "object": "chat.completion",
        "created": CREATED,
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text, "refusal": null},
            "logprobs": null,
            "finish_reason": "stop"
        }],
        "usage": openai_usage(out)
    })
}

/// A recorded OpenAI answer naming `model`, of `text` and exactly `input` prompt and
/// `output` completion tokens: unary, and streamed as a role chunk, one chunk per
/// piece of `text`, a stop chunk and the usage chunk (whether asked for or not).
pub fn openai_recorded(model: &str, text: &[&str], input: u64, output: u64) -> Behavior {
    let usage = json!({"prompt_tokens": input, "completion_tokens": output,
                       "total_tokens": input + output});
    let mut events = vec![openai_chunk(
        model,
        json!({"role": "assistant", "content": ""}),
        None,
    )];
    events.extend(
        text.iter()
            .map(|t| openai_chunk(model, json!({"content": t}), None)),
    );
    events.push(openai_chunk(model, json!({}), Some("stop")));
    let mut last = openai_usage_chunk(model, output);
    last["usage"] = usage.clone();
    events.push(last);
    let mut unary = openai_completion(model, &text.concat());
    unary["usage"] = usage;
    Behavior::Replay { unary, events }
}

/// OpenAI `chat.completion.chunk` with one choice.
pub fn openai_chunk(model: &str, delta: Value, finish_reason: Option<&str>) -> Value {
    json!({
        "id": OPENAI_ID,
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason}]
    })
}

/// OpenAI stream events for `pieces`: a role chunk, one chunk per piece, a
/// `finish_reason: "stop"` chunk, a usage chunk (`choices: []`) when `include_usage`
/// (the request's `stream_options.include_usage`), then `data: [DONE]`.
/// Each string is one complete SSE event (`data: …\n\n`).
pub fn openai_stream_events(model: &str, pieces: &[String], include_usage: bool) -> Vec<String> {
    let mut events = vec![openai_sse(&openai_chunk(
        model,
        json!({"role": "assistant", "content": ""}),
        None,
    ))];
    for piece in pieces {
        events.push(openai_sse(&openai_chunk(
            model,
            json!({"content": piece}),
            None,
        )));
    }
    events.push(openai_sse(&openai_chunk(model, json!({}), Some("stop"))));
    if include_usage {
        let out = completion_tokens(&pieces.concat());
        events.push(openai_sse(&openai_usage_chunk(model, out)));
    }
    events.push("data: [DONE]\n\n".to_owned());
    events
}

/// The final chunk of an OpenAI stream with `stream_options.include_usage`.
pub fn openai_usage_chunk(model: &str, completion_tokens: u64) -> Value {
    json!({
        "id": OPENAI_ID,
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": model,
        "choices": [],
        "usage": openai_usage(completion_tokens)
    })
}

/// OpenAI `usage` for a completion of `completion_tokens` after the fixed prompt.
fn openai_usage(completion_tokens: u64) -> Value {
    json!({
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": completion_tokens,
        "total_tokens": PROMPT_TOKENS + completion_tokens
    })
}

/// One OpenAI SSE event: `data: <json>\n\n`.
pub fn openai_sse(data: &Value) -> String {
    format!("data: {data}\n\n")
}

/// Anthropic `message` object answering `text`.
pub fn anthropic_message(model: &str, text: &str) -> Value {
    json!({
        "id": ANTHROPIC_ID,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": null,
        "usage": {"input_tokens": PROMPT_TOKENS, "output_tokens": completion_tokens(text)}
    })
}

/// Anthropic stream events for `pieces`: `message_start`, `content_block_start`,
/// `ping`, one `content_block_delta` per piece, `content_block_stop`, `message_delta`,
/// `message_stop`. Each string is one complete SSE event (`event: …\ndata: …\n\n`).
pub fn anthropic_stream_events(model: &str, pieces: &[String]) -> Vec<String> {
    let out = completion_tokens(&pieces.concat());
    let mut events = vec![
        anthropic_sse("message_start", &anthropic_message_start(model)),
        anthropic_sse(
            "content_block_start",
            &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        anthropic_sse("ping", &json!({"type": "ping"})),
    ];
    for piece in pieces {
        events.push(anthropic_sse(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}),
        ));
    }
    events.push(anthropic_sse(
        "content_block_stop",
        &json!({"type": "content_block_stop", "index": 0}),
    ));
    events.push(anthropic_sse(
        "message_delta",
        &json!({
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": null},
            "usage": {"output_tokens": out}
        }),
    ));
    events.push(anthropic_sse(
        "message_stop",
        &json!({"type": "message_stop"}),
    ));
    events
}

/// The `message_start` event data every Anthropic stream begins with.
pub fn anthropic_message_start(model: &str) -> Value {
    json!({
        "type": "message_start",
        "message": {
            "id": ANTHROPIC_ID,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": null,
            "stop_sequence": null,
            "usage": {"input_tokens": PROMPT_TOKENS, "output_tokens": 1}
        }
    })
}

/// One Anthropic SSE event: `event: <name>\ndata: <json>\n\n`.
pub fn anthropic_sse(event: &str, data: &Value) -> String {
    format!("event: {event}\ndata: {data}\n\n")
}

/// How a streamed tool call sends its arguments: the compact JSON text of `arguments`
/// cut into pieces of at most [`ARGUMENT_FRAGMENT_CHARS`] characters (so keys and
/// strings are split mid-token, as real providers do); they concatenate back to
/// `arguments.to_string()`.
pub fn argument_fragments(arguments: &Value) -> Vec<String> {
    let chars: Vec<char> = arguments.to_string().chars().collect();
    chars
        .chunks(ARGUMENT_FRAGMENT_CHARS)
        .map(|c| c.iter().collect())
        .collect()
}

/// Output tokens reported for a tool call: the text's words plus one per fragment.
fn tool_call_tokens(text: Option<&str>, arguments: &Value) -> u64 {
    text.map_or(0, completion_tokens) + argument_fragments(arguments).len() as u64
}

/// OpenAI `chat.completion` in which the model calls `name` with `arguments`
/// ([`Behavior::ToolCall`]): `content` is `text` or `null`, the arguments a JSON
/// string, `finish_reason: "tool_calls"`.
pub fn openai_tool_call_completion(
    model: &str,
    text: Option<&str>,
    name: &str,
    arguments: &Value,
) -> Value {
    let out = tool_call_tokens(text, arguments);
    json!({
        "id": OPENAI_ID,
        "object": "chat.completion",
        "created": CREATED,
        "model": model,
        "choices": [{
            "index": 0,
            "message": {
                "role": "assistant",
                "content": text,
                "tool_calls": [{
                    "id": OPENAI_TOOL_CALL_ID,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments.to_string()}
                }],
                "refusal": null
            },
            "logprobs": null,
            "finish_reason": "tool_calls"
        }],
        "usage": openai_usage(out)
    })
}

/// OpenAI stream events of [`Behavior::ToolCall`]. Without text: a first chunk with
/// the role, `content: null` and the tool call's head (`index`, `id`, `type`,
/// `function.name`, `arguments: ""`). With text: a role chunk, one chunk per word,
/// then the tool call's head. Then one chunk per [`argument_fragments`] piece
/// (`index` and `function.arguments` only), the `finish_reason: "tool_calls"` chunk,
/// the usage chunk when `include_usage`, and `data: [DONE]`.
pub fn openai_tool_call_stream_events(
    model: &str,
    text: Option<&str>,
    name: &str,
    arguments: &Value,
    include_usage: bool,
) -> Vec<String> {
    let head = json!([{
        "index": 0,
        "id": OPENAI_TOOL_CALL_ID,
        "type": "function",
        "function": {"name": name, "arguments": ""}
    }]);
    let mut events = Vec::new();
    match text {
        None => events.push(openai_sse(&openai_chunk(
            model,
            json!({"role": "assistant", "content": null, "tool_calls": head, "refusal": null}),
            None,
        ))),
        Some(text) => {
            events.push(openai_sse(&openai_chunk(
                model,
                json!({"role": "assistant", "content": "", "refusal": null}),
                None,
            )));
            for piece in split_words(text) {
                events.push(openai_sse(&openai_chunk(
                    model,
                    json!({"content": piece}),
                    None,
                )));
            }
            events.push(openai_sse(&openai_chunk(
                model,
                json!({"tool_calls": head}),
                None,
            )));
        }
    }
    for fragment in argument_fragments(arguments) {
        events.push(openai_sse(&openai_chunk(
            model,
            json!({"tool_calls": [{"index": 0, "function": {"arguments": fragment}}]}),
            None,
        )));
    }
    events.push(openai_sse(&openai_chunk(
        model,
        json!({}),
        Some("tool_calls"),
    )));
    if include_usage {
        let out = tool_call_tokens(text, arguments);
        events.push(openai_sse(&openai_usage_chunk(model, out)));
    }
    events.push("data: [DONE]\n\n".to_owned());
    events
}

/// Anthropic `message` in which the model calls `name` with `arguments`
/// ([`Behavior::ToolCall`]): a text block when `text` is set, then a `tool_use` block
/// with the arguments as its `input` object, `stop_reason: "tool_use"`.
pub fn anthropic_tool_use_message(
    model: &str,
    text: Option<&str>,
    name: &str,
    arguments: &Value,
) -> Value {
    let mut content = Vec::new();
    if let Some(text) = text {
        content.push(json!({"type": "text", "text": text}));
    }
    content.push(json!({
        "type": "tool_use",
        "id": ANTHROPIC_TOOL_USE_ID,
        "name": name,
        "input": arguments
    }));
    json!({
        "id": ANTHROPIC_ID,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use",
        "stop_sequence": null,
        "usage": {"input_tokens": PROMPT_TOKENS, "output_tokens": tool_call_tokens(text, arguments)}
    })
}

/// Anthropic stream events of [`Behavior::ToolCall`]: `message_start`; when `text` is
/// set, a text block (start, `ping`, one delta per word, stop) at index 0; then at
/// the next index `content_block_start` with the `tool_use` block (`input: {}`), an
/// empty `input_json_delta`, `ping` (when no text block sent one), one
/// `input_json_delta` per [`argument_fragments`] piece, `content_block_stop`; then
/// `message_delta` with `stop_reason: "tool_use"` and `message_stop`.
pub fn anthropic_tool_use_stream_events(
    model: &str,
    text: Option<&str>,
    name: &str,
    arguments: &Value,
) -> Vec<String> {
    let block_delta = |index: usize, delta: Value| {
        anthropic_sse(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": index, "delta": delta}),
        )
    };
    let block_stop = |index: usize| {
        anthropic_sse(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": index}),
        )
    };
    let ping = || anthropic_sse("ping", &json!({"type": "ping"}));
    let mut events = vec![anthropic_sse(
        "message_start",
        &anthropic_message_start(model),
    )];
    let mut index = 0;
    if let Some(text) = text {
        events.push(anthropic_sse(
            "content_block_start",
            &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ));
        events.push(ping());
        for piece in split_words(text) {
            events.push(block_delta(0, json!({"type": "text_delta", "text": piece})));
        }
        events.push(block_stop(0));
        index = 1;
    }
    events.push(anthropic_sse(
        "content_block_start",
        &json!({
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "tool_use", "id": ANTHROPIC_TOOL_USE_ID, "name": name, "input": {}}
        }),
    ));
    events.push(block_delta(
        index,
        json!({"type": "input_json_delta", "partial_json": ""}),
    ));
    if text.is_none() {
        events.push(ping());
    }
    for fragment in argument_fragments(arguments) {
        events.push(block_delta(
            index,
            json!({"type": "input_json_delta", "partial_json": fragment}),
        ));
    }
    events.push(block_stop(index));
    events.push(anthropic_sse(
        "message_delta",
        &json!({
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": null},
            "usage": {"output_tokens": tool_call_tokens(text, arguments)}
        }),
    ));
    events.push(anthropic_sse(
        "message_stop",
        &json!({"type": "message_stop"}),
    ));
    events
}

/// OpenAI embeddings list with one deterministic vector per input.
pub fn openai_embeddings(model: &str, inputs: usize) -> Value {
    let data: Vec<Value> = (0..inputs)
        .map(|i| {
            let vector: Vec<f64> = (0..EMBEDDING_DIMS)
                .map(|d| ((i + 1) * (d + 1)) as f64 / 100.0)
                .collect();
            json!({"object": "embedding", "index": i, "embedding": vector})
        })
        .collect();
    json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": PROMPT_TOKENS, "total_tokens": PROMPT_TOKENS}
    })
}

/// `GET /v1/models` list in the flavor's shape (Vertex lists no models: Google's
/// shape).
pub fn models_list(flavor: Flavor, ids: &[&str]) -> Value {
    match flavor {
        Flavor::OpenAi | Flavor::Azure => json!({
            "object": "list",
            "data": ids.iter().map(|id| json!({
                "id": id, "object": "model", "created": CREATED, "owned_by": "switchback-sim"
            })).collect::<Vec<_>>()
        }),
        Flavor::Anthropic => json!({
            "data": ids.iter().map(|id| json!({
                "type": "model", "id": id, "display_name": id,
                "created_at": "2023-11-14T22:13:20Z"
            })).collect::<Vec<_>>(),
            "has_more": false,
            "first_id": ids.first(),
            "last_id": ids.last()
        }),
        Flavor::Gemini | Flavor::Vertex => gemini_models(ids),
        // The Bedrock runtime lists no models (the control plane does).
        Flavor::Bedrock => {
            json!({"modelSummaries": ids.iter().map(|id| json!({"modelId": id})).collect::<Vec<_>>()})
        }
    }
}

/// OpenAI error body: `{"error":{"message","type","param","code"}}`.
pub fn openai_error(message: &str, kind: &str, code: Option<&str>) -> Value {
    json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
}

/// Anthropic error body: `{"type":"error","error":{"type","message"}}`.
pub fn anthropic_error(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

/// The error body a real provider of `flavor` sends with `status`.
pub fn error_body(flavor: Flavor, status: u16) -> Value {
    match flavor {
        Flavor::Gemini => gemini_error_body(status),
        Flavor::Vertex => vertex_error_body(status),
        Flavor::Bedrock => bedrock_error_body(status),
        Flavor::Azure => match status {
            401 => azure_error(
                "401",
                "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key for an active subscription and use a correct regional API endpoint for your resource.",
            ),
            404 => azure_error("404", "Resource not found"),
            429 => azure_error(
                "429",
                "Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-10-21 have exceeded token rate limit of your current OpenAI S0 pricing tier. Please retry after 1 second. Please go here: https://aka.ms/oai/quotaincrease if you would like to further increase the default rate limit.",
            ),
            s if s >= 500 => azure_error(
                "InternalServerError",
                "The service is temporarily unable to process your request. Please try again later.",
            ),
            _ => error_body(Flavor::OpenAi, status),
        },
        Flavor::OpenAi => {
            let (message, kind, code) = match status {
                400 => (
                    "Invalid request (simulated).",
                    "invalid_request_error",
                    None,
                ),
                401 => (
                    "Incorrect API key provided.",
                    "invalid_request_error",
                    Some("invalid_api_key"),
                ),
                403 => (
                    "You are not allowed to access this resource.",
                    "invalid_request_error",
                    None,
                ),
                404 => (
                    "The model or resource does not exist.",
                    "invalid_request_error",
                    Some("model_not_found"),
                ),
                429 => (
                    "Rate limit reached (simulated). Please try again later.",
                    "requests",
                    Some("rate_limit_exceeded"),
                ),
                503 => (
                    "The engine is currently overloaded, please try again later.",
                    "server_error",
                    None,
                ),
                s if s >= 500 => (
                    "The server had an error while processing your request. Sorry about that!",
                    "server_error",
                    None,
                ),
                _ => ("Request failed (simulated).", "invalid_request_error", None),
            };
            openai_error(message, kind, code)
        }
        Flavor::Anthropic => {
            let (kind, message) = match status {
                400 => ("invalid_request_error", "Invalid request (simulated)."),
                401 => ("authentication_error", "invalid x-api-key"),
                403 => (
                    "permission_error",
                    "Your API key does not have permission to use the specified resource.",
                ),
                404 => (
                    "not_found_error",
                    "The requested resource could not be found.",
                ),
                413 => (
                    "request_too_large",
                    "Request exceeds the maximum allowed size.",
                ),
                429 => (
                    "rate_limit_error",
                    "Number of requests has exceeded your rate limit (simulated).",
                ),
                529 => ("overloaded_error", "Overloaded"),
                s if s >= 500 => ("api_error", "Internal server error"),
                _ => ("invalid_request_error", "Request failed (simulated)."),
            };
            anthropic_error(kind, message)
        }
    }
}

/// 400 body of a context-length overflow in each provider's wording.
pub fn context_length_error(wording: ContextWording) -> Value {
    match wording {
        ContextWording::OpenAi => json!({"error": {
            "message": "This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded"
        }}),
        ContextWording::Anthropic => anthropic_error(
            "invalid_request_error",
            "prompt is too long: 210000 tokens > 200000 maximum",
        ),
        // Recent vLLM servers: OpenAI-shaped, numeric `code`, only the message says why.
        ContextWording::Vllm => json!({"error": {
            "message": "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.",
            "type": "BadRequestError",
            "param": null,
            "code": 400
        }}),
        ContextWording::Gemini => gemini_context_length_error(),
    }
}

/// Azure OpenAI's own error shape: `{"error":{"code","message"}}` (the gateway
/// layer's; model errors are OpenAI-shaped, see [`context_length_error`]).
pub fn azure_error(code: &str, message: &str) -> Value {
    json!({"error": {"code": code, "message": message}})
}

/// Azure's content-filter results for one piece of text, nothing filtered.
pub fn azure_filter_results() -> Value {
    let safe = json!({"filtered": false, "severity": "safe"});
    json!({"hate": safe, "self_harm": safe, "sexual": safe, "violence": safe})
}

/// `prompt_filter_results` of every Azure answer (one prompt).
pub fn azure_prompt_filter_results() -> Value {
    json!([{
        "prompt_index": 0,
        "content_filter_results": {
            "hate": {"filtered": false, "severity": "safe"},
            "jailbreak": {"filtered": false, "detected": false},
            "self_harm": {"filtered": false, "severity": "safe"},
            "sexual": {"filtered": false, "severity": "safe"},
            "violence": {"filtered": false, "severity": "safe"}
        }
    }])
}

/// Azure OpenAI chat completion: OpenAI's with the filter results Azure adds and
/// the model's own name and fingerprint, ending with `finish_reason`.
pub fn azure_completion(model: &str, text: &str, finish_reason: &str) -> Value {
    let mut v = openai_completion(model, text);
    v["choices"][0]["content_filter_results"] = azure_filter_results();
    v["choices"][0]["finish_reason"] = json!(finish_reason);
    v["prompt_filter_results"] = azure_prompt_filter_results();
    v["system_fingerprint"] = json!("fp_sim_azure");
    v
}

/// An OpenAI stream as Azure OpenAI sends it: first a chunk with `choices: []` and
/// the prompt's filter results (empty `id`, `model` and `object`), every chunk's
/// choices with `content_filter_results` (empty on the role chunk), and before the
/// finish chunk an annotation chunk with an empty delta.
pub fn azure_stream(openai_events: Vec<String>) -> Vec<String> {
    let mut out = vec![openai_sse(&json!({
        "choices": [],
        "created": 0,
        "id": "",
        "model": "",
        "object": "",
        "prompt_filter_results": azure_prompt_filter_results()
    }))];
    for event in openai_events {
        let Some(data) = event
            .strip_prefix("data: ")
            .and_then(|d| d.strip_suffix("\n\n"))
        else {
            out.push(event);
            continue;
        };
        let Ok(mut chunk) = serde_json::from_str::<Value>(data) else {
            out.push(event);
            continue;
        };
        let mut finishing = false;
        if let Some(choices) = chunk["choices"].as_array_mut() {
            for choice in choices {
                let role_only = choice["delta"].get("role").is_some();
                finishing |= !choice["finish_reason"].is_null();
                choice["content_filter_results"] = if role_only {
                    json!({})
                } else {
                    azure_filter_results()
                };
            }
        }
        if finishing {
            let mut note = chunk.clone();
            note["choices"][0]["delta"] = json!({});
            note["choices"][0]["finish_reason"] = Value::Null;
            out.push(openai_sse(&note));
        }
        out.push(openai_sse(&chunk));
    }
    out
}

/// 400 of Azure OpenAI's prompt filter: the request's fault.
pub fn azure_content_filter_error() -> Value {
    json!({"error": {
        "message": "The response was filtered due to the prompt triggering Azure OpenAI's content management policy. Please modify your prompt and retry. To learn more about our content filtering policies please read our documentation: https://go.microsoft.com/fwlink/?linkid=2198766",
        "type": null,
        "param": "prompt",
        "code": "content_filter",
        "status": 400,
        "innererror": {
            "code": "ResponsibleAIPolicyViolation",
            "content_filter_result": {
                "hate": {"filtered": false, "severity": "safe"},
                "jailbreak": {"filtered": false, "detected": false},
                "self_harm": {"filtered": false, "severity": "safe"},
                "sexual": {"filtered": false, "severity": "safe"},
                "violence": {"filtered": true, "severity": "medium"}
            }
        }
    }})
}

mod bedrock;
pub use bedrock::*;
mod gemini;
pub use gemini::*;
mod vertex;
pub use vertex::{
    TokenBehavior, VERTEX_ANTHROPIC_VERSION, VERTEX_CLIENT_EMAIL, VERTEX_LOCATION, VERTEX_PROJECT,
    VERTEX_SCOPE, VERTEX_TOKEN_LIFETIME, vertex_error_body,
};
pub mod responses;
pub use responses::RESPONSES_MODELS;

#[cfg(test)]
mod tests;
