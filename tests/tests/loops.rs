//! Loops through the gateway (docs/limits.md#no-loops), on the real `switchback-proxy`
//! binary: a credential whose base URL is its own proxy, and two proxies whose
//! credentials point at each other. Every upstream request carries
//! `x-switchback-hops`; a request arriving with `--max-hops` (2) of them is answered
//! 508 `loop_detected` and never sent on, and a 508 from upstream is neither retried
//! nor turned into a 502 that the hop before would retry. So a loop costs three
//! requests, and the routes beside it keep answering.
//!
//! Standalone manifests (`allowPrivateNetwork: true`: the file is the platform's).
//! In-process: the header on every provider adapter's requests, a credential's static
//! header cannot reset it, and the answers to a count at the limit or unreadable.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use switchback_tests::binaries::{Process, build, log_len, metric, proxy_args, scrape};
use switchback_tests::harness::{
    TestProxy, bedrock_credential, chat_body, credential, header, messages_body, route,
    vertex_credential,
};
use switchback_tests::sim::{
    BEDROCK_ACCESS_KEY_ID, BEDROCK_SECRET_ACCESS_KEY, Flavor, Received, SimProvider,
};
use tokio::time::{Instant, sleep, timeout};

/// A route whose one target is the credential `to`, retrying 5xx three times: a
/// gateway's 508 must not be retried all the same.
fn looping_route(name: &str, to: &str) -> String {
    route(
        name,
        &format!(
            "  models: [{name}]\n  timeout: 5s\n  targets:\n    - credentialRef: {{ name: {to} }}\n      retry: {{ attempts: 3 }}\n"
        ),
    )
}

fn plain_route(name: &str, to: &str) -> String {
    route(
        name,
        &format!("  models: [{name}]\n  targets:\n    - credentialRef: {{ name: {to} }}\n"),
    )
}

/// One real proxy on loopback ports, its manifests in `dir`.
struct Proxy {
    process: Process,
    data: u16,
    admin: u16,
    manifest: std::path::PathBuf,
    log: std::path::PathBuf,
}

impl Proxy {
    /// Starts the binary on free ports; `manifests` is given the data port it got.
    fn start(dir: &Path, name: &str, manifests: impl Fn(u16) -> String) -> Proxy {
        let bin = build().join("switchback-proxy");
        let manifest = dir.join(format!("{name}.yaml"));
        let log = dir.join(format!("{name}.log"));
        let (process, [data, admin]) = Process::start_listening(
            "switchback-proxy",
            &bin,
            |[data, admin]: [u16; 2]| {
                std::fs::write(&manifest, manifests(data)).unwrap();
                proxy_args(&manifest, data, admin, &[])
            },
            &log,
            "switchback-proxy serving",
        );
        Proxy {
            process,
            data,
            admin,
            manifest,
            log,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.data)
    }

    fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.data)
    }

    async fn metrics(&self) -> String {
        scrape(self.admin).await
    }

    /// Requests the route `team-a/<route>` has served (every outcome).
    async fn requests(&self, route: &str) -> u64 {
        let prefix = format!("switchback_requests_total{{route=\"team-a/{route}\"");
        self.metrics()
            .await
            .lines()
            .filter(|l| l.starts_with(&prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    async fn refusals(&self, limit: &str) -> u64 {
        let series = format!("switchback_limit_refusals_total{{limit=\"{limit}\"}}");
        let text = self.metrics().await;
        metric(&text, &series).unwrap_or_else(|| panic!("no {series} in /metrics:\n{text}"))
    }

    /// Rewrites the manifests and waits until the proxy has loaded them.
    fn rewrite(&mut self, text: &str) {
        let from = log_len(&self.log);
        std::fs::write(&self.manifest, text).unwrap();
        self.process
            .wait_for_log(from, "config reloaded", Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Requests that reached the proxies for `route` once the counts settle (a storm
/// would keep them growing for a while): those routed, and those refused for their
/// hops before routing (`max_hops`).
async fn settled(proxies: &[&Proxy], route: &str) -> u64 {
    let mut last = u64::MAX;
    loop {
        let mut now = 0;
        for p in proxies {
            now += p.requests(route).await + p.refusals("max_hops").await;
        }
        if now == last {
            return now;
        }
        last = now;
        sleep(Duration::from_millis(300)).await;
    }
}

fn assert_loop_detected(status: u16, body: &Value, anthropic: bool) {
    assert_eq!(status, 508, "{body}");
    if anthropic {
        assert_eq!(body["type"], "error", "{body}");
        assert_eq!(body["error"]["type"], "api_error", "{body}");
    }
    assert_eq!(body["error"]["code"], "loop_detected", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("x-switchback-hops"), "{body}");
}

#[tokio::test]
async fn a_credential_pointing_at_its_own_proxy_costs_three_requests() {
    let sim = SimProvider::start(Flavor::OpenAi).await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::start(dir.path(), "self", |data| {
        [
            credential(
                "self",
                "openai",
                &format!("http://127.0.0.1:{data}/v1"),
                "sk-self",
            ),
            credential(
                "anthropic-self",
                "anthropic",
                &format!("http://127.0.0.1:{data}/v1"),
                "sk-self",
            ),
            credential("good", "openai", &sim.base_url(), "sk-good"),
            looping_route("loop", "self"),
            looping_route("loop-messages", "anthropic-self"),
            plain_route("ok", "good"),
        ]
        .concat()
    });
    let http = reqwest::Client::new();
    // The looping request and a good one at the same time: the good one is served.
    let looping = http
        .post(proxy.url("/v1/chat/completions"))
        .json(&chat_body("loop", false))
        .send();
    let good = http
        .post(proxy.url("/v1/chat/completions"))
        .json(&chat_body("ok", false))
        .send();
    let (looping, good) = timeout(Duration::from_secs(30), async {
        tokio::join!(looping, good)
    })
    .await
    .expect("both are answered");
    let (looping, good) = (looping.unwrap(), good.unwrap());
    assert_eq!(good.status(), 200);
    let status = looping.status().as_u16();
    assert_eq!(header(&looping, "x-switchback-route"), "team-a/loop");
    let body: Value = looping.json().await.unwrap();
    let requests = settled(&[&proxy], "loop").await;
    eprintln!("one request to a route looping through its own proxy: {requests} requests");
    assert_loop_detected(status, &body, false);
    // The client's request, the proxy's to itself (hops 1), and its second one (hops
    // 2), answered 508 and not sent on: three, none retried.
    assert_eq!(requests, 3);
    assert_eq!(proxy.refusals("max_hops").await, 1);

    // The Anthropic API (the request path never names a provider) answers in its shape.
    let r = http
        .post(proxy.url("/v1/messages"))
        .json(&messages_body("loop-messages", false))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap();
    assert_loop_detected(status, &body, true);
    // Three more, the first refusal counted again in `settled`.
    assert_eq!(settled(&[&proxy], "loop-messages").await, 3 + 1);
    assert_eq!(proxy.refusals("max_hops").await, 2);

    // Still serving.
    let r = http
        .post(proxy.url("/v1/chat/completions"))
        .json(&chat_body("ok", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn two_proxies_pointing_at_each_other_cost_three_requests() {
    let sim = SimProvider::start(Flavor::OpenAi).await;
    let dir = tempfile::tempdir().unwrap();
    let manifests = |peer: &str| {
        [
            credential("peer", "openai", peer, "sk-peer"),
            credential("good", "openai", &sim.base_url(), "sk-good"),
            looping_route("loop", "peer"),
            plain_route("ok", "good"),
        ]
        .concat()
    };
    // The first points nowhere until the second is up, then at it.
    let mut first = Proxy::start(dir.path(), "first", |_| manifests("http://127.0.0.1:9/v1"));
    let second = Proxy::start(dir.path(), "second", |_| manifests(&first.base_url()));
    first.rewrite(&manifests(&second.base_url()));

    let started = Instant::now();
    let r = timeout(
        Duration::from_secs(30),
        reqwest::Client::new()
            .post(first.url("/v1/chat/completions"))
            .json(&chat_body("loop", false))
            .send(),
    )
    .await
    .expect("answered")
    .unwrap();
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap();
    let requests = settled(&[&first, &second], "loop").await;
    eprintln!("one request to two proxies pointing at each other: {requests} requests");
    assert_loop_detected(status, &body, false);
    // first (hops 0) -> second (hops 1) -> first (hops 2): 508.
    assert_eq!(requests, 3);
    assert_eq!(first.refusals("max_hops").await, 1);
    assert_eq!(second.refusals("max_hops").await, 0);
    assert!(started.elapsed() < Duration::from_secs(30));
    for p in [&first, &second] {
        let r = reqwest::Client::new()
            .post(p.url("/v1/chat/completions"))
            .json(&chat_body("ok", false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
}

/// The `x-switchback-hops` values a provider request carried.
fn hops(r: &Received) -> Vec<&str> {
    r.headers
        .get_all("x-switchback-hops")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect()
}

/// The last request the simulator received for the model call (not a token exchange).
fn last_call(sim: &SimProvider) -> Received {
    sim.received()
        .into_iter()
        .rev()
        .find(|r| !r.path.contains("token"))
        .unwrap_or_else(|| panic!("{} received no call", sim.name()))
}

#[tokio::test]
async fn every_upstream_request_carries_one_more_hop_whatever_the_provider() {
    let openai = SimProvider::start_named("openai", Flavor::OpenAi).await;
    let anthropic = SimProvider::start_named("anthropic", Flavor::Anthropic).await;
    let azure = SimProvider::start_named("azure", Flavor::Azure).await;
    let gemini = SimProvider::start_named("gemini", Flavor::Gemini).await;
    let bedrock = SimProvider::start_named("bedrock", Flavor::Bedrock).await;
    let vertex = SimProvider::start_named("vertex", Flavor::Vertex).await;
    let target = |cred: &str, model: &str| {
        format!("  targets:\n    - credentialRef: {{ name: {cred} }}\n      model: \"{model}\"\n")
    };
    let manifests = [
        credential(
            "openai",
            "openai",
            &openai.base_url(),
            "sk-openai-0123456789",
        ),
        credential(
            "anthropic",
            "anthropic",
            &anthropic.base_url(),
            "sk-ant-0123456789",
        ),
        credential(
            "azure",
            "azure-openai",
            &azure.base_url(),
            "azure-key-0123456789",
        ),
        credential(
            "gemini",
            "gemini",
            &gemini.base_url(),
            "gemini-key-0123456789",
        ),
        bedrock_credential(
            "bedrock",
            &bedrock.base_url(),
            BEDROCK_ACCESS_KEY_ID,
            BEDROCK_SECRET_ACCESS_KEY,
            None,
        ),
        vertex_credential("vertex", &vertex.base_url(), &vertex.service_account_json()),
        route("openai", &target("openai", "gpt-4o")),
        route("anthropic", &target("anthropic", "claude-sonnet-4-5")),
        route("azure", &target("azure", "gpt-4o")),
        route("gemini", &target("gemini", "gemini-2.5-flash")),
        route(
            "bedrock",
            &target("bedrock", "anthropic.claude-3-5-sonnet-20240620-v1:0"),
        ),
        route("vertex", &target("vertex", "gemini-2.5-flash")),
    ]
    .concat();
    let proxy = TestProxy::start(&manifests).await;
    let sims = [
        ("openai", &openai),
        ("anthropic", &anthropic),
        ("azure", &azure),
        ("gemini", &gemini),
        ("bedrock", &bedrock),
        ("vertex", &vertex),
    ];
    for (model, sim) in sims {
        // From a client: 1. From a gateway that has counted one: 2.
        for (incoming, sent) in [(None, "1"), (Some("1"), "2")] {
            for (path, body) in [
                ("/v1/chat/completions", chat_body(model, false)),
                ("/v1/messages", messages_body(model, true)),
            ] {
                let mut request = proxy.http.post(proxy.url(path)).json(&body);
                if let Some(n) = incoming {
                    request = request.header("x-switchback-hops", n);
                }
                let r = request.send().await.unwrap();
                let status = r.status();
                let text = r.text().await.unwrap();
                assert_eq!(status, 200, "{model} {path}: {text}");
                assert_eq!(hops(&last_call(sim)), [sent], "{model} {path}");
            }
        }
    }
}

#[tokio::test]
async fn a_credentials_static_header_cannot_reset_the_count() {
    let sim = SimProvider::start(Flavor::OpenAi).await;
    let c = credential("p", "openai", &sim.base_url(), "sk-p-0123456789").replacen(
        "  provider: openai\n",
        "  provider: openai\n  headers: { x-switchback-hops: \"0\" }\n",
        1,
    );
    let proxy = TestProxy::start(&[c, plain_route("m", "p")].concat()).await;
    let r = proxy
        .http
        .post(proxy.url("/v1/chat/completions"))
        .header("x-switchback-hops", "1")
        .json(&chat_body("m", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(hops(&last_call(&sim)), ["2"]);
}

#[tokio::test]
async fn a_count_at_the_limit_gets_508_and_an_unreadable_one_400_nothing_sent() {
    let sim = SimProvider::start(Flavor::OpenAi).await;
    let anthropic = SimProvider::start_named("anthropic", Flavor::Anthropic).await;
    let manifests = [
        credential("p", "openai", &sim.base_url(), "sk-p-0123456789"),
        credential("a", "anthropic", &anthropic.base_url(), "sk-a-0123456789"),
        plain_route("m", "p"),
        plain_route("claude", "a"),
    ]
    .concat();
    let proxy = TestProxy::start(&manifests).await;
    let send = |path: &'static str, body: Value, hops: &'static [&'static str]| {
        let mut request = proxy
            .http
            .post(proxy.url(path))
            .header("x-request-id", "loop-1")
            .json(&body);
        for h in hops {
            request = request.header("x-switchback-hops", *h);
        }
        async move {
            let r = request.send().await.unwrap();
            let status = r.status().as_u16();
            assert_eq!(header(&r, "x-request-id"), "loop-1");
            if status != 200 {
                assert_eq!(header(&r, "x-switchback-attempts"), "0");
            }
            (status, r.json::<Value>().await.unwrap())
        }
    };
    for hops in [&["2"][..], &["99999999999999999999999"], &["0", "7"]] {
        let (status, body) = send("/v1/chat/completions", chat_body("m", false), hops).await;
        assert_loop_detected(status, &body, false);
        let (status, body) = send("/v1/messages", messages_body("claude", false), hops).await;
        assert_loop_detected(status, &body, true);
    }
    for hops in [&["-1"][..], &["two"], &["1.5"]] {
        let (status, body) = send("/v1/chat/completions", chat_body("m", false), hops).await;
        assert_eq!(status, 400, "{hops:?}: {body}");
        assert_eq!(body["error"]["code"], "invalid_request");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("x-switchback-hops"), "{body}");
    }
    assert_eq!(sim.hits() + anthropic.hits(), 0, "nothing was sent on");
    let metrics = proxy.admin_text("/metrics").await;
    assert!(
        metrics.contains("switchback_limit_refusals_total{limit=\"max_hops\"} 9\n"),
        "{metrics}"
    );
    // Below the limit it is served.
    let (status, _) = send("/v1/chat/completions", chat_body("m", false), &["1"]).await;
    assert_eq!(status, 200);
}
