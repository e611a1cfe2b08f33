//! The internal form of a chat exchange: one request, one answer, one stream of
//! events and one error, as every adapter decodes to and encodes from. A pairing of
//! a client surface and a provider is then a decode by one adapter and an encode by
//! another, never a translator written for the pair.
//!
//! The form holds what chat APIs share: a system prompt, alternating turns whose
//! content is text, images, documents, reasoning, tool calls and tool results,
//! function tools and a tool choice, sampling parameters, stop sequences, the
//! answer's format (JSON, JSON matching a schema), how much to reason, stop reasons
//! and token usage. It is shaped after the richest of them (Anthropic messages, which
//! Gemini's `contents`/`parts` with `functionCall`/`functionResponse` and Bedrock
//! Converse's content blocks with `toolUse`/`toolResult` follow closely), so an
//! adapter maps blocks one to one instead of rebuilding turns.
//!
//! Everything borrows from the parsed client body or upstream event: decoding copies
//! no strings (tool arguments that arrive as a JSON string, and ids made up for tool
//! calls that came without one, aside). Nothing here knows a wire format.

use std::borrow::Cow;

use serde_json::{Number, Value};

/// What a target provider can take beyond the form's shared core. A decoder reads it
/// to refuse, with the client's own parameter path, what the target cannot serve
/// (only the decoder knows that path: after merging and reordering, the form does
/// not).
#[derive(Clone, Copy, Debug)]
pub struct Target {
    /// Ends refusal messages: "`top_k` cannot be served by {name}".
    pub name: &'static str,
    /// The highest `temperature` the target accepts (clamping would silently change
    /// sampling, so a higher one is refused).
    pub max_temperature: f64,
    /// Whether `top_k` can be sent.
    pub top_k: bool,
    /// Whether an image can be sent by URL for the provider to fetch (otherwise only
    /// inline, base64 images).
    pub image_urls: bool,
    /// Whether a tool result must name the function it answers (Gemini's
    /// `functionResponse`): the decoder then refuses a result whose call is not
    /// earlier in the conversation, as the encoder finds the name there.
    pub tool_result_names: bool,
    /// Whether a document can be sent by URL for the provider to fetch.
    pub document_urls: bool,
    /// Whether a URL must travel with its media type (Gemini's `fileData`): one
    /// whose name does not tell it is fetched by the gateway instead.
    pub url_media_type: bool,
    /// Whether a tool result can hold images and documents beside its text
    /// (Anthropic's `tool_result` blocks, Bedrock's `toolResult` content, Gemini's
    /// multimodal `functionResponse` parts); otherwise text only.
    pub tool_result_media: bool,
}

/// Images and documents the gateway fetched for a target that cannot take them by
/// URL (docs/translation.md#documents-and-media): each URL with the media type it was
/// served as and its bytes in base64, as the decoders put them in the form in the URL's
/// place.
#[derive(Debug, Default)]
pub struct Fetched(Vec<(String, String, String)>);

impl Fetched {
    /// What was fetched for `url`: (media type, base64 data).
    pub fn get(&self, url: &str) -> Option<(&str, &str)> {
        self.0
            .iter()
            .find(|(u, ..)| u == url)
            .map(|(_, m, d)| (m.as_str(), d.as_str()))
    }

    pub fn insert(&mut self, url: String, media_type: String, base64: String) {
        self.0.push((url, media_type, base64));
    }
}

/// A chat request.
#[derive(Debug, Default)]
pub struct Request<'a> {
    /// System prompt texts, in order, none empty.
    pub system: Vec<&'a str>,
    /// Turns as the client sent them: consecutive turns of one role are not merged
    /// (a provider that needs alternation merges them).
    pub messages: Vec<Message<'a>>,
    pub tools: Vec<Tool<'a>>,
    pub tool_choice: Option<ToolChoice<'a>>,
    /// `false` asks for at most one tool call per answer.
    pub parallel_tool_calls: bool,
    /// The client's output limit, if it set one (a provider that requires one supplies
    /// its default).
    pub max_tokens: Option<u64>,
    /// Numbers kept as sent, so `1` stays `1` and `0.7` stays `0.7`.
    pub temperature: Option<&'a Number>,
    pub top_p: Option<&'a Number>,
    pub top_k: Option<u64>,
    pub stop: Vec<&'a str>,
    /// As the client sent it (`false` included).
    pub stream: Option<bool>,
    /// An end-user id for the provider's abuse monitoring.
    pub user: Option<&'a str>,
    /// The answer's format, when the client asked for JSON.
    pub format: Option<Format<'a>>,
    /// How much the model should reason before it answers, when the client said.
    pub reasoning: Option<Reasoning>,
    /// The client's API has a place for the reasoning's text (Anthropic `thinking`
    /// blocks) and the client did not ask it left out: a provider that returns it
    /// only on request is asked for it.
    pub reasoning_content: bool,
}

/// A JSON answer (docs/translation.md#structured-output): what the client asked for, and
/// the client's parameter that asked (for refusals: only the decoder knows the path).
#[derive(Debug)]
pub struct Format<'a> {
    /// `response_format`, `output_config.format`, ...
    pub param: &'static str,
    pub kind: FormatKind<'a>,
}

#[derive(Debug)]
pub enum FormatKind<'a> {
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// JSON matching a schema.
    JsonSchema(JsonSchema<'a>),
}

#[derive(Debug)]
pub struct JsonSchema<'a> {
    /// The name the client gave it, if any.
    pub name: Option<&'a str>,
    pub description: Option<&'a str>,
    /// A JSON Schema (an object).
    pub schema: &'a Value,
    /// The client asked for the schema to be enforced (OpenAI's `strict`;
    /// Anthropic's structured outputs always are).
    pub strict: bool,
}

/// How much to reason, as the client said it; each target maps it by the table in
/// [`Effort::budget`] and [`Effort::of_budget`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reasoning {
    /// `reasoning_effort`, `thinking`, `output_config.effort`.
    pub param: &'static str,
    pub kind: ReasoningKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningKind {
    /// No reasoning (OpenAI `none`, Anthropic `disabled`).
    Off,
    /// A level on OpenAI's scale (also Anthropic's `output_config.effort`).
    Effort(Effort),
    /// A token budget (Anthropic `budget_tokens`).
    Budget(u64),
    /// The model decides how much (Anthropic `adaptive`).
    Adaptive,
}

/// OpenAI's reasoning effort levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Effort {
    Minimal,
    Low,
    Medium,
    High,
    XHigh,
    Max,
}

impl Effort {
    pub fn parse(s: &str) -> Option<Effort> {
        Some(match s {
            "minimal" => Self::Minimal,
            "low" => Self::Low,
            "medium" => Self::Medium,
            "high" => Self::High,
            "xhigh" => Self::XHigh,
            "max" => Self::Max,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Minimal => "minimal",
            Self::Low => "low",
            Self::Medium => "medium",
            Self::High => "high",
            Self::XHigh => "xhigh",
            Self::Max => "max",
        }
    }

    /// The thinking budget (tokens) a level stands for where a target takes a
    /// budget (Anthropic, Claude on Bedrock and Vertex, Gemini): the table of
    /// docs/translation.md. 1,024 is Anthropic's smallest budget.
    pub fn budget(self) -> u64 {
        match self {
            Self::Minimal => 1024,
            Self::Low => 2048,
            Self::Medium => 8192,
            Self::High => 16384,
            Self::XHigh => 24576,
            Self::Max => 32768,
        }
    }

    /// The level a budget stands for where a target takes a level (OpenAI, Nova,
    /// gpt-oss): low, medium or high, which every reasoning model of those APIs
    /// takes. Each level's budget maps back to itself.
    pub fn of_budget(budget: u64) -> Effort {
        match budget {
            0..4096 => Self::Low,
            4096..16384 => Self::Medium,
            _ => Self::High,
        }
    }

    /// The same level on the low / medium / high scale.
    pub fn coarse(self) -> Effort {
        Self::of_budget(self.budget())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    User,
    Assistant,
}

/// One turn.
#[derive(Debug)]
pub struct Message<'a> {
    pub role: Role,
    pub content: Vec<Part<'a>>,
}

/// One piece of a turn's content (or of an answer: text and tool calls only).
#[derive(Debug)]
pub enum Part<'a> {
    Text(&'a str),
    Image(Image<'a>),
    Document(Document<'a>),
    ToolUse(ToolUse<'a>),
    /// In a user turn only.
    ToolResult(ToolResult<'a>),
    /// The model's reasoning (an assistant turn or an answer).
    Reasoning(ReasoningText<'a>),
    /// Reasoning the provider encrypted (Anthropic `redacted_thinking`, Bedrock
    /// `redactedContent`): relayed as it came, never read.
    RedactedReasoning(&'a str),
    /// An answer given as a JSON value (the input of the tool through which an API
    /// without a schema-less JSON mode was asked for JSON, `vocab::JSON_TOOL`):
    /// the answer's text, in answers only.
    Json(Cow<'a, Value>),
}

/// The text of a model's reasoning and the provider's signature over it, relayed
/// byte for byte and never made up: `None` when the provider signed nothing.
#[derive(Debug)]
pub struct ReasoningText<'a> {
    pub text: &'a str,
    pub signature: Option<&'a str>,
}

#[derive(Debug)]
pub enum Image<'a> {
    /// An `http(s)` URL the provider fetches.
    Url(&'a str),
    /// Inline bytes, base64 encoded.
    Base64 { media_type: &'a str, data: &'a str },
}

/// A document: a PDF (base64 or by URL) or plain text.
#[derive(Debug)]
pub struct Document<'a> {
    pub source: DocumentSource<'a>,
    pub title: Option<&'a str>,
}

#[derive(Debug)]
pub enum DocumentSource<'a> {
    /// Inline bytes, base64 encoded (a PDF).
    Base64 { media_type: &'a str, data: &'a str },
    /// Plain text (`text/plain`), as the client sent it.
    Text(&'a str),
    /// A PDF at an `http(s)` URL.
    Url(&'a str),
}

/// A tool call by the model.
#[derive(Debug)]
pub struct ToolUse<'a> {
    /// Kept as the provider made it: it must round-trip through the client's next
    /// request. Made up (see `vocab::tool_id`) only when the provider gave none.
    pub id: Cow<'a, str>,
    pub name: &'a str,
    /// A JSON object.
    pub input: Cow<'a, Value>,
}

/// The result of a tool call, sent back by the client. It names the call by id only:
/// a wire that names the function instead (Gemini's `functionResponse`) finds it in
/// the [`ToolUse`] with that id earlier in the conversation.
#[derive(Debug)]
pub struct ToolResult<'a> {
    pub tool_use_id: &'a str,
    pub content: ToolOutput<'a>,
    pub is_error: bool,
}

/// A tool result's content. A plain string and a list of parts are told apart
/// because providers that take both keep the client's choice. Parts are text,
/// images and documents (decoders refuse media for targets whose tool results carry
/// text only, `Target::tool_result_media`).
#[derive(Debug)]
pub enum ToolOutput<'a> {
    Text(&'a str),
    Parts(Vec<Part<'a>>),
}

impl ToolOutput<'_> {
    /// The result's text: the string, or its text parts joined.
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Self::Text(s) => std::borrow::Cow::Borrowed(s),
            Self::Parts(ps) => {
                let mut texts = ps.iter().filter_map(|p| match p {
                    Part::Text(t) => Some(*t),
                    _ => None,
                });
                match (texts.next(), texts.next()) {
                    (None, _) => std::borrow::Cow::Borrowed(""),
                    (Some(one), None) => std::borrow::Cow::Borrowed(one),
                    (Some(a), Some(b)) => {
                        let mut s = String::from(a);
                        s.push_str(b);
                        texts.for_each(|t| s.push_str(t));
                        std::borrow::Cow::Owned(s)
                    }
                }
            }
        }
    }

    /// Whether it holds anything but text.
    pub fn has_media(&self) -> bool {
        matches!(self, Self::Parts(ps) if ps.iter().any(|p| !matches!(p, Part::Text(_))))
    }
}

/// A function the model may call.
#[derive(Debug)]
pub struct Tool<'a> {
    pub name: &'a str,
    pub description: Option<&'a str>,
    /// The JSON schema of the arguments; `None` is an object with no properties.
    pub schema: Option<&'a Value>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum ToolChoice<'a> {
    Auto,
    None,
    /// Some tool must be called.
    Required,
    /// This tool must be called.
    Tool(&'a str),
}

/// Why the model stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// A natural end (and any reason newer than this list).
    EndTurn,
    /// A client stop sequence matched.
    Sequence,
    /// The output limit.
    MaxTokens,
    /// The context window filled up.
    ContextWindow,
    /// The answer ends with tool calls.
    ToolUse,
    /// The model refused, or a content filter stopped it.
    Refusal,
    /// A long-running turn paused (Anthropic server tools).
    Pause,
}

/// Token counts. `input` excludes cached tokens: cache reads and writes are counted
/// apart (providers that count them in the prompt are converted by their adapter).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_write: u64,
}

/// Counts a stream reports as it goes: each is cumulative, and one not reported is
/// unchanged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsageDelta {
    pub input: Option<u64>,
    pub output: Option<u64>,
    pub cache_read: Option<u64>,
    pub cache_write: Option<u64>,
}

impl Usage {
    pub fn update(&mut self, d: &UsageDelta) {
        let set = |slot: &mut u64, v: Option<u64>| {
            if let Some(v) = v {
                *slot = v;
            }
        };
        set(&mut self.input, d.input);
        set(&mut self.output, d.output);
        set(&mut self.cache_read, d.cache_read);
        set(&mut self.cache_write, d.cache_write);
    }
}

/// A whole (unary) answer.
#[derive(Debug)]
pub struct Answer<'a> {
    /// The provider's id without its wire's prefix (`msg_`, `chatcmpl-`): each
    /// encoder adds its own, so ids round-trip. Made up only when the provider gave
    /// none.
    pub id: Cow<'a, str>,
    /// Text and tool calls.
    pub content: Vec<Part<'a>>,
    pub stop: Option<Stop>,
    pub usage: Option<Usage>,
}

/// One step of a streamed answer. A decoder emits them in the order the client must
/// see them; a stream that ends without [`Event::End`] but after [`Event::Stop`] is
/// complete all the same.
#[derive(Debug, PartialEq, Eq)]
pub enum Event<'a> {
    /// The answer begins (again, for providers that repeat it). `id` as in
    /// [`Answer::id`], when the provider gave one.
    Start {
        id: Option<&'a str>,
    },
    /// Answer text (never empty).
    Text(&'a str),
    /// A tool call begins. `tool` numbers the answer's tool calls from 0 in order;
    /// `id` is `None` when the provider gave none.
    ToolStart {
        tool: u32,
        id: Option<&'a str>,
        name: &'a str,
    },
    /// More of a tool call's arguments (a JSON text fragment, never empty).
    ToolArgs {
        tool: u32,
        json: &'a str,
    },
    /// More of the model's reasoning (never empty).
    Reasoning(&'a str),
    /// The provider's signature over the reasoning so far, as it sent it.
    ReasoningSignature(&'a str),
    /// Reasoning the provider encrypted, whole.
    RedactedReasoning(&'a str),
    Usage(UsageDelta),
    Stop(Stop),
    /// The answer is complete: stop reason and usage are final.
    End,
    /// The provider failed mid-answer; the stream ends with it. (In-band errors of
    /// SSE wires are found by `sse::error_in` before any decoder sees them; a wire
    /// with its own framing, such as Bedrock's event stream, decodes its own.)
    Error(Error),
}

/// What went wrong, as a class both sides of a pairing can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    InvalidRequest,
    /// The prompt does not fit the model's context window.
    ContextLength,
    Authentication,
    Permission,
    Billing,
    NotFound,
    /// The model named does not exist (or the caller cannot see it): OpenAI's
    /// `model_not_found`, what the gateway answers for a model no route serves.
    ModelNotFound,
    RequestTooLarge,
    RateLimit,
    Overloaded,
    Timeout,
    Server,
}

/// An upstream error answer. The status is the caller's (the upstream's is kept);
/// the message is the provider's, word for word.
#[derive(Debug, PartialEq, Eq)]
pub struct Error {
    pub class: ErrorClass,
    pub message: String,
}
