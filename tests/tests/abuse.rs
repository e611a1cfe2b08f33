//! Clients that misbehave on purpose (docs/limits.md#the-limits): headers at a drip, a body
//! at a drip, a `Content-Length` far over the limit, many idle sockets, more request bytes
//! at once than the budget. The data port refuses each as docs/limits.md#the-limits says,
//! counts it on `/metrics`, and stays responsive to well-behaved clients and `/healthz`
//! meanwhile.
//!
//! The proxy serves on two lanes of its own (as the binary does), so the limits are
//! checked on every lane; they run on the real clock, so the limits are set short
//! here. Loopback only; every socket is closed by the end of its test.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};
use switchback_proxy::front::ClientLimits;
use switchback_tests::harness::{TestProxy, chat_body, credential, header, route};
use switchback_tests::sim::{Flavor, SimProvider};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout, timeout_at};

const SHORT: Duration = Duration::from_millis(400);
/// Generous: the tests share two cores with each other.
const PROMPTLY: Duration = Duration::from_secs(5);

fn limits() -> ClientLimits {
    ClientLimits {
        header_read_timeout: SHORT,
        body_read_timeout: SHORT,
        idle_timeout: SHORT,
        ..ClientLimits::default()
    }
}

async fn proxy(limits: ClientLimits) -> (SimProvider, TestProxy) {
    let sim = SimProvider::start(Flavor::OpenAi).await;
    let manifests = format!(
        "{}{}",
        credential("p", "openai", &sim.base_url(), "sk-p"),
        route(
            "r",
            "  models: [m]\n  targets:\n    - credentialRef: { name: p }\n"
        )
    );
    let proxy = TestProxy::start_configured(&manifests, |o| {
        o.threads = 2;
        o.max_body_bytes = 1 << 20;
        o.limits = limits;
    })
    .await;
    (sim, proxy)
}

/// A well-behaved client is answered promptly, and so is `/healthz`.
async fn still_responsive(p: &TestProxy) {
    let started = Instant::now();
    let r = timeout(PROMPTLY, p.chat("m", false))
        .await
        .expect("the data port answers in time");
    assert_eq!(r.status(), 200);
    let h = timeout(PROMPTLY, p.http.get(p.admin_url("/healthz")).send())
        .await
        .expect("/healthz answers in time")
        .unwrap();
    assert_eq!(h.status(), 200);
    assert!(started.elapsed() < PROMPTLY, "{:?}", started.elapsed());
}

async fn refusals(p: &TestProxy, limit: &str) -> u64 {
    let text = p.admin_text("/metrics").await;
    let prefix = format!("switchback_limit_refusals_total{{limit=\"{limit}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {prefix} in /metrics"))
        .parse()
        .unwrap()
}

/// Reads until the server closes the connection (or resets it); the bytes it sent.
async fn until_closed(tcp: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tcp.read(&mut buf).await {
            Ok(0) | Err(_) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// True once `got` holds a whole answer with a `content-length`.
fn complete(got: &[u8]) -> bool {
    let text = String::from_utf8_lossy(got);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    head.lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|n| n.trim().parse::<usize>().ok())
        .is_some_and(|n| body.len() >= n)
}

async fn connect(addr: SocketAddr) -> TcpStream {
    TcpStream::connect(addr).await.expect("loopback connect")
}

#[tokio::test]
async fn headers_at_a_drip_are_cut_after_the_header_timeout() {
    let (_sim, p) = proxy(limits()).await;
    let addr = p.running.data_addr;
    let mut slow = Vec::new();
    for _ in 0..20 {
        let handle = tokio::spawn(async move {
            let mut tcp = connect(addr).await;
            let started = Instant::now();
            tcp.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
                .await
                .unwrap();
            // One header byte every 50 ms, until the proxy hangs up.
            loop {
                tokio::time::sleep(Duration::from_millis(50)).await;
                if tcp.write_all(b"x").await.is_err() || started.elapsed() > PROMPTLY {
                    break;
                }
                let mut probe = [0u8; 64];
                if let Ok(Ok(0) | Err(_)) =
                    timeout(Duration::from_millis(1), tcp.read(&mut probe)).await
                {
                    break;
                }
            }
            started.elapsed()
        });
        slow.push(handle);
    }
    still_responsive(&p).await;
    for h in slow {
        let took = h.await.unwrap();
        assert!(took >= SHORT && took < PROMPTLY, "cut after {took:?}");
    }
    assert!(refusals(&p, "header_read_timeout").await >= 20);
    still_responsive(&p).await;
}

#[tokio::test]
async fn a_body_at_a_drip_gets_408_after_the_body_timeout() {
    let (_sim, p) = proxy(limits()).await;
    let mut tcp = connect(p.running.data_addr).await;
    let started = Instant::now();
    tcp.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"model\":",
    )
    .await
    .unwrap();
    // Drip a byte every 50 ms while waiting for the answer.
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !complete(&answer) && started.elapsed() < PROMPTLY {
        tokio::select! {
            n = tcp.read(&mut buf) => match n {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            },
            () = tokio::time::sleep(Duration::from_millis(50)) => {
                let _ = tcp.write_all(b" ").await;
            }
        }
    }
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("\"code\":\"request_timeout\""), "{text}");
    assert!(took >= SHORT && took < PROMPTLY, "{took:?}");
    assert_eq!(refusals(&p, "body_read_timeout").await, 1);
    still_responsive(&p).await;
}

#[tokio::test]
async fn a_content_length_over_the_limit_is_refused_before_reading_and_without_100_continue() {
    let (_sim, p) = proxy(limits()).await;
    for expect in ["expect: 100-continue\r\n", ""] {
        let mut tcp = connect(p.running.data_addr).await;
        tcp.write_all(
            format!(
                "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{expect}content-length: 10000000000\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        // No body byte is ever sent: the answer must not wait for one.
        let answer = timeout(PROMPTLY, until_closed(&mut tcp))
            .await
            .expect("answered without reading the body");
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 413"), "{expect:?}: {text}");
        assert!(!text.contains("100 Continue"), "{text}");
        let body: Value = serde_json::from_str(text.split("\r\n\r\n").nth(1).unwrap()).unwrap();
        assert_eq!(body["error"]["code"], "invalid_request");
    }
    assert_eq!(refusals(&p, "max_body_bytes").await, 2);
    still_responsive(&p).await;
}

#[tokio::test]
async fn idle_sockets_past_the_connection_cap_wait_and_are_closed_by_the_idle_timeout() {
    let cap = 30;
    let limits = ClientLimits {
        max_connections: cap,
        ..limits()
    };
    let idle_timeout = limits.idle_timeout;
    let (_sim, p) = proxy(limits).await;
    let addr = p.running.data_addr;
    let mut idle = Vec::new();
    for _ in 0..2 * cap {
        let tcp = connect(addr).await;
        idle.push((tcp, Instant::now()));
    }
    // The proxy closes idle sockets a cap at a time, one idle timeout per wave: the
    // idle sockets, then the real client's connection and its keep-alive behind
    // them. Every wait below is bounded by that many idle timeouts, times ten for a
    // machine whose cores other test binaries share: the bound proves the sockets
    // are let in and closed, not how fast.
    let waves = (2 * cap).div_ceil(cap) + 2;
    let patience = idle_timeout * waves as u32 * 10;
    let deadline = Instant::now() + patience;

    // The admin port is not behind the data port's cap.
    let h = timeout_at(deadline, p.http.get(p.admin_url("/healthz")).send())
        .await
        .expect("/healthz answers while the data port is full")
        .unwrap();
    assert_eq!(h.status(), 200);
    // A real client waits in the accept queue and is served once idle ones close.
    let r = timeout_at(deadline, p.chat("m", false))
        .await
        .expect("the data port serves the client once idle sockets are closed");
    assert_eq!(r.status(), 200);
    // Every idle socket is closed by the proxy, without a byte, and none before its
    // idle timeout (those past the cap wait in the queue, they are not refused).
    for (mut tcp, connected) in idle {
        let rest = timeout_at(deadline, until_closed(&mut tcp))
            .await
            .expect("every idle socket is closed by the proxy");
        assert!(rest.is_empty());
        let open_for = connected.elapsed();
        assert!(open_for >= idle_timeout, "closed after only {open_for:?}");
    }
    assert!(refusals(&p, "idle_timeout").await >= 2 * cap as u64);
    assert!(refusals(&p, "max_connections").await >= 1);
    // With the idle ones gone, a new client is served at once: no wave to wait for.
    // A new connection, not the pooled one of the first call: that one has been idle
    // for the idle timeout too, and the proxy closing it as the pool hands it out is
    // the keep-alive race every HTTP client has, not what this test is about.
    let fresh = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let r = timeout_at(
        deadline,
        fresh
            .post(p.url("/v1/chat/completions"))
            .json(&chat_body("m", false))
            .send(),
    )
    .await
    .expect("the data port answers")
    .expect("the proxy answers a new connection");
    assert_eq!(r.status(), 200);
    let h = timeout_at(deadline, p.http.get(p.admin_url("/healthz")).send())
        .await
        .expect("/healthz answers")
        .unwrap();
    assert_eq!(h.status(), 200);
}

#[tokio::test]
async fn request_bodies_over_the_in_flight_budget_get_503_overloaded() {
    let (_sim, p) = proxy(ClientLimits {
        max_inflight_body_bytes: 64 << 10,
        body_read_timeout: Duration::from_secs(30),
        ..limits()
    })
    .await;
    let big = |n: usize| {
        let mut b = chat_body("m", false);
        b["messages"][0]["content"] = json!("x".repeat(n));
        serde_json::to_vec(&b).unwrap()
    };
    // 40 KiB declared, half sent: reserved while it is being read.
    let held = big(40 << 10);
    let mut tcp = connect(p.running.data_addr).await;
    tcp.write_all(
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            held.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    tcp.write_all(&held[..held.len() / 2]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let refused = p
        .http
        .post(p.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(big(40 << 10))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
    assert_eq!(header(&refused, "retry-after"), "1");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "overloaded", "{body}");
    // The Anthropic surface answers in its own shape.
    let refused = p
        .http
        .post(p.url("/v1/messages"))
        .header("content-type", "application/json")
        .body(big(40 << 10))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["type"], "error", "{body}");
    // Small requests still fit beside the held one.
    still_responsive(&p).await;
    // The held request completes normally, and then gives its bytes back.
    tcp.write_all(&held[held.len() / 2..]).await.unwrap();
    let mut head = vec![0u8; 16];
    timeout(PROMPTLY, tcp.read_exact(&mut head))
        .await
        .unwrap()
        .unwrap();
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&head)
    );
    let ok = p
        .http
        .post(p.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(big(40 << 10))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(refusals(&p, "max_inflight_body_bytes").await, 2);
}
