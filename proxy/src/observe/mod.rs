//! What the proxy counts and logs.

pub mod counters;
pub mod reason;
pub mod telemetry;
