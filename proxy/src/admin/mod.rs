//! The admin port.

pub mod guard;
pub mod metrics;
