//! Which addresses a provider `baseURL` may not reach unless the credential sets
//! `allowPrivateNetwork: true`: loopback, private, shared (CGNAT), link-local (cloud
//! metadata at 169.254.169.254 included) and unspecified addresses.
//!
//! `compile` applies it to a literal host; the proxy applies it again to every DNS
//! answer, because a public name can resolve to a private address.
//!
//! Whether a credential may set that field at all is the platform's decision, not the
//! tenant's (docs/security.md#where-the-proxies-connect): [`PrivateNetworks`] says in which
//! namespaces it is honoured.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The namespaces whose ProviderCredentials may set `allowPrivateNetwork: true`. In a
/// cluster it is the operator's `--allow-private-network-namespaces` (chart value
/// `egress.allowPrivateNetworkNamespaces`), none by default: whoever may edit a
/// namespace may write a credential, and without this a namespace editor could make
/// the proxies POST to any in-cluster or VPC address. Standalone manifests are the
/// platform's own file and are honoured as written ([`PrivateNetworks::Everywhere`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PrivateNetworks {
    /// Only credentials of these namespaces (empty: none, the default).
    Namespaces(BTreeSet<String>),
    /// Every credential's own field is honoured (`*`, and standalone manifests).
    Everywhere,
}

impl Default for PrivateNetworks {
    /// No namespace: a private network is allowed only where the platform says so.
    fn default() -> Self {
        PrivateNetworks::Namespaces(BTreeSet::new())
    }
}

impl PrivateNetworks {
    /// The list of `--allow-private-network-namespaces`: namespace names, or `*` alone
    /// for every namespace; empty entries are ignored. Errors name the bad entry.
    pub fn from_list(list: &[String]) -> Result<PrivateNetworks, String> {
        let names: BTreeSet<String> = list
            .iter()
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .collect();
        if names.contains("*") {
            return match names.len() {
                1 => Ok(PrivateNetworks::Everywhere),
                _ => Err("\"*\" allows every namespace and must be the only entry".into()),
            };
        }
        if let Some(bad) = names.iter().find(|n| !is_namespace_name(n)) {
            return Err(format!(
                "{bad:?} is not a namespace name (lowercase letters, digits and '-', at most 63 characters) or \"*\""
            ));
        }
        Ok(PrivateNetworks::Namespaces(names))
    }

    /// Whether a credential of `namespace` may set `allowPrivateNetwork: true`.
    pub fn allows(&self, namespace: &str) -> bool {
        match self {
            PrivateNetworks::Everywhere => true,
            PrivateNetworks::Namespaces(names) => names.contains(namespace),
        }
    }
}

/// An RFC 1123 label, as Kubernetes namespace names are.
fn is_namespace_name(name: &str) -> bool {
    let b = name.as_bytes();
    (1..=63).contains(&b.len())
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// True when `ip` is loopback, private (RFC 1918, IPv6 ULA fc00::/7), shared address
/// space (100.64.0.0/10), link-local (169.254.0.0/16, fe80::/10), unspecified, or an
/// IPv4-mapped / IPv4-compatible / NAT64 (64:ff9b::/96, RFC 6052) / 6to4 (2002::/16,
/// RFC 3056) IPv6 address of one of those: each of these reaches the IPv4 address it
/// embeds through a translator or relay.
pub fn is_private_ip(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_private_v4(v4),
        IpAddr::V6(v6) => is_private_v6(v6),
    }
}

fn is_private_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        // "This network" 0.0.0.0/8: connecting to it reaches the local host on Linux.
        || a == 0
        // Shared address space (RFC 6598), used by CGNAT and some cluster networks.
        || (a == 100 && (b & 0xc0) == 64)
}

fn is_private_v6(ip: Ipv6Addr) -> bool {
    // ::ffff:10.0.0.1 and friends reach the IPv4 address: judge that instead.
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_private_v4(v4);
    }
    let segments = ip.segments();
    // Deprecated IPv4-compatible form ::a.b.c.d (but not :: or ::1, handled below).
    if segments[..6].iter().all(|s| *s == 0) && segments[6] != 0 {
        return is_private_v4(v4_of(segments[6], segments[7]));
    }
    // NAT64 well-known prefix 64:ff9b::/96 (and the local-use 64:ff9b:1::/48): the
    // last 32 bits are the IPv4 destination.
    if (segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0]) || segments[..3] == [0x64, 0xff9b, 1] {
        return is_private_v4(v4_of(segments[6], segments[7]));
    }
    // 6to4 2002:AABB:CCDD::/48 embeds AA.BB.CC.DD.
    if segments[0] == 0x2002 {
        return is_private_v4(v4_of(segments[1], segments[2]));
    }
    ip.is_loopback()
        || ip.is_unspecified()
        // Unique local fc00::/7.
        || (segments[0] & 0xfe00) == 0xfc00
        // Link-local fe80::/10.
        || (segments[0] & 0xffc0) == 0xfe80
}

fn v4_of(high: u16, low: u16) -> Ipv4Addr {
    Ipv4Addr::new((high >> 8) as u8, high as u8, (low >> 8) as u8, low as u8)
}

/// True when a URL host names this machine or a private network: `localhost` (and
/// `*.localhost`, which resolvers map to loopback) or a literal private address.
/// Takes the host as the `url` crate gives it (IPv6 in brackets).
pub fn is_private_host(host: &url::Host<&str>) -> bool {
    match host {
        url::Host::Domain(name) => {
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            name == "localhost" || name.ends_with(".localhost")
        }
        url::Host::Ipv4(v4) => is_private_v4(*v4),
        url::Host::Ipv6(v6) => is_private_v6(*v6),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn private(text: &str) -> bool {
        is_private_ip(text.parse().expect("test address parses"))
    }

    #[test]
    fn private_addresses() {
        for ip in [
            "127.0.0.1",
            "127.255.0.9",
            "10.0.0.5",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "100.127.255.255",
            "169.254.169.254",
            "0.0.0.0",
            "0.1.2.3",
            "::1",
            "::",
            "fd00::1",
            "fc00::1",
            "fe80::1",
            "::ffff:10.0.0.1",
            "::ffff:127.0.0.1",
            "::169.254.169.254",
            "64:ff9b::7f00:1",
            "64:ff9b::10.1.2.3",
            "64:ff9b::169.254.169.254",
            "64:ff9b:1::a00:1",
            "2002:7f00:1::1",
            "2002:c0a8:101::",
            "2002:a9fe:a9fe::1",
        ] {
            assert!(private(ip), "{ip} should be private");
        }
    }

    #[test]
    fn public_addresses() {
        for ip in [
            "8.8.8.8",
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "100.63.255.255",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::8.8.8.8",
            "2002:808:808::1",
        ] {
            assert!(!private(ip), "{ip} should be public");
        }
    }

    #[test]
    fn private_networks_are_allowed_only_where_the_list_says() {
        let list = |items: &[&str]| {
            PrivateNetworks::from_list(&items.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        };
        let none = PrivateNetworks::default();
        assert!(!none.allows("team-a") && !none.allows("default"));
        assert_eq!(list(&[]).unwrap(), none);
        assert_eq!(list(&[" ", ""]).unwrap(), none);
        let some = list(&["team-a", " platform "]).unwrap();
        assert!(some.allows("team-a") && some.allows("platform"));
        assert!(!some.allows("team-b") && !some.allows("team-a "));
        let all = list(&["*"]).unwrap();
        assert_eq!(all, PrivateNetworks::Everywhere);
        assert!(all.allows("anything"));
        let e = list(&["*", "team-a"]).unwrap_err();
        assert!(e.contains("only entry"), "{e}");
        for bad in ["Team-A", "-a", "a-", "a.b", &"a".repeat(64)] {
            let e = list(&["team-a", bad]).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
    }

    #[test]
    fn localhost_names() {
        for (host, expected) in [
            ("localhost", true),
            ("LOCALHOST.", true),
            ("api.localhost", true),
            ("api.openai.com", false),
            ("localhost.example.com", false),
        ] {
            assert_eq!(
                is_private_host(&url::Host::Domain(host)),
                expected,
                "{host}"
            );
        }
    }
}
