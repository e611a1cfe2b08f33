//! `switchback-operator` as a library: the binary, its tests and the benchmark share
//! these modules. Pure parts (`render`, `publish`, `status`, `aggregate`, `usage`, `budget`, `circuit_events`) do no IO;
//! `controller` wires them to the API server, `scrape` to the proxies, `leader` to a
//! Lease and `metrics` to Prometheus. Nothing here touches global state.

pub mod aggregate;
pub mod bootstrap;
pub mod budget;
pub mod circuit_events;
pub mod cli;
pub mod controller;
pub mod explain;
pub mod fleet;
pub mod leader;
pub mod metrics;
pub mod publish;
pub mod render;
pub mod scope;
pub mod scrape;
pub mod status;
pub mod synced;
pub mod usage;

#[cfg(test)]
mod fixtures;
