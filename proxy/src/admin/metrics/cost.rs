//! What routes cost, on `/metrics`: `switchback_cost_usd_total{route,target,model,client}`
//! (answers at their target's `price`; `client` is the LLMClient, empty with
//! authentication off), `switchback_fallback_extra_cost_usd_total{route}` (what
//! answers by a target other than the route's first cost beyond the first's price)
//! and `switchback_primary_answers_total{route,mode}` (requests the first target
//! answered, for the cost-inversion alert). Read from the same exact counters as
//! `/admin/v1/stats`, shown in USD as Prometheus floats.

use std::collections::HashSet;
use std::sync::Arc;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use switchback_crds::config::Strategy;
use switchback_crds::cost::Usd;

use super::{Fmt, model};
use crate::config::snapshot::{RouteRt, Snapshot};
use crate::gateway::Gateway;
use crate::observe::counters;

pub(super) fn encode(enc: &mut DescriptorEncoder<'_>, gw: &Gateway, snapshot: &Snapshot) -> Fmt {
    let routes = &snapshot.route_list;
    {
        let mut m = enc.encode_descriptor(
            "switchback_cost_usd",
            "What answers cost at their target's price (reported and estimated usage), in USD",
            None,
            MetricType::Counter,
        )?;
        // Every priced target has its series; an unpriced one once it cost something
        // (it was priced before a reload).
        let mut priced = HashSet::new();
        for r in routes {
            let route = r.spec.id.to_string();
            let mut seen = HashSet::new();
            for t in &r.targets {
                if t.pricing.priced {
                    priced.insert((&r.spec.id, &t.spec.credential, t.spec.model.as_deref()));
                }
                // With authentication on, every request has its client's series.
                let cost = t.counters.cost.get();
                let shown = t.pricing.priced || !cost.is_zero();
                if snapshot.auth_required || !shown || !seen.insert((t.label.as_str(), model(t))) {
                    continue;
                }
                let labels = [
                    ("route", route.as_str()),
                    ("target", t.label.as_str()),
                    ("model", model(t)),
                    ("client", ""),
                ];
                ConstCounter::new(cost.as_f64()).encode(m.encode_family(&labels)?)?;
            }
        }
        for ((client, route, credential, target_model), c) in gw.carried().client_costs() {
            let cost = c.get();
            let is_priced = priced.contains(&(&route, &credential, target_model.as_deref()));
            if cost.is_zero() && !is_priced {
                continue;
            }
            let (client, route, target) = (
                client.to_string(),
                route.to_string(),
                credential.to_string(),
            );
            let labels = [
                ("route", route.as_str()),
                ("target", target.as_str()),
                ("model", target_model.as_deref().unwrap_or("")),
                ("client", client.as_str()),
            ];
            ConstCounter::new(cost.as_f64()).encode(m.encode_family(&labels)?)?;
        }
    }
    {
        let mut m = enc.encode_descriptor(
            "switchback_fallback_extra_cost_usd",
            "What answers by a target other than the route's first cost beyond what the first would have charged for the same tokens, in USD",
            None,
            MetricType::Counter,
        )?;
        for r in routes {
            let route = r.spec.id.to_string();
            ConstCounter::new(fallback_extra(r).as_f64())
                .encode(m.encode_family(&[("route", route.as_str())])?)?;
        }
    }
    let mut m = enc.encode_descriptor(
        "switchback_primary_answers",
        "Requests answered by the route's first declared target, by the route's strategy",
        None,
        MetricType::Counter,
    )?;
    for r in routes {
        let route = r.spec.id.to_string();
        let labels = [("route", route.as_str()), ("mode", mode(r.spec.strategy))];
        ConstCounter::new(counters::get(&r.counters.primary_answers))
            .encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

/// What a route's answers cost, and what of it was beyond its first target's price:
/// summed over its targets (a target listed twice shares its counters: once).
pub fn route_costs(r: &RouteRt) -> (Usd, Usd) {
    let mut seen = HashSet::new();
    r.targets
        .iter()
        .filter(|t| seen.insert(Arc::as_ptr(&t.counters)))
        .fold((Usd::ZERO, Usd::ZERO), |(cost, extra), t| {
            (
                cost.saturating_add(t.counters.cost.get()),
                extra.saturating_add(t.counters.fallback_extra.get()),
            )
        })
}

fn fallback_extra(r: &RouteRt) -> Usd {
    route_costs(r).1
}

/// `spec.strategy.mode` as the manifest spells it.
fn mode(s: Strategy) -> &'static str {
    match s {
        Strategy::Fallback => "fallback",
        Strategy::Loadbalance => "loadbalance",
        Strategy::LeastLatency => "least-latency",
        Strategy::CostOptimized => "cost-optimized",
    }
}
