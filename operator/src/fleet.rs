//! The fleet's health view (issue 32 item 5, `docs/request-lifecycle.md#one-view-across-replicas`),
//! decided purely from one scrape round: which circuits every replica should hold open
//! or closed, which one replica probes each open one, which keys are set aside and
//! until when; and whether the view is to be written now ([`due`]).
//!
//! - A target's circuit goes by the **latest transition** any ready replica reports:
//!   open if the last opening is later than the last close (a close counts only from a
//!   replica whose circuit ever opened: a fresh replica's `Closed` is its start, not a
//!   success). The view carries the *first* replica's time of that state (its `since`,
//!   and an open one's `until`), so replicas adopting it do not change it.
//! - The **prober** of an open circuit is the replica with the smallest `instanceId`
//!   among those that serve the target: stable while the fleet is, and one per target
//!   however many replicas run.
//! - A **key** set aside anywhere is set aside everywhere until the latest end reported,
//!   rounded down to the second (so replicas adopting it report back the same end).
//! - The view is **written** when its content changes, and refreshed while it says
//!   anything, every half `--fleet-view-ttl`; at most once per scrape round.

use std::collections::BTreeMap;

use switchback_crds::config::ObjectId;
use switchback_crds::fleet::{
    FleetCircuit, FleetView, KeyView, TargetView, VIEW_VERSION, format_ms, parse_ms,
};
use switchback_crds::stats::{CircuitState, KeyState, StatsReport, TargetState};

/// One replica's circuit of one target.
struct Seen<'a> {
    instance: &'a str,
    open: bool,
    since_ms: u64,
    until_ms: Option<u64>,
    ever_opened: bool,
}

type TargetKey = (ObjectId, Option<String>);

/// The view of `reports` (the ready replicas' stats of one round) at `now_ms`, without
/// its expiry (set when written). An opening already in `previous` keeps the end it
/// was told with: the opener's own end moves with each of its probes, and the view
/// is not rewritten for that.
pub fn view(reports: &[&StatsReport], now_ms: u64, previous: Option<&FleetView>) -> FleetView {
    let mut targets = targets(reports);
    for t in targets
        .iter_mut()
        .filter(|t| t.circuit == FleetCircuit::Open)
    {
        let told = previous.into_iter().flat_map(|p| &p.targets).find(|p| {
            (&p.credential, &p.model, p.circuit, &p.since)
                == (&t.credential, &t.model, t.circuit, &t.since)
        });
        if let Some(told) = told {
            t.until = told.until.clone();
        }
    }
    FleetView {
        version: VIEW_VERSION,
        expires_at: String::new(),
        targets,
        keys: keys(reports, now_ms),
    }
}

/// Every target's circuit as each replica reports it, once per replica (a target
/// shared by several routes has one circuit).
fn seen<'a>(reports: &[&'a StatsReport]) -> BTreeMap<TargetKey, Vec<Seen<'a>>> {
    let mut out: BTreeMap<TargetKey, Vec<Seen<'a>>> = BTreeMap::new();
    for r in reports {
        let mut mine = std::collections::BTreeSet::new();
        for t in r.routes.iter().flat_map(|route| &route.targets) {
            let key = (t.credential.clone(), t.model.clone());
            if !mine.insert(key.clone()) {
                continue;
            }
            let Some(since_ms) = t.circuit_since.as_deref().and_then(parse_ms) else {
                continue;
            };
            let open = t.circuit != CircuitState::Closed;
            let until_ms = (t.state == Some(TargetState::CircuitOpen))
                .then(|| t.state_until.as_deref().and_then(parse_ms))
                .flatten();
            out.entry(key).or_default().push(Seen {
                instance: &r.instance_id,
                open,
                since_ms,
                until_ms,
                ever_opened: t.circuit_opened > 0,
            });
        }
    }
    out
}

fn targets(reports: &[&StatsReport]) -> Vec<TargetView> {
    seen(reports)
        .into_iter()
        .filter_map(|((credential, model), seen)| {
            let (circuit, since, until, prober) = verdict(&seen)?;
            Some(TargetView {
                credential,
                model,
                circuit,
                since: format_ms(since),
                until: until.map(format_ms),
                prober: prober.map(str::to_string),
            })
        })
        .collect()
}

type Verdict<'a> = (FleetCircuit, u64, Option<u64>, Option<&'a str>);

/// The latest transition of one target across the replicas, or nothing to tell (no
/// replica holds it open).
fn verdict<'a>(seen: &[Seen<'a>]) -> Option<Verdict<'a>> {
    let last_open = seen.iter().filter(|s| s.open).map(|s| s.since_ms).max()?;
    let closes = || seen.iter().filter(|s| !s.open && s.ever_opened);
    let last_close = closes().map(|s| s.since_ms).max();
    if last_close.is_none_or(|c| last_open > c) {
        let after = last_close.unwrap_or(0);
        let first = seen
            .iter()
            .filter(|s| s.open && s.since_ms > after)
            .min_by_key(|s| (s.since_ms, s.instance))?;
        let prober = seen.iter().map(|s| s.instance).min();
        let until = first.until_ms.map(|u| u / 1000 * 1000);
        return Some((FleetCircuit::Open, first.since_ms, until, prober));
    }
    let first = closes()
        .filter(|s| s.since_ms > last_open)
        .min_by_key(|s| (s.since_ms, s.instance))?;
    Some((FleetCircuit::Closed, first.since_ms, None, None))
}

/// Every key some replica has set aside now: the latest ends, down to the second.
fn keys(reports: &[&StatsReport], now_ms: u64) -> Vec<KeyView> {
    let mut out: BTreeMap<(ObjectId, String), (u64, u64)> = BTreeMap::new();
    for c in reports.iter().flat_map(|r| &r.credentials) {
        for k in &c.keys {
            let Some(until) = k.until.as_deref().and_then(parse_ms) else {
                continue;
            };
            if until <= now_ms || k.state == KeyState::Active {
                continue;
            }
            let until = until / 1000 * 1000;
            let ends = out
                .entry((c.credential.clone(), k.name.clone()))
                .or_default();
            match k.state {
                KeyState::Parked => ends.0 = ends.0.max(until),
                KeyState::Rejected => ends.1 = ends.1.max(until),
                KeyState::Active => {}
            }
        }
    }
    let at = |ms: u64| (ms > now_ms).then(|| format_ms(ms));
    out.into_iter()
        .filter_map(|((credential, name), (parked, rejected))| {
            let (parked_until, rejected_until) = (at(parked), at(rejected));
            (parked_until.is_some() || rejected_until.is_some()).then_some(KeyView {
                credential,
                name,
                parked_until,
                rejected_until,
            })
        })
        .collect()
}

/// What was written last: its content (without expiry) and when.
#[derive(Clone, Debug)]
pub struct Written {
    pub content: FleetView,
    pub at_ms: u64,
}

/// Whether `content` is to be written at `now_ms`: it changed, or it says something
/// and half its `ttl_ms` has passed since the last write. An empty view at start is not
/// written (an older one expires by itself).
pub fn due(last: Option<&Written>, content: &FleetView, now_ms: u64, ttl_ms: u64) -> bool {
    match last {
        None => !content.is_empty(),
        Some(w) if w.content != *content => true,
        Some(w) => !content.is_empty() && now_ms.saturating_sub(w.at_ms) >= ttl_ms / 2,
    }
}

/// `content` as written at `now_ms`: valid for `ttl_ms`.
pub fn stamped(content: &FleetView, now_ms: u64, ttl_ms: u64) -> FleetView {
    FleetView {
        expires_at: format_ms(now_ms + ttl_ms),
        ..content.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchback_crds::stats::{CredentialStats, KeyStats, RouteStats, TargetStats};

    const T0: u64 = 1_780_000_000_000;

    fn id(name: &str) -> ObjectId {
        ObjectId {
            namespace: "team-a".into(),
            name: name.into(),
        }
    }

    /// A target's line: `open` since `since`, until `until`, ever opened or not.
    fn target(open: bool, since: u64, until: Option<u64>, opened: u64) -> TargetStats {
        TargetStats {
            credential: id("primary"),
            model: Some("gpt-x".into()),
            circuit: if open {
                CircuitState::Open
            } else {
                CircuitState::Closed
            },
            state: Some(if open {
                TargetState::CircuitOpen
            } else {
                TargetState::Ready
            }),
            circuit_since: Some(format_ms(since)),
            state_until: until.map(format_ms),
            circuit_opened: opened,
            ..TargetStats::default()
        }
    }

    fn replica(instance: &str, t: TargetStats) -> StatsReport {
        StatsReport {
            instance_id: instance.into(),
            routes: vec![RouteStats {
                route: id("smart"),
                // The same target on two routes is one circuit.
                targets: vec![t.clone(), t],
                ..RouteStats::default()
            }],
            ..StatsReport::default()
        }
    }

    fn of(reports: &[StatsReport]) -> FleetView {
        after(reports, None)
    }

    fn after(reports: &[StatsReport], previous: Option<&FleetView>) -> FleetView {
        view(&reports.iter().collect::<Vec<_>>(), T0 + 10_000, previous)
    }

    #[test]
    fn a_fleet_where_nothing_is_open_has_nothing_to_tell() {
        let v = of(&[
            replica("b", target(false, T0, None, 0)),
            replica("a", target(false, T0 - 5_000, None, 2)),
        ]);
        assert!(v.is_empty(), "{v:?}");
    }

    #[test]
    fn a_circuit_open_on_one_replica_is_open_for_all_probed_by_the_first_by_id() {
        let v = of(&[
            replica("c", target(true, T0 + 1_000, Some(T0 + 31_500), 1)),
            replica("a", target(false, T0, None, 0)),
            replica("b", target(false, T0, None, 0)),
        ]);
        assert_eq!(v.targets.len(), 1, "one circuit, though on two routes");
        let t = &v.targets[0];
        assert_eq!(t.circuit, FleetCircuit::Open);
        assert_eq!(t.since, format_ms(T0 + 1_000));
        assert_eq!(t.until.as_deref(), Some(format_ms(T0 + 31_000).as_str()));
        assert_eq!(t.prober.as_deref(), Some("a"));
        assert_eq!(t.model.as_deref(), Some("gpt-x"));
    }

    #[test]
    fn replicas_that_adopted_the_open_circuit_do_not_change_the_view() {
        let opener = replica("c", target(true, T0 + 1_000, Some(T0 + 31_500), 1));
        let before = of(&[opener.clone(), replica("a", target(false, T0, None, 0))]);
        let adopted = of(&[
            opener,
            // Adopted later: open since its adoption, its own end.
            replica("a", target(true, T0 + 3_000, Some(T0 + 31_503), 1)),
        ]);
        assert_eq!(before, adopted);
    }

    #[test]
    fn the_openers_next_probe_does_not_rewrite_the_view() {
        let told = of(&[replica("a", target(true, T0, Some(T0 + 3_000), 1))]);
        // The opener probed and failed: its end moved on.
        let now = after(
            &[replica("a", target(true, T0, Some(T0 + 5_000), 1))],
            Some(&told),
        );
        assert_eq!(now, told);
        // A new opening (after a close) is told with its own end.
        let reopened = after(
            &[replica("a", target(true, T0 + 9_000, Some(T0 + 12_000), 2))],
            Some(&told),
        );
        assert_eq!(reopened.targets[0].until, Some(format_ms(T0 + 12_000)));
    }

    #[test]
    fn the_first_success_closes_it_for_those_still_open_then_the_view_empties() {
        let v = of(&[
            replica("a", target(false, T0 + 40_000, None, 1)),
            replica("b", target(true, T0 + 3_000, None, 1)),
            replica("c", target(true, T0 + 1_000, None, 1)),
        ]);
        let t = &v.targets[0];
        assert_eq!(
            (t.circuit, t.since.clone(), t.prober.clone()),
            (FleetCircuit::Closed, format_ms(T0 + 40_000), None)
        );
        let settled = of(&[
            replica("a", target(false, T0 + 40_000, None, 1)),
            replica("b", target(false, T0 + 42_000, None, 1)),
            replica("c", target(false, T0 + 42_001, None, 1)),
        ]);
        assert!(settled.is_empty(), "{settled:?}");
    }

    #[test]
    fn an_opening_after_the_last_close_wins_and_a_fresh_replica_is_no_close() {
        let v = of(&[
            replica("a", target(false, T0 + 40_000, None, 1)),
            replica("b", target(true, T0 + 50_000, Some(T0 + 60_000), 2)),
            // Started after the opening: closed since its start, never opened.
            replica("c", target(false, T0 + 55_000, None, 0)),
        ]);
        let t = &v.targets[0];
        assert_eq!(t.circuit, FleetCircuit::Open);
        assert_eq!(t.since, format_ms(T0 + 50_000));
    }

    fn keyed(instance: &str, keys: Vec<KeyStats>) -> StatsReport {
        StatsReport {
            instance_id: instance.into(),
            credentials: vec![CredentialStats {
                credential: id("pool"),
                keys,
            }],
            ..StatsReport::default()
        }
    }

    fn key(name: &str, state: KeyState, until: Option<u64>) -> KeyStats {
        KeyStats {
            name: name.into(),
            state,
            until: until.map(format_ms),
            ..KeyStats::default()
        }
    }

    #[test]
    fn a_key_set_aside_anywhere_is_set_aside_until_the_latest_end_to_the_second() {
        let v = of(&[
            keyed(
                "a",
                vec![
                    key("k1", KeyState::Active, None),
                    key("k2", KeyState::Rejected, Some(T0 + 300_400)),
                    key("k3", KeyState::Parked, Some(T0 + 20_900)),
                ],
            ),
            keyed(
                "b",
                vec![
                    key("k2", KeyState::Rejected, Some(T0 + 299_000)),
                    // Ended already at the round's time.
                    key("k1", KeyState::Parked, Some(T0 + 9_000)),
                ],
            ),
        ]);
        assert_eq!(
            v.keys,
            vec![
                KeyView {
                    credential: id("pool"),
                    name: "k2".into(),
                    parked_until: None,
                    rejected_until: Some(format_ms(T0 + 300_000)),
                },
                KeyView {
                    credential: id("pool"),
                    name: "k3".into(),
                    parked_until: Some(format_ms(T0 + 20_000)),
                    rejected_until: None,
                },
            ]
        );
        let json = serde_json::to_string(&v).unwrap();
        assert!(!json.contains("sk-"), "names only: {json}");
    }

    #[test]
    fn written_on_change_refreshed_at_half_its_life_and_never_empty_at_start() {
        let empty = FleetView::default();
        let open = of(&[replica("a", target(true, T0, None, 1))]);
        assert!(!due(None, &empty, T0, 20_000));
        assert!(due(None, &open, T0, 20_000));
        let w = Written {
            content: open.clone(),
            at_ms: T0,
        };
        assert!(!due(Some(&w), &open, T0 + 9_999, 20_000));
        assert!(due(Some(&w), &open, T0 + 10_000, 20_000));
        assert!(
            due(Some(&w), &empty, T0 + 1, 20_000),
            "emptied: told at once"
        );
        let e = Written {
            content: empty.clone(),
            at_ms: T0,
        };
        assert!(!due(Some(&e), &empty, T0 + 60_000, 20_000));
        let s = stamped(&open, T0, 20_000);
        assert_eq!(s.expires_at, format_ms(T0 + 20_000));
        assert_eq!(s.targets, open.targets);
    }
}
