//! What metering adds to one request on the request path (issue 33): pricing its
//! usage exactly and counting the cost (`observe::cost`), and the OpenTelemetry GenAI
//! metrics (`observe::genai`: finding the series by the request and response models,
//! the histograms), against what the request path counted before (tokens and the
//! attempt histogram). Prints nanoseconds per request, one core; asserts nothing.
//!
//! `cargo bench -p switchback-proxy --bench metering`

use std::hint::black_box;
use std::time::{Duration, Instant};

use switchback_crds::config::Price;
use switchback_proxy::observe::cost::{Pricing, UsdCounter};
use switchback_proxy::observe::counters::RouteTargetCounters;
use switchback_proxy::observe::genai::{GenAi, Streamed};
use switchback_proxy::wire::rewrite::answer_model;
use switchback_proxy::wire::usage::Usage;

const ROUNDS: u32 = 2_000_000;

/// A typical unary chat completion answer, as a provider sends it.
const ANSWER: &[u8] = br#"{"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion","created":1741569952,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I assist you today?","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29},"service_tier":"default"}"#;

fn per_request(what: &str, mut f: impl FnMut(u64)) -> f64 {
    for i in 0..ROUNDS as u64 / 10 {
        f(i);
    }
    let start = Instant::now();
    for i in 0..ROUNDS as u64 {
        f(i);
    }
    let ns = start.elapsed().as_nanos() as f64 / f64::from(ROUNDS);
    println!("{what:<60} {ns:>7.1} ns");
    ns
}

fn main() {
    println!("metering cost per request (release build, one core, {ROUNDS} rounds)\n");
    let counters = RouteTargetCounters::default();
    let usage = |i: u64| Usage {
        input_tokens: 19 + (i & 7),
        output_tokens: 10 + (i & 3),
    };
    let before = per_request("before: tokens and the attempt histogram", |i| {
        counters.add_usage(black_box(usage(i)));
        counters
            .attempt_duration
            .observe(Duration::from_micros(800 + (i & 255)));
    });

    let cheap = Price {
        input_per_million: 0.15,
        output_per_million: 0.6,
    };
    let dear = Price {
        input_per_million: 2.5,
        output_per_million: 10.0,
    };
    let first = Pricing::new(Some(&cheap), Some(&cheap), 0);
    let fallback = Pricing::new(Some(&dear), Some(&cheap), 1);
    let client = UsdCounter::default();
    let cost = per_request("cost: priced exactly, target and client counters", |i| {
        let (c, extra) = black_box(&first).charge(black_box(usage(i)));
        counters.cost.add(c);
        counters.fallback_extra.add(extra);
        client.add(c);
    });
    let cost_fallback = per_request("cost: a fallback, and its extra beyond the first", |i| {
        let (c, extra) = black_box(&fallback).charge(black_box(usage(i)));
        counters.cost.add(c);
        counters.fallback_extra.add(extra);
        client.add(c);
    });

    let genai = GenAi::default();
    // A target that has seen three request models; this request asks for the third.
    for m in ["gpt-4o-mini", "gpt-4.1"] {
        genai.at("chat", m);
    }
    let unary = per_request(
        "GenAI, unary: series by models, answer's model, histograms",
        |i| {
            let at = genai.at("chat", black_box("gpt-4o"));
            let resp = genai.response_model(answer_model(black_box(ANSWER)));
            genai.answered_unary(
                at,
                resp,
                Duration::from_micros(800 + (i & 255)),
                Some(usage(i)),
            );
        },
    );
    let at = genai.at("chat", "gpt-4o");
    per_request("  of which: series by models", |_| {
        black_box(genai.at("chat", black_box("gpt-4o")));
    });
    per_request("  of which: finding the answer's model", |_| {
        black_box(answer_model(black_box(ANSWER)));
    });
    per_request("  of which: the answer's model", |_| {
        black_box(genai.response_model(answer_model(black_box(ANSWER))));
    });
    per_request("  of which: the histograms", |i| {
        genai.answered_unary(
            black_box(at),
            0,
            Duration::from_micros(800 + (i & 255)),
            Some(usage(i)),
        );
    });
    let stream = per_request("GenAI, stream end: duration, TTFT, TPOT, tokens", |i| {
        let at = genai.at("chat", black_box("gpt-4o"));
        genai.streamed(
            at,
            black_box(0),
            Streamed {
                duration: Duration::from_millis(900 + (i & 255)),
                first: Duration::from_millis(120),
                completed: true,
                usage: Some(usage(i)),
            },
        );
    });
    println!(
        "\nadded per unary request: {:.0} ns (cost) + {:.0} ns (GenAI) = {:.0} ns, against {before:.0} ns counted before; \
         a fallback's cost {cost_fallback:.0} ns; a stream's GenAI end {stream:.0} ns",
        cost,
        unary,
        cost + unary
    );
    black_box(client.get());
    black_box(genai.points().len());
}
