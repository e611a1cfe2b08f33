//! First-token hedging through the whole proxy (docs/streaming.md#first-token-hedging): a
//! slow first token is hedged on the next target and the first to commit answers, the
//! other's connection closed (the simulated provider sees it); a fast one is not; at most
//! `maxPercent` of the route's requests are hedged; never past the call's budget. Streams
//! (both APIs) and unary calls. Paused clock throughout.

use std::time::Duration;

use serde_json::Value;
use switchback_tests::harness::{
    CapturedLog, TestProxy, credential, header, route, sdk_python, sdk_stream_script,
};
use switchback_tests::sim::{Behavior, Flavor, SimProvider, answer_text};
use tokio::time::Instant;

/// Held by each test: one at a time, so that no other thread registers a callsite
/// while the log test's thread-local subscriber listens (it would miss its events).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn setup(flavor: Flavor, spec: &str) -> (SimProvider, SimProvider, TestProxy) {
    let provider = match flavor {
        Flavor::OpenAi => "openai",
        Flavor::Anthropic => "anthropic",
        other => unreachable!("{other:?}: not used here"),
    };
    let primary = SimProvider::start_named("primary", flavor).await;
    let backup = SimProvider::start_named("backup", flavor).await;
    let manifests = format!(
        "{}{}{}",
        credential("primary", provider, &primary.base_url(), "sk-primary"),
        credential("backup", provider, &backup.base_url(), "sk-backup"),
        route("smart", spec)
    );
    (primary, backup, TestProxy::start(&manifests).await)
}

const HEDGED: &str = "  hedge: { after: 1500ms, maxPercent: 100 }
  targets:
    - credentialRef: { name: primary }
    - credentialRef: { name: backup }
";

const SLOW: Duration = Duration::from_secs(10);

async fn request(proxy: &TestProxy, flavor: Flavor, stream: bool) -> reqwest::Response {
    match flavor {
        Flavor::Anthropic => proxy.messages("smart", stream).await,
        _ => proxy.chat("smart", stream).await,
    }
}

/// The route's target `i` in `/admin/v1/stats`.
async fn target_stats(proxy: &TestProxy, i: usize) -> Value {
    proxy.admin_stats().await["routes"][0]["targets"][i].clone()
}

/// The slow provider saw its connection closed, no later than 100 ms after `answered`.
async fn disconnected_by(slow: &SimProvider, answered: Instant) {
    tokio::time::timeout(Duration::from_secs(5), slow.wait_cancelled(1))
        .await
        .expect("the slow provider sees its request abandoned");
    let at = slow.cancelled_at()[0];
    assert!(
        at.saturating_duration_since(answered) <= Duration::from_millis(100),
        "disconnected {:?} after the answer",
        at.saturating_duration_since(answered)
    );
}

#[tokio::test(start_paused = true)]
async fn a_slow_first_token_is_hedged_the_backup_answers_and_the_primary_is_disconnected() {
    let _serial = ONE_AT_A_TIME.lock().await;
    for flavor in [Flavor::OpenAi, Flavor::Anthropic] {
        let (primary, backup, proxy) = setup(flavor, HEDGED).await;
        // Headers and the opening's events at once, the first content in 10 s.
        primary.set_default(Behavior::FirstTokenAfter(SLOW));
        let start = Instant::now();
        let r = request(&proxy, flavor, true).await;
        let answered = Instant::now();
        assert_eq!(answered - start, Duration::from_millis(1500), "{flavor:?}");
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
        assert_eq!(header(&r, "x-switchback-attempts"), "2");
        assert_eq!(header(&r, "x-switchback-fallbacks"), "1");
        let text = r.text().await.unwrap();
        for word in answer_text("backup").split_whitespace() {
            assert!(text.contains(word), "{flavor:?}: {text}");
        }
        assert!(!text.contains("primary"), "nothing of the slow one: {text}");
        disconnected_by(&primary, answered).await;
        assert_eq!((primary.hits(), backup.hits()), (1, 1));

        let (slow, fast) = (target_stats(&proxy, 0).await, target_stats(&proxy, 1).await);
        assert_eq!(
            (fast["hedges"].as_u64(), fast["hedgeWins"].as_u64()),
            (Some(1), Some(1))
        );
        assert_eq!(slow["hedges"], 0);
        assert_eq!(slow["failures"]["hedgeLost"], 1, "{slow}");
        assert_eq!(slow["fallbacksAwayByReason"]["hedgeLost"], 1, "{slow}");
        assert_eq!(
            slow["state"], "Ready",
            "a slow provider is not a failing one"
        );
        assert_eq!(proxy.admin_stats().await["routes"][0]["fallbacks"], 1);
        let metrics = proxy.admin_text("/metrics").await;
        for (outcome, n) in [("won", 1), ("lost", 0), ("failed", 0)] {
            let line = format!(
                "switchback_hedges_total{{route=\"team-a/smart\",target=\"team-a/backup\",model=\"\",outcome=\"{outcome}\"}} {n}"
            );
            assert!(metrics.contains(&line), "{line} in\n{metrics}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_slow_unary_answer_is_hedged_and_both_tries_are_in_the_attempt_log() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let (primary, backup, proxy) = setup(Flavor::OpenAi, HEDGED).await;
    primary.set_default(Behavior::FirstTokenAfter(SLOW));
    let captured = CapturedLog::default();
    let capture = captured.capture_json_debug();
    let start = Instant::now();
    let r = proxy.chat("smart", false).await;
    let answered = Instant::now();
    capture.stop();
    assert_eq!(answered - start, Duration::from_millis(1500));
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        body["choices"][0]["message"]["content"],
        answer_text("backup")
    );
    disconnected_by(&primary, answered).await;
    assert_eq!(backup.hits(), 1);

    // The request line: served by the backup, the primary's try cancelled.
    let logs = captured.text();
    let line = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["message"] == "request")
        .unwrap_or_else(|| panic!("no request line:\n{logs}"));
    assert_eq!(line["served_by"], "team-a/backup", "{line}");
    assert_eq!(line["attempts"], 2);
    assert_eq!(line["fallbacks"], 1);
    let log = &line["attempt_log"];
    assert_eq!(log[0]["target"], "team-a/primary", "{line}");
    assert_eq!(log[0]["reason"], "hedgeLost");
    assert_eq!(log[0]["durationMs"], 1500);
}

#[tokio::test(start_paused = true)]
async fn the_primary_answering_first_closes_the_hedges_connection() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let (primary, backup, proxy) = setup(Flavor::OpenAi, HEDGED).await;
    primary.set_default(Behavior::FirstTokenAfter(Duration::from_secs(2)));
    backup.set_default(Behavior::FirstTokenAfter(SLOW));
    let r = proxy.chat("smart", true).await;
    let answered = Instant::now();
    assert_eq!(header(&r, "x-switchback-target"), "team-a/primary");
    assert_eq!(header(&r, "x-switchback-attempts"), "2");
    assert_eq!(header(&r, "x-switchback-fallbacks"), "0");
    assert!(r.text().await.unwrap().contains("primary"));
    disconnected_by(&backup, answered).await;
    let hedge = target_stats(&proxy, 1).await;
    assert_eq!(
        (hedge["hedges"].as_u64(), hedge["hedgeWins"].as_u64()),
        (Some(1), Some(0))
    );
    assert_eq!(hedge["failures"]["hedgeLost"], 1);
    let metrics = proxy.admin_text("/metrics").await;
    assert!(metrics.contains(
        "switchback_hedges_total{route=\"team-a/smart\",target=\"team-a/backup\",model=\"\",outcome=\"lost\"} 1"
    ));
}

#[tokio::test(start_paused = true)]
async fn a_first_token_before_after_is_not_hedged() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let (primary, backup, proxy) = setup(Flavor::OpenAi, HEDGED).await;
    primary.set_default(Behavior::FirstTokenAfter(Duration::from_millis(1400)));
    for stream in [true, false] {
        let r = proxy.chat("smart", stream).await;
        assert_eq!(header(&r, "x-switchback-target"), "team-a/primary");
        assert_eq!(header(&r, "x-switchback-attempts"), "1");
        assert!(r.text().await.unwrap().contains("primary"));
    }
    assert_eq!(backup.hits(), 0, "no hedge");
    assert_eq!(primary.cancelled(), 0);
    assert_eq!(target_stats(&proxy, 1).await["hedges"], 0);
}

#[tokio::test(start_paused = true)]
async fn under_load_at_most_max_percent_of_the_requests_are_hedged() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let spec = HEDGED.replace("maxPercent: 100", "maxPercent: 10");
    let (primary, backup, proxy) = setup(Flavor::OpenAi, &spec).await;
    primary.set_default(Behavior::FirstTokenAfter(Duration::from_secs(3)));
    // A hundred requests at once, every one slow enough to be hedged.
    let requests: Vec<_> = (0..100).map(|_| proxy.spawn_chat("smart")).collect();
    let mut by_backup = 0;
    for r in requests {
        let r = r.await.unwrap();
        assert_eq!(r.status(), 200);
        by_backup += usize::from(header(&r, "x-switchback-target") == "team-a/backup");
    }
    assert!(
        (1..=10).contains(&by_backup),
        "at most 10 % hedged, and some: {by_backup}"
    );
    assert_eq!(backup.hits(), by_backup, "every hedge won");
    let hedge = target_stats(&proxy, 1).await;
    assert_eq!(hedge["hedges"].as_u64(), Some(by_backup as u64));
    assert_eq!(hedge["hedgeWins"].as_u64(), Some(by_backup as u64));
    assert_eq!(primary.hits(), 100);
}

#[tokio::test(start_paused = true)]
async fn a_hedge_never_starts_past_the_calls_budget() {
    let _serial = ONE_AT_A_TIME.lock().await;
    // The primary's own timeout, past the budget, lets it spend all of it (without
    // one it would leave the backup its share, docs/request-lifecycle.md#time-budgets).
    let spec = HEDGED
        .replace("  hedge:", "  timeout: 1500ms\n  hedge:")
        .replace(
            "{ name: primary }\n",
            "{ name: primary }\n      timeout: 10s\n",
        );
    let (primary, backup, proxy) = setup(Flavor::OpenAi, &spec).await;
    primary.set_default(Behavior::FirstTokenAfter(SLOW));
    let start = Instant::now();
    let r = proxy.chat("smart", true).await;
    assert_eq!(start.elapsed(), Duration::from_millis(1500));
    assert_eq!(
        r.status(),
        504,
        "the budget ran out, nothing else was tried"
    );
    assert_eq!(backup.hits(), 0);
    assert_eq!(target_stats(&proxy, 1).await["hedges"], 0);
}

/// The official Python SDKs read a hedged stream as one ordinary answer: the backup's
/// text, whole and once, and nothing of the slow primary, whose connection is closed.
/// Real clock: the SDKs run in a child process; the primary would take 10 s, the hedge
/// starts after 200 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_sdks_read_a_hedged_stream_as_one_answer() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let Some(python) = sdk_python() else {
        return;
    };
    const TEXT: &str = "one two three four five";
    let mut sims = Vec::new();
    let mut manifests = String::new();
    for (name, flavor, provider) in [
        ("chat-primary", Flavor::OpenAi, "openai"),
        ("chat-backup", Flavor::OpenAi, "openai"),
        ("msg-primary", Flavor::Anthropic, "anthropic"),
        ("msg-backup", Flavor::Anthropic, "anthropic"),
    ] {
        let sim = SimProvider::start_named(name, flavor).await;
        manifests.push_str(&credential(name, provider, &sim.base_url(), "sk-test"));
        sims.push(sim);
    }
    for (model, first, second) in [
        ("hedged-chat", "chat-primary", "chat-backup"),
        ("hedged-messages", "msg-primary", "msg-backup"),
    ] {
        manifests.push_str(&route(
            model,
            &format!(
                "  hedge: {{ after: 200ms, maxPercent: 100 }}\n  targets:\n    - credentialRef: {{ name: {first} }}\n    - credentialRef: {{ name: {second} }}\n"
            ),
        ));
    }
    for (slow, fast) in [(0, 1), (2, 3)] {
        sims[slow].set_default(Behavior::FirstTokenAfter(SLOW));
        sims[fast].set_default(Behavior::AnswerText(TEXT.into()));
    }
    let proxy = TestProxy::start(&manifests).await;
    let got = sdk_stream_script(&python, &proxy, "hedged-chat", "hedged-messages").await;
    let o = &got["openai"];
    assert_eq!(
        (&o["text"], &o["deltas"]),
        (&TEXT.into(), &TEXT.into()),
        "{o}"
    );
    assert_eq!(o["finish_reason"], "stop");
    assert_eq!(o["model"], "hedged-chat");
    let a = &got["anthropic"];
    assert_eq!(
        (&a["text"], &a["deltas"]),
        (&TEXT.into(), &TEXT.into()),
        "{a}"
    );
    assert_eq!(a["blocks"], 1, "one text block: {a}");
    assert_eq!(a["model"], "hedged-messages");
    for slow in [&sims[0], &sims[2]] {
        tokio::time::timeout(Duration::from_secs(5), slow.wait_cancelled(1))
            .await
            .expect("each slow primary sees its connection closed");
    }
    for (i, sim) in sims.iter().enumerate() {
        assert_eq!(sim.hits(), 1, "target {i}: one request each");
    }
}
