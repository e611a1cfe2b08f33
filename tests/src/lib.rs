//! Test support for Switchback, plus the end-to-end tests that span its binaries.
//!
//! This crate is never linked into a production binary: it exists so that unit tests,
//! integration tests, demos and benchmarks share one set of simulated providers (and,
//! later, one harness that starts the proxy against them).

pub mod binaries;
pub mod harness;
pub mod kubectl;
pub mod kubelet;
pub mod sim;
