//! What a stream event sent to a client carries of the answer, in the client's own
//! API, read from the raw bytes without parsing them: how many bytes of content (the
//! text, a tool call's arguments, reasoning), and whether it says the content is over
//! (OpenAI's `finish_reason`, Anthropic's `content_block_stop` / `message_delta`, the
//! Responses API's `…done` events). What a stream relayed is what a client that walks
//! away mid-answer pays for when no usage follows
//! (docs/tenancy.md#a-client-that-leaves-still-pays).
//!
//! Cheap by construction, since it runs on every event of a billed client's stream:
//! a few prebuilt substring searches and a scan of the strings found, nothing
//! allocated.

use std::sync::LazyLock;

use memchr::memmem::Finder;

use super::surface::Surface;

/// The keys whose string values are content, per client API (each with its closing
/// quote: `"content"` and `"reasoning_content"` both end in `content"`).
static CHAT_KEYS: LazyLock<[Finder<'static>; 2]> =
    LazyLock::new(|| [Finder::new(b"content\""), Finder::new(b"\"arguments\"")]);
static MESSAGES_KEYS: LazyLock<[Finder<'static>; 3]> = LazyLock::new(|| {
    [
        Finder::new(b"\"text\""),
        Finder::new(b"\"partial_json\""),
        Finder::new(b"\"thinking\""),
    ]
});
static RESPONSES_KEYS: LazyLock<[Finder<'static>; 1]> =
    LazyLock::new(|| [Finder::new(b"\"delta\"")]);

static FINISH_REASON: LazyLock<Finder<'static>> =
    LazyLock::new(|| Finder::new(b"\"finish_reason\""));

/// Bytes of content in one event of `surface` (escapes counted as written).
pub fn content_len(surface: Surface, event: &[u8]) -> u64 {
    let keys: &[Finder<'static>] = match surface {
        Surface::ChatCompletions => &*CHAT_KEYS,
        Surface::Messages => &*MESSAGES_KEYS,
        Surface::Responses => &*RESPONSES_KEYS,
        Surface::Embeddings => return 0,
    };
    keys.iter()
        .map(|k| {
            k.find_iter(event)
                .map(|at| string_after(&event[at + k.needle().len()..]))
                .sum::<u64>()
        })
        .sum()
}

/// Whether one event of `surface` says the answer's content is over: what follows
/// is the end of the message and its usage.
pub fn ends_content(surface: Surface, event: &[u8]) -> bool {
    match surface {
        Surface::ChatCompletions => FINISH_REASON.find_iter(event).any(|at| {
            // A string, not `null`.
            value_start(&event[at + FINISH_REASON.needle().len()..]) == Some(b'"')
        }),
        Surface::Messages => {
            let name = event_name(event);
            matches!(
                name,
                Some(b"content_block_stop" | b"message_delta" | b"message_stop")
            )
        }
        Surface::Responses => matches!(
            event_name(event),
            Some(
                b"response.output_text.done"
                    | b"response.function_call_arguments.done"
                    | b"response.completed"
            )
        ),
        Surface::Embeddings => false,
    }
}

/// The name on an event's leading `event:` line, if it has one.
fn event_name(event: &[u8]) -> Option<&[u8]> {
    let rest = event.strip_prefix(b"event:")?;
    let end = memchr::memchr(b'\n', rest).unwrap_or(rest.len());
    Some(rest[..end].trim_ascii())
}

/// The first byte of a key's value: past the colon and any whitespace.
fn value_start(after_key: &[u8]) -> Option<u8> {
    after_key
        .iter()
        .copied()
        .find(|b| !matches!(b, b':' | b' ' | b'\t' | b'\r' | b'\n'))
}

/// The length of the JSON string that is the value after a key (0 when the value is
/// not a string).
fn string_after(after_key: &[u8]) -> u64 {
    let Some(open) = after_key
        .iter()
        .position(|b| !matches!(b, b':' | b' ' | b'\t' | b'\r' | b'\n'))
    else {
        return 0;
    };
    if after_key[open] != b'"' {
        return 0;
    }
    let s = &after_key[open + 1..];
    let mut i = 0;
    while let Some(at) = memchr::memchr2(b'"', b'\\', &s[i..]) {
        i += at;
        if s[i] == b'"' {
            return i as u64;
        }
        i += 2; // an escape and the byte it escapes
        if i >= s.len() {
            break;
        }
    }
    // Unterminated: what there is.
    s.len() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_is_the_text_and_arguments_each_api_sends() {
        let chat = br#"data: {"id":"x","choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}]}

"#;
        assert_eq!(content_len(Surface::ChatCompletions, chat), 5);
        assert!(!ends_content(Surface::ChatCompletions, chat));
        let spaced = b"data: {\"choices\": [{\"delta\": {\"content\": \"a \\\"b\\\"\"}, \"finish_reason\": \"stop\"}]}\n\n";
        assert_eq!(
            content_len(Surface::ChatCompletions, spaced),
            7,
            "escapes as written"
        );
        assert!(ends_content(Surface::ChatCompletions, spaced));
        let tool = br#"data: {"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\":"}}]}}]}"#;
        assert_eq!(content_len(Surface::ChatCompletions, tool), 7);
        let role = br#"data: {"choices":[{"delta":{"role":"assistant","content":null}}]}"#;
        assert_eq!(content_len(Surface::ChatCompletions, role), 0);

        let delta = b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi there\"}}\n\n";
        assert_eq!(content_len(Surface::Messages, delta), 8);
        assert!(!ends_content(Surface::Messages, delta));
        let stop =
            b"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n";
        assert!(ends_content(Surface::Messages, stop));
        assert_eq!(content_len(Surface::Messages, stop), 0);

        let out = b"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"abc\"}\n\n";
        assert_eq!(content_len(Surface::Responses, out), 3);
        let done = b"event: response.output_text.done\ndata: {}\n\n";
        assert!(ends_content(Surface::Responses, done));
    }
}
