//! The client side of the data port: what one replica lets its clients hold (open
//! connections, time to send headers and bodies, idle keep-alive sockets, request
//! bytes in memory) and how it stops serving them on shutdown (docs/limits.md#shutdown).
//!
//! * `conn`: the accept loop under the connection cap, the header size limit, and
//!   the header-read, idle keep-alive and client-write timeouts (kept by a wrapper
//!   around each client socket); the admin port's connections too (its own cap, which
//!   closes the longest-quiet connection to make room, and idle timeout).
//! * `intake`: reading one request body: the size limit before reading, the global
//!   in-flight budget, and the body-read timeout.
//! * `drain`: ending open streams with the error event when the grace is over.
//! * `lanes`: the data port served by N threads, each with its own listening socket
//!   and upstream pool.
//!
//! [`Front`] is the state they share, one per gateway, across every serving lane.
//! It knows sockets and bodies, not what a request asks for: routing and providers
//! are the data port's and the pipeline's.

pub(crate) mod conn;
pub(crate) mod drain;
pub(crate) mod intake;
pub(crate) mod lanes;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};

/// The client-side limits (docs/limits.md#the-limits). Defaults are that page's.
#[derive(Clone, Debug)]
pub struct ClientLimits {
    /// From a request's first byte to the end of its headers; past it the connection
    /// is closed.
    pub header_read_timeout: Duration,
    /// From the end of the headers to the end of the body; past it, 408.
    pub body_read_timeout: Duration,
    /// A connection with no request in progress is closed after this long.
    pub idle_timeout: Duration,
    /// Open client connections per replica; past it new ones wait in the accept queue.
    pub max_connections: usize,
    /// Request body bytes held at once by all requests; past it, 503 `overloaded`.
    pub max_inflight_body_bytes: usize,
    /// A request's head (request line and headers) larger than this gets 431 and the
    /// connection is closed. At least 8 KiB (hyper's smallest read buffer).
    pub max_header_bytes: usize,
    /// Bytes of request heads still being received (a head that did not arrive in one
    /// read), all connections together; a head that does not fit closes its
    /// connection. Bounds what slow heads hold whatever `max_connections` allows.
    pub max_inflight_header_bytes: usize,
    /// A connection whose answer the client has not taken a byte of for this long is
    /// closed, and what its request held (answer bytes, slots) given back.
    pub client_write_timeout: Duration,
    /// A request arriving with `x-switchback-hops` at this or more is answered 508
    /// `loop_detected` and not sent on (docs/limits.md#no-loops). 1 to `crate::wire::hops::MAX`.
    pub max_hops: u8,
    /// Open connections on the admin port; past it the one quiet the longest (no
    /// request in progress) is closed to make room, or, when all are busy, the new
    /// one is.
    pub admin_max_connections: usize,
    /// An admin connection with no request in progress is closed after this long.
    pub admin_idle_timeout: Duration,
}

impl Default for ClientLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(90),
            max_connections: 10_000,
            max_inflight_body_bytes: 256 << 20,
            max_header_bytes: 64 << 10,
            max_inflight_header_bytes: 32 << 20,
            client_write_timeout: Duration::from_secs(60),
            max_hops: 2,
            admin_max_connections: 128,
            admin_idle_timeout: Duration::from_secs(30),
        }
    }
}

impl ClientLimits {
    /// The admin port's: its own cap and idle timeout, the data port's header and
    /// write limits.
    pub(crate) fn admin(&self) -> ClientLimits {
        ClientLimits {
            idle_timeout: self.admin_idle_timeout,
            max_connections: self.admin_max_connections,
            ..self.clone()
        }
    }
}

/// What the limits refused, for `/metrics` (counted only when something is refused:
/// nothing on the path of a request that passes).
#[derive(Debug, Default)]
pub struct Refusals {
    pub header_timeouts: AtomicU64,
    pub body_timeouts: AtomicU64,
    pub idle_timeouts: AtomicU64,
    /// Times the accept loop found every connection slot taken and waited for one.
    pub connection_waits: AtomicU64,
    pub too_large: AtomicU64,
    pub over_budget: AtomicU64,
    /// Request heads over `max_header_bytes` (or hyper's header count): 431.
    pub header_too_large: AtomicU64,
    /// Connections closed because their unfinished head did not fit in
    /// `max_inflight_header_bytes`.
    pub heads_over_budget: AtomicU64,
    /// Connections closed because the client took no byte of its answer in time.
    pub write_timeouts: AtomicU64,
    /// Requests refused for their `x-switchback-hops` (508, or 400 when unreadable).
    pub hops: AtomicU64,
    /// Admin port: connections closed (or refused) at the connection cap.
    pub evictions: AtomicU64,
}

impl Refusals {
    pub(crate) fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// A one-way signal every lane can wait on without contending with the others: a
/// flag to check, and one `Notify` per lane to sleep on (waiting on a `Notify` locks
/// it; per lane, that lock is only ever taken by one thread).
#[derive(Debug)]
pub struct Signal {
    set: AtomicBool,
    lanes: Box<[Arc<Notify>]>,
}

impl Signal {
    fn new(lanes: usize) -> Self {
        Self {
            set: AtomicBool::new(false),
            lanes: (0..lanes.max(1)).map(|_| Arc::new(Notify::new())).collect(),
        }
    }

    #[inline]
    pub(crate) fn is_set(&self) -> bool {
        self.set.load(Ordering::Acquire)
    }

    pub fn set(&self) {
        self.set.store(true, Ordering::Release);
        for n in self.lanes.iter() {
            n.notify_waiters();
        }
    }

    /// A future that completes once the signal is set, registered already: a `set`
    /// after this call wakes it. Check [`Signal::is_set`] after calling this.
    pub(crate) fn notified(&self) -> std::pin::Pin<Box<tokio::sync::futures::OwnedNotified>> {
        let lane = crate::upstream::lane() % self.lanes.len();
        let mut n = Box::pin(self.lanes[lane].clone().notified_owned());
        n.as_mut().enable();
        n
    }
}

/// The shared client-side state of one gateway.
#[derive(Debug)]
pub struct Front {
    pub limits: ClientLimits,
    pub refusals: Refusals,
    /// One permit per open client connection.
    pub(crate) slots: Arc<Semaphore>,
    /// Request body bytes reserved by requests being read or handled
    /// (`max_inflight_body_bytes`).
    pub(crate) bodies: crate::limits::bytes::Budget,
    /// Bytes of unfinished request heads (`max_inflight_header_bytes`).
    pub(crate) heads: Arc<crate::limits::bytes::Budget>,
    /// SIGTERM seen: `/readyz` answers 503.
    pub(crate) draining: AtomicBool,
    /// Listeners stop accepting; idle connections close, busy ones after their answer.
    pub(crate) stop_accepting: Signal,
    /// The grace is over: open streams end with the error event.
    pub(crate) end_streams: Signal,
    /// The admin port's connections, to close the quietest at the cap (`None` on
    /// the data port, where new connections wait in the accept queue instead).
    pub(crate) roster: Option<conn::Roster>,
}

impl Front {
    pub fn new(limits: ClientLimits, lanes: usize) -> Self {
        // A semaphore holds at most `usize::MAX >> 3` permits.
        let slots = limits.max_connections.clamp(1, Semaphore::MAX_PERMITS);
        let bodies = crate::limits::bytes::Budget::new(limits.max_inflight_body_bytes);
        let heads = Arc::new(crate::limits::bytes::Budget::new(
            limits.max_inflight_header_bytes,
        ));
        Self {
            limits,
            refusals: Refusals::default(),
            slots: Arc::new(Semaphore::new(slots)),
            bodies,
            heads,
            draining: AtomicBool::new(false),
            stop_accepting: Signal::new(lanes),
            end_streams: Signal::new(lanes),
            roster: None,
        }
    }

    /// The admin port's: `limits.admin()`, a roster of its connections, and a stop
    /// signal that is never set (the admin port answers until the process exits).
    pub fn admin(limits: &ClientLimits) -> Self {
        Self {
            roster: Some(conn::Roster::default()),
            ..Self::new(limits.admin(), 1)
        }
    }

    fn slots_total(&self) -> usize {
        self.limits.max_connections.clamp(1, Semaphore::MAX_PERMITS)
    }

    /// Open client connections now.
    pub(crate) fn open_connections(&self) -> usize {
        self.slots_total()
            .saturating_sub(self.slots.available_permits())
    }

    /// Request body bytes held now.
    pub(crate) fn body_bytes_held(&self) -> usize {
        self.bodies.held()
    }

    /// Bytes of unfinished request heads held now.
    pub(crate) fn header_bytes_held(&self) -> usize {
        self.heads.held()
    }

    /// True once a shutdown has begun.
    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }
}

impl Default for Front {
    fn default() -> Self {
        Self::new(ClientLimits::default(), 1)
    }
}
