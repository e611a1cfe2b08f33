//! Applying the fleet's health view (issue 32 item 5,
//! `docs/request-lifecycle.md#one-view-across-replicas`): what the operator found in
//! every replica's stats, laid over this replica's own state through the interface
//! `config::target` offers (adopt a circuit's opening or close, leave probes to
//! another replica, set a key aside).
//!
//! A view is applied only while it holds (`expiresAt`, on this replica's clock): an
//! expired one, or none, hands every probe back to this replica (delegation lapses),
//! and what was adopted ends as it would have here (an open circuit is probed here
//! again, a key's park or rejection runs out). A transition is adopted only when it is
//! later than this replica's own last one, so a view that says the same thing again
//! (it is applied on every change and every second) changes nothing, and a replica
//! that opened or closed since goes by what it found until the fleet catches up.

use std::collections::HashMap;
use std::time::Duration;

use switchback_crds::config::ObjectId;
use switchback_crds::fleet::{FleetCircuit, FleetView, TargetView, VIEW_VERSION, parse_ms};
use tokio::time::Instant;

use crate::gateway::Gateway;
use crate::limits::circuit::{State, Transition};

/// The shortest open time adopted: the prober of a circuit whose end has passed
/// probes it this long after it hears of it.
const MIN_OPEN: Duration = Duration::from_secs(1);

/// The view's ends are rounded down to the second (`operator/src/fleet.rs`): a
/// rejection may have begun up to this much later than its end says.
const ENDS_ROUNDED_MS: u64 = 1_000;

/// What one application of the view did, for logs and tests.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// The view holds (is not expired and reads).
    pub holds: bool,
    pub opened: usize,
    pub closed: usize,
    /// Targets whose probes are left to another replica now.
    pub delegated: usize,
    pub keys: usize,
}

/// Lays `view` over the gateway's state at `now`: see the module header.
pub fn apply(gw: &Gateway, view: Option<&FleetView>, now: Instant) -> Applied {
    let clock = gw.clock();
    let wall_ms = clock.unix(now).as_millis() as u64;
    let view = view.filter(|v| {
        v.version == VIEW_VERSION && parse_ms(&v.expires_at).is_some_and(|e| e > wall_ms)
    });
    let mut applied = Applied {
        holds: view.is_some(),
        ..Applied::default()
    };
    gw.health
        .view_holds
        .store(applied.holds, std::sync::atomic::Ordering::Relaxed);
    let targets: HashMap<(&ObjectId, Option<&str>), &TargetView> = view
        .iter()
        .flat_map(|v| &v.targets)
        .map(|t| ((&t.credential, t.model.as_deref()), t))
        .collect();
    let snapshot = gw.snapshot();
    let mut seen = std::collections::HashSet::new();
    for t in snapshot.route_list.iter().flat_map(|r| &r.targets) {
        if !seen.insert(std::sync::Arc::as_ptr(&t.state)) {
            continue;
        }
        let told = targets.get(&(&t.spec.credential, t.spec.model.as_deref()));
        let delegated = told.is_some_and(|v| {
            v.circuit == FleetCircuit::Open
                && v.prober.as_deref().is_some_and(|p| p != gw.instance_id)
        });
        if t.state.probes.delegated() && !delegated {
            // Handed back: the schedule may have put this target aside for good.
            gw.health.wake();
        }
        t.state.probes.set_delegated(delegated);
        applied.delegated += usize::from(delegated);
        if let Some(v) = told {
            match adopt(&t.state.breaker, v, now, wall_ms) {
                Transition::Opened => {
                    applied.opened += 1;
                    gw.health.wake();
                }
                Transition::Closed => applied.closed += 1,
                _ => {}
            }
        }
    }
    if let Some(view) = view {
        applied.keys = adopt_keys(gw, view, wall_ms);
    }
    applied
}

/// Adopts the fleet's latest transition of one circuit when it is later than this
/// replica's own.
fn adopt(
    breaker: &crate::limits::circuit::Breaker,
    v: &TargetView,
    now: Instant,
    wall_ms: u64,
) -> Transition {
    let Some(since) = parse_ms(&v.since) else {
        return Transition::None;
    };
    let (state, mine) = breaker.state();
    let mine = mine
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    if mine >= since {
        return Transition::None;
    }
    match (v.circuit, state) {
        (FleetCircuit::Open, State::Closed { .. }) => {
            let until = v.until.as_deref().and_then(parse_ms).unwrap_or(0);
            let open_for = Duration::from_millis(until.saturating_sub(wall_ms)).max(MIN_OPEN);
            breaker.adopt_open(now, open_for)
        }
        (FleetCircuit::Closed, State::Open { .. } | State::HalfOpen { .. }) => {
            breaker.adopt_closed(now)
        }
        _ => Transition::None,
    }
}

/// Sets aside each key the view names until its end (the later end wins); how many
/// keys it named that this replica holds.
fn adopt_keys(gw: &Gateway, view: &FleetView, wall_ms: u64) -> usize {
    let snapshot = gw.snapshot();
    let now_ms = gw.now_ms();
    // The end on this replica's clock: as far from now as it is on the wall.
    let here = |until: &Option<String>| {
        let until = until.as_deref().and_then(parse_ms)?;
        (until > wall_ms).then(|| now_ms + (until - wall_ms))
    };
    let mut n = 0;
    for k in &view.keys {
        let Some(credential) = snapshot.credentials.get(&k.credential) else {
            continue;
        };
        let Some(key) = credential.keys.iter().find(|key| *key.name == *k.name) else {
            continue;
        };
        if let Some(until) = here(&k.parked_until) {
            key.state.park_until(until);
        }
        // A rejection that began before this replica loaded the key's value was about
        // an older value (the key was rotated since): a new value starts afresh.
        let began = k
            .rejected_until
            .as_deref()
            .and_then(parse_ms)
            .map(|u| u.saturating_sub(credential.spec.key_rejected_for_ms));
        if let Some(until) = here(&k.rejected_until)
            && began.is_some_and(|b| b + ENDS_ROUNDED_MS >= key.state.loaded_at_ms)
        {
            key.state.reject_until(until);
        }
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use switchback_crds::fleet::{KeyView, format_ms};
    use switchback_crds::stats::KeyState as Shown;

    use super::*;
    use crate::limits::circuit::Reported;

    const MANIFEST: &str = "---
apiVersion: switchback.dev/v1alpha1
kind: ProviderCredential
metadata: { name: primary, namespace: team-a }
spec:
  provider: openai-compatible
  baseURL: http://127.0.0.1:9
  secretRef: { name: keys, keys: [k1, k2] }
  allowPrivateNetwork: true
---
apiVersion: switchback.dev/v1alpha1
kind: ProviderCredential
metadata: { name: backup, namespace: team-a }
spec:
  provider: openai-compatible
  baseURL: http://127.0.0.1:9
  secretRef: { name: keys, key: k1 }
  allowPrivateNetwork: true
---
apiVersion: v1
kind: Secret
metadata: { name: keys, namespace: team-a }
stringData: { k1: sk-one, k2: sk-two }
---
apiVersion: switchback.dev/v1alpha1
kind: LLMRoute
metadata: { name: smart, namespace: team-a }
spec:
  models: [smart]
  circuitBreaker: { consecutiveFailures: 1, openFor: 30s, probeInterval: 5s }
  targets:
    - credentialRef: { name: primary }
      model: gpt-x
    - credentialRef: { name: backup }
";

    fn gateway() -> Arc<Gateway> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.yaml");
        std::fs::write(&path, MANIFEST).unwrap();
        let gw = Arc::new(Gateway::new(1024, "test".into(), 1).unwrap());
        crate::sources::standalone::load_once(&gw, &path).expect("the manifest loads");
        gw
    }

    fn id(name: &str) -> ObjectId {
        ObjectId::new("team-a", name)
    }

    /// The wall-clock milliseconds of `now` on `gw`'s clock.
    fn wall(gw: &Gateway, now: Instant) -> u64 {
        gw.clock().unix(now).as_millis() as u64
    }

    fn view(gw: &Gateway, now: Instant, targets: Vec<TargetView>, keys: Vec<KeyView>) -> FleetView {
        FleetView {
            version: VIEW_VERSION,
            expires_at: format_ms(wall(gw, now) + 20_000),
            targets,
            keys,
        }
    }

    fn open_since(since: u64, until: u64, prober: &str) -> TargetView {
        TargetView {
            credential: id("primary"),
            model: Some("gpt-x".into()),
            circuit: FleetCircuit::Open,
            since: format_ms(since),
            until: Some(format_ms(until)),
            prober: Some(prober.into()),
        }
    }

    /// A view saying the primary opened elsewhere at `now`, due to be probed `for_ms`
    /// later by another replica.
    fn opened_elsewhere(gw: &Gateway, now: Instant, for_ms: u64) -> FleetView {
        let at = wall(gw, now);
        view(
            gw,
            now,
            vec![open_since(at, at + for_ms, "another")],
            vec![],
        )
    }

    fn primary(gw: &Gateway) -> Arc<crate::config::target::TargetState> {
        gw.snapshot().route_list[0].targets[0].state.clone()
    }

    #[tokio::test(start_paused = true)]
    async fn an_opening_elsewhere_opens_here_and_the_named_prober_alone_probes() {
        let gw = gateway();
        tokio::time::advance(Duration::from_secs(5)).await;
        let later = Instant::now();
        let t = primary(&gw);
        let v = opened_elsewhere(&gw, later, 10_000);
        let applied = apply(&gw, Some(&v), later);
        assert_eq!(
            (applied.holds, applied.opened, applied.delegated),
            (true, 1, 1)
        );
        assert_eq!(t.breaker.reported(later), Reported::Open);
        assert!(t.probes.delegated(), "another replica probes it");
        assert_eq!(
            t.breaker.next_probe(),
            Some(later + Duration::from_secs(10))
        );
        // The backup was not named: untouched, probed here as ever.
        let backup = gw.snapshot().route_list[0].targets[1].state.clone();
        assert_eq!(backup.breaker.reported(later), Reported::Closed);
        assert!(!backup.probes.delegated());
        // Applied again: nothing changes.
        assert_eq!(apply(&gw, Some(&v), later).opened, 0);
        // Named as the prober itself: it probes.
        let mine = view(
            &gw,
            later,
            vec![open_since(wall(&gw, later), 0, &gw.instance_id)],
            vec![],
        );
        assert_eq!(apply(&gw, Some(&mine), later).delegated, 0);
        assert!(!t.probes.delegated());
    }

    /// Now on the wall clock the breaker stamps its transitions with, a moment after
    /// the last one.
    fn after_a_moment() -> u64 {
        std::thread::sleep(Duration::from_millis(3));
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        std::thread::sleep(Duration::from_millis(3));
        ms
    }

    #[tokio::test(start_paused = true)]
    async fn a_close_elsewhere_closes_here_but_not_an_opening_here_after_it() {
        let gw = gateway();
        let t = primary(&gw);
        let now = Instant::now();
        t.breaker.adopt_open(now, Duration::from_secs(30));
        // A success elsewhere, after this replica's opening.
        let close = TargetView {
            circuit: FleetCircuit::Closed,
            since: format_ms(after_a_moment()),
            until: None,
            prober: None,
            ..open_since(0, 0, "x")
        };
        let v = view(&gw, now, vec![close], vec![]);
        let applied = apply(&gw, Some(&v), now);
        assert_eq!((applied.closed, applied.delegated), (1, 0));
        assert_eq!(t.breaker.reported(now), Reported::Closed);
        // This replica opens again after that close: the same view does not close it.
        t.breaker.adopt_open(now, Duration::from_secs(30));
        assert_eq!(apply(&gw, Some(&v), now).closed, 0);
        assert_eq!(t.breaker.reported(now), Reported::Open);
        // Nor does an older opening open a circuit closed since.
        t.breaker.adopt_closed(now);
        let old = view(&gw, now, vec![open_since(1_000, 2_000, "x")], vec![]);
        assert_eq!(apply(&gw, Some(&old), now).opened, 0);
        assert_eq!(t.breaker.reported(now), Reported::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn keys_are_set_aside_by_name_until_the_fleets_end() {
        let gw = gateway();
        // The rejection below began a moment after this replica loaded the keys.
        tokio::time::advance(Duration::from_secs(1)).await;
        let now = Instant::now();
        let w = wall(&gw, now);
        let keys = vec![
            KeyView {
                credential: id("primary"),
                name: "k2".into(),
                parked_until: None,
                rejected_until: Some(format_ms(w + 300_000)),
            },
            // A key this replica does not hold, a credential it does not serve.
            KeyView {
                credential: id("primary"),
                name: "k9".into(),
                parked_until: Some(format_ms(w + 5_000)),
                rejected_until: None,
            },
            KeyView {
                credential: id("elsewhere"),
                name: "k1".into(),
                parked_until: Some(format_ms(w + 5_000)),
                rejected_until: None,
            },
        ];
        let applied = apply(&gw, Some(&view(&gw, now, vec![], keys)), now);
        assert_eq!(applied.keys, 1);
        let snapshot = gw.snapshot();
        let pool = &snapshot.credentials[&id("primary")].keys;
        let now_ms = gw.now_ms();
        assert_eq!(pool.get(0).state.shown(now_ms), (Shown::Active, None));
        assert_eq!(
            pool.get(1).state.shown(now_ms),
            (Shown::Rejected, Some(now_ms + 300_000))
        );
        assert_eq!(pool.pick(now_ms), Some(0), "requests take k1 alone");
        // A rejection that began before k1's value was loaded here (5 minutes before
        // its end, keyRejectedFor's default) was about an older value: not adopted.
        let loaded = pool.get(0).state.loaded_at_ms;
        let stale = vec![KeyView {
            credential: id("primary"),
            name: "k1".into(),
            parked_until: None,
            rejected_until: Some(format_ms(loaded + 300_000 - 2_001)),
        }];
        assert_eq!(
            apply(&gw, Some(&view(&gw, now, vec![], stale)), now).keys,
            1
        );
        assert_eq!(pool.get(0).state.shown(now_ms), (Shown::Active, None));
        tokio::time::advance(Duration::from_secs(301)).await;
        assert!(pool.get(1).state.usable(gw.now_ms()), "the end ends it");
    }

    #[tokio::test(start_paused = true)]
    async fn an_expired_view_hands_the_probes_back_and_the_circuit_is_probed_here() {
        let gw = gateway();
        tokio::time::advance(Duration::from_secs(1)).await;
        let now = Instant::now();
        let t = primary(&gw);
        let v = opened_elsewhere(&gw, now, 2_000);
        assert_eq!(apply(&gw, Some(&v), now).opened, 1);
        assert!(t.probes.delegated());
        let metrics = crate::admin::metrics::render(&crate::admin::metrics::registry(gw.clone()));
        assert!(
            metrics.contains("switchback_fleet_view_holds 1"),
            "{metrics}"
        );
        assert!(
            metrics.contains("switchback_probes_delegated 1"),
            "{metrics}"
        );
        // The opening woke the schedule; take that wake-up.
        let woken = || tokio::time::timeout(Duration::ZERO, gw.health.wake.notified());
        assert!(woken().await.is_ok());
        // The operator is gone: nobody refreshes the view; 20 s later it is void.
        tokio::time::advance(Duration::from_secs(20)).await;
        let later = Instant::now();
        let applied = apply(&gw, Some(&v), later);
        assert_eq!(
            applied,
            Applied {
                holds: false,
                ..Applied::default()
            }
        );
        assert!(!t.probes.delegated(), "this replica probes again");
        let metrics = crate::admin::metrics::render(&crate::admin::metrics::registry(gw.clone()));
        assert!(
            metrics.contains("switchback_fleet_view_holds 0"),
            "{metrics}"
        );
        assert!(
            metrics.contains("switchback_probes_delegated 0"),
            "{metrics}"
        );
        assert!(woken().await.is_ok(), "the schedule looks at it again");
        assert!(t.breaker.begin_probe(later), "its own probe is due");
        // No view at all: the same.
        t.probes.set_delegated(true);
        assert!(!apply(&gw, None, later).holds);
        assert!(!t.probes.delegated());
    }
}
