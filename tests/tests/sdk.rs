//! Compatibility with the official Python SDKs: simulated providers and the proxy run
//! in-process on loopback, and `tests/sdk/compat.py` drives them with the `openai` and
//! `anthropic` packages (unary, streams, fallbacks, error parsing, embeddings, model
//! lists), and across providers: the `openai` SDK answered by simulated Anthropic
//! providers and the `anthropic` SDK by simulated OpenAI providers (unary, streams,
//! tool call round trips, a fallback from an OpenAI to an Anthropic target), and two
//! chains across three providers each: the `openai` SDK through Azure OpenAI (429),
//! Gemini (503) to Anthropic, and the `anthropic` SDK through Azure OpenAI (429),
//! Bedrock (ThrottlingException, SigV4-signed) to Claude on Vertex (OAuth token,
//! `rawPredict`), unary and streamed; after which the test checks what each provider
//! received in its own wire format and authentication. The SDKs
//! authenticate as an LLMClient with their normal `api_key` (a wrong one raises
//! `AuthenticationError`, another namespace's route `NotFoundError`). Real clock: the
//! SDKs run in a child process.
//!
//! Interpreter: `$SWITCHBACK_SDK_PYTHON`, else `<workspace>/.venv/bin/python` (made by
//! `.ci/setup-python`). Without one that imports both packages the test is skipped
//! with a note, except under `CI`, where it fails.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use switchback_tests::harness::{self, NS, TestProxy, credential, route};
use switchback_tests::sim::{
    ANTHROPIC_TOOL_USE_ID, BEDROCK_ACCESS_KEY_ID, BEDROCK_SECRET_ACCESS_KEY, Behavior, Flavor,
    OPENAI_TOOL_CALL_ID, Received, SimProvider, ToolUse, answer_text, stream_pieces,
};

/// The three-cloud chain's models: a Bedrock model id (its colon travels encoded in
/// the path) and a Claude model on Vertex (served through `rawPredict`).
const CLOUD_BEDROCK_MODEL: &str = "anthropic.claude-3-5-sonnet-20240620-v1:0";
const CLOUD_VERTEX_MODEL: &str = "claude-sonnet-4-5@20250929";
use tokio::process::Command;

/// The key the SDK clients send (an LLMClient's, so the proxy runs with `--auth
/// required`); it must never reach a provider.
const CLIENT_KEY: &str = "sk-switchback-sdk-client";
/// Another namespace, whose route `FORBIDDEN_MODEL` the SDK's client may not call.
const OTHER_NS: &str = "team-other";
const FORBIDDEN_MODEL: &str = "sdk-other-team";
const STREAM_CHUNKS: usize = 5;
/// Whole-script limit: a hang must fail the test, not stall CI.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(180);
/// The tool the simulated models call in the cross-provider cases (compat.py declares
/// it with this name and answers it with `TOOL_RESULT`).
const TOOL_NAME: &str = "get_weather";
const TOOL_RESULT: &str = "18C and sunny";
/// What the simulated models say before their second (streamed) tool call.
const PREAMBLE: &str = "Let me check the weather.";
/// compat.py's system prompt and `TOOL_SCHEMA`.
const SYSTEM: &str = "You are terse.";

fn tool_args() -> Value {
    json!({"city": "Zürich", "unit": "celsius"})
}

fn tool_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
        },
        "required": ["city"]
    })
}

/// Tool call, answer, tool call after some text, answer: the provider side of a unary
/// and then a streamed round trip.
fn tool_script() -> Behavior {
    Behavior::Cycle(vec![
        Behavior::tool_call(TOOL_NAME, tool_args()),
        Behavior::Answer,
        Behavior::ToolCall {
            name: TOOL_NAME.into(),
            arguments: tool_args(),
            text: Some(PREAMBLE.into()),
        },
        Behavior::Answer,
    ])
}

fn body(r: &Received) -> &Value {
    r.json
        .as_ref()
        .unwrap_or_else(|| panic!("{} body is not JSON: {:?}", r.path, r.body))
}

fn roles(r: &Received) -> Vec<&str> {
    body(r)["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| m["role"].as_str().unwrap_or("?"))
        .collect()
}

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
    // Across providers: OpenAI SDK -> Anthropic targets.
    x_claude: SimProvider,
    x_claude_streamer: SimProvider,
    x_claude_tools: SimProvider,
    x_down: SimProvider,
    x_claude_backup: SimProvider,
    // Anthropic SDK -> OpenAI targets.
    x_gpt: SimProvider,
    x_gpt_streamer: SimProvider,
    x_gpt_tools: SimProvider,
    // OpenAI SDK -> a chain across three providers.
    chain_azure: SimProvider,
    chain_gemini: SimProvider,
    chain_claude: SimProvider,
    // Anthropic SDK -> a chain across three clouds: Azure, Bedrock, Vertex.
    cloud_azure: SimProvider,
    cloud_bedrock: SimProvider,
    cloud_vertex: SimProvider,
    // OpenAI SDK, POST /v1/responses.
    resp_claude: SimProvider,
    resp_primary: SimProvider,
    resp_backup: SimProvider,
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
            x_claude: SimProvider::start_named("x-claude", Flavor::Anthropic).await,
            x_claude_streamer: SimProvider::start_named("x-claude-streamer", Flavor::Anthropic)
                .await,
            x_claude_tools: SimProvider::start_named("x-claude-tools", Flavor::Anthropic).await,
            x_down: SimProvider::start_named("x-down", Flavor::OpenAi).await,
            x_claude_backup: SimProvider::start_named("x-claude-backup", Flavor::Anthropic).await,
            x_gpt: SimProvider::start_named("x-gpt", Flavor::OpenAi).await,
            x_gpt_streamer: SimProvider::start_named("x-gpt-streamer", Flavor::OpenAi).await,
            x_gpt_tools: SimProvider::start_named("x-gpt-tools", Flavor::OpenAi).await,
            chain_azure: SimProvider::start_named("chain-azure", Flavor::Azure).await,
            chain_gemini: SimProvider::start_named("chain-gemini", Flavor::Gemini).await,
            chain_claude: SimProvider::start_named("chain-claude", Flavor::Anthropic).await,
            cloud_azure: SimProvider::start_named("cloud-azure", Flavor::Azure).await,
            cloud_bedrock: SimProvider::start_named("cloud-bedrock", Flavor::Bedrock).await,
            cloud_vertex: SimProvider::start_named("cloud-vertex", Flavor::Vertex).await,
            resp_claude: SimProvider::start_named("resp-claude", Flavor::Anthropic).await,
            resp_primary: SimProvider::start_named("resp-primary", Flavor::OpenAi).await,
            resp_backup: SimProvider::start_named("resp-backup", Flavor::OpenAi).await,
        };
        sims.chain_azure.set_default(Behavior::RateLimited {
            retry_after_secs: 1,
        });
        sims.chain_azure.set_deployments(&["upstream-chain-azure"]);
        sims.chain_gemini.set_default(Behavior::ServerError(503));
        sims.cloud_azure.set_default(Behavior::RateLimited {
            retry_after_secs: 1,
        });
        sims.cloud_azure.set_deployments(&["upstream-cloud-azure"]);
        // ThrottlingException.
        sims.cloud_bedrock.set_default(Behavior::RateLimited {
            retry_after_secs: 1,
        });
        sims.resp_primary.set_default(Behavior::RateLimited {
            retry_after_secs: 1,
        });
        sims.x_claude_streamer.set_default(stream.clone());
        sims.x_gpt_streamer.set_default(stream.clone());
        sims.x_claude_tools.set_default(tool_script());
        sims.x_gpt_tools.set_default(tool_script());
        sims.x_down.set_default(Behavior::ServerError(503));
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

    fn all(&self) -> [&SimProvider; 30] {
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
            &self.x_claude,
            &self.x_claude_streamer,
            &self.x_claude_tools,
            &self.x_down,
            &self.x_claude_backup,
            &self.x_gpt,
            &self.x_gpt_streamer,
            &self.x_gpt_tools,
            &self.chain_azure,
            &self.chain_gemini,
            &self.chain_claude,
            &self.cloud_azure,
            &self.cloud_bedrock,
            &self.cloud_vertex,
            &self.resp_claude,
            &self.resp_primary,
            &self.resp_backup,
        ]
    }

    fn manifests(&self) -> String {
        let mut m = String::new();
        for sim in self.all() {
            let provider = match sim.flavor() {
                Flavor::OpenAi => "openai",
                Flavor::Azure => "azure-openai",
                Flavor::Gemini => "gemini",
                Flavor::Anthropic => "anthropic",
                // Bedrock signs with the whole Secret's AWS keys; Vertex exchanges a
                // service-account key for tokens: no `apiKey`.
                Flavor::Bedrock => {
                    m += &harness::bedrock_credential(
                        sim.name(),
                        &sim.base_url(),
                        BEDROCK_ACCESS_KEY_ID,
                        BEDROCK_SECRET_ACCESS_KEY,
                        None,
                    );
                    continue;
                }
                Flavor::Vertex => {
                    m += &harness::vertex_credential(
                        sim.name(),
                        &sim.base_url(),
                        &sim.service_account_json(),
                    );
                    continue;
                }
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
        for (route_name, cred) in [
            ("sdk-x-claude", "x-claude"),
            ("sdk-x-claude-stream", "x-claude-streamer"),
            ("sdk-x-claude-tools", "x-claude-tools"),
            ("sdk-x-gpt", "x-gpt"),
            ("sdk-x-gpt-stream", "x-gpt-streamer"),
            ("sdk-x-gpt-tools", "x-gpt-tools"),
        ] {
            m += &route(route_name, &one(cred, &format!("upstream-{cred}")));
        }
        m += &route("sdk-x-fallback", &two("x-down", "x-claude-backup"));
        let three = |targets: [(&str, &str); 3]| {
            let mut spec = String::from("  targets:\n");
            for (n, model) in targets {
                spec += &format!("    - credentialRef: {{ name: {n} }}\n      model: {model}\n");
            }
            spec
        };
        m += &route(
            "sdk-x-chain",
            &three([
                ("chain-azure", "upstream-chain-azure"),
                ("chain-gemini", "upstream-chain-gemini"),
                ("chain-claude", "upstream-chain-claude"),
            ]),
        );
        m += &route(
            "sdk-x-cloud",
            &three([
                ("cloud-azure", "upstream-cloud-azure"),
                ("cloud-bedrock", CLOUD_BEDROCK_MODEL),
                ("cloud-vertex", CLOUD_VERTEX_MODEL),
            ]),
        );
        // The Responses simulator knows OpenAI's model names only.
        m += &route(
            "sdk-responses",
            &three([
                ("resp-claude", "upstream-resp-claude"),
                ("resp-primary", "gpt-4o"),
                ("resp-backup", "gpt-4o-mini"),
            ]),
        );
        // The SDKs authenticate as this client (their normal `api_key`); it may call
        // every route of its namespace, not another namespace's unshared one.
        m += &format!(
            "---
apiVersion: v1
kind: Secret
metadata: {{ name: sdk-client-key, namespace: {NS} }}
stringData: {{ apiKey: {CLIENT_KEY} }}
---
apiVersion: switchback.dev/v1alpha1
kind: LLMClient
metadata: {{ name: sdk, namespace: {NS} }}
spec:
  keySecretRef: {{ name: sdk-client-key, key: apiKey }}
---
apiVersion: switchback.dev/v1alpha1
kind: ProviderCredential
metadata: {{ name: other, namespace: {OTHER_NS} }}
spec:
  provider: openai
  baseURL: {base}
  secretRef: {{ name: other-key, key: apiKey }}
  allowPrivateNetwork: true
---
apiVersion: v1
kind: Secret
metadata: {{ name: other-key, namespace: {OTHER_NS} }}
stringData: {{ apiKey: sk-upstream-other }}
---
apiVersion: switchback.dev/v1alpha1
kind: LLMRoute
metadata: {{ name: {FORBIDDEN_MODEL}, namespace: {OTHER_NS} }}
spec:
  targets:
    - credentialRef: {{ name: other }}
",
            base = self.chat.base_url()
        );
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
    assert_eq!(
        proxy.admin_config().await["auth"],
        "required",
        "manifests with an LLMClient authenticate"
    );
    let script = workspace_root().join("tests/sdk/compat.py");
    let stream_text = |name: &str| stream_pieces(name, STREAM_CHUNKS).concat();
    let partial = |name: &str, n: usize| stream_pieces(name, n).concat();
    let target = |cred: &str| format!("{NS}/{cred}");

    let child = loopback_only(&mut Command::new(&python))
        .arg(&script)
        .env("SWITCHBACK_URL", proxy.url(""))
        .env("SWITCHBACK_API_KEY", CLIENT_KEY)
        .env("SWITCHBACK_FORBIDDEN_MODEL", FORBIDDEN_MODEL)
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
        .env("SWITCHBACK_TOOL_NAME", TOOL_NAME)
        .env("SWITCHBACK_TOOL_ARGS", tool_args().to_string())
        .env("SWITCHBACK_OPENAI_X_MODEL", "sdk-x-claude")
        .env("SWITCHBACK_OPENAI_X_TARGET", target("x-claude"))
        .env("SWITCHBACK_OPENAI_X_TEXT", answer_text("x-claude"))
        .env("SWITCHBACK_OPENAI_X_STREAM_MODEL", "sdk-x-claude-stream")
        .env(
            "SWITCHBACK_OPENAI_X_STREAM_TEXT",
            stream_text("x-claude-streamer"),
        )
        .env("SWITCHBACK_OPENAI_X_TOOLS_MODEL", "sdk-x-claude-tools")
        // Tool call ids pass through translation unchanged.
        .env("SWITCHBACK_OPENAI_X_TOOL_ID", ANTHROPIC_TOOL_USE_ID)
        .env(
            "SWITCHBACK_OPENAI_X_TOOLS_TEXT",
            answer_text("x-claude-tools"),
        )
        .env("SWITCHBACK_OPENAI_X_TOOLS_PREAMBLE", PREAMBLE)
        .env("SWITCHBACK_OPENAI_X_FALLBACK_MODEL", "sdk-x-fallback")
        .env(
            "SWITCHBACK_OPENAI_X_FALLBACK_TARGET",
            target("x-claude-backup"),
        )
        .env(
            "SWITCHBACK_OPENAI_X_FALLBACK_TEXT",
            answer_text("x-claude-backup"),
        )
        .env("SWITCHBACK_ANTHROPIC_X_MODEL", "sdk-x-gpt")
        .env("SWITCHBACK_ANTHROPIC_X_TARGET", target("x-gpt"))
        .env("SWITCHBACK_ANTHROPIC_X_TEXT", answer_text("x-gpt"))
        .env("SWITCHBACK_ANTHROPIC_X_STREAM_MODEL", "sdk-x-gpt-stream")
        .env(
            "SWITCHBACK_ANTHROPIC_X_STREAM_TEXT",
            stream_text("x-gpt-streamer"),
        )
        .env("SWITCHBACK_ANTHROPIC_X_TOOLS_MODEL", "sdk-x-gpt-tools")
        .env("SWITCHBACK_ANTHROPIC_X_TOOL_ID", OPENAI_TOOL_CALL_ID)
        .env(
            "SWITCHBACK_ANTHROPIC_X_TOOLS_TEXT",
            answer_text("x-gpt-tools"),
        )
        .env("SWITCHBACK_ANTHROPIC_X_TOOLS_PREAMBLE", PREAMBLE)
        .env("SWITCHBACK_CHAIN_MODEL", "sdk-x-chain")
        .env("SWITCHBACK_CHAIN_TARGET", target("chain-claude"))
        .env("SWITCHBACK_CHAIN_TEXT", answer_text("chain-claude"))
        .env("SWITCHBACK_CLOUD_MODEL", "sdk-x-cloud")
        .env("SWITCHBACK_CLOUD_TARGET", target("cloud-vertex"))
        .env("SWITCHBACK_CLOUD_TEXT", answer_text("cloud-vertex"))
        .env("SWITCHBACK_RESPONSES_MODEL", "sdk-responses")
        .env("SWITCHBACK_RESPONSES_TARGET", target("resp-backup"))
        .env("SWITCHBACK_RESPONSES_TEXT", answer_text("resp-backup"))
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
    check_cross_provider(&sims);
    // The three-provider chain: azure parked after its 429 (the stream may skip it),
    // gemini refused both, anthropic answered both.
    assert!((1..=2).contains(&sent(&sims.chain_azure)), "chain-azure");
    assert_eq!(sent(&sims.chain_gemini), 2, "chain-gemini: unary + stream");
    assert_eq!(sent(&sims.chain_claude), 2, "chain-claude: unary + stream");
    let azure = &sims.chain_azure.received()[0];
    assert_eq!(azure.path, "/openai/v1/chat/completions");
    assert_eq!(
        azure.model(),
        Some("upstream-chain-azure"),
        "the deployment"
    );
    for r in sims.chain_gemini.received() {
        assert!(
            r.path.starts_with("/v1beta/models/upstream-chain-gemini:"),
            "{}",
            r.path
        );
        assert!(
            body(&r)["contents"].is_array(),
            "Gemini's wire: {}",
            body(&r)
        );
    }
    // The three-cloud chain (Anthropic SDK): Azure's 429 and Bedrock's
    // ThrottlingException fail over, Claude on Vertex answered both, each in its own
    // wire and with its own authentication.
    assert!((1..=2).contains(&sent(&sims.cloud_azure)), "cloud-azure");
    for r in sims.cloud_azure.received() {
        assert_eq!(r.path, "/openai/v1/chat/completions");
        assert_eq!(r.model(), Some("upstream-cloud-azure"), "the deployment");
    }
    assert!(
        (1..=2).contains(&sent(&sims.cloud_bedrock)),
        "cloud-bedrock"
    );
    for r in sims.cloud_bedrock.received() {
        assert!(
            r.path
                .starts_with("/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse"),
            "{}",
            r.path
        );
        assert!(
            r.header("authorization")
                .is_some_and(|a| a.starts_with("AWS4-HMAC-SHA256 ")),
            "SigV4"
        );
    }
    let vertex = sims.cloud_vertex.received();
    let vertex: Vec<&Received> = vertex.iter().filter(|r| r.path.contains(":")).collect();
    assert_eq!(vertex.len(), 2, "cloud-vertex: unary + stream");
    assert!(
        vertex[0].path.ends_with(&format!(
            "/publishers/anthropic/models/{CLOUD_VERTEX_MODEL}:rawPredict"
        )),
        "{}",
        vertex[0].path
    );
    assert!(
        vertex[1].path.ends_with(":streamRawPredict"),
        "{}",
        vertex[1].path
    );
    assert_eq!(sims.cloud_vertex.token_requests(), 1, "one token for both");
    // The Responses API: never sent to the Anthropic target, passed through to the
    // OpenAI ones with the target's model.
    assert_eq!(sent(&sims.resp_claude), 0, "skipped as unsupportedSurface");
    assert!((1..=2).contains(&sent(&sims.resp_primary)), "resp-primary");
    let backup = sims.resp_backup.received();
    assert_eq!(backup.len(), 2, "resp-backup: unary + stream");
    for r in &backup {
        assert_eq!(r.path, "/v1/responses");
        assert_eq!(r.model(), Some("gpt-4o-mini"));
        assert_eq!(body(r)["input"], "hello", "passed through");
    }

    for sim in sims.all() {
        for r in sim.received() {
            // Each provider is spoken to in its own wire format, whatever the client's.
            match sim.flavor() {
                Flavor::Anthropic => {
                    assert_eq!(r.path, "/v1/messages", "{}", sim.name());
                    assert!(
                        r.header("anthropic-version").is_some(),
                        "{}: no anthropic-version",
                        sim.name()
                    );
                    assert!(
                        body(&r)["max_tokens"].is_u64(),
                        "{}: Anthropic requires max_tokens: {}",
                        sim.name(),
                        body(&r)
                    );
                    assert_eq!(r.header("authorization"), None, "{}", sim.name());
                }
                Flavor::Bedrock => {
                    assert!(r.path.starts_with("/model/"), "{}: {}", sim.name(), r.path);
                }
                Flavor::Vertex => {
                    assert!(
                        r.path.starts_with("/v1/projects/") || r.path == "/token",
                        "{}: {}",
                        sim.name(),
                        r.path
                    );
                }
                Flavor::OpenAi | Flavor::Azure | Flavor::Gemini => {
                    assert!(
                        [
                            "/v1/chat/completions",
                            "/v1/embeddings",
                            "/v1/responses",
                            "/openai/v1/chat/completions",
                        ]
                        .contains(&r.path.as_str())
                            || r.path.starts_with("/v1beta/models/"),
                        "{}: {}",
                        sim.name(),
                        r.path
                    );
                    assert_eq!(r.header("x-api-key"), None, "{}", sim.name());
                }
            }
            for (name, value) in &r.headers {
                let value = String::from_utf8_lossy(value.as_bytes());
                assert!(
                    !value.contains(CLIENT_KEY),
                    "{}: the client's key reached the provider in {name}",
                    sim.name()
                );
            }
            // Bedrock signs with its AWS keys (the simulator checks the signature),
            // Vertex sends the token it was issued (checked likewise): no API key.
            match sim.flavor() {
                Flavor::Bedrock => {
                    let auth = r.header("authorization").unwrap_or_default();
                    assert!(
                        auth.starts_with(&format!(
                            "AWS4-HMAC-SHA256 Credential={BEDROCK_ACCESS_KEY_ID}/"
                        )),
                        "{}: {auth}",
                        sim.name()
                    );
                    continue;
                }
                Flavor::Vertex => {
                    if r.path != "/token" {
                        let auth = r.header("authorization").unwrap_or_default();
                        assert!(auth.starts_with("Bearer ya29."), "{}", sim.name());
                    }
                    continue;
                }
                _ => {}
            }
            let key = format!("sk-upstream-{}", sim.name());
            let auth = match sim.flavor() {
                Flavor::OpenAi => r.header("authorization").map(str::to_owned),
                Flavor::Azure => r.header("api-key").map(|k| format!("Bearer {k}")),
                Flavor::Gemini => r.header("x-goog-api-key").map(|k| format!("Bearer {k}")),
                Flavor::Anthropic => r.header("x-api-key").map(str::to_owned),
                Flavor::Bedrock | Flavor::Vertex => unreachable!("checked above"),
            };
            let want = match sim.flavor() {
                Flavor::Anthropic => key,
                _ => format!("Bearer {key}"),
            };
            assert_eq!(auth.as_deref(), Some(want.as_str()), "{}", sim.name());
        }
    }
}

/// What the providers of the cross-provider cases received, in their own format.
fn check_cross_provider(sims: &Sims) {
    // OpenAI SDK -> Anthropic, unary: system hoisted, limits and sampling mapped.
    let got = sims.x_claude.received();
    assert_eq!(got.len(), 1, "x-claude");
    let b = body(&got[0]);
    assert_eq!(got[0].model(), Some("upstream-x-claude"));
    assert_eq!(b["system"], SYSTEM, "{b}");
    assert_eq!(
        b["messages"],
        json!([{"role": "user", "content": "hello"}]),
        "{b}"
    );
    assert_eq!(b["max_tokens"], 100, "{b}");
    assert_eq!(b["temperature"], 0.5, "{b}");
    assert_eq!(b["stop_sequences"], json!(["END"]), "{b}");
    assert_ne!(b["stream"], true, "{b}");

    // OpenAI SDK -> Anthropic, stream: the default max_tokens (the client set none).
    let got = sims.x_claude_streamer.received();
    assert_eq!(got.len(), 1, "x-claude-streamer");
    let b = body(&got[0]);
    assert_eq!(b["stream"], true, "{b}");
    assert_eq!(b["max_tokens"], 4096, "documented default: {b}");
    assert_eq!(b.get("stream_options"), None, "not an Anthropic field: {b}");

    // OpenAI SDK -> Anthropic, tools: unary round trip, then streamed.
    let got = sims.x_claude_tools.received();
    assert_eq!(got.len(), 4, "x-claude-tools: call, answer, call, answer");
    let b = body(&got[0]);
    assert_eq!(
        b["tools"],
        json!([{"name": TOOL_NAME, "description": "Current weather for a city",
                "input_schema": tool_schema()}]),
        "{b}"
    );
    assert_eq!(b["tool_choice"], json!({"type": "auto"}), "{b}");
    assert!(got[0].tool_results().is_empty());
    assert!(got[2].tool_results().is_empty());
    assert_eq!(got[2].json.as_ref().unwrap()["stream"], true);
    assert_eq!(got[3].json.as_ref().unwrap()["stream"], true);
    assert_tool_follow_ups(&got, ANTHROPIC_TOOL_USE_ID, "user");
    for r in [&got[1], &got[3]] {
        let user = &body(r)["messages"][2]["content"];
        assert_eq!(user[0]["type"], "tool_result", "{user}");
    }
    // The text said before the streamed call goes back ahead of the tool_use block.
    let assistant = &body(&got[3])["messages"][1]["content"];
    assert_eq!(
        assistant[0],
        json!({"type": "text", "text": PREAMBLE}),
        "{assistant}"
    );
    assert_eq!(assistant[1]["type"], "tool_use", "{assistant}");

    // OpenAI SDK: fallback from an OpenAI target to an Anthropic one (unary + stream).
    let down = sims.x_down.received();
    assert_eq!(down.len(), 2, "x-down: unary + stream");
    assert!(down.iter().all(|r| r.path == "/v1/chat/completions"));
    assert_eq!(down[0].model(), Some("upstream-x-down"));
    let backup = sims.x_claude_backup.received();
    assert_eq!(backup.len(), 2, "x-claude-backup: unary + stream");
    assert_eq!(backup[0].model(), Some("upstream-x-claude-backup"));
    assert_eq!(body(&backup[1])["stream"], true);

    // Anthropic SDK -> OpenAI, unary: system message first, limits and sampling mapped.
    let got = sims.x_gpt.received();
    assert_eq!(got.len(), 1, "x-gpt");
    let b = body(&got[0]);
    assert_eq!(got[0].model(), Some("upstream-x-gpt"));
    assert_eq!(
        b["messages"],
        json!([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hello"}]),
        "{b}"
    );
    // `provider: openai`: the limit goes as max_completion_tokens.
    assert_eq!(b["max_completion_tokens"], 64, "{b}");
    assert_eq!(b.get("max_tokens"), None, "{b}");
    assert_eq!(b["stop"], json!(["END"]), "{b}");

    // Anthropic SDK -> OpenAI, stream: usage asked for, so the final event can carry it.
    let got = sims.x_gpt_streamer.received();
    assert_eq!(got.len(), 1, "x-gpt-streamer");
    let b = body(&got[0]);
    assert_eq!(b["stream"], true, "{b}");
    assert_eq!(b["stream_options"]["include_usage"], true, "{b}");

    // Anthropic SDK -> OpenAI, tools.
    let got = sims.x_gpt_tools.received();
    assert_eq!(got.len(), 4, "x-gpt-tools: call, answer, call, answer");
    let b = body(&got[0]);
    assert_eq!(
        b["tools"],
        json!([{"type": "function", "function": {"name": TOOL_NAME,
                "description": "Current weather for a city", "parameters": tool_schema()}}]),
        "{b}"
    );
    assert_eq!(b["tool_choice"], "auto", "{b}");
    assert_tool_follow_ups(&got, OPENAI_TOOL_CALL_ID, "tool");
    let assistant = &body(&got[3])["messages"][1];
    let content = match &assistant["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
        other => panic!("assistant content {other}"),
    };
    assert_eq!(content, PREAMBLE, "{assistant}");
}

/// Requests 1 and 3 of a tool round trip carry the call back and its result:
/// user, assistant (the call), then the result under `result_role`.
fn assert_tool_follow_ups(got: &[Received], id: &str, result_role: &str) {
    let call = ToolUse {
        id: id.into(),
        name: TOOL_NAME.into(),
        arguments: tool_args(),
    };
    for (k, r) in [(1, &got[1]), (3, &got[3])] {
        assert_eq!(
            roles(r),
            ["user", "assistant", result_role],
            "request {k}: {}",
            body(r)
        );
        assert_eq!(r.tool_names(), [TOOL_NAME], "request {k}");
        assert_eq!(
            r.tool_uses(),
            std::slice::from_ref(&call),
            "request {k}: {}",
            body(r)
        );
        let results = r.tool_results();
        assert_eq!(results.len(), 1, "request {k}: {}", body(r));
        assert_eq!(results[0].id, id, "request {k}");
        assert_eq!(results[0].text(), TOOL_RESULT, "request {k}");
    }
}
