//! The OpenTelemetry GenAI semantic conventions' metrics of upstream operations: each
//! try the proxy sends a provider is a GenAI client operation, counted per (route,
//! target) in histograms with the conventions' bucket boundaries:
//! `gen_ai.client.token.usage` (`{token}`, by `gen_ai.token.type`),
//! `gen_ai.client.operation.duration` (s, with `error.type` when it failed),
//! `gen_ai.server.time_to_first_token` and `gen_ai.server.time_per_output_token` (s,
//! streams that completed). Their attributes are the operation (`chat`,
//! `embeddings`), the request model (the upstream model asked for) and the response
//! model (the one the answer names); the provider is the target's, added where they
//! are read (`admin::genai`, Prometheus and OTLP).
//!
//! The request path finds its series by small slot tables, not by formatting labels:
//! a model name is compared with the few a target has seen and stored once, the first
//! time (the only allocation, once per name); the series themselves are made on first
//! use. Names are bounded: past `MAX_REQUEST_MODELS` request models or
//! `MAX_RESPONSE_MODELS` response models a target counts the rest as `_OTHER` (a
//! provider names its response model, and is not trusted to keep their number small).

use std::borrow::Cow;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::observe::reason::Reason;
use crate::wire::usage::Usage;

/// `gen_ai.client.token.usage`'s advised bucket boundaries.
pub(crate) const TOKEN_BOUNDS: [f64; 14] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];
/// `gen_ai.client.operation.duration`'s.
pub(crate) const DURATION_BOUNDS: [f64; 14] = [
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];
/// `gen_ai.server.time_to_first_token`'s.
pub(crate) const TTFT_BOUNDS: [f64; 16] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];
/// `gen_ai.server.time_per_output_token`'s.
pub(crate) const TPOT_BOUNDS: [f64; 13] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
];

/// `gen_ai.operation.name` values, by [`At::op`].
pub(crate) const OPERATIONS: [&str; 2] = ["chat", "embeddings"];
/// The [`OPERATIONS`] index of `embeddings`, which has no output tokens.
const EMBEDDINGS: usize = 1;
/// Request models one target keeps apart; more are `_OTHER`.
pub(crate) const MAX_REQUEST_MODELS: usize = 16;
/// Response models one target keeps apart; more are `_OTHER`.
pub(crate) const MAX_RESPONSE_MODELS: usize = 8;
/// The value of a name past the slots (the conventions' fallback value).
pub(crate) const OTHER: &str = "_OTHER";
/// Longer response model names are `_OTHER`.
const MAX_NAME_BYTES: usize = 256;

/// Response slots: the named ones, `_OTHER`, and "the answer named none".
const RESPONSE_SLOTS: usize = MAX_RESPONSE_MODELS + 2;
/// The response slot of an answer that named no model.
pub(crate) const NO_RESPONSE_MODEL: u8 = (MAX_RESPONSE_MODELS + 1) as u8;

/// One metric of the conventions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    TokenUsage,
    OperationDuration,
    TimeToFirstToken,
    TimePerOutputToken,
}

impl Kind {
    pub const ALL: [Kind; 4] = [
        Kind::TokenUsage,
        Kind::OperationDuration,
        Kind::TimeToFirstToken,
        Kind::TimePerOutputToken,
    ];

    /// The conventions' name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::TokenUsage => "gen_ai.client.token.usage",
            Kind::OperationDuration => "gen_ai.client.operation.duration",
            Kind::TimeToFirstToken => "gen_ai.server.time_to_first_token",
            Kind::TimePerOutputToken => "gen_ai.server.time_per_output_token",
        }
    }

    /// The conventions' unit (UCUM).
    pub fn unit(self) -> &'static str {
        match self {
            Kind::TokenUsage => "{token}",
            _ => "s",
        }
    }

    pub fn description(self) -> &'static str {
        match self {
            Kind::TokenUsage => "Number of input and output tokens used.",
            Kind::OperationDuration => "GenAI operation duration.",
            Kind::TimeToFirstToken => "Time to generate first token for successful responses.",
            Kind::TimePerOutputToken => {
                "Time per output token generated after the first token for successful responses."
            }
        }
    }

    pub(crate) fn bounds(self) -> &'static [f64] {
        match self {
            Kind::TokenUsage => &TOKEN_BOUNDS,
            Kind::OperationDuration => &DURATION_BOUNDS,
            Kind::TimeToFirstToken => &TTFT_BOUNDS,
            Kind::TimePerOutputToken => &TPOT_BOUNDS,
        }
    }

    /// A histogram's raw sum in this metric's unit: tokens, or microseconds.
    pub fn sum(self, raw: u64) -> f64 {
        match self {
            Kind::TokenUsage => raw as f64,
            _ => raw as f64 / 1e6,
        }
    }
}

/// A lock-free histogram over fixed bounds; `B` counts the buckets, the last one
/// above every bound. Sums are integers: tokens, or microseconds.
#[derive(Debug)]
pub(crate) struct Hist<const B: usize> {
    counts: [AtomicU64; B],
    sum: AtomicU64,
}

impl<const B: usize> Default for Hist<B> {
    fn default() -> Self {
        Self {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum: AtomicU64::new(0),
        }
    }
}

impl<const B: usize> Hist<B> {
    fn observe(&self, bounds: &[f64], value: f64, raw: u64) {
        debug_assert_eq!(bounds.len() + 1, B);
        let i = bounds
            .iter()
            .position(|b| value <= *b)
            .unwrap_or(bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(raw, Ordering::Relaxed);
    }

    fn tokens(&self, n: u64) {
        self.observe(&TOKEN_BOUNDS, n as f64, n);
    }

    fn seconds(&self, bounds: &[f64], d: Duration) {
        self.observe(bounds, d.as_secs_f64(), d.as_micros() as u64);
    }

    /// What it holds now.
    fn read(&self) -> HistData {
        HistData {
            counts: self
                .counts
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            sum: self.sum.load(Ordering::Relaxed),
        }
    }
}

/// A histogram as read: per-bucket (not cumulative) counts, the last one above every
/// bound, and the raw sum. Several targets' are merged where their labels meet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HistData {
    pub counts: Vec<u64>,
    pub sum: u64,
}

impl HistData {
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    pub(crate) fn merge(&mut self, o: &HistData) {
        if self.counts.len() < o.counts.len() {
            self.counts.resize(o.counts.len(), 0);
        }
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
        self.sum += o.sum;
    }
}

/// The series of one (operation, request model, response model) that answered.
#[derive(Debug, Default)]
struct Answered {
    input: Hist<15>,
    output: Hist<15>,
    duration: Hist<15>,
    ttft: Hist<17>,
    tpot: Hist<14>,
}

impl Answered {
    /// One answer's tokens; an embedding has input only.
    fn count_tokens(&self, at: At, u: Usage) {
        self.input.tokens(u.input_tokens);
        if usize::from(at.op) != EMBEDDINGS {
            self.output.tokens(u.output_tokens);
        }
    }
}

/// One operation of one request model: what answered, by response model slot, and
/// what failed, by reason.
#[derive(Debug, Default)]
struct Operation {
    answered: [OnceLock<Box<Answered>>; RESPONSE_SLOTS],
    failed: OnceLock<Box<[Hist<15>; Reason::COUNT]>>,
}

#[derive(Debug)]
struct RequestModel {
    name: Box<str>,
    ops: [Operation; OPERATIONS.len()],
}

/// Where one operation's metrics go: its operation and request model slots. Found
/// once per try.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct At {
    op: u8,
    req: u8,
}

/// How a stream answered, for [`GenAi::streamed`].
#[derive(Clone, Copy, Debug)]
pub struct Streamed {
    /// The try's start to the stream's end.
    pub duration: Duration,
    /// The try's start to its first content event.
    pub first: Duration,
    /// The provider ended the stream (not the client, not a failure).
    pub completed: bool,
    /// The usage its provider reported.
    pub usage: Option<Usage>,
}

/// One target's GenAI metrics (per route), kept across reloads with its counters.
#[derive(Debug, Default)]
pub struct GenAi {
    requests: [OnceLock<Box<RequestModel>>; MAX_REQUEST_MODELS + 1],
    responses: [OnceLock<Box<str>>; MAX_RESPONSE_MODELS],
}

impl GenAi {
    /// Where a try of `operation` (a `OPERATIONS` value; another counts as the
    /// first) for `request_model` is counted.
    pub fn at(&self, operation: &str, request_model: &str) -> At {
        let op = OPERATIONS.iter().position(|o| *o == operation).unwrap_or(0) as u8;
        let mut req = MAX_REQUEST_MODELS;
        for (i, slot) in self.requests[..MAX_REQUEST_MODELS].iter().enumerate() {
            let m = slot.get_or_init(|| Box::new(RequestModel::new(request_model)));
            if &*m.name == request_model {
                req = i;
                break;
            }
        }
        At { op, req: req as u8 }
    }

    /// The response slot of the model an answer names, as the JSON string literal
    /// found in it (quotes included); `None`: it names none.
    pub fn response_model(&self, literal: Option<&[u8]>) -> u8 {
        let Some(name) = literal.and_then(decode) else {
            return NO_RESPONSE_MODEL;
        };
        if name.len() > MAX_NAME_BYTES || name.is_empty() {
            return MAX_RESPONSE_MODELS as u8;
        }
        for (i, slot) in self.responses.iter().enumerate() {
            let m = slot.get_or_init(|| name.as_ref().into());
            if **m == *name {
                return i as u8;
            }
        }
        MAX_RESPONSE_MODELS as u8
    }

    fn op(&self, at: At) -> &Operation {
        let m =
            self.requests[usize::from(at.req)].get_or_init(|| Box::new(RequestModel::new(OTHER)));
        &m.ops[usize::from(at.op)]
    }

    fn answered(&self, at: At, resp: u8) -> &Answered {
        let slot = usize::from(resp).min(RESPONSE_SLOTS - 1);
        self.op(at).answered[slot].get_or_init(Box::default)
    }

    /// A try that failed (`reason`) after `d`.
    pub fn failed(&self, at: At, reason: Reason, d: Duration) {
        let failed = self
            .op(at)
            .failed
            .get_or_init(|| Box::new(std::array::from_fn(|_| Hist::default())));
        failed[reason.index()].seconds(&DURATION_BOUNDS, d);
    }

    /// A unary answer, read whole after `d`, with the usage it reported.
    pub fn answered_unary(&self, at: At, resp: u8, d: Duration, usage: Option<Usage>) {
        let s = self.answered(at, resp);
        s.duration.seconds(&DURATION_BOUNDS, d);
        if let Some(u) = usage {
            s.count_tokens(at, u);
        }
    }

    /// A committed stream that ended without failing. Its duration when the provider
    /// ended it; the time to its first token and per output token after it when
    /// that is known too (two output tokens or more); its tokens always.
    pub fn streamed(&self, at: At, resp: u8, s: Streamed) {
        let series = self.answered(at, resp);
        if let Some(u) = s.usage {
            series.count_tokens(at, u);
        }
        if !s.completed {
            return;
        }
        series.duration.seconds(&DURATION_BOUNDS, s.duration);
        series.ttft.seconds(&TTFT_BOUNDS, s.first);
        let out = s.usage.map_or(0, |u| u.output_tokens);
        if out >= 2 {
            let after = s.duration.saturating_sub(s.first);
            series
                .tpot
                .seconds(&TPOT_BOUNDS, after.div_f64((out - 1) as f64));
        }
    }

    /// Tokens of an answer counted apart from its try (a unary answer read after
    /// its client went away).
    pub fn tokens(&self, at: At, resp: u8, u: Usage) {
        self.answered(at, resp).count_tokens(at, u);
    }

    /// Every series with observations, as read now.
    pub fn points(&self) -> Vec<Point<'_>> {
        let mut out = Vec::new();
        for m in self.requests.iter().filter_map(OnceLock::get) {
            for (op, o) in m.ops.iter().enumerate() {
                let base = Point {
                    operation: OPERATIONS[op],
                    request_model: &m.name,
                    response_model: None,
                    error: None,
                    kind: Kind::OperationDuration,
                    token_type: None,
                    data: HistData::default(),
                };
                for (slot, s) in o.answered.iter().enumerate() {
                    let Some(s) = s.get() else { continue };
                    let response_model = match slot {
                        i if i < MAX_RESPONSE_MODELS => self.responses[i].get().map(|n| &**n),
                        i if i == MAX_RESPONSE_MODELS => Some(OTHER),
                        _ => None,
                    };
                    let answered = Point {
                        response_model,
                        ..base.clone()
                    };
                    for (kind, token_type, data) in [
                        (Kind::TokenUsage, Some("input"), s.input.read()),
                        (Kind::TokenUsage, Some("output"), s.output.read()),
                        (Kind::OperationDuration, None, s.duration.read()),
                        (Kind::TimeToFirstToken, None, s.ttft.read()),
                        (Kind::TimePerOutputToken, None, s.tpot.read()),
                    ] {
                        if data.count() > 0 {
                            out.push(Point {
                                kind,
                                token_type,
                                data,
                                ..answered.clone()
                            });
                        }
                    }
                }
                if let Some(failed) = o.failed.get() {
                    for reason in Reason::ALL {
                        let data = failed[reason.index()].read();
                        if data.count() > 0 {
                            out.push(Point {
                                error: Some(reason),
                                data,
                                ..base.clone()
                            });
                        }
                    }
                }
            }
        }
        out
    }
}

impl RequestModel {
    fn new(name: &str) -> Self {
        RequestModel {
            name: name.into(),
            ops: Default::default(),
        }
    }
}

/// One series of one metric, as read.
#[derive(Clone, Debug)]
pub struct Point<'a> {
    pub operation: &'static str,
    pub request_model: &'a str,
    /// `None`: the answer named no model (or it failed).
    pub response_model: Option<&'a str>,
    /// `error.type` of a try that failed: the failure's reason.
    pub error: Option<Reason>,
    pub kind: Kind,
    /// `gen_ai.token.type` of [`Kind::TokenUsage`].
    pub token_type: Option<&'static str>,
    pub data: HistData,
}

/// A series' attributes: the conventions' keys and their values.
pub(crate) type Attributes = Vec<(&'static str, String)>;

/// One series as exported (Prometheus, OTLP): a metric, its attributes under the
/// conventions' keys (`gen_ai.operation.name`, ...), and its histogram, merged over
/// every target that has those attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub kind: Kind,
    pub attributes: Attributes,
    pub data: HistData,
}

impl Point<'_> {
    /// The attributes of this point for a target of `provider`
    /// (`gen_ai.provider.name`).
    pub fn attributes(&self, provider: &str) -> Attributes {
        let mut a = vec![
            ("gen_ai.operation.name", self.operation.to_string()),
            ("gen_ai.provider.name", provider.to_string()),
            ("gen_ai.request.model", self.request_model.to_string()),
        ];
        if let Some(m) = self.response_model {
            a.push(("gen_ai.response.model", m.to_string()));
        }
        if let Some(t) = self.token_type {
            a.push(("gen_ai.token.type", t.to_string()));
        }
        if let Some(e) = self.error {
            a.push(("error.type", e.as_str().to_string()));
        }
        a
    }
}

/// The text of a JSON string literal (quotes included); `None` when it is not one.
fn decode(literal: &[u8]) -> Option<Cow<'_, str>> {
    let inner = literal.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    if !inner.contains(&b'\\') {
        return std::str::from_utf8(inner).ok().map(Cow::Borrowed);
    }
    serde_json::from_slice::<String>(literal)
        .ok()
        .map(Cow::Owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(i: u64, o: u64) -> Usage {
        Usage {
            input_tokens: i,
            output_tokens: o,
        }
    }

    #[test]
    fn names_take_slots_once_and_overflow_into_other() {
        let g = GenAi::default();
        let a = g.at("chat", "gpt-4o");
        assert_eq!(g.at("chat", "gpt-4o"), a, "the same slot again");
        assert_ne!(g.at("embeddings", "gpt-4o"), a);
        assert_ne!(g.at("chat", "gpt-4o-mini"), a);
        for i in 0..MAX_REQUEST_MODELS {
            g.at("chat", &format!("m{i}"));
        }
        let other = g.at("chat", "one-too-many");
        assert_eq!(usize::from(other.req), MAX_REQUEST_MODELS);

        assert_eq!(g.response_model(None), NO_RESPONSE_MODEL);
        let r = g.response_model(Some(b"\"gpt-4o-2024-08-06\""));
        assert_eq!(g.response_model(Some(b"\"gpt-4o-2024-08-06\"")), r);
        let escaped = g.response_model(Some(b"\"gpt\\u002d4o-2024-08-06\""));
        assert_eq!(escaped, r, "an escaped spelling is the same name");
        for i in 0..MAX_RESPONSE_MODELS {
            g.response_model(Some(format!("\"r{i}\"").as_bytes()));
        }
        assert_eq!(
            usize::from(g.response_model(Some(b"\"hostile-9\""))),
            MAX_RESPONSE_MODELS
        );
        assert_eq!(g.response_model(Some(b"not a literal")), NO_RESPONSE_MODEL);
    }

    #[test]
    fn observations_land_in_the_conventions_buckets_with_their_labels() {
        let g = GenAi::default();
        let at = g.at("chat", "gpt-4o");
        let resp = g.response_model(Some(b"\"gpt-4o-2024-08-06\""));
        g.answered_unary(at, resp, Duration::from_millis(150), Some(usage(10, 3)));
        g.streamed(
            at,
            resp,
            Streamed {
                duration: Duration::from_millis(1100),
                first: Duration::from_millis(100),
                completed: true,
                usage: Some(usage(20, 101)),
            },
        );
        g.failed(at, Reason::Status5xx, Duration::from_millis(30));
        let points = g.points();
        let find = |kind, token_type, error| {
            points
                .iter()
                .find(|p| p.kind == kind && p.token_type == token_type && p.error == error)
                .unwrap_or_else(|| panic!("{kind:?} {token_type:?} {error:?} in {points:?}"))
        };
        let input = find(Kind::TokenUsage, Some("input"), None);
        assert_eq!(input.response_model, Some("gpt-4o-2024-08-06"));
        assert_eq!((input.data.count(), input.data.sum), (2, 30));
        // 10 ≤ 16 (bucket 2), 20 ≤ 64 (bucket 3).
        assert_eq!(input.data.counts[2..4], [1, 1]);
        let duration = find(Kind::OperationDuration, None, None);
        // 0.15 s ≤ 0.16 (bucket 4), 1.1 s ≤ 1.28 (bucket 7).
        assert_eq!(duration.data.counts[4], 1);
        assert_eq!(duration.data.counts[7], 1);
        assert_eq!(duration.data.sum, 1_250_000, "microseconds");
        let ttft = find(Kind::TimeToFirstToken, None, None);
        assert_eq!(ttft.data.counts[7], 1, "0.1 s ≤ 0.1");
        // (1.1 s - 0.1 s) / 100 tokens after the first = 10 ms ≤ 0.01.
        let tpot = find(Kind::TimePerOutputToken, None, None);
        assert_eq!((tpot.data.counts[0], tpot.data.sum), (1, 10_000));
        let failed = find(Kind::OperationDuration, None, Some(Reason::Status5xx));
        assert_eq!(
            (failed.response_model, failed.data.counts[2]),
            (None, 1),
            "0.03 s ≤ 0.04"
        );
        assert_eq!(Kind::OperationDuration.bounds().len() + 1, 15);
    }

    #[test]
    fn a_stream_the_client_left_counts_its_tokens_only() {
        let g = GenAi::default();
        let at = g.at("chat", "m");
        g.streamed(
            at,
            NO_RESPONSE_MODEL,
            Streamed {
                duration: Duration::from_secs(1),
                first: Duration::from_millis(10),
                completed: false,
                usage: Some(usage(5, 5)),
            },
        );
        let kinds: Vec<Kind> = g.points().iter().map(|p| p.kind).collect();
        assert_eq!(kinds, [Kind::TokenUsage, Kind::TokenUsage]);
        assert!(g.points().iter().all(|p| p.response_model.is_none()));
    }
}
