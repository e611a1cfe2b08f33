//! `provider: bedrock` through the whole proxy, against the strict Bedrock simulator
//! (`Flavor::Bedrock`, which recomputes every request's SigV4 signature): both
//! client surfaces unary and streamed (ConverseStream's binary event-stream frames),
//! with tools both ways; the model id encoded as one path segment; usage counted;
//! AWS's errors mapped to the failover classes (ThrottlingException and an exception
//! frame before content fail over, one after commit ends the stream with the error
//! event, "Input is too long" advances as contextLength, a bad signature or unknown
//! key is an auth error); temporary credentials (session token) signed; nothing of
//! the keys in logs or admin output; a chain azure-openai → bedrock → anthropic.

use serde_json::{Value, json};
use switchback_proxy::limits::answers::UpstreamLimits;
use switchback_tests::harness::{
    self, CapturedLog, TestProxy, credential, header, json_of, route, streamed_text,
};
use switchback_tests::sim::{
    BEDROCK_ACCESS_KEY_ID, BEDROCK_SECRET_ACCESS_KEY, BEDROCK_SESSION_TOKEN,
    BEDROCK_TEMP_ACCESS_KEY_ID, BEDROCK_TOOL_USE_ID, Behavior, ContextWording, Flavor,
    PROMPT_TOKENS, SimProvider,
};

/// A Bedrock model id with the colon AWS's ids carry.
const MODEL: &str = "anthropic.claude-3-5-sonnet-20240620-v1:0";
const MODEL_PATH: &str = "anthropic.claude-3-5-sonnet-20240620-v1%3A0";

/// A bedrock credential for `sim` reading the whole Secret `{name}-keys`.
fn bedrock_credential(
    name: &str,
    sim: &SimProvider,
    akid: &str,
    secret: &str,
    token: Option<&str>,
) -> String {
    harness::bedrock_credential(name, &sim.base_url(), akid, secret, token)
}

/// Route `smart`: a bedrock target alone, or before a backup of `backup_flavor`.
async fn setup_with(
    akid: &str,
    secret: &str,
    token: Option<&str>,
    backup_flavor: Option<Flavor>,
) -> (SimProvider, Option<SimProvider>, TestProxy) {
    let bedrock = SimProvider::start_named("bedrock", Flavor::Bedrock).await;
    let mut manifests = bedrock_credential("br", &bedrock, akid, secret, token);
    let mut targets =
        format!("  targets:\n    - credentialRef: {{ name: br }}\n      model: \"{MODEL}\"\n");
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
    manifests += &route("smart", &targets);
    let proxy = TestProxy::start(&manifests).await;
    (bedrock, backup, proxy)
}

async fn setup(backup_flavor: Option<Flavor>) -> (SimProvider, Option<SimProvider>, TestProxy) {
    setup_with(
        BEDROCK_ACCESS_KEY_ID,
        BEDROCK_SECRET_ACCESS_KEY,
        None,
        backup_flavor,
    )
    .await
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
    let (bedrock, _, proxy) = setup(None).await;

    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/br");
    let body = json_of(r).await;
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "smart");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "Hello from bedrock."
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
    assert_eq!(streamed_text(&text), "Hello from bedrock.", "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(text.contains(r#""finish_reason":"stop""#), "{text}");
    assert!(text.contains(r#""prompt_tokens":10"#), "{text}");

    let r = proxy.messages("smart", false).await;
    assert_eq!(r.status(), 200);
    let body = json_of(r).await;
    assert_eq!(body["type"], "message");
    assert_eq!(body["model"], "smart");
    assert_eq!(body["content"][0]["text"], "Hello from bedrock.");
    assert_eq!(body["stop_reason"], "end_turn");
    assert_eq!(body["usage"]["input_tokens"], PROMPT_TOKENS);
    assert_eq!(body["usage"]["output_tokens"], 3);

    let r = proxy.messages("smart", true).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.starts_with("event: message_start"), "{text}");
    assert_eq!(streamed_text(&text), "Hello from bedrock.", "{text}");
    assert!(text.contains(r#""stop_reason":"end_turn""#), "{text}");
    assert!(text.contains(r#""output_tokens":3"#), "{text}");
    assert!(text.contains("event: message_stop"), "{text}");

    let got = bedrock.received();
    let paths: Vec<&str> = got.iter().map(|r| r.path.as_str()).collect();
    let unary = format!("/model/{MODEL_PATH}/converse");
    let stream = format!("/model/{MODEL_PATH}/converse-stream");
    assert_eq!(paths, [&unary, &stream, &unary, &stream]);
    for r in &got {
        let body = r.json.as_ref().unwrap();
        assert!(
            body.get("model").is_none() && body.get("stream").is_none(),
            "{body}"
        );
        assert_eq!(body["messages"][0]["content"][0]["text"], "hello", "{body}");
        let auth = r.headers["authorization"].to_str().unwrap();
        assert!(
            auth.starts_with(&format!(
                "AWS4-HMAC-SHA256 Credential={BEDROCK_ACCESS_KEY_ID}/"
            )),
            "{auth}"
        );
        assert!(auth.contains("/us-east-1/bedrock/aws4_request"), "{auth}");
        assert!(r.headers.get("x-amz-security-token").is_none());
    }

    // Usage reached the metrics: 4 answers of 10 in, 3 out.
    let metrics = proxy.admin_text("/metrics").await;
    let input = metric(
        &metrics,
        "switchback_tokens_total",
        &["team-a/br", "direction=\"input\""],
    );
    assert_eq!(input, 4 * PROMPT_TOKENS, "{metrics}");
    let output = metric(
        &metrics,
        "switchback_tokens_total",
        &["team-a/br", "direction=\"output\""],
    );
    assert_eq!(output, 4 * 3, "{metrics}");
}

/// ConverseStream answers in AWS event-stream framing
/// (`application/vnd.amazon.eventstream`); the client asked for server-sent events
/// and gets them, under their own content type, on both surfaces.
#[tokio::test]
async fn a_converse_stream_reaches_clients_as_server_sent_events() {
    let (_bedrock, _, proxy) = setup(None).await;
    for r in [
        proxy.chat("smart", true).await,
        proxy.messages("smart", true).await,
    ] {
        assert_eq!(r.status(), 200);
        let content_type = header(&r, "content-type");
        assert!(
            content_type.starts_with("text/event-stream"),
            "{content_type}"
        );
        let text = r.text().await.unwrap();
        assert_eq!(streamed_text(&text), "Hello from bedrock.", "{text}");
    }
}

#[tokio::test]
async fn tools_both_ways() {
    let (bedrock, _, proxy) = setup(None).await;
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    for stream in [false, true] {
        bedrock.push(Behavior::ToolCall {
            name: "get_weather".into(),
            arguments: json!({"city": "Paris"}),
            text: None,
        });
        let r = proxy
            .post(
                "/v1/chat/completions",
                &json!({"model": "smart", "stream": stream, "tool_choice": "required", "tools": tools,
                    "messages": [{"role": "user", "content": "weather in Paris?"}]}),
            )
            .await;
        assert_eq!(r.status(), 200);
        let text = r.text().await.unwrap();
        if stream {
            assert!(text.contains(BEDROCK_TOOL_USE_ID), "{text}");
            assert!(text.contains(r#""name":"get_weather""#), "{text}");
            // The input arrived in two fragments, relayed as they came.
            assert!(text.contains(r#""arguments":"{\"city\":"#), "{text}");
            assert!(text.contains(r#""finish_reason":"tool_calls""#), "{text}");
        } else {
            let body: Value = serde_json::from_str(&text).unwrap();
            let call = &body["choices"][0]["message"]["tool_calls"][0];
            assert_eq!(call["id"], BEDROCK_TOOL_USE_ID);
            assert_eq!(call["function"]["name"], "get_weather");
            assert_eq!(call["function"]["arguments"], r#"{"city":"Paris"}"#);
            assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
        }
    }
    let sent = bedrock.received();
    let first = sent[0].json.as_ref().unwrap();
    assert_eq!(first["toolConfig"]["toolChoice"], json!({"any": {}}));
    assert_eq!(
        first["toolConfig"]["tools"][0]["toolSpec"]["inputSchema"]["json"]["properties"]["city"]["type"],
        "string"
    );

    // The result goes back as a toolResult naming the call's id (Messages surface).
    let r = proxy
        .post(
            "/v1/messages",
            &json!({"model": "smart", "max_tokens": 100,
                "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
                "messages": [
                {"role": "user", "content": "weather in Paris?"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": BEDROCK_TOOL_USE_ID,
                    "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": BEDROCK_TOOL_USE_ID,
                    "content": "18°C, sunny", "is_error": false}]}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        json_of(r).await["content"][0]["text"],
        "Hello from bedrock."
    );
    let last = bedrock.received().pop().unwrap().json.unwrap();
    assert_eq!(
        last["messages"][1]["content"][0]["toolUse"],
        json!({"toolUseId": BEDROCK_TOOL_USE_ID, "name": "get_weather", "input": {"city": "Paris"}})
    );
    assert_eq!(
        last["messages"][2]["content"][0]["toolResult"],
        json!({"toolUseId": BEDROCK_TOOL_USE_ID, "content": [{"text": "18°C, sunny"}]})
    );
    assert_eq!(last["inferenceConfig"]["maxTokens"], 100);

    // Anthropic client, streamed tool call.
    bedrock.push(Behavior::ToolCall {
        name: "get_weather".into(),
        arguments: json!({"city": "Paris"}),
        text: Some("Let me check.".into()),
    });
    let r = proxy
        .post(
            "/v1/messages",
            &json!({"model": "smart", "max_tokens": 100, "stream": true,
                "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
                "messages": [{"role": "user", "content": "weather in Paris?"}]}),
        )
        .await;
    let text = r.text().await.unwrap();
    assert!(text.contains(r#""type":"tool_use""#), "{text}");
    assert!(text.contains(r#""partial_json":"{\"city\":"#), "{text}");
    assert!(text.contains(r#""stop_reason":"tool_use""#), "{text}");
    assert_eq!(streamed_text(&text), "Let me check.", "{text}");
}

#[tokio::test]
async fn what_converse_cannot_take_is_refused_before_sending() {
    let (bedrock, _, proxy) = setup(None).await;
    let r = proxy
        .post(
            "/v1/messages",
            &json!({"model": "smart", "max_tokens": 10, "top_k": 5,
                "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(r.status(), 400);
    let body = json_of(r).await;
    assert!(
        body["error"]["message"].as_str().unwrap().contains("top_k"),
        "{body}"
    );
    let r = proxy
        .post(
            "/v1/chat/completions",
            &json!({"model": "smart", "tool_choice": "none",
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "messages": [{"role": "user", "content": "q"},
                    {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                    {"role": "tool", "tool_call_id": "c1", "content": "r"}]}),
        )
        .await;
    assert_eq!(r.status(), 400);
    assert_eq!(json_of(r).await["error"]["param"], "tool_choice");
    assert_eq!(bedrock.hits(), 0, "refused requests are never sent");
    // `none` without tool history: the tools are left out.
    let r = proxy
        .post(
            "/v1/chat/completions",
            &json!({"model": "smart", "tool_choice": "none",
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "messages": [{"role": "user", "content": "q"}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert!(
        bedrock.received()[0]
            .json
            .as_ref()
            .unwrap()
            .get("toolConfig")
            .is_none()
    );
}

#[tokio::test]
async fn throttling_fails_over_to_a_backup() {
    let (bedrock, backup, proxy) = setup(Some(Flavor::OpenAi)).await;
    let backup = backup.unwrap();
    for stream in [false, true] {
        bedrock.push(Behavior::RateLimited {
            retry_after_secs: 1,
        });
        let r = proxy.chat("smart", stream).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
        assert_eq!(header(&r, "x-switchback-fallbacks"), "1");
        let text = r.text().await.unwrap();
        let said = if stream {
            streamed_text(&text)
        } else {
            text.clone()
        };
        assert!(said.contains("Hello from backup."), "{text}");
    }
    assert_eq!(bedrock.hits(), 2);
    assert_eq!(backup.hits(), 2);
    let stats = proxy.admin_stats().await.to_string();
    assert!(stats.contains("rateLimited"), "{stats}");
}

#[tokio::test]
async fn an_exception_before_content_fails_over_and_after_commit_ends_the_stream() {
    let (bedrock, backup, proxy) = setup(Some(Flavor::Anthropic)).await;
    let backup = backup.unwrap();
    for b in [Behavior::StreamErrorFirst, Behavior::OpeningThenError] {
        bedrock.push(b);
        let r = proxy.messages("smart", true).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
        let text = r.text().await.unwrap();
        assert_eq!(streamed_text(&text), "Hello from backup.", "{text}");
    }
    assert_eq!(backup.hits(), 2);

    // After the first content: committed, the exception ends the client's stream.
    bedrock.push(Behavior::StreamThen {
        chunks: 2,
        event: "modelStreamErrorException".into(),
    });
    let r = proxy.chat("smart", true).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/br");
    let text = r.text().await.unwrap();
    assert_eq!(streamed_text(&text), "bedrock-0 bedrock-1 ", "{text}");
    assert!(
        text.contains("The model stream failed (simulated)."),
        "{text}"
    );
    assert!(
        !text.contains("[DONE]"),
        "ended by the error, not completed: {text}"
    );
    assert_eq!(backup.hits(), 2, "no failover after commit");
    // A frame over the event limit is refused from its prelude (unit-tested in
    // eventstream); a break mid-stream ends with the proxy's own error event.
    bedrock.push(Behavior::BreakMidStream { chunks: 1 });
    let text = proxy.messages("smart", true).await.text().await.unwrap();
    assert!(text.contains("event: error"), "{text}");
}

/// A ConverseStream frame over `--max-event-bytes` is refused from its prelude: the
/// attempt fails over before commit (class invalidResponse) instead of buffering it.
#[tokio::test]
async fn a_frame_over_the_event_limit_fails_over() {
    let bedrock = SimProvider::start_named("bedrock", Flavor::Bedrock).await;
    let backup = SimProvider::start_named("backup", Flavor::OpenAi).await;
    let manifests = format!(
        "{}{}{}",
        bedrock_credential(
            "br",
            &bedrock,
            BEDROCK_ACCESS_KEY_ID,
            BEDROCK_SECRET_ACCESS_KEY,
            None
        ),
        credential(
            "backup",
            "openai",
            &backup.base_url(),
            "sk-backup-0123456789"
        ),
        route(
            "smart",
            &format!(
                "  targets:\n    - credentialRef: {{ name: br }}\n      model: \"{MODEL}\"\n    - credentialRef: {{ name: backup }}\n"
            ),
        ),
    );
    let limits = UpstreamLimits {
        max_event_bytes: 4096,
        ..Default::default()
    };
    let proxy = TestProxy::start_with_limits(&manifests, limits).await;
    bedrock.push(Behavior::HugeBody { bytes: 1 << 20 });
    let r = proxy.messages("smart", true).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
    assert_eq!(
        streamed_text(&r.text().await.unwrap()),
        "Hello from backup."
    );
    // Frames under the limit still stream.
    let r = proxy.chat("smart", true).await;
    assert_eq!(header(&r, "x-switchback-target"), "team-a/br");
    assert_eq!(
        streamed_text(&r.text().await.unwrap()),
        "Hello from bedrock."
    );
    let stats = proxy.admin_stats().await.to_string();
    assert!(
        stats.contains("eventTooLarge") || stats.contains("invalidResponse"),
        "{stats}"
    );
}

#[tokio::test]
async fn context_length_advances_and_alone_reaches_the_client_in_its_shape() {
    let (bedrock, backup, proxy) = setup(Some(Flavor::OpenAi)).await;
    bedrock.push(Behavior::ContextLength(ContextWording::OpenAi));
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
    assert_eq!(header(&r, "x-switchback-attempts"), "2", "not retried");
    assert_eq!(backup.unwrap().hits(), 1);
    let stats = proxy.admin_stats().await.to_string();
    assert!(stats.contains("contextLength"), "{stats}");

    let (bedrock, _, proxy) = setup(None).await;
    bedrock.push(Behavior::ContextLength(ContextWording::OpenAi));
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 400);
    let body = json_of(r).await;
    assert_eq!(body["error"]["code"], "context_length_exceeded", "{body}");
    assert_eq!(
        body["error"]["message"],
        "Input is too long for requested model."
    );
    bedrock.push(Behavior::ContextLength(ContextWording::OpenAi));
    let body = json_of(proxy.messages("smart", false).await).await;
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("prompt is too long"),
        "{body}"
    );
}

#[tokio::test]
async fn a_bad_signature_or_unknown_key_is_an_auth_error() {
    // The wrong secret: AWS recomputes a different signature.
    let (bedrock, backup, proxy) = setup_with(
        BEDROCK_ACCESS_KEY_ID,
        "not-the-secret",
        None,
        Some(Flavor::OpenAi),
    )
    .await;
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 403, "authError is not in onFailures: returned");
    let body = json_of(r).await;
    // AWS's signature refusal is an authentication failure, in OpenAI's words.
    assert_eq!(body["error"]["code"], "invalid_api_key", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("signature we calculated does not match"),
        "{body}"
    );
    assert_eq!(backup.unwrap().hits(), 0);
    assert_eq!(bedrock.hits(), 1);
    let stats = proxy.admin_stats().await.to_string();
    assert!(stats.contains("authError"), "{stats}");

    let (_bedrock, _, proxy) =
        setup_with("AKIAUNKNOWN", BEDROCK_SECRET_ACCESS_KEY, None, None).await;
    let r = proxy.messages("smart", false).await;
    let status = r.status();
    let body = json_of(r).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["type"], "authentication_error", "{body}");
}

#[tokio::test]
async fn temporary_credentials_sign_their_session_token() {
    let (bedrock, _, proxy) = setup_with(
        BEDROCK_TEMP_ACCESS_KEY_ID,
        BEDROCK_SECRET_ACCESS_KEY,
        Some(BEDROCK_SESSION_TOKEN),
        None,
    )
    .await;
    for stream in [false, true] {
        let r = proxy.chat("smart", stream).await;
        assert_eq!(r.status(), 200);
        let text = r.text().await.unwrap();
        let said = if stream {
            streamed_text(&text)
        } else {
            text.clone()
        };
        assert!(said.contains("Hello from bedrock."), "{text}");
    }
    for r in bedrock.received() {
        assert_eq!(r.headers["x-amz-security-token"], BEDROCK_SESSION_TOKEN);
        let auth = r.headers["authorization"].to_str().unwrap();
        assert!(
            auth.contains("SignedHeaders=content-type;host;x-amz-date;x-amz-security-token,"),
            "{auth}"
        );
    }
    // The same temporary key without its token: refused as AWS refuses it.
    let (_bedrock, _, proxy) = setup_with(
        BEDROCK_TEMP_ACCESS_KEY_ID,
        BEDROCK_SECRET_ACCESS_KEY,
        None,
        None,
    )
    .await;
    assert_eq!(proxy.chat("smart", false).await.status(), 403);
}

#[tokio::test]
async fn the_simulator_refuses_what_aws_refuses() {
    let bedrock = SimProvider::start_named("bedrock", Flavor::Bedrock).await;
    let http = reqwest::Client::new();
    let url = format!("{}/model/{MODEL_PATH}/converse", bedrock.base_url());
    let r = http
        .post(&url)
        .json(&json!({"messages": [{"role": "user", "content": [{"text": "hi"}]}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(header(&r, "x-amzn-errortype").starts_with("MissingAuthenticationTokenException"));
    let r = http
        .post(format!("{}/model/{MODEL_PATH}/invoke", bedrock.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(bedrock.hits(), 2, "refused requests still count");
}

#[tokio::test]
async fn no_key_in_logs_or_admin_output() {
    let logs = CapturedLog::default();
    let capture = logs.capture_json_debug();

    let (bedrock, _, proxy) = setup_with(
        BEDROCK_TEMP_ACCESS_KEY_ID,
        BEDROCK_SECRET_ACCESS_KEY,
        Some(BEDROCK_SESSION_TOKEN),
        None,
    )
    .await;
    let mut seen = String::new();
    bedrock.push(Behavior::RateLimited {
        retry_after_secs: 1,
    });
    bedrock.push(Behavior::StreamThen {
        chunks: 1,
        event: "throttlingException".into(),
    });
    // A dropped connection: the proxy logs the transport error (debug).
    bedrock.push(Behavior::Reset);
    for stream in [false, true, false, true, false] {
        let r = proxy.chat("smart", stream).await;
        for (k, v) in r.headers() {
            seen.push_str(&format!("{k}: {v:?}\n"));
        }
        seen.push_str(&r.text().await.unwrap());
    }
    for path in ["/admin/v1/config", "/admin/v1/stats", "/metrics"] {
        seen.push_str(&proxy.admin_text(path).await);
    }
    assert!(
        seen.contains("team-a/br"),
        "the admin output names the credential"
    );
    drop(proxy);
    capture.stop();
    let logs = logs.text();
    assert!(
        logs.contains("upstream transport error"),
        "logs were captured:\n{logs}"
    );
    for secret in [BEDROCK_SECRET_ACCESS_KEY, BEDROCK_SESSION_TOKEN] {
        assert!(
            !logs.contains(secret),
            "a key leaked into the logs:\n{logs}"
        );
        assert!(!seen.contains(secret), "a key leaked:\n{seen}");
    }
}

#[tokio::test]
async fn a_chain_from_azure_through_bedrock_to_anthropic() {
    let azure = SimProvider::start_named("azure", Flavor::Azure).await;
    let bedrock = SimProvider::start_named("bedrock", Flavor::Bedrock).await;
    let anthropic = SimProvider::start_named("anthropic", Flavor::Anthropic).await;
    let manifests = format!(
        "{}{}{}{}",
        credential(
            "az",
            "azure-openai",
            &azure.base_url(),
            "azure-key-0123456789"
        ),
        bedrock_credential(
            "br",
            &bedrock,
            BEDROCK_ACCESS_KEY_ID,
            BEDROCK_SECRET_ACCESS_KEY,
            None
        ),
        credential(
            "ant",
            "anthropic",
            &anthropic.base_url(),
            "sk-ant-0123456789"
        ),
        route(
            "smart",
            &format!(
                "  targets:\n    - credentialRef: {{ name: az }}\n      model: gpt-4o\n    - credentialRef: {{ name: br }}\n      model: \"{MODEL}\"\n    - credentialRef: {{ name: ant }}\n      model: claude\n"
            )
        ),
    );
    let proxy = TestProxy::start(&manifests).await;

    // Azure throttles: Bedrock answers, both surfaces, streamed and not.
    for stream in [false, true] {
        azure.push(Behavior::RateLimited {
            retry_after_secs: 1,
        });
        let r = proxy.messages("smart", stream).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-switchback-target"), "team-a/br");
        let text = r.text().await.unwrap();
        let said = if stream {
            streamed_text(&text)
        } else {
            text.clone()
        };
        assert!(said.contains("Hello from bedrock."), "{text}");
    }
    // Azure parked (Retry-After), Bedrock throttled too: Anthropic answers.
    bedrock.push(Behavior::RateLimited {
        retry_after_secs: 1,
    });
    let r = proxy.chat("smart", true).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/ant");
    assert_eq!(
        streamed_text(&r.text().await.unwrap()),
        "Hello from anthropic."
    );
    assert_eq!(anthropic.hits(), 1);
    assert_eq!(bedrock.hits(), 3);
}
