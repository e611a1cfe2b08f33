//! The fault suite: every way a provider can misbehave that once hurt the proxy
//! (issue 11), each against a route with a healthy backup. Before commit the backup
//! answers 200; after commit the stream ends with the error event. Memory stays
//! bounded: the proxy stops reading an answer at its limit (the simulator sees its
//! client go away) and the process's RSS does not grow with what a provider sends.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use switchback_proxy::limits::answers::UpstreamLimits;
use switchback_tests::harness::{TestProxy, credential, header, route};
use switchback_tests::sim::{
    Behavior, Flavor, SimProvider, Unusable, anthropic_error, anthropic_sse,
};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};

const SPEC: &str = "  targets:
    - credentialRef: { name: primary }
      timeout: 5s
      retry: { attempts: 3, initialBackoff: 1ms, maxBackoff: 2ms }
    - credentialRef: { name: backup }
  fallback: { maxRetryAfter: 10s }
  circuitBreaker: { consecutiveFailures: 2, openFor: 30s }
";

fn provider(flavor: Flavor) -> &'static str {
    match flavor {
        Flavor::OpenAi => "openai",
        Flavor::Azure => "azure-openai",
        Flavor::Gemini => "gemini",
        Flavor::Bedrock => unreachable!("bedrock takes the whole Secret: see tests/bedrock.rs"),
        Flavor::Anthropic => "anthropic",
        Flavor::Vertex => "vertex",
    }
}

fn manifests(primary: &SimProvider, backup: &SimProvider, spec: &str) -> String {
    format!(
        "{}{}{}",
        credential(
            "primary",
            provider(primary.flavor()),
            &primary.base_url(),
            "sk-primary"
        ),
        credential(
            "backup",
            provider(backup.flavor()),
            &backup.base_url(),
            "sk-backup"
        ),
        route("smart", spec)
    )
}

async fn setup_with(
    flavor: Flavor,
    spec: &str,
    limits: UpstreamLimits,
) -> (SimProvider, SimProvider, TestProxy) {
    let primary = SimProvider::start_named("primary", flavor).await;
    let backup = SimProvider::start_named("backup", flavor).await;
    let proxy = TestProxy::start_with_limits(&manifests(&primary, &backup, spec), limits).await;
    (primary, backup, proxy)
}

async fn setup(flavor: Flavor) -> (SimProvider, SimProvider, TestProxy) {
    setup_with(flavor, SPEC, UpstreamLimits::default()).await
}

async fn ask(proxy: &TestProxy, flavor: Flavor, stream: bool) -> reqwest::Response {
    match flavor {
        Flavor::OpenAi | Flavor::Azure | Flavor::Gemini | Flavor::Vertex | Flavor::Bedrock => {
            proxy.chat("smart", stream).await
        }
        Flavor::Anthropic => proxy.messages("smart", stream).await,
    }
}

/// Resident memory of this process (proxy and simulators run in it), in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

async fn metrics(proxy: &TestProxy) -> String {
    proxy.admin_text("/metrics").await
}

/// The value of the sample of `metrics` whose name and labels contain every piece.
fn sample(metrics: &str, pieces: &[&str]) -> Option<u64> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| pieces.iter().all(|p| l.contains(p)))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// The request log lines (`switchback::request`) written on this thread, as field
/// name → value. The harness proxy runs on the test's own runtime, so on the test's
/// thread. One global subscriber keeps them per thread: a scoped one
/// (`set_default`) misses events when other tests of the binary run at once.
struct RequestLines;

thread_local! {
    static LINES: std::cell::RefCell<Vec<BTreeMap<String, String>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

impl RequestLines {
    fn capture() -> RequestLines {
        static INSTALLED: std::sync::Once = std::sync::Once::new();
        INSTALLED.call_once(|| {
            tracing::subscriber::set_global_default(tracing_subscriber::registry().with(LineLayer))
                .expect("no other global subscriber");
        });
        LINES.with(|l| l.borrow_mut().clear());
        RequestLines
    }

    fn all(&self) -> Vec<BTreeMap<String, String>> {
        LINES.with(|l| l.borrow().clone())
    }
}

struct LineLayer;

thread_local! {
    /// Warnings of the proxy (`switchback_proxy::*`) written on this thread.
    static WARNINGS: std::cell::RefCell<Vec<BTreeMap<String, String>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for LineLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let meta = event.metadata();
        let warning =
            *meta.level() == tracing::Level::WARN && meta.target().starts_with("switchback_proxy");
        if meta.target() != "switchback::request" && !warning {
            return;
        }
        struct Fields(BTreeMap<String, String>);
        impl Visit for Fields {
            fn record_debug(&mut self, f: &Field, v: &dyn std::fmt::Debug) {
                self.0.insert(f.name().into(), format!("{v:?}"));
            }
            fn record_str(&mut self, f: &Field, v: &str) {
                self.0.insert(f.name().into(), v.into());
            }
            fn record_u64(&mut self, f: &Field, v: u64) {
                self.0.insert(f.name().into(), v.to_string());
            }
        }
        let mut fields = Fields(BTreeMap::new());
        event.record(&mut fields);
        if warning {
            WARNINGS.with(|l| l.borrow_mut().push(fields.0));
        } else {
            LINES.with(|l| l.borrow_mut().push(fields.0));
        }
    }
}

async fn stats_failures(proxy: &TestProxy, target: &str) -> Value {
    let stats: Value = proxy.admin_stats().await;
    let routes = stats["routes"].as_array().cloned().unwrap_or_default();
    for r in routes {
        for t in r["targets"].as_array().cloned().unwrap_or_default() {
            if t["credential"].to_string().contains(target) {
                return t["failures"].clone();
            }
        }
    }
    panic!("no stats for {target}: {stats}")
}

fn assert_backup_answered(r: &reqwest::Response, what: &str) {
    assert_eq!(r.status(), 200, "{what}");
    assert_eq!(header(r, "x-switchback-target"), "team-a/backup", "{what}");
    assert_eq!(header(r, "x-switchback-fallbacks"), "1", "{what}");
}

// ---- item 5: Retry-After ---------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn an_absurd_retry_after_abandons_the_target_and_parks_it_no_longer_than_the_cap() {
    let (primary, backup, proxy) = setup(Flavor::OpenAi).await;
    primary.push(Behavior::RateLimitedRaw("9223372036854775809".into()));
    let r = proxy.chat("smart", false).await;
    assert_backup_answered(&r, "absurd Retry-After");
    assert_eq!(primary.hits(), 1, "abandoned at once, no retry");
    assert_eq!(backup.hits(), 1);

    // Parked for later requests, but never longer than maxRetryAfter (10s).
    proxy.chat("smart", false).await;
    assert_eq!(primary.hits(), 1, "parked");
    tokio::time::advance(Duration::from_secs(11)).await;
    let r = proxy.chat("smart", false).await;
    assert_eq!(header(&r, "x-switchback-target"), "team-a/primary");
    assert_eq!(primary.hits(), 2, "the park ended at the cap");
}

#[tokio::test(start_paused = true)]
async fn a_huge_retry_after_on_a_503_or_in_ms_never_overflows_a_clock() {
    let (primary, _backup, proxy) = setup(Flavor::OpenAi).await;
    primary.push(Behavior::Status {
        status: 503,
        body: None,
        retry_after: Some("18446744073709551615".into()),
    });
    let r = proxy.chat("smart", false).await;
    assert_backup_answered(&r, "503 with an absurd Retry-After");
    assert_eq!(primary.hits(), 1);
}

#[tokio::test]
async fn a_reload_that_changes_the_target_clears_its_park() {
    let primary = SimProvider::start_named("primary", Flavor::OpenAi).await;
    let backup = SimProvider::start_named("backup", Flavor::OpenAi).await;
    let spec = SPEC.replace("maxRetryAfter: 10s", "maxRetryAfter: 1h");
    let m = manifests(&primary, &backup, &spec);
    let proxy = TestProxy::start(&m).await;
    primary.push(Behavior::RateLimitedRaw("3000".into()));
    assert_backup_answered(&proxy.chat("smart", false).await, "429");
    proxy.chat("smart", false).await;
    assert_eq!(primary.hits(), 1, "parked for 3000s");
    // Key rotation: the same target, made from something else.
    let generation = proxy.admin_config().await["load"]["generation"].as_u64();
    proxy.rewrite(&m.replace("sk-primary", "sk-rotated"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while proxy.admin_config().await["load"]["generation"].as_u64() == generation {
        assert!(tokio::time::Instant::now() < deadline, "reload not applied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = proxy.chat("smart", false).await;
    assert_eq!(header(&r, "x-switchback-target"), "team-a/primary");
    assert_eq!(primary.hits(), 2);
}

// ---- item 1: SSE event size ----------------------------------------------------

#[tokio::test(start_paused = true)]
async fn an_endless_line_after_commit_ends_the_stream_and_frees_the_upstream() {
    let limits = UpstreamLimits {
        max_event_bytes: 256 * 1024,
        ..UpstreamLimits::default()
    };
    let (primary, backup, proxy) = setup_with(Flavor::OpenAi, SPEC, limits).await;
    // Role chunk and one delta, then a line that never ends (128 MiB of it).
    primary.push(Behavior::EndlessLine { events: 2 });
    let before = rss();
    let r = proxy.chat("smart", true).await;
    assert_eq!(r.status(), 200);
    let text = tokio::time::timeout(Duration::from_secs(30), r.text())
        .await
        .expect("the stream ends")
        .unwrap();
    // Only the ends in messages: without the limit the text is the whole line.
    let shown = format!(
        "{} bytes: {:?} … {:?}",
        text.len(),
        &text[..text.len().min(300)],
        &text[text.len().saturating_sub(300)..]
    );
    assert!(text.len() < 1 << 20, "stopped at the limit: {shown}");
    assert!(text.contains("primary"), "the committed content: {shown}");
    assert!(
        text.trim_end().ends_with("}") && text.contains("stream_interrupted"),
        "ends with the error event: {shown}"
    );
    // The proxy let go of the upstream: it stopped reading at the limit.
    tokio::time::timeout(Duration::from_secs(5), primary.wait_cancelled(1))
        .await
        .expect("the proxy dropped the endless stream");
    assert_eq!(backup.hits(), 0, "no fallback after commit");
    // Without the limit the proxy held the whole line, several times over. The
    // bound leaves room for the other tests of this binary running at once.
    assert!(
        rss().saturating_sub(before) < 100 << 20,
        "RSS grew by {} bytes",
        rss().saturating_sub(before)
    );
    let failures = stats_failures(&proxy, "primary").await;
    assert_eq!(failures["eventTooLarge"], 1, "{failures}");
    let m = metrics(&proxy).await;
    let refused = sample(&m, &["switchback_limit_refusals_total", "max_event_bytes"]);
    assert_eq!(refused, Some(1), "{m}");
}

#[tokio::test(start_paused = true)]
async fn an_endless_line_before_any_content_fails_over() {
    for flavor in [Flavor::OpenAi, Flavor::Anthropic] {
        let (primary, _backup, proxy) = setup(flavor).await;
        primary.push(Behavior::EndlessLine { events: 0 });
        let r = ask(&proxy, flavor, true).await;
        assert_backup_answered(&r, &format!("{flavor:?}"));
        assert!(r.text().await.unwrap().contains("backup"));
    }
}

// ---- items 8 and 3: useless 200s ---------------------------------------------------

#[tokio::test(start_paused = true)]
async fn streams_without_content_fail_over() {
    for flavor in [Flavor::OpenAi, Flavor::Anthropic] {
        for b in [Behavior::EmptyStream, Behavior::StreamWithoutContent] {
            let (primary, _backup, proxy) = setup(flavor).await;
            primary.push(b.clone());
            let r = ask(&proxy, flavor, true).await;
            assert_backup_answered(&r, &format!("{flavor:?} {b:?}"));
            let text = r.text().await.unwrap();
            assert!(text.contains("backup"), "{flavor:?} {b:?}: {text}");
            assert_eq!(primary.hits(), 1, "no retry spent: {b:?}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn unusable_unary_200s_fail_over() {
    for flavor in [Flavor::OpenAi, Flavor::Anthropic] {
        for kind in [Unusable::Truncated, Unusable::Html, Unusable::NotJson] {
            let (primary, _backup, proxy) = setup(flavor).await;
            primary.push(Behavior::Unusable(kind));
            let r = ask(&proxy, flavor, false).await;
            assert_backup_answered(&r, &format!("{flavor:?} {kind:?}"));
            assert_eq!(primary.hits(), 1, "no retry spent");
            let failures = stats_failures(&proxy, "primary").await;
            assert_eq!(failures["invalidResponse"], 1, "{failures}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn an_unusable_answer_to_translate_fails_over() {
    // An OpenAI client on an Anthropic primary: the translation has nothing to read.
    let primary = SimProvider::start_named("primary", Flavor::Anthropic).await;
    let backup = SimProvider::start_named("backup", Flavor::OpenAi).await;
    let proxy = TestProxy::start(&manifests(&primary, &backup, SPEC)).await;
    primary.push(Behavior::Unusable(Unusable::Truncated));
    let r = proxy.chat("smart", false).await;
    assert_backup_answered(&r, "untranslatable");
}

#[tokio::test(start_paused = true)]
async fn a_huge_unary_answer_fails_over_without_being_held() {
    let (primary, backup, proxy) = setup(Flavor::OpenAi).await;
    let before = rss();
    // 200 MiB, against the default limit of 32 MiB.
    primary.push(Behavior::HugeBody { bytes: 200 << 20 });
    let r = proxy.chat("smart", false).await;
    assert_backup_answered(&r, "huge body");
    assert!(r.text().await.unwrap().contains("backup"));
    let grown = rss().saturating_sub(before);
    assert!(grown < 120 << 20, "RSS grew by {grown} bytes");
    assert_eq!(backup.hits(), 1);
    let failures = stats_failures(&proxy, "primary").await;
    assert_eq!(failures["responseTooLarge"], 1, "{failures}");
    let m = metrics(&proxy).await;
    let refused = sample(
        &m,
        &["switchback_limit_refusals_total", "max_response_bytes"],
    );
    assert_eq!(refused, Some(1), "{m}");
}

#[tokio::test(start_paused = true)]
async fn an_answer_over_the_limit_is_response_too_large_in_the_attempt_log() {
    let spec = "  targets:
    - credentialRef: { name: primary }
";
    let limits = UpstreamLimits {
        max_response_bytes: 1 << 20,
        ..UpstreamLimits::default()
    };
    let (primary, _backup, proxy) = setup_with(Flavor::OpenAi, spec, limits).await;
    primary.push(Behavior::HugeBody { bytes: 2 << 20 });
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 502);
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        body["error"]["attempts"][0]["reason"], "responseTooLarge",
        "{body}"
    );
    // Just under the limit is an answer.
    primary.push(Behavior::HugeBody { bytes: 900 << 10 });
    assert_eq!(proxy.chat("smart", false).await.status(), 200);
}

#[tokio::test(start_paused = true)]
async fn an_answer_past_the_in_flight_answer_budget_gets_503_without_failing_over() {
    // Room for one answer of about 1 MiB (its buffer may be up to twice that), not
    // for a second one of 2 MiB beside it.
    let limits = UpstreamLimits {
        max_response_bytes: 4 << 20,
        max_inflight_response_bytes: 3 << 20,
        ..UpstreamLimits::default()
    };
    let (primary, backup, proxy) = setup_with(Flavor::OpenAi, SPEC, limits).await;
    let held = |m: &str| sample(m, &["switchback_response_bytes_held"]);
    assert_eq!(held(&metrics(&proxy).await), Some(0));
    // The first answer is held while its last chunk is late.
    primary.push(Behavior::HugeBodyPaused {
        bytes: 1 << 20,
        pause: Duration::from_secs(2),
    });
    let first = proxy.spawn_chat("smart");
    // Everything before the pause read: at least 1 MiB held, and no more growth over
    // many turns of the event loop (the buffer grows by doubling from wherever its
    // first chunk put it, so 1 MiB held can come half-way, while the first answer
    // would still grow into the room the second one is refused for).
    let (mut last, mut steady) = (0, 0);
    while steady < 200 {
        // No timer while waiting: the paused clock must not reach the pause's end.
        let now = held(&metrics(&proxy).await).unwrap_or(0);
        if now >= 1 << 20 && now == last {
            steady += 1;
        } else {
            steady = 0;
        }
        last = now;
        tokio::task::yield_now().await;
    }
    primary.push(Behavior::HugeBody { bytes: 2 << 20 });
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 503, "the second answer does not fit");
    assert_eq!(header(&r, "retry-after"), "1");
    assert_eq!(header(&r, "x-switchback-attempts"), "1");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "overloaded", "{body}");
    assert_eq!(
        body["error"]["attempts"][0]["reason"], "overloaded",
        "{body}"
    );
    assert_eq!(
        backup.hits(),
        0,
        "the replica is short, not the provider: no failover"
    );
    let m = metrics(&proxy).await;
    assert_eq!(
        sample(
            &m,
            &[
                "switchback_limit_refusals_total",
                "max_inflight_response_bytes"
            ]
        ),
        Some(1),
        "{m}"
    );
    let stats = proxy.admin_stats().await;
    assert!(
        !stats.to_string().contains(r#""circuit":"open""#),
        "not a provider failure: {stats}"
    );

    // The first answer was not disturbed, and once it is delivered its bytes are free.
    let first = first.await.unwrap();
    assert_eq!(first.status(), 200);
    assert!(first.text().await.unwrap().len() > 1 << 20);
    assert_eq!(held(&metrics(&proxy).await), Some(0));
    // Now an answer of the first one's size fits again. (Not one of 2 MiB: its buffer,
    // doubled from wherever its first chunk put it, may pass 4 MiB, over the 3 MiB.)
    primary.push(Behavior::HugeBody { bytes: 1 << 20 });
    assert_eq!(proxy.chat("smart", false).await.status(), 200);
    assert_eq!(held(&metrics(&proxy).await), Some(0));
}

// ---- item 9: the commit point ------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn an_in_band_error_after_events_without_content_fails_over() {
    for flavor in [Flavor::OpenAi, Flavor::Anthropic] {
        let (primary, _backup, proxy) = setup(flavor).await;
        primary.push(Behavior::OpeningThenError);
        primary.push(Behavior::OpeningThenError);
        primary.push(Behavior::OpeningThenError);
        let r = ask(&proxy, flavor, true).await;
        assert_backup_answered(&r, &format!("{flavor:?}"));
        let text = r.text().await.unwrap();
        assert!(
            text.contains("backup") && !text.contains("primary"),
            "{text}"
        );
        // Overloaded is like a 529: retried on the primary, until its second
        // failure opens the circuit (consecutiveFailures: 2).
        assert_eq!(primary.hits(), 2);
        if flavor == Flavor::Anthropic {
            assert_eq!(
                text.matches("event: message_start").count(),
                1,
                "one opening: {text}"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn an_in_band_error_after_commit_is_relayed_without_the_key_in_any_spelling() {
    // The key as is and JSON-escaped (`\u002d` for `-`), as a provider may echo it.
    let message = r"invalid key sk-primary (sk\u002dprimary)";
    for flavor in [Flavor::OpenAi, Flavor::Anthropic] {
        let (primary, backup, proxy) = setup(flavor).await;
        let event = match flavor {
            Flavor::OpenAi | Flavor::Azure | Flavor::Gemini | Flavor::Vertex | Flavor::Bedrock => {
                format!(
                    "data: {{\"error\":{{\"message\":\"{message}\",\"type\":\"invalid_request_error\",\"code\":\"invalid_api_key\"}}}}\n\n"
                )
            }
            Flavor::Anthropic => format!(
                "event: error\ndata: {{\"type\":\"error\",\"error\":{{\"type\":\"authentication_error\",\"message\":\"{message}\"}}}}\n\n"
            ),
        };
        primary.push(Behavior::StreamThen { chunks: 5, event });
        let r = ask(&proxy, flavor, true).await;
        assert_eq!(r.status(), 200, "{flavor:?}: committed");
        assert_eq!(header(&r, "x-switchback-target"), "team-a/primary");
        let text = r.text().await.unwrap();
        assert!(
            text.contains("invalid key **** (****)"),
            "{flavor:?}: {text}"
        );
        assert!(
            !text.contains("sk-primary") && !text.contains(r"sk\u002dprimary"),
            "{flavor:?}: {text}"
        );
        assert_eq!(backup.hits(), 0, "{flavor:?}: no fallback after commit");
    }
}

#[tokio::test(start_paused = true)]
async fn in_band_errors_before_commit_are_classified_like_statuses() {
    let too_long = anthropic_sse(
        "error",
        &anthropic_error(
            "invalid_request_error",
            "prompt is too long: 210000 tokens > 200000 maximum",
        ),
    );
    // Echoing the key, as some providers do: masked when relayed.
    let auth = anthropic_sse(
        "error",
        &anthropic_error("authentication_error", "invalid x-api-key: sk-primary"),
    );

    // Context length: advances at once, no retry spent.
    let (primary, backup, proxy) = setup(Flavor::Anthropic).await;
    primary.push(Behavior::OpeningThen(too_long));
    let r = proxy.messages("smart", true).await;
    assert_backup_answered(&r, "context length in the stream");
    assert!(!r.text().await.unwrap().contains("prompt is too long"));
    assert_eq!((primary.hits(), backup.hits()), (1, 1));
    assert_eq!(stats_failures(&proxy, "primary").await["contextLength"], 1);

    // An auth error is the provider's answer to this request: relayed in the stream,
    // as it was sent, after the held-back opening...
    let (primary, backup, proxy) = setup(Flavor::Anthropic).await;
    primary.push(Behavior::OpeningThen(auth.clone()));
    let r = proxy.messages("smart", true).await;
    assert_eq!(header(&r, "x-switchback-target"), "team-a/primary");
    let text = r.text().await.unwrap();
    assert!(
        text.contains("event: message_start") && text.contains("authentication_error"),
        "{text}"
    );
    assert!(
        text.contains("invalid x-api-key: ****") && !text.contains("sk-primary"),
        "{text}"
    );
    assert_eq!((primary.hits(), backup.hits()), (1, 0));
    assert_eq!(stats_failures(&proxy, "primary").await["authError"], 1);

    // ... unless the route opts in.
    let spec = SPEC.replace(
        "fallback: { maxRetryAfter: 10s }",
        "fallback: { maxRetryAfter: 10s, onFailures: [status5xx, authError] }",
    );
    let (primary, backup, proxy) = setup_with(Flavor::Anthropic, &spec, Default::default()).await;
    primary.push(Behavior::OpeningThen(auth));
    let r = proxy.messages("smart", true).await;
    assert_backup_answered(&r, "authError opted in");
    assert_eq!((primary.hits(), backup.hits()), (1, 1));
}

/// A stream's request log line is written when the stream ends, with its real
/// duration and how it ended, not when it is committed.
#[tokio::test(start_paused = true)]
async fn a_streams_request_line_is_written_when_it_ends() {
    let lines = RequestLines::capture();
    let (primary, _backup, proxy) = setup(Flavor::OpenAi).await;
    primary.push(Behavior::Stream {
        chunks: 4,
        interval: Duration::from_secs(3),
    });
    let mut r = proxy.chat("smart", true).await;
    assert_eq!(r.status(), 200);
    r.chunk().await.unwrap().expect("the first content");
    assert!(
        lines.all().is_empty(),
        "written at commit: {:?}",
        lines.all()
    );
    while r.chunk().await.unwrap().is_some() {}
    // The end reaches the client before the proxy's body is dropped: let it finish.
    for _ in 0..100 {
        if !lines.all().is_empty() {
            break;
        }
        tokio::task::yield_now().await;
    }
    let all = lines.all();
    assert_eq!(all.len(), 1, "{all:?}");
    let line = &all[0];
    assert_eq!(line["stream"], "completed", "{line:?}");
    assert_eq!(line["status"], "200");
    let took: u64 = line["duration_ms"].parse().unwrap();
    assert!(
        took >= 12_000,
        "the whole stream (4 events 3s apart): {line:?}"
    );

    // A break after commit: the line says so.
    primary.push(Behavior::BreakMidStream { chunks: 5 });
    let r = proxy.chat("smart", true).await;
    assert!(r.text().await.unwrap().contains("stream_interrupted"));
    for _ in 0..100 {
        if lines.all().len() == 2 {
            break;
        }
        tokio::task::yield_now().await;
    }
    let all = lines.all();
    assert_eq!(all.len(), 2, "{all:?}");
    assert_eq!(all[1]["stream"], "connectionError", "{:?}", all[1]);

    // A unary answer's line has no `stream` field and is written at once.
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 200);
    let all = lines.all();
    assert_eq!(all.len(), 3, "{all:?}");
    assert!(!all[2].contains_key("stream"), "{:?}", all[2]);
}

#[tokio::test(start_paused = true)]
async fn breaks_after_commit_count_for_the_circuit() {
    let (primary, backup, proxy) = setup(Flavor::OpenAi).await;
    for _ in 0..2 {
        primary.push(Behavior::BreakMidStream { chunks: 3 });
        let r = proxy.chat("smart", true).await;
        assert_eq!(header(&r, "x-switchback-target"), "team-a/primary");
        let text = r.text().await.unwrap();
        assert!(text.contains("stream_interrupted"), "{text}");
    }
    // Two failures in a row (consecutiveFailures: 2): the circuit is open.
    let r = proxy.chat("smart", true).await;
    assert_backup_answered(&r, "circuit open");
    assert_eq!(primary.hits(), 2);
    assert_eq!(backup.hits(), 1);
    let failures = stats_failures(&proxy, "primary").await;
    assert_eq!(failures["connectionError"], 2, "{failures}");
    // Failures in the metrics too, not successes; and failed requests of the route.
    let m = metrics(&proxy).await;
    let attempts = |result: &str| {
        sample(
            &m,
            &[
                "switchback_attempts_total",
                "team-a/primary",
                &format!("result=\"{result}\""),
            ],
        )
    };
    assert_eq!(attempts("connectionError"), Some(2), "{m}");
    assert_eq!(attempts("success"), Some(0), "{m}");
    assert_eq!(
        sample(&m, &["switchback_requests_total", "outcome=\"failed\""]),
        Some(2),
        "{m}"
    );
}

// ---- item 12: what of a provider's answer reaches the client -----------------------

/// The fault suite's route, with the primary asked for its own model.
fn spec_with_primary_model() -> String {
    SPEC.replace(
        "credentialRef: { name: primary }\n",
        "credentialRef: { name: primary }\n      model: up-primary\n",
    )
}

#[tokio::test(start_paused = true)]
async fn a_gzip_answer_reaches_the_client_plain_with_its_model_rewritten() {
    for flavor in [Flavor::OpenAi, Flavor::Anthropic] {
        for stream in [false, true] {
            let what = format!("{flavor:?} stream={stream}");
            let (primary, _backup, proxy) = setup_with(
                flavor,
                &spec_with_primary_model(),
                UpstreamLimits::default(),
            )
            .await;
            // Gzips unless asked for identity.
            primary.push(Behavior::Gzip { always: false });
            let r = ask(&proxy, flavor, stream).await;
            assert_eq!(r.status(), 200, "{what}");
            assert_eq!(
                header(&r, "x-switchback-target"),
                "team-a/primary",
                "{what}"
            );
            assert!(r.headers().get("content-encoding").is_none(), "{what}");
            assert_eq!(
                primary.received()[0].header("accept-encoding"),
                Some("identity"),
                "{what}"
            );
            let text = r.text().await.unwrap();
            assert!(
                text.contains("\"model\":\"smart\"") && !text.contains("up-primary"),
                "{what}: {text}"
            );
            if !stream {
                let v: Value = serde_json::from_str(&text).expect("plain JSON");
                assert_eq!(v["model"], "smart", "{what}");
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn an_answer_encoded_against_the_proxys_ask_fails_over() {
    for flavor in [Flavor::OpenAi, Flavor::Anthropic] {
        for stream in [false, true] {
            let what = format!("{flavor:?} stream={stream}");
            let (primary, _backup, proxy) = setup(flavor).await;
            primary.push(Behavior::Gzip { always: true });
            let r = ask(&proxy, flavor, stream).await;
            assert_backup_answered(&r, &what);
            assert!(r.headers().get("content-encoding").is_none(), "{what}");
            assert!(r.text().await.unwrap().contains("backup"), "{what}");
            assert_eq!(primary.hits(), 1, "no retry spent: {what}");
            let failures = stats_failures(&proxy, "primary").await;
            assert_eq!(failures["invalidResponse"], 1, "{what}: {failures}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn only_the_listed_provider_headers_reach_the_client() {
    let (primary, _backup, proxy) = setup(Flavor::OpenAi).await;
    let r = proxy.chat("smart", false).await;
    assert_eq!(header(&r, "x-switchback-target"), "team-a/primary");
    // The provider's id under its own name; `x-request-id` is the client's.
    assert_eq!(header(&r, "x-upstream-request-id"), "req_sim_1");
    assert_eq!(
        primary.received()[0].header("x-request-id"),
        Some(header(&r, "x-request-id"))
    );
    // The simulator sends these (an Anthropic one sends `request-id`).
    let provider_only = ["server", "set-cookie"];
    for name in provider_only {
        assert!(r.headers().get(name).is_none(), "{name} relayed");
    }
}

#[tokio::test(start_paused = true)]
async fn a_provider_error_that_echoes_the_key_is_relayed_masked() {
    let (primary, backup, proxy) = setup(Flavor::OpenAi).await;
    primary.push(Behavior::Status {
        status: 401,
        body: Some(
            r#"{"error":{"message":"Incorrect API key provided: sk-primary. You can find your API key at https://example.com.","type":"invalid_request_error","code":"invalid_api_key"}}"#
                .into(),
        ),
        retry_after: None,
    });
    let r = proxy.chat("smart", false).await;
    // 401 is returned unchanged (authError is not in onFailures)... but for the key.
    assert_eq!(r.status(), 401);
    assert_eq!(backup.hits(), 0);
    let text = r.text().await.unwrap();
    assert!(!text.contains("sk-primary"), "{text}");
    let v: Value = serde_json::from_str(&text).expect("still JSON");
    assert_eq!(
        v["error"]["message"],
        "Incorrect API key provided: **** You can find your API key at https://example.com."
    );
    assert_eq!(v["error"]["code"], "invalid_api_key");
    assert_eq!(primary.hits(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_circuit_opened_line_names_the_model() {
    let _lines = RequestLines::capture();
    WARNINGS.with(|w| w.borrow_mut().clear());
    let (primary, _backup, proxy) = setup_with(
        Flavor::OpenAi,
        &spec_with_primary_model(),
        UpstreamLimits::default(),
    )
    .await;
    primary.set_default(Behavior::ServerError(503));
    // Two 503s in a row (consecutiveFailures: 2) open the circuit.
    assert_backup_answered(&proxy.chat("smart", false).await, "circuit opened");
    let opened = WARNINGS
        .with(|w| w.borrow().clone())
        .into_iter()
        .find(|w| w.get("message").map(String::as_str) == Some("circuit opened"))
        .expect("a circuit-opened line");
    assert_eq!(opened["model"], "up-primary", "{opened:?}");
    assert_eq!(opened["target_credential"], "team-a/primary", "{opened:?}");
}

// ---- the wire: stalls, drips and resets in the body --------------------------------

/// A head then no body, a body one byte a second, a body cut by a reset: before
/// commit, each fails over to the backup (a stall or a drip at the attempt timeout,
/// without a retry; a reset after the retries, or once the circuit opens).
#[tokio::test(start_paused = true)]
async fn body_stalls_drips_and_resets_before_commit_fail_over() {
    for flavor in [Flavor::OpenAi, Flavor::Anthropic] {
        for stream in [false, true] {
            for b in [
                Behavior::HeadersThenStall,
                Behavior::SlowDrip {
                    every: Duration::from_secs(1),
                },
                // Mid-JSON, or mid-way through the first event.
                Behavior::ResetMidBody { after: 20 },
            ] {
                let what = format!("{flavor:?} stream={stream} {b:?}");
                let (primary, _backup, proxy) = setup(flavor).await;
                primary.set_default(b.clone());
                let r = ask(&proxy, flavor, stream).await;
                assert_backup_answered(&r, &what);
                let text = r.text().await.unwrap();
                assert!(text.contains("backup"), "{what}: {text}");
                if !matches!(b, Behavior::ResetMidBody { .. }) {
                    assert_eq!(primary.hits(), 1, "a timeout spends no retry: {what}");
                }
            }
        }
    }
}

/// After commit, a reset of the body ends the stream with the error event.
#[tokio::test(start_paused = true)]
async fn a_reset_after_commit_ends_the_stream_with_the_error_event() {
    for flavor in [Flavor::OpenAi, Flavor::Anthropic] {
        let (primary, backup, proxy) = setup(flavor).await;
        // Everything but the last few bytes: well past the first content event.
        let whole = {
            primary.push(Behavior::Answer);
            ask(&proxy, flavor, true).await.text().await.unwrap().len()
        };
        primary.push(Behavior::ResetMidBody { after: whole - 8 });
        let r = ask(&proxy, flavor, true).await;
        assert_eq!(r.status(), 200, "{flavor:?}");
        assert_eq!(header(&r, "x-switchback-target"), "team-a/primary");
        let text = r.text().await.unwrap();
        let last = text.trim_end().rsplit("\n\n").next().unwrap_or_default();
        let error_event = match flavor {
            Flavor::OpenAi | Flavor::Azure | Flavor::Gemini | Flavor::Vertex | Flavor::Bedrock => {
                last.contains("\"code\":\"stream_interrupted\"")
            }
            Flavor::Anthropic => last.starts_with("event: error\n"),
        };
        assert!(error_event, "{flavor:?} ends with the error event: {text}");
        assert!(
            text.contains("primary"),
            "what came before is relayed: {text}"
        );
        assert_eq!(backup.hits(), 0, "{flavor:?}");
    }
}
