//! SIGTERM under load, on the real `switchback-proxy` binary (docs/limits.md#shutdown):
//! unary calls in flight (a slow provider) and open streams all finish; `/readyz` answers
//! 503 from the signal on while the admin port keeps answering; requests that come during
//! the drain delay are still served; a stream still open when the grace is over ends with
//! the error event; the request log is flushed; the process exits 0.

use std::path::Path;
use std::time::Duration;

use futures_util::StreamExt;
use switchback_tests::binaries::{Process, build};
use switchback_tests::harness::{chat_body, credential, route};
use switchback_tests::sim::{Behavior, Flavor, SimProvider};
use tokio::time::{Instant, sleep, timeout};

/// Long enough for the test to see `/readyz` turn 503 and send one more request.
const DRAIN_DELAY: Duration = Duration::from_secs(2);
const GRACE: Duration = Duration::from_secs(4);
const UNARY: usize = 20;
const STREAMS: usize = 10;

fn route_to(name: &str, credential: &str) -> String {
    route(
        name,
        &format!(
            "  models: [{name}]\n  timeout: 60s\n  targets:\n    - credentialRef: {{ name: {credential} }}\n"
        ),
    )
}

/// Reads an SSE answer to its end; the whole text.
async fn read_stream(r: reqwest::Response) -> Result<String, String> {
    let mut body = r.bytes_stream();
    let mut text = String::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| format!("{e} after {text:?}"))?;
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    Ok(text)
}

#[tokio::test]
async fn sigterm_drains_in_flight_calls_and_streams_then_exits_0() {
    let bin = build().join("switchback-proxy");
    let slow = SimProvider::start_named("slow", Flavor::OpenAi).await;
    slow.set_default(Behavior::Delay(
        Duration::from_secs(2),
        Box::new(Behavior::Answer),
    ));
    let streams = SimProvider::start_named("streams", Flavor::OpenAi).await;
    // 3 s of events: ends well within the grace.
    streams.set_default(Behavior::Stream {
        chunks: 30,
        interval: Duration::from_millis(100),
    });
    let stuck = SimProvider::start_named("stuck", Flavor::OpenAi).await;
    stuck.set_default(Behavior::StallMidStream { chunks: 2 });

    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("switchback.yaml");
    std::fs::write(
        &manifest,
        [
            credential("slow", "openai", &slow.base_url(), "sk-slow"),
            credential("streams", "openai", &streams.base_url(), "sk-streams"),
            credential("stuck", "openai", &stuck.base_url(), "sk-stuck"),
            route_to("unary", "slow"),
            route_to("stream", "streams"),
            route_to("stuck", "stuck"),
        ]
        .concat(),
    )
    .unwrap();
    let log = dir.path().join("proxy.log");
    let (delay, grace) = (
        format!("{}ms", DRAIN_DELAY.as_millis()),
        format!("{}ms", GRACE.as_millis()),
    );
    let (mut proxy, [data, admin]) = Process::start_proxy(
        &bin,
        &manifest,
        &log,
        &[
            "--threads",
            "2",
            "--drain-delay",
            &delay,
            "--shutdown-grace",
            &grace,
        ],
    );
    let http = reqwest::Client::new();
    let (data_url, admin_url) = (
        format!("http://127.0.0.1:{data}/v1/chat/completions"),
        format!("http://127.0.0.1:{admin}"),
    );
    let readyz = |http: reqwest::Client| {
        let url = format!("{admin_url}/readyz");
        async move { http.get(url).send().await.map(|r| r.status().as_u16()).ok() }
    };
    let started = Instant::now();
    while readyz(http.clone()).await != Some(200) {
        assert!(started.elapsed() < Duration::from_secs(30), "never ready");
        assert!(proxy.exited().is_none(), "the proxy exited: {}", dump(&log));
        sleep(Duration::from_millis(50)).await;
    }

    let send = |model: &'static str, stream: bool| {
        let request = http.post(&data_url).json(&chat_body(model, stream));
        tokio::spawn(async move {
            let r = request.send().await.map_err(|e| e.to_string())?;
            let status = r.status().as_u16();
            let text = if stream {
                read_stream(r).await?
            } else {
                r.text().await.map_err(|e| e.to_string())?
            };
            Ok::<_, String>((status, text))
        })
    };
    let unary: Vec<_> = (0..UNARY).map(|_| send("unary", false)).collect();
    let open: Vec<_> = (0..STREAMS).map(|_| send("stream", true)).collect();
    let stuck_stream = send("stuck", true);
    timeout(Duration::from_secs(10), async {
        slow.wait_hits(UNARY).await;
        streams.wait_hits(STREAMS).await;
        stuck.wait_hits(1).await;
    })
    .await
    .expect("every request is in flight");

    let signalled = Instant::now();
    proxy.signal("TERM");
    // Not ready any more; the admin port still answers. (That this comes at once,
    // before the delay, is front::drain's unit test on the paused clock.)
    timeout(Duration::from_secs(10), async {
        while readyz(http.clone()).await != Some(503) {
            sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("/readyz turns 503 after SIGTERM");
    // Not ready, yet still accepting (the drain delay): a request on a new
    // connection is taken and served.
    let late = {
        let fresh = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        let request = fresh.post(&data_url).json(&chat_body("unary", false));
        tokio::spawn(async move {
            let r = request.send().await.map_err(|e| e.to_string())?;
            let status = r.status().as_u16();
            Ok::<_, String>((status, r.text().await.map_err(|e| e.to_string())?))
        })
    };

    for (what, handles) in [("unary", unary), ("stream", open)] {
        for h in handles {
            let (status, text) = h
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("a {what} request failed: {e}"));
            assert_eq!(status, 200, "{what}: {text}");
            if what == "stream" {
                assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
                assert!(!text.contains("\"error\""), "{text}");
            } else {
                let v: serde_json::Value = serde_json::from_str(&text).unwrap();
                assert!(v["choices"][0]["message"]["content"].is_string(), "{text}");
            }
        }
    }
    let (status, _) = late.await.unwrap().expect("a request in the drain delay");
    assert_eq!(status, 200);
    assert_eq!(
        readyz(http.clone()).await,
        Some(503),
        "the admin port answers while draining"
    );

    // The stuck stream is ended with the error event when the grace is over.
    let (status, text) = timeout(DRAIN_DELAY + GRACE + Duration::from_secs(5), stuck_stream)
        .await
        .expect("the stuck stream was ended")
        .unwrap()
        .expect("ended cleanly, with the error event");
    assert_eq!(status, 200);
    assert!(text.contains("shutting down"), "{text}");
    assert!(text.contains("stream_interrupted"), "{text}");
    // A lower bound (a slow machine cannot break it): the stream had the grace.
    assert!(
        signalled.elapsed() >= DRAIN_DELAY + GRACE,
        "{:?}",
        signalled.elapsed()
    );

    let exited = timeout(Duration::from_secs(10), async {
        loop {
            if let Some(status) = proxy.exited() {
                return status;
            }
            sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the proxy exits after the grace");
    assert!(exited.success(), "{exited}: {}", dump(&log));
    // The request log was flushed on the way out: one line per request.
    let lines = std::fs::read_to_string(&log).unwrap();
    let logged = lines
        .lines()
        .filter(|l| l.contains("route=team-a/unary"))
        .count();
    assert_eq!(logged, UNARY + 1, "{lines}");
}

fn dump(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}
