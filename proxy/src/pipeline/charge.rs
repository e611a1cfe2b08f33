//! What an answer's usage is charged to: the (route, target) counters' tokens and
//! cost, what it cost beyond the route's first target, and the LLMClient's tokens,
//! cost on that target and budgets. One place, so every path that counts usage (a
//! unary answer, each stream event that reports some, an estimate, an answer read
//! after its client left) prices it alike, exactly (`observe::cost`).

use crate::limits::clients::ClientUsage;
use crate::observe::cost::Pricing;
use crate::observe::counters::RouteTargetCounters;
use crate::wire::usage::Usage;

/// Charge `u` (reported, or `estimated` by the proxy) of an answer of the target
/// with `counters` and `pricing`, for `client` when the request has one.
pub(crate) fn charge(
    counters: &RouteTargetCounters,
    pricing: &Pricing,
    client: Option<&ClientUsage>,
    u: Usage,
    estimated: bool,
) {
    counters.add_usage(u);
    let (cost, extra) = pricing.charge(u);
    counters.cost.add(cost);
    counters.fallback_extra.add(extra);
    let Some(c) = client else {
        return;
    };
    if let Some(on_target) = c.costs.get(usize::from(pricing.index)) {
        on_target.add(cost);
    }
    let micro = cost.micro_rounded();
    if estimated {
        c.record_estimate(u, micro);
    } else {
        c.record(u, micro);
    }
}
