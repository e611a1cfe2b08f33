//! What the request path counts, and the two ways it is read back: the
//! `/admin/v1/stats` document (SPEC §5, for the operator) and Prometheus `/metrics`.
//!
//! The request path only ever touches atomics here (no lock, no allocation); both
//! read-outs walk the live snapshot at scrape time. Counters live in registries that
//! outlive reloads (see `snapshot`), so a reload never resets them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::outcome::Reason;

/// Histogram upper bounds in seconds (Prometheus-style, `+Inf` implied).
pub const BOUNDS: [f64; 17] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
];

/// A lock-free histogram over [`BOUNDS`].
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; BOUNDS.len() + 1],
    sum_us: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = BOUNDS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(BOUNDS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    pub fn sum_secs(&self) -> f64 {
        self.sum_us.load(Ordering::Relaxed) as f64 / 1e6
    }

    /// Per-bucket (not cumulative) counts, with their upper bounds.
    pub fn buckets(&self) -> Vec<(f64, u64)> {
        BOUNDS
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(self.buckets.iter().map(|b| b.load(Ordering::Relaxed)))
            .collect()
    }

    /// The `q` quantile in milliseconds, interpolated linearly inside its bucket;
    /// `None` before the first observation.
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = (q.clamp(0.0, 1.0) * total as f64).max(1.0);
        let mut seen = 0u64;
        for (i, c) in counts.iter().enumerate() {
            if *c == 0 {
                continue;
            }
            if (seen + c) as f64 >= rank {
                let lo = if i == 0 { 0.0 } else { BOUNDS[i - 1] };
                // Above the last bound: report the last bound, the most that is known.
                let hi = BOUNDS.get(i).copied().unwrap_or(BOUNDS[BOUNDS.len() - 1]);
                let within = (rank - seen as f64) / *c as f64;
                return Some((lo + (hi - lo) * within) * 1000.0);
            }
            seen += c;
        }
        None
    }
}

/// Counts per reason, indexed by [`Reason::index`].
#[derive(Debug, Default)]
pub struct ByReason([AtomicU64; Reason::COUNT]);

impl ByReason {
    pub fn inc(&self, r: Reason) {
        self.0[r.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self, r: Reason) -> u64 {
        self.0[r.index()].load(Ordering::Relaxed)
    }

    pub fn nonzero(&self) -> impl Iterator<Item = (Reason, u64)> + '_ {
        Reason::ALL
            .into_iter()
            .map(|r| (r, self.get(r)))
            .filter(|(_, n)| *n > 0)
    }
}

pub fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

pub fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

pub fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// Per route, across reloads.
#[derive(Debug, Default)]
pub struct RouteCounters {
    pub requests: AtomicU64,
    pub attempts: AtomicU64,
    pub fallbacks: AtomicU64,
    pub failed: AtomicU64,
    /// Client request to response head (for streams: to the first content event).
    pub duration: Histogram,
    /// `duration` minus time spent waiting on providers and in deliberate waits.
    pub overhead: Histogram,
}

/// Per (route, target), across reloads.
#[derive(Debug, Default)]
pub struct RouteTargetCounters {
    pub requests: AtomicU64,
    pub attempts: AtomicU64,
    pub retries: AtomicU64,
    pub successes: AtomicU64,
    /// Failed attempts and skips.
    pub failures: ByReason,
    /// Requests that moved on from this target, by the reason they left.
    pub fallbacks_away: ByReason,
    pub input_tokens: AtomicU64,
    pub output_tokens: AtomicU64,
    pub attempt_duration: Histogram,
    /// Time to the first content event of committed streams.
    pub ttfb: Histogram,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_within_buckets() {
        let h = Histogram::default();
        assert_eq!(h.quantile_ms(0.5), None);
        for _ in 0..100 {
            h.observe(Duration::from_millis(20)); // bucket (10ms, 25ms]
        }
        let p50 = h.quantile_ms(0.5).unwrap();
        assert!((10.0..=25.0).contains(&p50), "{p50}");
        h.observe(Duration::from_secs(2));
        let p99 = h.quantile_ms(0.99).unwrap();
        assert!(p99 <= 25.0, "one slow request in 101 is above p99: {p99}");
        let p100 = h.quantile_ms(1.0).unwrap();
        assert!((1000.0..=2500.0).contains(&p100), "{p100}");
        assert_eq!(h.count(), 101);
        assert!((h.sum_secs() - 4.0).abs() < 1e-6);
        let b = h.buckets();
        assert_eq!(b.len(), BOUNDS.len() + 1);
        assert_eq!(b.iter().map(|(_, c)| c).sum::<u64>(), 101);
    }

    #[test]
    fn reasons_count_separately() {
        let r = ByReason::default();
        r.inc(Reason::Status5xx);
        r.inc(Reason::Status5xx);
        r.inc(Reason::QueueFull);
        assert_eq!(
            r.nonzero().collect::<Vec<_>>(),
            vec![(Reason::Status5xx, 2), (Reason::QueueFull, 1)]
        );
    }
}

/// Token counts a provider reported in a `usage` object (OpenAI `prompt_tokens` /
/// `completion_tokens`, Anthropic `input_tokens` / `output_tokens`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub struct Usage {
    #[serde(default, alias = "prompt_tokens")]
    pub input_tokens: u64,
    #[serde(default, alias = "completion_tokens")]
    pub output_tokens: u64,
}

static USAGE_KEY: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"usage\""));

/// The first `usage` object in a JSON document or SSE event, parsed on its own so
/// the rest of the document is not read twice.
pub fn usage(doc: &[u8]) -> Option<Usage> {
    let at = USAGE_KEY.find(doc)? + b"\"usage\"".len();
    let rest = &doc[at..];
    let start = rest
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t' | b'\r' | b'\n' | b':'))?;
    let mut values = serde_json::Deserializer::from_slice(&rest[start..]).into_iter::<Usage>();
    values.next()?.ok()
}

/// Gemini's `usageMetadata`, as [`Usage`]: the prompt (cached and tool-use prompt
/// tokens included, as OpenAI counts cached ones) in, candidates plus thinking
/// tokens (billed as output) out.
#[derive(Debug, Default, Clone, Copy, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct GeminiUsage {
    #[serde(default)]
    prompt_token_count: u64,
    #[serde(default)]
    tool_use_prompt_token_count: u64,
    #[serde(default)]
    candidates_token_count: u64,
    #[serde(default)]
    thoughts_token_count: u64,
}

static GEMINI_USAGE_KEY: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"usageMetadata\""));

/// [`usage`] for a Gemini answer or stream chunk (`usageMetadata`).
pub fn gemini_usage(doc: &[u8]) -> Option<Usage> {
    let at = GEMINI_USAGE_KEY.find(doc)? + b"\"usageMetadata\"".len();
    let rest = &doc[at..];
    let start = rest
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t' | b'\r' | b'\n' | b':'))?;
    let mut values =
        serde_json::Deserializer::from_slice(&rest[start..]).into_iter::<GeminiUsage>();
    let u = values.next()?.ok()?;
    Some(Usage {
        input_tokens: u
            .prompt_token_count
            .saturating_add(u.tool_use_prompt_token_count),
        output_tokens: u
            .candidates_token_count
            .saturating_add(u.thoughts_token_count),
    })
}

/// Bedrock's `usage` (a Converse answer, or a ConverseStream `metadata` event):
/// cache reads and writes, which Bedrock counts apart, are input as OpenAI counts
/// them.
#[derive(Debug, Default, Clone, Copy, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct BedrockUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    cache_read_input_tokens: u64,
    #[serde(default)]
    cache_write_input_tokens: u64,
}

static BEDROCK_USAGE_KEY: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"inputTokens\""));

/// [`usage`] for a Bedrock answer or stream event (`usage.inputTokens`, ...).
pub fn bedrock_usage(doc: &[u8]) -> Option<Usage> {
    BEDROCK_USAGE_KEY.find(doc)?;
    let at = memchr::memmem::find(doc, b"\"usage\"")? + b"\"usage\"".len();
    let rest = &doc[at..];
    let start = rest
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t' | b'\r' | b'\n' | b':'))?;
    let mut values =
        serde_json::Deserializer::from_slice(&rest[start..]).into_iter::<BedrockUsage>();
    let u = values.next()?.ok()?;
    Some(Usage {
        input_tokens: u
            .input_tokens
            .saturating_add(u.cache_read_input_tokens)
            .saturating_add(u.cache_write_input_tokens),
        output_tokens: u.output_tokens,
    })
}

impl RouteTargetCounters {
    pub fn add_usage(&self, u: Usage) {
        add(&self.input_tokens, u.input_tokens);
        add(&self.output_tokens, u.output_tokens);
    }
}

#[cfg(test)]
mod usage_tests {
    use super::*;

    #[test]
    fn reads_usage_in_both_wires() {
        let openai = br#"{"id":"x","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}"#;
        assert_eq!(
            usage(openai),
            Some(Usage {
                input_tokens: 10,
                output_tokens: 5
            })
        );
        let anthropic = b"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{},\"usage\": {\"output_tokens\":7}}\n\n";
        assert_eq!(
            usage(anthropic),
            Some(Usage {
                input_tokens: 0,
                output_tokens: 7
            })
        );
        assert_eq!(usage(b"data: {\"choices\":[]}\n\n"), None);
        let gemini = b"data: {\"candidates\":[],\"usageMetadata\": {\"promptTokenCount\":12,\"candidatesTokenCount\":5,\"thoughtsTokenCount\":3,\"totalTokenCount\":20}}\n\n";
        assert_eq!(usage(gemini), None);
        assert_eq!(
            gemini_usage(gemini),
            Some(Usage {
                input_tokens: 12,
                output_tokens: 8
            })
        );
        assert_eq!(gemini_usage(br#"{"candidates":[]}"#), None);
        let bedrock = b"event: metadata\ndata: {\"metadata\":{\"usage\":{\"inputTokens\":12,\"outputTokens\":5,\"totalTokens\":17},\"metrics\":{\"latencyMs\":9}}}\n\n";
        assert_eq!(
            bedrock_usage(bedrock),
            Some(Usage {
                input_tokens: 12,
                output_tokens: 5
            })
        );
        assert_eq!(bedrock_usage(br#"{"metadata":{}}"#), None);
        assert_eq!(usage(br#"{"usage":null}"#), None);
    }
}

/// `/admin/v1/stats`: the live snapshot's routes with their counters and the state of
/// their targets.
pub fn report(gw: &crate::gateway::Gateway) -> switchback_crds::stats::StatsReport {
    use switchback_crds::stats as doc;
    let snapshot = gw.snapshot();
    let now = tokio::time::Instant::now();
    let (now_ms, wall) = (gw.now_ms(), std::time::SystemTime::now());
    let rfc3339 = |t: std::time::SystemTime| humantime::format_rfc3339_millis(t).to_string();
    let load = gw.report();
    let routes = snapshot
        .route_list
        .iter()
        .map(|r| doc::RouteStats {
            route: r.spec.id.clone(),
            generation: r.spec.generation,
            revision: Some(r.revision),
            requests: get(&r.counters.requests),
            attempts: get(&r.counters.attempts),
            fallbacks: get(&r.counters.fallbacks),
            failed: get(&r.counters.failed),
            resumed: 0,
            order: Vec::new(),
            targets: r
                .targets
                .iter()
                .map(|t| {
                    let c = &t.counters;
                    let parked = t.state.parked_until_ms();
                    let (_, since) = t.state.breaker.state();
                    let ewma = t.state.latency_ewma_us();
                    doc::TargetStats {
                        credential: t.spec.credential.clone(),
                        model: t.spec.model.clone(),
                        requests: get(&c.requests),
                        attempts: get(&c.attempts),
                        retries: get(&c.retries),
                        successes: get(&c.successes),
                        failures: c
                            .failures
                            .nonzero()
                            .map(|(r, n)| (r.as_str().to_string(), n))
                            .collect(),
                        fallbacks_away: Reason::ALL.iter().map(|r| c.fallbacks_away.get(*r)).sum(),
                        resumed: 0,
                        hedges: 0,
                        hedge_wins: 0,
                        fallbacks_away_by_reason: c
                            .fallbacks_away
                            .nonzero()
                            .map(|(r, n)| (r.as_str().to_string(), n))
                            .collect(),
                        state: None,
                        state_since: None,
                        state_until: None,
                        circuit: match t.state.breaker.reported(now) {
                            crate::circuit::Reported::Closed => doc::CircuitState::Closed,
                            crate::circuit::Reported::Open => doc::CircuitState::Open,
                            crate::circuit::Reported::HalfOpen => doc::CircuitState::HalfOpen,
                        },
                        circuit_since: Some(rfc3339(since)),
                        parked_until: (parked > now_ms)
                            .then(|| rfc3339(wall + Duration::from_millis(parked - now_ms))),
                        last_failure: t.state.last_failure().map(|f| doc::LastFailure {
                            status: f.status,
                            reason: f.reason.as_str().to_string(),
                            at: rfc3339(f.at),
                        }),
                        latency: doc::Latency {
                            smoothed_ms: (ewma > 0).then(|| ewma as f64 / 1000.0),
                            p50_ms: t.state.latency.quantile_ms(0.5),
                            p99_ms: t.state.latency.quantile_ms(0.99),
                        },
                    }
                })
                .collect(),
        })
        .collect();
    doc::StatsReport {
        version: doc::STATS_VERSION,
        instance_id: gw.instance_id.clone(),
        started_at: rfc3339(gw.started_at),
        config_generation: load.generation,
        config_error: load.last_error.map(|e| {
            e.problems
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join("; ")
        }),
        routes,
        clients: gw
            .carried()
            .clients()
            .into_iter()
            .map(|(client, c)| {
                let last = get(&c.last_request_ms);
                doc::ClientStats {
                    client,
                    requests: get(&c.requests),
                    input_tokens: get(&c.input_tokens),
                    output_tokens: get(&c.output_tokens),
                    micro_usd: get(&c.micro_usd),
                    rate_limited: get(&c.rate_limited),
                    budget_exhausted: get(&c.budget_exhausted),
                    last_request_at: (last > 0)
                        .then(|| rfc3339(std::time::UNIX_EPOCH + Duration::from_millis(last))),
                }
            })
            .collect(),
    }
}
