//! A fallback keeps the request's meaning
//! (docs/translation.md#translation-one-model-name-across-providers), through the official
//! Python SDKs (`tests/sdk/meaning.py`): structured output by each SDK's `parse` helpers on
//! translated routes (Anthropic, Gemini and Bedrock targets for the OpenAI SDK; OpenAI,
//! Gemini and Bedrock for the Anthropic SDK; unary and streamed) and the Responses API's
//! `text.format` relayed (`responses.parse`), JSON mode through Bedrock's forced tool, a
//! target skipped as `unsupportedFeature` for a schema it cannot express and the 400 when
//! no target can, reasoning (thinking blocks from Gemini and Bedrock, signatures relayed
//! byte for byte, an OpenAI client's effort as Claude's budget), and documents and media
//! sent to Bedrock (a URL fetched by the proxy), Gemini and Vertex. Each simulated provider
//! answers in its real shapes; after the script, the test checks what each one received in
//! its own wire. Without a Python that imports both SDKs the test skips with a note (fails
//! under CI).

use std::net::SocketAddr;

use base64::Engine as _;
use serde_json::{Value, json};
use switchback_proxy::pipeline::fetch::MediaFetch;
use switchback_tests::harness::{
    NS, TestProxy, bedrock_credential, credential, route, sdk_python, sdk_script, vertex_credential,
};
use switchback_tests::sim::{
    BEDROCK_ACCESS_KEY_ID, BEDROCK_SECRET_ACCESS_KEY, Behavior, Flavor, Received, SimProvider,
};

const EVENT: &str =
    r#"{"name": "Science fair", "date": "Friday", "participants": ["Alice", "Bob"]}"#;
const CONTACT: &str = r#"{"name": "Jane Doe", "email": "jane@example.com", "plan_interest": "Pro", "demo_requested": true}"#;
const TREE: &str = r#"{"title": "Plan", "children": [{"title": "Step", "children": []}]}"#;
/// Bedrock's signature over Claude's reasoning (`reasoningText.signature`).
const SIGNATURE: &str = "ErcBCkgIBhABGAIiQHqG2Yk3hJ0i4vS1m1lWq6x0i9d8ZVdU0tQb0H1m2n3o4p5q6r7s8t9u0v1w2x3y4z5A6B7C8D9E0F1G2H3I4J5K6L7M8N9O0P";
const REASONING: &str = "25 primes lie below 100: 2, 3, 5, 7, 11 ...";
const THOUGHT: &str =
    "**Counting primes**\n\nI list the primes below ten, then extend to a hundred.";
const PDF: &[u8] = b"%PDF-1.4\n% simulated report\n%%EOF\n";
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";

/// A Gemini answer whose first part is a thought summary (`includeThoughts`), as
/// `generateContent` returns it, and the same streamed in three chunks.
fn gemini_thoughts() -> Behavior {
    let usage = |c: u64| json!({"promptTokenCount": 12, "candidatesTokenCount": c, "totalTokenCount": 412 + c, "thoughtsTokenCount": 400});
    let chunk = |parts: Value, finish: Option<&str>, c: u64| {
        let mut cand = json!({"content": {"parts": parts, "role": "model"}, "index": 0});
        if let Some(f) = finish {
            cand["finishReason"] = f.into();
        }
        json!({"candidates": [cand], "usageMetadata": usage(c), "modelVersion": "gemini-2.5-flash", "responseId": "th0ughts1"})
    };
    Behavior::Replay {
        unary: chunk(
            json!([{"text": THOUGHT, "thought": true},
                {"text": "There are 25 primes below 100.", "thoughtSignature": "CiIBVKhc7oW0q8vO1m9XrKc3"}]),
            Some("STOP"),
            9,
        ),
        events: vec![
            chunk(json!([{"text": THOUGHT, "thought": true}]), None, 0),
            chunk(
                json!([{"text": "There are 25 primes", "thoughtSignature": "CiIBVKhc7oW0q8vO1m9XrKc3"}]),
                None,
                5,
            ),
            chunk(json!([{"text": " below 100."}]), Some("STOP"), 9),
        ],
    }
}

/// A Converse answer that reasons first (Claude on Bedrock: `reasoningContent` with
/// its signature), unary and as ConverseStream events.
fn bedrock_reasoning() -> Behavior {
    let usage = json!({"inputTokens": 48, "outputTokens": 230, "totalTokens": 278});
    Behavior::Replay {
        unary: json!({"output": {"message": {"role": "assistant", "content": [
            {"reasoningContent": {"reasoningText": {"text": REASONING, "signature": SIGNATURE}}},
            {"text": "There are 25 primes below 100."}]}},
            "stopReason": "end_turn", "usage": usage, "metrics": {"latencyMs": 4021}}),
        events: vec![
            json!({"messageStart": {"role": "assistant"}}),
            json!({"contentBlockDelta": {"contentBlockIndex": 0, "delta": {"reasoningContent": {"text": "25 primes lie below 100:"}}}}),
            json!({"contentBlockDelta": {"contentBlockIndex": 0, "delta": {"reasoningContent": {"text": " 2, 3, 5, 7, 11 ..."}}}}),
            json!({"contentBlockDelta": {"contentBlockIndex": 0, "delta": {"reasoningContent": {"signature": SIGNATURE}}}}),
            json!({"contentBlockStop": {"contentBlockIndex": 0}}),
            json!({"contentBlockDelta": {"contentBlockIndex": 1, "delta": {"text": "There are 25 primes below 100."}}}),
            json!({"contentBlockStop": {"contentBlockIndex": 1}}),
            json!({"messageStop": {"stopReason": "end_turn"}}),
            json!({"metadata": {"usage": usage, "metrics": {"latencyMs": 4021}}}),
        ],
    }
}

/// A server holding one PDF at `/report.pdf`, for the Bedrock route to fetch.
async fn document_server() -> SocketAddr {
    use axum::http::header;
    let app = axum::Router::new().route(
        "/report.pdf",
        axum::routing::get(|| async { ([(header::CONTENT_TYPE, "application/pdf")], PDF) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

fn body(r: &Received) -> &Value {
    r.json.as_ref().expect("a JSON body")
}

struct Sims {
    list: Vec<(String, SimProvider)>,
}

impl Sims {
    fn get(&self, name: &str) -> &SimProvider {
        &self.list.iter().find(|(n, _)| n == name).expect(name).1
    }
}

async fn sims() -> Sims {
    let mut list = Vec::new();
    for (name, flavor) in [
        ("so-claude", Flavor::Anthropic),
        ("so-gemini", Flavor::Gemini),
        ("so-bedrock", Flavor::Bedrock),
        ("so-gpt", Flavor::OpenAi),
        ("so-responses", Flavor::OpenAi),
        ("so-json-bedrock", Flavor::Bedrock),
        ("skip-gemini", Flavor::Gemini),
        ("skip-gpt", Flavor::OpenAi),
        ("think-gemini", Flavor::Gemini),
        ("think-bedrock", Flavor::Bedrock),
        ("docs-bedrock", Flavor::Bedrock),
        ("docs-gemini", Flavor::Gemini),
        ("docs-vertex", Flavor::Vertex),
    ] {
        list.push((
            name.to_owned(),
            SimProvider::start_named(name, flavor).await,
        ));
    }
    let s = Sims { list };
    s.get("so-claude")
        .set_default(Behavior::AnswerText(EVENT.into()));
    for sim in ["so-gemini", "so-bedrock"] {
        // The OpenAI SDK's parse first, the Anthropic SDK's after.
        s.get(sim).push(Behavior::AnswerText(EVENT.into()));
        s.get(sim).push(Behavior::AnswerText(CONTACT.into()));
    }
    s.get("so-gpt")
        .set_default(Behavior::AnswerText(CONTACT.into()));
    s.get("so-responses")
        .set_default(Behavior::AnswerText(EVENT.into()));
    s.get("so-json-bedrock").set_default(Behavior::tool_call(
        "switchback_json_answer",
        json!({"name": "Grace Hopper", "year": 1952}),
    ));
    s.get("skip-gpt")
        .set_default(Behavior::AnswerText(TREE.into()));
    s.get("think-gemini").set_default(gemini_thoughts());
    let bedrock = s.get("think-bedrock");
    bedrock.push(bedrock_reasoning());
    bedrock.push(bedrock_reasoning());
    bedrock.push(Behavior::AnswerText("15 primes lie below 50.".into()));
    bedrock.push(Behavior::AnswerText(
        "There are 25 primes below 100.".into(),
    ));
    s
}

fn manifests(s: &Sims) -> String {
    let mut m = String::new();
    for (name, sim) in &s.list {
        m += &match sim.flavor() {
            Flavor::Bedrock => bedrock_credential(
                name,
                &sim.base_url(),
                BEDROCK_ACCESS_KEY_ID,
                BEDROCK_SECRET_ACCESS_KEY,
                None,
            ),
            Flavor::Vertex => vertex_credential(name, &sim.base_url(), &sim.service_account_json()),
            Flavor::Gemini => credential(name, "gemini", &sim.base_url(), "AIzaSim-meaning"),
            Flavor::Anthropic => credential(name, "anthropic", &sim.base_url(), "sk-ant-meaning"),
            _ => credential(name, "openai", &sim.base_url(), "sk-meaning"),
        };
    }
    let targets = |ts: &[(&str, &str)]| {
        let mut spec = String::from("  targets:\n");
        for (cred, model) in ts {
            spec += &format!("    - credentialRef: {{ name: {cred} }}\n      model: {model}\n");
        }
        spec
    };
    let claude = "anthropic.claude-sonnet-4-5-20250929-v1:0";
    for (r, ts) in [
        ("so-claude", vec![("so-claude", "claude-sonnet-4-5")]),
        ("so-gemini", vec![("so-gemini", "gemini-2.5-flash")]),
        ("so-bedrock", vec![("so-bedrock", claude)]),
        ("so-gpt", vec![("so-gpt", "gpt-4o")]),
        ("so-responses", vec![("so-responses", "gpt-4o")]),
        ("so-json-bedrock", vec![("so-json-bedrock", claude)]),
        (
            "so-skip",
            vec![("skip-gemini", "gemini-2.5-flash"), ("skip-gpt", "gpt-4o")],
        ),
        (
            "so-none",
            vec![
                ("skip-gemini", "gemini-2.5-flash"),
                ("so-claude", "claude-sonnet-4-5"),
            ],
        ),
        ("think-gemini", vec![("think-gemini", "gemini-2.5-flash")]),
        ("think-bedrock", vec![("think-bedrock", claude)]),
        ("docs-bedrock", vec![("docs-bedrock", claude)]),
        ("docs-gemini", vec![("docs-gemini", "gemini-2.5-flash")]),
        ("docs-vertex", vec![("docs-vertex", "gemini-2.5-flash")]),
    ] {
        m += &route(r, &targets(&ts));
    }
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_sdks_keep_the_meaning_across_providers() {
    let Some(python) = sdk_python() else {
        return;
    };
    let s = sims().await;
    let docs = document_server().await;
    let doc_url = format!("http://{docs}/report.pdf");
    // The document server is on loopback, as every simulator: fetch from any address.
    let proxy =
        TestProxy::start_configured(&manifests(&s), |o| o.fetch_media = MediaFetch::Any).await;
    let got = sdk_script(
        &python,
        &proxy,
        "meaning.py",
        &[("SWITCHBACK_DOC", &doc_url)],
    )
    .await;
    let event: Value = serde_json::from_str(EVENT).unwrap();
    let contact: Value = serde_json::from_str(CONTACT).unwrap();

    structured_output(&s, &got, &event, &contact);
    skipped_for_a_schema(&s, &got, &proxy).await;
    reasoning(&s, &got);
    documents(&s, &doc_url);
}

/// The SDKs' `parse` read the JSON answer of every target; each target was asked in
/// its own mechanism.
fn structured_output(s: &Sims, got: &Value, event: &Value, contact: &Value) {
    for route in ["so-claude", "so-gemini", "so-bedrock"] {
        let o = &got[format!("openai-parse/{route}")];
        assert_eq!(&o["parsed"], event, "{route}: {o}");
        assert_eq!(o["finish_reason"], "stop", "{route}");
    }
    let o = &got["openai-stream/so-claude"];
    assert_eq!(o["deltas"], EVENT, "{o}");
    assert_eq!(&o["parsed"], event);
    for route in ["so-gpt", "so-gemini", "so-bedrock"] {
        let o = &got[format!("anthropic-parse/{route}")];
        assert_eq!(&o["parsed"], contact, "{route}: {o}");
        assert_eq!(o["blocks"], json!(["text"]), "{route}");
        assert_eq!(o["stop_reason"], "end_turn", "{route}");
    }
    let o = &got["anthropic-stream/so-gpt"];
    assert_eq!(o["deltas"], CONTACT, "{o}");
    assert_eq!(&o["parsed"], contact);
    assert_eq!(&got["openai-responses-parse"]["parsed"], event);
    let sent = s.get("so-responses").received();
    let format = &body(&sent[0])["text"]["format"];
    assert_eq!(format["type"], "json_schema", "relayed as sent: {format}");
    assert_eq!(format["name"], "Event");
    let json_answer = json!({"name": "Grace Hopper", "year": 1952});
    for case in ["unary", "stream"] {
        let o = &got[format!("openai-json-object/{case}")];
        assert_eq!(o["json"], json_answer, "{case}: {o}");
        assert_eq!(o["finish_reason"], "stop", "{case}: {o}");
    }
    assert!(got["openai-json-object/unary"]["tool_calls"].is_null());

    // Anthropic: output_config.format, the OpenAI SDK's strict schema, closed.
    let claude = s.get("so-claude").received();
    assert_eq!(
        claude.len(),
        2,
        "parse and stream; never the schema it cannot take"
    );
    let format = &body(&claude[0])["output_config"]["format"];
    assert_eq!(format["type"], "json_schema", "{format}");
    assert_eq!(
        format["schema"]["required"],
        json!(["name", "date", "participants"])
    );
    assert_eq!(format["schema"]["additionalProperties"], false);
    assert_eq!(body(&claude[1])["stream"], true);
    // Gemini: responseMimeType and the JSON Schema as written.
    let gemini = s.get("so-gemini").received();
    for (r, field) in [(&gemini[0], "participants"), (&gemini[1], "demo_requested")] {
        let g = &body(r)["generationConfig"];
        assert_eq!(g["responseMimeType"], "application/json", "{g}");
        assert!(
            g["responseJsonSchema"]["properties"][field].is_object(),
            "{g}"
        );
    }
    // Bedrock: outputConfig.textFormat, the schema as a JSON string.
    let bedrock = s.get("so-bedrock").received();
    for (r, field) in [
        (&bedrock[0], "participants"),
        (&bedrock[1], "demo_requested"),
    ] {
        let tf = &body(r)["outputConfig"]["textFormat"];
        assert_eq!(tf["type"], "json_schema", "{tf}");
        let schema: Value =
            serde_json::from_str(tf["structure"]["jsonSchema"]["schema"].as_str().unwrap())
                .unwrap();
        assert!(schema["properties"][field].is_object(), "{schema}");
    }
    // OpenAI: response_format json_schema, strict where OpenAI takes it as it is.
    let gpt = s.get("so-gpt").received();
    let rf = &body(&gpt[0])["response_format"];
    assert_eq!(rf["type"], "json_schema", "{rf}");
    assert_eq!(rf["json_schema"]["strict"], true, "{rf}");
    assert!(rf["json_schema"]["schema"]["properties"]["email"].is_object());
    // JSON mode on Bedrock: the gateway's tool, forced.
    for r in s.get("so-json-bedrock").received() {
        let tc = &body(&r)["toolConfig"];
        assert_eq!(
            tc["toolChoice"],
            json!({"tool": {"name": "switchback_json_answer"}}),
            "{tc}"
        );
        assert_eq!(
            tc["tools"][0]["toolSpec"]["inputSchema"]["json"]["type"],
            "object"
        );
    }
}

/// A recursive schema: Gemini is skipped (`unsupportedFeature`, counted and
/// shown), OpenAI answers; a route with no target that can express it answers 400
/// naming the field and each target.
async fn skipped_for_a_schema(s: &Sims, got: &Value, proxy: &TestProxy) {
    let o = &got["openai-parse/so-skip"];
    assert_eq!(o["parsed"]["children"][0]["title"], "Step", "{o}");
    assert_eq!(o["target"], format!("{NS}/skip-gpt"));
    assert_eq!(o["fallbacks"], "1");
    assert_eq!(s.get("skip-gemini").hits(), 0, "skipped before sending");
    let gpt = s.get("skip-gpt").received();
    let rf = &body(&gpt[0])["response_format"];
    assert!(
        rf["json_schema"]["schema"].to_string().contains("$ref"),
        "{rf}"
    );

    let o = &got["openai-parse/so-none"];
    assert_eq!(o["status"], 400, "{o}");
    // The SDK keeps the body's `error` object.
    let e = &o["error"];
    assert_eq!(e["param"], "response_format.json_schema.schema", "{e}");
    let message = e["message"].as_str().unwrap();
    for needle in [
        "no target of route team-a/so-none can serve this request",
        "team-a/skip-gemini: a recursive $ref",
        "cannot be served by a Gemini target",
        "team-a/so-claude: a recursive $ref",
        "cannot be served by an Anthropic target",
    ] {
        assert!(message.contains(needle), "{needle:?} in {message}");
    }
    let attempts = e["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{e}");
    assert!(
        attempts.iter().all(|a| a["reason"] == "unsupportedFeature"),
        "{e}"
    );

    let stats = proxy.admin_stats().await;
    let failures = |route: &str, i: usize| {
        let r = stats["routes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| {
                r["route"]["name"] == route || r["route"].as_str() == Some(&format!("{NS}/{route}"))
            })
            .unwrap_or_else(|| panic!("{route} in {stats}"))
            .clone();
        r["targets"][i]["failures"]["unsupportedFeature"].clone()
    };
    assert_eq!(failures("so-skip", 0), 1);
    assert_eq!(failures("so-none", 0), 1);
    assert_eq!(failures("so-none", 1), 1);
    let metrics = proxy.admin_text("/metrics").await;
    let skips = metrics
        .lines()
        .filter(|l| {
            l.starts_with("switchback_skips_total")
                && l.contains("reason=\"unsupportedFeature\"")
                && l.contains("so-skip")
        })
        .collect::<Vec<_>>();
    assert_eq!(skips.len(), 1, "{metrics}");
    assert!(skips[0].ends_with(" 1"), "{}", skips[0]);
}

/// Thinking blocks reach the Anthropic SDK from Gemini (unsigned: an empty
/// signature, never one made up) and Bedrock (its signature byte for byte), unary
/// and streamed; Bedrock gets its signature back in the next turn; each target was
/// asked by its own setting.
fn reasoning(s: &Sims, got: &Value) {
    for case in ["anthropic-think", "anthropic-think-stream"] {
        let blocks = &got[format!("{case}/think-gemini")]["blocks"];
        assert_eq!(blocks[0]["type"], "thinking", "{blocks}");
        assert_eq!(blocks[0]["thinking"], THOUGHT);
        assert_eq!(blocks[0]["signature"], "", "never forged: {blocks}");
        assert_eq!(blocks[1]["text"], "There are 25 primes below 100.");
        let blocks = &got[format!("{case}/think-bedrock")]["blocks"];
        assert_eq!(blocks[0]["thinking"], REASONING, "{blocks}");
        assert_eq!(blocks[0]["signature"], SIGNATURE, "relayed byte for byte");
        assert_eq!(blocks[1]["text"], "There are 25 primes below 100.");
    }
    assert_eq!(
        got["anthropic-think-stream/think-gemini"]["thinking"],
        THOUGHT
    );
    assert_eq!(
        got["anthropic-think-stream/think-bedrock"]["thinking"],
        REASONING
    );
    assert_eq!(
        got["anthropic-think/second-turn"]["text"],
        "15 primes lie below 50."
    );
    assert_eq!(
        got["openai-effort/think-bedrock"]["content"],
        "There are 25 primes below 100."
    );
    for r in s.get("think-gemini").received() {
        let t = &body(&r)["generationConfig"]["thinkingConfig"];
        assert_eq!(
            t,
            &json!({"thinkingBudget": 2048, "includeThoughts": true}),
            "{t}"
        );
    }
    let bedrock = s.get("think-bedrock").received();
    assert_eq!(bedrock.len(), 4);
    for r in &bedrock[..3] {
        let b = body(r);
        assert_eq!(
            b["additionalModelRequestFields"],
            json!({"thinking": {"type": "enabled", "budget_tokens": 2048}}),
            "{b}"
        );
        assert_eq!(b["inferenceConfig"]["maxTokens"], 4096);
    }
    let history = &body(&bedrock[2])["messages"][1]["content"][0];
    assert_eq!(
        history,
        &json!({"reasoningContent": {"reasoningText": {"text": REASONING, "signature": SIGNATURE}}}),
    );
    // The OpenAI SDK's `high` is Claude's 16,384-token budget, with room to answer.
    let b = body(&bedrock[3]);
    assert_eq!(
        b["additionalModelRequestFields"]["thinking"]["budget_tokens"], 16384,
        "{b}"
    );
    assert_eq!(b["inferenceConfig"]["maxTokens"], 16384 + 4096);
}

/// A plain-text document, a document by URL and an image in a tool result, as each
/// target's API takes them: Bedrock inline (the URL fetched by the proxy), Gemini
/// and Vertex by `inlineData` and `fileData`.
fn documents(s: &Sims, doc_url: &str) {
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let bedrock = s.get("docs-bedrock").received();
    assert_eq!(bedrock.len(), 1);
    let m = &body(&bedrock[0])["messages"];
    assert_eq!(
        m[0]["content"][0],
        json!({"document": {"format": "txt", "name": "Colours",
            "source": {"bytes": b64(b"The grass is green.")}}})
    );
    assert_eq!(
        m[0]["content"][1],
        json!({"document": {"format": "pdf", "name": "document-2",
            "source": {"bytes": b64(PDF)}}}),
        "fetched by the proxy"
    );
    let result = &m[2]["content"][0]["toolResult"];
    assert_eq!(result["content"][0], json!({"text": "The chart:"}));
    assert_eq!(
        result["content"][1],
        json!({"image": {"format": "png", "source": {"bytes": PNG}}})
    );
    for name in ["docs-gemini", "docs-vertex"] {
        let got = s.get(name).received();
        let got: Vec<&Received> = got.iter().filter(|r| r.path.contains(':')).collect();
        assert_eq!(got.len(), 1, "{name}");
        let c = &body(got[0])["contents"];
        assert_eq!(
            c[0]["parts"][0],
            json!({"inlineData": {"mimeType": "text/plain", "data": b64(b"The grass is green.")}}),
            "{name}"
        );
        assert_eq!(
            c[0]["parts"][1],
            json!({"fileData": {"mimeType": "application/pdf", "fileUri": doc_url}}),
            "{name}: Google fetches the URL itself"
        );
        let parts = &c[2]["parts"];
        assert_eq!(
            parts[0]["functionResponse"]["name"], "fetch_chart",
            "{name}"
        );
        assert_eq!(
            parts[1],
            json!({"inlineData": {"mimeType": "image/png", "data": PNG}}),
            "{name}"
        );
    }
}
