//! The gateway operator: runs beside `fabric-gateway` (a second container in the gateway pod)
//! and turns the API into the gateway's configuration, then the gateway's state back into the
//! API. It renders the gateway's TOML from the peers' Configurations (real and granted CIDRs,
//! peer id), PublicKeys and GatewayClients, writes the private key from its Secret to a 0600
//! file, asks the gateway to reload (over its control socket) when anything changed, and
//! reports each tunnel as a `Connection`. It also publishes this gateway's identity (public
//! key, endpoint) for `fabricctl peer`.
//!
//! Replicas run active/passive: the operators compete for a Lease, and only the holder's
//! gateway runs tunnels. The passive replica's gateway gets a configuration without peers, so
//! the peer never sees two gateways with the same key. The holder publishes its gateway's
//! cluster-network address on the Lease; node agents route to whatever that says.
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    net::Ipv4Addr,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    time::Duration,
};

use fabric_api::{
    identity::{cluster_key, gateway_key},
    names::{annotation, config_map, field_manager, label, secret},
    networking::v1alpha1::{
        Configuration, Connection, ConnectionSpec, ConnectionState, ConnectionStatus,
        GatewayClient, IP, PublicKey,
    },
};
pub use fabric_kube::Election;
use fabric_kube::{FieldManager, lease};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{ConfigMap, Node, Secret},
};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, ObjectMeta, Patch, PatchParams},
};
use tokio::sync::watch;
use tracing::{info, warn};

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
    cfgs: &[Configuration],
    keys: &[PublicKey],
    clients: &[GatewayClient],
) -> Vec<PeerView> {
    let mut out: Vec<PeerView> = cfgs
        .iter()
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
pub fn externals(ips: &[IP]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = ips
        .iter()
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

/// One pass: key, identity, config (+ reload), Connections. A standby replica (`active`
/// false) only keeps its key file current and gives its gateway a configuration without peers;
/// the identity and the Connections are the active replica's to write.
async fn pass(
    client: &Client,
    o: &Opts,
    active: bool,
    last_config: &mut Option<String>,
) -> anyhow::Result<()> {
    let ns = o.namespace.as_str();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let secret = secrets.get(secret::GATEWAY_KEY).await?;
    let key = secret
        .data
        .as_ref()
        .and_then(|d| d.get(secret::GATEWAY_KEY_FIELD))
        .ok_or_else(|| {
            anyhow::anyhow!(
                "secret {} has no {}",
                secret::GATEWAY_KEY,
                secret::GATEWAY_KEY_FIELD
            )
        })?;
    let key_text = String::from_utf8_lossy(&key.0).trim().to_owned();
    if std::fs::read_to_string(&o.key_path)
        .ok()
        .as_deref()
        .map(str::trim)
        != Some(key_text.as_str())
    {
        write_private(&o.key_path, format!("{key_text}\n").as_bytes())?;
    }
    if !active {
        let config = render(o, "", &[], &[]);
        if last_config.as_deref() != Some(config.as_str()) {
            write_private(&o.config_path, config.as_bytes())?;
            match control(o).reload().await {
                Ok(()) => info!("standby: gateway configuration without peers applied"),
                Err(e) => warn!(error = %e, "gateway reload"),
            }
            *last_config = Some(config);
        }
        return Ok(());
    }
    {
        let public = fabric_gateway_api::PrivateKey::from_base64(&key_text)
            .map_err(|e| {
                anyhow::anyhow!(
                    "secret {}: {}: {e}",
                    secret::GATEWAY_KEY,
                    secret::GATEWAY_KEY_FIELD
                )
            })?
            .public_key()
            .to_base64();
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(config_map::GATEWAY_IDENTITY.into()),
                ..Default::default()
            },
            data: Some(BTreeMap::from([
                (gateway_key::PUBLIC_KEY.into(), public),
                (gateway_key::ENDPOINT.into(), o.advertise.clone()),
            ])),
            ..Default::default()
        };
        FIELD_MANAGER.apply(&cms, &cm).await?;
    }

    let lp = ListParams::default();
    let cfgs = Api::<Configuration>::namespaced(client.clone(), ns)
        .list(&lp)
        .await?
        .items;
    let keys = Api::<PublicKey>::namespaced(client.clone(), ns)
        .list(&lp)
        .await?
        .items;
    let clients = Api::<GatewayClient>::namespaced(client.clone(), ns)
        .list(&lp)
        .await?
        .items;
    let peers = peers(&cfgs, &keys, &clients);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let me = cms
        .get(config_map::CLUSTER)
        .await?
        .data
        .and_then(|d| d.get(cluster_key::CLUSTER_ID).cloned())
        .ok_or_else(|| {
            anyhow::anyhow!(
                "{ns}/{} has no {}",
                config_map::CLUSTER,
                cluster_key::CLUSTER_ID
            )
        })?;
    let ips = Api::<IP>::namespaced(client.clone(), ns)
        .list(&lp)
        .await?
        .items;
    let config = render(o, &me, &peers, &externals(&ips));
    if last_config.as_deref() != Some(config.as_str()) {
        write_private(&o.config_path, config.as_bytes())?;
        match control(o).reload().await {
            Ok(()) => info!(peers = peers.len(), "active: gateway configuration applied"),
            // Not running yet: it reads the file when it starts.
            Err(e) => warn!(error = %e, "gateway reload"),
        }
        *last_config = Some(config);
    }

    // Report each tunnel.
    let status = match control(o).status().await {
        Ok(s) => Some(s),
        Err(e) => {
            warn!(error = %e, "gateway status");
            None
        }
    };
    let conns: Api<Connection> = Api::namespaced(client.clone(), ns);
    for p in &peers {
        let gw = status
            .as_ref()
            .and_then(|s| s.peers.iter().find(|x| x.name == p.cluster_id));
        let bytes = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let (value, latency, rx, tx, message) = match gw {
            Some(g) if g.up => (
                ConnectionState::Connected,
                g.probe_rtt_seconds.map(|s| format!("{:.2}ms", s * 1e3)),
                bytes(g.rx_bytes),
                bytes(g.tx_bytes),
                None,
            ),
            Some(g) => (
                ConnectionState::Connecting,
                None,
                bytes(g.rx_bytes),
                bytes(g.tx_bytes),
                Some("no recent handshake".to_owned()),
            ),
            None => (
                ConnectionState::Error,
                None,
                0,
                0,
                Some("gateway does not run this peer".to_owned()),
            ),
        };
        let conn = Connection {
            metadata: ObjectMeta {
                name: Some(p.cluster_id.clone()),
                labels: Some(BTreeMap::from([(
                    label::PEER.to_owned(),
                    p.cluster_id.clone(),
                )])),
                ..Default::default()
            },
            spec: ConnectionSpec {
                cluster_id: p.cluster_id.clone(),
            },
            status: None,
        };
        FIELD_MANAGER.apply(&conns, &conn).await?;
        let st = ConnectionStatus {
            value,
            latency,
            rx_bytes: rx,
            tx_bytes: tx,
            message,
            conditions: vec![],
        };
        FIELD_MANAGER
            .apply_status(&conns, &p.cluster_id, st)
            .await?;
    }
    // Connections of peers that are gone.
    for c in conns.list(&lp).await?.items {
        if !peers.iter().any(|p| p.cluster_id == c.spec.cluster_id) {
            let _ = conns.delete(&c.name_any(), &Default::default()).await;
        }
    }
    Ok(())
}

async fn label_pod(client: &Client, ns: &str, pod: &str, active: bool) -> kube::Result<()> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), ns);
    let patch =
        serde_json::json!({"metadata": {"labels": {label::GATEWAY_ACTIVE: active.to_string()}}});
    pods.patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Watches `api` and signals every change, keeping `store` (when given) up to date.
fn spawn_watch<K>(
    api: Api<K>,
    store: Option<kube::runtime::reflector::store::Writer<K>>,
    changed: std::sync::Arc<tokio::sync::Notify>,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    tokio::spawn(async move {
        let events = watcher(api, watcher::Config::default()).default_backoff();
        let mut s = match store {
            Some(w) => events.reflect(w).boxed(),
            None => events.boxed(),
        };
        while let Some(ev) = s.next().await {
            match ev {
                Ok(_) => changed.notify_one(),
                Err(e) => warn!(error = %e, "watch"),
            }
        }
    })
}

pub async fn run(client: Client, o: Opts) -> anyhow::Result<()> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), &o.namespace);
    let (tx, mut leading) = watch::channel(false);
    let mut election = o.election.clone();
    // The node agents route to whatever address the holder publishes here.
    election.annotations.insert(
        annotation::GATEWAY_IP.to_owned(),
        o.gateway_ip.map(|ip| ip.to_string()),
    );
    let elector = tokio::spawn(lease::elect(leases.clone(), election.clone(), tx));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    // Changes to what the configuration is made of trigger a pass at once; the interval pass
    // still catches the gateway's own state (Connections) and anything a watch missed.
    let changed = std::sync::Arc::new(tokio::sync::Notify::new());
    let ns = o.namespace.as_str();
    let mut watchers = vec![
        spawn_watch::<Configuration>(Api::namespaced(client.clone(), ns), None, changed.clone()),
        spawn_watch::<PublicKey>(Api::namespaced(client.clone(), ns), None, changed.clone()),
        spawn_watch::<GatewayClient>(Api::namespaced(client.clone(), ns), None, changed.clone()),
        spawn_watch::<IP>(Api::namespaced(client.clone(), ns), None, changed.clone()),
    ];
    let mut overlay = match &o.overlay {
        None => None,
        Some(ov) => {
            let local = o.gateway_ip.ok_or_else(|| {
                anyhow::anyhow!("--overlay needs --gateway-ip: the nodes' overlay endpoint")
            })?;
            let (conn, handle, _) =
                rtnetlink::new_connection().map_err(|e| anyhow::anyhow!("netlink socket: {e}"))?;
            tokio::spawn(conn);
            let (nodes, writer) = kube::runtime::reflector::store::<Node>();
            watchers.push(spawn_watch(
                Api::<Node>::all(client.clone()),
                Some(writer),
                changed.clone(),
            ));
            // An empty cache would remove the routes to every node's pods after a restart, so
            // the overlay is only synced once the Nodes have been listed.
            let ready = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            tokio::spawn({
                let (nodes, ready) = (nodes.clone(), ready.clone());
                let notify = changed.clone();
                async move {
                    if nodes.wait_until_ready().await.is_ok() {
                        ready.store(true, std::sync::atomic::Ordering::Relaxed);
                        notify.notify_one();
                    }
                }
            });
            // Pods, for nodes without spec.podCIDRs: only where each runs is kept.
            let pods =
                std::sync::Arc::new(std::sync::Mutex::new(crate::overlay::PodPlaces::default()));
            watchers.push(tokio::spawn({
                let (pods, notify) = (pods.clone(), changed.clone());
                let api = Api::<k8s_openapi::api::core::v1::Pod>::all(client.clone());
                async move {
                    use futures::StreamExt;
                    use kube::runtime::{WatchStreamExt, watcher};
                    let mut s = watcher(api, watcher::Config::default())
                        .default_backoff()
                        .boxed();
                    while let Some(ev) = s.next().await {
                        match ev {
                            Ok(ev) => {
                                if pods.lock().unwrap().apply(ev) {
                                    notify.notify_one();
                                }
                            }
                            Err(e) => warn!(error = %e, "watching Pods"),
                        }
                    }
                }
            }));
            Some((
                crate::overlay::GatewayOverlay::new(ov.clone(), local, handle),
                nodes,
                ready,
                pods,
            ))
        }
    };
    let mut last = None;
    // In a pod, the label tells the gateway Service which replica is active, so peers'
    // handshakes reach the one with the tunnels and not the standby.
    let pod = std::env::var("POD_NAME").ok().filter(|p| !p.is_empty());
    let mut labeled: Option<bool> = None;
    loop {
        let active = *leading.borrow_and_update();
        if let Some(pod) = &pod
            && labeled != Some(active)
        {
            match label_pod(&client, &o.namespace, pod, active).await {
                Ok(()) => labeled = Some(active),
                Err(e) => warn!(error = %e, pod, "labelling this pod for the gateway Service"),
            }
        }
        // Both replicas keep their end of the overlay: a takeover then only moves the nodes'
        // next hop.
        if let Some((ov, nodes, _, pods)) = overlay.as_mut().filter(|(_, _, r, p)| {
            r.load(std::sync::atomic::Ordering::Relaxed) && p.lock().unwrap().ready
        }) {
            let list = nodes.state();
            let peered = Api::<Configuration>::namespaced(client.clone(), &o.namespace)
                .list_metadata(&ListParams::default().limit(1))
                .await
                .map(|l| !l.items.is_empty());
            // A snapshot: the lock is not held across the netlink calls.
            let places = pods.lock().unwrap().clone();
            let res = match peered {
                Ok(peered) => {
                    ov.sync(list.iter().map(|n| n.as_ref()), &places, peered)
                        .await
                }
                Err(e) => Err(e.into()),
            };
            if let Err(e) = res {
                warn!(error = %format!("{e:#}"), "gateway overlay");
            }
        }
        if let Err(e) = pass(&client, &o, active, &mut last).await {
            warn!(error = %format!("{e:#}"), "gateway operator pass");
        }
        tokio::select! {
            _ = tokio::time::sleep(o.interval) => {}
            _ = changed.notified() => {}
            // A takeover is applied at once, not at the next interval.
            Ok(()) = leading.changed() => {}
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
        }
    }
    elector.abort();
    for w in watchers {
        w.abort();
    }
    if *leading.borrow() {
        match lease::release(&leases, &election).await {
            Ok(()) => info!("released the gateway Lease"),
            Err(e) => warn!(error = %e, "releasing the gateway Lease"),
        }
    }
    Ok(())
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
