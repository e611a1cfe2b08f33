//! Why a route's requests go where they go
//! (docs/troubleshooting.md#my-requests-go-to-the-fallback), computed purely from the last
//! scrape round: each target's state for `status.targets[]` (with since, until, how many
//! replicas see it and its share of the window's answers), the target that answers first
//! now (`status.serving`, the SERVING column), the window's fallbacks by reason, and
//! `status.summary`, one sentence that reads as the answer to "why does this route go to
//! that provider right now?".
//!
//! It knows the states and reasons as the proxies report them; it does not know how a
//! proxy decides them, nor how status is written.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use switchback_crds::route::TargetStatus;
use switchback_crds::stats::{CircuitState, TargetState};

use crate::aggregate::{RouteView, TargetView};

/// The skip reason of a target that cannot serve the surface a request came on.
const UNSUPPORTED_SURFACE: &str = "unsupportedSurface";

/// What [`explain`] gives a route's status.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Explained {
    /// Per target, in declared order: `state`, `since`, `until`, `replicas`, `share`
    /// (the other fields are left at their defaults for the caller to fill).
    pub targets: Vec<Explanation>,
    pub serving: Option<String>,
    pub summary: Option<String>,
    /// The window's fallbacks, by the reason requests left a target.
    pub fallbacks_by_reason: BTreeMap<String, i64>,
}

/// One target's part of [`Explained`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Explanation {
    pub state: TargetState,
    pub since: Option<Time>,
    pub until: Option<Time>,
    pub replicas: u32,
    pub share: Option<f64>,
}

/// Explains `view` (a route's targets over the ready replicas), keeping each target's
/// `since` from `previous` (the status written last) while its state holds and no
/// replica says since when. `ready_replicas`: how many replicas were scraped.
pub fn explain(
    view: &RouteView,
    previous: &[TargetStatus],
    ready_replicas: usize,
    window_seconds: u64,
    now: &Time,
) -> Explained {
    let answers: u64 = view.targets.iter().map(|t| t.window.successes).sum();
    let targets: Vec<Explanation> = view
        .targets
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let state = state_of(t);
            let since = t.since.as_deref().and_then(time).or_else(|| {
                previous
                    .get(i)
                    .filter(|p| p.credential == t.credential.name && p.model == t.model)
                    .filter(|p| p.state.as_deref() == Some(state.as_str()))
                    .and_then(|p| p.since.clone())
            });
            Explanation {
                state,
                since: since.or_else(|| (state != TargetState::Ready).then(|| now.clone())),
                until: t.until.as_deref().and_then(time),
                replicas: if t.state.is_some() {
                    t.state_replicas
                } else {
                    ready_replicas as u32
                },
                share: (answers > 0)
                    .then(|| (t.window.successes as f64 / answers as f64 * 100.0).round() / 100.0),
            }
        })
        .collect();
    let mut fallbacks_by_reason = BTreeMap::new();
    for t in &view.targets {
        for (reason, n) in &t.window.fallbacks {
            *fallbacks_by_reason.entry(reason.clone()).or_insert(0i64) +=
                i64::try_from(*n).unwrap_or(i64::MAX);
        }
    }
    let order: Vec<usize> = if view.order.len() == view.targets.len() {
        view.order.clone()
    } else {
        (0..view.targets.len()).collect()
    };
    // The first Ready target in the order that answered in the window: a target that
    // is Ready (its circuit not open yet) but failed every request it got is tried
    // first without answering. With no answer in the window, the first Ready one.
    let ready = |i: &&usize| targets[**i].state == TargetState::Ready;
    let serving_index = order
        .iter()
        .filter(ready)
        .find(|&&i| view.targets[i].window.successes > 0)
        .or_else(|| order.iter().find(ready))
        .copied();
    let serving = serving_index.map(|i| name(&view.targets, i));
    let summary = (!view.targets.is_empty()).then(|| {
        summary(
            view,
            &targets,
            &order,
            serving_index,
            &fallbacks_by_reason,
            window_seconds,
        )
    });
    Explained {
        targets,
        serving,
        summary,
        fallbacks_by_reason,
    }
}

/// A target's state: as the replicas report it (an older proxy: from its circuit), or
/// Unsupported when every request of the window that reached it was skipped for the
/// surface it came on.
fn state_of(t: &TargetView) -> TargetState {
    let reported = t.state.unwrap_or(match t.circuit {
        CircuitState::Open => TargetState::CircuitOpen,
        CircuitState::HalfOpen => TargetState::HalfOpen,
        CircuitState::Closed => TargetState::Ready,
    });
    let unsupported = t.window.requests > 0
        && t.window
            .failures
            .get(UNSUPPORTED_SURFACE)
            .copied()
            .unwrap_or(0)
            >= t.window.requests;
    if reported == TargetState::Ready && unsupported {
        TargetState::Unsupported
    } else {
        reported
    }
}

/// The credential's name, with the model when another target uses that credential.
fn name(targets: &[TargetView], i: usize) -> String {
    let t = &targets[i];
    let shared = targets
        .iter()
        .filter(|o| o.credential == t.credential)
        .count()
        > 1;
    match (&t.model, shared) {
        (Some(model), true) => format!("{} ({model})", t.credential.name),
        _ => t.credential.name.clone(),
    }
}

fn time(rfc3339: &str) -> Option<Time> {
    rfc3339.parse().ok().map(Time)
}

/// "Order now: a (CircuitOpen on 2 replicas until …, skipped), b (Ready, serving), c.
/// Last 300s: 1200 requests, 31 fallbacks (status5xx 25, timeout 6), 2 failed."
fn summary(
    view: &RouteView,
    targets: &[Explanation],
    order: &[usize],
    serving: Option<usize>,
    fallbacks_by_reason: &BTreeMap<String, i64>,
    window_seconds: u64,
) -> String {
    let steps: Vec<String> = order
        .iter()
        .map(|&i| {
            let e = &targets[i];
            let name = name(&view.targets, i);
            let until = e
                .until
                .as_ref()
                .map(|t| format!(" until {}", t.0))
                .unwrap_or_default();
            let replicas = if e.replicas == 1 {
                "1 replica".to_string()
            } else {
                format!("{} replicas", e.replicas)
            };
            let tried = view.targets[i].window.requests;
            match e.state {
                _ if serving == Some(i) => format!("{name} (Ready: serving)"),
                TargetState::Ready if serving.is_some_and(|s| order.iter().position(|&o| o == s) > order.iter().position(|&o| o == i)) => {
                    format!("{name} (Ready, but it answered none of {tried} requests: tried first, failing over)")
                }
                TargetState::Ready => name,
                TargetState::HalfOpen => {
                    format!("{name} (HalfOpen on {replicas}: one probe at a time)")
                }
                state => format!("{name} ({} on {replicas}{until}: skipped)", state.as_str()),
            }
        })
        .collect();
    let mut text = format!("Order now: {}.", steps.join(", "));
    if serving.is_none() {
        text.push_str(
            " No target is Ready: requests try a skipped one anyway or get 503 no_available_target.",
        );
    }
    let w = &view.window;
    let reasons: Vec<String> = {
        let mut by: Vec<(&String, &i64)> = fallbacks_by_reason.iter().collect();
        by.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        by.iter().map(|(r, n)| format!("{r} {n}")).collect()
    };
    let fallbacks = if reasons.is_empty() {
        format!("{} fallbacks", w.fallbacks)
    } else {
        format!("{} fallbacks ({})", w.fallbacks, reasons.join(", "))
    };
    text.push_str(&format!(
        " Last {window_seconds}s: {} requests, {fallbacks}, {} failed.",
        w.requests, w.failed
    ));
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::{Counters, TargetCounts};
    use crate::fixtures::time;
    use switchback_crds::config::ObjectId;

    fn target(name: &str, state: Option<TargetState>, successes: u64) -> TargetView {
        TargetView {
            last_probe: None,
            probing: false,
            credential: ObjectId::new("team-a", name),
            model: None,
            circuit: CircuitState::Closed,
            open_replicas: 0,
            last_failure: None,
            state,
            state_replicas: 2,
            since: None,
            until: None,
            window: TargetCounts {
                requests: successes,
                successes,
                ..TargetCounts::default()
            },
        }
    }

    /// The example of docs/troubleshooting.md#my-requests-go-to-the-fallback: the primary's
    /// circuit is open on both replicas, the backup answers; the summary says the order,
    /// why the first is skipped and until when, and the window's fallbacks by reason.
    #[test]
    fn an_open_circuit_moves_serving_to_the_backup_and_says_until_when() {
        let mut primary = target("openai-prod", Some(TargetState::CircuitOpen), 0);
        primary.since = Some("2026-12-04T12:02:40Z".into());
        primary.until = Some("2026-12-04T12:03:10Z".into());
        primary.window.requests = 40;
        primary.window.fallbacks = BTreeMap::from([
            ("circuitOpen".to_string(), 30),
            ("status5xx".to_string(), 10),
        ]);
        let backup = target("anthropic-prod", Some(TargetState::Ready), 40);
        let view = RouteView {
            targets: vec![primary, backup],
            order: vec![0, 1],
            window: Counters {
                requests: 40,
                attempts: 50,
                fallbacks: 40,
                failed: 0,
                resumed: 0,
                ..Counters::default()
            },
            ..RouteView::default()
        };
        let e = explain(&view, &[], 2, 300, &time(100));
        assert_eq!(e.serving.as_deref(), Some("anthropic-prod"));
        assert_eq!(e.targets[0].state, TargetState::CircuitOpen);
        assert_eq!(e.targets[0].replicas, 2);
        assert_eq!(
            e.targets[0].until,
            Some(Time("2026-12-04T12:03:10Z".parse().unwrap()))
        );
        assert_eq!(e.targets[0].share, Some(0.0));
        assert_eq!(e.targets[1].share, Some(1.0));
        assert_eq!(e.fallbacks_by_reason["circuitOpen"], 30);
        assert_eq!(
            e.summary.as_deref(),
            Some(
                "Order now: openai-prod (CircuitOpen on 2 replicas until 2026-12-04T12:03:10Z: \
                 skipped), anthropic-prod (Ready: serving). Last 300s: 40 requests, 40 \
                 fallbacks (circuitOpen 30, status5xx 10), 0 failed."
            )
        );
    }

    /// A target that is Ready (its circuit has not opened yet) but answered nothing in
    /// the window is not what serves: the README quickstart's first target, down.
    #[test]
    fn a_ready_target_that_answers_nothing_is_not_serving() {
        let mut down = target("down", Some(TargetState::Ready), 0);
        down.window.requests = 1;
        down.window.fallbacks = BTreeMap::from([("connectionError".to_string(), 1)]);
        let view = RouteView {
            targets: vec![down, target("main", Some(TargetState::Ready), 1)],
            order: vec![0, 1],
            window: Counters {
                requests: 1,
                attempts: 2,
                fallbacks: 1,
                failed: 0,
                resumed: 0,
                ..Counters::default()
            },
            ..RouteView::default()
        };
        let e = explain(&view, &[], 2, 300, &time(1));
        assert_eq!(e.serving.as_deref(), Some("main"));
        assert_eq!(
            e.summary.as_deref(),
            Some(
                "Order now: down (Ready, but it answered none of 1 requests: tried first, \
                 failing over), main (Ready: serving). Last 300s: 1 requests, 1 fallbacks \
                 (connectionError 1), 0 failed."
            )
        );
    }

    /// The order a request takes is the proxies' (cost-optimized, least-latency,
    /// loadbalance reorder it), not the declared one.
    #[test]
    fn serving_follows_the_reported_order() {
        let view = RouteView {
            targets: vec![
                target("a", Some(TargetState::Ready), 1),
                target("b", Some(TargetState::Ready), 3),
            ],
            order: vec![1, 0],
            ..RouteView::default()
        };
        let e = explain(&view, &[], 2, 300, &time(1));
        assert_eq!(e.serving.as_deref(), Some("b"));
        assert_eq!(e.targets[1].share, Some(0.75));
        assert!(
            e.summary
                .unwrap()
                .starts_with("Order now: b (Ready: serving), a.")
        );
    }

    /// A state held across rounds keeps the `since` it was first seen at; a change
    /// starts a new one. Parked shows until when; NoKey is skipped.
    #[test]
    fn since_is_kept_while_the_state_holds() {
        let mut parked = target("a", Some(TargetState::Parked), 0);
        parked.until = Some("2026-12-04T12:00:30Z".into());
        let view = RouteView {
            targets: vec![parked, target("b", Some(TargetState::NoKey), 0)],
            ..RouteView::default()
        };
        let first = explain(&view, &[], 1, 300, &time(1));
        assert_eq!(first.targets[0].since, Some(time(1)));
        assert_eq!(first.serving, None);
        let summary = first.summary.clone().unwrap();
        assert!(summary.contains("No target is Ready"), "{summary}");
        assert!(
            summary.contains("b (NoKey on 2 replicas: skipped)"),
            "{summary}"
        );
        let written: Vec<TargetStatus> = first
            .targets
            .iter()
            .zip(["a", "b"])
            .map(|(e, name)| TargetStatus {
                credential: name.into(),
                state: Some(e.state.as_str().into()),
                since: e.since.clone(),
                ..TargetStatus::default()
            })
            .collect();
        let later = explain(&view, &written, 1, 300, &time(50));
        assert_eq!(later.targets[0].since, Some(time(1)), "kept");
        let mut recovered = view.clone();
        recovered.targets[1].state = Some(TargetState::Ready);
        let after = explain(&recovered, &written, 1, 300, &time(60));
        assert_eq!(
            after.targets[1].since, None,
            "Ready carries no since of its own"
        );
        assert_eq!(after.serving.as_deref(), Some("b"));
    }

    /// Every request of the window skipped for its surface: Unsupported. An older proxy
    /// without states: the circuit says what it can.
    #[test]
    fn unsupported_is_derived_and_older_proxies_fall_back_to_the_circuit() {
        let mut t = target("gemini", Some(TargetState::Ready), 0);
        t.window.requests = 5;
        t.window.failures = BTreeMap::from([(UNSUPPORTED_SURFACE.to_string(), 5)]);
        let mut old = target("old", None, 0);
        old.circuit = CircuitState::Open;
        let view = RouteView {
            targets: vec![t, old],
            ..RouteView::default()
        };
        let e = explain(&view, &[], 3, 300, &time(1));
        assert_eq!(e.targets[0].state, TargetState::Unsupported);
        assert_eq!(e.targets[1].state, TargetState::CircuitOpen);
        assert_eq!(e.targets[1].replicas, 3);
        assert_eq!(e.targets[0].share, None, "no answers in the window");
    }

    /// Two targets on one credential are told apart by their model.
    #[test]
    fn targets_sharing_a_credential_are_named_with_their_model() {
        let mut a = target("openai", Some(TargetState::CircuitOpen), 0);
        a.model = Some("gpt-4o".into());
        let mut b = target("openai", Some(TargetState::Ready), 1);
        b.model = Some("gpt-4o-mini".into());
        let view = RouteView {
            targets: vec![a, b],
            ..RouteView::default()
        };
        let e = explain(&view, &[], 1, 300, &time(1));
        assert_eq!(e.serving.as_deref(), Some("openai (gpt-4o-mini)"));
    }
}
