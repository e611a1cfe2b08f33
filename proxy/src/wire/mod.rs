//! The words of the wire.

pub mod headers;
pub mod json;
pub mod rewrite;
pub mod sse;
pub mod surface;
pub mod usage;
