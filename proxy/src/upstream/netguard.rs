//! Refusing to reach private networks by name. `compile` already refuses base URLs
//! that are private IP literals; this resolver closes the other door: a public-looking
//! hostname that resolves to loopback, a private range, link-local (cloud metadata
//! included) or an unspecified address. Credentials with `allowPrivateNetwork: true`
//! use a client whose resolver lets every address through.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::dns::Name;
use switchback_crds::network::is_private_ip;

/// The upstream clients' DNS resolver (the system's, through tokio), refusing
/// private answers unless built with `public_only: false`. Only new connections
/// resolve; pooled ones do not come here.
#[derive(Debug, Clone, Copy)]
pub struct Resolver {
    pub public_only: bool,
}

#[derive(Debug, thiserror::Error)]
#[error(
    "{host} resolves only to private, loopback or link-local addresses; set allowPrivateNetwork: true on the credential to allow it"
)]
pub struct PrivateAddress {
    host: String,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<Name> for Resolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let public_only = self.public_only;
        Box::pin(async move {
            let host = name.as_str();
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, 0))
                .await?
                .filter(|a| !public_only || !is_private_ip(a.ip()))
                .collect();
            if addrs.is_empty() && public_only {
                return Err(Box::new(PrivateAddress {
                    host: host.to_owned(),
                }) as BoxError);
            }
            Ok(addrs.into_iter())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_service::Service as _;

    #[tokio::test]
    async fn localhost_is_refused_unless_private_networks_are_allowed() {
        let name: Name = "localhost".parse().unwrap();
        let err = match (Resolver { public_only: true }).call(name.clone()).await {
            Ok(_) => panic!("localhost must not resolve through the public-only resolver"),
            Err(e) => e,
        };
        assert!(err.to_string().contains("allowPrivateNetwork"), "{err}");
        let addrs: Vec<_> = (Resolver { public_only: false })
            .call(name)
            .await
            .unwrap()
            .collect();
        assert!(addrs.iter().all(|a| a.ip().is_loopback()) && !addrs.is_empty());
    }
}
