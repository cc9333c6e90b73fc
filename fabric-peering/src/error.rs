use std::fmt;

use fabric_api::{identity::IdentityError, names::config_map};

use crate::Side;

/// Why a peering failed, and what to check.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reaching the {side} cluster")]
    Unreachable {
        side: Side,
        #[source]
        source: kube::Error,
    },
    #[error(
        "the {side} cluster has no {namespace}/{} ConfigMap: is the fabric installed there? \
         (kubectl apply -k deploy/)",
        config_map::CLUSTER
    )]
    NotInstalled { side: Side, namespace: String },
    #[error(
        "the {side} cluster's {namespace}/{} ConfigMap is invalid (fix \
         deploy/fabric-cluster.env and apply it again)",
        config_map::CLUSTER
    )]
    BadIdentity {
        side: Side,
        namespace: String,
        #[source]
        source: IdentityError,
    },
    #[error(
        "both clusters call themselves {id:?}: set a distinct FABRIC_CLUSTER_ID in each \
         {namespace}/{}",
        config_map::CLUSTER
    )]
    SameClusterId { id: String, namespace: String },
    #[error(
        "the {side} gateway published an invalid {namespace}/{} (check the gateway operator's \
         --advertise, FABRIC_GATEWAY_ENDPOINT)",
        config_map::GATEWAY_IDENTITY
    )]
    BadGatewayIdentity {
        side: Side,
        namespace: String,
        #[source]
        source: IdentityError,
    },
    #[error("{action} {kind} {name} in the {side} cluster")]
    Api {
        action: Action,
        kind: String,
        name: String,
        side: Side,
        #[source]
        source: kube::Error,
    },
    #[error("generating a gateway key for the {side} cluster")]
    KeyGeneration {
        side: Side,
        #[source]
        source: fabric_gateway_api::KeyError,
    },
    #[error("timed out waiting for {0}")]
    Timeout(Wait),
}

/// What an API call that failed was doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Reading,
    Creating,
    Deleting,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Action::Reading => "reading",
            Action::Creating => "creating",
            Action::Deleting => "deleting",
        })
    }
}

/// What a peering waits for from the components of a cluster; each says which one to check
/// when it does not come.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wait {
    /// The gateway operator publishes the gateway's key and endpoint.
    GatewayIdentity { side: Side, namespace: String },
    /// IPAM grants the CIDRs the peer is seen under.
    Ipam { side: Side, peer: String },
    /// The gateway reports the tunnel to the peer as connected.
    Tunnel { side: Side, peer: String },
    /// IPAM and the gateway let go of a deleted peer.
    Release { side: Side, peer: String },
}

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Wait::GatewayIdentity { side, namespace } => write!(
                f,
                "the {side} gateway to publish its key and endpoint ({namespace}/{}); is \
                 fabric-gateway running there?",
                config_map::GATEWAY_IDENTITY
            ),
            Wait::Ipam { side, peer } => write!(
                f,
                "the {side} cluster's IPAM to grant CIDRs for {peer} (is fabric-controller \
                 running?)"
            ),
            Wait::Tunnel { side, peer } => {
                write!(f, "the tunnel from the {side} cluster to {peer}")
            }
            Wait::Release { side, peer } => write!(
                f,
                "the {side} cluster to release {peer} (IPAM finalizer, gateway)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_say_what_to_check() {
        let e = Error::NotInstalled {
            side: Side::Remote,
            namespace: "fabric-system".into(),
        };
        assert_eq!(
            e.to_string(),
            "the remote cluster has no fabric-system/fabric-cluster ConfigMap: is the fabric \
             installed there? (kubectl apply -k deploy/)"
        );
        let e = Error::Timeout(Wait::GatewayIdentity {
            side: Side::Local,
            namespace: "ns".into(),
        });
        assert!(
            e.to_string()
                .ends_with("(ns/fabric-gateway-identity); is fabric-gateway running there?"),
            "{e}"
        );
        let e = Error::BadIdentity {
            side: Side::Local,
            namespace: "ns".into(),
            source: IdentityError::Missing {
                key: "FABRIC_POD_CIDR",
            },
        };
        assert_eq!(
            e.to_string(),
            "the local cluster's ns/fabric-cluster ConfigMap is invalid (fix \
             deploy/fabric-cluster.env and apply it again)"
        );
        assert_eq!(
            std::error::Error::source(&e).unwrap().to_string(),
            "FABRIC_POD_CIDR is missing or empty"
        );
    }
}
