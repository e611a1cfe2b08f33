//! Where the config comes from.

pub mod cluster;
pub mod manifest;
pub mod standalone;
