//! The gateway operator: runs beside `fabric-gateway` (a second container in the gateway pod)
//! and turns the API into the gateway's configuration, then the gateway's state back into the
//! API. It renders the gateway's TOML from the peers' Configurations (real and granted CIDRs,
//! peer id), PublicKeys and GatewayClients, writes the private key from its Secret to a 0600
//! file, asks the gateway to reload when anything changed, and reports each tunnel as a
//! `Connection`. It also publishes this gateway's identity (public key, endpoint) for
//! `fabricctl peer`.
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use fabric_api::{
    Configuration, Connection, ConnectionSpec, ConnectionState, ConnectionStatus, GatewayClient,
    IP, PublicKey,
};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, ObjectMeta, Patch, PatchParams},
};
use tracing::{info, warn};

pub const FIELD_MANAGER: &str = "fabric-gateway-operator";
/// Secret holding the gateway's WireGuard private key (`privateKey`, base64 as `wg` prints it).
pub const KEY_SECRET: &str = "fabric-gateway-key";
/// ConfigMap where the operator publishes `publicKey` and `endpoint` for peering.
pub const IDENTITY: &str = "fabric-gateway-identity";

pub struct Opts {
    pub namespace: String,
    /// Name of the gateway interface (its control and UAPI socket names).
    pub name: String,
    pub config_path: PathBuf,
    pub key_path: PathBuf,
    pub control_dir: PathBuf,
    pub gateway_bin: PathBuf,
    pub listen_port: u16,
    pub mtu: u16,
    /// `address:port` where peers reach this gateway (after NodePort/LoadBalancer mapping).
    pub advertise: String,
    pub interval: Duration,
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
        "[interface]\nname = {:?}\nprivate_key_file = {:?}\nlisten_port = {}\nmtu = {}\n",
        o.name,
        o.key_path.display().to_string(),
        o.listen_port,
        o.mtu
    );
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

/// Runs a `fabric-gateway` subcommand; `control` adds the socket it talks to.
fn gateway(o: &Opts, args: &[&str], control: bool) -> Result<String, String> {
    let mut c = Command::new(&o.gateway_bin);
    c.args(args);
    if control {
        c.args(["--name", &o.name, "--control-dir"])
            .arg(&o.control_dir);
    }
    let out = c
        .output()
        .map_err(|e| format!("running {}: {e}", o.gateway_bin.display()))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One pass: key, identity, config (+ reload), Connections.
async fn pass(client: &Client, o: &Opts, last_config: &mut Option<String>) -> anyhow::Result<()> {
    let ns = o.namespace.as_str();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let secret = secrets.get(KEY_SECRET).await?;
    let key = secret
        .data
        .as_ref()
        .and_then(|d| d.get("privateKey"))
        .ok_or_else(|| anyhow::anyhow!("secret {KEY_SECRET} has no privateKey"))?;
    let key_text = String::from_utf8_lossy(&key.0).trim().to_owned();
    if std::fs::read_to_string(&o.key_path)
        .ok()
        .as_deref()
        .map(str::trim)
        != Some(key_text.as_str())
    {
        write_private(&o.key_path, format!("{key_text}\n").as_bytes())?;
    }
    if let Ok(public) = gateway(
        o,
        &["pubkey", "--key-file", &o.key_path.display().to_string()],
        false,
    )
    .map(|s| s.trim().to_owned())
    {
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(IDENTITY.into()),
                ..Default::default()
            },
            data: Some(BTreeMap::from([
                ("publicKey".into(), public),
                ("endpoint".into(), o.advertise.clone()),
            ])),
            ..Default::default()
        };
        cms.patch(
            IDENTITY,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&cm),
        )
        .await?;
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
        .get("fabric-cluster")
        .await?
        .data
        .and_then(|d| d.get("FABRIC_CLUSTER_ID").cloned())
        .ok_or_else(|| anyhow::anyhow!("{ns}/fabric-cluster has no FABRIC_CLUSTER_ID"))?;
    let ips = Api::<IP>::namespaced(client.clone(), ns)
        .list(&lp)
        .await?
        .items;
    let config = render(o, &me, &peers, &externals(&ips));
    if last_config.as_deref() != Some(config.as_str()) {
        write_private(&o.config_path, config.as_bytes())?;
        match gateway(o, &["reload"], true) {
            Ok(_) => info!(peers = peers.len(), "gateway configuration applied"),
            // Not running yet: it reads the file when it starts.
            Err(e) => warn!(error = %e, "gateway reload"),
        }
        *last_config = Some(config);
    }

    // Report each tunnel.
    let status: serde_json::Value = match gateway(o, &["status"], true) {
        Ok(s) => serde_json::from_str(&s).unwrap_or_default(),
        Err(e) => {
            warn!(error = %e, "gateway status");
            serde_json::Value::Null
        }
    };
    let conns: Api<Connection> = Api::namespaced(client.clone(), ns);
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    for p in &peers {
        let gw = status["peers"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["name"] == p.cluster_id.as_str()));
        let (value, latency, rx, tx, message) = match gw {
            Some(g) if g["up"] == true => (
                ConnectionState::Connected,
                g["probe_rtt_seconds"]
                    .as_f64()
                    .map(|s| format!("{:.2}ms", s * 1e3)),
                g["rx_bytes"].as_i64().unwrap_or(0),
                g["tx_bytes"].as_i64().unwrap_or(0),
                None,
            ),
            Some(g) => (
                ConnectionState::Connecting,
                None,
                g["rx_bytes"].as_i64().unwrap_or(0),
                g["tx_bytes"].as_i64().unwrap_or(0),
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
                    fabric_api::LABEL_PEER.to_owned(),
                    p.cluster_id.clone(),
                )])),
                ..Default::default()
            },
            spec: ConnectionSpec {
                cluster_id: p.cluster_id.clone(),
            },
            status: None,
        };
        conns
            .patch(&p.cluster_id, &pp, &Patch::Apply(&conn))
            .await?;
        let st = serde_json::json!({
            "apiVersion": "networking.fabric.io/v1alpha1",
            "kind": "Connection",
            "status": ConnectionStatus { value, latency, rx_bytes: rx, tx_bytes: tx, message, conditions: vec![] },
        });
        conns
            .patch_status(&p.cluster_id, &pp, &Patch::Apply(&st))
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

pub async fn run(client: Client, o: Opts) -> anyhow::Result<()> {
    let mut last = None;
    loop {
        if let Err(e) = pass(&client, &o, &mut last).await {
            warn!(error = %format!("{e:#}"), "gateway operator pass");
        }
        tokio::select! {
            _ = tokio::time::sleep(o.interval) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
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

    #[test]
    fn device_names_fit() {
        assert_eq!(device("b"), "fab-b");
        assert_eq!(device("a-very-long-cluster-name"), "fab-a-very-long");
        assert!(device("a-very-long-cluster-name").len() <= 15);
    }
}
