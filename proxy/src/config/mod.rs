//! The config made ready for the request path.

pub mod keys;
pub mod snapshot;
