//! One model name across providers: OpenAI-API clients answered by Anthropic targets
//! and Anthropic-API clients by OpenAI targets, through the whole pipeline (failover
//! classification, streams, errors), against simulated providers.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{Value, json};
use switchback_tests::harness::{TestProxy, credential, header, route};
use switchback_tests::sim::{
    Behavior, ContextWording, Flavor, SimProvider, answer_text, stream_pieces,
};

/// Route `smart`: an OpenAI provider first, an Anthropic one second.
async fn chain() -> (SimProvider, SimProvider, TestProxy) {
    let openai = SimProvider::start_named("gpt", Flavor::OpenAi).await;
    let anthropic = SimProvider::start_named("claude", Flavor::Anthropic).await;
    let manifests = format!(
        "{}{}{}",
        credential("oa", "openai", &openai.base_url(), "sk-oa"),
        credential("an", "anthropic", &anthropic.base_url(), "sk-an"),
        route(
            "smart",
            "  targets:
    - credentialRef: { name: oa }
      model: gpt-4o
    - credentialRef: { name: an }
      model: claude-sonnet-4-5
"
        )
    );
    (openai, anthropic, TestProxy::start(&manifests).await)
}

fn sse_data(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

#[tokio::test]
async fn an_openai_client_falls_back_to_an_anthropic_target_and_cannot_tell() {
    let (openai, anthropic, proxy) = chain().await;
    openai.set_default(Behavior::ServerError(503));
    let r = proxy
        .post(
            "/v1/chat/completions",
            &json!({"model": "smart", "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hello"}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/an");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "smart");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        answer_text("claude")
    );
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert!(body["usage"]["prompt_tokens"].is_u64());

    let got = &anthropic.received()[0];
    assert_eq!(got.path, "/v1/messages");
    assert_eq!(got.header("x-api-key"), Some("sk-an"));
    assert_eq!(got.header("authorization"), None);
    let sent = got.json.as_ref().unwrap();
    assert_eq!(sent["model"], "claude-sonnet-4-5");
    assert_eq!(sent["system"], "be brief");
    assert_eq!(
        sent["max_tokens"], 4096,
        "Anthropic needs max_tokens: the documented default"
    );
    assert_eq!(sent["messages"][0]["role"], "user");
}

#[tokio::test]
async fn an_openai_stream_is_translated_event_by_event() {
    let (openai, anthropic, proxy) = chain().await;
    openai.set_default(Behavior::Reset);
    anthropic.push(Behavior::Stream {
        chunks: 4,
        interval: Duration::from_millis(20),
    });
    let r = proxy
        .post(
            "/v1/chat/completions",
            &json!({"model": "smart", "stream": true, "stream_options": {"include_usage": true},
                    "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let mut chunks = 0;
    let mut text = String::new();
    let mut body = r.bytes_stream();
    while let Some(c) = body.next().await {
        chunks += 1;
        text.push_str(std::str::from_utf8(&c.unwrap()).unwrap());
    }
    assert!(
        chunks >= 4,
        "events arrive as they are translated, not in one lump: {chunks}"
    );
    let events = sse_data(&text);
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    let content: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, stream_pieces("claude", 4).concat());
    assert!(
        events
            .iter()
            .all(|e| e["object"] == "chat.completion.chunk" && e["model"] == "smart")
    );
    assert!(
        events
            .iter()
            .any(|e| e["choices"][0]["finish_reason"] == "stop")
    );
    assert!(
        events.last().unwrap()["usage"]["completion_tokens"].is_u64(),
        "the usage chunk"
    );
    assert!(text.trim_end().ends_with("data: [DONE]"));
}

#[tokio::test]
async fn an_anthropic_client_is_answered_by_an_openai_target() {
    let (openai, _anthropic, proxy) = chain().await;
    let r = proxy
        .post(
            "/v1/messages",
            &json!({"model": "smart", "max_tokens": 100, "system": "be brief",
                    "messages": [{"role": "user", "content": "hello"}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/oa");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["type"], "message");
    assert_eq!(body["model"], "smart");
    assert_eq!(body["content"][0]["text"], answer_text("gpt"));
    assert_eq!(body["stop_reason"], "end_turn");
    let got = &openai.received()[0];
    assert_eq!(got.path, "/v1/chat/completions");
    assert_eq!(got.header("authorization"), Some("Bearer sk-oa"));
    assert_eq!(
        got.header("anthropic-version"),
        None,
        "Anthropic headers stay with Anthropic"
    );
    let sent = got.json.as_ref().unwrap();
    assert_eq!(
        sent["messages"][0],
        json!({"role": "system", "content": "be brief"})
    );
    assert_eq!(sent["model"], "gpt-4o");

    openai.push(Behavior::Stream {
        chunks: 3,
        interval: Duration::ZERO,
    });
    let r = proxy
        .post(
            "/v1/messages",
            &json!({"model": "smart", "max_tokens": 100, "stream": true,
                    "messages": [{"role": "user", "content": "hello"}]}),
        )
        .await;
    let text = r.text().await.unwrap();
    assert!(text.starts_with("event: message_start"), "{text}");
    assert!(text.contains("event: message_stop"), "{text}");
    let deltas: String = sse_data(&text)
        .iter()
        .filter_map(|e| e["delta"]["text"].as_str())
        .collect();
    assert_eq!(deltas, stream_pieces("gpt", 3).concat());
}

#[tokio::test]
async fn failover_rules_read_the_providers_own_words_before_translation() {
    // Anthropic first this time, so its context-length error decides the next step.
    let anthropic = SimProvider::start_named("claude", Flavor::Anthropic).await;
    let openai = SimProvider::start_named("gpt", Flavor::OpenAi).await;
    let manifests = format!(
        "{}{}{}",
        credential("an", "anthropic", &anthropic.base_url(), "sk-an"),
        credential("oa", "openai", &openai.base_url(), "sk-oa"),
        route(
            "smart",
            "  targets:\n    - credentialRef: { name: an }\n    - credentialRef: { name: oa }\n"
        )
    );
    let proxy = TestProxy::start(&manifests).await;
    anthropic.push(Behavior::ContextLength(ContextWording::Anthropic));
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        header(&r, "x-switchback-target"),
        "team-a/oa",
        "context length advances at once"
    );

    // An in-band overload as the first event of a translated stream fails over too.
    anthropic.push(Behavior::StreamErrorFirst);
    let r = proxy.chat("smart", true).await;
    assert_eq!(header(&r, "x-switchback-target"), "team-a/oa");
    assert!(!r.text().await.unwrap().contains("verloaded"));

    // With nothing to fall back to, the provider's error comes back in the client's shape.
    let solo = format!(
        "{}{}",
        credential("an", "anthropic", &anthropic.base_url(), "sk-an"),
        route("solo", "  targets:\n    - credentialRef: { name: an }\n")
    );
    let proxy = TestProxy::start(&solo).await;
    anthropic.push(Behavior::ContextLength(ContextWording::Anthropic));
    let r = proxy.chat("solo", false).await;
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("prompt is too long"),
        "OpenAI shape, Anthropic's words: {body}"
    );
}

#[tokio::test]
async fn parameters_a_target_cannot_honour_skip_it_or_answer_400() {
    let (openai, anthropic, proxy) = chain().await;
    // Native OpenAI target first: n=2 is fine there.
    let body = json!({"model": "smart", "n": 2, "messages": [{"role": "user", "content": "hi"}]});
    openai.push(Behavior::ServerError(500));
    let r = proxy.post("/v1/chat/completions", &body).await;
    assert_eq!(
        r.status(),
        502,
        "the Anthropic target cannot take n=2, so it is not tried"
    );
    assert_eq!(anthropic.hits(), 0);

    let solo = format!(
        "{}{}",
        credential("an", "anthropic", &anthropic.base_url(), "sk-an"),
        route("solo", "  targets:\n    - credentialRef: { name: an }\n")
    );
    let proxy = TestProxy::start(&solo).await;
    let r = proxy
        .post(
            "/v1/chat/completions",
            &json!({"model": "solo", "n": 2, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(r.status(), 400);
    assert_eq!(header(&r, "x-switchback-attempts"), "0");
    let body: Value = r.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains('n'), "names the parameter: {body}");
    assert_eq!(body["error"]["param"], "n", "{body}");
    assert_eq!(anthropic.hits(), 0);
}
