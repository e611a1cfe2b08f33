//! The providers.

pub mod bedrock;
pub mod translate;
pub mod vertex;
