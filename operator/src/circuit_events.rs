//! Which circuit transitions become `CircuitOpened` / `CircuitClosed` Events.
//!
//! The rule: the last Event published for a target always ends up agreeing with its
//! circuit in `status.targets`. Every change of state is published at once, except
//! while a target flaps: past [`BURST`] Events within [`EVERY`], a change waits until
//! the oldest of them leaves the window, and only the state the circuit is in by then
//! is published (nothing, if it is back where the last Event left it). So an open
//! followed by a close within seconds gives both Events, and a breaker that flips
//! every scrape gives at most [`BURST`] Events a minute and never a stale last one.
//!
//! Pure: the scrape loop feeds it transitions and the time, and publishes what it
//! returns.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use switchback_crds::config::ObjectId;
use switchback_crds::stats::CircuitState;
use tokio::time::Instant;

use crate::aggregate::Transition;

/// The window Events are counted in, per target.
pub const EVERY: Duration = Duration::from_secs(60);
/// Events allowed per target within [`EVERY`]: an open and its close.
pub const BURST: usize = 2;

/// One target of one route.
type Key = (ObjectId, ObjectId, Option<String>);

#[derive(Debug, Default)]
struct Entry {
    /// The state the last published Event announced.
    published: Option<CircuitState>,
    /// When the Events within the window were published, oldest first.
    times: VecDeque<Instant>,
    /// The latest transition not yet published (flapping).
    pending: Option<Transition>,
}

/// Per-target memory of published circuit Events.
#[derive(Debug, Default)]
pub struct CircuitEvents {
    targets: HashMap<Key, Entry>,
}

impl CircuitEvents {
    /// Takes this round's transitions; returns those to publish now, held-back ones
    /// whose wait is over included. The caller publishes them in order.
    pub fn observe(&mut self, now: Instant, transitions: Vec<Transition>) -> Vec<Transition> {
        for t in transitions {
            let key = (t.route.clone(), t.credential.clone(), t.model.clone());
            self.targets.entry(key).or_default().pending = Some(t);
        }
        let mut out = Vec::new();
        for entry in self.targets.values_mut() {
            while entry
                .times
                .front()
                .is_some_and(|at| now.duration_since(*at) >= EVERY)
            {
                entry.times.pop_front();
            }
            let Some(t) = entry.pending.take() else {
                continue;
            };
            if entry.published == Some(t.to) {
                continue; // back where the last Event left it
            }
            if entry.times.len() >= BURST {
                entry.pending = Some(t); // flapping: wait for the window
                continue;
            }
            entry.published = Some(t.to);
            entry.times.push_back(now);
            out.push(t);
        }
        // A target with nothing pending and nothing in the window needs no memory: the
        // aggregator only reports changes, so its next transition differs anyway.
        self.targets
            .retain(|_, e| e.pending.is_some() || !e.times.is_empty());
        out.sort_by(|a, b| {
            (&a.route, &a.credential, &a.model).cmp(&(&b.route, &b.credential, &b.model))
        });
        out
    }

    /// Forgets the targets of routes that no longer exist.
    pub fn retain_routes(&mut self, exists: impl Fn(&ObjectId) -> bool) {
        self.targets.retain(|(route, _, _), _| exists(route));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(to: CircuitState) -> Transition {
        Transition {
            route: ObjectId::new("team-a", "smart"),
            credential: ObjectId::new("team-a", "openai"),
            model: None,
            from: if to == CircuitState::Open {
                CircuitState::Closed
            } else {
                CircuitState::Open
            },
            to,
            open_replicas: u32::from(to == CircuitState::Open),
        }
    }

    fn states(out: &[Transition]) -> Vec<CircuitState> {
        out.iter().map(|t| t.to).collect()
    }

    use CircuitState::{Closed, Open};

    #[test]
    fn a_close_seconds_after_the_open_is_published() {
        let start = Instant::now();
        let mut ev = CircuitEvents::default();
        assert_eq!(states(&ev.observe(start, vec![t(Open)])), [Open]);
        assert_eq!(
            states(&ev.observe(start + Duration::from_secs(5), vec![t(Closed)])),
            [Closed],
            "the last Event must agree with status"
        );
    }

    #[test]
    fn flapping_is_held_and_only_the_state_at_the_end_of_the_wait_is_published() {
        let start = Instant::now();
        let s = Duration::from_secs;
        let mut ev = CircuitEvents::default();
        assert_eq!(states(&ev.observe(start, vec![t(Open)])), [Open]);
        assert_eq!(states(&ev.observe(start + s(2), vec![t(Closed)])), [Closed]);
        // Third change within the minute: held.
        assert!(ev.observe(start + s(4), vec![t(Open)]).is_empty());
        assert!(ev.observe(start + s(30), vec![]).is_empty());
        // The window frees one slot at start + 60 s: the state then is Open.
        assert_eq!(states(&ev.observe(start + s(60), vec![])), [Open]);
        assert!(
            ev.observe(start + s(61), vec![]).is_empty(),
            "published once"
        );
    }

    #[test]
    fn a_held_change_undone_before_its_turn_publishes_nothing() {
        let start = Instant::now();
        let s = Duration::from_secs;
        let mut ev = CircuitEvents::default();
        ev.observe(start, vec![t(Open)]);
        ev.observe(start + s(1), vec![t(Closed)]);
        assert!(ev.observe(start + s(2), vec![t(Open)]).is_empty());
        assert!(ev.observe(start + s(3), vec![t(Closed)]).is_empty());
        // Closed is what the last Event already says.
        assert!(ev.observe(start + s(90), vec![]).is_empty());
        assert!(ev.targets.is_empty(), "nothing left to remember");
    }

    #[test]
    fn targets_are_independent_and_deleted_routes_are_forgotten() {
        let start = Instant::now();
        let mut ev = CircuitEvents::default();
        let mut other = t(Open);
        other.credential = ObjectId::new("team-a", "anthropic");
        let out = ev.observe(start, vec![t(Open), other]);
        assert_eq!(out.len(), 2);
        assert_eq!(
            out[0].credential.name, "anthropic",
            "published in a stable order"
        );
        ev.retain_routes(|_| false);
        assert!(ev.targets.is_empty());
    }
}
