//! fabricctl: peer clusters through the fabric and see how they are connected.
//!
//! `fabricctl peer --remote-kubeconfig B.yaml` (with A's kubeconfig as usual) exchanges what
//! each side needs about the other (CIDRs, gateway key and endpoint), creates the resources on
//! both sides and waits until the tunnel is up in both directions.
use std::{
    collections::BTreeMap,
    io::{IsTerminal, Read, Write},
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use base64::Engine;
use clap::{Parser, Subcommand, ValueEnum};
use fabric_api::networking::v1alpha1::{
    ClusterCidrs, Configuration, ConfigurationSpec, Connection, ConnectionState, Endpoint,
    GatewayClient, GatewayClientSpec, GatewayServer, GatewayServerSpec, Network, PublicKey,
    PublicKeySpec, ServiceType,
};
use k8s_openapi::{
    ByteString,
    api::core::v1::{ConfigMap, Secret},
};
use kube::{
    Api, Client, Resource,
    api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use serde::Serialize;

use fabric_api::names::{
    config_map::{CLUSTER as CLUSTER_CM, GATEWAY_IDENTITY as IDENTITY_CM},
    field_manager::PEERING as FIELD_MANAGER,
    label,
    secret::{GATEWAY_KEY as KEY_SECRET, GATEWAY_KEY_FIELD},
};

#[derive(Parser)]
#[command(
    name = "fabricctl",
    version,
    about = "Peer Kubernetes clusters through the fabric"
)]
struct Cli {
    /// Kubeconfig of the local cluster (default: $KUBECONFIG or ~/.kube/config).
    #[arg(long, global = true, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Namespace the fabric runs in.
    #[arg(long, short = 'n', global = true, default_value = fabric_api::names::DEFAULT_NAMESPACE)]
    namespace: String,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Peer the local cluster with a remote one (both directions) and wait until connected.
    Peer {
        #[arg(long)]
        remote_kubeconfig: PathBuf,
        /// Which side's gateway listens (the other dials it).
        #[arg(long, value_enum, default_value_t = Side::Remote)]
        server: Side,
        #[arg(long, default_value_t = 120)]
        timeout_secs: u64,
    },
    /// Remove a peering from both clusters and wait until every trace is gone.
    Unpeer {
        #[arg(long)]
        remote_kubeconfig: PathBuf,
        #[arg(long, default_value_t = 60)]
        timeout_secs: u64,
    },
    /// Peers of the local cluster: CIDRs as seen here, tunnel state, latency, traffic.
    Status {
        #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// What the fabric programmed on this machine (run it on a node or gateway host).
    #[command(subcommand)]
    Network(NetworkCmd),
}

#[derive(Subcommand)]
enum NetworkCmd {
    /// The eBPF maps (peers, counters, remaps, external IPs, drops) of every data plane pinned
    /// here, and the fabric's routes.
    Dump {
        /// Pin directories to read (default: every data plane under /sys/fs/bpf).
        #[arg(long)]
        pin_dir: Vec<PathBuf>,
        /// Look inside this network namespace (a name under /run/netns, or a path).
        #[arg(long)]
        netns: Option<String>,
        #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum Side {
    Local,
    Remote,
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
    Yaml,
}

struct Cluster {
    label: &'static str,
    client: Client,
    ns: String,
    id: String,
    cidrs: ClusterCidrs,
}

async fn client(path: Option<&PathBuf>, what: &str) -> Result<Client> {
    let cfg = match path {
        Some(p) => {
            let kc = Kubeconfig::read_from(p)
                .with_context(|| format!("reading {what} kubeconfig {}", p.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("{what} kubeconfig {}", p.display()))?
        }
        None => kube::Config::infer()
            .await
            .with_context(|| format!("no {what} kubeconfig (set KUBECONFIG)"))?,
    };
    Client::try_from(cfg).with_context(|| format!("{what} cluster client"))
}

async fn cluster(label: &'static str, client: Client, ns: &str) -> Result<Cluster> {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let cm = cms.get_opt(CLUSTER_CM).await.with_context(|| format!("reaching the {label} cluster"))?.with_context(|| {
        format!("the {label} cluster has no {ns}/{CLUSTER_CM} ConfigMap: is the fabric installed there? (kubectl apply -k deploy/)")
    })?;
    let data = cm.data.unwrap_or_default();
    let get = |k: &str| {
        data.get(k)
            .filter(|v| !v.is_empty())
            .cloned()
            .with_context(|| format!("{label} cluster: {ns}/{CLUSTER_CM} lacks {k}"))
    };
    Ok(Cluster {
        label,
        client,
        ns: ns.to_owned(),
        id: get("FABRIC_CLUSTER_ID")?,
        cidrs: ClusterCidrs {
            pod: get("FABRIC_POD_CIDR")?,
            external: get("FABRIC_EXTERNAL_CIDR")?,
        },
    })
}

/// A fresh WireGuard private key (clamped like `wg genkey`), base64.
fn genkey() -> Result<String> {
    let mut k = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut k)?;
    k[0] &= 248;
    k[31] &= 127;
    k[31] |= 64;
    Ok(base64::engine::general_purpose::STANDARD.encode(k))
}

async fn ensure_key(c: &Cluster) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(c.client.clone(), &c.ns);
    if secrets.get_opt(KEY_SECRET).await?.is_some() {
        return Ok(());
    }
    let s = Secret {
        metadata: ObjectMeta {
            name: Some(KEY_SECRET.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            GATEWAY_KEY_FIELD.into(),
            ByteString(genkey()?.into_bytes()),
        )])),
        ..Default::default()
    };
    match secrets.create(&PostParams::default(), &s).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e).context(format!(
            "creating the gateway key in the {} cluster",
            c.label
        )),
    }
}

struct Progress {
    t0: Instant,
    tty: bool,
}

impl Progress {
    fn step(&self, msg: &str) {
        if self.tty {
            print!("  \u{2026} {msg}\r");
            let _ = std::io::stdout().flush();
        }
    }
    fn done(&self, msg: &str) {
        println!("  \u{2713} {msg} ({:.1}s)", self.t0.elapsed().as_secs_f64());
    }
}

/// Polls `f` until it yields a value or the deadline passes.
async fn wait_for<T, F, Fut>(deadline: Instant, what: &str, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    loop {
        if let Some(v) = f().await? {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn identity(c: &Cluster, deadline: Instant) -> Result<(String, String)> {
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    wait_for(deadline, &format!("the {} gateway to publish its key and endpoint ({}/{IDENTITY_CM}); is fabric-gateway running there?", c.label, c.ns), || async {
        let cm = cms.get_opt(IDENTITY_CM).await?;
        Ok(cm.and_then(|cm| {
            let d = cm.data?;
            Some((d.get("publicKey")?.clone(), d.get("endpoint")?.clone()))
        }))
    })
    .await
}

async fn apply<K>(c: &Cluster, obj: &K) -> Result<()>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(c.client.clone(), &c.ns);
    let name = obj.meta().name.clone().unwrap_or_default();
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(obj),
    )
    .await
    .with_context(|| {
        format!(
            "creating {} {name} in the {} cluster",
            K::kind(&Default::default()),
            c.label
        )
    })?;
    Ok(())
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        labels: Some(BTreeMap::from([(label::PEER.to_owned(), name.to_owned())])),
        ..Default::default()
    }
}

/// Creates, on `here`, everything about `there`.
async fn describe_peer(
    here: &Cluster,
    there: &Cluster,
    key: &str,
    endpoint: Option<&str>,
    port: u16,
) -> Result<()> {
    apply(
        here,
        &Configuration {
            metadata: meta(&there.id),
            spec: ConfigurationSpec {
                cluster_id: there.id.clone(),
                remote: there.cidrs.clone(),
            },
            status: None,
        },
    )
    .await?;
    apply(
        here,
        &PublicKey {
            metadata: meta(&there.id),
            spec: PublicKeySpec {
                cluster_id: there.id.clone(),
                public_key: key.to_owned(),
            },
        },
    )
    .await?;
    match endpoint {
        Some(ep) => {
            let (addr, p) = ep
                .rsplit_once(':')
                .with_context(|| format!("endpoint {ep:?} is not address:port"))?;
            apply(
                here,
                &GatewayClient {
                    metadata: meta(&there.id),
                    spec: GatewayClientSpec {
                        cluster_id: there.id.clone(),
                        endpoint: Endpoint {
                            addresses: vec![addr.to_owned()],
                            port: p
                                .parse()
                                .with_context(|| format!("endpoint {ep:?}: bad port"))?,
                        },
                        mtu: 1420,
                    },
                    status: None,
                },
            )
            .await
        }
        None => {
            apply(
                here,
                &GatewayServer {
                    metadata: meta(&there.id),
                    spec: GatewayServerSpec {
                        cluster_id: there.id.clone(),
                        service_type: ServiceType::NodePort,
                        port: i32::from(port),
                        mtu: 1420,
                    },
                    status: None,
                },
            )
            .await
        }
    }
}

async fn seen_as(c: &Cluster, peer: &str, deadline: Instant) -> Result<ClusterCidrs> {
    let api: Api<Configuration> = Api::namespaced(c.client.clone(), &c.ns);
    wait_for(
        deadline,
        &format!(
            "the {} cluster's IPAM to grant CIDRs for {peer} (is fabric-controller running?)",
            c.label
        ),
        || async { Ok(api.get_opt(peer).await?.and_then(|c| c.status?.remote)) },
    )
    .await
}

async fn connected(c: &Cluster, peer: &str, deadline: Instant) -> Result<Option<String>> {
    let api: Api<Connection> = Api::namespaced(c.client.clone(), &c.ns);
    wait_for(
        deadline,
        &format!("the tunnel from the {} cluster to {peer}", c.label),
        || async {
            Ok(api
                .get_opt(peer)
                .await?
                .and_then(|c| c.status)
                .filter(|s| s.value == ConnectionState::Connected)
                .map(|s| s.latency))
        },
    )
    .await
}

async fn peer(local: Cluster, remote: Cluster, server: Side, timeout: Duration) -> Result<()> {
    if local.id == remote.id {
        bail!(
            "both clusters call themselves {:?}: set a distinct FABRIC_CLUSTER_ID in each {}/{CLUSTER_CM}",
            local.id,
            local.ns
        );
    }
    let p = Progress {
        t0: Instant::now(),
        tty: std::io::stdout().is_terminal(),
    };
    let deadline = Instant::now() + timeout;
    println!("Peering {} (local) with {} (remote)", local.id, remote.id);
    p.step("gateway keys");
    ensure_key(&local).await?;
    ensure_key(&remote).await?;
    let (lkey, lep) = identity(&local, deadline).await?;
    let (rkey, rep) = identity(&remote, deadline).await?;
    p.done(&format!(
        "gateways: {} at {lep}, {} at {rep}",
        local.id, remote.id
    ));
    let port = |ep: &str| {
        ep.rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .unwrap_or(51820u16)
    };
    p.step("creating the peering on both sides");
    let (l_ep, r_ep) = match server {
        // The local gateway dials the remote one.
        Side::Remote => (Some(rep.as_str()), None),
        Side::Local => (None, Some(lep.as_str())),
    };
    describe_peer(&local, &remote, &rkey, l_ep, port(&lep)).await?;
    describe_peer(&remote, &local, &lkey, r_ep, port(&rep)).await?;
    p.done("Configuration, PublicKey and gateway endpoint created on both sides");
    p.step("waiting for IPAM");
    let l_view = seen_as(&local, &remote.id, deadline).await?;
    let r_view = seen_as(&remote, &local.id, deadline).await?;
    p.done(&format!(
        "{} sees {}'s pods {} as {}; {} sees {}'s pods {} as {}",
        local.id,
        remote.id,
        remote.cidrs.pod,
        l_view.pod,
        remote.id,
        local.id,
        local.cidrs.pod,
        r_view.pod
    ));
    p.step("waiting for the tunnel");
    let l_lat = connected(&local, &remote.id, deadline).await?;
    let r_lat = connected(&remote, &local.id, deadline).await?;
    p.done(&format!(
        "connected (latency {} / {})",
        l_lat.as_deref().unwrap_or("n/a"),
        r_lat.as_deref().unwrap_or("n/a")
    ));
    Ok(())
}

async fn delete_all<K>(c: &Cluster, name: &str) -> Result<()>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(c.client.clone(), &c.ns);
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e).with_context(|| {
            format!(
                "deleting {} {name} in the {} cluster",
                K::kind(&Default::default()),
                c.label
            )
        }),
    }
}

async fn forget(c: &Cluster, peer: &str, deadline: Instant) -> Result<()> {
    delete_all::<GatewayClient>(c, peer).await?;
    delete_all::<GatewayServer>(c, peer).await?;
    delete_all::<PublicKey>(c, peer).await?;
    delete_all::<Configuration>(c, peer).await?;
    let cfgs: Api<Configuration> = Api::namespaced(c.client.clone(), &c.ns);
    let nets: Api<Network> = Api::namespaced(c.client.clone(), &c.ns);
    let conns: Api<Connection> = Api::namespaced(c.client.clone(), &c.ns);
    wait_for(
        deadline,
        &format!(
            "the {} cluster to release {peer} (IPAM finalizer, gateway)",
            c.label
        ),
        || async {
            let sel = format!("{}={peer}", label::PEER);
            let gone = cfgs.get_opt(peer).await?.is_none()
                && nets
                    .list(&ListParams::default().labels(&sel))
                    .await?
                    .items
                    .is_empty()
                && conns.get_opt(peer).await?.is_none();
            Ok(gone.then_some(()))
        },
    )
    .await
}

#[derive(Serialize)]
struct PeerRow {
    peer: String,
    pod_cidr: String,
    pod_seen_as: Option<String>,
    external_cidr: String,
    external_seen_as: Option<String>,
    tunnel: String,
    latency: Option<String>,
    rx_bytes: i64,
    tx_bytes: i64,
}

async fn status(c: &Client, ns: &str, output: Output) -> Result<()> {
    let cfgs = Api::<Configuration>::namespaced(c.clone(), ns)
        .list(&ListParams::default())
        .await?;
    let conns = Api::<Connection>::namespaced(c.clone(), ns)
        .list(&ListParams::default())
        .await?;
    let rows: Vec<PeerRow> = cfgs
        .items
        .iter()
        .map(|cfg| {
            let seen = cfg.status.as_ref().and_then(|s| s.remote.clone());
            let conn = conns
                .items
                .iter()
                .find(|x| x.spec.cluster_id == cfg.spec.cluster_id)
                .and_then(|x| x.status.clone());
            PeerRow {
                peer: cfg.spec.cluster_id.clone(),
                pod_cidr: cfg.spec.remote.pod.clone(),
                pod_seen_as: seen.as_ref().map(|s| s.pod.clone()),
                external_cidr: cfg.spec.remote.external.clone(),
                external_seen_as: seen.map(|s| s.external),
                tunnel: conn
                    .as_ref()
                    .map_or("NoGateway".into(), |s| format!("{:?}", s.value)),
                latency: conn.as_ref().and_then(|s| s.latency.clone()),
                rx_bytes: conn.as_ref().map_or(0, |s| s.rx_bytes),
                tx_bytes: conn.as_ref().map_or(0, |s| s.tx_bytes),
            }
        })
        .collect();
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
        Output::Yaml => print!("{}", serde_saphyr::to_string(&rows)?),
        Output::Table => {
            println!(
                "{:<16} {:<18} {:<18} {:<18} {:<18} {:<11} {:>9} {:>12} {:>12}",
                "PEER",
                "POD CIDR",
                "SEEN AS",
                "EXTERNAL CIDR",
                "SEEN AS",
                "TUNNEL",
                "LATENCY",
                "RX",
                "TX"
            );
            for r in &rows {
                println!(
                    "{:<16} {:<18} {:<18} {:<18} {:<18} {:<11} {:>9} {:>12} {:>12}",
                    r.peer,
                    r.pod_cidr,
                    r.pod_seen_as.as_deref().unwrap_or("-"),
                    r.external_cidr,
                    r.external_seen_as.as_deref().unwrap_or("-"),
                    r.tunnel,
                    r.latency.as_deref().unwrap_or("-"),
                    r.rx_bytes,
                    r.tx_bytes
                );
            }
            if rows.is_empty() {
                println!("(no peers; connect one with `fabricctl peer --remote-kubeconfig ...`)");
            }
        }
    }
    Ok(())
}

/// Data planes pinned under /sys/fs/bpf (directories holding the interface map).
fn pinned_dataplanes() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir("/sys/fs/bpf")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("FABRIC_IFACES").exists())
        .collect();
    out.sort();
    out
}

#[derive(Serialize)]
struct Dump {
    dataplanes: Vec<(PathBuf, fabric_dataplane::Snapshot)>,
    routes: Vec<String>,
    /// The overlay device between nodes and gateway, when there is one.
    overlay: Option<OverlayDump>,
}

#[derive(Serialize)]
struct OverlayDump {
    device: String,
    vni: Option<u32>,
    port: Option<u16>,
    mac: String,
    /// Remote endpoints with both their forwarding and neighbour entries.
    endpoints: Vec<std::net::Ipv4Addr>,
    /// Remote endpoints with only one of the two (the agent or operator restores the other).
    incomplete: Vec<std::net::Ipv4Addr>,
    foreign_entries: usize,
}

fn ifname(i: u32) -> String {
    fabric_dataplane::sys::ifname(i).unwrap_or_else(|| i.to_string())
}

/// Our routes (protocol 250) and the overlay device in the current network namespace.
async fn fabric_routing_state() -> Result<(Vec<String>, Option<OverlayDump>)> {
    use fabric_routing::overlay;
    let (conn, handle, _) = rtnetlink::new_connection().context("netlink")?;
    tokio::spawn(conn);
    let mut routes: Vec<String> = fabric_routing::routes::current(&handle)
        .await
        .context("listing routes")?
        .into_iter()
        .map(|r| match r.dev {
            Some(d) => format!("{} via {} dev {} onlink", r.dst, r.via, ifname(d)),
            None => format!("{} via {}", r.dst, r.via),
        })
        .collect();
    routes.sort();
    let ov = overlay::inspect(&handle, overlay::DEFAULT_DEVICE)
        .await
        .context("reading the overlay device")?
        .map(|i| {
            let (endpoints, incomplete) = i.endpoints();
            OverlayDump {
                device: overlay::DEFAULT_DEVICE.into(),
                vni: i.vni,
                port: i.port,
                mac: i
                    .mac
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<Vec<_>>()
                    .join(":"),
                endpoints,
                incomplete,
                foreign_entries: i.foreign,
            }
        });
    Ok((routes, ov))
}

fn network_dump(pin_dirs: Vec<PathBuf>, output: Output) -> Result<()> {
    let dirs = if pin_dirs.is_empty() {
        pinned_dataplanes()
    } else {
        pin_dirs
    };
    let mut dump = Dump {
        dataplanes: Vec::new(),
        routes: Vec::new(),
        overlay: None,
    };
    for d in dirs {
        let snap = fabric_dataplane::Maps::open_pinned(&d)
            .and_then(|m| m.snapshot())
            .with_context(|| format!("reading the data plane pinned at {}", d.display()))?;
        dump.dataplanes.push((d, snap));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    (dump.routes, dump.overlay) = rt.block_on(fabric_routing_state())?;
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&dump)?),
        Output::Yaml => print!("{}", serde_saphyr::to_string(&dump)?),
        Output::Table => {
            for (d, snap) in &dump.dataplanes {
                println!(
                    "== data plane pinned at {}\n{}",
                    d.display(),
                    snap.to_table()
                );
            }
            if dump.dataplanes.is_empty() {
                println!("== no data plane pinned under /sys/fs/bpf (is this a gateway host?)\n");
            }
            println!("== fabric routes (proto 250)");
            for r in &dump.routes {
                println!("  {r}");
            }
            if dump.routes.is_empty() {
                println!("  (none)");
            }
            match &dump.overlay {
                None => println!("== no overlay device"),
                Some(o) => {
                    println!(
                        "== overlay {} (VNI {}, UDP {}, MAC {})",
                        o.device,
                        o.vni.map_or("?".into(), |v| v.to_string()),
                        o.port.map_or("?".into(), |v| v.to_string()),
                        o.mac
                    );
                    for e in &o.endpoints {
                        println!("  endpoint {e}");
                    }
                    for e in &o.incomplete {
                        println!(
                            "  endpoint {e} (incomplete: forwarding or neighbour entry missing)"
                        );
                    }
                    if o.endpoints.is_empty() && o.incomplete.is_empty() {
                        println!("  (no endpoints)");
                    }
                    if o.foreign_entries > 0 {
                        println!("  {} entries not written by the fabric", o.foreign_entries);
                    }
                }
            }
        }
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // Inspecting a host: switch namespace before any thread exists, then stay synchronous.
    if let Cmd::Network(NetworkCmd::Dump {
        pin_dir,
        netns,
        output,
    }) = &cli.cmd
    {
        let r = netns
            .as_deref()
            .map_or(Ok(()), fabric_dataplane::sys::enter_netns)
            .map_err(anyhow::Error::from)
            .and_then(|()| network_dump(pin_dir.clone(), *output));
        return match r {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<()> {
    let local = client(cli.kubeconfig.as_ref(), "local").await?;
    match cli.cmd {
        Cmd::Peer {
            remote_kubeconfig,
            server,
            timeout_secs,
        } => {
            let remote = client(Some(&remote_kubeconfig), "remote").await?;
            let l = cluster("local", local, &cli.namespace).await?;
            let r = cluster("remote", remote, &cli.namespace).await?;
            peer(l, r, server, Duration::from_secs(timeout_secs)).await
        }
        Cmd::Unpeer {
            remote_kubeconfig,
            timeout_secs,
        } => {
            let remote = client(Some(&remote_kubeconfig), "remote").await?;
            let l = cluster("local", local, &cli.namespace).await?;
            let r = cluster("remote", remote, &cli.namespace).await?;
            let deadline = Instant::now() + Duration::from_secs(timeout_secs);
            forget(&l, &r.id, deadline).await?;
            forget(&r, &l.id, deadline).await?;
            println!(
                "unpeered {} and {}: no peering resources left on either side",
                l.id, r.id
            );
            Ok(())
        }
        Cmd::Status { output } => status(&local, &cli.namespace, output).await,
        Cmd::Network(_) => unreachable!("handled before the runtime starts"),
    }
}
