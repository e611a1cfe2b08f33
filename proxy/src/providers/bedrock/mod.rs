//! Amazon Bedrock.

pub mod eventstream;
pub mod sigv4;
