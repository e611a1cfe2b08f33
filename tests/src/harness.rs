//! Running a real proxy in-process against simulated providers: write manifests to
//! a temporary folder, start `switchback_proxy::start` on loopback ports, and talk to
//! it with a plain HTTP client. Used by the integration tests, the demo and the
//! benchmark.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde_json::{Value, json};
use switchback_proxy::limits::answers::UpstreamLimits;
use switchback_proxy::{Options, Running, Source};

/// The namespace every harness manifest lives in.
pub const NS: &str = "team-a";

/// A `ProviderCredential` plus the `Secret` holding its key, allowed to reach
/// loopback (simulated providers live there).
pub fn credential(name: &str, provider: &str, base_url: &str, key: &str) -> String {
    format!(
        "---
apiVersion: switchback.dev/v1alpha1
kind: ProviderCredential
metadata: {{ name: {name}, namespace: {NS} }}
spec:
  provider: {provider}
  baseURL: {base_url}
  secretRef: {{ name: {name}-key, key: apiKey }}
  allowPrivateNetwork: true
---
apiVersion: v1
kind: Secret
metadata: {{ name: {name}-key, namespace: {NS} }}
stringData: {{ apiKey: {key} }}
"
    )
}

/// A `provider: bedrock` credential `name` for a Bedrock simulator at `base_url`
/// (the simulator's region), reading the whole Secret `{name}-keys`: `akid`,
/// `secret` and, for temporary credentials, `token`.
pub fn bedrock_credential(
    name: &str,
    base_url: &str,
    akid: &str,
    secret: &str,
    token: Option<&str>,
) -> String {
    let token = token.map_or(String::new(), |t| format!(", sessionToken: \"{t}\""));
    format!(
        "---
apiVersion: switchback.dev/v1alpha1
kind: ProviderCredential
metadata: {{ name: {name}, namespace: {NS} }}
spec:
  provider: bedrock
  region: {region}
  baseURL: {base_url}
  secretRef: {{ name: {name}-keys }}
  allowPrivateNetwork: true
---
apiVersion: v1
kind: Secret
metadata: {{ name: {name}-keys, namespace: {NS} }}
stringData: {{ accessKeyId: \"{akid}\", secretAccessKey: \"{secret}\"{token} }}
",
        region = crate::sim::BEDROCK_REGION,
    )
}

/// A `provider: vertex` credential `name` for a Vertex simulator at `base_url` (the
/// simulator's project and location), its service-account key
/// (`service_account_json`, one line) in the Secret `{name}-sa`.
pub fn vertex_credential(name: &str, base_url: &str, service_account_json: &str) -> String {
    format!(
        r#"---
apiVersion: switchback.dev/v1alpha1
kind: ProviderCredential
metadata: {{ name: {name}, namespace: {NS} }}
spec:
  provider: vertex
  project: {project}
  location: {location}
  baseURL: {base_url}
  secretRef: {{ name: {name}-sa, key: serviceAccount.json }}
  allowPrivateNetwork: true
---
apiVersion: v1
kind: Secret
metadata: {{ name: {name}-sa, namespace: {NS} }}
stringData:
  serviceAccount.json: |
    {service_account_json}
"#,
        project = crate::sim::VERTEX_PROJECT,
        location = crate::sim::VERTEX_LOCATION,
    )
}

/// An `LLMRoute` whose `spec` body (indented two spaces, without `spec:`) is given.
pub fn route(name: &str, spec: &str) -> String {
    format!(
        "---
apiVersion: switchback.dev/v1alpha1
kind: LLMRoute
metadata: {{ name: {name}, namespace: {NS} }}
spec:
{spec}"
    )
}

/// A provider credential `primary` (of `provider`, at `base_url`), the route `smart`
/// to it priced at $2.50 / $10.00 per million tokens, and the LLMClient team-a/app
/// authenticating with `key` (its Secret included), `client_spec` (indented spec
/// lines: limits, budget) added to its spec.
pub fn priced_client(provider: &str, base_url: &str, key: &str, client_spec: &str) -> String {
    [
        credential("primary", provider, base_url, "sk-primary"),
        route(
            "smart",
            "  timeout: 60s
  targets:
    - credentialRef: { name: primary }
      price: { inputPerMillion: \"2.50\", outputPerMillion: \"10.00\" }
",
        ),
        app_client(key, client_spec),
    ]
    .concat()
}

/// The LLMClient team-a/app authenticating with `key` (its Secret included),
/// `client_spec` (indented spec lines: limits, budget) added to its spec.
pub fn app_client(key: &str, client_spec: &str) -> String {
    format!(
        "---
apiVersion: v1
kind: Secret
metadata: {{ name: app-llm, namespace: {NS} }}
stringData: {{ apiKey: \"{key}\" }}
---
apiVersion: switchback.dev/v1alpha1
kind: LLMClient
metadata: {{ name: app, namespace: {NS} }}
spec:
  keySecretRef: {{ name: app-llm, key: apiKey }}
{client_spec}"
    )
}

/// The proxy's default `--max-body-bytes`.
const DEFAULT_MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// A proxy serving the manifests in its own temporary folder.
pub struct TestProxy {
    pub running: Running,
    pub dir: tempfile::TempDir,
    pub manifest: PathBuf,
    pub http: reqwest::Client,
}

impl TestProxy {
    /// Start on `127.0.0.1:0` with the default body limit. Panics with the load errors
    /// if the manifests do not load.
    pub async fn start(manifests: &str) -> TestProxy {
        Self::try_start(manifests, DEFAULT_MAX_BODY_BYTES)
            .await
            .unwrap_or_else(|e| panic!("proxy did not start: {e}"))
    }

    /// Like [`TestProxy::start`], with the data port served by `threads` threads of
    /// their own (as the binary does) instead of the test's runtime. Those threads run
    /// on the real clock and serve until the test process ends.
    pub async fn start_threaded(manifests: &str, threads: usize) -> TestProxy {
        Self::launch(manifests, DEFAULT_MAX_BODY_BYTES, threads)
            .await
            .unwrap_or_else(|e| panic!("proxy did not start: {e}"))
    }

    pub async fn try_start(
        manifests: &str,
        max_body_bytes: usize,
    ) -> Result<TestProxy, switchback_proxy::StartError> {
        Self::launch(manifests, max_body_bytes, 0).await
    }

    /// Like [`TestProxy::start`], with the given limits on provider answers.
    pub async fn start_with_limits(manifests: &str, limits: UpstreamLimits) -> TestProxy {
        Self::start_configured(manifests, |o| o.upstream_limits = limits).await
    }

    async fn launch(
        manifests: &str,
        max_body_bytes: usize,
        threads: usize,
    ) -> Result<TestProxy, switchback_proxy::StartError> {
        Self::try_start_configured(manifests, |o| {
            o.max_body_bytes = max_body_bytes;
            o.threads = threads;
        })
        .await
    }

    /// Start on loopback with the default options as changed by `configure` (limits,
    /// threads, ...).
    pub async fn try_start_configured(
        manifests: &str,
        configure: impl FnOnce(&mut Options),
    ) -> Result<TestProxy, switchback_proxy::StartError> {
        let dir = tempfile::tempdir().expect("temp dir");
        let manifest = dir.path().join("switchback.yaml");
        std::fs::write(&manifest, manifests).expect("write manifests");
        let loopback: SocketAddr = "127.0.0.1:0".parse().expect("addr");
        let mut options = Options {
            source: Source::Manifests(manifest.clone()),
            listen: loopback,
            admin_listen: loopback,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
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
        };
        configure(&mut options);
        let running = switchback_proxy::start(options).await?;
        Ok(TestProxy {
            running,
            dir,
            manifest,
            http: reqwest::Client::new(),
        })
    }

    /// Like [`TestProxy::try_start_configured`]; panics with the load errors.
    pub async fn start_configured(
        manifests: &str,
        configure: impl FnOnce(&mut Options),
    ) -> TestProxy {
        Self::try_start_configured(manifests, configure)
            .await
            .unwrap_or_else(|e| panic!("proxy did not start: {e}"))
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.running.data_addr)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.running.admin_addr)
    }

    /// Replace the manifests on disk (the watcher picks the change up).
    pub fn rewrite(&self, manifests: &str) {
        std::fs::write(&self.manifest, manifests).expect("write manifests");
    }

    pub async fn post(&self, path: &str, body: &Value) -> reqwest::Response {
        self.http
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .expect("proxy answers")
    }

    /// `POST /v1/chat/completions` with one user message.
    pub async fn chat(&self, model: &str, stream: bool) -> reqwest::Response {
        self.post("/v1/chat/completions", &chat_body(model, stream))
            .await
    }

    /// Send a chat completion in the background (for requests that must be in flight
    /// while the test does something else).
    pub fn spawn_chat(&self, model: &str) -> tokio::task::JoinHandle<reqwest::Response> {
        let request = self
            .http
            .post(self.url("/v1/chat/completions"))
            .json(&chat_body(model, false));
        tokio::spawn(async move { request.send().await.expect("proxy answers") })
    }

    /// `POST /v1/messages` with one user message.
    pub async fn messages(&self, model: &str, stream: bool) -> reqwest::Response {
        self.post("/v1/messages", &messages_body(model, stream))
            .await
    }

    pub async fn admin_config(&self) -> Value {
        self.admin_json("/admin/v1/config").await
    }

    /// `/admin/v1/stats`: what the operator scrapes.
    pub async fn admin_stats(&self) -> Value {
        self.admin_json("/admin/v1/stats").await
    }

    /// A text document of the admin port (`/metrics`, `/admin/v1/config` as sent).
    pub async fn admin_text(&self, path: &str) -> String {
        self.http
            .get(self.admin_url(path))
            .send()
            .await
            .expect("admin answers")
            .text()
            .await
            .unwrap_or_else(|e| panic!("{path} is text: {e}"))
    }

    /// A JSON document of the admin port.
    pub async fn admin_json(&self, path: &str) -> Value {
        self.http
            .get(self.admin_url(path))
            .send()
            .await
            .expect("admin answers")
            .json()
            .await
            .unwrap_or_else(|e| panic!("{path} is JSON: {e}"))
    }
}

pub fn chat_body(model: &str, stream: bool) -> Value {
    json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "hello"}]})
}

pub fn messages_body(model: &str, stream: bool) -> Value {
    json!({"model": model, "stream": stream, "max_tokens": 64,
           "messages": [{"role": "user", "content": "hello"}]})
}

/// A response header as a string ("" when absent).
pub fn header<'a>(r: &'a reqwest::Response, name: &str) -> &'a str {
    r.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// A JSON answer's body (the test fails when it is not JSON).
pub async fn json_of(r: reqwest::Response) -> Value {
    r.json().await.expect("JSON body")
}

/// The text content of an SSE body, whichever client API it is in: OpenAI's
/// `choices[0].delta.content` and Anthropic's `delta.text`, concatenated.
pub fn streamed_text(body: &str) -> String {
    let mut out = String::new();
    for line in body.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
            out.push_str(t);
        }
        if let Some(t) = v["delta"]["text"].as_str() {
            out.push_str(t);
        }
    }
    out
}

/// A log sink for tests that read what the proxy logged: a `tracing` writer that
/// appends to a shared buffer.
#[derive(Clone, Default)]
pub struct CapturedLog(pub std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for CapturedLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl CapturedLog {
    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }

    /// Sends this thread's `tracing` events through the binary's own log pipeline
    /// (JSON, debug level, the batched writer) into this buffer, until the returned
    /// capture is stopped or dropped. Tests that check what never reaches a log use it.
    pub fn capture_json_debug(&self) -> LogCapture {
        use switchback_proxy::observe::telemetry::LogFormat;
        use switchback_proxy::observe::telemetry::{self, BatchedWriter};
        let writer = BatchedWriter::start(self.clone());
        let dispatch = telemetry::dispatch(
            LogFormat::Json,
            &writer,
            || tracing_subscriber::EnvFilter::new("debug"),
            false,
            None,
        );
        let guard = tracing::dispatcher::set_default(&dispatch);
        LogCapture {
            writer,
            _guard: guard,
        }
    }
}

/// A running [`CapturedLog::capture_json_debug`].
pub struct LogCapture {
    writer: switchback_proxy::observe::telemetry::BatchedWriter,
    _guard: tracing::dispatcher::DefaultGuard,
}

impl LogCapture {
    /// Flushes what was logged into the buffer (and stops the writer).
    pub fn stop(&self) {
        self.writer.stop();
    }
}

/// An interpreter that imports both official SDKs (`$SWITCHBACK_SDK_PYTHON`, else
/// the workspace's `.venv`, made by `.ci/setup-python`). Without one a test skips
/// with a printed reason, except under CI, where that is a failure.
pub fn sdk_python() -> Option<std::path::PathBuf> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent()?;
    let python = match std::env::var_os("SWITCHBACK_SDK_PYTHON") {
        Some(p) if !p.is_empty() => std::path::PathBuf::from(p),
        _ => root.join(".venv/bin/python"),
    };
    let ok = std::process::Command::new(&python)
        .args(["-c", "import openai, anthropic"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some(python);
    }
    let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
    assert!(
        !ci,
        "CI is set but no Python with the SDKs: .ci/setup-python must run first"
    );
    eprintln!("SKIPPED: no Python with the openai and anthropic SDKs (.ci/setup-python)");
    None
}

/// Runs `tests/sdk/resume.py` (both official SDKs stream one answer each) with
/// `python` against `proxy`, on the chat route `openai_model` and the messages route
/// `anthropic_model`, and returns the JSON line it prints: what each SDK made of
/// its stream.
pub async fn sdk_stream_script(
    python: &std::path::Path,
    proxy: &TestProxy,
    openai_model: &str,
    anthropic_model: &str,
) -> Value {
    let env = [
        ("SWITCHBACK_OPENAI_MODEL", openai_model),
        ("SWITCHBACK_ANTHROPIC_MODEL", anthropic_model),
    ];
    sdk_script(python, proxy, "resume.py", &env).await
}

/// Runs `tests/sdk/<script>` with `python` against `proxy` (`SWITCHBACK_URL`) and
/// `env`, loopback only, within two minutes, and returns the one JSON line it prints.
pub async fn sdk_script(
    python: &std::path::Path,
    proxy: &TestProxy,
    script: &str,
    env: &[(&str, &str)],
) -> Value {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("sdk")
        .join(script);
    let out = tokio::process::Command::new(python)
        .arg(&script)
        .env("SWITCHBACK_URL", proxy.url(""))
        .envs(env.iter().copied())
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("ALL_PROXY")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(120), out)
        .await
        .expect("the script finishes")
        .expect("the script runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}:\n{stdout}\n{}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).expect("one JSON line")
}
