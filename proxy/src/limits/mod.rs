//! The limits.

pub mod answers;
pub mod bytes;
pub mod circuit;
pub mod clients;
pub mod concurrency;
