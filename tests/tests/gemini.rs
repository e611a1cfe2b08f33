//! `provider: gemini` through the whole proxy, against the strict Gemini simulator
//! (`Flavor::Gemini`): both client surfaces unary and streamed, with tools both ways;
//! the `x-goog-api-key` header and the model in the path; usage counted; Google's
//! errors mapped to the failover classes (429 `RESOURCE_EXHAUSTED` fails over, a
//! prompt blocked for safety does not unless the route lists `contentFilter`, its
//! context-length wording advances, `API_KEY_INVALID` is an auth error); chains
//! from and to OpenAI and Anthropic targets.

use serde_json::{Value, json};
use switchback_tests::harness::{TestProxy, credential, header, json_of, route, streamed_text};
use switchback_tests::sim::{
    Behavior, ContextWording, Flavor, GEMINI_BAD_KEY, GEMINI_RESPONSE_ID, PROMPT_TOKENS,
    SimProvider, gemini_function_calls, gemini_function_responses,
};

const GEMINI_KEY: &str = "gemini-key-0123456789abcdef";

/// Route `smart`: a gemini target (`gemini-2.5-flash`) alone, or before a backup of
/// `backup_flavor`, with `fallback_extra` under `fallback:`.
async fn setup(
    backup_flavor: Option<Flavor>,
    fallback_extra: &str,
) -> (SimProvider, Option<SimProvider>, TestProxy) {
    let gemini = SimProvider::start_named("gemini", Flavor::Gemini).await;
    let mut manifests = credential("gem", "gemini", &gemini.base_url(), GEMINI_KEY);
    let mut targets =
        "  targets:\n    - credentialRef: { name: gem }\n      model: gemini-2.5-flash\n"
            .to_owned();
    let backup = match backup_flavor {
        Some(flavor) => {
            let sim = SimProvider::start_named("backup", flavor).await;
            let provider = match flavor {
                Flavor::Anthropic => "anthropic",
                _ => "openai",
            };
            manifests += &credential("backup", provider, &sim.base_url(), "sk-backup-0123456789");
            targets += "    - credentialRef: { name: backup }\n      model: backup-model\n";
            Some(sim)
        }
        None => None,
    };
    if !fallback_extra.is_empty() {
        targets += &format!("  fallback:\n{fallback_extra}");
    }
    manifests += &route("smart", &targets);
    let proxy = TestProxy::start(&manifests).await;
    (gemini, backup, proxy)
}

fn metric(text: &str, name: &str, labels: &[&str]) -> u64 {
    text.lines()
        .find(|l| l.starts_with(name) && labels.iter().all(|x| l.contains(x)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{name} {labels:?} in\n{text}"))
}

#[tokio::test]
async fn both_surfaces_unary_and_streamed_with_usage() {
    let (gemini, _, proxy) = setup(None, "").await;

    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/gem");
    let body = json_of(r).await;
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "smart");
    assert_eq!(body["id"], format!("chatcmpl-{GEMINI_RESPONSE_ID}"));
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "Hello from gemini."
    );
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert_eq!(body["usage"]["prompt_tokens"], PROMPT_TOKENS);
    assert_eq!(body["usage"]["completion_tokens"], 3);

    let r = proxy
        .post(
            "/v1/chat/completions",
            &json!({"model": "smart", "stream": true, "stream_options": {"include_usage": true},
                "messages": [{"role": "user", "content": "hello"}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert_eq!(streamed_text(&text), "Hello from gemini.", "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(text.contains(r#""finish_reason":"stop""#), "{text}");
    assert!(text.contains(r#""prompt_tokens":10"#), "{text}");
    for line in text.lines().filter(|l| l.starts_with("data: {")) {
        let chunk: Value = serde_json::from_str(&line[6..]).unwrap();
        assert_eq!(chunk["model"], "smart", "{line}");
    }

    let r = proxy.messages("smart", false).await;
    assert_eq!(r.status(), 200);
    let body = json_of(r).await;
    assert_eq!(body["type"], "message");
    assert_eq!(body["model"], "smart");
    assert_eq!(body["content"][0]["text"], "Hello from gemini.");
    assert_eq!(body["stop_reason"], "end_turn");
    assert_eq!(body["usage"]["input_tokens"], PROMPT_TOKENS);

    let r = proxy.messages("smart", true).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.starts_with("event: message_start"), "{text}");
    assert_eq!(streamed_text(&text), "Hello from gemini.", "{text}");
    assert!(text.contains(r#""stop_reason":"end_turn""#), "{text}");
    assert!(text.contains("event: message_stop"), "{text}");

    let got = gemini.received();
    assert_eq!(got.len(), 4);
    let paths: Vec<&str> = got.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/v1beta/models/gemini-2.5-flash:generateContent",
            "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
            "/v1beta/models/gemini-2.5-flash:generateContent",
            "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
        ]
    );
    for r in &got {
        assert_eq!(r.header("x-goog-api-key"), Some(GEMINI_KEY), "{}", r.path);
        assert_eq!(r.header("authorization"), None, "never Authorization");
        assert_eq!(r.header("x-api-key"), None);
        assert_eq!(r.header("anthropic-version"), None);
        let body = r.json.as_ref().unwrap();
        assert!(
            body.get("model").is_none(),
            "the model is in the path: {body}"
        );
        assert_eq!(body["contents"][0]["parts"][0]["text"], "hello", "{body}");
    }
    // The Anthropic client's max_tokens is Gemini's maxOutputTokens.
    let translated = got[2].json.as_ref().unwrap();
    assert_eq!(translated["generationConfig"]["maxOutputTokens"], 64);

    // Usage of all four, in metrics; the key nowhere on the admin port.
    let metrics = proxy.admin_text("/metrics").await;
    let input = metric(
        &metrics,
        "switchback_tokens_total",
        &["team-a/gem", "direction=\"input\""],
    );
    assert_eq!(input, 4 * PROMPT_TOKENS, "{metrics}");
    let output = metric(
        &metrics,
        "switchback_tokens_total",
        &["team-a/gem", "direction=\"output\""],
    );
    assert_eq!(output, 4 * 3, "{metrics}");
    for path in ["/admin/v1/config", "/admin/v1/stats", "/metrics"] {
        assert!(!proxy.admin_text(path).await.contains(GEMINI_KEY), "{path}");
    }
}

/// A tool result that is a JSON object is Gemini's `functionResponse.response` as
/// it is (what Google's own examples send); only what is not an object is wrapped,
/// as `{"output": ...}` (`{"error": ...}` for a failed call).
#[tokio::test]
async fn an_object_tool_result_is_sent_to_gemini_as_the_object() {
    let (gemini, _, proxy) = setup(None, "").await;
    let call = json!({"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}});
    for (content, response) in [
        (
            r#"{"temperature": 18, "sky": "sunny"}"#,
            json!({"temperature": 18, "sky": "sunny"}),
        ),
        ("18C and sunny", json!({"output": "18C and sunny"})),
        ("[1, 2]", json!({"output": "[1, 2]"})),
    ] {
        let r = proxy
            .post(
                "/v1/chat/completions",
                &json!({"model": "smart", "messages": [
                    {"role": "user", "content": "Weather in Paris?"},
                    {"role": "assistant", "content": null, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "call_1", "content": content}]}),
            )
            .await;
        assert_eq!(r.status(), 200, "{content}");
        let sent = gemini.received().last().unwrap().json.clone().unwrap();
        assert_eq!(
            gemini_function_responses(&sent),
            [("get_weather".to_owned(), response)],
            "{content}"
        );
    }
}

#[tokio::test]
async fn tools_go_both_ways_on_both_surfaces() {
    let (gemini, _, proxy) = setup(None, "").await;
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Weather in a city", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": false}}}]);

    // OpenAI client, unary: the call comes back with an id made for it.
    gemini.push(Behavior::tool_call("get_weather", json!({"city": "Paris"})));
    let r = proxy
        .post(
            "/v1/chat/completions",
            &json!({"model": "smart", "tools": tools, "tool_choice": "required",
                "messages": [{"role": "user", "content": "Weather in Paris?"}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let body = json_of(r).await;
    let call = &body["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(body["choices"][0]["finish_reason"], "tool_calls", "{body}");
    assert_eq!(call["function"]["name"], "get_weather");
    assert_eq!(
        serde_json::from_str::<Value>(call["function"]["arguments"].as_str().unwrap()).unwrap(),
        json!({"city": "Paris"})
    );
    let id = call["id"].as_str().unwrap().to_owned();
    assert_eq!(id, format!("call_{GEMINI_RESPONSE_ID}_0"));
    let sent = gemini.received()[0].json.clone().unwrap();
    let decl = &sent["tools"][0]["functionDeclarations"][0];
    assert_eq!(decl["name"], "get_weather");
    assert_eq!(decl["parametersJsonSchema"]["additionalProperties"], false);
    assert_eq!(
        sent["toolConfig"]["functionCallingConfig"]["mode"], "ANY",
        "{sent}"
    );

    // The result goes back naming the function.
    let r = proxy
        .post(
            "/v1/chat/completions",
            &json!({"model": "smart", "tools": tools, "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": null, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": id, "content": "18C and sunny"}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let sent = gemini.received()[1].json.clone().unwrap();
    assert_eq!(
        gemini_function_calls(&sent),
        [("get_weather".to_owned(), json!({"city": "Paris"}))]
    );
    assert_eq!(
        gemini_function_responses(&sent),
        [("get_weather".to_owned(), json!({"output": "18C and sunny"}))]
    );

    // Anthropic client, streamed: a tool_use block with the same made-up id.
    gemini.push(Behavior::ToolCall {
        name: "get_weather".into(),
        arguments: json!({"city": "Oslo"}),
        text: Some("Checking.".into()),
    });
    let r = proxy
        .post(
            "/v1/messages",
            &json!({"model": "smart", "max_tokens": 100, "stream": true,
                "tools": [{"name": "get_weather", "input_schema": {"type": "object",
                    "properties": {"city": {"type": "string"}}}}],
                "messages": [{"role": "user", "content": "Weather in Oslo?"}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.contains(r#""type":"tool_use""#), "{text}");
    assert!(
        text.contains(&format!(r#""id":"call_{GEMINI_RESPONSE_ID}_0""#)),
        "{text}"
    );
    assert!(
        text.contains(r#""partial_json":"{\"city\":\"Oslo\"}""#),
        "{text}"
    );
    assert!(text.contains(r#""stop_reason":"tool_use""#), "{text}");
    assert_eq!(streamed_text(&text), "Checking.");

    // A result whose call is not in the conversation cannot name its function: 400.
    let r = proxy
        .post(
            "/v1/chat/completions",
            &json!({"model": "smart", "messages": [
                {"role": "user", "content": "hi"},
                {"role": "tool", "tool_call_id": "call_unknown", "content": "x"}]}),
        )
        .await;
    assert_eq!(r.status(), 400);
    assert_eq!(
        json_of(r).await["error"]["param"],
        "messages[1].tool_call_id"
    );
    assert_eq!(gemini.hits(), 3, "refused requests are never sent");
    // An image by URL goes as a file Google fetches, typed by its name
    // (docs/translation.md#documents-and-media).
    let r = proxy
        .post(
            "/v1/chat/completions",
            &json!({"model": "smart", "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let sent = gemini.received();
    let sent = sent
        .last()
        .and_then(|r| r.json.clone())
        .expect("a JSON body");
    assert_eq!(
        sent["contents"][0]["parts"][0],
        json!({"fileData": {"mimeType": "image/png", "fileUri": "https://example.com/a.png"}})
    );
}

#[tokio::test]
async fn resource_exhausted_fails_over_to_an_openai_backup() {
    let (gemini, backup, proxy) = setup(Some(Flavor::OpenAi), "").await;
    let backup = backup.unwrap();
    gemini.push(Behavior::ServerError(429));
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
    assert_eq!(header(&r, "x-switchback-fallbacks"), "1");
    assert_eq!(
        json_of(r).await["choices"][0]["message"]["content"],
        "Hello from backup."
    );
    // Parked for RetryInfo's 2 s: the next request goes straight to the backup.
    let r = proxy.messages("smart", true).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
    assert_eq!(gemini.hits(), 1);
    assert_eq!(backup.hits(), 2);
    let stats = proxy.admin_stats().await.to_string();
    assert!(stats.contains("rateLimited"), "{stats}");
}

#[tokio::test]
async fn an_overloaded_gemini_stream_fails_over_to_an_anthropic_backup() {
    let (gemini, backup, proxy) = setup(Some(Flavor::Anthropic), "").await;
    let backup = backup.unwrap();
    // A 503 UNAVAILABLE, then an in-band error before any content.
    gemini.push(Behavior::ServerError(503));
    let r = proxy.chat("smart", true).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
    assert_eq!(
        streamed_text(&r.text().await.unwrap()),
        "Hello from backup."
    );
    gemini.push(Behavior::OpeningThenError);
    let r = proxy.messages("smart", true).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
    assert_eq!(
        streamed_text(&r.text().await.unwrap()),
        "Hello from backup."
    );
    assert_eq!(gemini.hits(), 2);
    assert_eq!(backup.hits(), 2);
}

#[tokio::test]
async fn a_failing_openai_primary_falls_over_to_gemini() {
    let openai = SimProvider::start_named("primary", Flavor::OpenAi).await;
    let gemini = SimProvider::start_named("gemini", Flavor::Gemini).await;
    let manifests = format!(
        "{}{}{}",
        credential(
            "primary",
            "openai",
            &openai.base_url(),
            "sk-primary-0123456789"
        ),
        credential("gem", "gemini", &gemini.base_url(), GEMINI_KEY),
        route(
            "smart",
            "  targets:\n    - credentialRef: { name: primary }\n      model: gpt-4o\n    - credentialRef: { name: gem }\n      model: gemini-2.5-pro\n"
        ),
    );
    let proxy = TestProxy::start(&manifests).await;
    openai.set_default(Behavior::ServerError(503));
    for stream in [false, true] {
        let r = proxy.chat("smart", stream).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-switchback-target"), "team-a/gem");
        assert_eq!(header(&r, "x-switchback-fallbacks"), "1");
        let text = if stream {
            streamed_text(&r.text().await.unwrap())
        } else {
            json_of(r).await["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_owned()
        };
        assert_eq!(text, "Hello from gemini.");
    }
    let r = proxy.messages("smart", false).await;
    assert_eq!(header(&r, "x-switchback-target"), "team-a/gem");
    assert_eq!(json_of(r).await["content"][0]["text"], "Hello from gemini.");
    for r in gemini.received() {
        assert!(
            r.path.starts_with("/v1beta/models/gemini-2.5-pro:"),
            "{}",
            r.path
        );
    }
}

#[tokio::test]
async fn a_blocked_prompt_is_answered_not_failed_over() {
    let (gemini, backup, proxy) = setup(Some(Flavor::OpenAi), "").await;
    let backup = backup.unwrap();
    gemini.push(Behavior::ContentFilter);
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/gem");
    assert_eq!(header(&r, "x-switchback-attempts"), "1", "never retried");
    let body = json_of(r).await;
    assert_eq!(
        body["choices"][0]["finish_reason"], "content_filter",
        "{body}"
    );
    assert_eq!(body["choices"][0]["message"]["content"], "");

    gemini.push(Behavior::ContentFilter);
    let r = proxy.messages("smart", true).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.contains(r#""stop_reason":"refusal""#), "{text}");
    assert!(text.contains("event: message_stop"), "{text}");
    assert_eq!(backup.hits(), 0);
    let stats = proxy.admin_stats().await.to_string();
    assert!(stats.contains("contentFilter"), "{stats}");

    // An answer stopped for SAFETY is an answer like any other.
    gemini.push(Behavior::FilteredAnswer);
    let r = proxy.chat("smart", true).await;
    let text = r.text().await.unwrap();
    assert!(
        text.contains(r#""finish_reason":"content_filter""#),
        "{text}"
    );
    assert_eq!(backup.hits(), 0);
}

#[tokio::test]
async fn a_blocked_prompt_fails_over_when_the_route_lists_content_filter() {
    let (gemini, backup, proxy) = setup(
        Some(Flavor::OpenAi),
        "    onFailures: [status5xx, rateLimited, contentFilter]\n",
    )
    .await;
    let backup = backup.unwrap();
    for stream in [false, true] {
        gemini.push(Behavior::ContentFilter);
        let r = proxy.chat("smart", stream).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
        assert_eq!(header(&r, "x-switchback-attempts"), "2");
    }
    assert_eq!(backup.hits(), 2);
}

#[tokio::test]
async fn gemini_context_length_wording_advances_as_context_length() {
    let (gemini, backup, proxy) = setup(Some(Flavor::Anthropic), "").await;
    let backup = backup.unwrap();
    gemini.push(Behavior::ContextLength(ContextWording::Gemini));
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
    assert_eq!(header(&r, "x-switchback-attempts"), "2", "not retried");
    assert_eq!(backup.hits(), 1);
    let stats = proxy.admin_stats().await.to_string();
    assert!(stats.contains("contextLength"), "{stats}");

    // Alone, Google's answer reaches the client in its shape, worded as it expects.
    let (gemini, _, proxy) = setup(None, "").await;
    gemini.push(Behavior::ContextLength(ContextWording::Gemini));
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 400);
    let body = json_of(r).await;
    assert_eq!(body["error"]["code"], "context_length_exceeded", "{body}");
    gemini.push(Behavior::ContextLength(ContextWording::Gemini));
    let r = proxy.messages("smart", false).await;
    assert_eq!(r.status(), 400);
    let body = json_of(r).await;
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("prompt is too long"),
        "{body}"
    );
}

#[tokio::test]
async fn an_invalid_key_is_an_auth_error_returned_unless_listed() {
    let gemini = SimProvider::start_named("gemini", Flavor::Gemini).await;
    let backup = SimProvider::start_named("backup", Flavor::OpenAi).await;
    let manifests = |fallback: &str| {
        format!(
            "{}{}{}",
            credential("gem", "gemini", &gemini.base_url(), GEMINI_BAD_KEY),
            credential(
                "backup",
                "openai",
                &backup.base_url(),
                "sk-backup-0123456789"
            ),
            route(
                "smart",
                &format!(
                    "  targets:\n    - credentialRef: {{ name: gem }}\n      model: gemini-2.5-flash\n    - credentialRef: {{ name: backup }}\n{fallback}"
                )
            ),
        )
    };
    let proxy = TestProxy::start(&manifests("")).await;
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 400);
    let body = json_of(r).await;
    assert_eq!(body["error"]["code"], "invalid_api_key", "{body}");
    assert!(!body.to_string().contains(GEMINI_BAD_KEY), "{body}");
    assert_eq!(backup.hits(), 0);
    let stats = proxy.admin_stats().await.to_string();
    assert!(stats.contains("authError"), "{stats}");

    let proxy = TestProxy::start(&manifests(
        "  fallback:\n    onFailures: [status5xx, authError]\n",
    ))
    .await;
    let r = proxy.messages("smart", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
}

/// The simulator refuses what Google refuses, so the tests above mean something.
#[tokio::test]
async fn the_simulator_refuses_what_google_refuses() {
    let sim = SimProvider::start_named("gemini", Flavor::Gemini).await;
    let http = reqwest::Client::new();
    let url = |rest: &str| format!("{}/models/gemini-2.5-flash{rest}", sim.base_url());
    let ok = json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]});
    let send = |path: String, key: Option<&'static str>, body: Value| {
        let mut req = http.post(path).json(&body);
        if let Some(k) = key {
            req = req.header("x-goog-api-key", k);
        }
        async move {
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (s, _) = send(url(":generateContent"), Some("k"), ok.clone()).await;
    assert_eq!(s, 200);
    let (s, b) = send(url(":generateContent"), None, ok.clone()).await;
    assert_eq!(
        (s, b["error"]["status"].as_str()),
        (403, Some("PERMISSION_DENIED"))
    );
    let (s, b) = send(url(":generateContent"), Some(GEMINI_BAD_KEY), ok.clone()).await;
    assert_eq!(s, 400);
    assert!(b.to_string().contains("API_KEY_INVALID"));
    let mut with_model = ok.clone();
    with_model["model"] = json!("gemini-2.5-flash");
    let (s, b) = send(url(":generateContent"), Some("k"), with_model).await;
    assert_eq!(s, 400, "{b}");
    let (s, _) = send(
        url(":generateContent"),
        Some("k"),
        json!({"messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(s, 400);
    let (s, b) = send(
        url(":generateContent"),
        Some("k"),
        json!({"contents": [{"role": "assistant", "parts": [{"text": "hi"}]}]}),
    )
    .await;
    assert_eq!(s, 400);
    assert_eq!(
        b["error"]["message"],
        "Please use a valid role: user, model."
    );
    let (s, _) = send(
        url(":generateContent"),
        Some("k"),
        json!({"contents": [{"role": "user", "parts": [{"functionResponse": {"response": {"output": "x"}}}]}]}),
    )
    .await;
    assert_eq!(s, 400);
    let (s, _) = send(url(":streamGenerateContent"), Some("k"), ok.clone()).await;
    assert_eq!(s, 400, "streams are asked for with alt=sse");
    let (s, _) = send(
        url(":generateContent"),
        Some("k"),
        json!({"contents": ok["contents"], "generationConfig": {"max_tokens": 5}}),
    )
    .await;
    assert_eq!(s, 400);
    let (s, _) = send(url(":streamGenerateContent?alt=sse"), Some("k"), ok).await;
    assert_eq!(s, 200);
    assert_eq!(sim.hits(), 10, "refusals are recorded and counted");
}

#[tokio::test]
async fn an_unknown_gemini_model_is_returned_as_model_not_found() {
    let (gemini, backup, proxy) = setup(Some(Flavor::OpenAi), "").await;
    let backup = backup.unwrap();
    gemini.push(Behavior::ServerError(404));
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 404);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/gem");
    let body = json_of(r).await;
    assert_eq!(body["error"]["code"], "model_not_found", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("models/"),
        "Google's words: {body}"
    );
    gemini.push(Behavior::ServerError(404));
    let r = proxy.messages("smart", false).await;
    assert_eq!(r.status(), 404);
    assert_eq!(json_of(r).await["error"]["type"], "not_found_error");
    assert_eq!(backup.hits(), 0, "never failed over");
}

/// The model is one path segment: Google's own `models/` prefix is taken as written
/// once, and a name the client sent is percent-encoded, never a path of its own.
#[tokio::test]
async fn the_model_is_one_path_segment() {
    let gemini = SimProvider::start_named("gemini", Flavor::Gemini).await;
    let manifests = format!(
        "{}{}{}",
        credential("gem", "gemini", &gemini.base_url(), GEMINI_KEY),
        route(
            "smart",
            "  targets:\n    - credentialRef: { name: gem }\n      model: models/gemini-2.5-flash\n"
        ),
        route(
            "tuned",
            "  models: [\"tuned/v1 beta\"]\n  targets:\n    - credentialRef: { name: gem }\n"
        ),
    );
    let proxy = TestProxy::start(&manifests).await;
    assert_eq!(proxy.chat("smart", true).await.status(), 200);
    assert_eq!(proxy.messages("tuned/v1 beta", false).await.status(), 200);
    let paths: Vec<String> = gemini.received().into_iter().map(|r| r.path).collect();
    assert_eq!(
        paths,
        [
            "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
            "/v1beta/models/tuned%2Fv1%20beta:generateContent",
        ]
    );
}

/// A Gemini stream whose function takes no arguments (`"args": {}`): an OpenAI
/// client's streamed arguments make `{}`, which it parses as JSON (OpenAI sends it
/// so; an empty string would not parse).
#[tokio::test]
async fn a_streamed_call_without_arguments_reaches_an_openai_client_as_an_empty_object() {
    let (gemini, _, proxy) = setup(None, "").await;
    gemini.push(Behavior::tool_call("get_time", json!({})));
    let r = proxy
        .post(
            "/v1/chat/completions",
            &json!({"model": "smart", "stream": true, "tool_choice": "required",
                "tools": [{"type": "function", "function": {"name": "get_time",
                    "parameters": {"type": "object", "properties": {}}}}],
                "messages": [{"role": "user", "content": "What time is it?"}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    let sent = gemini.received()[0].json.clone().unwrap();
    assert!(text.contains("get_time"), "{text}");
    let args: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| {
            let v: Value = serde_json::from_str(d).ok()?;
            v["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&args).unwrap_or(Value::Null),
        json!({}),
        "arguments {args:?} in {text}; Gemini was sent {sent}"
    );
}
