//! Streams that survive their provider
//! (docs/streaming.md#streams-that-survive-their-provider): stall detection and resume
//! after commit, through the whole proxy against simulated providers that cut, stall or
//! send an in-band error after N content events, and record the prefill they were asked to
//! continue. Paused clock throughout: a stall is a virtual wait.

use serde_json::{Value, json};
use switchback_tests::harness::{
    TestProxy, credential, header, route, sdk_python, sdk_stream_script, streamed_text,
};
use switchback_tests::sim::{
    ANTHROPIC_ID, Behavior, CONTINUED_ANTHROPIC_ID, CONTINUED_OPENAI_ID, Flavor, OPENAI_ID,
    PROMPT_TOKENS, SimProvider, StreamFault, openai_tool_call_stream_events,
};

/// The answer every test's providers give, one word per content event.
const TEXT: &str = "one two three four five";

/// One target: its name, `provider:` value, flavor, and whether its credential
/// declares `prefill: true`.
struct Spec {
    name: &'static str,
    provider: &'static str,
    flavor: Flavor,
    prefill: bool,
}

const fn spec(name: &'static str, provider: &'static str, flavor: Flavor, prefill: bool) -> Spec {
    Spec {
        name,
        provider,
        flavor,
        prefill,
    }
}

/// Simulated providers for `targets` and a proxy whose route `smart` walks them in
/// order and resumes its streams (`stream:` block as given, indented four spaces).
async fn setup(targets: &[Spec], stream: &str) -> (Vec<SimProvider>, TestProxy) {
    let mut sims = Vec::new();
    let mut manifests = String::new();
    let mut route_targets = String::from("  targets:\n");
    for t in targets {
        let sim = SimProvider::start_named(t.name, t.flavor).await;
        let mut c = credential(t.name, t.provider, &sim.base_url(), "sk-test");
        if t.prefill {
            c = c.replace(
                "  allowPrivateNetwork: true\n",
                "  allowPrivateNetwork: true\n  prefill: true\n",
            );
        }
        manifests.push_str(&c);
        route_targets.push_str(&format!(
            "    - credentialRef: {{ name: {} }}\n      model: upstream-{}\n",
            t.name, t.name
        ));
        sims.push(sim);
    }
    manifests.push_str(&route(
        "smart",
        &format!("{route_targets}  timeout: 60s\n  stream:\n{stream}"),
    ));
    (sims, TestProxy::start(&manifests).await)
}

const RESUME: &str = "    idleTimeout: 5s\n    resume: { mode: Continue, maxResumes: 2 }\n";

fn fail_after(content: usize, fault: StreamFault) -> Behavior {
    Behavior::FailAfter {
        text: Some(TEXT.into()),
        content,
        fault,
    }
}

async fn chat(proxy: &TestProxy) -> reqwest::Response {
    let body = json!({"model": "smart", "stream": true, "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "count to five"}]});
    proxy.post("/v1/chat/completions", &body).await
}

async fn messages(proxy: &TestProxy) -> reqwest::Response {
    let body = json!({"model": "smart", "stream": true, "max_tokens": 64,
        "messages": [{"role": "user", "content": "count to five"}]});
    proxy.post("/v1/messages", &body).await
}

/// `(event name, data)` of every SSE event, comments left out.
fn events(text: &str) -> Vec<(Option<String>, Value)> {
    text.split("\n\n")
        .filter_map(|block| {
            let mut name = None;
            let mut data = None;
            for line in block.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_owned());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = serde_json::from_str(d).ok();
                }
            }
            Some((name, data?))
        })
        .collect()
}

fn resumed_comments(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| l.starts_with(": switchback resumed"))
        .collect()
}

/// The target that resumed, and the route's count, in `/admin/v1/stats`.
async fn resumed_stats(proxy: &TestProxy) -> (u64, Vec<u64>) {
    let stats = proxy.admin_stats().await;
    let route = &stats["routes"][0];
    let per_target = route["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["resumed"].as_u64().unwrap())
        .collect();
    (route["resumed"].as_u64().unwrap(), per_target)
}

async fn metric_lines(proxy: &TestProxy, name: &str) -> Vec<String> {
    proxy
        .admin_text("/metrics")
        .await
        .lines()
        .filter(|l| l.starts_with(name))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_cut_openai_stream_is_resumed_on_the_backup_as_one_stream() {
    let (sims, proxy) = setup(
        &[
            spec("primary", "openai-compatible", Flavor::OpenAi, false),
            spec("backup", "openai-compatible", Flavor::OpenAi, true),
        ],
        RESUME,
    )
    .await;
    sims[0].push(fail_after(2, StreamFault::Cut));
    sims[1].set_default(Behavior::AnswerText(TEXT.into()));
    let r = chat(&proxy).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-switchback-target"), "team-a/primary");
    let text = r.text().await.unwrap();
    assert_eq!(streamed_text(&text), TEXT, "{text}");
    assert_eq!(
        resumed_comments(&text),
        [": switchback resumed team-a/backup"]
    );
    let chunks = events(&text);
    assert!(
        chunks.iter().all(|(_, c)| c["id"] == OPENAI_ID),
        "one id: {text}"
    );
    assert!(!text.contains(CONTINUED_OPENAI_ID));
    assert!(chunks.iter().all(|(_, c)| c["model"] == "smart"), "{text}");
    let roles = chunks
        .iter()
        .filter(|(_, c)| c["choices"][0]["delta"]["role"].is_string())
        .count();
    assert_eq!(roles, 1, "one opening: {text}");
    assert!(text.trim_end().ends_with("data: [DONE]"));
    assert!(!text.contains("error"), "{text}");
    // The comment comes between the two attempts' text.
    let at = text.find(": switchback resumed").unwrap();
    assert_eq!(streamed_text(&text[..at]), "one two ");

    // What the backup was asked: the text the client had, whole, the vLLM way.
    let asked = &sims[1].received()[0];
    assert_eq!(asked.prefill().as_deref(), Some("one two "));
    let json = asked.json.as_ref().unwrap();
    assert_eq!(json["continue_final_message"], true);
    assert_eq!(json["add_generation_prompt"], false);
    assert_eq!(json["model"], "upstream-backup");

    // Usage: the primary reported none before the cut; the backup's.
    let usage = &chunks
        .iter()
        .rev()
        .find(|(_, c)| c["usage"].is_object())
        .unwrap()
        .1["usage"];
    assert_eq!(usage["prompt_tokens"], PROMPT_TOKENS);
    assert_eq!(usage["completion_tokens"], 3);

    assert_eq!(resumed_stats(&proxy).await, (1, vec![0, 1]));
    let stats = proxy.admin_stats().await;
    let failures = &stats["routes"][0]["targets"][0]["failures"];
    assert_eq!(failures["connectionError"], 1, "{failures}");
    assert_eq!(stats["routes"][0]["failed"], 0, "the request did not fail");
    let lines = metric_lines(&proxy, "switchback_stream_resumes_total").await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("target=\"team-a/backup\"") && lines[0].contains("outcome=\"resumed\""),
        "{lines:?}"
    );
    assert!(lines[0].ends_with(" 1"), "{lines:?}");
}

#[tokio::test(start_paused = true)]
async fn a_cut_anthropic_stream_is_resumed_with_one_message_and_summed_usage() {
    let (sims, proxy) = setup(
        &[
            spec("primary", "anthropic", Flavor::Anthropic, false),
            spec("backup", "anthropic", Flavor::Anthropic, false),
        ],
        RESUME,
    )
    .await;
    sims[0].push(fail_after(2, StreamFault::Cut));
    sims[1].set_default(Behavior::AnswerText(TEXT.into()));
    let r = messages(&proxy).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert_eq!(streamed_text(&text), TEXT, "{text}");
    assert_eq!(
        resumed_comments(&text),
        [": switchback resumed team-a/backup"]
    );
    let evs = events(&text);
    let names: Vec<&str> = evs.iter().filter_map(|(n, _)| n.as_deref()).collect();
    assert_eq!(
        names.iter().filter(|n| **n == "message_start").count(),
        1,
        "{text}"
    );
    assert_eq!(
        names.iter().filter(|n| **n == "message_stop").count(),
        1,
        "{text}"
    );
    assert_eq!(names.last(), Some(&"message_stop"));
    assert!(!names.contains(&"error"), "{text}");
    // One text block, index 0, started once and stopped once.
    assert_eq!(
        names
            .iter()
            .filter(|n| **n == "content_block_start")
            .count(),
        1,
        "{text}"
    );
    assert!(
        evs.iter()
            .filter(|(n, _)| n.as_deref().is_some_and(|n| n.starts_with("content_block")))
            .all(|(_, e)| e["index"] == 0),
        "{text}"
    );
    assert_eq!(evs[0].1["message"]["id"], ANTHROPIC_ID);
    assert!(!text.contains(CONTINUED_ANTHROPIC_ID));
    assert_eq!(evs[0].1["message"]["model"], "smart");

    // Anthropic refuses trailing whitespace: the prefill leaves it out, and the
    // continuation's leading space is not sent again.
    assert_eq!(sims[1].received()[0].prefill().as_deref(), Some("one two"));

    // Usage: both attempts' input, and their output added up.
    let start_output = evs[0].1["message"]["usage"]["output_tokens"]
        .as_u64()
        .unwrap();
    let delta = &evs
        .iter()
        .find(|(n, _)| n.as_deref() == Some("message_delta"))
        .unwrap()
        .1;
    assert_eq!(delta["usage"]["input_tokens"], 2 * PROMPT_TOKENS, "{delta}");
    assert_eq!(delta["usage"]["output_tokens"], start_output + 3, "{delta}");
    assert_eq!(resumed_stats(&proxy).await, (1, vec![0, 1]));
}

#[tokio::test(start_paused = true)]
async fn an_openai_client_is_resumed_on_an_anthropic_backup_through_translation() {
    let (sims, proxy) = setup(
        &[
            spec("primary", "openai-compatible", Flavor::OpenAi, false),
            spec("backup", "anthropic", Flavor::Anthropic, false),
        ],
        RESUME,
    )
    .await;
    sims[0].push(fail_after(3, StreamFault::Cut));
    sims[1].set_default(Behavior::AnswerText(TEXT.into()));
    let text = chat(&proxy).await.text().await.unwrap();
    assert_eq!(streamed_text(&text), TEXT, "{text}");
    let chunks = events(&text);
    assert!(chunks.iter().all(|(_, c)| c["id"] == OPENAI_ID), "{text}");
    assert!(
        chunks
            .iter()
            .all(|(_, c)| c["object"] == "chat.completion.chunk")
    );
    assert_eq!(
        chunks
            .iter()
            .filter(|(_, c)| c["choices"][0]["finish_reason"] == "stop")
            .count(),
        1,
        "{text}"
    );
    assert!(text.trim_end().ends_with("data: [DONE]"));
    let asked = &sims[1].received()[0];
    assert_eq!(asked.path, "/v1/messages", "translated");
    assert_eq!(asked.prefill().as_deref(), Some("one two three"));
}

#[tokio::test(start_paused = true)]
async fn a_stall_past_the_idle_timeout_is_resumed() {
    let (sims, proxy) = setup(
        &[
            spec("primary", "anthropic", Flavor::Anthropic, false),
            spec("backup", "anthropic", Flavor::Anthropic, false),
        ],
        RESUME,
    )
    .await;
    sims[0].push(fail_after(2, StreamFault::Stall));
    sims[1].set_default(Behavior::AnswerText(TEXT.into()));
    let started = tokio::time::Instant::now();
    let text = messages(&proxy).await.text().await.unwrap();
    let took = started.elapsed();
    assert!(
        took >= std::time::Duration::from_secs(5) && took < std::time::Duration::from_secs(6),
        "the idle timeout, not the route's: {took:?}"
    );
    assert_eq!(streamed_text(&text), TEXT, "{text}");
    assert_eq!(resumed_comments(&text).len(), 1);
    let stats = proxy.admin_stats().await;
    assert_eq!(stats["routes"][0]["targets"][0]["failures"]["timeout"], 1);
    assert_eq!(resumed_stats(&proxy).await, (1, vec![0, 1]));
}

#[tokio::test(start_paused = true)]
async fn a_stall_without_resume_ends_with_the_error_event_after_the_idle_timeout() {
    let (sims, proxy) = setup(
        &[
            spec("primary", "openai-compatible", Flavor::OpenAi, false),
            spec("backup", "openai-compatible", Flavor::OpenAi, true),
        ],
        "    idleTimeout: 3s\n",
    )
    .await;
    sims[0].push(fail_after(2, StreamFault::Stall));
    let started = tokio::time::Instant::now();
    let text = chat(&proxy).await.text().await.unwrap();
    let took = started.elapsed();
    assert!(
        took >= std::time::Duration::from_secs(3) && took < std::time::Duration::from_secs(4),
        "{took:?}"
    );
    let last = events(&text).pop().unwrap().1;
    assert_eq!(last["error"]["code"], "stream_interrupted", "{text}");
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .contains("stalled")
    );
    assert_eq!(sims[1].hits(), 0);
    assert!(resumed_comments(&text).is_empty());
    let stats = proxy.admin_stats().await;
    assert_eq!(stats["routes"][0]["failed"], 1);
}

#[tokio::test(start_paused = true)]
async fn an_in_band_error_after_commit_is_resumed_and_not_shown() {
    for (flavor, provider) in [
        (Flavor::Anthropic, "anthropic"),
        (Flavor::OpenAi, "openai-compatible"),
    ] {
        let (sims, proxy) = setup(
            &[
                spec("primary", provider, flavor, false),
                spec("backup", "anthropic", Flavor::Anthropic, false),
            ],
            RESUME,
        )
        .await;
        sims[0].push(fail_after(2, StreamFault::Error));
        sims[1].set_default(Behavior::AnswerText(TEXT.into()));
        let text = match flavor {
            Flavor::Anthropic => messages(&proxy).await,
            _ => chat(&proxy).await,
        }
        .text()
        .await
        .unwrap();
        assert_eq!(streamed_text(&text), TEXT, "{flavor:?}: {text}");
        assert!(
            !text.contains("overloaded") && !text.contains("server_error"),
            "{flavor:?}: the error is not relayed: {text}"
        );
        let stats = proxy.admin_stats().await;
        assert_eq!(
            stats["routes"][0]["targets"][0]["failures"]["status5xx"], 1,
            "{flavor:?}"
        );
        assert_eq!(resumed_stats(&proxy).await, (1, vec![0, 1]), "{flavor:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_tool_call_in_progress_is_not_resumed() {
    let (sims, proxy) = setup(
        &[
            spec("primary", "openai-compatible", Flavor::OpenAi, false),
            spec("backup", "anthropic", Flavor::Anthropic, false),
        ],
        RESUME,
    )
    .await;
    let args = json!({"city": "Paris", "unit": "celsius"});
    let all = openai_tool_call_stream_events("m", Some("Let me look. "), "weather", &args, false);
    let finish = all
        .iter()
        .position(|e| e.contains("\"finish_reason\":\"tool_calls\""))
        .unwrap();
    sims[0].push(Behavior::BrokenToolCall {
        name: "weather".into(),
        arguments: args,
        text: Some("Let me look. ".into()),
        events: finish - 1,
    });
    let text = chat(&proxy).await.text().await.unwrap();
    let last = events(&text).pop().unwrap().1;
    assert_eq!(last["error"]["code"], "stream_interrupted", "{text}");
    assert!(resumed_comments(&text).is_empty());
    assert_eq!(sims[1].hits(), 0, "nothing asked of the backup");
    let lines = metric_lines(&proxy, "switchback_stream_resumes_total").await;
    assert!(
        lines.iter().any(|l| l.contains("target=\"team-a/primary\"")
            && l.contains("outcome=\"toolCallInProgress\"")
            && l.ends_with(" 1")),
        "{lines:?}"
    );
    let stats = proxy.admin_stats().await;
    assert_eq!(stats["routes"][0]["failed"], 1);
    assert_eq!(resumed_stats(&proxy).await, (0, vec![0, 0]));
}

#[tokio::test(start_paused = true)]
async fn a_completed_tool_call_does_not_prevent_a_resume() {
    // An Anthropic stream: text, a tool_use block that completed, then more text that
    // breaks. The continuation goes on after the client's text.
    let (sims, proxy) = setup(
        &[
            spec("primary", "anthropic", Flavor::Anthropic, false),
            spec("backup", "anthropic", Flavor::Anthropic, false),
        ],
        RESUME,
    )
    .await;
    let args = json!({"city": "Paris"});
    // The whole tool call, cut before its message_delta: the tool_use block is
    // stopped, nothing is streaming.
    let all =
        switchback_tests::sim::anthropic_tool_use_stream_events("m", Some("one two "), "f", &args);
    let stop = all
        .iter()
        .rposition(|e| e.contains("content_block_stop"))
        .unwrap();
    sims[0].push(Behavior::BrokenToolCall {
        name: "f".into(),
        arguments: args,
        text: Some("one two ".into()),
        events: stop + 1,
    });
    sims[1].set_default(Behavior::AnswerText(TEXT.into()));
    let text = messages(&proxy).await.text().await.unwrap();
    assert_eq!(resumed_comments(&text).len(), 1, "{text}");
    assert_eq!(streamed_text(&text), TEXT, "{text}");
    // The continuation's text block comes after the tool_use block: a new index.
    let starts: Vec<u64> = events(&text)
        .iter()
        .filter(|(n, _)| n.as_deref() == Some("content_block_start"))
        .map(|(_, e)| e["index"].as_u64().unwrap())
        .collect();
    assert_eq!(starts, [0, 1, 2], "{text}");
}

#[tokio::test(start_paused = true)]
async fn more_text_than_max_held_bytes_is_not_resumed() {
    let (sims, proxy) = setup(
        &[
            spec("primary", "anthropic", Flavor::Anthropic, false),
            spec("backup", "anthropic", Flavor::Anthropic, false),
        ],
        "    resume: { mode: Continue, maxHeldBytes: 1Ki }\n",
    )
    .await;
    let long = "word ".repeat(400); // 2000 bytes
    sims[0].push(Behavior::FailAfter {
        text: Some(long.clone()),
        content: 300,
        fault: StreamFault::Cut,
    });
    let text = messages(&proxy).await.text().await.unwrap();
    assert_eq!(streamed_text(&text), long[..1500], "all that was sent");
    let last = events(&text).pop().unwrap();
    assert_eq!(last.0.as_deref(), Some("error"), "{text}");
    assert_eq!(sims[1].hits(), 0);
    let lines = metric_lines(&proxy, "switchback_stream_resumes_total").await;
    assert!(
        lines
            .iter()
            .any(|l| l.contains("outcome=\"heldBytesExceeded\"") && l.ends_with(" 1")),
        "{lines:?}"
    );
    let held = metric_lines(&proxy, "switchback_resume_held_bytes").await;
    assert_eq!(held, ["switchback_resume_held_bytes 0"], "released");
}

#[tokio::test(start_paused = true)]
async fn targets_that_cannot_continue_a_prefill_are_skipped_as_cannot_resume() {
    let (sims, proxy) = setup(
        &[
            spec("primary", "anthropic", Flavor::Anthropic, false),
            spec("plain", "openai-compatible", Flavor::OpenAi, false),
            spec("openai", "openai", Flavor::OpenAi, false),
            spec("backup", "anthropic", Flavor::Anthropic, false),
        ],
        RESUME,
    )
    .await;
    sims[0].push(fail_after(2, StreamFault::Cut));
    sims[3].set_default(Behavior::AnswerText(TEXT.into()));
    let text = messages(&proxy).await.text().await.unwrap();
    assert_eq!(streamed_text(&text), TEXT, "{text}");
    assert_eq!(
        resumed_comments(&text),
        [": switchback resumed team-a/backup"]
    );
    assert_eq!((sims[1].hits(), sims[2].hits()), (0, 0));
    let stats = proxy.admin_stats().await;
    for t in [1, 2] {
        assert_eq!(
            stats["routes"][0]["targets"][t]["failures"]["cannotResume"], 1,
            "{}",
            stats["routes"][0]["targets"][t]
        );
    }
    let skips = metric_lines(&proxy, "switchback_skips_total").await;
    assert_eq!(
        skips
            .iter()
            .filter(|l| l.contains("reason=\"cannotResume\""))
            .count(),
        2,
        "{skips:?}"
    );

    // Only targets that cannot: nothing left to resume on.
    let (sims, proxy) = setup(
        &[
            spec("primary", "anthropic", Flavor::Anthropic, false),
            spec("openai", "openai", Flavor::OpenAi, false),
        ],
        RESUME,
    )
    .await;
    sims[0].push(fail_after(2, StreamFault::Cut));
    let text = messages(&proxy).await.text().await.unwrap();
    assert_eq!(events(&text).pop().unwrap().0.as_deref(), Some("error"));
    assert_eq!(sims[1].hits(), 0);
    let lines = metric_lines(&proxy, "switchback_stream_resumes_total").await;
    assert!(
        lines
            .iter()
            .any(|l| l.contains("outcome=\"noEligibleTarget\"") && l.contains("team-a/primary")),
        "{lines:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn max_resumes_bounds_how_often_a_stream_is_resumed() {
    let (sims, proxy) = setup(
        &[
            spec("primary", "anthropic", Flavor::Anthropic, false),
            spec("second", "anthropic", Flavor::Anthropic, false),
            spec("third", "anthropic", Flavor::Anthropic, false),
        ],
        "    resume: { mode: Continue, maxResumes: 1 }\n",
    )
    .await;
    // The second continues "one" with " two ...": its first content event is the
    // space the client has (not sent again), its second "two ".
    sims[0].push(fail_after(1, StreamFault::Cut));
    sims[1].push(fail_after(2, StreamFault::Cut));
    let text = messages(&proxy).await.text().await.unwrap();
    assert_eq!(
        resumed_comments(&text),
        [": switchback resumed team-a/second"]
    );
    assert_eq!(streamed_text(&text), "one two ", "{text}");
    assert_eq!(events(&text).pop().unwrap().0.as_deref(), Some("error"));
    assert_eq!(sims[2].hits(), 0);
    let lines = metric_lines(&proxy, "switchback_stream_resumes_total").await;
    assert!(
        lines
            .iter()
            .any(|l| l.contains("outcome=\"maxResumesUsed\"") && l.contains("team-a/second")),
        "{lines:?}"
    );

    // With two allowed, the third target finishes the answer.
    let (sims, proxy) = setup(
        &[
            spec("primary", "anthropic", Flavor::Anthropic, false),
            spec("second", "anthropic", Flavor::Anthropic, false),
            spec("third", "anthropic", Flavor::Anthropic, false),
        ],
        RESUME,
    )
    .await;
    // The second continues "one" with " two ...": its first content event is the
    // space the client has (not sent again), its second "two ".
    sims[0].push(fail_after(1, StreamFault::Cut));
    sims[1].push(fail_after(2, StreamFault::Cut));
    sims[2].set_default(Behavior::AnswerText(TEXT.into()));
    let text = messages(&proxy).await.text().await.unwrap();
    assert_eq!(streamed_text(&text), TEXT, "{text}");
    assert_eq!(
        resumed_comments(&text),
        [
            ": switchback resumed team-a/second",
            ": switchback resumed team-a/third"
        ]
    );
    assert_eq!(sims[2].received()[0].prefill().as_deref(), Some("one two"));
    assert_eq!(resumed_stats(&proxy).await, (2, vec![0, 1, 1]));
}

/// The official Python SDKs parse a resumed stream as one answer whose text is the
/// exact concatenation: an OpenAI client resumed on an Anthropic target (translated)
/// after a cut, an Anthropic client resumed after an in-band overload error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_sdks_parse_a_resumed_stream_as_one_answer() {
    let Some(python) = sdk_python() else {
        return;
    };
    let names = ["chat-primary", "chat-backup", "msg-primary", "msg-backup"];
    let flavors = [
        Flavor::OpenAi,
        Flavor::Anthropic,
        Flavor::Anthropic,
        Flavor::Anthropic,
    ];
    let providers = ["openai-compatible", "anthropic", "anthropic", "anthropic"];
    let mut sims = Vec::new();
    let mut manifests = String::new();
    for ((name, flavor), provider) in names.iter().zip(flavors).zip(providers) {
        let sim = SimProvider::start_named(*name, flavor).await;
        manifests.push_str(&credential(name, provider, &sim.base_url(), "sk-test"));
        sims.push(sim);
    }
    for (model, first, second) in [
        ("resumed-chat", "chat-primary", "chat-backup"),
        ("resumed-messages", "msg-primary", "msg-backup"),
    ] {
        manifests.push_str(&route(
            model,
            &format!(
                "  targets:\n    - credentialRef: {{ name: {first} }}\n    - credentialRef: {{ name: {second} }}\n  stream:\n    resume: {{ mode: Continue }}\n"
            ),
        ));
    }
    sims[0].push(fail_after(2, StreamFault::Cut));
    sims[1].set_default(Behavior::AnswerText(TEXT.into()));
    sims[2].push(fail_after(3, StreamFault::Error));
    sims[3].set_default(Behavior::AnswerText(TEXT.into()));
    let proxy = TestProxy::start(&manifests).await;
    let got = sdk_stream_script(&python, &proxy, "resumed-chat", "resumed-messages").await;

    let o = &got["openai"];
    assert_eq!(o["text"], TEXT, "{o}");
    assert_eq!(o["deltas"], TEXT, "no character repeated or missing: {o}");
    assert_eq!(o["finish_reason"], "stop");
    assert_eq!(o["id"], OPENAI_ID, "the first stream's id");
    assert_eq!(o["model"], "resumed-chat");
    assert_eq!(sims[1].received()[0].prefill().as_deref(), Some("one two"));

    let a = &got["anthropic"];
    assert_eq!(a["text"], TEXT, "{a}");
    assert_eq!(a["deltas"], TEXT, "{a}");
    assert_eq!(a["blocks"], 1, "one text block: {a}");
    assert_eq!(a["stop_reason"], "end_turn");
    assert_eq!(a["id"], ANTHROPIC_ID);
    assert_eq!(a["model"], "resumed-messages");
    assert_eq!(a["usage"]["input_tokens"], 2 * PROMPT_TOKENS, "summed: {a}");
    assert_eq!(
        sims[3].received()[0].prefill().as_deref(),
        Some("one two three")
    );
}
