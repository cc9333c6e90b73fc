//! How a peer's addresses are seen here: the fabric's IPAM grants, per peer, a CIDR under
//! which each of the peer's real CIDRs (pod, external) is seen in this cluster (the peer's
//! `Configuration`: real CIDRs in spec, remapped ones in status). An address keeps its host
//! part across the remap (see `shared/design/packet-path.md`).
//!
//! Pure: the consumer's virtual kubelet reports its offloaded pods' addresses home through
//! the provider's pod remap; the provider translates the addresses of a consumer's
//! EndpointSlices through the consumer's pod and external remaps.
use std::net::Ipv4Addr;

use ipnetwork::Ipv4Network;

use super::v1alpha1::{ClusterCidrs, Configuration};

/// Which of a peer's CIDRs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Pod,
    External,
}

impl Role {
    fn of(self, c: &ClusterCidrs) -> Ipv4Network {
        match self {
            Role::Pod => c.pod,
            Role::External => c.external,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Role::Pod => "pod",
            Role::External => "external",
        }
    }
}

/// One of a peer's real CIDRs and the one it is seen under here (equal when nothing
/// clashed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Remap {
    pub real: Ipv4Network,
    pub seen: Ipv4Network,
}

/// Why a Configuration gives no remap.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadConfiguration {
    #[error("the IPAM has not granted a {0} CIDR for the peer yet")]
    NotGranted(&'static str),
    #[error("the remapped {role} CIDR {seen} is not the size of the real one {real}")]
    SizeMismatch {
        role: &'static str,
        real: Ipv4Network,
        seen: Ipv4Network,
    },
}

impl Remap {
    /// The pod CIDR remap a peer's Configuration records.
    pub fn of(cfg: &Configuration) -> Result<Self, BadConfiguration> {
        Self::of_role(cfg, Role::Pod)
    }

    /// The remap of the peer's `role` CIDR a Configuration records.
    pub fn of_role(cfg: &Configuration, role: Role) -> Result<Self, BadConfiguration> {
        let real = role.of(&cfg.spec.remote);
        let seen = cfg
            .status
            .as_ref()
            .and_then(|s| s.remote.as_ref())
            .ok_or(BadConfiguration::NotGranted(role.name()))?;
        let seen = role.of(seen);
        if real.prefix() != seen.prefix() {
            return Err(BadConfiguration::SizeMismatch {
                role: role.name(),
                real,
                seen,
            });
        }
        Ok(Self { real, seen })
    }

    /// `ip` as seen here, if it is in the real CIDR: the remapped network, the same host
    /// part.
    pub fn map(&self, ip: Ipv4Addr) -> Option<Ipv4Addr> {
        if !self.real.contains(ip) {
            return None;
        }
        let host = u32::from(ip) & !u32::from(self.real.mask());
        Some(Ipv4Addr::from(u32::from(self.seen.network()) | host))
    }
}

/// Both of a peer's remaps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Remaps {
    pub pod: Remap,
    pub external: Remap,
}

/// Why a peer's address has no address here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unmapped {
    #[error("{0:?} is not an IPv4 address")]
    NotIpv4(String),
    #[error("{ip} is in neither the peer's pod CIDR {pod} nor its external CIDR {external}")]
    Outside {
        ip: Ipv4Addr,
        pod: Ipv4Network,
        external: Ipv4Network,
    },
}

impl Remaps {
    /// The pod and external remaps a peer's Configuration records.
    pub fn of(cfg: &Configuration) -> Result<Self, BadConfiguration> {
        Ok(Self {
            pod: Remap::of_role(cfg, Role::Pod)?,
            external: Remap::of_role(cfg, Role::External)?,
        })
    }

    /// The peer's address `ip` as seen here: through the pod remap if it is a pod address,
    /// else through the external remap; anything else is refused (it would name an address
    /// of this cluster, not the peer's).
    pub fn map(&self, ip: &str) -> Result<Ipv4Addr, Unmapped> {
        let addr: Ipv4Addr = ip.parse().map_err(|_| Unmapped::NotIpv4(ip.to_owned()))?;
        self.pod
            .map(addr)
            .or_else(|| self.external.map(addr))
            .ok_or(Unmapped::Outside {
                ip: addr,
                pod: self.pod.real,
                external: self.external.real,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::networking::v1alpha1::{ConfigurationSpec, ConfigurationStatus};

    fn cfg(real: (&str, &str), seen: Option<(&str, &str)>) -> Configuration {
        let cidrs = |(pod, external): (&str, &str)| ClusterCidrs {
            pod: pod.parse().unwrap(),
            external: external.parse().unwrap(),
        };
        let mut c = Configuration::new(
            "b",
            ConfigurationSpec {
                cluster_id: "b".into(),
                remote: cidrs(real),
            },
        );
        c.status = seen.map(|s| ConfigurationStatus {
            remote: Some(cidrs(s)),
            ..Default::default()
        });
        c
    }

    #[test]
    fn a_remapped_address_keeps_its_host_part() {
        let r = Remap::of(&cfg(
            ("10.244.0.0/16", "10.70.0.0/16"),
            Some(("10.71.0.0/16", "10.72.0.0/16")),
        ))
        .unwrap();
        assert_eq!(
            r.map("10.244.2.7".parse().unwrap()),
            Some(Ipv4Addr::new(10, 71, 2, 7))
        );
        assert_eq!(r.map("10.245.2.7".parse().unwrap()), None);
        let r = Remap::of(&cfg(
            ("192.168.16.0/20", "10.70.0.0/16"),
            Some(("10.80.32.0/20", "10.70.0.0/16")),
        ))
        .unwrap();
        assert_eq!(
            r.map("192.168.31.255".parse().unwrap()),
            Some("10.80.47.255".parse().unwrap())
        );
    }

    #[test]
    fn pod_then_external_and_nothing_else() {
        let c = cfg(
            ("10.244.0.0/16", "10.70.0.0/16"),
            Some(("10.245.0.0/16", "10.90.0.0/16")),
        );
        let r = Remaps::of(&c).unwrap();
        assert_eq!(r.map("10.244.1.5"), Ok(Ipv4Addr::new(10, 245, 1, 5)));
        assert_eq!(r.map("10.70.3.4"), Ok(Ipv4Addr::new(10, 90, 3, 4)));
        assert!(matches!(r.map("10.96.0.1"), Err(Unmapped::Outside { .. })));
        // Already an address as seen here: not the peer's, refused.
        assert!(matches!(r.map("10.245.1.5"), Err(Unmapped::Outside { .. })));
        assert_eq!(r.map("fd00::1"), Err(Unmapped::NotIpv4("fd00::1".into())));
        let e = r.map("10.96.0.1").unwrap_err().to_string();
        assert!(
            e.contains("10.96.0.1") && e.contains("10.244.0.0/16"),
            "{e}"
        );
    }

    #[test]
    fn a_configuration_without_a_grant_or_malformed_gives_no_remap() {
        let c = cfg(("10.244.0.0/16", "10.70.0.0/16"), None);
        assert_eq!(Remap::of(&c), Err(BadConfiguration::NotGranted("pod")));
        assert_eq!(Remaps::of(&c), Err(BadConfiguration::NotGranted("pod")));
        let c = cfg(
            ("10.244.0.0/16", "10.70.0.0/16"),
            Some(("10.71.0.0/16", "10.72.0.0/24")),
        );
        assert!(Remap::of(&c).is_ok());
        assert!(matches!(
            Remaps::of(&c),
            Err(BadConfiguration::SizeMismatch {
                role: "external",
                ..
            })
        ));
        // A malformed CIDR never gets this far: it is not a Configuration (and the CRD's
        // rules refuse it before it is stored).
        let bad = serde_json::json!({"apiVersion": "networking.fabric.io/v1alpha1",
            "kind": "Configuration", "metadata": {"name": "b"},
            "spec": {"clusterId": "b", "remote": {"pod": "10.71.0.0/33", "external": "10.72.0.0/16"}}});
        let err = serde_json::from_value::<Configuration>(bad).unwrap_err();
        assert!(err.to_string().contains("prefix"), "{err}");
    }
}
