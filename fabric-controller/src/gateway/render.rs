//! Rendering, free of I/O: the peers as the API describes them (Configurations with their
//! grants, PublicKeys, GatewayClients, `IP`s) joined into the gateway's configuration, built
//! with `fabric-gateway-api`'s builders and validated as the gateway validates it.
use std::{
    borrow::Borrow,
    net::{Ipv4Addr, SocketAddr},
};

use fabric_api::networking::v1alpha1::{Configuration, GatewayClient, IP, PublicKey};
use fabric_gateway_api::{Config, ConfigError, PeerConfig, PublicKey as Key, config::PeerBuilder};
use ipnetwork::Ipv4Network;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::Opts;

/// One peer as the gateway needs it, assembled from the API and read once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerView {
    pub cluster_id: String,
    pub peer_id: u32,
    pub public_key: Key,
    pub endpoint: Option<SocketAddr>,
    pub real_pod: Ipv4Network,
    pub real_external: Ipv4Network,
    pub seen_pod: Ipv4Network,
    pub seen_external: Ipv4Network,
}

/// The peers the API describes: those the gateway can be told of, oldest first, and those
/// it cannot (a value the API server should have refused), with why.
#[derive(Debug, Default)]
pub struct Peers {
    pub views: Vec<PeerView>,
    pub malformed: Vec<Skipped>,
}

impl Peers {
    /// The cluster id of every peer, whether it can run or not.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        let malformed = self.malformed.iter().filter_map(|s| match &s.subject {
            Subject::Peer(id) => Some(id.as_str()),
            Subject::Ip(_) => None,
        });
        self.views
            .iter()
            .map(|p| p.cluster_id.as_str())
            .chain(malformed)
    }
}

/// One peer's view from its Configuration `c` (with its grant `seen`), key and endpoint.
fn view(
    c: &Configuration,
    seen: &fabric_api::networking::v1alpha1::ClusterCidrs,
    peer_id: u32,
    key: &str,
    endpoint: Option<(&str, i32)>,
) -> Result<PeerView, RenderError> {
    let peer = &c.spec.cluster_id;
    let public_key = Key::from_base64(key).map_err(|source| RenderError::Key {
        peer: peer.clone(),
        value: key.to_owned(),
        source,
    })?;
    let endpoint = endpoint
        .map(|(a, port)| {
            a.parse::<std::net::IpAddr>()
                .map(|ip| SocketAddr::new(ip, port as u16))
                .map_err(|source| RenderError::Endpoint {
                    peer: peer.clone(),
                    value: format!("{a}:{port}"),
                    source,
                })
        })
        .transpose()?;
    Ok(PeerView {
        cluster_id: peer.clone(),
        peer_id,
        public_key,
        endpoint,
        real_pod: c.spec.remote.pod,
        real_external: c.spec.remote.external,
        seen_pod: seen.pod,
        seen_external: seen.external,
    })
}

/// Joins Configurations (with grants), PublicKeys and GatewayClients by cluster id. Peers
/// missing a grant or a key are left out until they have one.
pub fn peers(
    cfgs: &[impl Borrow<Configuration>],
    keys: &[impl Borrow<PublicKey>],
    clients: &[impl Borrow<GatewayClient>],
) -> Peers {
    let keys: Vec<&PublicKey> = keys.iter().map(Borrow::borrow).collect();
    let clients: Vec<&GatewayClient> = clients.iter().map(Borrow::borrow).collect();
    let mut out: Vec<(Option<Time>, String, Result<PeerView, RenderError>)> = cfgs
        .iter()
        .map(Borrow::borrow)
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .filter_map(|c| {
            let st = c.status.as_ref()?;
            let seen = st.remote.as_ref()?;
            let id = &c.spec.cluster_id;
            let key = keys.iter().find(|k| k.spec.cluster_id == *id)?;
            let endpoint = clients
                .iter()
                .find(|g| g.spec.cluster_id == *id)
                .and_then(|g| {
                    let a = g.spec.endpoint.addresses.first()?;
                    Some((a.as_str(), g.spec.endpoint.port))
                });
            let peer_id = u32::try_from(st.peer_id?).ok()?;
            Some((
                c.metadata.creation_timestamp.clone(),
                id.clone(),
                view(c, seen, peer_id, &key.spec.public_key, endpoint),
            ))
        })
        .collect();
    // Oldest first: a newcomer that collides with a running peer is the one left out.
    out.sort_by(|(ta, a, _), (tb, b, _)| ta.cmp(tb).then_with(|| a.cmp(b)));
    let mut peers = Peers::default();
    for (_, id, v) in out {
        match v {
            Ok(v) => peers.views.push(v),
            Err(reason) => peers.malformed.push(Skipped {
                subject: Subject::Peer(id),
                reason,
            }),
        }
    }
    peers
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

/// A local IP exposed to peers through an `IP` object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalView {
    /// The `IP` object's name.
    pub name: String,
    /// Its address in the local external CIDR (granted by IPAM).
    pub external: String,
    /// The local IP it stands for.
    pub internal: String,
}

/// Local IPs exposed to peers, for `IP` objects whose address has been granted, oldest first
/// (a newcomer colliding with one already exposed is the one left out).
pub fn externals(ips: &[impl Borrow<IP>]) -> Vec<ExternalView> {
    let mut out: Vec<(Option<Time>, ExternalView)> = ips
        .iter()
        .map(Borrow::borrow)
        .filter(|i| i.metadata.deletion_timestamp.is_none())
        .filter_map(|i| {
            Some((
                i.metadata.creation_timestamp.clone(),
                ExternalView {
                    name: i.metadata.name.clone().unwrap_or_default(),
                    external: i.status.as_ref()?.ip.clone()?,
                    internal: i.spec.ip.clone(),
                },
            ))
        })
        .collect();
    out.sort_by(|(ta, a), (tb, b)| ta.cmp(tb).then_with(|| a.name.cmp(&b.name)));
    out.into_iter().map(|(_, e)| e).collect()
}

/// What keeps the API's view of the peers from becoming a gateway configuration. The API
/// server's validation refuses most of it; what gets through is reported, never written.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
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
    /// Valid alone, but not beside the peers and IPs taken before it (or not at all).
    #[error(transparent)]
    Invalid(#[from] fabric_gateway_api::Invalid),
}

/// Whose resource a part left out of the configuration came from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Subject {
    /// A peer, by cluster id (its Configuration).
    Peer(String),
    /// An `IP` object, by name.
    Ip(String),
}

/// A peer or exposed IP the gateway will not run, and why.
#[derive(Debug)]
pub struct Skipped {
    pub subject: Subject,
    pub reason: RenderError,
}

/// The gateway's configuration, and what was left out of it.
#[derive(Debug)]
pub struct Rendered {
    pub config: Config,
    pub skipped: Vec<Skipped>,
}

/// The gateway's configuration for these peers, validated as the gateway validates it, peer
/// by peer: a peer or exposed IP that could not run (malformed, or colliding with one taken
/// before it: same key, overlapping prefixes, an IP exposed twice) is left out and reported,
/// and the others run. Only an invalid interface (the operator's own options) fails the whole.
/// `me` is this cluster's id, `pods` its pod CIDRs (all that peers may reach but the exposed
/// IPs and their tunnel addresses).
pub fn render(
    o: &Opts,
    me: &str,
    pods: &[Ipv4Network],
    peers: &[PeerView],
    externals: &[ExternalView],
) -> Result<Rendered, RenderError> {
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
    let mut skipped = Vec::new();
    let built: Vec<(&PeerView, PeerBuilder)> = peers.iter().map(|p| (p, peer_config(p))).collect();
    let mut exposed = Vec::new();
    for e in externals {
        match (host(&e.external), host(&e.internal)) {
            (Ok(ext), Ok(int)) => exposed.push((e, ext, int)),
            (Err(reason), _) | (_, Err(reason)) => skipped.push(Skipped {
                subject: Subject::Ip(e.name.clone()),
                reason,
            }),
        }
    }
    // First which peers can run beside each other; then their probes, so that a peer left out
    // does not keep its tunnel /30 from the one that would have had it next.
    let (trial, left) = cfg
        .clone()
        .peers(built.iter().map(|(_, c)| c.clone().build()))
        .build_per_peer()?;
    // What was kept, in the order given (two Configurations may even name the same peer).
    let mut kept = trial.peers.iter().peekable();
    let running: Vec<&(&PeerView, PeerBuilder)> = built
        .iter()
        .filter(|(_, c)| kept.next_if(|k| **k == c.clone().build()).is_some())
        .collect();
    skipped.extend(left.into_iter().filter_map(|l| match l {
        fabric_gateway_api::LeftOut::Peer { name, reason } => Some(Skipped {
            subject: Subject::Peer(name),
            reason: reason.into(),
        }),
        fabric_gateway_api::LeftOut::External { .. } => None,
    }));
    let mut used = std::collections::BTreeSet::new();
    for (p, peer) in running {
        let mut peer = peer.clone();
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
    for (_, ext, int) in &exposed {
        cfg = cfg.external(*ext, *int);
    }
    let (config, left) = cfg.build_per_peer()?;
    let mut taken = vec![false; exposed.len()];
    for l in left {
        let (subject, reason) = match l {
            fabric_gateway_api::LeftOut::Peer { name, reason } => (Subject::Peer(name), reason),
            fabric_gateway_api::LeftOut::External { mapping, reason } => {
                let i = exposed
                    .iter()
                    .enumerate()
                    .position(|(i, (_, ext, int))| {
                        !taken[i] && *ext == mapping.external && *int == mapping.internal
                    })
                    .expect("every mapping left out was given");
                taken[i] = true;
                (Subject::Ip(exposed[i].0.name.clone()), reason)
            }
        };
        skipped.push(Skipped {
            subject,
            reason: reason.into(),
        });
    }
    skipped.sort_by(|a, b| a.subject.cmp(&b.subject));
    Ok(Rendered { config, skipped })
}

/// A peer as the gateway runs it, without its probe (which depends on the other peers).
fn peer_config(p: &PeerView) -> PeerBuilder {
    let (real_pod, real_external) = (p.real_pod, p.real_external);
    let (seen_pod, seen_external) = (p.seen_pod, p.seen_external);
    let mut peer = PeerConfig::builder(&p.cluster_id, p.public_key)
        .id(p.peer_id)
        .device(device(&p.cluster_id, p.peer_id))
        .allowed_ips([real_pod, real_external])
        .routes([seen_pod, seen_external])
        .remap(seen_pod, real_pod)
        .remap(seen_external, real_external);
    if let Some(endpoint) = p.endpoint {
        // We dial: keep the NAT mapping on the way open.
        peer = peer.endpoint(endpoint).persistent_keepalive(25);
    }
    peer
}

/// An exposed IP's address as a /32.
fn host(value: &str) -> Result<Ipv4Network, RenderError> {
    value
        .parse::<Ipv4Addr>()
        .map(Ipv4Network::from)
        .map_err(|source| RenderError::External {
            value: value.to_owned(),
            source,
        })
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
            advertise: "192.0.2.1:51820".parse().unwrap(),
            interval: Duration::from_secs(1),
            pin_dir: pin_dir.map(PathBuf::from),
            busy_poll_us: 0,
            overlay: None,
            guard_pin_dir: None,
            gateway_ip: None,
            election: Election::new(fabric_api::names::lease::GATEWAY, "gw-0"),
            gateway_grace: None,
        }
    }

    fn peer_b() -> PeerView {
        PeerView {
            cluster_id: "b".into(),
            peer_id: 1,
            public_key: "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw="
                .parse()
                .unwrap(),
            endpoint: None,
            real_pod: "10.244.0.0/16".parse().unwrap(),
            real_external: "10.70.0.0/16".parse().unwrap(),
            seen_pod: "10.64.0.0/16".parse().unwrap(),
            seen_external: "10.65.0.0/16".parse().unwrap(),
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
        .unwrap()
        .config;
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
        let without = render(&opts(None), "a", &[], std::slice::from_ref(&peer), &[])
            .unwrap()
            .config;
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
        .unwrap()
        .config;
        assert_eq!(busy.interface.busy_poll_us, 20_000);
        // What a standby replica's gateway gets: the interface and nothing else.
        let standby = render(&opts(None), "", &[], &[], &[]).unwrap().config;
        assert!(standby.peers.is_empty() && standby.externals.is_empty());
        assert_eq!(standby.interface, without.interface);
    }

    fn ip(name: &str, external: &str, internal: &str) -> ExternalView {
        ExternalView {
            name: name.into(),
            external: external.into(),
            internal: internal.into(),
        }
    }

    /// Renders `bad` beside the good peer b and an exposed IP: b and the IP run, `bad` is
    /// left out with the reason.
    fn beside_b(bad: PeerView) -> RenderError {
        let pods = ["10.244.0.0/16".parse().unwrap()];
        let peers = [peer_b(), bad];
        let exposed = [ip("db", "10.70.0.1", "192.168.1.5")];
        let r = render(&opts(None), "a", &pods, &peers, &exposed).unwrap();
        assert_eq!(r.config.peers.len(), 1, "{:?}", r.skipped);
        assert_eq!(r.config.peers[0].name, "b");
        // b keeps everything it has alone, probe included.
        let alone = render(&opts(None), "a", &pods, &[peer_b()], &exposed).unwrap();
        assert!(alone.skipped.is_empty());
        assert_eq!(r.config, alone.config);
        let mut skipped = r.skipped;
        assert_eq!(skipped.len(), 1, "{skipped:?}");
        let s = skipped.remove(0);
        assert_eq!(s.subject, Subject::Peer(peers[1].cluster_id.clone()));
        s.reason
    }

    #[test]
    fn a_bad_peer_is_left_out_and_the_others_run() {
        let other = |f: fn(&mut PeerView)| {
            let mut p = peer_b();
            p.cluster_id = "x".into();
            p.peer_id = 2;
            p.public_key = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg="
                .parse()
                .unwrap();
            p.seen_pod = "10.66.0.0/16".parse().unwrap();
            p.seen_external = "10.67.0.0/16".parse().unwrap();
            f(&mut p);
            beside_b(p)
        };
        // Fine alone, not beside b: b's key, b's data-plane id, a view overlapping b's.
        let e = other(|p| p.public_key = peer_b().public_key);
        assert!(e.to_string().contains("used by another peer"), "{e}");
        let e = other(|p| p.peer_id = 1);
        assert!(e.to_string().contains("share id"), "{e}");
        let e = other(|p| p.seen_pod = "10.64.0.0/16".parse().unwrap());
        assert!(e.to_string().contains("overlaps"), "{e}");
        // Its own pod and external CIDRs overlapping.
        let e = other(|p| p.real_external = "10.244.0.0/16".parse().unwrap());
        assert!(e.to_string().contains("overlap"), "{e}");
        // Two Configurations naming the same peer.
        let e = other(|p| p.cluster_id = "b".into());
        assert!(e.to_string().contains("duplicate peer name"), "{e}");
    }

    #[test]
    fn a_peer_left_out_does_not_take_the_next_ones_probe() {
        // A peer whose tunnel /30 (with "a") is b's: the first of the two gets the probe.
        let b = tunnel_addrs("a", "b").0;
        let twin = (0..200_000)
            .map(|i| format!("t{i}"))
            .find(|id| tunnel_addrs("a", id).0 == b)
            .expect("16384 /30s: some id shares b's");
        let mut bad = peer_b();
        bad.cluster_id = twin;
        bad.peer_id = 2;
        bad.public_key = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg="
            .parse()
            .unwrap();
        bad.seen_external = "10.67.0.0/16".parse().unwrap();
        // Runs beside b, before it: b goes without a probe.
        bad.seen_pod = "10.66.0.0/16".parse().unwrap();
        let r = render(&opts(None), "a", &[], &[bad.clone(), peer_b()], &[]).unwrap();
        assert!(r.skipped.is_empty());
        assert_eq!(r.config.peers[1].probe_address, None);
        // Left out (its view changes the prefix length): b keeps its probe.
        bad.seen_pod = "10.66.0.0/24".parse().unwrap();
        let r = render(&opts(None), "a", &[], &[bad, peer_b()], &[]).unwrap();
        assert_eq!(r.skipped.len(), 1);
        assert_eq!(r.config.peers[0].name, "b");
        assert!(
            r.config.peers[0].probe_address.is_some(),
            "b keeps its probe"
        );
    }

    #[test]
    fn an_ip_exposed_twice_is_left_out_and_the_first_runs() {
        let exposed = [
            ip("db", "10.70.0.1", "192.168.1.5"),
            ip("db-again", "10.70.0.2", "192.168.1.5"),
            ip("typo", "10.70.0.3", "192.168.1"),
            ip("web", "10.70.0.4", "192.168.1.6"),
        ];
        let r = render(&opts(None), "a", &[], &[peer_b()], &exposed).unwrap();
        assert_eq!(r.config.peers.len(), 1);
        let ext: Vec<String> = r
            .config
            .externals
            .iter()
            .map(|e| e.external.ip().to_string())
            .collect();
        assert_eq!(ext, ["10.70.0.1", "10.70.0.4"]);
        let left: Vec<&Subject> = r.skipped.iter().map(|s| &s.subject).collect();
        assert_eq!(
            left,
            [&Subject::Ip("db-again".into()), &Subject::Ip("typo".into())]
        );
        assert!(r.skipped[0].reason.to_string().contains("overlap"));
        assert!(matches!(r.skipped[1].reason, RenderError::External { .. }));
        // Only the operator's own options fail the whole configuration.
        let o = Opts {
            mtu: 100,
            ..opts(None)
        };
        assert!(render(&o, "a", &[], &[peer_b()], &exposed).is_err());
    }

    #[test]
    fn endpoints_of_either_family_are_read_back() {
        use fabric_api::networking::v1alpha1::{Endpoint, GatewayClientSpec};
        let client = |a: &str| {
            GatewayClient::new(
                "b",
                GatewayClientSpec {
                    cluster_id: "b".into(),
                    endpoint: Endpoint {
                        addresses: vec![a.into()],
                        port: 51820,
                    },
                    mtu: 1420,
                },
            )
        };
        let mut cfg = Configuration::new(
            "b",
            fabric_api::networking::v1alpha1::ConfigurationSpec {
                cluster_id: "b".into(),
                remote: fabric_api::networking::v1alpha1::ClusterCidrs {
                    pod: "10.244.0.0/16".parse().unwrap(),
                    external: "10.70.0.0/16".parse().unwrap(),
                },
            },
        );
        cfg.status = Some(fabric_api::networking::v1alpha1::ConfigurationStatus {
            remote: Some(cfg.spec.remote.clone()),
            peer_id: Some(1),
            ..Default::default()
        });
        let key = PublicKey::new(
            "b",
            fabric_api::networking::v1alpha1::PublicKeySpec {
                cluster_id: "b".into(),
                public_key: peer_b().public_key.to_base64(),
            },
        );
        for (a, want) in [
            ("192.0.2.7", "192.0.2.7:51820"),
            ("fd00::7", "[fd00::7]:51820"),
        ] {
            let v = peers(
                std::slice::from_ref(&cfg),
                std::slice::from_ref(&key),
                &[client(a)],
            );
            assert!(v.malformed.is_empty(), "{:?}", v.malformed);
            assert_eq!(
                v.views[0].endpoint.map(|e| e.to_string()).as_deref(),
                Some(want)
            );
            let r = render(&opts(None), "a", &[], &v.views, &[]).unwrap();
            assert!(r.skipped.is_empty(), "{:?}", r.skipped);
        }
        // What the API server should have refused is read once, here: the peer is left out
        // with why, and the others run.
        let with = |f: &dyn Fn(&mut Configuration, &mut PublicKey, &mut GatewayClient)| {
            let (mut c, mut k, mut g) = (cfg.clone(), key.clone(), client("192.0.2.7"));
            f(&mut c, &mut k, &mut g);
            let mut good = cfg.clone();
            good.spec.cluster_id = "good".into();
            let mut good_key = key.clone();
            good_key.spec.cluster_id = "good".into();
            let v = peers(&[good, c], &[good_key, k], &[g]);
            assert_eq!(v.views.len(), 1);
            assert_eq!(v.views[0].cluster_id, "good");
            assert_eq!(v.ids().collect::<Vec<_>>(), ["good", "b"]);
            let [s] = <[Skipped; 1]>::try_from(v.malformed).unwrap();
            assert_eq!(s.subject, Subject::Peer("b".into()));
            s.reason
        };
        let e = with(&|_, k, _| k.spec.public_key = "k".into());
        assert!(matches!(e, RenderError::Key { .. }), "{e}");
        let e = with(&|_, _, g| g.spec.endpoint.addresses = vec!["gw.example".into()]);
        assert!(matches!(e, RenderError::Endpoint { .. }), "{e}");
        assert!(e.to_string().contains("gw.example:51820"), "{e}");
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
