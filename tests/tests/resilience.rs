//! Resilience state end to end: circuit breakers (open, half-open probe, close,
//! doubling), the all-open rule, concurrency queues, least-latency ordering, and the
//! stats and metrics a scripted run leaves behind. Paused clock throughout. The
//! circuits here are probed by a client request (`probeInterval: 0s`,
//! docs/request-lifecycle.md#probed-circuits); their background probes are `health.rs`'s.

use std::time::Duration;

use serde_json::Value;
use switchback_tests::harness::{TestProxy, credential, header, route};
use switchback_tests::sim::{Behavior, Flavor, SimProvider};

async fn setup_with(extra_cred: &str, spec: &str) -> (SimProvider, SimProvider, TestProxy) {
    let primary = SimProvider::start_named("primary", Flavor::OpenAi).await;
    let backup = SimProvider::start_named("backup", Flavor::OpenAi).await;
    let primary_cred = credential("primary", "openai", &primary.base_url(), "sk-primary").replace(
        "  allowPrivateNetwork: true\n",
        &format!("  allowPrivateNetwork: true\n{extra_cred}"),
    );
    let manifests = format!(
        "{primary_cred}{}{}",
        credential("backup", "openai", &backup.base_url(), "sk-backup"),
        route("smart", spec)
    );
    (primary, backup, TestProxy::start(&manifests).await)
}

const BREAKER: &str =
    "  circuitBreaker: { consecutiveFailures: 2, openFor: 10s, probeInterval: 0s }
  targets:
    - credentialRef: { name: primary }
    - credentialRef: { name: backup }
";

async fn stats(proxy: &TestProxy) -> Value {
    proxy.admin_stats().await
}

async fn circuit(proxy: &TestProxy) -> String {
    stats(proxy).await["routes"][0]["targets"][0]["circuit"]
        .as_str()
        .unwrap()
        .to_string()
}

async fn served_by(proxy: &TestProxy) -> String {
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 200);
    header(&r, "x-switchback-target").to_string()
}

#[tokio::test(start_paused = true)]
async fn the_circuit_opens_probes_once_and_closes() {
    let (primary, backup, proxy) = setup_with("", BREAKER).await;
    primary.set_default(Behavior::ServerError(503));
    assert_eq!(served_by(&proxy).await, "team-a/backup");
    assert_eq!(circuit(&proxy).await, "Closed");
    assert_eq!(served_by(&proxy).await, "team-a/backup");
    assert_eq!(
        circuit(&proxy).await,
        "Open",
        "two failures in a row open it"
    );
    assert_eq!(primary.hits(), 2);

    let r = proxy.chat("smart", false).await;
    assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
    assert_eq!(
        header(&r, "x-switchback-attempts"),
        "1",
        "the open target is skipped, not tried"
    );
    assert_eq!(header(&r, "x-switchback-fallbacks"), "1");
    assert_eq!(primary.hits(), 2);

    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(circuit(&proxy).await, "HalfOpen");
    primary.set_default(Behavior::Answer);
    assert_eq!(
        served_by(&proxy).await,
        "team-a/primary",
        "the probe goes through and succeeds"
    );
    assert_eq!(circuit(&proxy).await, "Closed");
    assert_eq!(served_by(&proxy).await, "team-a/primary");
    assert_eq!(backup.hits(), 3);
}

/// docs/troubleshooting.md#target-states: what a request finds at each target now, as the
/// operator reads it from `/admin/v1/stats`: CircuitOpen with since and until (the probe's
/// time), HalfOpen once that time has come, Ready again after the probe; and the order a
/// request takes.
#[tokio::test(start_paused = true)]
async fn stats_say_what_a_request_finds_at_each_target() {
    let (primary, _backup, proxy) = setup_with("", BREAKER).await;
    let target = |s: &Value, i: usize| s["routes"][0]["targets"][i].clone();
    let s = stats(&proxy).await;
    assert_eq!(target(&s, 0)["state"], "Ready");
    assert_eq!(s["routes"][0]["order"], serde_json::json!([0, 1]));
    primary.set_default(Behavior::ServerError(503));
    served_by(&proxy).await;
    served_by(&proxy).await;
    let s = stats(&proxy).await;
    let t = target(&s, 0);
    assert_eq!(t["state"], "CircuitOpen", "{t}");
    let since: humantime::Timestamp = t["stateSince"].as_str().unwrap().parse().unwrap();
    let until: humantime::Timestamp = t["stateUntil"].as_str().unwrap().parse().unwrap();
    let open_for = std::time::SystemTime::from(until)
        .duration_since(std::time::SystemTime::from(since))
        .unwrap();
    assert!(
        open_for.as_secs_f64() > 9.0 && open_for.as_secs_f64() < 11.0,
        "openFor 10s: {t}"
    );
    assert_eq!(t["fallbacksAwayByReason"]["status5xx"], 2, "{t}");
    assert_eq!(target(&s, 1)["state"], "Ready");

    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(target(&stats(&proxy).await, 0)["state"], "HalfOpen");
    primary.set_default(Behavior::Answer);
    served_by(&proxy).await;
    let t = target(&stats(&proxy).await, 0);
    assert_eq!(t["state"], "Ready", "{t}");
    assert!(t["stateUntil"].is_null());
}

/// A credential whose key is missing is NoKey without any traffic; a 429 with
/// Retry-After parks its target until then.
#[tokio::test(start_paused = true)]
async fn stats_say_no_key_and_parked() {
    let (primary, _backup, proxy) = setup_with("", BREAKER).await;
    primary.set_default(Behavior::RateLimited {
        retry_after_secs: 20,
    });
    assert_eq!(served_by(&proxy).await, "team-a/backup");
    let t = stats(&proxy).await["routes"][0]["targets"][0].clone();
    assert_eq!(t["state"], "Parked", "{t}");
    assert!(t["stateUntil"].is_string(), "{t}");
    tokio::time::sleep(Duration::from_secs(21)).await;
    let t = stats(&proxy).await["routes"][0]["targets"][0].clone();
    assert_eq!(t["state"], "Ready", "the park is over: {t}");

    let keyless = SimProvider::start_named("keyless", Flavor::OpenAi).await;
    let manifests = format!(
        "{}{}",
        credential("keyless", "openai", &keyless.base_url(), "sk-k")
            .replace("key: apiKey }", "key: absent }"),
        route(
            "smart",
            "  targets:\n    - credentialRef: { name: keyless }\n"
        )
    );
    let proxy = TestProxy::start(&manifests).await;
    let t = stats(&proxy).await["routes"][0]["targets"][0].clone();
    assert_eq!(t["state"], "NoKey", "{t}");
}

#[tokio::test(start_paused = true)]
async fn a_failed_probe_reopens_for_twice_as_long() {
    let (primary, _backup, proxy) = setup_with("", BREAKER).await;
    primary.set_default(Behavior::ServerError(503));
    served_by(&proxy).await;
    served_by(&proxy).await;
    assert_eq!(primary.hits(), 2);

    tokio::time::sleep(Duration::from_secs(10)).await;
    served_by(&proxy).await; // the probe fails
    assert_eq!(primary.hits(), 3);
    assert_eq!(circuit(&proxy).await, "Open");

    tokio::time::sleep(Duration::from_secs(10)).await;
    served_by(&proxy).await;
    assert_eq!(primary.hits(), 3, "reopened for 20s, not 10s");

    tokio::time::sleep(Duration::from_secs(10)).await;
    served_by(&proxy).await; // second probe, after 20s
    assert_eq!(primary.hits(), 4);

    tokio::time::sleep(Duration::from_secs(39)).await;
    served_by(&proxy).await;
    assert_eq!(primary.hits(), 4, "then 40s");
    tokio::time::sleep(Duration::from_secs(1)).await;
    served_by(&proxy).await;
    assert_eq!(primary.hits(), 5);
}

#[tokio::test(start_paused = true)]
async fn when_every_circuit_is_open_one_target_is_still_tried() {
    let spec = "  circuitBreaker: { consecutiveFailures: 1, openFor: 60s, probeInterval: 0s }
  targets:
    - credentialRef: { name: primary }
";
    let (primary, _backup, proxy) = setup_with("", spec).await;
    primary.set_default(Behavior::ServerError(500));
    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 502);
    assert_eq!(circuit(&proxy).await, "Open");

    let r = proxy.chat("smart", false).await;
    assert_eq!(r.status(), 503, "its failure answers 503");
    assert_eq!(header(&r, "x-switchback-attempts"), "1");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "no_available_target");
    assert_eq!(primary.hits(), 2);

    primary.set_default(Behavior::Answer);
    let r = proxy.chat("smart", false).await;
    assert_eq!(
        r.status(),
        200,
        "a recovered provider is found without waiting for openFor"
    );
    assert_eq!(
        circuit(&proxy).await,
        "Closed",
        "and its success closes the circuit"
    );
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_fails_over_at_once_without_spending_a_retry() {
    let spec = "  targets:
    - credentialRef: { name: primary }
      retry: { attempts: 3 }
    - credentialRef: { name: backup }
";
    let (primary, backup, proxy) = setup_with("  maxConcurrency: 1\n", spec).await;
    primary.push(Behavior::Answer.after(Duration::from_secs(5)));
    let slow = proxy.spawn_chat("smart");
    primary.wait_hits(1).await;
    let started = tokio::time::Instant::now();
    let r = proxy.chat("smart", false).await;
    assert_eq!(header(&r, "x-switchback-target"), "team-a/backup");
    assert_eq!(header(&r, "x-switchback-attempts"), "1");
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(primary.hits(), 1);
    assert_eq!(
        header(&slow.await.unwrap(), "x-switchback-target"),
        "team-a/primary"
    );
    assert_eq!(backup.hits(), 1);
    let s = stats(&proxy).await;
    assert_eq!(s["routes"][0]["targets"][0]["failures"]["queueFull"], 1);
}

#[tokio::test(start_paused = true)]
async fn a_queued_request_waits_for_a_slot_within_its_budget() {
    let spec = "  timeout: 3s
  targets:
    - credentialRef: { name: primary }
";
    let (primary, _backup, proxy) = setup_with("  maxConcurrency: 1\n  maxQueue: 1\n", spec).await;
    primary.push(Behavior::Answer.after(Duration::from_secs(1)));
    primary.push(Behavior::Answer.after(Duration::from_secs(10)));
    let first = proxy.spawn_chat("smart");
    primary.wait_hits(1).await;
    let second = proxy.spawn_chat("smart"); // queued behind the first, gets the slot after 1s
    tokio::time::sleep(Duration::from_millis(100)).await;
    let third = proxy.chat("smart", false).await; // queue full: nothing else to try
    assert_eq!(third.status(), 503);
    assert_eq!(first.await.unwrap().status(), 200);
    assert_eq!(
        second.await.unwrap().status(),
        504,
        "its upstream call outlives the budget"
    );
    assert_eq!(primary.hits(), 2);
}

#[tokio::test(start_paused = true)]
async fn least_latency_prefers_the_faster_target_and_shifts_when_it_slows() {
    let spec = "  strategy: { mode: least-latency }
  targets:
    - credentialRef: { name: primary }
    - credentialRef: { name: backup }
";
    let (primary, backup, proxy) = setup_with("", spec).await;
    primary.set_default(Behavior::Answer.after(Duration::from_millis(100)));
    backup.set_default(Behavior::Answer.after(Duration::from_millis(300)));
    assert_eq!(
        served_by(&proxy).await,
        "team-a/primary",
        "unmeasured targets first, declared order"
    );
    assert_eq!(
        served_by(&proxy).await,
        "team-a/backup",
        "the other one is still unmeasured"
    );
    for _ in 0..5 {
        assert_eq!(served_by(&proxy).await, "team-a/primary");
    }
    primary.set_default(Behavior::Answer.after(Duration::from_secs(2)));
    let mut shifted_after = None;
    for n in 1..=10 {
        if served_by(&proxy).await == "team-a/backup" {
            shifted_after = Some(n);
            break;
        }
    }
    let n = shifted_after.expect("traffic moves to the faster backup");
    assert!(
        n <= 2,
        "one slow answer is enough to prefer the backup: {n}"
    );
}

#[tokio::test(start_paused = true)]
async fn rate_limits_do_not_make_a_target_look_fast() {
    let spec = "  strategy: { mode: least-latency }
  targets:
    - credentialRef: { name: primary }
    - credentialRef: { name: backup }
";
    let (primary, backup, proxy) = setup_with("", spec).await;
    primary.set_default(Behavior::Answer.after(Duration::from_millis(500)));
    backup.set_default(Behavior::Answer.after(Duration::from_millis(100)));
    served_by(&proxy).await;
    served_by(&proxy).await;
    let before = stats(&proxy).await["routes"][0]["targets"][1]["latency"]["smoothedMs"].clone();
    backup.push(Behavior::RateLimited {
        retry_after_secs: 0,
    });
    backup.push(Behavior::RateLimited {
        retry_after_secs: 0,
    });
    proxy.chat("smart", false).await;
    let after = stats(&proxy).await["routes"][0]["targets"][1]["latency"]["smoothedMs"].clone();
    assert_eq!(before, after, "instant 429s are not latency samples");
}

#[tokio::test(start_paused = true)]
async fn stats_and_metrics_after_a_scripted_run() {
    let spec = "  targets:
    - credentialRef: { name: primary }
      model: up-primary
      retry: { attempts: 2, initialBackoff: 10ms }
    - credentialRef: { name: backup }
      model: up-backup
";
    let (primary, _backup, proxy) = setup_with("", spec).await;
    // 1: answered by primary. 2: primary 503 twice, backup answers. 3: 400 relayed.
    proxy.chat("smart", false).await;
    primary.push(Behavior::ServerError(503));
    primary.push(Behavior::ServerError(503));
    proxy.chat("smart", false).await;
    primary.push(Behavior::Status {
        status: 400,
        body: None,
        retry_after: None,
    });
    assert_eq!(proxy.chat("smart", false).await.status(), 400);

    let s = stats(&proxy).await;
    assert_eq!(s["version"], 1);
    assert_eq!(s["instanceId"].as_str().unwrap().len(), 36);
    assert!(s["startedAt"].as_str().unwrap().ends_with('Z'));
    assert_eq!(s["configGeneration"], 1);
    let r = &s["routes"][0];
    assert_eq!(r["route"]["name"], "smart");
    assert_eq!(
        (r["requests"].as_u64(), r["attempts"].as_u64()),
        (Some(3), Some(5))
    );
    assert_eq!(
        (r["fallbacks"].as_u64(), r["failed"].as_u64()),
        (Some(1), Some(1))
    );
    let p = &r["targets"][0];
    assert_eq!(p["model"], "up-primary");
    assert_eq!(
        (p["requests"].as_u64(), p["attempts"].as_u64()),
        (Some(3), Some(4))
    );
    assert_eq!(
        (p["retries"].as_u64(), p["successes"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(p["failures"]["status5xx"], 2);
    assert_eq!(p["failures"]["clientError"], 1);
    assert_eq!(p["fallbacksAway"], 1);
    assert_eq!(p["lastFailure"]["status"], 400);
    assert_eq!(p["lastFailure"]["reason"], "clientError");
    assert_eq!(p["circuit"], "Closed");
    assert!(p["latency"]["p50Ms"].is_number());
    let b = &r["targets"][1];
    assert_eq!(
        (b["requests"].as_u64(), b["successes"].as_u64()),
        (Some(1), Some(1))
    );

    let metrics = proxy.admin_text("/metrics").await;
    for line in [
        r#"switchback_requests_total{route="team-a/smart",outcome="answered"} 2"#,
        r#"switchback_requests_total{route="team-a/smart",outcome="failed"} 1"#,
        r#"switchback_fallbacks_total{route="team-a/smart"} 1"#,
        r#"switchback_attempts_total{route="team-a/smart",target="team-a/primary",model="up-primary",result="status5xx"} 2"#,
        r#"switchback_attempts_total{route="team-a/smart",target="team-a/backup",model="up-backup",result="success"} 1"#,
        r#"switchback_fallbacks_away_total{route="team-a/smart",target="team-a/primary",model="up-primary",reason="status5xx"} 1"#,
        r#"switchback_tokens_total{route="team-a/smart",target="team-a/primary",model="up-primary",direction="input"} 10"#,
        r#"switchback_circuit_state{target="team-a/primary",model="up-primary",state="closed"} 1"#,
        r#"switchback_request_duration_seconds_count{route="team-a/smart"} 3"#,
        r#"switchback_gateway_overhead_seconds_count{route="team-a/smart"} 3"#,
        r#"switchback_config_generation 1"#,
        r#"switchback_config_reloads_total{result="applied"} 1"#,
    ] {
        assert!(metrics.contains(line), "missing {line}\n{metrics}");
    }
}

/// docs/streaming.md#failback-ramp, the failback ramp: a target whose circuit its probe
/// just closed takes 10 % of its requests, 55 % half way through `rampUp` and all of them
/// at its end; the others go on to the next target as skips with reason `rampingUp`, in the
/// stats and the metrics. Its state stays Ready (the list in
/// docs/troubleshooting.md#target-states has no ramp).
#[tokio::test(start_paused = true)]
async fn a_circuit_closed_by_its_probe_ramps_its_share_back_up() {
    let spec = BREAKER.replace("openFor: 10s,", "openFor: 10s, rampUp: 30s,");
    let (primary, backup, proxy) = setup_with("", &spec).await;
    primary.set_default(Behavior::ServerError(503));
    served_by(&proxy).await;
    served_by(&proxy).await;
    assert_eq!(circuit(&proxy).await, "Open");
    tokio::time::sleep(Duration::from_secs(10)).await;
    primary.set_default(Behavior::Answer);
    assert_eq!(served_by(&proxy).await, "team-a/primary", "the probe");
    let closed = tokio::time::Instant::now();
    let mut shares = Vec::new();
    for at in [0, 15, 30] {
        tokio::time::sleep_until(closed + Duration::from_secs(at)).await;
        let mut first = 0;
        for _ in 0..100 {
            first += usize::from(served_by(&proxy).await == "team-a/primary");
        }
        shares.push(first);
    }
    assert_eq!(shares, [10, 55, 100], "of 100 requests at 0 s, 15 s, 30 s");
    assert_eq!(backup.hits(), 2 + 90 + 45);

    let t = stats(&proxy).await["routes"][0]["targets"][0].clone();
    assert_eq!(t["state"], "Ready", "{t}");
    assert_eq!(t["circuit"], "Closed");
    assert_eq!(t["failures"]["rampingUp"], 135, "{t}");
    assert_eq!(t["fallbacksAwayByReason"]["rampingUp"], 135, "{t}");
    let metrics = proxy.admin_text("/metrics").await;
    let line = r#"switchback_skips_total{route="team-a/smart",target="team-a/primary",model="",reason="rampingUp"} 135"#;
    assert!(metrics.contains(line), "missing {line}\n{metrics}");
}
