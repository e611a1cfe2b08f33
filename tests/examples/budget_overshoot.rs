//! Budget overshoot (docs/tenancy.md#the-overshoot-measured): how far past one LLMClient's
//! budget N proxy replicas (real `switchback-proxy` processes) and C concurrent clients
//! get, with reservation and without it. A figure, not a test: it prints a table and
//! asserts nothing.
//!
//! ```text
//! cargo run -p switchback-tests --example budget_overshoot
//! OVERSHOOT_CELLS=1x16,3x16,3x64,5x128 cargo run -p switchback-tests --example budget_overshoot
//! ```
//!
//! What it does, for each cell `REPLICASxCLIENTS` of `OVERSHOOT_CELLS` (default
//! `1x16,3x16,3x64`) and each of `--budget-reservation off` and `on`:
//!
//! 1. a simulated OpenAI provider on loopback answers every request with exactly as many
//!    output tokens as its `max_tokens` (`OVERSHOOT_MAX_TOKENS`, default 100) plus the
//!    simulator's 10 prompt tokens, after `OVERSHOOT_ANSWER_MS` (default 300 ms: the
//!    time a provider takes to answer, during which requests pile up in flight);
//! 2. REPLICAS proxies run standalone on the same manifests (one route, one LLMClient
//!    with `budget.tokensPerDay: OVERSHOOT_BUDGET`, default 20000), each with
//!    `--replicas REPLICAS`, so each enforces 1/REPLICAS of the budget, exactly as the
//!    operator's rendering splits it in a cluster;
//! 3. CLIENTS client loops send `max_tokens` requests round-robin over the replicas as
//!    fast as answers come, each stopping once every replica refused it in a row (429
//!    `budget_exhausted`), or after 120 s;
//! 4. the tokens counted are summed over the replicas' `/admin/v1/stats` (what the
//!    operator sums into `status.usage`), and compared with the budget.
//!
//! Columns: `upstream` requests the provider received, `counted` tokens counted by the
//! replicas, `overshoot` counted minus the budget (negative: left unspent, the last
//! shares too small for one more reservation), `refused` 429 answers. The binaries are
//! built in this example's profile (counts do not depend on it).

use std::time::Duration;

use serde_json::{Value, json};
use switchback_tests::binaries::{Process, build, build_release};
use switchback_tests::harness::{credential, route};
use switchback_tests::sim::{Behavior, Flavor, SimProvider};

const KEY: &str = "sk-overshoot-client-0123456789";

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One cell's outcome.
struct Run {
    upstream: usize,
    counted: u64,
    refused: u64,
    seconds: f64,
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let budget = env_u64("OVERSHOOT_BUDGET", 20_000);
    let max_tokens = env_u64("OVERSHOOT_MAX_TOKENS", 100);
    let answer_ms = env_u64("OVERSHOOT_ANSWER_MS", 300);
    let cells: Vec<(usize, usize)> = std::env::var("OVERSHOOT_CELLS")
        .unwrap_or_else(|_| "1x16,3x16,3x64".into())
        .split(',')
        .filter_map(|c| {
            let (r, n) = c.trim().split_once('x')?;
            Some((r.parse().ok()?, n.parse().ok()?))
        })
        .collect();
    let bin = if cfg!(debug_assertions) {
        build()
    } else {
        build_release()
    };
    println!(
        "budget {budget} tokens/day; each request max_tokens {max_tokens}, answered with all \
         of them (+10 prompt tokens) after {answer_ms} ms"
    );
    println!(
        "{:>8} {:>7} {:>11} {:>8} {:>8} {:>10} {:>8} {:>6}",
        "replicas", "clients", "reservation", "upstream", "counted", "overshoot", "refused", "s"
    );
    for (replicas, clients) in cells {
        for reservation in ["off", "on"] {
            let run = run(
                &bin,
                replicas,
                clients,
                reservation,
                budget,
                max_tokens,
                answer_ms,
            )
            .await;
            let overshoot = run.counted as i64 - budget as i64;
            println!(
                "{replicas:>8} {clients:>7} {reservation:>11} {:>8} {:>8} {:>+10} {:>8} {:>6.1}",
                run.upstream, run.counted, overshoot, run.refused, run.seconds
            );
        }
    }
}

async fn run(
    bin: &std::path::Path,
    replicas: usize,
    clients: usize,
    reservation: &str,
    budget: u64,
    max_tokens: u64,
    answer_ms: u64,
) -> Run {
    let sim = SimProvider::start_named("sim", Flavor::OpenAi).await;
    sim.set_recording(false);
    let words = (0..max_tokens).map(|i| format!("w{i}")).collect::<Vec<_>>();
    sim.set_default(Behavior::AnswerText(words.join(" ")).after(Duration::from_millis(answer_ms)));
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("switchback.yaml");
    std::fs::write(
        &manifests,
        [
            credential("sim", "openai", &sim.base_url(), "sk-sim"),
            route("smart", "  targets:\n    - credentialRef: { name: sim }\n"),
            format!(
                "---\napiVersion: v1\nkind: Secret\nmetadata: {{ name: app-llm, namespace: team-a }}\n\
                 stringData: {{ apiKey: \"{KEY}\" }}\n---\napiVersion: switchback.dev/v1alpha1\n\
                 kind: LLMClient\nmetadata: {{ name: app, namespace: team-a }}\nspec:\n  \
                 keySecretRef: {{ name: app-llm, key: apiKey }}\n  budget: {{ tokensPerDay: {budget} }}\n"
            ),
        ]
        .concat(),
    )
    .unwrap();
    let mut proxies: Vec<(Process, String, String)> = (0..replicas)
        .map(|i| {
            let log = dir.path().join(format!("proxy-{i}.log"));
            let n = replicas.to_string();
            let (p, [data, admin]) = Process::start_proxy(
                &bin.join("switchback-proxy"),
                &manifests,
                &log,
                &[
                    "--threads",
                    "1",
                    "--replicas",
                    &n,
                    "--budget-reservation",
                    reservation,
                ],
            );
            (
                p,
                format!("http://127.0.0.1:{data}/v1/chat/completions"),
                format!("http://127.0.0.1:{admin}/admin/v1/stats"),
            )
        })
        .collect();
    let http = reqwest::Client::new();
    let urls: Vec<String> = proxies.iter().map(|p| p.1.clone()).collect();
    let started = std::time::Instant::now();
    let loops = (0..clients).map(|c| {
        let (http, urls) = (http.clone(), urls.clone());
        tokio::spawn(async move {
            let (mut refused, mut in_a_row, mut next) = (0u64, 0usize, c);
            let body = json!({"model": "smart", "max_tokens": max_tokens,
                              "messages": [{"role": "user", "content": "hello"}]});
            while in_a_row < urls.len() && started.elapsed() < Duration::from_secs(120) {
                let url = &urls[next % urls.len()];
                next += 1;
                let Ok(r) = http.post(url).bearer_auth(KEY).json(&body).send().await else {
                    continue;
                };
                if r.status() == 429 {
                    refused += 1;
                    in_a_row += 1;
                } else {
                    in_a_row = 0;
                }
                let _ = r.bytes().await;
            }
            refused
        })
    });
    let refused = futures_util::future::join_all(loops)
        .await
        .into_iter()
        .map(|r| r.unwrap_or(0))
        .sum();
    let seconds = started.elapsed().as_secs_f64();
    let mut counted = 0;
    for (_, _, stats) in &proxies {
        let s: Value = http.get(stats).send().await.unwrap().json().await.unwrap();
        let app = s["clients"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["client"]["name"] == "app"))
            .cloned()
            .unwrap_or_default();
        counted +=
            app["inputTokens"].as_u64().unwrap_or(0) + app["outputTokens"].as_u64().unwrap_or(0);
    }
    for (p, _, _) in &mut proxies {
        p.stop();
    }
    Run {
        upstream: sim.hits(),
        counted,
        refused,
        seconds,
    }
}
