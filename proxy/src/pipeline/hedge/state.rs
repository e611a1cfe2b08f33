//! What the walk and a try hold of first-token hedging: a hedging request's state
//! (`Hedging`) and what a raced try came to (`Raced`). A leaf of the pipeline's
//! hedging, so that the walk and the try need nothing of the race itself.

use std::sync::Arc;

use axum::body::Body;
use axum::http::Response;
use switchback_crds::config::Hedge;
use tokio::time::Instant;

use crate::config::snapshot::RouteRt;
use crate::gateway::Gateway;
use crate::observe::reason::Reason;
use crate::pipeline::attempt::Attempted;
use crate::pipeline::order::Order;
use crate::pipeline::stream::LineSlot;

/// A request of a route that hedges: its policy, its order, and its one hedge.
pub(in crate::pipeline) struct Hedging {
    pub(super) policy: Hedge,
    pub(super) order: Order,
    /// The hedge, once started: its target's position in the order, and the target.
    pub(super) started: Option<(u32, u8)>,
    /// Why the hedge failed, if it did.
    pub(super) failed: Option<Reason>,
}

impl Hedging {
    /// For a route that hedges, the request counted in the route's budget.
    pub(in crate::pipeline) fn begin(
        gw: &Gateway,
        route: &RouteRt,
        order: Order,
    ) -> Option<Box<Self>> {
        let (policy, budget) = (route.spec.hedge?, route.hedge.as_deref()?);
        budget.started(gw.now_ms());
        Some(Box::new(Self {
            policy,
            order,
            started: None,
            failed: None,
        }))
    }
}

/// What a raced try came to.
pub(in crate::pipeline) enum Raced {
    /// The try's own result and when it came (no hedge won; the hedge, if one was
    /// started, is counted and logged).
    Primary(Attempted, Instant),
    /// The hedge committed first: its answer, and why the request left the slow try's
    /// target (its failure, counted and logged, or `hedgeLost`).
    HedgeWon(Response<Body>, Option<Arc<LineSlot>>, Reason),
}
