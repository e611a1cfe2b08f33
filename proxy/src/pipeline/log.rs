//! What the request log line is told of a request's attempts: each failed or
//! skipped try ([`AttemptLog`]) and what resuming its stream added ([`ResumeLog`]).
//! A leaf: the pipeline's files fill these in; the log line (`http`) reads them.

use std::time::Duration;

use crate::observe::reason::{Reason, ResumeOutcome};

/// One line of the attempt log.
#[derive(Debug, Clone, Copy)]
pub struct AttemptLog {
    pub target: u8,
    pub status: Option<u16>,
    pub reason: Reason,
    pub duration: Duration,
    pub retry_after: Option<Duration>,
}

/// What a resumed (or not resumed) stream adds to its request's log line.
#[derive(Debug, Default)]
pub struct ResumeLog {
    /// The failures that stopped committed streams, and the continuations' skips
    /// and failures, in order.
    pub log: Vec<AttemptLog>,
    /// Times the stream was resumed.
    pub resumes: u32,
    /// The target whose continuation was relayed last.
    pub resumed_by: Option<u8>,
    /// Why the last failure was not resumed.
    pub outcome: Option<ResumeOutcome>,
    /// Upstream requests the continuations sent.
    pub sent: u32,
}
