//! `/admin/v1/stats` (docs/observability.md#stats): the document the operator scrapes, made
//! at request time from the live snapshot's routes, their targets' counters and state
//! (circuit, park, latency, last failure), what a request finds at each target now and the
//! order it takes them (docs/troubleshooting.md#target-states), and every LLMClient's usage
//! since start.

use std::time::{Duration, SystemTime};

use switchback_crds::stats::TargetState;
use tokio::time::Instant;

use super::metrics::route_costs as costs;
use crate::config::snapshot::TargetRt;
use crate::gateway::Gateway;
use crate::limits::circuit::{Reported, State};
use crate::limits::clients::Counted;
use crate::observe::counters::get;
use crate::observe::reason::{Reason, ResumeOutcome};

/// What a request finds at `t` now, with since and until when known: a missing key
/// first (nothing can be sent), then the circuit, a park, a full queue.
fn target_state(
    t: &TargetRt,
    now: Instant,
    now_ms: u64,
    wall: SystemTime,
) -> (TargetState, Option<SystemTime>, Option<SystemTime>) {
    let at = |instant: Instant| wall + instant.saturating_duration_since(now);
    if t.credential.keys.is_empty() {
        return (TargetState::NoKey, None, None);
    }
    let (state, since) = t.state.breaker.state();
    match (t.state.breaker.reported(now), state) {
        // Until: the end of `openFor`, or the next background probe.
        (Reported::Open, State::Open { until, .. }) => {
            let until = (until > now).then(|| at(until));
            return (TargetState::CircuitOpen, Some(since), until);
        }
        // A background probe is running.
        (Reported::Open, _) => return (TargetState::CircuitOpen, Some(since), None),
        (Reported::HalfOpen, _) => return (TargetState::HalfOpen, Some(since), None),
        (Reported::Closed, _) => {}
    }
    let parked = t.state.parked_until_ms();
    if parked > now_ms {
        return (
            TargetState::Parked,
            None,
            Some(wall + Duration::from_millis(parked - now_ms)),
        );
    }
    let spec = &t.credential.spec;
    if let (Some(limiter), Some(max)) = (&t.credential.limiter, spec.max_concurrency)
        && limiter.in_flight(max) >= max
        && limiter.waiting() >= spec.max_queue.unwrap_or(0)
    {
        return (TargetState::Saturated, None, None);
    }
    (TargetState::Ready, None, None)
}

/// `/admin/v1/stats`: the live snapshot's routes with their counters and the state of
/// their targets, read by the operator's scrape round `round` (`?round=`): each
/// client's counters are remembered as of that round (what the operator's rendered
/// `budget.left` counts from, see `limits::clients`), and what was reported is
/// noted for the handover at shutdown (`handover`).
pub fn report_for(gw: &Gateway, round: Option<u64>) -> switchback_crds::stats::StatsReport {
    use switchback_crds::stats as doc;
    let snapshot = gw.snapshot();
    let now = tokio::time::Instant::now();
    let (now_ms, wall) = (gw.now_ms(), std::time::SystemTime::now());
    let load = gw.report();
    let routes = snapshot
        .route_list
        .iter()
        .map(|r| doc::RouteStats {
            order: crate::pipeline::order::likely(r)
                .as_slice()
                .iter()
                .map(|&i| u32::from(i))
                .collect(),
            route: r.spec.id.clone(),
            generation: r.spec.generation,
            revision: Some(r.revision),
            requests: get(&r.counters.requests),
            attempts: get(&r.counters.attempts),
            fallbacks: get(&r.counters.fallbacks),
            failed: get(&r.counters.failed),
            resumed: get(&r.counters.resumed),
            cost_usd: costs(r).0,
            fallback_extra_usd: costs(r).1,
            targets: r
                .targets
                .iter()
                .map(|t| target_stats(t, now, now_ms, wall))
                .collect(),
        })
        .collect();
    doc::StatsReport {
        credentials: credential_stats(&snapshot, now_ms, wall),
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
        clients: client_stats(gw, round),
        draining: gw.front.is_draining(),
    }
}

/// Every client's counters since start; remembered as of `round`, and noted as
/// read for the handover, when the operator's scrape asks.
fn client_stats(gw: &Gateway, round: Option<u64>) -> Vec<switchback_crds::stats::ClientStats> {
    use switchback_crds::stats as doc;
    let clients: Vec<doc::ClientStats> = gw
        .carried()
        .clients()
        .into_iter()
        .map(|(client, c)| {
            let last = get(&c.last_request_ms);
            let s = doc::ClientStats {
                client,
                requests: get(&c.requests),
                input_tokens: get(&c.input_tokens),
                output_tokens: get(&c.output_tokens),
                micro_usd: get(&c.micro_usd),
                rate_limited: get(&c.rate_limited),
                budget_exhausted: get(&c.budget_exhausted),
                last_request_at: (last > 0)
                    .then(|| rfc3339(std::time::UNIX_EPOCH + Duration::from_millis(last))),
                estimated_requests: get(&c.estimated_requests),
                estimated_tokens: get(&c.estimated_tokens),
                reserved_tokens: c.reserved_tokens(),
            };
            if let Some(round) = round {
                // The very numbers reported: what the operator sums at this round.
                c.read_at(Counted {
                    round,
                    tokens: s.input_tokens + s.output_tokens,
                    micro_usd: s.micro_usd,
                });
            }
            s
        })
        .collect();
    if round.is_some() {
        let reported = clients
            .iter()
            .map(|s| {
                [
                    s.requests,
                    s.input_tokens,
                    s.output_tokens,
                    s.micro_usd,
                    s.rate_limited,
                    s.budget_exhausted,
                ]
                .into_iter()
                .fold(0u64, u64::wrapping_add)
            })
            .fold(0u64, u64::wrapping_add);
        gw.handover.read(reported);
    }
    clients
}

/// One target's line of the report: its counters, circuit, park, last failure,
/// latency, and its state now (see [`target_state`]).
fn target_stats(
    t: &TargetRt,
    now: tokio::time::Instant,
    now_ms: u64,
    wall: std::time::SystemTime,
) -> switchback_crds::stats::TargetStats {
    use switchback_crds::stats as doc;
    let c = &t.counters;
    let parked = t.state.parked_until_ms();
    let (_, since) = t.state.breaker.state();
    let ewma = t.state.latency_ewma_us();
    let (state, state_since, state_until) = target_state(t, now, now_ms, wall);
    doc::TargetStats {
        state: Some(state),
        resumed: c.resumes.get(ResumeOutcome::Resumed),
        hedges: get(&c.hedges),
        hedge_wins: get(&c.hedge_wins),
        cost_usd: c.cost.get(),
        state_since: state_since.map(rfc3339),
        state_until: state_until.map(rfc3339),
        fallbacks_away_by_reason: c
            .fallbacks_away
            .nonzero()
            .map(|(r, n)| (r.as_str().to_string(), n))
            .collect(),
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
        circuit: match t.state.breaker.reported(now) {
            Reported::Closed => doc::CircuitState::Closed,
            Reported::Open => doc::CircuitState::Open,
            Reported::HalfOpen => doc::CircuitState::HalfOpen,
        },
        circuit_since: Some(rfc3339(since)),
        circuit_opened: t.state.breaker.opened(),
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
        // Left to another replica by the fleet's view: not probed here.
        probing: (t.state.breaker.probing() || t.spec.health_check.is_some())
            && !t.state.probes.delegated(),
        probes: probe_counts(t),
        last_probe: t.state.probes.last().map(|(failure, at)| doc::ProbeRecord {
            outcome: failure.map_or("success", Reason::as_str).to_string(),
            at: rfc3339(at),
        }),
    }
}

/// A target's probes by outcome: `success`, or the failure's reason.
fn probe_counts(t: &TargetRt) -> std::collections::BTreeMap<String, u64> {
    let p = &t.state.probes;
    let successes = get(&p.successes);
    (successes > 0)
        .then(|| ("success".to_string(), successes))
        .into_iter()
        .chain(
            p.failures
                .nonzero()
                .map(|(r, n)| (r.as_str().to_string(), n)),
        )
        .collect()
}

/// Every credential's keys (docs/request-lifecycle.md#key-pools), by data-key name, never value.
fn credential_stats(
    snapshot: &crate::config::snapshot::Snapshot,
    now_ms: u64,
    wall: SystemTime,
) -> Vec<switchback_crds::stats::CredentialStats> {
    use switchback_crds::stats as doc;
    let mut out: Vec<doc::CredentialStats> = snapshot
        .credentials
        .values()
        .map(|c| doc::CredentialStats {
            credential: c.spec.id.clone(),
            keys: c
                .keys
                .iter()
                .map(|k| {
                    let (state, until) = k.state.shown(now_ms);
                    doc::KeyStats {
                        name: k.name.to_string(),
                        state,
                        until: until.map(|u| rfc3339(wall + Duration::from_millis(u - now_ms))),
                        attempts: get(&k.state.attempts),
                        rate_limited: get(&k.state.rate_limited),
                        rejected: get(&k.state.rejected),
                    }
                })
                .collect(),
        })
        .collect();
    out.sort_by(|a, b| a.credential.cmp(&b.credential));
    out
}

/// A wall-clock time as the report writes it (RFC 3339, milliseconds).
fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}
