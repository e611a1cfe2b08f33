//! The admin port behind `--admin-token-file` (docs/proxy.md#admin-port): a proxy started
//! in-process on loopback, its admin endpoints called with no token, a wrong one and
//! the right one.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use switchback_proxy::{Options, Running, Source, StartError, start};

const TOKEN: &str = "admin-token-0123456789abcdef";
const WRONG: &str = "wrong-token-0123456789abcdef";

fn options(dir: &Path, token_file: Option<PathBuf>) -> Options {
    let manifests = dir.join("switchback.yaml");
    std::fs::write(&manifests, "").unwrap();
    let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
    Options {
        source: Source::Manifests(manifests),
        listen: loopback,
        admin_listen: loopback,
        max_body_bytes: 1024,
        upstream_limits: Default::default(),
        threads: 0,
        limits: Default::default(),
        allow_empty_config: true,
        budgets: Default::default(),
        auth: None,
        client_key_hmac_file: None,
        admin_token_file: token_file,
        fetch_media: Default::default(),
        fetch_limits: Default::default(),
        listen_wait: std::time::Duration::ZERO,
    }
}

/// Writes `text` beside `path` and renames it over, as the kubelet swaps a Secret.
fn put(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

async fn start_with_token(dir: &Path) -> (Running, PathBuf) {
    let file = dir.join("admin-token");
    put(&file, &format!("{TOKEN}\n"));
    let running = start(options(dir, Some(file.clone())))
        .await
        .unwrap_or_else(|e| panic!("the proxy did not start: {e}"));
    (running, file)
}

/// `GET path` on the admin port with `Authorization: <authorization>`: status and body.
async fn get(running: &Running, path: &str, authorization: Option<&str>) -> (u16, String) {
    let client: Client<HttpConnector, Empty<bytes::Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let mut request = http::Request::get(format!("http://{}{path}", running.admin_addr));
    if let Some(a) = authorization {
        request = request.header(http::header::AUTHORIZATION, a);
    }
    let response = client
        .request(request.body(Empty::new()).unwrap())
        .await
        .expect("the admin port answers");
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

const GUARDED: [&str; 3] = ["/admin/v1/stats", "/admin/v1/config", "/metrics"];

#[tokio::test]
async fn admin_endpoints_and_metrics_need_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let (running, _) = start_with_token(dir.path()).await;
    for path in GUARDED.into_iter().chain(["/admin/v1/unknown"]) {
        for authorization in [
            None,
            Some(format!("Bearer {WRONG}")),
            // A prefix of the token, and the token with more after it.
            Some(format!("Bearer {}", &TOKEN[..TOKEN.len() - 1])),
            Some(format!("Bearer {TOKEN}x")),
            // The token, but not as a bearer token.
            Some(format!("Basic {TOKEN}")),
            Some(TOKEN.to_string()),
        ] {
            let (status, body) = get(&running, path, authorization.as_deref()).await;
            assert_eq!(status, 401, "{path} with {authorization:?}: {body}");
            let doc: serde_json::Value = serde_json::from_str(&body)
                .unwrap_or_else(|e| panic!("{path}: the 401 body is JSON ({e}): {body}"));
            assert_eq!(doc["error"]["type"], "unauthorized", "{body}");
            assert!(
                !body.contains(TOKEN) && !body.contains(WRONG) && !body.contains("0123456789"),
                "{path}: the 401 body repeats a token: {body}"
            );
        }
    }
    let bearer = format!("Bearer {TOKEN}");
    for path in GUARDED {
        let (status, body) = get(&running, path, Some(&bearer)).await;
        assert_eq!(status, 200, "{path}: {body}");
        assert!(!body.contains(TOKEN), "{path} shows the token: {body}");
    }
    let (status, _) = get(&running, "/admin/v1/unknown", Some(&bearer)).await;
    assert_eq!(status, 404);
    let (_, stats) = get(&running, "/admin/v1/stats", Some(&bearer)).await;
    assert!(stats.contains("instanceId"), "{stats}");
    let (_, metrics) = get(&running, "/metrics", Some(&format!("bearer  {TOKEN} "))).await;
    assert!(metrics.contains("# EOF"), "{metrics}");
}

#[tokio::test]
async fn probes_stay_open() {
    let dir = tempfile::tempdir().unwrap();
    let (running, _) = start_with_token(dir.path()).await;
    for authorization in [None, Some(format!("Bearer {WRONG}"))] {
        let (status, body) = get(&running, "/healthz", authorization.as_deref()).await;
        assert_eq!((status, body.as_str()), (200, "ok\n"));
        let (status, body) = get(&running, "/readyz", authorization.as_deref()).await;
        assert_eq!((status, body.as_str()), (200, "ready\n"));
    }
}

#[tokio::test]
async fn a_rotated_token_replaces_the_old_one() {
    let dir = tempfile::tempdir().unwrap();
    let (running, file) = start_with_token(dir.path()).await;
    let next = "rotated-token-fedcba9876543210";
    put(&file, next);
    let (status, _) = get(&running, "/admin/v1/stats", Some(&format!("Bearer {next}"))).await;
    assert_eq!(status, 200, "the new token is taken");
    let (status, _) = get(
        &running,
        "/admin/v1/stats",
        Some(&format!("Bearer {TOKEN}")),
    )
    .await;
    assert_eq!(status, 401, "the old token is refused");
    // A rotation to nothing usable keeps the last good token.
    put(&file, "\n");
    let (status, _) = get(&running, "/admin/v1/stats", Some(&format!("Bearer {next}"))).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn without_a_token_file_the_admin_port_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(options(dir.path(), None)).await.unwrap();
    for path in GUARDED {
        let (status, body) = get(&running, path, None).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
}

#[tokio::test]
async fn start_up_refuses_an_unusable_token_file_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    for (name, content, why) in [
        ("empty-token", Some("  \n"), "empty"),
        ("short-token", Some("s3cr3t-short\n"), "at least 16"),
        ("absent-token", None, "cannot read"),
    ] {
        let path = dir.path().join(name);
        if let Some(c) = content {
            std::fs::write(&path, c).unwrap();
        }
        let err = match start(options(dir.path(), Some(path.clone()))).await {
            Err(e) => e,
            Ok(_) => panic!("{name}: the proxy started"),
        };
        assert!(matches!(err, StartError::AdminToken(_)), "{name}: {err}");
        let text = err.to_string();
        assert!(text.contains("--admin-token-file"), "{text}");
        assert!(
            text.contains(&path.display().to_string()),
            "names the file: {text}"
        );
        assert!(text.contains(why), "{text}");
        assert!(!text.contains("s3cr3t"), "shows the token: {text}");
    }
}
