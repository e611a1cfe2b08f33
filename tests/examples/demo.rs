//! The newcomer's demo: no cluster, no provider key. Starts two simulated OpenAI-style
//! providers on loopback (one flaky: it fails two requests out of three), writes the
//! LLMRoute / ProviderCredential / Secret manifests you would `kubectl apply` into a
//! temporary folder, runs the real proxy on them, sends a few requests and prints
//! what happened: retries on the flaky provider, then a fallback to the steady one.
//!
//! ```text
//! cargo run -p switchback-tests --example demo            # then try the printed curl
//! cargo run -p switchback-tests --example demo -- --once  # just the scripted requests
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use switchback_proxy::{Options, Source};
use switchback_tests::harness::{chat_body, credential, header, route};
use switchback_tests::sim::{Behavior, Flavor, SimProvider};

const ROUTE_SPEC: &str = "  models: [demo]
  targets:
    - credentialRef: { name: flaky-openai }
      model: gpt-4o
      timeout: 5s
      retry: { attempts: 2, initialBackoff: 50ms, maxBackoff: 200ms }
    - credentialRef: { name: steady-openai }
      model: gpt-4o-mini
  timeout: 30s
";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let once = std::env::args().any(|a| a == "--once");
    let flaky = SimProvider::start_named("flaky-openai", Flavor::OpenAi).await;
    flaky.set_default(Behavior::Cycle(vec![
        Behavior::ServerError(503),
        Behavior::ServerError(503),
        Behavior::Answer,
    ]));
    let steady = SimProvider::start_named("steady-openai", Flavor::OpenAi).await;

    let dir = tempfile::tempdir()?;
    let manifest = dir.path().join("demo.yaml");
    let manifests = format!(
        "{}{}{}",
        credential("flaky-openai", "openai", &flaky.base_url(), "sk-demo-flaky"),
        credential(
            "steady-openai",
            "openai",
            &steady.base_url(),
            "sk-demo-steady"
        ),
        route("demo", ROUTE_SPEC),
    );
    std::fs::write(&manifest, &manifests)?;

    // The usual ports when they are free, any free port otherwise.
    let (listen, admin_listen) = (free_or_any(8080), free_or_any(9090));
    let proxy = switchback_proxy::start(Options {
        source: Source::Manifests(manifest.clone()),
        listen,
        admin_listen,
        max_body_bytes: 32 * 1024 * 1024,
        upstream_limits: Default::default(),
        threads: 0,
        limits: Default::default(),
        allow_empty_config: false,
        budgets: Default::default(),
        auth: None,
        client_key_hmac_file: None,
        admin_token_file: None,
        fetch_media: Default::default(),
        fetch_limits: Default::default(),
        listen_wait: std::time::Duration::ZERO,
    })
    .await?;
    let base = format!("http://{}", proxy.data_addr);

    println!("Switchback demo: two simulated providers, one of them flaky, behind route `demo`.\n");
    println!("The route (written to {}):\n", manifest.display());
    println!("{}", indent(&route("demo", ROUTE_SPEC)));
    println!("Sending four requests to {base}/v1/chat/completions with model \"demo\":\n");
    let http = reqwest::Client::new();
    for n in 1..=4 {
        let r = http
            .post(format!("{base}/v1/chat/completions"))
            .json(&chat_body("demo", false))
            .send()
            .await?;
        let (status, target, attempts, fallbacks) = (
            r.status().as_u16(),
            header(&r, "x-switchback-target").to_string(),
            header(&r, "x-switchback-attempts").to_string(),
            header(&r, "x-switchback-fallbacks").to_string(),
        );
        let body: serde_json::Value = r.json().await?;
        let text = body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or("?");
        let what = if fallbacks == "0" {
            "answered by the first target".to_string()
        } else {
            format!("FELL BACK past {fallbacks} target(s)")
        };
        println!(
            "  request {n}: {status} from {target}, {attempts} upstream attempt(s), {what}: {text:?} (model {:?})",
            body["model"].as_str().unwrap_or("?")
        );
    }
    println!(
        "\nThe flaky provider saw {} requests, the steady one {}.",
        flaky.hits(),
        steady.hits()
    );
    if once {
        return Ok(());
    }
    println!("\nTry it yourself (Ctrl-C to stop):\n");
    println!(
        "  curl -si {base}/v1/chat/completions -H 'content-type: application/json' \\\n    -d '{{\"model\":\"demo\",\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}'"
    );
    println!(
        "  curl -sN {base}/v1/chat/completions -H 'content-type: application/json' \\\n    -d '{{\"model\":\"demo\",\"stream\":true,\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}'"
    );
    println!("  curl -s http://{}/admin/v1/config", proxy.admin_addr);
    println!(
        "\nEdit {} while this runs: the proxy reloads it, and a broken edit is refused with file, line and field.",
        manifest.display()
    );
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = proxy.wait() => {}
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    Ok(())
}

fn free_or_any(port: u16) -> SocketAddr {
    let preferred = SocketAddr::from(([127, 0, 0, 1], port));
    match std::net::TcpListener::bind(preferred) {
        Ok(_) => preferred,
        Err(_) => SocketAddr::from(([127, 0, 0, 1], 0)),
    }
}

fn indent(text: &str) -> String {
    text.lines()
        .filter(|l| *l != "---")
        .map(|l| format!("    {l}\n"))
        .collect()
}
