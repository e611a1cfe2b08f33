//! The words of the wire.

pub mod json;
pub mod rewrite;
pub mod sse;
pub mod surface;
