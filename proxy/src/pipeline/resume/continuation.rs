//! The walk that finds a broken stream's continuation: the targets after the one
//! whose stream broke, in the request's order, each skipped for its usual reasons or
//! because it cannot continue a prefilled answer (`cannotResume`), each tried with its
//! retries within the call's budget, its request carrying the text the client holds
//! as a prefill (by each provider's rules, `providers`). The first whose continuation
//! commits takes over.

use std::sync::Arc;

use axum::body::Body;
use tokio::time::Instant;

use super::Seed;
use crate::observe::reason::{Reason, ResumeOutcome};
use crate::pipeline::call::Call;
use crate::pipeline::log::AttemptLog;
use crate::pipeline::outcome::may_advance;
use crate::pipeline::send::Http;
use crate::pipeline::stream::{Resuming, StreamReport};
use crate::pipeline::walk::{Tried, Walk};

/// What the walk found.
pub(super) enum Found {
    Continued {
        /// The continuation's body (the client's API) and what its stream tells.
        attempt: (Body, Arc<StreamReport>),
        target: u8,
        /// Its position in `Seed::order`.
        at: usize,
        /// Bytes of the client's text the prefill carried.
        prefilled: usize,
        log: Vec<AttemptLog>,
        sent: u32,
    },
    NotResumed {
        why: ResumeOutcome,
        /// The target whose stream broke, and why it did.
        broken: u8,
        reason: Reason,
        log: Vec<AttemptLog>,
        sent: u32,
    },
}

/// Finds the continuation of an answer whose client holds `text`, among
/// `seed.order[from..]`, after `broken`'s stream failed for `reason`.
pub(super) async fn find(
    seed: Arc<Seed>,
    (broken, reason): (u8, Reason),
    from: usize,
    text: String,
) -> Found {
    let call = Call {
        surface: seed.surface,
        client_model: &seed.client_model,
        client_model_json: seed.client_model_json.clone(),
        body: seed.body.clone(),
        stream: true,
        client_headers: &seed.client_headers,
        request_id: &seed.request_id,
        hops: seed.hops,
        client: seed.client.as_ref(),
        include_usage: seed.include_usage,
        strip_usage: seed.strip_usage,
        // The request's reservation went with the stream that broke (it settled
        // as that stream ended); the client that leaves a continuation cancels it.
        reservation: None,
        abandoned: &crate::pipeline::STAYS,
    };
    let mut walk = Walk::new(&Http, &seed.gw, &seed.route, &call, seed.budget);
    walk.prefill = Some(&text);
    let mut why = ResumeOutcome::NoEligibleTarget;
    let span = tracing::Span::current();
    for (at, &i) in seed.order.iter().enumerate().skip(from) {
        match walk.target(i, false).await {
            Tried::Answered(response, _line) => {
                let (mut parts, body) = response.into_parts();
                let Some(Resuming(report)) = parts.extensions.remove::<Resuming>() else {
                    // Not a committed stream of this route (never so): not relayed.
                    continue;
                };
                span.record("switchback.resume.outcome", ResumeOutcome::Resumed.as_str());
                span.record(
                    "switchback.resume.target",
                    seed.route.targets[i as usize].label.as_str(),
                );
                return Found::Continued {
                    attempt: (body, report),
                    target: i,
                    at,
                    prefilled: walk.prefilled,
                    log: std::mem::take(&mut walk.log),
                    sent: walk.sent,
                };
            }
            Tried::Skipped(_) => {}
            // The continuation's walk never hedges (`Walk::new` leaves `hedge` empty):
            // a continuation already waited for its first token once.
            Tried::HedgeWon(..) => debug_assert!(false, "a continuation does not hedge"),
            Tried::Failed(f) => {
                if f.reason == Reason::Budget || Instant::now() >= walk.budget {
                    why = ResumeOutcome::BudgetExhausted;
                    break;
                }
                if !may_advance(f.reason, f.status, &seed.route.spec.fallback) {
                    break;
                }
            }
        }
    }
    span.record("switchback.resume.outcome", why.as_str());
    Found::NotResumed {
        why,
        broken,
        reason,
        log: std::mem::take(&mut walk.log),
        sent: walk.sent,
    }
}
