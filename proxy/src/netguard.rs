//! Refusing to reach private networks by name. `compile` already refuses base URLs
//! that are private IP literals; this resolver closes the other door: a public-looking
//! hostname that resolves to loopback, a private range, link-local (cloud metadata
//! included) or an unspecified address. Credentials with `allowPrivateNetwork: true`
//! use a client without it.

use std::net::SocketAddr;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use switchback_crds::network::is_private_ip;

#[derive(Debug, Default, Clone, Copy)]
pub struct PublicOnly;

#[derive(Debug, thiserror::Error)]
#[error(
    "{host} resolves only to private, loopback or link-local addresses; set allowPrivateNetwork: true on the credential to allow it"
)]
pub struct PrivateAddress {
    host: String,
}

impl Resolve for PublicOnly {
    fn resolve(&self, name: Name) -> Resolving {
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await?
                .filter(|a| !is_private_ip(a.ip()))
                .collect();
            if addrs.is_empty() {
                return Err(
                    Box::new(PrivateAddress { host }) as Box<dyn std::error::Error + Send + Sync>
                );
            }
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn localhost_is_refused() {
        let err = match PublicOnly.resolve("localhost".parse().unwrap()).await {
            Ok(_) => panic!("localhost must not resolve through the public-only resolver"),
            Err(e) => e,
        };
        assert!(err.to_string().contains("allowPrivateNetwork"), "{err}");
    }
}
