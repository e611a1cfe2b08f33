//! The OpenAI Responses API (`POST /v1/responses`) as the simulator speaks it: the
//! `response` object, its stream's typed events (`response.created` ...
//! `response.completed`, each `event: <type>` with a `sequence_number`), its in-band
//! `error` and `response.failed` events, and the refusals of a malformed request.
//! Pure renderers, public so that tests can build expected values.

use serde_json::{Value, json};

use super::{CREATED, PROMPT_TOKENS};

/// Fixed id of every simulated `response` object.
pub const RESPONSE_ID: &str = "resp_switchback_sim";
/// Fixed id of the message output item of every simulated response.
pub const MESSAGE_ID: &str = "msg_switchback_sim_output";
/// Models an OpenAI-flavor simulator serves the Responses API for; another `model`
/// is refused with 400 `model_not_found`, as OpenAI does.
pub const RESPONSES_MODELS: [&str; 4] = ["gpt-4o", "gpt-4o-mini", "gpt-4.1", "sim-chat"];

/// Output tokens reported for `text`: its words.
fn output_tokens(text: &str) -> u64 {
    text.split_whitespace().count() as u64
}

/// The Responses API `usage` of an answer of `output_tokens` after the fixed prompt.
pub fn usage(output_tokens: u64) -> Value {
    json!({
        "input_tokens": PROMPT_TOKENS,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": PROMPT_TOKENS + output_tokens
    })
}

/// The assistant message output item holding `text`, `status` `completed` (or
/// `in_progress` with no content yet, as `response.output_item.added` announces it).
pub fn message_item(text: Option<&str>) -> Value {
    match text {
        Some(text) => json!({
            "type": "message",
            "id": MESSAGE_ID,
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]
        }),
        None => json!({
            "type": "message",
            "id": MESSAGE_ID,
            "status": "in_progress",
            "role": "assistant",
            "content": []
        }),
    }
}

/// A `response` object. `text: Some` is a completed answer with its output and
/// usage; `None` the in-progress one `response.created` carries (no output, usage
/// `null`).
pub fn response_object(model: &str, text: Option<&str>) -> Value {
    let (status, output, usage) = match text {
        Some(t) => (
            "completed",
            json!([message_item(Some(t))]),
            usage(output_tokens(t)),
        ),
        None => ("in_progress", json!([]), Value::Null),
    };
    json!({
        "id": RESPONSE_ID,
        "object": "response",
        "created_at": CREATED,
        "status": status,
        "background": false,
        "error": null,
        "incomplete_details": null,
        "instructions": null,
        "max_output_tokens": null,
        "model": model,
        "output": output,
        "parallel_tool_calls": true,
        "previous_response_id": null,
        "reasoning": {"effort": null, "summary": null},
        "store": true,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage,
        "user": null,
        "metadata": {}
    })
}

/// One Responses API SSE event: `event: <type>\ndata: <json>\n\n`, the `type` and
/// `sequence_number` set in the data.
pub fn responses_sse(kind: &str, sequence_number: usize, mut data: Value) -> String {
    data["type"] = json!(kind);
    data["sequence_number"] = json!(sequence_number);
    format!("event: {kind}\ndata: {data}\n\n")
}

/// The events of a stream's opening, none of which carries content:
/// `response.created`, `response.in_progress`, `response.output_item.added` (the
/// empty message) and `response.content_part.added` (an empty text part).
pub fn opening_events(model: &str) -> Vec<String> {
    let created = response_object(model, None);
    vec![
        responses_sse("response.created", 0, json!({"response": created})),
        responses_sse("response.in_progress", 1, json!({"response": created})),
        responses_sse(
            "response.output_item.added",
            2,
            json!({"output_index": 0, "item": message_item(None)}),
        ),
        responses_sse(
            "response.content_part.added",
            3,
            json!({"item_id": MESSAGE_ID, "output_index": 0, "content_index": 0,
                   "part": {"type": "output_text", "text": "", "annotations": []}}),
        ),
    ]
}

/// A whole stream answering `pieces`: the [`opening_events`], one
/// `response.output_text.delta` per piece, then `response.output_text.done`,
/// `response.content_part.done`, `response.output_item.done` and
/// `response.completed` (with the usage). No `[DONE]`: the Responses API ends
/// with its terminal event.
pub fn stream_events(model: &str, pieces: &[String]) -> Vec<String> {
    let text = pieces.concat();
    let mut events = opening_events(model);
    for piece in pieces {
        events.push(responses_sse(
            "response.output_text.delta",
            events.len(),
            json!({"item_id": MESSAGE_ID, "output_index": 0, "content_index": 0,
                   "delta": piece, "logprobs": []}),
        ));
    }
    events.push(responses_sse(
        "response.output_text.done",
        events.len(),
        json!({"item_id": MESSAGE_ID, "output_index": 0, "content_index": 0,
               "text": text, "logprobs": []}),
    ));
    events.push(responses_sse(
        "response.content_part.done",
        events.len(),
        json!({"item_id": MESSAGE_ID, "output_index": 0, "content_index": 0,
               "part": {"type": "output_text", "text": text, "annotations": []}}),
    ));
    events.push(responses_sse(
        "response.output_item.done",
        events.len(),
        json!({"output_index": 0, "item": message_item(Some(&text))}),
    ));
    events.push(responses_sse(
        "response.completed",
        events.len(),
        json!({"response": response_object(model, Some(&text))}),
    ));
    events
}

/// The in-band `error` event, as OpenAI sends it mid-stream: the error object under
/// `error` (`code` `server_error` for an overload, `rate_limit_exceeded`, ...).
pub fn error_event(sequence_number: usize, code: &str, message: &str) -> String {
    responses_sse(
        "error",
        sequence_number,
        json!({"error": {"type": "server_error", "code": code, "message": message, "param": null}}),
    )
}

/// `response.failed`: the response object with `status: failed` and its `error`.
pub fn failed_event(model: &str, sequence_number: usize, code: &str, message: &str) -> String {
    let mut response = response_object(model, None);
    response["status"] = json!("failed");
    response["error"] = json!({"code": code, "message": message});
    responses_sse(
        "response.failed",
        sequence_number,
        json!({"response": response}),
    )
}

/// What OpenAI refuses before generating anything: no `input` (400
/// `missing_required_parameter`), a `model` it does not have (400
/// `model_not_found`). `known` says which models exist. `None`: acceptable.
pub fn refusal(body: Option<&Value>, known: impl Fn(&str) -> bool) -> Option<(u16, Value)> {
    let error = |message: String, param: &str, code: &str| {
        json!({"error": {"message": message, "type": "invalid_request_error",
                         "param": param, "code": code}})
    };
    let Some(body) = body.filter(|b| b.is_object()) else {
        return Some((
            400,
            error(
                "We could not parse the JSON body of your request.".into(),
                "body",
                "invalid_json",
            ),
        ));
    };
    if body.get("input").is_none_or(Value::is_null) {
        return Some((
            400,
            error(
                "Missing required parameter: 'input'.".into(),
                "input",
                "missing_required_parameter",
            ),
        ));
    }
    match body.get("model").and_then(Value::as_str) {
        Some(m) if known(m) => None,
        Some(m) => Some((
            400,
            error(
                format!("The requested model '{m}' does not exist."),
                "model",
                "model_not_found",
            ),
        )),
        None => Some((
            400,
            error(
                "Missing required parameter: 'model'.".into(),
                "model",
                "missing_required_parameter",
            ),
        )),
    }
}
