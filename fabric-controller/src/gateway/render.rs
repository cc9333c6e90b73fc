//! Rendering, free of I/O: the peers as the API describes them (Configurations with their
//! grants, PublicKeys, GatewayClients, `IP`s) joined into the gateway's configuration, built
//! with `fabric-gateway-api`'s builders and validated as the gateway validates it.
use std::{borrow::Borrow, net::Ipv4Addr};

use fabric_api::networking::v1alpha1::{Configuration, GatewayClient, IP, PublicKey};
use fabric_gateway_api::{Config, ConfigError, PeerConfig};
use ipnetwork::Ipv4Network;

use super::Opts;

/// One peer as the gateway needs it, assembled from the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerView {
    pub cluster_id: String,
    pub peer_id: u32,
    pub public_key: String,
    pub endpoint: Option<String>,
    pub real_pod: String,
    pub real_external: String,
    pub seen_pod: String,
    pub seen_external: String,
}

/// Joins Configurations (with grants), PublicKeys and GatewayClients by cluster id. Peers
/// missing a grant or a key are left out until they have one.
pub fn peers(
    cfgs: &[impl Borrow<Configuration>],
    keys: &[impl Borrow<PublicKey>],
    clients: &[impl Borrow<GatewayClient>],
) -> Vec<PeerView> {
    let keys: Vec<&PublicKey> = keys.iter().map(Borrow::borrow).collect();
    let clients: Vec<&GatewayClient> = clients.iter().map(Borrow::borrow).collect();
    let mut out: Vec<PeerView> = cfgs
        .iter()
        .map(Borrow::borrow)
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .filter_map(|c| {
            let st = c.status.as_ref()?;
            let seen = st.remote.as_ref()?;
            let id = c.spec.cluster_id.clone();
            let key = keys.iter().find(|k| k.spec.cluster_id == id)?;
            let endpoint = clients
                .iter()
                .find(|g| g.spec.cluster_id == id)
                .and_then(|g| {
                    g.spec
                        .endpoint
                        .addresses
                        .first()
                        .map(|a| format!("{a}:{}", g.spec.endpoint.port))
                });
            Some(PeerView {
                peer_id: u32::try_from(st.peer_id?).ok()?,
                public_key: key.spec.public_key.clone(),
                endpoint,
                real_pod: c.spec.remote.pod.clone(),
                real_external: c.spec.remote.external.clone(),
                seen_pod: seen.pod.clone(),
                seen_external: seen.external.clone(),
                cluster_id: id,
            })
        })
        .collect();
    out.sort_by(|a, b| a.cluster_id.cmp(&b.cluster_id));
    out
}

/// The /30 that both ends of a tunnel derive from the pair of cluster ids, without talking:
/// the listening side takes .1, the dialing side .2. Their addresses carry the in-tunnel
/// health probe (Up/Down, latency, and the quick re-handshake after a peer restarts).
pub fn tunnel_addrs(a: &str, b: &str) -> (std::net::Ipv4Addr, std::net::Ipv4Addr) {
    let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
    // FNV-1a: stable across builds and platforms, unlike std's hasher.
    let mut h: u32 = 0x811c9dc5;
    for byte in lo.bytes().chain([b'/']).chain(hi.bytes()) {
        h ^= u32::from(byte);
        h = h.wrapping_mul(0x0100_0193);
    }
    let net = u32::from(std::net::Ipv4Addr::new(169, 254, 0, 0)) + (h % 16384) * 4;
    (
        std::net::Ipv4Addr::from(net + 1),
        std::net::Ipv4Addr::from(net + 2),
    )
}

/// TUN device name for a peer: `fab-` and the cluster id when it fits (IFNAMSIZ: 15 bytes).
/// A longer id is cut and followed by `_` and the peer's id, which IPAM hands out once per
/// peer: two ids sharing a long prefix would otherwise get the same device (and one peer would
/// take the other's tunnel down), and since a cluster id is a DNS label it never contains `_`,
/// so no peer can pick an id whose short form equals another peer's cut one.
pub fn device(cluster_id: &str, peer_id: u32) -> String {
    const IFNAMSIZ: usize = 15;
    let mut d = String::from("fab-");
    if d.len() + cluster_id.len() <= IFNAMSIZ {
        d.push_str(cluster_id);
        return d;
    }
    let suffix = format!("_{peer_id}");
    d.extend(cluster_id.chars().take(IFNAMSIZ - d.len() - suffix.len()));
    d.push_str(&suffix);
    d
}

/// Local IPs exposed to peers: (address in the local external CIDR, the real IP), for `IP`
/// objects whose address has been granted.
pub fn externals(ips: &[impl Borrow<IP>]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = ips
        .iter()
        .map(Borrow::borrow)
        .filter(|i| i.metadata.deletion_timestamp.is_none())
        .filter_map(|i| Some((i.status.as_ref()?.ip.clone()?, i.spec.ip.clone())))
        .collect();
    out.sort();
    out
}

/// What keeps the API's view of the peers from becoming a gateway configuration. The API
/// server's validation refuses most of it; what gets through is reported, never written.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("peer {peer}: {field} {value:?} is not an IPv4 prefix: {source}")]
    Prefix {
        peer: String,
        field: &'static str,
        value: String,
        #[source]
        source: ipnetwork::IpNetworkError,
    },
    #[error("peer {peer}: public key {value:?}: {source}")]
    Key {
        peer: String,
        value: String,
        #[source]
        source: fabric_gateway_api::KeyError,
    },
    #[error("peer {peer}: endpoint {value:?} is not address:port: {source}")]
    Endpoint {
        peer: String,
        value: String,
        #[source]
        source: std::net::AddrParseError,
    },
    #[error("IP {value:?} is not an IPv4 address: {source}")]
    External {
        value: String,
        #[source]
        source: std::net::AddrParseError,
    },
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// The gateway's configuration for these peers, validated as the gateway validates it. `me`
/// is this cluster's id, `pods` its pod CIDRs (all that peers may reach but the exposed IPs and
/// their tunnel addresses).
pub fn render(
    o: &Opts,
    me: &str,
    pods: &[Ipv4Network],
    peers: &[PeerView],
    externals: &[(String, String)],
) -> Result<Config, RenderError> {
    let mut cfg = Config::builder(&o.key_path)
        .name(&o.name)
        .listen_port(o.listen_port)
        .mtu(o.mtu)
        .busy_poll_us(o.busy_poll_us);
    for net in pods {
        cfg = cfg.local_cidr(*net);
    }
    if let Some(pins) = &o.pin_dir {
        cfg = cfg.dataplane_pin_dir(pins);
    }
    let mut used = std::collections::BTreeSet::new();
    for p in peers {
        let prefix = |field: &'static str, value: &str| {
            value
                .parse::<Ipv4Network>()
                .map_err(|source| RenderError::Prefix {
                    peer: p.cluster_id.clone(),
                    field,
                    value: value.to_owned(),
                    source,
                })
        };
        let real_pod = prefix("real pod CIDR", &p.real_pod)?;
        let real_external = prefix("real external CIDR", &p.real_external)?;
        let seen_pod = prefix("granted pod CIDR", &p.seen_pod)?;
        let seen_external = prefix("granted external CIDR", &p.seen_external)?;
        let key = fabric_gateway_api::PublicKey::from_base64(&p.public_key).map_err(|source| {
            RenderError::Key {
                peer: p.cluster_id.clone(),
                value: p.public_key.clone(),
                source,
            }
        })?;
        let mut peer = PeerConfig::builder(&p.cluster_id, key)
            .id(p.peer_id)
            .device(device(&p.cluster_id, p.peer_id))
            .allowed_ips([real_pod, real_external])
            .routes([seen_pod, seen_external])
            .remap(seen_pod, real_pod)
            .remap(seen_external, real_external);
        if let Some(e) = &p.endpoint {
            let endpoint = e.parse().map_err(|source| RenderError::Endpoint {
                peer: p.cluster_id.clone(),
                value: e.clone(),
                source,
            })?;
            // We dial: keep the NAT mapping on the way open.
            peer = peer.endpoint(endpoint).persistent_keepalive(25);
        }
        let (server, client) = tunnel_addrs(me, &p.cluster_id);
        let (mine, theirs) = if p.endpoint.is_some() {
            (client, server)
        } else {
            (server, client)
        };
        // Two peers whose pairs hash to the same /30 would need the same route on two
        // devices: the later one goes without a probe (Up then follows handshakes).
        if used.insert(server) {
            let theirs_net = Ipv4Network::from(theirs);
            peer = peer
                .address(Ipv4Network::from(mine))
                .probe_address(theirs)
                .allowed_ip(theirs_net)
                .route(theirs_net);
        }
        cfg = cfg.peer(peer.build());
    }
    for (external, internal) in externals {
        let host = |value: &String| {
            value
                .parse::<Ipv4Addr>()
                .map(Ipv4Network::from)
                .map_err(|source| RenderError::External {
                    value: value.clone(),
                    source,
                })
        };
        cfg = cfg.external(host(external)?, host(internal)?);
    }
    Ok(cfg.build()?)
}

/// The configuration file's text.
pub fn config_file(cfg: &Config) -> Result<String, ConfigError> {
    Ok(format!(
        "# Written by the fabric gateway operator from the API; edits are overwritten.\n{}",
        cfg.to_toml()?
    ))
}

#[cfg(test)]
mod tests {
    use std::{path::PathBuf, time::Duration};

    use super::*;
    use crate::gateway::Election;

    #[test]
    fn both_ends_derive_the_same_tunnel_addresses() {
        let (s1, c1) = tunnel_addrs("cluster-a", "cluster-b");
        let (s2, c2) = tunnel_addrs("cluster-b", "cluster-a");
        assert_eq!((s1, c1), (s2, c2));
        assert_eq!(u32::from(c1), u32::from(s1) + 1);
        assert_eq!(u32::from(s1) % 4, 1);
        assert!(s1.is_link_local());
        assert_ne!(tunnel_addrs("cluster-a", "cluster-c").0, s1);
    }

    fn opts(pin_dir: Option<&str>) -> Opts {
        Opts {
            namespace: fabric_api::names::DEFAULT_NAMESPACE.into(),
            name: "gw".into(),
            config_path: "/tmp/gw.toml".into(),
            key_path: "/tmp/gw.key".into(),
            control_dir: "/tmp".into(),
            listen_port: 51820,
            mtu: 1420,
            advertise: "192.0.2.1:51820".into(),
            interval: Duration::from_secs(1),
            pin_dir: pin_dir.map(PathBuf::from),
            busy_poll_us: 0,
            overlay: None,
            gateway_ip: None,
            election: Election::new(fabric_api::names::lease::GATEWAY, "gw-0"),
        }
    }

    fn peer_b() -> PeerView {
        PeerView {
            cluster_id: "b".into(),
            peer_id: 1,
            public_key: "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=".into(),
            endpoint: None,
            real_pod: "10.244.0.0/16".into(),
            real_external: "10.70.0.0/16".into(),
            seen_pod: "10.64.0.0/16".into(),
            seen_external: "10.65.0.0/16".into(),
        }
    }

    #[test]
    fn the_interface_follows_the_options() {
        let peer = peer_b();
        let with = render(
            &opts(Some("/sys/fs/bpf/x")),
            "a",
            &["10.244.0.0/16".parse().unwrap()],
            std::slice::from_ref(&peer),
            &[],
        )
        .unwrap();
        // Peers may reach this cluster's pods (and, through the data plane, nothing else).
        let (_, dp) = with.dataplane().unwrap();
        assert_eq!(dp.local_cidrs, ["10.244.0.0/16".parse().unwrap()]);
        assert_eq!(
            with.interface.dataplane_pin_dir,
            Some(PathBuf::from("/sys/fs/bpf/x"))
        );
        assert_eq!(with.interface.name, "gw");
        assert_eq!(
            with.interface.private_key_file,
            PathBuf::from("/tmp/gw.key")
        );
        let without = render(&opts(None), "a", &[], std::slice::from_ref(&peer), &[]).unwrap();
        assert_eq!(without.interface.dataplane_pin_dir, None);
        assert_eq!(without.interface.busy_poll_us, 0);
        let busy = render(
            &Opts {
                busy_poll_us: 20_000,
                ..opts(None)
            },
            "a",
            &[],
            &[peer],
            &[],
        )
        .unwrap();
        assert_eq!(busy.interface.busy_poll_us, 20_000);
        // What a standby replica's gateway gets: the interface and nothing else.
        let standby = render(&opts(None), "", &[], &[], &[]).unwrap();
        assert!(standby.peers.is_empty() && standby.externals.is_empty());
        assert_eq!(standby.interface, without.interface);
    }

    #[test]
    fn what_the_api_should_have_refused_is_not_rendered() {
        let bad = |f: fn(&mut PeerView)| {
            let mut p = peer_b();
            f(&mut p);
            render(&opts(None), "a", &[], &[p], &[]).unwrap_err()
        };
        assert!(matches!(
            bad(|p| p.public_key = "k".into()),
            RenderError::Key { .. }
        ));
        let e = bad(|p| p.seen_pod = "10.64.0.0/33".into());
        assert!(
            matches!(&e, RenderError::Prefix { field, .. } if field.contains("pod")),
            "{e}"
        );
        let e = bad(|p| p.endpoint = Some("gw.example:51820".into()));
        assert!(matches!(e, RenderError::Endpoint { .. }), "{e}");
        // Parsed, but not a configuration the gateway would run.
        let e = bad(|p| p.seen_pod = "10.64.0.0/24".into());
        assert!(matches!(e, RenderError::Config(_)), "{e}");
        let e = render(
            &opts(None),
            "a",
            &[],
            &[],
            &[("x".into(), "10.0.0.1".into())],
        )
        .unwrap_err();
        assert!(matches!(e, RenderError::External { .. }), "{e}");
    }

    #[test]
    fn device_names_fit_and_never_collide() {
        assert_eq!(device("b", 1), "fab-b");
        assert_eq!(device("cluster-abc", 2), "fab-cluster-abc");
        // Long ids sharing a prefix: the peer id tells them apart.
        let a = device("a-very-long-cluster-name-1", 7);
        let b = device("a-very-long-cluster-name-2", 8);
        assert_eq!(a, "fab-a-very-lo_7");
        assert_ne!(a, b);
        assert_eq!(device("a-very-long-cluster-name", 4095), "fab-a-very_4095");
        for d in [&a, &b] {
            assert!(d.len() <= 15, "{d}");
        }
        // A short id can never take a long one's name: DNS labels have no '_'.
        assert!(!device("a-very-l-7", 9).contains('_'));
    }
}
