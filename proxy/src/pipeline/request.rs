//! One request on one route, from the HTTP side: the walk over HTTP, and for a stream
//! of a route that resumes, the body that resumes it (`resume`). The walk itself
//! knows nothing of resuming: a continuation is a walk of its own.

use std::sync::Arc;

use tokio::time::Instant;

use super::call::{Call, Outcome};
use super::order::order;
use super::resume;
use super::send::Http;
use super::stream::resumes;
use super::walk::walk;
use crate::config::snapshot::RouteRt;
use crate::gateway::Gateway;

/// Walk `route`'s targets for `call`, sending over HTTP. A committed stream of a
/// route that resumes gets the body that resumes it (`resume`).
pub async fn run(gw: &Arc<Gateway>, route: &Arc<RouteRt>, call: &Call<'_>) -> Outcome {
    let draw = rand::random::<f64>();
    // Only a stream of a route that resumes reads the clock for it.
    let resumes = (call.stream && resumes(route, call.surface)).then(Instant::now);
    let outcome = walk(&Http, gw, route, call, draw).await;
    match resumes {
        None => outcome,
        Some(started) => resume::hook(gw, route, call, outcome, order(route, draw), started),
    }
}
