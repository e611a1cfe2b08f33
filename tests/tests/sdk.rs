//! Compatibility with the official Python SDKs: simulated providers and the proxy run
//! in-process on loopback, and `tests/sdk/compat.py` drives them with the `openai` and
//! `anthropic` packages (unary, streams, fallbacks, error parsing, embeddings, model
//! lists). Real clock: the SDKs run in a child process.
//!
//! Interpreter: `$SWITCHBACK_SDK_PYTHON`, else `<workspace>/.venv/bin/python` (made by
//! `.ci/setup-python`). Without one that imports both packages the test is skipped
//! with a note, except under `CI`, where it fails.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use switchback_tests::harness::{NS, TestProxy, credential, route};
use switchback_tests::sim::{Behavior, Flavor, SimProvider, answer_text, stream_pieces};
use tokio::process::Command;

/// The key the SDK clients send; it must never reach a provider.
const CLIENT_KEY: &str = "sk-switchback-sdk-client";
const STREAM_CHUNKS: usize = 5;
/// Whole-script limit: a hang must fail the test, not stall CI.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(180);

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// Environment for every child: loopback only, never through a proxy.
fn loopback_only(cmd: &mut Command) -> &mut Command {
    for var in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .env("PYTHONUNBUFFERED", "1")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .kill_on_drop(true)
}

/// An interpreter that imports both SDKs, or why there is none.
async fn find_python() -> Result<PathBuf, String> {
    let (python, origin) = match std::env::var_os("SWITCHBACK_SDK_PYTHON") {
        Some(p) if !p.is_empty() => (PathBuf::from(p), "$SWITCHBACK_SDK_PYTHON"),
        _ => (
            workspace_root().join(".venv/bin/python"),
            "the workspace venv",
        ),
    };
    let probe = loopback_only(&mut Command::new(&python))
        .args([
            "-c",
            "import openai, anthropic; print(openai.__version__, anthropic.__version__)",
        ])
        .output()
        .await;
    match probe {
        Err(e) => Err(format!("{} ({origin}) does not run: {e}", python.display())),
        Ok(out) if !out.status.success() => Err(format!(
            "{} ({origin}) cannot import openai and anthropic: {}",
            python.display(),
            // The exception line (e.g. `ModuleNotFoundError: No module named 'openai'`).
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .rfind(|l| !l.trim().is_empty())
                .unwrap_or("no error output")
                .trim()
        )),
        Ok(_) => Ok(python),
    }
}

struct Sims {
    chat: SimProvider,
    streamer: SimProvider,
    primary: SimProvider,
    backup: SimProvider,
    down_a: SimProvider,
    down_b: SimProvider,
    claude: SimProvider,
    claude_streamer: SimProvider,
    claude_down_a: SimProvider,
    claude_down_b: SimProvider,
    breaker: SimProvider,
    claude_breaker: SimProvider,
    claude_overloaded: SimProvider,
}

impl Sims {
    async fn start() -> Sims {
        let stream = Behavior::Stream {
            chunks: STREAM_CHUNKS,
            interval: Duration::from_millis(20),
        };
        let sims = Sims {
            chat: SimProvider::start_named("chat", Flavor::OpenAi).await,
            streamer: SimProvider::start_named("streamer", Flavor::OpenAi).await,
            primary: SimProvider::start_named("primary", Flavor::OpenAi).await,
            backup: SimProvider::start_named("backup", Flavor::OpenAi).await,
            down_a: SimProvider::start_named("down-a", Flavor::OpenAi).await,
            down_b: SimProvider::start_named("down-b", Flavor::OpenAi).await,
            claude: SimProvider::start_named("claude", Flavor::Anthropic).await,
            claude_streamer: SimProvider::start_named("claude-streamer", Flavor::Anthropic).await,
            claude_down_a: SimProvider::start_named("claude-down-a", Flavor::Anthropic).await,
            claude_down_b: SimProvider::start_named("claude-down-b", Flavor::Anthropic).await,
            breaker: SimProvider::start_named("breaker", Flavor::OpenAi).await,
            claude_breaker: SimProvider::start_named("claude-breaker", Flavor::Anthropic).await,
            claude_overloaded: SimProvider::start_named("claude-overloaded", Flavor::Anthropic)
                .await,
        };
        sims.streamer.set_default(stream.clone());
        sims.claude_streamer.set_default(stream);
        sims.primary.set_default(Behavior::ServerError(503));
        sims.down_a.set_default(Behavior::ServerError(500));
        sims.down_b.set_default(Behavior::ServerError(503));
        sims.claude_down_a.set_default(Behavior::ServerError(529));
        sims.claude_down_b.set_default(Behavior::ServerError(500));
        // OpenAI: role event + 3 deltas; Anthropic: message_start, content_block_start,
        // ping + 2 deltas. Then the connection drops.
        sims.breaker
            .set_default(Behavior::BreakMidStream { chunks: 4 });
        sims.claude_breaker
            .set_default(Behavior::BreakMidStream { chunks: 5 });
        sims.claude_overloaded
            .set_default(Behavior::StreamErrorFirst);
        sims
    }

    fn all(&self) -> [&SimProvider; 13] {
        [
            &self.chat,
            &self.streamer,
            &self.primary,
            &self.backup,
            &self.down_a,
            &self.down_b,
            &self.claude,
            &self.claude_streamer,
            &self.claude_down_a,
            &self.claude_down_b,
            &self.breaker,
            &self.claude_breaker,
            &self.claude_overloaded,
        ]
    }

    fn manifests(&self) -> String {
        let mut m = String::new();
        for sim in self.all() {
            let provider = match sim.flavor() {
                Flavor::OpenAi => "openai",
                Flavor::Anthropic => "anthropic",
            };
            let key = format!("sk-upstream-{}", sim.name());
            m += &credential(sim.name(), provider, &sim.base_url(), &key);
        }
        let one = |cred: &str, model: &str| {
            format!("  targets:\n    - credentialRef: {{ name: {cred} }}\n      model: {model}\n")
        };
        let two = |a: &str, b: &str| {
            format!(
                "  targets:
    - credentialRef: {{ name: {a} }}
      model: upstream-{a}
    - credentialRef: {{ name: {b} }}
      model: upstream-{b}
"
            )
        };
        m += &route("sdk-chat", &one("chat", "upstream-chat"));
        m += &route("sdk-chat-stream", &one("streamer", "upstream-streamer"));
        m += &route("sdk-fallback", &two("primary", "backup"));
        m += &route("sdk-failing", &two("down-a", "down-b"));
        m += &route("sdk-embedding", &one("chat", "upstream-embedding"));
        m += &route("sdk-claude", &one("claude", "upstream-claude"));
        m += &route(
            "sdk-claude-stream",
            &one("claude-streamer", "upstream-claude-streamer"),
        );
        m += &route("sdk-chat-break", &one("breaker", "upstream-breaker"));
        m += &route(
            "sdk-claude-break",
            &one("claude-breaker", "upstream-claude-breaker"),
        );
        m += &route(
            "sdk-claude-overloaded",
            &two("claude-overloaded", "claude-streamer"),
        );
        m += &route("sdk-claude-failing", &two("claude-down-a", "claude-down-b"));
        m
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_python_sdks_parse_what_the_proxy_sends() {
    let python = match find_python().await {
        Ok(p) => p,
        Err(reason) if in_ci() => panic!(
            "CI is set but no Python with the SDKs was found: {reason}. \
             .ci/setup-python must run before the tests"
        ),
        Err(reason) => {
            // Straight to stderr, past the test harness's capture: a skip must be seen.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: SDK compatibility test: {reason}. To run it: run .ci/run, or \
                 python3 -m venv .venv && .venv/bin/pip install -r tests/sdk/requirements.txt \
                 (i.e. openai anthropic), or set SWITCHBACK_SDK_PYTHON"
            );
            return;
        }
    };

    let sims = Sims::start().await;
    let proxy = TestProxy::start(&sims.manifests()).await;
    let script = workspace_root().join("tests/sdk/compat.py");
    let stream_text = |name: &str| stream_pieces(name, STREAM_CHUNKS).concat();
    let partial = |name: &str, n: usize| stream_pieces(name, n).concat();
    let target = |cred: &str| format!("{NS}/{cred}");

    let child = loopback_only(&mut Command::new(&python))
        .arg(&script)
        .env("SWITCHBACK_URL", proxy.url(""))
        .env("SWITCHBACK_API_KEY", CLIENT_KEY)
        .env("SWITCHBACK_OPENAI_MODEL", "sdk-chat")
        .env("SWITCHBACK_OPENAI_TARGET", target("chat"))
        .env("SWITCHBACK_OPENAI_TEXT", answer_text("chat"))
        .env("SWITCHBACK_OPENAI_STREAM_MODEL", "sdk-chat-stream")
        .env("SWITCHBACK_OPENAI_STREAM_TEXT", stream_text("streamer"))
        .env("SWITCHBACK_FALLBACK_MODEL", "sdk-fallback")
        .env("SWITCHBACK_FALLBACK_TARGET", target("backup"))
        .env("SWITCHBACK_FALLBACK_TEXT", answer_text("backup"))
        .env("SWITCHBACK_FAILING_MODEL", "sdk-failing")
        .env("SWITCHBACK_FAILING_TARGETS", "2")
        .env("SWITCHBACK_EMBEDDING_MODEL", "sdk-embedding")
        .env("SWITCHBACK_ANTHROPIC_MODEL", "sdk-claude")
        .env("SWITCHBACK_ANTHROPIC_TEXT", answer_text("claude"))
        .env("SWITCHBACK_ANTHROPIC_STREAM_MODEL", "sdk-claude-stream")
        .env(
            "SWITCHBACK_ANTHROPIC_STREAM_TEXT",
            stream_text("claude-streamer"),
        )
        .env("SWITCHBACK_ANTHROPIC_FAILING_MODEL", "sdk-claude-failing")
        .env("SWITCHBACK_OPENAI_BREAK_MODEL", "sdk-chat-break")
        .env("SWITCHBACK_OPENAI_BREAK_TEXT", partial("breaker", 3))
        .env("SWITCHBACK_ANTHROPIC_BREAK_MODEL", "sdk-claude-break")
        .env(
            "SWITCHBACK_ANTHROPIC_BREAK_TEXT",
            partial("claude-breaker", 2),
        )
        .env(
            "SWITCHBACK_ANTHROPIC_OVERLOADED_MODEL",
            "sdk-claude-overloaded",
        )
        .env(
            "SWITCHBACK_ANTHROPIC_OVERLOADED_TEXT",
            stream_text("claude-streamer"),
        )
        .env("SWITCHBACK_UNKNOWN_MODEL", "sdk-no-such-model")
        .env_remove("SWITCHBACK_SDK_CASES")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    let out = tokio::time::timeout(SCRIPT_TIMEOUT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{} did not finish in {SCRIPT_TIMEOUT:?}", script.display()))
        .expect("collect the script's output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} failed ({}):\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
        script.display(),
        out.status
    );
    println!("{stdout}");

    // What the providers saw: the target's model and key, never the client's key.
    let sent = |sim: &SimProvider| sim.received().len();
    assert_eq!(sent(&sims.chat), 2, "unary chat + embeddings");
    assert_eq!(sent(&sims.streamer), 1);
    assert_eq!(sent(&sims.primary), 1, "one 503, no retry by default");
    assert_eq!(sent(&sims.backup), 1);
    assert_eq!(sent(&sims.down_a), 1);
    assert_eq!(sent(&sims.down_b), 1);
    assert_eq!(sent(&sims.claude), 1);
    assert_eq!(
        sent(&sims.claude_streamer),
        2,
        "its own route + the overload fallback"
    );
    assert_eq!(sent(&sims.claude_overloaded), 1);
    assert_eq!(
        sent(&sims.breaker),
        1,
        "no retry once the stream is committed"
    );
    assert_eq!(
        sent(&sims.claude_breaker),
        1,
        "no retry once the stream is committed"
    );
    assert_eq!(sent(&sims.claude_down_a), 2, "unary + stream");
    assert_eq!(sent(&sims.claude_down_b), 2, "unary + stream");
    let chat = sims.chat.received();
    assert_eq!(chat[0].model(), Some("upstream-chat"));
    assert_eq!(chat[1].path, "/v1/embeddings");
    assert_eq!(chat[1].model(), Some("upstream-embedding"));
    assert_eq!(
        sims.claude.received()[0].model(),
        Some("upstream-claude"),
        "upstream gets the target's model"
    );
    for sim in sims.all() {
        for r in sim.received() {
            for (name, value) in &r.headers {
                let value = String::from_utf8_lossy(value.as_bytes());
                assert!(
                    !value.contains(CLIENT_KEY),
                    "{}: the client's key reached the provider in {name}",
                    sim.name()
                );
            }
            let key = format!("sk-upstream-{}", sim.name());
            let auth = match sim.flavor() {
                Flavor::OpenAi => r.header("authorization").map(str::to_owned),
                Flavor::Anthropic => r.header("x-api-key").map(str::to_owned),
            };
            let want = match sim.flavor() {
                Flavor::OpenAi => format!("Bearer {key}"),
                Flavor::Anthropic => key,
            };
            assert_eq!(auth.as_deref(), Some(want.as_str()), "{}", sim.name());
        }
    }
}
