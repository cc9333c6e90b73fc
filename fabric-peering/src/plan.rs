//! What a peering creates on each side, as a pure function of the two clusters' identities,
//! their gateways' identities and which side listens.
use std::{collections::BTreeMap, net::SocketAddr};

use fabric_api::{
    identity::{ClusterIdentity, GatewayIdentity},
    names::label,
    networking::v1alpha1::{
        ClusterCidrs, Configuration, ConfigurationSpec, Endpoint, GatewayClient, GatewayClientSpec,
        GatewayServer, GatewayServerSpec, PublicKey, PublicKeySpec, ServiceType,
    },
};
use kube::api::ObjectMeta;

use crate::Side;

/// Tunnel MTU of both gateways: leaves room for WireGuard on a 1500-byte underlay.
pub const TUNNEL_MTU: i32 = 1420;

/// Everything one cluster holds about a peer; every object is named after the peer and
/// labelled with it.
#[derive(Clone, Debug)]
pub struct PeerObjects {
    pub configuration: Configuration,
    pub public_key: PublicKey,
    pub gateway: GatewayRole,
}

/// The cluster's end of the tunnel to the peer.
#[derive(Clone, Debug)]
pub enum GatewayRole {
    /// This side dials the peer's gateway.
    Client(GatewayClient),
    /// The peer dials this side's gateway.
    Server(GatewayServer),
}

/// The objects of a peering on both sides.
#[derive(Clone, Debug)]
pub struct Plan {
    /// To create in the local cluster: everything about the remote one.
    pub local: PeerObjects,
    /// To create in the remote cluster: everything about the local one.
    pub remote: PeerObjects,
}

/// One side of a peering as the other needs to know it.
#[derive(Clone, Copy, Debug)]
pub struct Member<'a> {
    pub cluster: &'a ClusterIdentity,
    pub gateway: &'a GatewayIdentity,
}

/// The objects that peer `local` and `remote`, with `server`'s gateway listening on its
/// advertised endpoint and the other dialing it.
pub fn plan(local: Member<'_>, remote: Member<'_>, server: Side) -> Plan {
    let (local_dials, remote_dials) = match server {
        Side::Remote => (Some(remote.gateway.endpoint), None),
        Side::Local => (None, Some(local.gateway.endpoint)),
    };
    Plan {
        local: peer_objects(remote, local_dials, local.gateway.endpoint.port()),
        remote: peer_objects(local, remote_dials, remote.gateway.endpoint.port()),
    }
}

/// The pod and external CIDRs a peer learns about a cluster.
pub fn cidrs(c: &ClusterIdentity) -> ClusterCidrs {
    ClusterCidrs {
        pod: c.pod_cidr.to_string(),
        external: c.external_cidr.to_string(),
    }
}

/// Labels every object about `peer` carries.
pub fn peer_selector(peer: &str) -> String {
    format!("{}={peer}", label::PEER)
}

/// What a cluster holds about `there`: a client dialing `dial`, or else a server listening on
/// `own_port` (the port this cluster's gateway advertises).
fn peer_objects(there: Member<'_>, dial: Option<SocketAddr>, own_port: u16) -> PeerObjects {
    let id = &there.cluster.cluster_id;
    let meta = || ObjectMeta {
        name: Some(id.clone()),
        labels: Some(BTreeMap::from([(label::PEER.to_owned(), id.clone())])),
        ..Default::default()
    };
    let gateway = match dial {
        Some(ep) => GatewayRole::Client(GatewayClient {
            metadata: meta(),
            spec: GatewayClientSpec {
                cluster_id: id.clone(),
                endpoint: Endpoint {
                    addresses: vec![ep.ip().to_string()],
                    port: i32::from(ep.port()),
                },
                mtu: TUNNEL_MTU,
            },
            status: None,
        }),
        None => GatewayRole::Server(GatewayServer {
            metadata: meta(),
            spec: GatewayServerSpec {
                cluster_id: id.clone(),
                service_type: ServiceType::NodePort,
                port: i32::from(own_port),
                mtu: TUNNEL_MTU,
            },
            status: None,
        }),
    };
    PeerObjects {
        configuration: Configuration {
            metadata: meta(),
            spec: ConfigurationSpec {
                cluster_id: id.clone(),
                remote: cidrs(there.cluster),
            },
            status: None,
        },
        public_key: PublicKey {
            metadata: meta(),
            spec: PublicKeySpec {
                cluster_id: id.clone(),
                public_key: there.gateway.public_key.clone(),
            },
        },
        gateway,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(id: &str, pod: &str) -> ClusterIdentity {
        ClusterIdentity::from_data(&BTreeMap::from(
            [
                ("FABRIC_CLUSTER_ID", id),
                ("FABRIC_POD_CIDR", pod),
                ("FABRIC_SERVICE_CIDR", "10.96.0.0/12"),
                ("FABRIC_EXTERNAL_CIDR", "10.70.0.0/16"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned())),
        ))
        .unwrap()
    }

    fn gateway(key: char, endpoint: &str) -> GatewayIdentity {
        GatewayIdentity {
            public_key: format!("{}=", key.to_string().repeat(43)),
            endpoint: endpoint.parse().unwrap(),
        }
    }

    struct Pair {
        a: ClusterIdentity,
        b: ClusterIdentity,
        ga: GatewayIdentity,
        gb: GatewayIdentity,
    }

    impl Pair {
        fn new() -> Self {
            Self {
                a: identity("cluster-a", "10.244.0.0/16"),
                b: identity("cluster-b", "10.245.0.0/16"),
                ga: gateway('A', "192.0.2.10:31820"),
                gb: gateway('B', "198.51.100.7:32001"),
            }
        }
        fn plan(&self, server: Side) -> Plan {
            plan(
                Member {
                    cluster: &self.a,
                    gateway: &self.ga,
                },
                Member {
                    cluster: &self.b,
                    gateway: &self.gb,
                },
                server,
            )
        }
    }

    fn metas(o: &PeerObjects) -> [&ObjectMeta; 3] {
        let gw = match &o.gateway {
            GatewayRole::Client(c) => &c.metadata,
            GatewayRole::Server(s) => &s.metadata,
        };
        [&o.configuration.metadata, &o.public_key.metadata, gw]
    }

    #[test]
    fn each_side_describes_the_other() {
        let p = Pair::new();
        let plan = p.plan(Side::Remote);
        assert_eq!(plan.local.configuration.spec.cluster_id, "cluster-b");
        assert_eq!(plan.local.configuration.spec.remote.pod, "10.245.0.0/16");
        assert_eq!(
            plan.local.configuration.spec.remote.external,
            "10.70.0.0/16"
        );
        assert_eq!(plan.local.public_key.spec.public_key, p.gb.public_key);
        assert_eq!(plan.remote.configuration.spec.cluster_id, "cluster-a");
        assert_eq!(plan.remote.configuration.spec.remote.pod, "10.244.0.0/16");
        assert_eq!(plan.remote.public_key.spec.public_key, p.ga.public_key);
        let named_and_labelled = |m: &&ObjectMeta, id: &str| {
            m.name.as_deref() == Some(id)
                && m.labels == Some(BTreeMap::from([(label::PEER.to_owned(), id.to_owned())]))
        };
        assert!(
            metas(&plan.local)
                .iter()
                .all(|m| named_and_labelled(m, "cluster-b"))
        );
        assert!(
            metas(&plan.remote)
                .iter()
                .all(|m| named_and_labelled(m, "cluster-a"))
        );
    }

    #[test]
    fn the_server_listens_on_its_advertised_port_and_the_client_dials_it() {
        let p = Pair::new();
        let plan = p.plan(Side::Remote);
        let GatewayRole::Client(c) = &plan.local.gateway else {
            panic!(
                "the local side dials a remote server: {:?}",
                plan.local.gateway
            )
        };
        assert_eq!(c.spec.endpoint.addresses, ["198.51.100.7"]);
        assert_eq!(c.spec.endpoint.port, 32001);
        assert_eq!(c.spec.mtu, TUNNEL_MTU);
        let GatewayRole::Server(s) = &plan.remote.gateway else {
            panic!("the remote side listens: {:?}", plan.remote.gateway)
        };
        assert_eq!(
            (s.spec.port, s.spec.service_type),
            (32001, ServiceType::NodePort)
        );

        let plan = p.plan(Side::Local);
        let GatewayRole::Server(s) = &plan.local.gateway else {
            panic!("the local side listens: {:?}", plan.local.gateway)
        };
        assert_eq!(s.spec.port, 31820);
        let GatewayRole::Client(c) = &plan.remote.gateway else {
            panic!("the remote side dials: {:?}", plan.remote.gateway)
        };
        assert_eq!(c.spec.endpoint.addresses, ["192.0.2.10"]);
        assert_eq!(c.spec.endpoint.port, 31820);
    }

    #[test]
    fn ipv6_endpoints_lose_their_brackets() {
        let mut p = Pair::new();
        p.gb.endpoint = "[2001:db8::7]:51820".parse().unwrap();
        let GatewayRole::Client(c) = p.plan(Side::Remote).local.gateway else {
            panic!("client expected")
        };
        assert_eq!(c.spec.endpoint.addresses, ["2001:db8::7"]);
        assert_eq!(c.spec.endpoint.port, 51820);
    }

    #[test]
    fn selector_matches_the_label() {
        assert_eq!(
            peer_selector("cluster-b"),
            "networking.fabric.io/peer=cluster-b"
        );
    }
}
