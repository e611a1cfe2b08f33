//! The admin port.

pub mod guard;
pub mod metrics;
pub mod stats;
