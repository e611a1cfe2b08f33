//! Gemini stream chunks (`streamGenerateContent?alt=sse`: `data: {GenerateContentResponse}`
//! events, no event names, no `[DONE]`) → form events, and what a chunk of a stream's
//! opening means for the commit.
//!
//! Each chunk carries whole parts: a text delta, or a whole `functionCall` (its
//! arguments are not streamed in pieces). `finishReason` and `usageMetadata` come
//! in the last chunk (usage often in every chunk, as running totals). The stream
//! ends when the connection does: the client's stream is completed by
//! `StreamTranslator::finish` once the stop reason is known.

use serde::Deserialize;

use super::super::dialect;
use super::super::form::{Event, Stop, UsageDelta};
use super::super::vocab::{fresh_id, tool_id};
use super::shapes::stop_of;
use crate::wire::sse::{self, Opening, StreamError};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ChunkIn<'a> {
    #[serde(default, borrow)]
    response_id: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    candidates: Option<Vec<CandidateIn<'a>>>,
    #[serde(default)]
    usage_metadata: Option<UsageIn>,
    #[serde(default)]
    prompt_feedback: Option<FeedbackIn>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CandidateIn<'a> {
    #[serde(default, borrow)]
    content: Option<ContentIn<'a>>,
    #[serde(default, borrow)]
    finish_reason: Option<std::borrow::Cow<'a, str>>,
}

#[derive(Deserialize)]
struct ContentIn<'a> {
    #[serde(default, borrow)]
    parts: Option<Vec<PartIn<'a>>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PartIn<'a> {
    #[serde(default, borrow)]
    text: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    thought: Option<bool>,
    #[serde(default, borrow)]
    function_call: Option<CallIn<'a>>,
}

#[derive(Deserialize)]
struct CallIn<'a> {
    #[serde(default, borrow)]
    id: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    name: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    args: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct UsageIn {
    #[serde(default)]
    prompt_token_count: Option<u64>,
    #[serde(default)]
    candidates_token_count: Option<u64>,
    #[serde(default)]
    thoughts_token_count: Option<u64>,
    #[serde(default)]
    cached_content_token_count: Option<u64>,
    #[serde(default)]
    tool_use_prompt_token_count: Option<u64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FeedbackIn {
    #[serde(default)]
    block_reason: Option<serde::de::IgnoredAny>,
}

impl UsageIn {
    /// As `super::usage_of`: cached tokens leave the input, thinking counts as output.
    fn delta(&self) -> UsageDelta {
        let cached = self.cached_content_token_count.unwrap_or(0);
        let prompt = self.prompt_token_count.map(|p| {
            p.saturating_add(self.tool_use_prompt_token_count.unwrap_or(0))
                .saturating_sub(cached)
        });
        let output = match (self.candidates_token_count, self.thoughts_token_count) {
            (None, None) => None,
            (c, t) => Some(c.unwrap_or(0).saturating_add(t.unwrap_or(0))),
        };
        UsageDelta {
            input: prompt,
            output,
            cache_read: self.prompt_token_count.map(|_| cached),
            cache_write: None,
        }
    }
}

/// Reads one Gemini stream. The first candidate is the answer.
#[derive(Default)]
pub(in super::super) struct StreamDecoder {
    /// The bare id (the first chunk's `responseId`, or made up), once started: tool
    /// call ids are made from it as for unary answers.
    id: Option<String>,
    tools: u32,
    stopped: bool,
}

impl StreamDecoder {
    /// One event's `data`.
    pub(in super::super) fn decode(&mut self, data: &[u8], emit: &mut dyn FnMut(Event<'_>)) {
        let Ok(chunk) = serde_json::from_slice::<ChunkIn<'_>>(data) else {
            return; // not a Gemini chunk: nothing to say
        };
        if self.id.is_none() {
            let id = match chunk.response_id.as_deref() {
                Some(id) if !id.is_empty() => id.to_owned(),
                _ => fresh_id(),
            };
            emit(Event::Start { id: Some(&id) });
            self.id = Some(id);
        }
        let id = self.id.as_deref().unwrap_or("");
        let candidate = chunk.candidates.as_ref().and_then(|c| c.first());
        let parts = candidate
            .and_then(|c| c.content.as_ref())
            .and_then(|c| c.parts.as_deref())
            .unwrap_or(&[]);
        for p in parts {
            if p.thought == Some(true) {
                if let Some(t) = p.text.as_deref().filter(|t| !t.is_empty()) {
                    emit(Event::Reasoning(t));
                }
                continue;
            }
            if let Some(t) = p.text.as_deref().filter(|t| !t.is_empty()) {
                emit(Event::Text(t));
            }
            if let Some(call) = &p.function_call {
                let tool = self.tools;
                self.tools = self.tools.saturating_add(1);
                let made;
                let call_id = match call.id.as_deref() {
                    Some(c) if !c.is_empty() => c,
                    _ => {
                        made = tool_id(id, tool as usize);
                        &made
                    }
                };
                emit(Event::ToolStart {
                    tool,
                    id: Some(call_id),
                    name: call.name.as_deref().unwrap_or(""),
                });
                // Arguments arrive whole: one fragment (none for `{}` or none at all).
                if let Some(args) = call
                    .args
                    .as_ref()
                    .filter(|a| a.as_object().is_some_and(|o| !o.is_empty()))
                {
                    emit(Event::ToolArgs {
                        tool,
                        json: &args.to_string(),
                    });
                }
            }
        }
        if let Some(u) = &chunk.usage_metadata {
            emit(Event::Usage(u.delta()));
        }
        if self.stopped {
            return;
        }
        if let Some(reason) = candidate.and_then(|c| c.finish_reason.as_deref()) {
            self.stopped = true;
            emit(Event::Stop(stop_of(reason, self.tools > 0)));
        } else if candidate.is_none()
            && chunk
                .prompt_feedback
                .as_ref()
                .is_some_and(|f| f.block_reason.is_some())
        {
            // The prompt was blocked: no answer will come.
            self.stopped = true;
            emit(Event::Stop(Stop::Refusal));
        }
    }
}

/// What one event of a Gemini stream's opening means for the commit
/// (docs/request-lifecycle.md#streams-the-commit-point): a chunk without text (a thought's
/// included), a function call, a finish reason or a block holds back; an in-band `{"error":
/// ...}` is an error; a blocked prompt is an error of class `contentFilter` (reported with
/// status 400, as the same refusal would be as a plain answer elsewhere), relayed to the
/// client unless the route fails over on it.
pub(crate) fn opening(event: &[u8]) -> Opening {
    let f = sse::fields(event);
    let Some(data) = f.data else {
        return Opening::Hold;
    };
    if let Some(e) = sse::error_in(&f) {
        return Opening::Error(e);
    }
    let Ok(chunk) = serde_json::from_slice::<ChunkIn<'_>>(data) else {
        return Opening::Content; // not ours to judge
    };
    let candidate = chunk.candidates.as_ref().and_then(|c| c.first());
    if candidate.is_none()
        && chunk
            .prompt_feedback
            .as_ref()
            .is_some_and(|f| f.block_reason.is_some())
    {
        return Opening::Error(StreamError {
            status: 400,
            body: bytes::Bytes::copy_from_slice(data),
        });
    }
    let Some(c) = candidate else {
        return Opening::Hold;
    };
    let content = c.finish_reason.is_some()
        || c.content
            .as_ref()
            .and_then(|c| c.parts.as_deref())
            .unwrap_or(&[])
            .iter()
            .any(|p| p.function_call.is_some() || p.text.as_deref().is_some_and(|t| !t.is_empty()));
    if content {
        Opening::Content
    } else {
        Opening::Hold
    }
}

impl dialect::StreamDecoder for StreamDecoder {
    fn decode(&mut self, data: &[u8], emit: &mut dyn FnMut(Event<'_>)) {
        StreamDecoder::decode(self, data, emit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(chunks: &[&str]) -> Vec<String> {
        let mut d = StreamDecoder::default();
        let mut out = Vec::new();
        for c in chunks {
            d.decode(c.as_bytes(), &mut |e| out.push(format!("{e:?}")));
        }
        out
    }

    #[test]
    fn tool_calls_get_stable_ids_and_whole_arguments() {
        let out = events(&[
            r#"{"candidates":[{"content":{"role":"model","parts":[{"functionCall":{"name":"get_weather","args":{"city":"Paris"}}}]},"index":0}],"responseId":"r1"}"#,
            r#"{"candidates":[{"content":{"role":"model","parts":[{"text":""}]},"finishReason":"STOP","index":0}],"usageMetadata":{"promptTokenCount":10,"candidatesTokenCount":5,"totalTokenCount":15},"responseId":"r1"}"#,
        ]);
        assert_eq!(
            out,
            [
                r#"Start { id: Some("r1") }"#,
                r#"ToolStart { tool: 0, id: Some("call_r1_0"), name: "get_weather" }"#,
                r#"ToolArgs { tool: 0, json: "{\"city\":\"Paris\"}" }"#,
                "Usage(UsageDelta { input: Some(10), output: Some(5), cache_read: Some(0), cache_write: None })",
                "Stop(ToolUse)",
            ]
        );
    }

    #[test]
    fn openings_hold_empty_chunks_and_flag_blocks() {
        let ev = |d: &str| format!("data: {d}\n\n");
        assert_eq!(
            opening(
                ev(r#"{"candidates":[{"content":{"role":"model","parts":[{"text":""}]}}]}"#)
                    .as_bytes()
            ),
            Opening::Hold
        );
        assert_eq!(
            opening(ev(r#"{"usageMetadata":{"promptTokenCount":3}}"#).as_bytes()),
            Opening::Hold
        );
        assert_eq!(
            opening(
                ev(r#"{"candidates":[{"content":{"role":"model","parts":[{"text":"Hi"}]}}]}"#)
                    .as_bytes()
            ),
            Opening::Content
        );
        let Opening::Error(e) =
            opening(ev(r#"{"promptFeedback":{"blockReason":"SAFETY"},"usageMetadata":{"promptTokenCount":3}}"#).as_bytes())
        else {
            panic!("a block is an error")
        };
        assert_eq!(
            crate::providers::classify::classify_status(e.status, &e.body),
            crate::observe::reason::Reason::ContentFilter
        );
        let Opening::Error(e) = opening(
            ev(r#"{"error":{"code":429,"message":"Resource has been exhausted","status":"RESOURCE_EXHAUSTED"}}"#).as_bytes(),
        ) else {
            panic!("an in-band error")
        };
        assert_eq!(e.status, 429);
    }
}
