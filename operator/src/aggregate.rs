//! Aggregation of the proxies' `/admin/v1/stats` into per-route facts, a pure state
//! machine fed one scrape round at a time (docs/observability.md#stats).
//!
//! - Counters are cumulative per proxy *instance* (a process start). Each round adds
//!   the per-instance delta since the previous round, so a restart (new instance id,
//!   counters from zero) never makes totals go backwards; a counter that shrinks
//!   within one instance is read as a reset. An instance that started before this
//!   operator did gives its first reading as a baseline only: an earlier operator may
//!   have counted it already (totals continue from `status.totals`).
//! - The rolling window sums the deltas of the last `window`, in 10-second buckets.
//! - Circuit state per target: `Open` when open on any replica (with how many),
//!   `HalfOpen` when half-open on any and open on none; the last failure is the most
//!   recent one across replicas. Transitions between rounds are reported for Events.
//! - What a request finds at each target now (docs/troubleshooting.md#target-states): the
//!   state that keeps requests away the most among the replicas, with how many see it, the
//!   earliest `since` and the latest `until` they report; and per target, the window's
//!   requests, answers, failures and fallbacks by reason, in the same buckets as the
//!   route's counters. Whether any replica probes it, and the most recent probe
//!   (docs/request-lifecycle.md#probed-circuits).
//! - Each credential's keys (docs/request-lifecycle.md#key-pools): per key, the state that
//!   keeps requests away the most among the replicas (Rejected, Parked, Active), how many
//!   see it and the latest `until`.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use switchback_crds::config::ObjectId;
use switchback_crds::cost::Usd;
use switchback_crds::revision::Revision;
use switchback_crds::stats::{
    CircuitState, KeyState, LastFailure, ProbeRecord, RouteStats, StatsReport, TargetState,
    TargetStats,
};

use crate::usage::{Counted, Reading};

const BUCKET_MS: u64 = 10_000;
/// Instances not seen for this long are forgotten.
const FORGET_INSTANCE_MS: u64 = 15 * 60 * 1000;

/// One replica's answer in a scrape round.
#[derive(Clone, Debug)]
pub struct Scrape {
    /// The admin base URL scraped.
    pub endpoint: String,
    pub result: Result<StatsReport, String>,
}

/// Request counters of a route.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub requests: u64,
    pub attempts: u64,
    pub fallbacks: u64,
    pub failed: u64,
    /// Streams resumed on another target after their commit.
    pub resumed: u64,
    /// What the answers cost, and what of it was beyond the first target's price
    /// (exact: see `switchback_crds::cost`).
    pub cost: Usd,
    pub fallback_extra: Usd,
}

impl Counters {
    fn of(r: &switchback_crds::stats::RouteStats) -> Self {
        Self {
            requests: r.requests,
            attempts: r.attempts,
            fallbacks: r.fallbacks,
            failed: r.failed,
            resumed: r.resumed,
            cost: r.cost_usd,
            fallback_extra: r.fallback_extra_usd,
        }
    }

    fn add(&mut self, o: &Counters) {
        self.requests += o.requests;
        self.attempts += o.attempts;
        self.fallbacks += o.fallbacks;
        self.failed += o.failed;
        self.resumed += o.resumed;
        self.cost = self.cost.saturating_add(o.cost);
        self.fallback_extra = self.fallback_extra.saturating_add(o.fallback_extra);
    }

    /// `self - earlier`, or `self` when any counter went down (a reset).
    fn since(&self, earlier: &Counters) -> Counters {
        if self.requests < earlier.requests
            || self.attempts < earlier.attempts
            || self.fallbacks < earlier.fallbacks
            || self.failed < earlier.failed
            || self.resumed < earlier.resumed
            || self.cost < earlier.cost
            || self.fallback_extra < earlier.fallback_extra
        {
            return *self;
        }
        Counters {
            requests: self.requests - earlier.requests,
            attempts: self.attempts - earlier.attempts,
            fallbacks: self.fallbacks - earlier.fallbacks,
            failed: self.failed - earlier.failed,
            resumed: self.resumed - earlier.resumed,
            cost: self.cost.saturating_sub(earlier.cost),
            fallback_extra: self.fallback_extra.saturating_sub(earlier.fallback_extra),
        }
    }
}

/// One target, aggregated over replicas.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TargetView {
    pub credential: ObjectId,
    pub model: Option<String>,
    pub circuit: CircuitState,
    pub open_replicas: u32,
    pub last_failure: Option<LastFailure>,
    /// The state that keeps requests away the most among the replicas that report one
    /// (`None`: no replica reports states, an older proxy).
    pub state: Option<TargetState>,
    /// Replicas that see `state`.
    pub state_replicas: u32,
    /// RFC 3339: the earliest `since` of those replicas, the latest `until`.
    pub since: Option<String>,
    pub until: Option<String>,
    /// Counters over the rolling window.
    pub window: TargetCounts,
    /// Some replica probes it in the background now.
    pub probing: bool,
    /// The most recent probe any replica reports.
    pub last_probe: Option<ProbeRecord>,
}

/// One key of a credential, over the replicas that report it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyView {
    pub name: String,
    /// The state that keeps requests away the most among them.
    pub state: KeyState,
    /// Replicas that see `state`.
    pub replicas: u32,
    /// RFC 3339: the latest end those replicas report.
    pub until: Option<String>,
}

/// Cumulative or windowed counters of one target.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TargetCounts {
    /// Requests that reached it (tried or skipped).
    pub requests: u64,
    /// Requests it answered.
    pub successes: u64,
    /// Failed attempts and skips, by reason.
    pub failures: BTreeMap<String, u64>,
    /// Requests that moved on from it, by the reason they left.
    pub fallbacks: BTreeMap<String, u64>,
}

impl TargetCounts {
    fn of(t: &TargetStats) -> Self {
        Self {
            requests: t.requests,
            successes: t.successes,
            failures: t.failures.clone(),
            fallbacks: t.fallbacks_away_by_reason.clone(),
        }
    }

    fn add(&mut self, o: &TargetCounts) {
        self.requests += o.requests;
        self.successes += o.successes;
        for (reason, n) in &o.failures {
            *self.failures.entry(reason.clone()).or_default() += n;
        }
        for (reason, n) in &o.fallbacks {
            *self.fallbacks.entry(reason.clone()).or_default() += n;
        }
    }

    /// `self - earlier`, or `self` when a counter went down (a reset).
    fn since(&self, earlier: &TargetCounts) -> TargetCounts {
        let shrank = |now: &BTreeMap<String, u64>, then: &BTreeMap<String, u64>| {
            then.iter()
                .any(|(k, v)| now.get(k).copied().unwrap_or(0) < *v)
        };
        if self.requests < earlier.requests
            || self.successes < earlier.successes
            || shrank(&self.failures, &earlier.failures)
            || shrank(&self.fallbacks, &earlier.fallbacks)
        {
            return self.clone();
        }
        let minus = |now: &BTreeMap<String, u64>, then: &BTreeMap<String, u64>| {
            now.iter()
                .map(|(k, v)| (k.clone(), v - then.get(k).copied().unwrap_or(0)))
                .filter(|(_, v)| *v > 0)
                .collect()
        };
        TargetCounts {
            requests: self.requests - earlier.requests,
            successes: self.successes - earlier.successes,
            failures: minus(&self.failures, &earlier.failures),
            fallbacks: minus(&self.fallbacks, &earlier.fallbacks),
        }
    }

    fn is_zero(&self) -> bool {
        self.requests == 0
            && self.successes == 0
            && self.failures.is_empty()
            && self.fallbacks.is_empty()
    }
}

/// A target of a route, across replicas and rounds: its credential and model.
type TargetKey = (ObjectId, Option<String>);

/// One route, aggregated over replicas.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouteView {
    /// Generation served, per replica that serves the route.
    pub generations: BTreeMap<String, i64>,
    /// Revision served (route, credentials, keys), per replica that reports one.
    pub revisions: BTreeMap<String, Revision>,
    pub targets: Vec<TargetView>,
    /// Indexes of `targets` in the order a request takes them now, as the replica
    /// serving the highest generation reports it (empty from older proxies).
    pub order: Vec<usize>,
    /// Counters over the rolling window.
    pub window: Counters,
    /// Counters counted since this operator started.
    pub totals: Counters,
}

/// A replica as seen in the last round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replica {
    pub endpoint: String,
    /// Why it could not be scraped.
    pub error: Option<String>,
    /// The last config it refused, if any.
    pub config_error: Option<String>,
}

/// A circuit that opened or closed between two rounds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    pub route: ObjectId,
    pub credential: ObjectId,
    pub model: Option<String>,
    pub from: CircuitState,
    pub to: CircuitState,
    pub open_replicas: u32,
}

/// One LLMClient, aggregated over replicas.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientView {
    /// Usage and throttles counted since this operator started, per period.
    pub counted: Counted,
    /// Requests let through over the rolling window.
    pub window_requests: u64,
    /// The latest request any replica saw (ms since the epoch).
    pub last_request_ms: Option<u64>,
}

/// The outcome of the latest round.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Every ready replica of the round, scraped or not (not the draining ones: their
    /// counts are taken, but they share no limit and serve no new generation).
    pub replicas: Vec<Replica>,
    /// Replicas read this round that are shutting down.
    pub draining: usize,
    /// The scrape round's id (see `scrape::scrape`), set by the scrape loop.
    pub round: u64,
    pub routes: BTreeMap<ObjectId, RouteView>,
    /// Clients any replica reported, or counted since this operator started.
    pub clients: BTreeMap<ObjectId, ClientView>,
    pub window_seconds: u64,
    /// Each credential's keys, as the ready replicas of this round report them.
    pub credentials: BTreeMap<ObjectId, Vec<KeyView>>,
}

#[derive(Debug)]
struct Instance {
    last_seen_ms: u64,
    counters: HashMap<ObjectId, Counters>,
    targets: HashMap<(ObjectId, TargetKey), TargetCounts>,
    clients: HashMap<ObjectId, Reading>,
}

#[derive(Debug, Default)]
struct ClientAcc {
    counted: Counted,
    /// (bucket start, requests), oldest first.
    buckets: VecDeque<(u64, u64)>,
    last_request_ms: Option<u64>,
}

#[derive(Debug, Default)]
struct RouteAcc {
    totals: Counters,
    /// (bucket start, deltas), oldest first.
    buckets: VecDeque<(u64, Counters)>,
    /// (bucket start, deltas per target), oldest first.
    target_buckets: VecDeque<(u64, BTreeMap<TargetKey, TargetCounts>)>,
}

/// The aggregation state, kept across rounds.
#[derive(Debug)]
pub struct Aggregator {
    window_ms: u64,
    /// When this operator started (ms since the Unix epoch).
    started_ms: u64,
    instances: HashMap<String, Instance>,
    routes: HashMap<ObjectId, RouteAcc>,
    clients: HashMap<ObjectId, ClientAcc>,
    last: Snapshot,
}

impl Aggregator {
    pub fn new(window_ms: u64, started_ms: u64) -> Self {
        Self {
            window_ms: window_ms.max(BUCKET_MS),
            started_ms,
            instances: HashMap::new(),
            routes: HashMap::new(),
            clients: HashMap::new(),
            last: Snapshot::default(),
        }
    }

    /// The latest snapshot.
    pub fn snapshot(&self) -> &Snapshot {
        &self.last
    }

    /// Forgets routes that `exists` says are gone (deleted objects) and no replica
    /// served in the last round, so a long-running operator does not carry every route
    /// it ever saw. A route that still exists keeps its totals even when nothing serves
    /// it: its status adds them to the seed it started from, so dropping them would
    /// make `status.totals` go backwards. Per-instance readings are left alone: they go
    /// with their instance, and a route recreated under the same name must not count a
    /// proxy's earlier cumulative counters as new traffic.
    pub fn retain_routes(&mut self, exists: impl Fn(&ObjectId) -> bool) {
        // A view has generations iff a replica served the route in the last round.
        self.last
            .routes
            .retain(|id, view| exists(id) || !view.generations.is_empty());
        // Every accumulated route has a view (`observe` builds one per route), so the
        // views left say which accumulators stay.
        self.routes
            .retain(|id, _| self.last.routes.contains_key(id));
    }

    /// Forgets clients that `exists` says are gone (deleted objects): a client
    /// recreated under the same name starts from zero, as its status does.
    pub fn retain_clients(&mut self, exists: impl Fn(&ObjectId) -> bool) {
        self.clients.retain(|id, _| exists(id));
        self.last.clients.retain(|id, _| exists(id));
    }

    /// Takes one scrape round (every ready replica) at `now_ms`, returning the circuit
    /// transitions since the previous round. In steps: each replica's report becomes
    /// deltas against that instance's previous reading (`take`), buckets older than the
    /// window go (`expire`), and the views are built from what is left.
    pub fn observe(&mut self, now_ms: u64, scrapes: &[Scrape]) -> Vec<Transition> {
        let bucket = now_ms - now_ms % BUCKET_MS;
        let mut replicas = Vec::new();
        let mut draining = 0;
        let mut per_route: BTreeMap<ObjectId, Vec<(&str, &RouteStats)>> = BTreeMap::new();
        let mut credentials = Credentials::default();
        for scrape in scrapes {
            let report = match &scrape.result {
                Ok(report) => report,
                Err(e) => {
                    replicas.push(Replica {
                        endpoint: scrape.endpoint.clone(),
                        error: Some(e.clone()),
                        config_error: None,
                    });
                    continue;
                }
            };
            self.take(now_ms, bucket, report);
            if report.draining {
                // Its counts matter until it exits (docs/tenancy.md#drains); nothing else does.
                draining += 1;
                continue;
            }
            replicas.push(Replica {
                endpoint: scrape.endpoint.clone(),
                error: None,
                config_error: report.config_error.clone(),
            });
            for route in &report.routes {
                per_route
                    .entry(route.route.clone())
                    .or_default()
                    .push((scrape.endpoint.as_str(), route));
            }
            credentials.add(report);
        }
        self.instances
            .retain(|_, i| now_ms.saturating_sub(i.last_seen_ms) < FORGET_INSTANCE_MS);
        self.expire(now_ms.saturating_sub(self.window_ms));

        let clients = self
            .clients
            .iter()
            .map(|(id, acc)| {
                let view = ClientView {
                    counted: acc.counted.clone(),
                    window_requests: acc.buckets.iter().map(|(_, n)| n).sum(),
                    last_request_ms: acc.last_request_ms,
                };
                (id.clone(), view)
            })
            .collect();
        let ids: BTreeSet<&ObjectId> = per_route.keys().chain(self.routes.keys()).collect();
        let routes = ids
            .into_iter()
            .map(|id| {
                let reports = per_route.get(id).map(Vec::as_slice).unwrap_or_default();
                (id.clone(), self.route_view(id, reports))
            })
            .collect();
        let next = Snapshot {
            replicas,
            draining,
            round: 0,
            routes,
            clients,
            window_seconds: self.window_ms / 1000,
            credentials: credentials.views(),
        };
        let transitions = transitions(&self.last, &next);
        self.last = next;
        transitions
    }

    /// One replica's report: the deltas since that instance's previous reading, added
    /// to the clients' and routes' accumulators. An instance first seen that started
    /// before this operator only sets the baseline: its counters were counted before.
    fn take(&mut self, now_ms: u64, bucket: u64, report: &StatsReport) {
        let baseline_only = !self.instances.contains_key(&report.instance_id)
            && started_ms(&report.started_at).is_none_or(|s| s < self.started_ms);
        let instance = self
            .instances
            .entry(report.instance_id.clone())
            .or_insert_with(|| Instance {
                last_seen_ms: now_ms,
                counters: HashMap::new(),
                targets: HashMap::new(),
                clients: HashMap::new(),
            });
        instance.last_seen_ms = now_ms;
        for client in &report.clients {
            let now = Reading::of(client);
            let before = instance
                .clients
                .insert(client.client.clone(), now)
                .unwrap_or_default();
            let acc = self.clients.entry(client.client.clone()).or_default();
            if let Some(at) = client.last_request_at.as_deref().and_then(started_ms) {
                acc.last_request_ms = acc.last_request_ms.max(Some(at));
            }
            let delta = now.since(&before);
            if baseline_only || delta == Reading::default() {
                continue;
            }
            acc.counted.add(now_ms, &delta);
            if delta.usage.requests > 0 {
                match acc.buckets.back_mut() {
                    Some((start, n)) if *start == bucket => *n += delta.usage.requests,
                    _ => acc.buckets.push_back((bucket, delta.usage.requests)),
                }
            }
        }
        for route in &report.routes {
            let now = Counters::of(route);
            let before = instance
                .counters
                .insert(route.route.clone(), now)
                .unwrap_or_default();
            let mut target_deltas = BTreeMap::new();
            for t in &route.targets {
                let key = (t.credential.clone(), t.model.clone());
                let now = TargetCounts::of(t);
                let before = instance
                    .targets
                    .insert((route.route.clone(), key.clone()), now.clone())
                    .unwrap_or_default();
                let delta = now.since(&before);
                if !delta.is_zero() {
                    target_deltas.insert(key, delta);
                }
            }
            let delta = now.since(&before);
            if baseline_only || (delta == Counters::default() && target_deltas.is_empty()) {
                continue;
            }
            let acc = self.routes.entry(route.route.clone()).or_default();
            acc.totals.add(&delta);
            match acc.buckets.back_mut() {
                Some((start, c)) if *start == bucket => c.add(&delta),
                _ => acc.buckets.push_back((bucket, delta)),
            }
            if !target_deltas.is_empty() {
                match acc.target_buckets.back_mut() {
                    Some((start, per)) if *start == bucket => {
                        for (key, d) in target_deltas {
                            per.entry(key).or_default().add(&d);
                        }
                    }
                    _ => acc.target_buckets.push_back((bucket, target_deltas)),
                }
            }
        }
    }

    /// Drops the buckets that ended before `oldest` (ms): the window slides.
    fn expire(&mut self, oldest: u64) {
        fn drop_old<T>(buckets: &mut VecDeque<(u64, T)>, oldest: u64) {
            while buckets
                .front()
                .is_some_and(|(start, _)| start + BUCKET_MS <= oldest)
            {
                buckets.pop_front();
            }
        }
        for acc in self.routes.values_mut() {
            drop_old(&mut acc.buckets, oldest);
            drop_old(&mut acc.target_buckets, oldest);
        }
        for acc in self.clients.values_mut() {
            drop_old(&mut acc.buckets, oldest);
        }
    }

    /// A route's view: its totals and window from the accumulator, and from this
    /// round's `reports` (endpoint, the route's stats there) the generations and
    /// revisions served, the targets over replicas with their window counts, and the
    /// order of the replica serving the newest generation.
    fn route_view(&self, id: &ObjectId, reports: &[(&str, &RouteStats)]) -> RouteView {
        let mut view = RouteView::default();
        let mut target_window: BTreeMap<TargetKey, TargetCounts> = BTreeMap::new();
        if let Some(acc) = self.routes.get(id) {
            view.totals = acc.totals;
            for (_, c) in &acc.buckets {
                view.window.add(c);
            }
            for (_, per) in &acc.target_buckets {
                for (key, d) in per {
                    target_window.entry(key.clone()).or_default().add(d);
                }
            }
        }
        if reports.is_empty() {
            return view;
        }
        for (endpoint, r) in reports {
            view.generations.insert(endpoint.to_string(), r.generation);
            if let Some(revision) = r.revision {
                view.revisions.insert(endpoint.to_string(), revision);
            }
        }
        view.targets = targets(reports);
        for t in &mut view.targets {
            if let Some(w) = target_window.remove(&(t.credential.clone(), t.model.clone())) {
                t.window = w;
            }
        }
        view.order = reports
            .iter()
            .max_by_key(|(_, r)| r.generation)
            .map(|(_, r)| {
                r.order
                    .iter()
                    .map(|&i| i as usize)
                    .filter(|&i| i < view.targets.len())
                    .collect()
            })
            .unwrap_or_default();
        view
    }
}

/// Targets of a route over replicas, in the order of the replica serving the highest
/// generation (declared order); others are matched by credential and model.
fn targets(reports: &[(&str, &RouteStats)]) -> Vec<TargetView> {
    let Some((_, lead)) = reports.iter().max_by_key(|(_, r)| r.generation) else {
        return Vec::new();
    };
    lead.targets
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let mut view = TargetView {
                credential: t.credential.clone(),
                model: t.model.clone(),
                circuit: CircuitState::Closed,
                open_replicas: 0,
                last_failure: None,
                state: None,
                state_replicas: 0,
                since: None,
                until: None,
                window: TargetCounts::default(),
                probing: false,
                last_probe: None,
            };
            let mut half_open = false;
            // (state, since, until) per replica that reports a state.
            let mut states: Vec<(TargetState, Option<&String>, Option<&String>)> = Vec::new();
            for (_, r) in reports {
                let same = |o: &&switchback_crds::stats::TargetStats| {
                    o.credential == t.credential && o.model == t.model
                };
                let Some(o) = r
                    .targets
                    .get(i)
                    .filter(same)
                    .or_else(|| r.targets.iter().find(same))
                else {
                    continue;
                };
                match o.circuit {
                    CircuitState::Open => view.open_replicas += 1,
                    CircuitState::HalfOpen => half_open = true,
                    CircuitState::Closed => {}
                }
                if let Some(state) = o.state {
                    states.push((state, o.state_since.as_ref(), o.state_until.as_ref()));
                }
                if let Some(f) = &o.last_failure {
                    let newer = view.last_failure.as_ref().is_none_or(|cur| {
                        started_ms(&f.at).unwrap_or(0) > started_ms(&cur.at).unwrap_or(0)
                    });
                    if newer {
                        view.last_failure = Some(f.clone());
                    }
                }
                view.probing |= o.probing;
                if let Some(p) = &o.last_probe {
                    let newer = view.last_probe.as_ref().is_none_or(|cur| {
                        started_ms(&p.at).unwrap_or(0) > started_ms(&cur.at).unwrap_or(0)
                    });
                    if newer {
                        view.last_probe = Some(p.clone());
                    }
                }
            }
            view.circuit = if view.open_replicas > 0 {
                CircuitState::Open
            } else if half_open {
                CircuitState::HalfOpen
            } else {
                CircuitState::Closed
            };
            if let Some(worst) = states
                .iter()
                .map(|(s, _, _)| *s)
                .max_by_key(|s| s.severity())
            {
                let seeing: Vec<_> = states.iter().filter(|(s, _, _)| *s == worst).collect();
                view.state = Some(worst);
                view.state_replicas = seeing.len() as u32;
                // RFC 3339 in UTC with one precision sorts as text; parse to be safe.
                let ms = |t: &&String| started_ms(t).unwrap_or(0);
                view.since = seeing
                    .iter()
                    .filter_map(|(_, s, _)| *s)
                    .min_by_key(ms)
                    .cloned();
                view.until = seeing
                    .iter()
                    .filter_map(|(_, _, u)| *u)
                    .max_by_key(ms)
                    .cloned();
            }
            view
        })
        .collect()
}

/// Each replica's state of one key, and until when.
type Seen = Vec<(KeyState, Option<String>)>;

/// The keys of every credential over one round's ready replicas.
#[derive(Default)]
struct Credentials {
    /// Per credential, per key in the order first reported: what each replica sees.
    keys: BTreeMap<ObjectId, Vec<(String, Seen)>>,
}

impl Credentials {
    fn add(&mut self, report: &StatsReport) {
        for c in &report.credentials {
            let keys = self.keys.entry(c.credential.clone()).or_default();
            for k in &c.keys {
                let at = match keys.iter().position(|(name, _)| *name == k.name) {
                    Some(at) => at,
                    None => {
                        keys.push((k.name.clone(), Vec::new()));
                        keys.len() - 1
                    }
                };
                keys[at].1.push((k.state, k.until.clone()));
            }
        }
    }

    fn views(self) -> BTreeMap<ObjectId, Vec<KeyView>> {
        self.keys
            .into_iter()
            .map(|(id, keys)| {
                let views = keys
                    .into_iter()
                    .map(|(name, seen)| {
                        let worst = seen
                            .iter()
                            .map(|(s, _)| *s)
                            .max_by_key(|s| s.severity())
                            .unwrap_or_default();
                        let seeing: Vec<_> = seen.iter().filter(|(s, _)| *s == worst).collect();
                        KeyView {
                            name,
                            state: worst,
                            replicas: seeing.len() as u32,
                            until: seeing
                                .iter()
                                .filter_map(|(_, u)| u.as_ref())
                                .max_by_key(|u| started_ms(u).unwrap_or(0))
                                .cloned(),
                        }
                    })
                    .collect();
                (id, views)
            })
            .collect()
    }
}

fn transitions(before: &Snapshot, after: &Snapshot) -> Vec<Transition> {
    let mut out = Vec::new();
    for (id, view) in &after.routes {
        for t in &view.targets {
            let was = before
                .routes
                .get(id)
                .and_then(|v| {
                    v.targets
                        .iter()
                        .find(|o| o.credential == t.credential && o.model == t.model)
                })
                .map(|o| o.circuit)
                .unwrap_or(CircuitState::Closed);
            let opened = t.circuit == CircuitState::Open && was != CircuitState::Open;
            let closed = t.circuit == CircuitState::Closed && was != CircuitState::Closed;
            if opened || closed {
                out.push(Transition {
                    route: id.clone(),
                    credential: t.credential.clone(),
                    model: t.model.clone(),
                    from: was,
                    to: t.circuit,
                    open_replicas: t.open_replicas,
                });
            }
        }
    }
    out
}

/// Milliseconds since the epoch of an RFC 3339 time.
fn started_ms(rfc3339: &str) -> Option<u64> {
    let t: k8s_openapi::jiff::Timestamp = rfc3339.parse().ok()?;
    u64::try_from(t.as_millisecond()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchback_crds::stats::TargetStats;

    const START: u64 = 1_800_000_000_000;

    fn id() -> ObjectId {
        ObjectId::new("team-a", "smart")
    }

    fn report(instance: &str, started: &str, requests: u64, circuit: CircuitState) -> StatsReport {
        StatsReport {
            credentials: Default::default(),
            version: 1,
            instance_id: instance.into(),
            started_at: started.into(),
            config_generation: 1,
            config_error: None,
            clients: Vec::new(),
            draining: false,
            routes: vec![RouteStats {
                route: id(),
                generation: 3,
                revision: Some(revision("00000000000000aa")),
                requests,
                attempts: requests * 2,
                fallbacks: requests / 2,
                failed: 0,
                resumed: requests / 5,
                cost_usd: Default::default(),
                fallback_extra_usd: Default::default(),
                targets: vec![TargetStats {
                    credential: ObjectId::new("team-a", "openai"),
                    model: Some("gpt-4o".into()),
                    circuit,
                    ..TargetStats::default()
                }],
                order: Vec::new(),
            }],
        }
    }

    fn revision(hex: &str) -> Revision {
        hex.parse().unwrap()
    }

    fn ok(endpoint: &str, r: StatsReport) -> Scrape {
        Scrape {
            endpoint: endpoint.into(),
            result: Ok(r),
        }
    }

    /// An RFC 3339 time `s` seconds after START.
    fn at(s: u64) -> String {
        k8s_openapi::jiff::Timestamp::from_millisecond((START + s * 1000) as i64)
            .unwrap()
            .to_string()
    }

    fn with_client(mut r: StatsReport, tokens: u64, rate_limited: u64, last: &str) -> StatsReport {
        r.clients = vec![switchback_crds::stats::ClientStats {
            client: ObjectId::new("team-a", "checkout"),
            requests: tokens / 10,
            input_tokens: tokens / 2,
            output_tokens: tokens - tokens / 2,
            micro_usd: tokens * 3,
            rate_limited,
            budget_exhausted: 0,
            last_request_at: Some(last.into()),
            ..Default::default()
        }];
        r
    }

    fn with_keys(mut r: StatsReport, keys: &[(&str, KeyState, Option<u64>)]) -> StatsReport {
        use switchback_crds::stats::{CredentialStats, KeyStats};
        r.credentials = vec![CredentialStats {
            credential: ObjectId::new("team-a", "openai"),
            keys: keys
                .iter()
                .map(|(name, state, until)| KeyStats {
                    name: name.to_string(),
                    state: *state,
                    until: until.map(at),
                    ..KeyStats::default()
                })
                .collect(),
        }];
        r
    }

    /// docs/request-lifecycle.md#key-pools: a key's state over the replicas is the one that
    /// keeps requests away the most, with how many replicas see it and the latest end they
    /// report; a draining replica's keys are not counted.
    #[test]
    fn keys_are_shown_by_the_state_that_keeps_requests_away_the_most() {
        let mut agg = Aggregator::new(300_000, START);
        let r = |i: &str, keys| with_keys(report(i, &at(0), 1, CircuitState::Closed), keys);
        let mut draining = r("i3", &[("k1", KeyState::Rejected, Some(900))]);
        draining.draining = true;
        agg.observe(
            START + 1_000,
            &[
                ok(
                    "a",
                    r(
                        "i1",
                        &[
                            ("k1", KeyState::Active, None),
                            ("k2", KeyState::Parked, Some(20)),
                            ("k3", KeyState::Parked, Some(5)),
                        ],
                    ),
                ),
                ok(
                    "b",
                    r(
                        "i2",
                        &[
                            ("k1", KeyState::Active, None),
                            ("k2", KeyState::Parked, Some(30)),
                            ("k3", KeyState::Rejected, Some(300)),
                        ],
                    ),
                ),
                ok("c", draining),
            ],
        );
        let keys = &agg.snapshot().credentials[&ObjectId::new("team-a", "openai")];
        let shown: Vec<(&str, KeyState, u32, Option<String>)> = keys
            .iter()
            .map(|k| (k.name.as_str(), k.state, k.replicas, k.until.clone()))
            .collect();
        assert_eq!(
            shown,
            [
                ("k1", KeyState::Active, 2, None),
                ("k2", KeyState::Parked, 2, Some(at(30))),
                ("k3", KeyState::Rejected, 1, Some(at(300))),
            ]
        );
    }

    /// Whether any replica probes a target, and the latest probe any reports.
    #[test]
    fn a_target_is_probing_when_any_replica_probes_it() {
        let mut agg = Aggregator::new(300_000, START);
        let probed = |i: &str, probing: bool, s: u64, outcome: &str| {
            let mut r = report(i, &at(0), 1, CircuitState::Open);
            let t = &mut r.routes[0].targets[0];
            t.probing = probing;
            t.last_probe = Some(ProbeRecord {
                outcome: outcome.into(),
                at: at(s),
            });
            r
        };
        agg.observe(
            START + 1_000,
            &[
                ok("a", probed("i1", false, 40, "success")),
                ok("b", probed("i2", true, 10, "timeout")),
            ],
        );
        let t = &agg.snapshot().routes[&id()].targets[0];
        assert!(t.probing);
        assert_eq!(
            t.last_probe.as_ref().map(|p| p.outcome.as_str()),
            Some("success")
        );
    }

    #[test]
    fn client_usage_is_summed_over_replicas_and_survives_a_proxy_restart() {
        let checkout = ObjectId::new("team-a", "checkout");
        let mut agg = Aggregator::new(300_000, START);
        let r = |i: &str, started: u64, tokens, limited, last| {
            with_client(
                report(i, &at(started), 1, CircuitState::Closed),
                tokens,
                limited,
                &at(last),
            )
        };
        agg.observe(
            START + 1_000,
            &[
                ok("a", r("i1", 0, 100, 1, 1)),
                ok("b", r("i2", 0, 50, 0, 1)),
            ],
        );
        agg.observe(
            START + 2_000,
            &[
                ok("a", r("i1", 0, 300, 2, 2)),
                ok("b", r("i2", 0, 80, 0, 1)),
            ],
        );
        let view = &agg.snapshot().clients[&checkout];
        assert_eq!(view.counted.today.usage.tokens(), 380);
        assert_eq!(view.counted.month.usage.micro_usd, 1_140);
        assert_eq!(view.counted.throttled.rate_limited, 2);
        assert_eq!(view.window_requests, 38);
        assert_eq!(view.last_request_ms, Some(START + 2_000));
        // Replica a restarts (counters from zero): its new counts add, nothing is lost.
        agg.observe(
            START + 3_000,
            &[ok("a", r("i3", 3, 20, 0, 3)), ok("b", r("i2", 0, 80, 0, 1))],
        );
        let view = &agg.snapshot().clients[&checkout];
        assert_eq!(view.counted.today.usage.tokens(), 400);
        assert_eq!(view.counted.throttled.rate_limited, 2);
        agg.retain_clients(|id| id != &checkout);
        assert!(agg.snapshot().clients.is_empty());
    }

    #[test]
    fn totals_never_go_backwards_across_proxy_restarts() {
        let mut agg = Aggregator::new(300_000, START);
        agg.observe(
            START + 1_000,
            &[ok("a", report("i1", &at(0), 10, CircuitState::Closed))],
        );
        agg.observe(
            START + 2_000,
            &[ok("a", report("i1", &at(0), 25, CircuitState::Closed))],
        );
        assert_eq!(agg.snapshot().routes[&id()].totals.requests, 25);
        // The proxy restarts: a new instance, counters from zero.
        agg.observe(
            START + 3_000,
            &[ok("a", report("i2", &at(3), 4, CircuitState::Closed))],
        );
        assert_eq!(agg.snapshot().routes[&id()].totals.requests, 29);
        agg.observe(
            START + 4_000,
            &[ok("a", report("i2", &at(3), 6, CircuitState::Closed))],
        );
        let view = &agg.snapshot().routes[&id()];
        assert_eq!(view.totals.requests, 31);
        assert_eq!(view.totals.attempts, 62);
        // Resumed streams too: 5 (of 25), then 0 and 1 (of 4 and 6) after the restart.
        assert_eq!(view.totals.resumed, 5 + 1);
        assert_eq!(view.window.requests, 31);
    }

    #[test]
    fn cost_is_summed_exactly_over_replicas_and_across_restarts() {
        let usd = |s: &str| s.parse::<Usd>().unwrap();
        // `cost`, `extra`: what the replica reports, cumulative since it started.
        let priced = |instance: &str, started: u64, cost: &str, extra: &str| {
            let mut r = report(instance, &at(started), 1, CircuitState::Closed);
            r.routes[0].cost_usd = usd(cost);
            r.routes[0].fallback_extra_usd = usd(extra);
            r
        };
        let mut agg = Aggregator::new(300_000, START);
        agg.observe(
            START + 1_000,
            &[
                ok("a", priced("i1", 0, "0.1", "0.0000001")),
                ok("b", priced("i2", 0, "0.2", "0")),
            ],
        );
        // Float sums would give 0.30000000000000004.
        assert_eq!(agg.snapshot().routes[&id()].totals.cost.to_string(), "0.30");
        agg.observe(
            START + 2_000,
            &[
                ok("a", priced("i1", 0, "0.100000000000003", "0.0000001")),
                ok("b", priced("i2", 0, "0.25", "0.05")),
            ],
        );
        // Replica a restarts: its cost starts from zero again, the totals go on.
        agg.observe(
            START + 3_000,
            &[
                ok("a", priced("i3", 3, "0.000000000000001", "0")),
                ok("b", priced("i2", 0, "0.25", "0.05")),
            ],
        );
        let view = &agg.snapshot().routes[&id()];
        assert_eq!(view.totals.cost.to_string(), "0.350000000000004");
        assert_eq!(view.totals.fallback_extra.to_string(), "0.0500001");
        assert_eq!(view.window.cost, view.totals.cost, "all in the window");
    }

    #[test]
    fn replicas_are_summed_and_come_and_go() {
        let mut agg = Aggregator::new(300_000, START);
        agg.observe(
            START + 1_000,
            &[
                ok("a", report("i1", &at(0), 10, CircuitState::Closed)),
                ok("b", report("i2", &at(0), 5, CircuitState::Closed)),
            ],
        );
        assert_eq!(agg.snapshot().routes[&id()].totals.requests, 15);
        // Replica b is gone (scaled down); a third one appears.
        agg.observe(
            START + 2_000,
            &[
                ok("a", report("i1", &at(0), 12, CircuitState::Closed)),
                ok("c", report("i3", &at(2), 1, CircuitState::Closed)),
            ],
        );
        let view = &agg.snapshot().routes[&id()];
        assert_eq!(view.totals.requests, 18);
        assert_eq!(view.generations.len(), 2);
        // b comes back with the same instance: only its growth counts.
        agg.observe(
            START + 3_000,
            &[ok("b", report("i2", &at(0), 9, CircuitState::Closed))],
        );
        assert_eq!(agg.snapshot().routes[&id()].totals.requests, 22);
    }

    #[test]
    fn a_draining_replica_is_counted_until_it_exits_but_is_no_replica() {
        let checkout = ObjectId::new("team-a", "checkout");
        let mut agg = Aggregator::new(300_000, START);
        let a = |tokens| {
            with_client(
                report("i1", &at(0), 10, CircuitState::Closed),
                tokens,
                0,
                &at(1),
            )
        };
        agg.observe(
            START + 1_000,
            &[
                ok("a", a(100)),
                ok("b", report("i2", &at(0), 5, CircuitState::Closed)),
            ],
        );
        assert_eq!(agg.snapshot().replicas.len(), 2);
        // SIGTERM: a keeps counting while it drains.
        let mut draining = a(400);
        draining.draining = true;
        draining.routes[0].requests = 14;
        agg.observe(
            START + 2_000,
            &[
                ok("a", draining),
                ok("b", report("i2", &at(0), 5, CircuitState::Closed)),
            ],
        );
        let s = agg.snapshot();
        assert_eq!(s.replicas.len(), 1, "shares and Programmed count b only");
        assert_eq!(s.draining, 1);
        assert_eq!(s.clients[&checkout].counted.today.usage.tokens(), 400);
        assert_eq!(s.routes[&id()].totals.requests, 19, "its requests too");
        assert_eq!(s.routes[&id()].generations.len(), 1);
    }

    #[test]
    fn instances_older_than_the_operator_are_a_baseline() {
        let mut agg = Aggregator::new(300_000, START + 10_000);
        agg.observe(
            START + 11_000,
            &[ok("a", report("old", &at(0), 100, CircuitState::Closed))],
        );
        let view = &agg.snapshot().routes[&id()];
        assert_eq!(view.totals.requests, 0, "counted by an earlier operator");
        agg.observe(
            START + 12_000,
            &[ok("a", report("old", &at(0), 103, CircuitState::Closed))],
        );
        assert_eq!(agg.snapshot().routes[&id()].totals.requests, 3);
    }

    #[test]
    fn the_window_forgets_old_traffic() {
        let mut agg = Aggregator::new(60_000, START);
        agg.observe(
            START,
            &[ok("a", report("i1", &at(0), 0, CircuitState::Closed))],
        );
        agg.observe(
            START + 1_000,
            &[ok("a", report("i1", &at(0), 10, CircuitState::Closed))],
        );
        agg.observe(
            START + 50_000,
            &[ok("a", report("i1", &at(0), 15, CircuitState::Closed))],
        );
        assert_eq!(agg.snapshot().routes[&id()].window.requests, 15);
        agg.observe(
            START + 90_000,
            &[ok("a", report("i1", &at(0), 16, CircuitState::Closed))],
        );
        let view = &agg.snapshot().routes[&id()];
        assert_eq!(view.window.requests, 6);
        assert_eq!(view.totals.requests, 16);
        assert_eq!(agg.snapshot().window_seconds, 60);
    }

    /// A report whose one target is in `state` (since, until) and has answered
    /// `successes` requests, `left` of which moved on for `status5xx`.
    fn with_target(
        mut r: StatsReport,
        state: TargetState,
        since: Option<&str>,
        until: Option<&str>,
        successes: u64,
        left: u64,
    ) -> StatsReport {
        let t = &mut r.routes[0].targets[0];
        t.state = Some(state);
        t.state_since = since.map(String::from);
        t.state_until = until.map(String::from);
        t.requests = successes + left;
        t.successes = successes;
        if left > 0 {
            t.fallbacks_away_by_reason = BTreeMap::from([("status5xx".to_string(), left)]);
        }
        r.routes[0].order = vec![0];
        r
    }

    /// docs/troubleshooting.md#target-states: the state that keeps requests away the most,
    /// with how many replicas see it, the earliest since and the latest until among them;
    /// per-target window counters summed over replicas from per-instance deltas, and
    /// forgotten with the window.
    #[test]
    fn target_states_and_window_counters_are_aggregated_over_replicas() {
        let mut agg = Aggregator::new(60_000, START);
        let round = |agg: &mut Aggregator, now: u64, a: (u64, u64), b_state: TargetState| {
            let a_report = with_target(
                report("i1", &at(0), 0, CircuitState::Open),
                TargetState::CircuitOpen,
                Some(&at(10)),
                Some(&at(40)),
                a.0,
                a.1,
            );
            let b_report = with_target(
                report("i2", &at(0), 0, CircuitState::Closed),
                b_state,
                None,
                None,
                a.0,
                0,
            );
            agg.observe(now, &[ok("a", a_report), ok("b", b_report)]);
        };
        round(&mut agg, START, (0, 0), TargetState::Ready);
        round(&mut agg, START + 1_000, (5, 3), TargetState::Ready);
        let view = &agg.snapshot().routes[&id()];
        let t = &view.targets[0];
        assert_eq!(t.state, Some(TargetState::CircuitOpen));
        assert_eq!(t.state_replicas, 1);
        assert_eq!(
            (t.since.as_deref(), t.until.as_deref()),
            (Some(at(10).as_str()), Some(at(40).as_str()))
        );
        assert_eq!(t.window.successes, 10, "5 on each replica");
        assert_eq!(t.window.fallbacks["status5xx"], 3);
        assert_eq!(view.order, [0]);
        // Both replicas open: two see it.
        round(&mut agg, START + 2_000, (5, 3), TargetState::CircuitOpen);
        assert_eq!(agg.snapshot().routes[&id()].targets[0].state_replicas, 2);
        // The window moves on: nothing new counted.
        round(&mut agg, START + 90_000, (5, 3), TargetState::Ready);
        let t = &agg.snapshot().routes[&id()].targets[0];
        assert_eq!(t.window, TargetCounts::default());
    }

    #[test]
    fn a_circuit_open_anywhere_is_open_and_transitions_are_reported() {
        let mut agg = Aggregator::new(300_000, START);
        let t = agg.observe(
            START + 1_000,
            &[
                ok("a", report("i1", &at(0), 1, CircuitState::Closed)),
                ok("b", report("i2", &at(0), 1, CircuitState::Closed)),
            ],
        );
        assert!(t.is_empty());
        let mut open = report("i2", &at(0), 2, CircuitState::Open);
        open.routes[0].targets[0].last_failure = Some(LastFailure {
            status: Some(503),
            reason: "status5xx".into(),
            at: at(1),
        });
        let mut older = report("i1", &at(0), 2, CircuitState::HalfOpen);
        older.routes[0].targets[0].last_failure = Some(LastFailure {
            status: None,
            reason: "timeout".into(),
            at: at(0),
        });
        let t = agg.observe(START + 2_000, &[ok("a", older), ok("b", open)]);
        let target = &agg.snapshot().routes[&id()].targets[0];
        assert_eq!(target.circuit, CircuitState::Open);
        assert_eq!(target.open_replicas, 1);
        assert_eq!(target.last_failure.as_ref().unwrap().reason, "status5xx");
        assert_eq!(t.len(), 1);
        assert_eq!(
            (t[0].from, t[0].to),
            (CircuitState::Closed, CircuitState::Open)
        );
        let t = agg.observe(
            START + 3_000,
            &[
                ok("a", report("i1", &at(0), 3, CircuitState::Closed)),
                ok("b", report("i2", &at(0), 3, CircuitState::Closed)),
            ],
        );
        assert_eq!(
            (t[0].from, t[0].to),
            (CircuitState::Open, CircuitState::Closed)
        );
    }

    #[test]
    fn deleted_routes_are_forgotten_once_nothing_serves_them() {
        let other = ObjectId::new("team-b", "other");
        let kept = |rid: &ObjectId| *rid == id();
        let mut agg = Aggregator::new(60_000, START);
        let mut r = report("i1", &at(0), 5, CircuitState::Closed);
        r.routes.push(RouteStats {
            route: other.clone(),
            ..r.routes[0].clone()
        });
        agg.observe(START + 10_000, &[ok("a", r.clone())]);
        r.routes[0].requests = 9;
        r.routes[1].requests = 9;
        agg.observe(START + 20_000, &[ok("a", r.clone())]);
        assert_eq!(agg.snapshot().routes[&other].totals.requests, 9);

        // Deleted, but a proxy still serves it: kept (its deltas still arrive).
        agg.retain_routes(kept);
        assert!(agg.snapshot().routes.contains_key(&other));

        // The proxy dropped it too: forgotten, snapshot and accumulator alike.
        r.routes.truncate(1);
        agg.observe(START + 30_000, &[ok("a", r.clone())]);
        agg.retain_routes(kept);
        assert!(!agg.snapshot().routes.contains_key(&other));
        agg.observe(START + 40_000, &[ok("a", r.clone())]);
        assert!(!agg.snapshot().routes.contains_key(&other));

        // A route that exists but that nothing serves keeps its totals.
        agg.observe(START + 50_000, &[]);
        agg.retain_routes(kept);
        assert_eq!(agg.snapshot().routes[&id()].totals.requests, 9);
    }

    #[test]
    fn each_replica_keeps_the_revision_it_reports() {
        let mut agg = Aggregator::new(300_000, START);
        let mut rotated = report("i2", &at(0), 1, CircuitState::Closed);
        rotated.routes[0].revision = Some(revision("00000000000000bb"));
        let mut older = report("i3", &at(0), 1, CircuitState::Closed);
        older.routes[0].revision = None; // a proxy older than the field
        agg.observe(
            START + 1_000,
            &[
                ok("a", report("i1", &at(0), 1, CircuitState::Closed)),
                ok("b", rotated),
                ok("c", older),
            ],
        );
        let view = &agg.snapshot().routes[&id()];
        assert_eq!(view.generations.len(), 3);
        assert_eq!(
            view.revisions,
            BTreeMap::from([
                ("a".to_string(), revision("00000000000000aa")),
                ("b".to_string(), revision("00000000000000bb")),
            ])
        );
        // Once b serves the new revision too, its entry follows.
        let mut caught_up = report("i1", &at(0), 2, CircuitState::Closed);
        caught_up.routes[0].revision = Some(revision("00000000000000bb"));
        agg.observe(START + 2_000, &[ok("a", caught_up)]);
        let view = &agg.snapshot().routes[&id()];
        assert_eq!(
            view.revisions,
            BTreeMap::from([("a".to_string(), revision("00000000000000bb"))])
        );
    }

    #[test]
    fn unreachable_replicas_are_listed_with_the_error() {
        let mut agg = Aggregator::new(300_000, START);
        agg.observe(
            START,
            &[Scrape {
                endpoint: "a".into(),
                result: Err("connection refused".into()),
            }],
        );
        assert_eq!(agg.snapshot().replicas.len(), 1);
        assert!(agg.snapshot().replicas.iter().all(|r| r.error.is_some()));
    }
}
