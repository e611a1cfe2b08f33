//! The order in which one request walks a route's targets, per strategy:
//! `fallback` as declared; `loadbalance` first target drawn by weight, the rest as
//! declared; `least-latency` unmeasured targets first, then by smoothed latency;
//! `cost-optimized` by price (input + output per million), unpriced last. Ties keep
//! the declared order. Fixed-size, allocation-free: a route has at most 8 targets.

use switchback_crds::config::Strategy;

use crate::config::snapshot::RouteRt;

pub const MAX_TARGETS: usize = 8;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Order {
    idx: [u8; MAX_TARGETS],
    len: u8,
}

impl Order {
    fn declared(n: usize) -> Self {
        let n = n.min(MAX_TARGETS);
        let mut idx = [0u8; MAX_TARGETS];
        for (i, slot) in idx.iter_mut().enumerate().take(n) {
            *slot = i as u8;
        }
        Self { idx, len: n as u8 }
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.idx[..self.len as usize]
    }
}

/// `draw` is uniform in `[0, 1)`; passing it in keeps the function deterministic to test.
pub fn order(route: &RouteRt, draw: f64) -> Order {
    let mut o = Order::declared(route.targets.len());
    let n = o.len as usize;
    match route.spec.strategy {
        Strategy::Fallback => {}
        Strategy::Loadbalance => {
            let total: u32 = route.targets.iter().map(|t| t.spec.weight).sum();
            let mut point = draw * f64::from(total);
            let first = route
                .targets
                .iter()
                .position(|t| {
                    point -= f64::from(t.spec.weight);
                    point < 0.0
                })
                .unwrap_or(0);
            // Rotate the pick to the front, keeping the others in declared order.
            o.idx[..=first].rotate_right(1);
        }
        Strategy::LeastLatency => {
            // Unmeasured (0) sorts first; stable sort keeps declared order for ties.
            o.idx[..n].sort_by_key(|&i| route.targets[i as usize].state.latency_ewma_us());
        }
        Strategy::CostOptimized => {
            let cost = |i: u8| {
                route.targets[i as usize]
                    .spec
                    .price
                    .map(|p| p.input_per_million + p.output_per_million)
                    .unwrap_or(f64::INFINITY)
            };
            o.idx[..n].sort_by(|&a, &b| cost(a).total_cmp(&cost(b)));
        }
    }
    o
}

/// The order a request most likely takes now, for stats
/// (docs/troubleshooting.md#target-states): [`order`], with loadbalance's draw replaced by
/// its heaviest target (the likeliest first; ties keep the declared order).
pub fn likely(route: &RouteRt) -> Order {
    if route.spec.strategy != Strategy::Loadbalance {
        return order(route, 0.0);
    }
    let mut o = Order::declared(route.targets.len());
    let heaviest = (0..o.len as usize)
        .max_by_key(|&i| (route.targets[i].spec.weight, std::cmp::Reverse(i)))
        .unwrap_or(0);
    o.idx[..=heaviest].rotate_right(1);
    o
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use http::header::HeaderValue;
    use switchback_crds::config::{
        CircuitBreaker, Credential, Fallback, ObjectId, Price, Provider, Retry, Route,
        SecretKeyRef, Target,
    };

    use super::*;
    use crate::config::snapshot::{CredentialRt, TargetRt};
    use crate::config::target::TargetState;
    use crate::limits::keys::KeyPool;

    /// A route over one credential `ns/c`: a target per `(weight, price)`.
    pub(crate) fn route(strategy: Strategy, targets: Vec<(u32, Option<f64>)>) -> RouteRt {
        route_with_keys(strategy, targets, 1)
    }

    /// [`route`], its credential holding a pool of `keys` keys named `k0`, `k1`, ...
    pub(crate) fn route_with_keys(
        strategy: Strategy,
        targets: Vec<(u32, Option<f64>)>,
        keys: usize,
    ) -> RouteRt {
        let spec = Credential {
            key_rejected_for_ms: 300_000,
            api_version: None,
            responses_api: false,
            prefill: false,
            project: None,
            location: None,
            region: None,
            id: ObjectId::new("ns", "c"),
            provider: Provider::Openai,
            base_url: "http://x".into(),
            headers: Default::default(),
            max_concurrency: None,
            max_queue: None,
            allow_private_network: false,
            secret_ref: SecretKeyRef {
                keys: Vec::new(),
                name: "s".into(),
                key: "k".into(),
            },
        };
        let adapter = crate::providers::adapter(spec.provider);
        let prepared = adapter
            .prepare(&spec, None, &mut Default::default())
            .unwrap();
        let cred = Arc::new(CredentialRt {
            spec,
            adapter,
            endpoint: prepared.endpoint,
            target_header: HeaderValue::from_static("ns/c"),
            host: "x".into(),
            keys: KeyPool::unkeyed(keys),
            client: crate::upstream::Clients::new(1).unwrap().private,
            limiter: None,
        });
        RouteRt {
            spec: Route {
                response_model: Default::default(),
                id: ObjectId::new("ns", "r"),
                generation: 1,
                models: vec!["m".into()],
                strategy,
                targets: vec![],
                fallback: Fallback::default(),
                circuit_breaker: CircuitBreaker::default(),
                timeout_ms: 1000,
                shared_with: Vec::new(),
                stream: None,
                hedge: None,
            },
            route_header: HeaderValue::from_static("ns/r"),
            generation_header: HeaderValue::from_static("1"),
            revision: Default::default(),
            counters: Default::default(),
            hedge: None,
            targets: targets
                .into_iter()
                .map(|(weight, price)| TargetRt {
                    model_headers: Default::default(),
                    spec: Target {
                        health_check: None,
                        model_map: Default::default(),
                        credential: ObjectId::new("ns", "c"),
                        model: None,
                        weight,
                        timeout_ms: None,
                        retry: Retry::default(),
                        price: price.map(|p| Price {
                            input_per_million: p,
                            output_per_million: p,
                        }),
                    },
                    credential: cred.clone(),
                    state: Arc::new(TargetState::default()),
                    counters: Default::default(),
                    label: "ns/c".into(),
                    model_json: None,
                    model_map_json: Default::default(),
                    urls: Default::default(),
                    pricing: Default::default(),
                })
                .collect(),
        }
    }

    #[test]
    fn fallback_keeps_declared_order() {
        let r = route(Strategy::Fallback, vec![(1, None); 3]);
        assert_eq!(order(&r, 0.9).as_slice(), &[0, 1, 2]);
    }

    #[test]
    fn loadbalance_draws_the_first_by_weight_then_declared() {
        let r = route(Strategy::Loadbalance, vec![(1, None), (2, None), (1, None)]);
        assert_eq!(order(&r, 0.0).as_slice(), &[0, 1, 2]);
        assert_eq!(order(&r, 0.24).as_slice(), &[0, 1, 2]);
        assert_eq!(order(&r, 0.25).as_slice(), &[1, 0, 2]);
        assert_eq!(order(&r, 0.74).as_slice(), &[1, 0, 2]);
        assert_eq!(order(&r, 0.75).as_slice(), &[2, 0, 1]);
        assert_eq!(order(&r, 0.999).as_slice(), &[2, 0, 1]);
    }

    /// What stats report as the order now: loadbalance's heaviest target first (the
    /// likeliest), the other strategies as a request orders them.
    #[test]
    fn the_likely_order_puts_loadbalance_heaviest_first() {
        let r = route(Strategy::Loadbalance, vec![(1, None), (3, None), (3, None)]);
        assert_eq!(
            likely(&r).as_slice(),
            &[1, 0, 2],
            "ties keep declared order"
        );
        let r = route(Strategy::Fallback, vec![(1, None), (9, None)]);
        assert_eq!(likely(&r).as_slice(), &[0, 1]);
        let r = route(
            Strategy::CostOptimized,
            vec![(1, Some(3.0)), (1, Some(1.0)), (1, None)],
        );
        assert_eq!(likely(&r).as_slice(), order(&r, 0.5).as_slice());
    }

    #[test]
    fn least_latency_tries_unmeasured_first_then_fastest() {
        let r = route(Strategy::LeastLatency, vec![(1, None); 3]);
        r.targets[0]
            .state
            .observe_latency(Duration::from_millis(30));
        r.targets[2]
            .state
            .observe_latency(Duration::from_millis(10));
        assert_eq!(order(&r, 0.0).as_slice(), &[1, 2, 0]);
        r.targets[1]
            .state
            .observe_latency(Duration::from_millis(20));
        assert_eq!(order(&r, 0.0).as_slice(), &[2, 1, 0]);
    }

    #[test]
    fn cost_optimized_sorts_by_price_unpriced_last() {
        let r = route(
            Strategy::CostOptimized,
            vec![(1, None), (1, Some(5.0)), (1, Some(1.0)), (1, Some(5.0))],
        );
        assert_eq!(order(&r, 0.0).as_slice(), &[2, 1, 3, 0]);
    }
}
