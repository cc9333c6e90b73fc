//! Who a cluster is to its peers, and where its gateway is reached.
//!
//! [`ClusterIdentity`] is what `deploy/fabric-cluster.env` puts into the `fabric-cluster`
//! ConfigMap (also the controllers' environment); [`GatewayIdentity`] is what the active
//! gateway operator publishes in `fabric-gateway-identity` for peering. Both parse and
//! validate the untyped ConfigMap data here, once, and say which key is wrong and why.
use std::{
    collections::BTreeMap,
    net::{AddrParseError, SocketAddr},
};

use ipnetwork::{IpNetworkError, Ipv4Network};

/// Keys of the `fabric-cluster` ConfigMap: the variables of `deploy/fabric-cluster.env`.
pub mod cluster_key {
    /// The cluster's name among its peers: a DNS label, unique across peered clusters.
    pub const CLUSTER_ID: &str = "FABRIC_CLUSTER_ID";
    pub const POD_CIDR: &str = "FABRIC_POD_CIDR";
    pub const SERVICE_CIDR: &str = "FABRIC_SERVICE_CIDR";
    pub const EXTERNAL_CIDR: &str = "FABRIC_EXTERNAL_CIDR";
    /// Further ranges in use in the cluster, comma separated; may be empty or absent.
    pub const RESERVED: &str = "FABRIC_RESERVED";
    /// Where remapped CIDRs for clashing peers come from, comma separated; absent or empty
    /// means [`DEFAULT_POOLS`](super::DEFAULT_POOLS).
    pub const POOLS: &str = "FABRIC_POOLS";
    /// Where peers reach the cluster's gateway (address:port); optional.
    pub const GATEWAY_ENDPOINT: &str = "FABRIC_GATEWAY_ENDPOINT";
}

/// Keys of the `fabric-gateway-identity` ConfigMap.
pub mod gateway_key {
    /// The gateway's WireGuard public key (base64).
    pub const PUBLIC_KEY: &str = "publicKey";
    /// Where peers reach the gateway (address:port).
    pub const ENDPOINT: &str = "endpoint";
}

/// The pools remapped CIDRs come from when the cluster names none.
pub const DEFAULT_POOLS: &str = "10.64.0.0/10";

/// A cluster's identity: its id and networks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterIdentity {
    /// A DNS label, unique across peered clusters.
    pub cluster_id: String,
    pub pod_cidr: Ipv4Network,
    pub service_cidr: Ipv4Network,
    /// The addresses under which the cluster exposes non-pod IPs to peers.
    pub external_cidr: Ipv4Network,
    /// Further ranges in use in the cluster (node subnets, ...): never handed out to peers.
    pub reserved: Vec<Ipv4Network>,
    /// Where remapped CIDRs for clashing peers come from.
    pub pools: Vec<Ipv4Network>,
    /// Where peers reach the cluster's gateway, when declared here.
    pub gateway_endpoint: Option<SocketAddr>,
}

/// What is wrong with an identity's data; each names the key and the offending value.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdentityError {
    #[error("{key} is missing or empty")]
    Missing { key: &'static str },
    #[error(
        "{key}={value:?} is not a DNS label (at most 63 lowercase letters, digits and '-', \
         starting and ending with a letter or digit)"
    )]
    BadClusterId { key: &'static str, value: String },
    #[error("{key}={value:?}: {item:?} is not an IPv4 CIDR such as 10.244.0.0/16")]
    BadCidr {
        key: &'static str,
        value: String,
        item: String,
        #[source]
        source: IpNetworkError,
    },
    #[error("{key}={value:?} is not address:port such as 192.0.2.10:31820")]
    BadEndpoint {
        key: &'static str,
        value: String,
        #[source]
        source: AddrParseError,
    },
    #[error("{key}={value:?} is not a WireGuard key (32 bytes in base64)")]
    BadKey { key: &'static str, value: String },
    #[error(
        "{key}={value} overlaps {other_key}={other}: a cluster's pod, service and external \
         CIDRs must be disjoint"
    )]
    Overlap {
        key: &'static str,
        value: Ipv4Network,
        other_key: &'static str,
        other: Ipv4Network,
    },
}

impl ClusterIdentity {
    /// Parses and validates the `fabric-cluster` ConfigMap's data.
    pub fn from_data(data: &BTreeMap<String, String>) -> Result<Self, IdentityError> {
        Self::from_lookup(|k| data.get(k).cloned())
    }

    /// Parses and validates the identity from any source of the same keys (a ConfigMap, the
    /// environment).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, IdentityError> {
        use cluster_key::*;
        let value = |key: &'static str| get(key).map(|v| v.trim().to_owned());
        let required = |key: &'static str| {
            value(key)
                .filter(|v| !v.is_empty())
                .ok_or(IdentityError::Missing { key })
        };
        let cidr = |key: &'static str| {
            let v = required(key)?;
            parse_cidr(key, &v, &v)
        };
        let cluster_id = required(CLUSTER_ID)?;
        if !is_dns_label(&cluster_id) {
            return Err(IdentityError::BadClusterId {
                key: CLUSTER_ID,
                value: cluster_id,
            });
        }
        let own = [
            (POD_CIDR, cidr(POD_CIDR)?),
            (SERVICE_CIDR, cidr(SERVICE_CIDR)?),
            (EXTERNAL_CIDR, cidr(EXTERNAL_CIDR)?),
        ];
        for (i, &(key, value)) in own.iter().enumerate() {
            if let Some(&(other_key, other)) = own[i + 1..].iter().find(|(_, o)| o.overlaps(value))
            {
                return Err(IdentityError::Overlap {
                    key,
                    value,
                    other_key,
                    other,
                });
            }
        }
        let reserved = cidr_list(RESERVED, &value(RESERVED).unwrap_or_default())?;
        let mut pools = cidr_list(POOLS, &value(POOLS).unwrap_or_default())?;
        if pools.is_empty() {
            pools = cidr_list(POOLS, DEFAULT_POOLS)?;
        }
        let gateway_endpoint = match value(GATEWAY_ENDPOINT).filter(|v| !v.is_empty()) {
            None => None,
            Some(v) => Some(parse_endpoint(GATEWAY_ENDPOINT, v)?),
        };
        Ok(Self {
            cluster_id,
            pod_cidr: own[0].1,
            service_cidr: own[1].1,
            external_cidr: own[2].1,
            reserved,
            pools,
            gateway_endpoint,
        })
    }

    /// The ConfigMap data this identity parses from.
    pub fn to_data(&self) -> BTreeMap<String, String> {
        use cluster_key::*;
        let list = |l: &[Ipv4Network]| {
            l.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut data = BTreeMap::from([
            (CLUSTER_ID.to_owned(), self.cluster_id.clone()),
            (POD_CIDR.to_owned(), self.pod_cidr.to_string()),
            (SERVICE_CIDR.to_owned(), self.service_cidr.to_string()),
            (EXTERNAL_CIDR.to_owned(), self.external_cidr.to_string()),
            (RESERVED.to_owned(), list(&self.reserved)),
            (POOLS.to_owned(), list(&self.pools)),
        ]);
        if let Some(e) = self.gateway_endpoint {
            data.insert(GATEWAY_ENDPOINT.to_owned(), e.to_string());
        }
        data
    }
}

/// What the active gateway operator publishes for peering: the gateway's public key and
/// where peers reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewayIdentity {
    pub public_key: String,
    pub endpoint: SocketAddr,
}

impl GatewayIdentity {
    /// Parses and validates the `fabric-gateway-identity` ConfigMap's data.
    pub fn from_data(data: &BTreeMap<String, String>) -> Result<Self, IdentityError> {
        use gateway_key::*;
        let required = |key: &'static str| {
            data.get(key)
                .map(|v| v.trim())
                .filter(|v| !v.is_empty())
                .ok_or(IdentityError::Missing { key })
        };
        let public_key = required(PUBLIC_KEY)?;
        if !is_wireguard_key(public_key) {
            return Err(IdentityError::BadKey {
                key: PUBLIC_KEY,
                value: public_key.to_owned(),
            });
        }
        Ok(Self {
            public_key: public_key.to_owned(),
            endpoint: parse_endpoint(ENDPOINT, required(ENDPOINT)?.to_owned())?,
        })
    }

    pub fn to_data(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (gateway_key::PUBLIC_KEY.to_owned(), self.public_key.clone()),
            (gateway_key::ENDPOINT.to_owned(), self.endpoint.to_string()),
        ])
    }
}

fn parse_cidr(key: &'static str, value: &str, item: &str) -> Result<Ipv4Network, IdentityError> {
    item.parse().map_err(|source| IdentityError::BadCidr {
        key,
        value: value.to_owned(),
        item: item.to_owned(),
        source,
    })
}

/// A comma-separated list of CIDRs; empty items (as in `FABRIC_RESERVED=`) are skipped.
fn cidr_list(key: &'static str, value: &str) -> Result<Vec<Ipv4Network>, IdentityError> {
    value
        .split(',')
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .map(|i| parse_cidr(key, value, i))
        .collect()
}

fn parse_endpoint(key: &'static str, value: String) -> Result<SocketAddr, IdentityError> {
    value
        .parse()
        .map_err(|source| IdentityError::BadEndpoint { key, value, source })
}

/// The rule the CRDs apply to cluster ids: an RFC 1123 label.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    let inner = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-';
    !b.is_empty() && b.len() <= 63 && b.iter().all(inner) && b[0] != b'-' && b[b.len() - 1] != b'-'
}

/// The rule the `PublicKey` CRD applies: 32 bytes in padded base64 (43 characters and '=',
/// the last of them carrying only 4 bits).
pub fn is_wireguard_key(s: &str) -> bool {
    let b = s.as_bytes();
    let b64 = |c: &u8| c.is_ascii_alphanumeric() || *c == b'+' || *c == b'/';
    b.len() == 44
        && b[..42].iter().all(b64)
        && b"AEIMQUYcgkosw048".contains(&b[42])
        && b[43] == b'='
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> BTreeMap<String, String> {
        // As deploy/fabric-cluster.env has it.
        [
            ("FABRIC_CLUSTER_ID", "cluster-a"),
            ("FABRIC_POD_CIDR", "10.244.0.0/16"),
            ("FABRIC_SERVICE_CIDR", "10.96.0.0/12"),
            ("FABRIC_EXTERNAL_CIDR", "10.70.0.0/16"),
            ("FABRIC_RESERVED", ""),
            ("FABRIC_POOLS", "10.64.0.0/10"),
            ("FABRIC_GATEWAY_ENDPOINT", "192.0.2.10:31820"),
            ("FABRIC_GATEWAY_BUSY_POLL_US", "0"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    fn with(changes: &[(&str, Option<&str>)]) -> Result<ClusterIdentity, IdentityError> {
        let mut d = env();
        for (k, v) in changes {
            match v {
                Some(v) => d.insert((*k).to_owned(), (*v).to_owned()),
                None => d.remove(*k),
            };
        }
        ClusterIdentity::from_data(&d)
    }

    #[test]
    fn parses_the_deployed_env() {
        let id = ClusterIdentity::from_data(&env()).unwrap();
        assert_eq!(id.cluster_id, "cluster-a");
        assert_eq!(id.pod_cidr, "10.244.0.0/16".parse().unwrap());
        assert_eq!(id.service_cidr, "10.96.0.0/12".parse().unwrap());
        assert_eq!(id.external_cidr, "10.70.0.0/16".parse().unwrap());
        assert!(id.reserved.is_empty());
        assert_eq!(id.pools, vec!["10.64.0.0/10".parse().unwrap()]);
        assert_eq!(
            id.gateway_endpoint,
            Some("192.0.2.10:31820".parse().unwrap())
        );
        assert_eq!(ClusterIdentity::from_data(&id.to_data()), Ok(id));
    }

    #[test]
    fn optional_keys_default() {
        let id = with(&[
            ("FABRIC_RESERVED", None),
            ("FABRIC_POOLS", Some(" ")),
            ("FABRIC_GATEWAY_ENDPOINT", None),
        ])
        .unwrap();
        assert!(id.reserved.is_empty());
        assert_eq!(id.pools, vec![DEFAULT_POOLS.parse().unwrap()]);
        assert_eq!(id.gateway_endpoint, None);
        let id = with(&[("FABRIC_RESERVED", Some("192.168.0.0/24, ,172.16.0.0/12"))]).unwrap();
        assert_eq!(
            id.reserved,
            vec![
                "192.168.0.0/24".parse().unwrap(),
                "172.16.0.0/12".parse().unwrap()
            ]
        );
    }

    #[test]
    fn missing_keys_are_named() {
        for key in [
            "FABRIC_CLUSTER_ID",
            "FABRIC_POD_CIDR",
            "FABRIC_SERVICE_CIDR",
            "FABRIC_EXTERNAL_CIDR",
        ] {
            assert_eq!(with(&[(key, None)]), Err(IdentityError::Missing { key }));
            assert_eq!(
                with(&[(key, Some(""))]),
                Err(IdentityError::Missing { key })
            );
        }
        assert_eq!(
            with(&[("FABRIC_POD_CIDR", None)]).unwrap_err().to_string(),
            "FABRIC_POD_CIDR is missing or empty"
        );
    }

    #[test]
    fn bad_values_say_what_is_wrong() {
        let e = with(&[("FABRIC_POD_CIDR", Some("10.244.0.0/33"))]).unwrap_err();
        assert!(
            matches!(&e, IdentityError::BadCidr { key: "FABRIC_POD_CIDR", item, .. } if item == "10.244.0.0/33"),
            "{e:?}"
        );
        assert!(e.to_string().contains("is not an IPv4 CIDR"), "{e}");
        let e = with(&[("FABRIC_EXTERNAL_CIDR", Some("fd00::/64"))]).unwrap_err();
        assert!(matches!(
            e,
            IdentityError::BadCidr {
                key: "FABRIC_EXTERNAL_CIDR",
                ..
            }
        ));
        let e = with(&[("FABRIC_RESERVED", Some("10.1.0.0/16,nope"))]).unwrap_err();
        assert!(
            matches!(&e, IdentityError::BadCidr { key: "FABRIC_RESERVED", item, .. } if item == "nope"),
            "{e:?}"
        );
        let e = with(&[("FABRIC_POOLS", Some("10.64.0.0"))]);
        // A bare address is a /32: valid, if not useful.
        assert_eq!(e.unwrap().pools, vec!["10.64.0.0/32".parse().unwrap()]);
        for bad in ["Cluster-A", "-a", "a-", "a_b", &"a".repeat(64)] {
            assert_eq!(
                with(&[("FABRIC_CLUSTER_ID", Some(bad))]),
                Err(IdentityError::BadClusterId {
                    key: "FABRIC_CLUSTER_ID",
                    value: bad.to_owned()
                })
            );
        }
        let e = with(&[("FABRIC_GATEWAY_ENDPOINT", Some("gw.example.com:31820"))]).unwrap_err();
        assert!(matches!(
            e,
            IdentityError::BadEndpoint {
                key: "FABRIC_GATEWAY_ENDPOINT",
                ..
            }
        ));
        assert!(with(&[("FABRIC_GATEWAY_ENDPOINT", Some("192.0.2.10"))]).is_err());
    }

    #[test]
    fn own_networks_must_be_disjoint() {
        let e = with(&[("FABRIC_EXTERNAL_CIDR", Some("10.244.128.0/17"))]).unwrap_err();
        assert_eq!(
            e,
            IdentityError::Overlap {
                key: "FABRIC_POD_CIDR",
                value: "10.244.0.0/16".parse().unwrap(),
                other_key: "FABRIC_EXTERNAL_CIDR",
                other: "10.244.128.0/17".parse().unwrap(),
            }
        );
        assert!(
            with(&[("FABRIC_SERVICE_CIDR", Some("10.70.0.0/24"))]).is_err(),
            "service inside external"
        );
    }

    #[test]
    fn gateway_identity() {
        let key = "mJsw9r1vXqAbXJH9R0z6C5xkLh3fTKm3rQbU0dVn4kE=";
        let data = |k: &str, e: &str| {
            BTreeMap::from([
                ("publicKey".to_owned(), k.to_owned()),
                ("endpoint".to_owned(), e.to_owned()),
            ])
        };
        let id = GatewayIdentity::from_data(&data(key, "192.0.2.10:31820")).unwrap();
        assert_eq!(id.public_key, key);
        assert_eq!(id.endpoint.port(), 31820);
        assert_eq!(GatewayIdentity::from_data(&id.to_data()), Ok(id));
        assert_eq!(
            GatewayIdentity::from_data(&BTreeMap::new()),
            Err(IdentityError::Missing { key: "publicKey" })
        );
        // The last character before '=' carries 4 bits: 'F' would set bits past 256.
        let bad = format!("{}F=", &key[..42]);
        assert!(matches!(
            GatewayIdentity::from_data(&data(&bad, "192.0.2.10:31820")),
            Err(IdentityError::BadKey { .. })
        ));
        assert!(matches!(
            GatewayIdentity::from_data(&data(key, "192.0.2.10")),
            Err(IdentityError::BadEndpoint {
                key: "endpoint",
                ..
            })
        ));
    }
}
