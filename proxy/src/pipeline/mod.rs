//! One client request on one route (`request`): the walk along the route's targets
//! in order (`walk`, `order`), each target tried with its retries, backoff and Retry-After
//! inside the call's budget (`target`, `outcome`), each try sent upstream (`send`),
//! and either one answer committed (`answer` for unary ones, `stream` for streams,
//! `relay` for what reaches the client of both) or the last failure turned into the
//! gateway's own error (`failure`); an image or document by URL is fetched for a
//! target that cannot fetch it (`fetch`). A committed stream of a route that resumes is
//! continued on the next target when it breaks (`resume`), and a route may hedge a
//! slow try on the next target (`hedge`, both docs/streaming.md#first-token-hedging). What
//! the request log line is told of the attempts is in `log`; what an answer's usage is
//! charged to, in `charge`.
//!
//! No file here imports one that imports it back: `request` imports `walk` and
//! `resume`; `target`, `hedge` and `resume` extend the walk and import it, never the
//! other way round (what the walk holds of a hedge is in `hedge::state`); `stream`,
//! `attempt`, `call`, `charge` and `log` are below them all.
//!
//! It reaches providers only through the `providers` interface (an adapter, a
//! credential's endpoint, a dialect, the translation): it names none. It knows
//! nothing of client connections, authentication or where the config comes from.
//! Nothing here holds a lock across an await; per-target facts are atomics.
//! Dropping the future (the client went away) drops the in-flight upstream request
//! with it, so nothing more is sent upstream.

mod answer;
mod attempt;
mod call;
mod charge;
mod failure;
pub mod fetch;
mod hedge;
#[cfg(test)]
mod hedge_tests;
mod log;
pub(crate) mod order;
pub(crate) mod outcome;
mod relay;
mod request;
mod resume;
mod send;
pub(crate) mod stream;
mod target;
mod walk;

pub(crate) use call::{Call, Outcome, STAYS};
pub(crate) use log::{AttemptLog, ResumeLog};
pub(crate) use request::run;
pub(crate) use stream::StreamEnd;
