//! Prometheus `/metrics`: a prometheus-client collector that reads the same atomics
//! as `/admin/v1/stats` at scrape time, so the request path never counts twice.
//! Label cardinality is bounded by routes × targets, and clients × routes (plus a
//! fixed set of reasons).
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `switchback_requests_total` | counter | `route`, `outcome` (`answered`, `failed`) |
//! | `switchback_fallbacks_total` | counter | `route`: requests answered by a target other than the first |
//! | `switchback_attempts_total` | counter | `route`, `target`, `model`, `result` (`success` or a failure reason; a committed stream's when it ends) |
//! | `switchback_skips_total` | counter | `route`, `target`, `model`, `reason` (`missingKey`, `parked`, `circuitOpen`, ...) |
//! | `switchback_fallbacks_away_total` | counter | `route`, `target`, `model`, `reason`: requests that left this target |
//! | `switchback_stream_resumes_total` | counter | `route`, `target`, `model`, `outcome`: committed streams that failed on a route that resumes (docs/streaming.md#resume-after-commit): `resumed` on the target that continued one, or why one was not (`toolCallInProgress`, `heldBytesExceeded`, `maxResumesUsed`, `noEligibleTarget`, `budgetExhausted`) on the target whose stream broke |
//! | `switchback_hedges_total` | counter | `route`, `target`, `model`, `outcome` (`won`: answered first, `lost`: cancelled because the slow try answered first, `failed`): hedged tries started on this target beside a slow one (`spec.hedge`) |
//! | `switchback_tokens_total` | counter | `route`, `target`, `model`, `direction` (`input`, `output`), from provider usage |
//! | `switchback_client_tokens_total` | counter | `client` (`namespace/name`, never the key), `route`, `direction` (`input`, `output`): provider usage of the LLMClient's requests |
//! | `switchback_client_throttled_total` | counter | `client`, `reason` (`rate_limited`, `budget_exhausted`): requests refused with 429 before anything was sent upstream |
//! | `switchback_circuit_state` | gauge | `target`, `model`, `state` (`closed`, `open`, `half_open`): 1 for the current state |
//! | `switchback_probes_total` | counter | `route`, `target`, `model`, `outcome` (`success` or the failure's reason): background probes of open circuits and health checks (docs/request-lifecycle.md#probed-circuits), under the first route that uses the target |
//! | `switchback_key_attempts_total` | counter | `credential`, `key` (the Secret data-key name, never the value): upstream requests sent with each key |
//! | `switchback_key_set_aside_total` | counter | `credential`, `key`, `reason` (`rateLimited`: a 429 parked it, `authError`: a 401 or 403 rejected it) |
//! | `switchback_key_state` | gauge | `credential`, `key`, `state` (`Active`, `Parked`, `Rejected`): 1 for the current state |
//! | `switchback_request_duration_seconds` | histogram | `route`: to the response head (streams: the commit, at the first content event) |
//! | `switchback_gateway_overhead_seconds` | histogram | `route`: request duration minus provider time and deliberate waits |
//! | `switchback_attempt_duration_seconds` | histogram | `route`, `target`, `model` |
//! | `switchback_time_to_first_byte_seconds` | histogram | `route`, `target`, `model`: committed streams, to the first content event |
//! | `switchback_config_generation` | gauge | configs applied since start |
//! | `switchback_fleet_view_holds` | gauge | 1 while the fleet's health view holds on this replica, 0 when it lapsed or there is none (`health::fleet`) |
//! | `switchback_probes_delegated` | gauge | targets whose open circuit the fleet's view leaves another replica to probe |
//! | `switchback_config_reloads_total` | counter | `result` (`applied`, `refused`) |
//! | `switchback_limit_refusals_total` | counter | `limit` (the flag: `header_read_timeout`, `body_read_timeout`, `idle_timeout`, `max_connections`: times new connections had to wait, `max_body_bytes`, `max_inflight_body_bytes`; provider answers: `max_event_bytes`: SSE events over it, before or after commit, `max_response_bytes`: unary answers over it, `max_inflight_response_bytes`: unary answers that did not fit in the answer budget; fetched media (docs/translation.md#documents-and-media): `fetch_media_timeout`: fetches that took too long, `max_fetched_urls`: URLs past the request's count) |
//! | `switchback_limit_refusals_total` | counter | `limit` (the flag: `header_read_timeout`, `body_read_timeout`, `idle_timeout`, `max_connections`: times new connections had to wait, `max_body_bytes`, `max_inflight_body_bytes`, `max_header_bytes`: heads answered 431, `max_inflight_header_bytes`: connections closed because their unfinished head did not fit, `client_write_timeout`: clients disconnected for not reading, `max_hops`: requests refused for their `x-switchback-hops` (508, or 400 unreadable), `admin_max_connections`: admin connections closed or refused at the cap, `admin_idle_timeout`; `header_read_timeout`, `max_header_bytes` and `client_write_timeout` count both ports; provider answers: `max_event_bytes`: SSE events over it, before or after commit, `max_response_bytes`: unary answers over it, `max_inflight_response_bytes`: unary answers that did not fit in the answer budget) |
//! | `switchback_client_connections` | gauge | open client connections on the data port |
//! | `switchback_admin_connections` | gauge | open connections on the admin port |
//! | `switchback_header_bytes_held` | gauge | bytes of unfinished request heads held in the head budget (both ports) |
//! | `switchback_request_body_bytes_held` | gauge | request body bytes held in the in-flight budget |
//! | `switchback_response_bytes_held` | gauge | unary provider answer bytes held in the in-flight budget (being read, or on their way to the client) |
//! | `switchback_resume_held_bytes` | gauge | answer text held to resume broken streams (docs/streaming.md#resume-after-commit; each stream at most its route's `maxHeldBytes`) |
//! | `switchback_cost_usd_total` | counter | `route`, `target`, `model`, `client` (empty with authentication off): what answers cost at their target's `price`, in USD (`cost`) |
//! | `switchback_fallback_extra_cost_usd_total` | counter | `route`: what answers by a target other than the route's first cost beyond the first's price for the same tokens |
//! | `switchback_primary_answers_total` | counter | `route`, `mode` (the route's strategy): requests answered by the route's first declared target |
//! | `gen_ai_client_token_usage` | histogram | the OpenTelemetry GenAI semantic conventions' metrics of upstream operations, with their attributes (`genai`) |
//! | `gen_ai_client_operation_duration_seconds` | histogram | |
//! | `gen_ai_server_time_to_first_token_seconds` | histogram | |
//! | `gen_ai_server_time_per_output_token_seconds` | histogram | |

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::config::snapshot::{RouteRt, TargetRt};
use crate::gateway::Gateway;
use crate::limits::circuit::Reported;
use crate::observe::counters::{self, Histogram};

mod cost;
pub mod genai;

pub use cost::route_costs;

struct Metrics(Arc<Gateway>);

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("switchback metrics")
    }
}

/// A registry holding the gateway's collector.
pub fn registry(gw: Arc<Gateway>) -> Registry {
    let mut r = Registry::default();
    r.register_collector(Box::new(Metrics(gw)));
    r
}

pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, registry).is_err() {
        let _ = writeln!(out, "# encoding failed");
    }
    out
}

type Fmt = Result<(), std::fmt::Error>;

fn model(t: &TargetRt) -> &str {
    t.spec.model.as_deref().unwrap_or("")
}

fn histogram(enc: prometheus_client::encoding::MetricEncoder<'_>, h: &Histogram) -> Fmt {
    let buckets: Vec<(f64, u64)> = h
        .buckets()
        .into_iter()
        .map(|(b, c)| (if b.is_infinite() { f64::MAX } else { b }, c))
        .collect();
    let mut enc = enc;
    enc.encode_histogram::<NoLabelSet>(h.sum_secs(), h.count(), &buckets, None)
}

/// Encode one counter family from every (route, target) pair.
fn per_target(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    routes: &[Arc<RouteRt>],
    mut each: impl FnMut(&RouteRt, &TargetRt, &mut dyn FnMut(&str, &str, u64) -> Fmt) -> Fmt,
) -> Fmt {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for r in routes {
        let route = r.spec.id.to_string();
        for t in &r.targets {
            each(r, t, &mut |key, value, n| {
                let labels = [
                    ("route", route.as_str()),
                    ("target", t.label.as_str()),
                    ("model", model(t)),
                    (key, value),
                ];
                ConstCounter::new(n).encode(m.encode_family(&labels)?)
            })?;
        }
    }
    Ok(())
}

impl Collector for Metrics {
    fn encode(&self, mut enc: DescriptorEncoder) -> Fmt {
        let gw = &self.0;
        let snapshot = gw.snapshot();
        let routes = &snapshot.route_list;
        route_counts(&mut enc, routes)?;
        target_counts(&mut enc, routes)?;
        circuits(&mut enc, routes)?;
        probes(&mut enc, routes)?;
        keys(&mut enc, gw)?;
        latencies(&mut enc, routes)?;
        config_loads(&mut enc, gw)?;
        fleet(&mut enc, gw, routes)?;
        clients(&mut enc, gw)?;
        limits(
            &mut enc,
            (&gw.front, &gw.admin_front),
            &gw.refused,
            gw.answers.held(),
            gw.resume_held.load(Ordering::Relaxed),
        )?;
        cost::encode(&mut enc, gw, &snapshot)?;
        genai::encode(&mut enc, &snapshot)?;
        Ok(())
    }
}

/// Per route: requests by outcome, and those answered by a later target.
fn route_counts(enc: &mut DescriptorEncoder<'_>, routes: &[Arc<RouteRt>]) -> Fmt {
    {
        let mut m = enc.encode_descriptor(
            "switchback_requests",
            "Client requests by route and outcome",
            None,
            MetricType::Counter,
        )?;
        for r in routes {
            let route = r.spec.id.to_string();
            let (all, failed) = (
                counters::get(&r.counters.requests),
                counters::get(&r.counters.failed),
            );
            for (outcome, n) in [("answered", all.saturating_sub(failed)), ("failed", failed)] {
                ConstCounter::new(n)
                    .encode(m.encode_family(&[("route", route.as_str()), ("outcome", outcome)])?)?;
            }
        }
    }
    {
        let mut m = enc.encode_descriptor(
            "switchback_fallbacks",
            "Requests answered by a target other than the first in their order",
            None,
            MetricType::Counter,
        )?;
        for r in routes {
            let route = r.spec.id.to_string();
            ConstCounter::new(counters::get(&r.counters.fallbacks))
                .encode(m.encode_family(&[("route", route.as_str())])?)?;
        }
    }
    Ok(())
}

/// Per (route, target): attempts by result, skips and fallbacks away by reason, tokens.
fn target_counts(enc: &mut DescriptorEncoder<'_>, routes: &[Arc<RouteRt>]) -> Fmt {
    per_target(
        enc,
        "switchback_attempts",
        "Upstream requests by route, target and result",
        routes,
        |_, t, emit| {
            emit("result", "success", counters::get(&t.counters.successes))?;
            for (reason, n) in t.counters.failures.nonzero().filter(|(r, _)| !r.is_skip()) {
                emit("result", reason.as_str(), n)?;
            }
            Ok(())
        },
    )?;
    per_target(
        enc,
        "switchback_skips",
        "Targets passed over before a request was sent, by reason",
        routes,
        |_, t, emit| {
            for (reason, n) in t.counters.failures.nonzero().filter(|(r, _)| r.is_skip()) {
                emit("reason", reason.as_str(), n)?;
            }
            Ok(())
        },
    )?;
    per_target(
        enc,
        "switchback_fallbacks_away",
        "Requests that moved on from this target to a later one, by the reason they left",
        routes,
        |_, t, emit| {
            for (reason, n) in t.counters.fallbacks_away.nonzero() {
                emit("reason", reason.as_str(), n)?;
            }
            Ok(())
        },
    )?;
    per_target(
        enc,
        "switchback_stream_resumes",
        "Committed streams that failed on a route that resumes: resumed (on the target that continued), or why not (on the target whose stream broke)",
        routes,
        |_, t, emit| {
            for (outcome, n) in t.counters.resumes.nonzero() {
                emit("outcome", outcome.as_str(), n)?;
            }
            Ok(())
        },
    )?;
    per_target(
        enc,
        "switchback_hedges",
        "Hedged tries started on this target beside a slow one, by how they ended",
        routes,
        |r, t, emit| {
            if r.hedge.is_none() && counters::get(&t.counters.hedges) == 0 {
                return Ok(()); // a route that does not hedge (and never did)
            }
            let c = &t.counters;
            emit("outcome", "won", counters::get(&c.hedge_wins))?;
            emit("outcome", "lost", counters::get(&c.hedge_losses))?;
            emit("outcome", "failed", counters::get(&c.hedge_failures))
        },
    )?;
    per_target(
        enc,
        "switchback_tokens",
        "Tokens reported in provider usage",
        routes,
        |_, t, emit| {
            emit(
                "direction",
                "input",
                counters::get(&t.counters.input_tokens),
            )?;
            emit(
                "direction",
                "output",
                counters::get(&t.counters.output_tokens),
            )
        },
    )?;
    Ok(())
}

/// Each target's circuit state, once per (credential, upstream model).
fn circuits(enc: &mut DescriptorEncoder<'_>, routes: &[Arc<RouteRt>]) -> Fmt {
    {
        let mut m = enc.encode_descriptor(
            "switchback_circuit_state",
            "Circuit state of each target (credential and upstream model): 1 for the current state",
            None,
            MetricType::Gauge,
        )?;
        let now = tokio::time::Instant::now();
        let mut seen = std::collections::HashSet::new();
        for r in routes {
            for t in &r.targets {
                if !seen.insert((t.label.as_str(), model(t))) {
                    continue; // shared by several routes: one series per target
                }
                let current = t.state.breaker.reported(now);
                for (name, state) in [
                    ("closed", Reported::Closed),
                    ("open", Reported::Open),
                    ("half_open", Reported::HalfOpen),
                ] {
                    let labels = [
                        ("target", t.label.as_str()),
                        ("model", model(t)),
                        ("state", name),
                    ];
                    ConstGauge::new(i64::from(current == state))
                        .encode(m.encode_family(&labels)?)?;
                }
            }
        }
    }
    Ok(())
}

/// Background probes by outcome, once per target (under the first route using it:
/// the one it is probed for).
fn probes(enc: &mut DescriptorEncoder<'_>, routes: &[Arc<RouteRt>]) -> Fmt {
    let mut m = enc.encode_descriptor(
        "switchback_probes",
        "Background probes of open circuits and health checks, by outcome",
        None,
        MetricType::Counter,
    )?;
    let mut seen = std::collections::HashSet::new();
    for r in routes {
        let route = r.spec.id.to_string();
        for t in &r.targets {
            if !seen.insert(Arc::as_ptr(&t.state)) {
                continue;
            }
            let p = &t.state.probes;
            let outcomes = std::iter::once(("success", counters::get(&p.successes)))
                .chain(p.failures.nonzero().map(|(r, n)| (r.as_str(), n)))
                .filter(|(_, n)| *n > 0);
            for (outcome, n) in outcomes {
                let labels = [
                    ("route", route.as_str()),
                    ("target", t.label.as_str()),
                    ("model", model(t)),
                    ("outcome", outcome),
                ];
                ConstCounter::new(n).encode(m.encode_family(&labels)?)?;
            }
        }
    }
    Ok(())
}

/// Each credential's keys by data-key name: requests sent, set aside, state now.
fn keys(enc: &mut DescriptorEncoder<'_>, gw: &crate::gateway::Gateway) -> Fmt {
    use switchback_crds::stats::KeyState;
    let snapshot = gw.snapshot();
    let mut credentials: Vec<_> = snapshot.credentials.values().collect();
    credentials.sort_by(|a, b| a.spec.id.cmp(&b.spec.id));
    let keys: Vec<(String, &crate::limits::keys::PoolKey)> = credentials
        .iter()
        .flat_map(|c| c.keys.iter().map(|k| (c.spec.id.to_string(), k)))
        .collect();
    let now_ms = gw.now_ms();
    {
        let mut m = enc.encode_descriptor(
            "switchback_key_attempts",
            "Upstream requests sent with each key of a credential",
            None,
            MetricType::Counter,
        )?;
        for (credential, k) in &keys {
            let labels = [("credential", credential.as_str()), ("key", &*k.name)];
            ConstCounter::new(counters::get(&k.state.attempts))
                .encode(m.encode_family(&labels)?)?;
        }
    }
    {
        let mut m = enc.encode_descriptor(
            "switchback_key_set_aside",
            "Keys set aside by a 429 (rateLimited) or a 401/403 (authError)",
            None,
            MetricType::Counter,
        )?;
        for (credential, k) in &keys {
            for (reason, n) in [
                ("rateLimited", &k.state.rate_limited),
                ("authError", &k.state.rejected),
            ] {
                let labels = [
                    ("credential", credential.as_str()),
                    ("key", &*k.name),
                    ("reason", reason),
                ];
                ConstCounter::new(counters::get(n)).encode(m.encode_family(&labels)?)?;
            }
        }
    }
    let mut m = enc.encode_descriptor(
        "switchback_key_state",
        "State of each key of a credential: 1 for the current state",
        None,
        MetricType::Gauge,
    )?;
    for (credential, k) in &keys {
        let now = k.state.shown(now_ms).0;
        for s in KeyState::ALL {
            let labels = [
                ("credential", credential.as_str()),
                ("key", &*k.name),
                ("state", s.as_str()),
            ];
            ConstGauge::new(i64::from(now == s)).encode(m.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

/// The request and attempt histograms.
fn latencies(enc: &mut DescriptorEncoder<'_>, routes: &[Arc<RouteRt>]) -> Fmt {
    for (name, help, pick) in [
        (
            "switchback_request_duration_seconds",
            "Client request to response head (streams: to the first content event)",
            (|r: &RouteRt| &r.counters.duration) as fn(&RouteRt) -> &Histogram,
        ),
        (
            "switchback_gateway_overhead_seconds",
            "Request duration minus time waiting on providers, backoff and queues",
            |r: &RouteRt| &r.counters.overhead,
        ),
    ] {
        let mut m = enc.encode_descriptor(name, help, None, MetricType::Histogram)?;
        for r in routes {
            let route = r.spec.id.to_string();
            histogram(m.encode_family(&[("route", route.as_str())])?, pick(r))?;
        }
    }
    for (name, help, pick) in [
        (
            "switchback_attempt_duration_seconds",
            "One upstream attempt",
            (|t: &TargetRt| &t.counters.attempt_duration) as fn(&TargetRt) -> &Histogram,
        ),
        (
            "switchback_time_to_first_byte_seconds",
            "Upstream request to the first content event of a committed stream",
            |t: &TargetRt| &t.counters.ttfb,
        ),
    ] {
        let mut m = enc.encode_descriptor(name, help, None, MetricType::Histogram)?;
        for r in routes {
            let route = r.spec.id.to_string();
            for t in &r.targets {
                let labels = [
                    ("route", route.as_str()),
                    ("target", t.label.as_str()),
                    ("model", model(t)),
                ];
                histogram(m.encode_family(&labels)?, pick(t))?;
            }
        }
    }
    Ok(())
}

/// Configs applied since start, and loads by result.
fn config_loads(enc: &mut DescriptorEncoder<'_>, gw: &Gateway) -> Fmt {
    {
        let m = enc.encode_descriptor(
            "switchback_config_generation",
            "Configs applied since the proxy started",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(gw.report().generation as i64).encode(m)?;
    }
    {
        let mut m = enc.encode_descriptor(
            "switchback_config_reloads",
            "Config loads by result",
            None,
            MetricType::Counter,
        )?;
        for (result, n) in [
            ("applied", gw.reloads_applied.load(Ordering::Relaxed)),
            ("refused", gw.reloads_refused.load(Ordering::Relaxed)),
        ] {
            ConstCounter::new(n).encode(m.encode_family(&[("result", result)])?)?;
        }
    }
    Ok(())
}

/// The fleet's health view (`health::fleet`): whether it holds here, and how many
/// targets' probes this replica leaves to another.
fn fleet(enc: &mut DescriptorEncoder<'_>, gw: &Gateway, routes: &[Arc<RouteRt>]) -> Fmt {
    let holds = gw.health.view_holds.load(Ordering::Relaxed);
    let m = enc.encode_descriptor(
        "switchback_fleet_view_holds",
        "1 while the fleet's health view (switchback-health) holds on this replica",
        None,
        MetricType::Gauge,
    )?;
    ConstGauge::new(i64::from(holds)).encode(m)?;
    let mut seen = std::collections::HashSet::new();
    let delegated = routes
        .iter()
        .flat_map(|r| &r.targets)
        .filter(|t| seen.insert(Arc::as_ptr(&t.state)) && t.state.probes.delegated())
        .count();
    let m = enc.encode_descriptor(
        "switchback_probes_delegated",
        "Targets whose open circuit this replica leaves another replica to probe",
        None,
        MetricType::Gauge,
    )?;
    ConstGauge::new(delegated as i64).encode(m)
}

/// Per LLMClient (docs/tenancy.md#usage): its tokens by route, and its requests refused with 429.
fn clients(enc: &mut DescriptorEncoder<'_>, gw: &Gateway) -> Fmt {
    let carried = gw.carried();
    {
        let mut m = enc.encode_descriptor(
            "switchback_client_tokens",
            "Tokens reported in provider usage, by LLMClient and route",
            None,
            MetricType::Counter,
        )?;
        for ((client, route), t) in carried.client_routes() {
            let (client, route) = (client.to_string(), route.to_string());
            for (direction, n) in [("input", &t.input), ("output", &t.output)] {
                let labels = [
                    ("client", client.as_str()),
                    ("route", route.as_str()),
                    ("direction", direction),
                ];
                ConstCounter::new(counters::get(n)).encode(m.encode_family(&labels)?)?;
            }
        }
    }
    let mut m = enc.encode_descriptor(
        "switchback_client_throttled",
        "LLMClient requests refused with 429 before routing, by reason",
        None,
        MetricType::Counter,
    )?;
    for (client, c) in carried.clients() {
        let client = client.to_string();
        for (reason, n) in [
            ("rate_limited", &c.rate_limited),
            ("budget_exhausted", &c.budget_exhausted),
        ] {
            ConstCounter::new(counters::get(n))
                .encode(m.encode_family(&[("client", client.as_str()), ("reason", reason)])?)?;
        }
    }
    Ok(())
}

/// What the limits refused (docs/limits.md#the-limits): the client-side ones and those on provider
/// answers, in one family; and what the two in-flight budgets hold now.
fn limits(
    enc: &mut DescriptorEncoder<'_>,
    (front, admin): (&crate::front::Front, &crate::front::Front),
    upstream: &crate::limits::answers::Refusals,
    answers_held: usize,
    resume_held: usize,
) -> Fmt {
    let (r, a) = (&front.refusals, &admin.refusals);
    // Limits both ports keep count on both.
    let both = |data: &std::sync::atomic::AtomicU64, admin: &std::sync::atomic::AtomicU64| {
        data.load(Ordering::Relaxed) + admin.load(Ordering::Relaxed)
    };
    {
        let mut m = enc.encode_descriptor(
            "switchback_limit_refusals",
            "What each limit refused (for max_connections: times new connections had to wait)",
            None,
            MetricType::Counter,
        )?;
        let load = |n: &std::sync::atomic::AtomicU64| n.load(Ordering::Relaxed);
        for (limit, n) in [
            (
                "header_read_timeout",
                both(&r.header_timeouts, &a.header_timeouts),
            ),
            ("body_read_timeout", load(&r.body_timeouts)),
            ("idle_timeout", load(&r.idle_timeouts)),
            ("max_connections", load(&r.connection_waits)),
            ("max_body_bytes", load(&r.too_large)),
            ("max_inflight_body_bytes", load(&r.over_budget)),
            (
                "max_header_bytes",
                both(&r.header_too_large, &a.header_too_large),
            ),
            (
                "max_inflight_header_bytes",
                both(&r.heads_over_budget, &a.heads_over_budget),
            ),
            (
                "client_write_timeout",
                both(&r.write_timeouts, &a.write_timeouts),
            ),
            ("max_hops", load(&r.hops)),
            ("admin_max_connections", load(&a.evictions)),
            ("admin_idle_timeout", load(&a.idle_timeouts)),
            ("max_event_bytes", load(&upstream.events)),
            ("max_response_bytes", load(&upstream.responses)),
            ("max_inflight_response_bytes", load(&upstream.over_budget)),
            ("fetch_media_timeout", load(&upstream.fetch_timeouts)),
            ("max_fetched_urls", load(&upstream.fetches_over_count)),
        ] {
            ConstCounter::new(n).encode(m.encode_family(&[("limit", limit)])?)?;
        }
    }
    for (name, help, value) in [
        (
            "switchback_client_connections",
            "Open client connections on the data port",
            front.open_connections(),
        ),
        (
            "switchback_admin_connections",
            "Open connections on the admin port",
            admin.open_connections(),
        ),
        (
            "switchback_header_bytes_held",
            "Bytes of unfinished request heads held in the head budget",
            front.header_bytes_held() + admin.header_bytes_held(),
        ),
        (
            "switchback_request_body_bytes_held",
            "Request body bytes held in the in-flight budget",
            front.body_bytes_held(),
        ),
        (
            "switchback_response_bytes_held",
            "Unary provider answer bytes held in the in-flight budget",
            answers_held,
        ),
        (
            "switchback_resume_held_bytes",
            "Answer text held to resume broken streams",
            resume_held,
        ),
    ] {
        let m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
        ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX)).encode(m)?;
    }
    Ok(())
}
