//! Where the config comes from, and how it reaches the gateway: standalone manifests
//! read with positions for every error (`manifest`) and reloaded when they change
//! (`standalone`), or the rendered ConfigMaps and Secrets of a namespace watched
//! through the Kubernetes API (`cluster`), with the fleet's health view beside it
//! (`fleet_view`). Each load is compiled (`switchback_crds`)
//! and applied whole to the gateway, or refused and reported, the last good config
//! serving on.
//!
//! It knows nothing of requests, providers or the pipeline.

pub(crate) mod cluster;
pub(crate) mod fleet_view;
pub mod manifest;
pub mod standalone;
