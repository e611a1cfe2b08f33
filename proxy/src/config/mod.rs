//! The config as the request path serves it: the compiled config prepared into a
//! snapshot (`prepare` → `snapshot`: routes by model name, each target with its
//! credential's adapter, endpoint and headers), the per-target facts that outlive a
//! reload (`target`: park, circuit, latency), and how clients authenticate (`keys`).
//!
//! Where the config comes from (files, the cluster) is `sources`; how a request uses
//! it is the pipeline's. Nothing here does I/O.

pub mod keys;
pub(crate) mod prepare;
pub mod snapshot;
pub(crate) mod target;
