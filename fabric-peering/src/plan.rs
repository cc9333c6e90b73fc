//! What a peering creates on each side, as a pure function of the two clusters' identities,
//! their gateways' identities and which side listens.
use std::{collections::BTreeMap, net::SocketAddr};

use fabric_api::{
    identity::{ClusterIdentity, GatewayIdentity},
    names::label,
    networking::v1alpha1::{
        ClusterCidrs, Configuration, ConfigurationSpec, Endpoint, GatewayClient, GatewayClientSpec,
        GatewayServer, GatewayServerSpec, PeerNetworkParams, PublicKey, PublicKeySpec, ServiceType,
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
        pod: c.pod_cidr,
        external: c.external_cidr,
    }
}

/// Labels every object about `peer` carries.
pub fn peer_selector(peer: &str) -> String {
    format!("{}={peer}", label::PEER)
}

/// A cluster's side of a peering as the other side learns it over the sharing layer's
/// negotiation (a `PeeringNetwork`): id, real CIDRs, gateway key and where it listens.
pub fn params(m: Member<'_>) -> PeerNetworkParams {
    PeerNetworkParams {
        cluster_id: m.cluster.cluster_id.clone(),
        cidrs: cidrs(m.cluster),
        public_key: m.gateway.public_key.clone(),
        endpoint: Some(endpoint(m.gateway.endpoint)),
    }
}

fn endpoint(ep: SocketAddr) -> Endpoint {
    Endpoint {
        addresses: vec![ep.ip().to_string()],
        port: i32::from(ep.port()),
    }
}

/// The first address of an endpoint with its port, if it is one.
pub fn endpoint_addr(e: &Endpoint) -> Option<SocketAddr> {
    let ip = e.addresses.first()?.parse().ok()?;
    Some(SocketAddr::new(ip, u16::try_from(e.port).ok()?))
}

/// What a cluster holds about a peer it knows by its negotiated parameters: a client dialing
/// `dial`, or else a server listening on `own_port`. The same objects as [`plan`] makes.
pub fn objects_for(
    peer: &PeerNetworkParams,
    dial: Option<SocketAddr>,
    own_port: u16,
) -> PeerObjects {
    objects(
        &peer.cluster_id,
        peer.cidrs.clone(),
        &peer.public_key,
        dial,
        own_port,
    )
}

/// What a cluster holds about `there`: a client dialing `dial`, or else a server listening on
/// `own_port` (the port this cluster's gateway advertises).
fn peer_objects(there: Member<'_>, dial: Option<SocketAddr>, own_port: u16) -> PeerObjects {
    objects(
        &there.cluster.cluster_id,
        cidrs(there.cluster),
        &there.gateway.public_key,
        dial,
        own_port,
    )
}

fn objects(
    id: &str,
    remote: ClusterCidrs,
    public_key: &str,
    dial: Option<SocketAddr>,
    own_port: u16,
) -> PeerObjects {
    let meta = || ObjectMeta {
        name: Some(id.to_owned()),
        labels: Some(BTreeMap::from([(label::PEER.to_owned(), id.to_owned())])),
        ..Default::default()
    };
    let gateway = match dial {
        Some(ep) => GatewayRole::Client(GatewayClient {
            metadata: meta(),
            spec: GatewayClientSpec {
                cluster_id: id.to_owned(),
                endpoint: endpoint(ep),
                mtu: TUNNEL_MTU,
            },
            status: None,
        }),
        None => GatewayRole::Server(GatewayServer {
            metadata: meta(),
            spec: GatewayServerSpec {
                cluster_id: id.to_owned(),
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
                cluster_id: id.to_owned(),
                remote,
            },
            status: None,
        },
        public_key: PublicKey {
            metadata: meta(),
            spec: PublicKeySpec {
                cluster_id: id.to_owned(),
                public_key: public_key.to_owned(),
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
        assert_eq!(
            plan.local.configuration.spec.remote.pod.to_string(),
            "10.245.0.0/16"
        );
        assert_eq!(
            plan.local.configuration.spec.remote.external.to_string(),
            "10.70.0.0/16"
        );
        assert_eq!(plan.local.public_key.spec.public_key, p.gb.public_key);
        assert_eq!(plan.remote.configuration.spec.cluster_id, "cluster-a");
        assert_eq!(
            plan.remote.configuration.spec.remote.pod.to_string(),
            "10.244.0.0/16"
        );
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
    fn negotiated_params_make_the_same_objects_as_the_plan() {
        let p = Pair::new();
        let plan = p.plan(Side::Remote);
        let b = params(Member {
            cluster: &p.b,
            gateway: &p.gb,
        });
        let dial = endpoint_addr(b.endpoint.as_ref().unwrap());
        assert_eq!(dial, Some(p.gb.endpoint));
        let local = objects_for(&b, dial, 0);
        assert_eq!(local.configuration.spec, plan.local.configuration.spec);
        assert_eq!(
            local.configuration.metadata,
            plan.local.configuration.metadata
        );
        assert_eq!(local.public_key.spec, plan.local.public_key.spec);
        let (GatewayRole::Client(x), GatewayRole::Client(y)) =
            (&local.gateway, &plan.local.gateway)
        else {
            panic!("both dial")
        };
        assert_eq!((&x.spec, &x.metadata), (&y.spec, &y.metadata));
        let a = params(Member {
            cluster: &p.a,
            gateway: &p.ga,
        });
        let remote = objects_for(&a, None, p.gb.endpoint.port());
        let (GatewayRole::Server(x), GatewayRole::Server(y)) =
            (&remote.gateway, &plan.remote.gateway)
        else {
            panic!("both listen")
        };
        assert_eq!((&x.spec, &x.metadata), (&y.spec, &y.metadata));
        assert_eq!(remote.configuration.spec, plan.remote.configuration.spec);
    }

    #[test]
    fn selector_matches_the_label() {
        assert_eq!(
            peer_selector("cluster-b"),
            "networking.fabric.io/peer=cluster-b"
        );
    }
}
