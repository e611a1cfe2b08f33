//! A target that cannot serve a feature is skipped, not an error
//! (docs/translation.md#a-target-that-cannot-serve-a-feature), through the whole pipeline
//! against simulated providers: the skip is `unsupportedFeature` in the attempts list,
//! stats and metrics and the walk goes on; a circuit-open target is still tried when every
//! other one cannot serve the request; only when no target can is the answer a 400 naming
//! the field and each target; and an image or document by URL is fetched for Bedrock within
//! the private-network guard and the answer size limit, or the target is skipped saying
//! why.

use std::net::SocketAddr;

use serde_json::{Value, json};
use switchback_proxy::limits::answers::UpstreamLimits;
use switchback_proxy::pipeline::fetch::{FetchLimits, MediaFetch};
use switchback_tests::harness::{
    NS, TestProxy, bedrock_credential, credential, header, json_of, route,
};
use switchback_tests::sim::{
    BEDROCK_ACCESS_KEY_ID, BEDROCK_SECRET_ACCESS_KEY, Behavior, Flavor, SimProvider,
};

const CLAUDE_ON_BEDROCK: &str = "anthropic.claude-sonnet-4-5-20250929-v1:0";

/// A JSON schema that refers to itself: Gemini and Claude cannot express it.
fn recursive_format() -> Value {
    json!({"type": "json_schema", "json_schema": {"name": "Tree", "strict": true, "schema": {
        "$defs": {"node": {"type": "object", "properties": {
            "title": {"type": "string"},
            "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            "required": ["title", "children"], "additionalProperties": false}},
        "$ref": "#/$defs/node"}}})
}

/// Simulators of `flavors`, named `t0`, `t1`, ..., each a target of route `smart`
/// in that order (`extra` is added to the route's spec).
async fn chain(
    flavors: &[Flavor],
    extra: &str,
    configure: impl FnOnce(&mut switchback_proxy::Options),
) -> (Vec<SimProvider>, TestProxy) {
    let mut sims = Vec::new();
    let mut manifests = String::new();
    let mut targets = String::from("  targets:\n");
    for (i, flavor) in flavors.iter().enumerate() {
        let name = format!("t{i}");
        let sim = SimProvider::start_named(name.clone(), *flavor).await;
        let (credential, model) = match flavor {
            Flavor::Bedrock => (
                bedrock_credential(
                    &name,
                    &sim.base_url(),
                    BEDROCK_ACCESS_KEY_ID,
                    BEDROCK_SECRET_ACCESS_KEY,
                    None,
                ),
                CLAUDE_ON_BEDROCK,
            ),
            Flavor::Gemini => (
                credential(&name, "gemini", &sim.base_url(), "AIzaSim"),
                "gemini-2.5-flash",
            ),
            Flavor::Anthropic => (
                credential(&name, "anthropic", &sim.base_url(), "sk-ant"),
                "claude-sonnet-4-5",
            ),
            _ => (
                credential(&name, "openai", &sim.base_url(), "sk-oa"),
                "gpt-4o",
            ),
        };
        manifests += &credential;
        targets += &format!("    - credentialRef: {{ name: {name} }}\n      model: {model}\n");
        sims.push(sim);
    }
    manifests += &route("smart", &format!("{targets}{extra}"));
    let proxy = TestProxy::start_configured(&manifests, configure).await;
    (sims, proxy)
}

/// The answer an OpenAI target gives to the recursive schema's request.
const TREE: &str = r#"{"title": "Plan", "children": []}"#;

/// An OpenAI client asking for the recursive schema.
async fn ask_for_a_tree(proxy: &TestProxy) -> reqwest::Response {
    proxy
        .post(
            "/v1/chat/completions",
            &json!({"model": "smart", "response_format": recursive_format(),
                "messages": [{"role": "user", "content": "Outline the plan."}]}),
        )
        .await
}

/// A 400's error message.
async fn refusal(r: reqwest::Response) -> String {
    assert_eq!(r.status(), 400);
    let body = json_of(r).await;
    body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn failures(stats: &Value, target: usize) -> Value {
    stats["routes"][0]["targets"][target]["failures"].clone()
}

#[tokio::test]
async fn a_target_that_cannot_serve_a_feature_is_skipped_and_the_walk_goes_on() {
    let (sims, proxy) = chain(
        &[Flavor::Gemini, Flavor::Bedrock, Flavor::OpenAi],
        "",
        |_| {},
    )
    .await;
    sims[2].set_default(Behavior::AnswerText(TREE.into()));
    let r = ask_for_a_tree(&proxy).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), format!("{NS}/t2"));
    assert_eq!(
        header(&r, "x-switchback-fallbacks"),
        "2",
        "skipped ones count"
    );
    assert_eq!(
        header(&r, "x-switchback-attempts"),
        "1",
        "nothing was sent to them"
    );
    let body = json_of(r).await;
    assert_eq!(body["choices"][0]["message"]["content"], TREE);
    assert_eq!((sims[0].hits(), sims[1].hits()), (0, 0));
    // The OpenAI target got the schema as the client sent it (a relay).
    assert_eq!(
        sims[2].received()[0].json.as_ref().unwrap()["response_format"],
        recursive_format()
    );
    let stats = proxy.admin_stats().await;
    for t in [0, 1] {
        assert_eq!(failures(&stats, t)["unsupportedFeature"], 1, "{stats}");
    }
}

#[tokio::test]
async fn when_no_target_can_serve_it_the_answer_is_a_400_naming_the_field_and_each_target() {
    let (sims, proxy) = chain(&[Flavor::Gemini, Flavor::Bedrock], "", |_| {}).await;
    // An Anthropic client: its own error shape, the field as it named it.
    let r = proxy
        .post(
            "/v1/messages",
            &json!({"model": "smart", "max_tokens": 256,
                "messages": [{"role": "user", "content": "Outline the plan."}],
                "output_config": {"format": {"type": "json_schema", "schema": {
                    "type": "object", "additionalProperties": false, "required": ["title"],
                    "properties": {"title": {"type": "string"},
                        "children": {"type": "array", "items": {"$ref": "#"}}}}}}}),
        )
        .await;
    assert_eq!(r.status(), 400);
    assert_eq!(header(&r, "x-switchback-attempts"), "0");
    let body = json_of(r).await;
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    let message = body["error"]["message"].as_str().unwrap();
    assert_eq!(
        message,
        "no target of route team-a/smart can serve this request: \
         team-a/t0: a recursive $ref (#) cannot be served by a Gemini target (output_config.format.schema); \
         team-a/t1: a recursive $ref (#) cannot be served by a Bedrock target (output_config.format.schema)"
    );
    let attempts = body["error"]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2);
    for (a, t) in attempts.iter().zip(["team-a/t0", "team-a/t1"]) {
        assert_eq!(a["target"], t);
        assert_eq!(a["reason"], "unsupportedFeature");
        assert!(a["status"].is_null());
    }
    assert_eq!((sims[0].hits(), sims[1].hits()), (0, 0));
    let metrics = proxy.admin_text("/metrics").await;
    let skipped = |target: &str| {
        metrics.lines().any(|l| {
            l.starts_with("switchback_skips_total")
                && l.contains(&format!("target=\"{NS}/{target}\""))
                && l.contains("reason=\"unsupportedFeature\"")
                && l.ends_with(" 1")
        })
    };
    assert!(skipped("t0") && skipped("t1"), "{metrics}");
}

#[tokio::test]
async fn a_circuit_open_target_is_still_tried_when_the_others_cannot_serve_the_request() {
    let breaker = "  circuitBreaker: { consecutiveFailures: 1, openFor: 60s }\n";
    let (sims, proxy) = chain(&[Flavor::OpenAi, Flavor::Gemini], breaker, |_| {}).await;
    // The first request opens the OpenAI target's circuit; Gemini answers it.
    sims[0].push(Behavior::ServerError(503));
    assert_eq!(proxy.chat("smart", false).await.status(), 200);
    // Now only the open target could express the schema: it is tried anyway.
    sims[0].set_default(Behavior::AnswerText(TREE.into()));
    let r = ask_for_a_tree(&proxy).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), format!("{NS}/t0"));
    assert_eq!(sims[1].hits(), 1, "Gemini was never sent the schema");
}

/// A server of PDFs, counting its requests.
async fn document_server() -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use axum::http::header;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let hits = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    // Every path is a PDF; `/slow/...` answers after ten seconds.
    let app = axum::Router::new().fallback(move |uri: axum::http::Uri| {
        counted.fetch_add(1, Ordering::Relaxed);
        async move {
            if uri.path().starts_with("/slow/") {
                tokio::time::sleep(std::time::Duration::from_secs(10)).await;
            }
            (
                [(header::CONTENT_TYPE, "application/pdf")],
                "%PDF-1.4\n% a report of 40 bytes or so\n",
            )
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, hits)
}

fn document_request(url: &str) -> Value {
    json!({"model": "smart", "max_tokens": 256, "messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "url", "url": url}},
        {"type": "text", "text": "Summarise it."}]}]})
}

#[tokio::test]
async fn a_url_on_a_private_network_is_not_fetched_by_default_and_the_next_target_reads_it() {
    let (docs, fetched) = document_server().await;
    let url = format!("http://{docs}/report.pdf");
    // `--fetch-media public` (the default): a loopback literal is refused before
    // anything is sent; the Anthropic target takes the URL itself.
    let (sims, proxy) = chain(&[Flavor::Bedrock, Flavor::Anthropic], "", |_| {}).await;
    let r = proxy.post("/v1/messages", &document_request(&url)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), format!("{NS}/t1"));
    assert_eq!(fetched.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert_eq!(sims[0].hits(), 0);
    let sent = sims[1].received()[0].json.clone().unwrap();
    assert_eq!(
        sent["messages"][0]["content"][0]["source"]["url"], url,
        "relayed as sent"
    );

    // Bedrock alone: the 400 says why it could not be served.
    let (_, proxy) = chain(&[Flavor::Bedrock], "", |_| {}).await;
    let r = proxy.post("/v1/messages", &document_request(&url)).await;
    let message = refusal(r).await;
    assert!(
        message.contains("a document by URL (the target reads inline bytes only) cannot be served by a Bedrock target; the gateway could not fetch it: a private, loopback or link-local address"),
        "{message}"
    );
    // `--fetch-media off`: not fetched either.
    let (_, proxy) = chain(&[Flavor::Bedrock], "", |o| o.fetch_media = MediaFetch::Off).await;
    let r = proxy.post("/v1/messages", &document_request(&url)).await;
    assert_eq!(r.status(), 400);
    assert_eq!(fetched.load(std::sync::atomic::Ordering::Relaxed), 0);
}

#[tokio::test]
async fn a_fetched_document_is_bounded_by_the_answer_size_limit() {
    let (docs, fetched) = document_server().await;
    let url = format!("http://{docs}/report.pdf");
    let limits = UpstreamLimits {
        max_response_bytes: 16,
        ..UpstreamLimits::default()
    };
    let (sims, proxy) = chain(&[Flavor::Bedrock, Flavor::Anthropic], "", |o| {
        o.fetch_media = MediaFetch::Any;
        o.upstream_limits = limits;
    })
    .await;
    // Streamed: the limit is the unary answers', the Anthropic target streams.
    let mut request = document_request(&url);
    request["stream"] = true.into();
    let r = proxy.post("/v1/messages", &request).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), format!("{NS}/t1"));
    assert_eq!(
        fetched.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "fetched once"
    );
    assert_eq!(sims[0].hits(), 0);
    let metrics = proxy.admin_text("/metrics").await;
    assert!(
        metrics.lines().any(|l| l
            .starts_with("switchback_limit_refusals_total{limit=\"max_response_bytes\"}")
            && l.ends_with(" 1")),
        "{metrics}"
    );
    assert_eq!(
        failures(&proxy.admin_stats().await, 0)["unsupportedFeature"],
        1
    );
}

#[tokio::test]
async fn a_request_has_at_most_max_fetched_urls_fetched_and_each_within_the_fetch_timeout() {
    let (docs, fetched) = document_server().await;
    let limits = FetchLimits {
        timeout: std::time::Duration::from_millis(300),
        max_urls: 1,
    };
    let (sims, proxy) = chain(&[Flavor::Bedrock], "", |o| {
        o.fetch_media = MediaFetch::Any;
        o.fetch_limits = limits;
    })
    .await;
    // Two documents: the second is past --max-fetched-urls.
    let request = json!({"model": "smart", "max_tokens": 256, "messages": [{"role": "user",
        "content": [
            {"type": "document", "source": {"type": "url", "url": format!("http://{docs}/a.pdf")}},
            {"type": "document", "source": {"type": "url", "url": format!("http://{docs}/b.pdf")}},
            {"type": "text", "text": "Compare them."}]}]});
    let r = proxy.post("/v1/messages", &request).await;
    let message = refusal(r).await;
    assert!(
        message.contains("messages[0].content[1].source.url"),
        "{message}"
    );
    assert_eq!(fetched.load(std::sync::atomic::Ordering::Relaxed), 1);
    // A slow one is given up after --fetch-media-timeout.
    let r = proxy
        .post(
            "/v1/messages",
            &document_request(&format!("http://{docs}/slow/c.pdf")),
        )
        .await;
    let message = refusal(r).await;
    assert!(
        message.contains("the gateway could not fetch it: no answer within 300ms"),
        "{message}"
    );
    assert_eq!(sims[0].hits(), 0);
    let metrics = proxy.admin_text("/metrics").await;
    for limit in ["max_fetched_urls", "fetch_media_timeout"] {
        assert!(
            metrics.lines().any(|l| l.starts_with(&format!(
                "switchback_limit_refusals_total{{limit=\"{limit}\"}}"
            )) && l.ends_with(" 1")),
            "{limit}: {metrics}"
        );
    }
}
