//! The words of the wire, shared by every layer: the client surfaces and their
//! error shapes (`surface`), server-sent events (`sse`: framing, openings, in-band
//! errors, the failure event), a JSON object check that builds nothing (`json`), the
//! `model` rewrite in raw bytes (`rewrite`), usage as the client APIs report it
//! (`usage`), what a stream event carries of the answer (`content`), the names of the
//! gateway's own headers (`headers`), and the hop count that stops loops (`hops`).
//!
//! Pure functions over bytes: nothing here knows routes, providers, the config or the
//! network.

pub(crate) mod content;
pub(crate) mod headers;
pub(crate) mod hops;
pub mod json;
pub mod rewrite;
pub mod sse;
pub mod surface;
pub mod usage;
