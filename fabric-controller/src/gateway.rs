//! The gateway operator: runs beside `fabric-gateway` (a second container in the gateway pod)
//! and turns the API into the gateway's configuration, then the gateway's state back into the
//! API. It renders the gateway's TOML from the peers' Configurations (real and granted CIDRs,
//! peer id), PublicKeys and GatewayClients, writes the private key from its Secret to a 0600
//! file, asks the gateway to reload (over its control socket) when anything changed, and
//! reports each tunnel as a `Connection`. It also publishes this gateway's identity (public
//! key, endpoint) for `fabricctl peer`.
//!
//! The loop ([`operator`]) works from watch caches ([`caches`]) and writes to the API only what
//! changed; what it reports about each tunnel is decided in [`report`], free of I/O.
//!
//! Replicas run active/passive: the operators compete for a Lease, and only the holder's
//! gateway runs tunnels. The passive replica's gateway gets a configuration without peers, so
//! the peer never sees two gateways with the same key. The holder publishes its gateway's
//! cluster-network address on the Lease; node agents route to whatever that says.
use std::{
    borrow::Borrow,
    fmt::Write as _,
    net::Ipv4Addr,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    time::Duration,
};

use fabric_api::{
    names::field_manager,
    networking::v1alpha1::{Configuration, GatewayClient, IP, PublicKey},
};
pub use fabric_kube::Election;
use fabric_kube::FieldManager;

mod caches;
mod operator;
pub mod report;

pub use operator::{COUNTER_REFRESH, RESYNC, run};

/// Everything the operator writes: Connections and the gateway identity.
pub const FIELD_MANAGER: FieldManager = FieldManager(field_manager::GATEWAY_OPERATOR);

pub struct Opts {
    pub namespace: String,
    /// Name of the gateway interface (its control and UAPI socket names).
    pub name: String,
    pub config_path: PathBuf,
    pub key_path: PathBuf,
    /// Where the gateway's control socket `<name>.ctl` is.
    pub control_dir: PathBuf,
    pub listen_port: u16,
    pub mtu: u16,
    /// `address:port` where peers reach this gateway (after NodePort/LoadBalancer mapping).
    pub advertise: String,
    pub interval: Duration,
    /// Where the gateway pins its data-plane maps (its default when unset).
    pub pin_dir: Option<PathBuf>,
    /// The gateway's `busy_poll_us` (0: off).
    pub busy_poll_us: u64,
    /// Reach the nodes through the VXLAN overlay (the gateway's end of it, from Node objects).
    pub overlay: Option<fabric_routing::overlay::Overlay>,
    /// This replica's gateway address as the nodes reach it: published on the Lease while it
    /// holds it, and the gateway's end of the overlay.
    pub gateway_ip: Option<Ipv4Addr>,
    /// The active/passive election (the gateway address annotation is added by [`run`]).
    pub election: Election,
}

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

/// TUN device name for a peer: `fab-` plus as much of the cluster id as fits (IFNAMSIZ).
pub fn device(cluster_id: &str) -> String {
    let mut d = String::from("fab-");
    d.extend(cluster_id.chars().take(15 - 4));
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

/// The gateway's configuration file for these peers. `me` is this cluster's id.
pub fn render(o: &Opts, me: &str, peers: &[PeerView], externals: &[(String, String)]) -> String {
    let mut used = std::collections::BTreeSet::new();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Written by the fabric gateway operator from the API; edits are overwritten."
    );
    let _ = writeln!(
        s,
        "[interface]\nname = {:?}\nprivate_key_file = {:?}\nlisten_port = {}\nmtu = {}",
        o.name,
        o.key_path.display().to_string(),
        o.listen_port,
        o.mtu
    );
    if let Some(pins) = &o.pin_dir {
        let _ = writeln!(s, "dataplane_pin_dir = {:?}", pins.display().to_string());
    }
    if o.busy_poll_us > 0 {
        let _ = writeln!(s, "busy_poll_us = {}", o.busy_poll_us);
    }
    s.push('\n');
    for p in peers {
        let _ = writeln!(
            s,
            "[[peers]]\nname = {:?}\nid = {}\npublic_key = {:?}",
            p.cluster_id, p.peer_id, p.public_key
        );
        if let Some(e) = &p.endpoint {
            // We dial: keep the NAT mapping on the way open.
            let _ = writeln!(s, "endpoint = {e:?}\npersistent_keepalive = 25");
        }
        let (server, client) = tunnel_addrs(me, &p.cluster_id);
        let (mine, theirs) = if p.endpoint.is_some() {
            (client, server)
        } else {
            (server, client)
        };
        // Two peers whose pairs hash to the same /30 would need the same route on two
        // devices: the later one goes without a probe (Up then follows handshakes).
        let (probe_lines, extra_allowed, extra_route) = if used.insert(server) {
            (
                format!("addresses = [\"{mine}/32\"]\nprobe_address = \"{theirs}\"\n"),
                format!(", \"{theirs}/32\""),
                format!(", \"{theirs}/32\""),
            )
        } else {
            (String::new(), String::new(), String::new())
        };
        let _ = writeln!(
            s,
            "device = {:?}\n{probe_lines}allowed_ips = [{:?}, {:?}{extra_allowed}]\nroutes = [{:?}, {:?}{extra_route}]\nremaps = [\n  {{ local = {:?}, remote = {:?} }},\n  {{ local = {:?}, remote = {:?} }},\n]\n",
            device(&p.cluster_id),
            p.real_pod,
            p.real_external,
            p.seen_pod,
            p.seen_external,
            p.seen_pod,
            p.real_pod,
            p.seen_external,
            p.real_external,
        );
    }
    for (external, internal) in externals {
        let _ = writeln!(
            s,
            "[[externals]]\nexternal = \"{external}/32\"\ninternal = \"{internal}/32\"\n"
        );
    }
    s
}

fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(data)?;
    }
    std::fs::rename(tmp, path)
}

/// The gateway's control socket (`<control_dir>/<name>.ctl`).
fn control(o: &Opts) -> fabric_gateway_api::control::Client {
    fabric_gateway_api::control::Client::for_gateway(&o.control_dir, &o.name)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn the_pin_dir_goes_into_the_interface_table() {
        let peer = PeerView {
            cluster_id: "b".into(),
            peer_id: 1,
            public_key: "k".into(),
            endpoint: None,
            real_pod: "10.244.0.0/16".into(),
            real_external: "10.70.0.0/16".into(),
            seen_pod: "10.64.0.0/16".into(),
            seen_external: "10.65.0.0/16".into(),
        };
        let with = render(
            &opts(Some("/sys/fs/bpf/x")),
            "a",
            std::slice::from_ref(&peer),
            &[],
        );
        let iface = &with[..with.find("[[peers]]").unwrap()];
        assert!(
            iface.contains("dataplane_pin_dir = \"/sys/fs/bpf/x\""),
            "{with}"
        );
        let without = render(&opts(None), "a", std::slice::from_ref(&peer), &[]);
        assert!(!without.contains("dataplane_pin_dir"), "{without}");
        assert!(!without.contains("busy_poll_us"), "{without}");
        let busy = render(
            &Opts {
                busy_poll_us: 20_000,
                ..opts(None)
            },
            "a",
            &[peer],
            &[],
        );
        let iface = &busy[..busy.find("[[peers]]").unwrap()];
        assert!(iface.contains("busy_poll_us = 20000"), "{busy}");
        // What a standby replica's gateway gets: the interface and nothing else.
        let standby = render(&opts(None), "", &[], &[]);
        assert!(!standby.contains("[[peers]]") && standby.contains("[interface]"));
    }

    #[test]
    fn device_names_fit() {
        assert_eq!(device("b"), "fab-b");
        assert_eq!(device("a-very-long-cluster-name"), "fab-a-very-long");
        assert!(device("a-very-long-cluster-name").len() <= 15);
    }
}
