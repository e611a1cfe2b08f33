//! Switchback's API: the `LLMRoute`, `ProviderCredential` and `LLMClient` custom
//! resources, their validation, and the compiled config that the operator renders and
//! the proxy loads.

pub mod admintoken;
pub mod client;
pub mod compile;
pub mod config;
pub mod cost;
pub mod crdgen;
pub mod credential;
pub mod delivery;
pub mod duration;
pub mod fleet;
pub mod keyhash;
pub mod network;
pub mod revision;
pub mod route;
pub mod schema;
pub mod secret;
pub mod service_account;
pub mod stats;

#[cfg(test)]
mod cel_parity;

pub use client::{LLMClient, LLMClientSpec, LLMClientStatus};
pub use compile::{Compiled, Diagnostic, Inputs, compile, reason};
pub use crdgen::crd_yaml;
pub use credential::{ProviderCredential, ProviderCredentialSpec, ProviderCredentialStatus};
pub use route::{LLMRoute, LLMRouteSpec, LLMRouteStatus};
pub use secret::Secret;
