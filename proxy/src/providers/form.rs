//! The internal form of a chat exchange: one request, one answer, one stream of
//! events and one error, as every adapter decodes to and encodes from. A pairing of
//! a client surface and a provider is then a decode by one adapter and an encode by
//! another, never a translator written for the pair.
//!
//! The form holds what chat APIs share: a system prompt, alternating turns whose
//! content is text, images, inline documents, tool calls and tool results, function
//! tools and a tool choice, sampling parameters, stop sequences, stop reasons and
//! token usage. It is shaped after the richest of them (Anthropic messages, which
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
}

#[derive(Debug)]
pub enum Image<'a> {
    /// An `http(s)` URL the provider fetches.
    Url(&'a str),
    /// Inline bytes, base64 encoded.
    Base64 { media_type: &'a str, data: &'a str },
}

/// An inline document (a base64 PDF: what every provider in view reads).
#[derive(Debug)]
pub struct Document<'a> {
    pub media_type: &'a str,
    pub data: &'a str,
    pub title: Option<&'a str>,
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

/// A tool result's content: text only (chat completions' tool messages carry nothing
/// else, and Gemini's `functionResponse` is a JSON object). A plain string and a list
/// of text parts are told apart because providers that take both keep the client's
/// choice.
#[derive(Debug)]
pub enum ToolOutput<'a> {
    Text(&'a str),
    Parts(Vec<&'a str>),
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
