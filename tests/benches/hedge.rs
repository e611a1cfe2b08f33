//! What first-token hedging (`spec.hedge`, docs/streaming.md#first-token-hedging) costs,
//! through the whole proxy in-process (one thread: load generator, simulated providers and
//! proxy), against the same route without it:
//!
//! - **at 0 %**: the route hedges but its primary answers at once, so no hedge ever
//!   starts: what every request of a hedging route pays (counting it in the route's
//!   sliding window, arming and dropping the timer);
//! - **at the cap**: the primary takes 5 ms, `after` is 2 ms and `maxPercent` 1 or
//!   10, so every request wants a hedge (its timer fires, the budget is asked) and one
//!   in a hundred or in ten gets one (a second upstream request, the race, the slow
//!   try's connection closed, and a new one made for a later request).
//!
//! Prints figures and ratios; asserts nothing but that hedging happened as set.
//!
//! `cargo bench -p switchback-tests --bench hedge` (`HEDGE_BENCH_SECONDS`, default 2,
//! per row; `HEDGE_BENCH_CONCURRENCY`, default 16).

use std::time::{Duration, Instant};

use switchback_tests::harness::{TestProxy, credential, route};
use switchback_tests::sim::{Behavior, Flavor, SimProvider};

const TARGETS: &str = "  targets:
    - credentialRef: { name: primary }
    - credentialRef: { name: backup }
";

struct Row {
    name: &'static str,
    requests: usize,
    per_second: f64,
    p50_us: f64,
    p99_us: f64,
    cpu_us: f64,
    hedged: u64,
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// On-CPU time of this process so far, all threads, from `/proc/self/task/*/schedstat`.
fn cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

fn quantile_us(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * q) as usize).min(sorted.len() - 1);
    sorted[i].as_secs_f64() * 1e6
}

/// Drive `proxy` with `concurrency` closed-loop workers for `seconds` (after a short
/// warm-up), and report.
async fn measure(
    name: &'static str,
    hedge: Option<&str>,
    primary_ms: u64,
    seconds: u64,
    concurrency: usize,
) -> Row {
    let primary = SimProvider::start_named("primary", Flavor::OpenAi).await;
    let backup = SimProvider::start_named("backup", Flavor::OpenAi).await;
    for p in [&primary, &backup] {
        p.set_recording(false);
    }
    if primary_ms > 0 {
        primary.set_default(Behavior::Answer.after(Duration::from_millis(primary_ms)));
    }
    let spec = match hedge {
        Some(h) => format!("  hedge: {h}\n{TARGETS}"),
        None => TARGETS.to_string(),
    };
    let manifests = format!(
        "{}{}{}",
        credential("primary", "openai", &primary.base_url(), "sk-primary"),
        credential("backup", "openai", &backup.base_url(), "sk-backup"),
        route("smart", &spec)
    );
    let proxy = TestProxy::start(&manifests).await;
    let body = switchback_tests::harness::chat_body("smart", false);
    let url = proxy.url("/v1/chat/completions");
    let run = |until: Instant| {
        let (http, url, body) = (proxy.http.clone(), url.clone(), body.clone());
        async move {
            let mut took = Vec::new();
            while Instant::now() < until {
                let t = Instant::now();
                let r = http.post(&url).json(&body).send().await.expect("answered");
                assert_eq!(r.status(), 200);
                r.bytes().await.expect("a body");
                took.push(t.elapsed());
            }
            took
        }
    };
    // Warm-up: connections made, the pools filled.
    let warm = Instant::now() + Duration::from_millis(300);
    futures_util::future::join_all((0..concurrency).map(|_| run(warm))).await;
    let before = proxy.admin_stats().await["routes"][0]["targets"][1]["hedges"]
        .as_u64()
        .unwrap_or(0);
    let (cpu, start) = (cpu_ns(), Instant::now());
    let until = start + Duration::from_secs(seconds);
    let mut took: Vec<Duration> =
        futures_util::future::join_all((0..concurrency).map(|_| run(until)))
            .await
            .into_iter()
            .flatten()
            .collect();
    let (elapsed, cpu) = (start.elapsed(), cpu_ns().saturating_sub(cpu));
    let hedged = proxy.admin_stats().await["routes"][0]["targets"][1]["hedges"]
        .as_u64()
        .unwrap_or(0)
        - before;
    took.sort();
    Row {
        name,
        requests: took.len(),
        per_second: took.len() as f64 / elapsed.as_secs_f64(),
        p50_us: quantile_us(&took, 0.5),
        p99_us: quantile_us(&took, 0.99),
        cpu_us: cpu as f64 / 1e3 / took.len().max(1) as f64,
        hedged,
    }
}

fn print(row: &Row, baseline: Option<&Row>) {
    let vs = baseline.map_or(String::new(), |b| {
        format!(
            "{:>9.2}x {:>+9.0} {:>+9.0}",
            row.cpu_us / b.cpu_us,
            row.p50_us - b.p50_us,
            row.p99_us - b.p99_us
        )
    });
    println!(
        "{:<34} {:>8} {:>9.0} {:>9.0} {:>9.0} {:>9.1} {:>8.1} {}",
        row.name,
        row.requests,
        row.per_second,
        row.p50_us,
        row.p99_us,
        row.cpu_us,
        100.0 * row.hedged as f64 / row.requests.max(1) as f64,
        vs
    );
}

fn main() {
    let seconds = env("HEDGE_BENCH_SECONDS", 2);
    let concurrency = env("HEDGE_BENCH_CONCURRENCY", 16) as usize;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    println!(
        "first-token hedging cost: client, simulated providers and proxy in one thread, \
         {concurrency} closed-loop workers, {seconds} s per row (figures are relative)\n"
    );
    println!(
        "{:<34} {:>8} {:>9} {:>9} {:>9} {:>9} {:>8} {:>10} {:>9} {:>9}",
        "route",
        "requests",
        "req/s",
        "p50 µs",
        "p99 µs",
        "CPU µs",
        "hedged%",
        "CPU ratio",
        "+p50 µs",
        "+p99 µs"
    );
    rt.block_on(async {
        let off = measure("no hedge, primary at once", None, 0, seconds, concurrency).await;
        print(&off, None);
        let zero = measure(
            "hedge 0 % (after 10s)",
            Some("{ after: 10s, maxPercent: 10 }"),
            0,
            seconds,
            concurrency,
        )
        .await;
        print(&zero, Some(&off));
        assert_eq!(
            zero.hedged, 0,
            "a primary that answers at once is never hedged"
        );
        let slow = measure("no hedge, primary 5 ms", None, 5, seconds, concurrency).await;
        print(&slow, None);
        let one = measure(
            "hedge at the cap (after 2ms, 1%)",
            Some("{ after: 2ms, maxPercent: 1 }"),
            5,
            seconds,
            concurrency,
        )
        .await;
        print(&one, Some(&slow));
        let cap = measure(
            "hedge at the cap (after 2ms, 10%)",
            Some("{ after: 2ms, maxPercent: 10 }"),
            5,
            seconds,
            concurrency,
        )
        .await;
        print(&cap, Some(&slow));
        // The route's window also holds the warm-up's requests and hedges.
        let share = cap.hedged as f64 / cap.requests as f64;
        assert!(share > 0.05 && share < 0.11, "about 10 % hedged: {share}");
    });
    println!(
        "\nCPU µs: on-CPU time of the whole process per request (load generator and \
         providers included): the ratio and the added latency are the hedge's."
    );
}
