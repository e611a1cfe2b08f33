//! Token counts as a provider reports them in a `usage` object (OpenAI's
//! `prompt_tokens` / `completion_tokens`, Anthropic's `input_tokens` /
//! `output_tokens`, in answers, stream events and the Responses API alike), read
//! from the raw bytes: the first `usage` object is parsed on its own, the rest of
//! the document is not read twice. Providers that spell usage otherwise read their
//! own (see each provider's dialect).

/// Token counts a provider reported in a `usage` object (OpenAI `prompt_tokens` /
/// `completion_tokens`, Anthropic `input_tokens` / `output_tokens`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub struct Usage {
    #[serde(default, alias = "prompt_tokens")]
    pub input_tokens: u64,
    #[serde(default, alias = "completion_tokens")]
    pub output_tokens: u64,
}

static USAGE_KEY: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"usage\""));

/// The first `usage` object in a JSON document or SSE event, parsed on its own so
/// the rest of the document is not read twice.
pub fn usage(doc: &[u8]) -> Option<Usage> {
    let at = USAGE_KEY.find(doc)? + b"\"usage\"".len();
    let rest = &doc[at..];
    let start = rest
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t' | b'\r' | b'\n' | b':'))?;
    let mut values = serde_json::Deserializer::from_slice(&rest[start..]).into_iter::<Usage>();
    values.next()?.ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_usage_in_both_wires() {
        let openai = br#"{"id":"x","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}"#;
        assert_eq!(
            usage(openai),
            Some(Usage {
                input_tokens: 10,
                output_tokens: 5
            })
        );
        let anthropic = b"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{},\"usage\": {\"output_tokens\":7}}\n\n";
        assert_eq!(
            usage(anthropic),
            Some(Usage {
                input_tokens: 0,
                output_tokens: 7
            })
        );
        assert_eq!(usage(b"data: {\"choices\":[]}\n\n"), None);
        let gemini = b"data: {\"candidates\":[],\"usageMetadata\": {\"promptTokenCount\":12,\"candidatesTokenCount\":5,\"thoughtsTokenCount\":3,\"totalTokenCount\":20}}\n\n";
        assert_eq!(usage(gemini), None);
        assert_eq!(usage(br#"{"usage":null}"#), None);
    }
}
