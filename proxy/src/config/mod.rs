//! The config made ready for the request path.

pub mod keys;
pub mod prepare;
pub mod snapshot;
pub mod target;
