//! The provider's pod addresses as this (consumer) cluster reaches them: the fabric's IPAM
//! granted a CIDR under which the peer's pod CIDR is seen here (the peer's `Configuration`:
//! real CIDRs in spec, remapped ones in status). An offloaded pod's IP is reported home
//! through that remap, so `kubectl get pod -o wide` shows the address the consumer's pods
//! can use.
//!
//! The remap is computed once per change of the Configuration ([`Remap::current`]); a
//! Configuration that gives none for another reason than a grant still to come is said as
//! what it is wherever an address is missing, not as "not configured yet".
use std::net::Ipv4Addr;

pub use fabric_api::networking::remap::{BadConfiguration, Remap};
use fabric_api::networking::v1alpha1::Configuration;
use ipnetwork::Ipv4Network;

/// Why a provider pod IP has no address here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Untranslatable {
    #[error("the network to the provider is not configured yet (no remapped pod CIDR)")]
    NoRemap,
    #[error("the peer's Configuration gives no remap of its pod CIDR: {0}")]
    BadConfiguration(BadConfiguration),
    #[error("{0:?} is not an IPv4 address")]
    NotIpv4(String),
    #[error("{ip} is outside the provider's pod CIDR {real}: it cannot be reached from here")]
    OutOfRange { ip: Ipv4Addr, real: Ipv4Network },
}

/// The remap of the peer's Configuration `cfg`, if there is one yet, or why there is none:
/// what every address is translated with until the Configuration changes.
pub fn current(cfg: Option<&Configuration>) -> Result<Remap, Untranslatable> {
    match cfg.map(Remap::of) {
        None | Some(Err(BadConfiguration::NotGranted(_))) => Err(Untranslatable::NoRemap),
        Some(Err(e)) => Err(Untranslatable::BadConfiguration(e)),
        Some(Ok(r)) => Ok(r),
    }
}

/// `ip` (a provider pod address) as seen here through `remap`: the remapped network, the
/// same host part.
pub fn translate(remap: &Remap, ip: &str) -> Result<Ipv4Addr, Untranslatable> {
    let addr: Ipv4Addr = ip
        .parse()
        .map_err(|_| Untranslatable::NotIpv4(ip.to_owned()))?;
    remap.map(addr).ok_or(Untranslatable::OutOfRange {
        ip: addr,
        real: remap.real,
    })
}

/// `ip` through `remap`, if there is one; else why there is none.
pub fn to_home(
    ip: &str,
    remap: Result<&Remap, &Untranslatable>,
) -> Result<Ipv4Addr, Untranslatable> {
    translate(remap.map_err(Clone::clone)?, ip)
}

#[cfg(test)]
mod tests {
    use fabric_api::networking::v1alpha1::{ClusterCidrs, ConfigurationSpec, ConfigurationStatus};

    use super::*;

    fn cidrs(pod: &str) -> ClusterCidrs {
        ClusterCidrs {
            pod: pod.parse().unwrap(),
            external: "10.70.0.0/16".parse().unwrap(),
        }
    }

    fn cfg(real: &str, seen: Option<&str>) -> Configuration {
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
        let r = Remap::of(&cfg("10.244.0.0/16", Some("10.71.0.0/16"))).unwrap();
        assert_eq!(
            to_home("10.244.2.7", Ok(&r)),
            Ok(Ipv4Addr::new(10, 71, 2, 7))
        );
        let r = Remap::of(&cfg("192.168.16.0/20", Some("10.80.32.0/20"))).unwrap();
        assert_eq!(
            translate(&r, "192.168.31.255"),
            Ok("10.80.47.255".parse().unwrap())
        );
    }

    #[test]
    fn without_a_clash_the_address_is_the_real_one() {
        let r = Remap::of(&cfg("10.245.0.0/16", Some("10.245.0.0/16"))).unwrap();
        assert_eq!(
            translate(&r, "10.245.3.4"),
            Ok(Ipv4Addr::new(10, 245, 3, 4))
        );
    }

    #[test]
    fn an_address_outside_the_pod_cidr_is_not_reported() {
        let r = Remap::of(&cfg("10.244.0.0/16", Some("10.71.0.0/16"))).unwrap();
        // A host-network pod, say: its node address means nothing here.
        assert!(matches!(
            translate(&r, "192.0.2.10"),
            Err(Untranslatable::OutOfRange { .. })
        ));
        assert!(matches!(
            translate(&r, "fd00::1"),
            Err(Untranslatable::NotIpv4(_))
        ));
        assert_eq!(
            to_home("10.244.0.1", Err(&Untranslatable::NoRemap)),
            Err(Untranslatable::NoRemap)
        );
    }

    #[test]
    fn a_configuration_without_a_grant_gives_no_remap() {
        assert_eq!(
            Remap::of(&cfg("10.244.0.0/16", None)),
            Err(BadConfiguration::NotGranted("pod"))
        );
        assert!(matches!(
            Remap::of(&cfg("10.244.0.0/16", Some("10.71.0.0/24"))),
            Err(BadConfiguration::SizeMismatch { .. })
        ));
    }

    #[test]
    fn a_malformed_configuration_is_said_as_such_not_as_not_configured_yet() {
        // No Configuration, or one whose grant is still to come: not configured yet.
        assert_eq!(current(None), Err(Untranslatable::NoRemap));
        let waiting = cfg("10.244.0.0/16", None);
        assert_eq!(current(Some(&waiting)), Err(Untranslatable::NoRemap));
        // A granted CIDR not the real one's size: what is wrong. (One that is no CIDR is
        // no Configuration: the API types carry CIDRs typed.)
        let smaller = cfg("10.244.0.0/16", Some("10.71.0.0/24"));
        let e = current(Some(&smaller)).unwrap_err();
        assert_eq!(to_home("10.244.0.1", Err(&e)), Err(e.clone()));
        assert!(e.to_string().contains("10.71.0.0/24"), "{e}");
        assert!(matches!(
            current(Some(&smaller)),
            Err(Untranslatable::BadConfiguration(
                BadConfiguration::SizeMismatch { .. }
            ))
        ));
        let good = cfg("10.244.0.0/16", Some("10.71.0.0/16"));
        assert_eq!(
            current(Some(&good)).and_then(|r| translate(&r, "10.244.0.1")),
            Ok(Ipv4Addr::new(10, 71, 0, 1))
        );
    }
}
