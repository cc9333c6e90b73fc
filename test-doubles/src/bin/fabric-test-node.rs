//! The test clusters' kubelet stand-in (see `fabric_test_doubles::testnode`): run one per node,
//! inside the node's network namespace, with a kubeconfig that reaches the API server.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::{Ipv4Addr, SocketAddr},
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context as _, Result};
use clap::Parser;
use fabric_test_doubles::testnode::{node, podnet, pods, proxy, server};
use ipnetwork::Ipv4Network;
use tracing::info;

#[derive(Parser)]
#[command(
    about = "Test node: registers a Node, runs the pods bound to it as processes in network namespaces"
)]
struct Cli {
    /// Run in this network namespace (a name under /run/netns, or a path), entered by the
    /// process itself: unlike under `ip netns exec`, the pods' namespaces it creates are then
    /// mounted where everyone sees them.
    #[arg(long)]
    netns: Option<String>,
    #[arg(long)]
    node_name: String,
    /// The node's address (InternalIP; the kubelet API listens on it).
    #[arg(long)]
    node_ip: Ipv4Addr,
    #[arg(long, default_value_t = 10250)]
    kubelet_port: u16,
    /// The node's pod range: pods get addresses from it.
    #[arg(long)]
    pod_cidr: Ipv4Network,
    /// Also publish the range as the Node's spec.podCIDRs when this process creates the Node
    /// (what node IPAM would do).
    #[arg(long)]
    publish_pod_cidr: bool,
    /// The pods' next hop; default: the range's first address.
    #[arg(long)]
    pod_gateway: Option<Ipv4Addr>,
    /// Addresses of the range that are in use otherwise (repeatable).
    #[arg(long = "reserve")]
    reserved: Vec<Ipv4Addr>,
    #[arg(long, default_value = "4")]
    cpu: String,
    #[arg(long, default_value = "8Gi")]
    memory: String,
    #[arg(long, default_value_t = 110)]
    max_pods: u32,
    /// More capacity, `name=quantity` (e.g. nvidia.com/gpu=2; repeatable).
    #[arg(long = "capacity")]
    capacity: Vec<String>,
    /// Node labels, `key=value` (repeatable; applied when this process creates the Node).
    #[arg(long = "label")]
    labels: Vec<String>,
    /// Taints, `key[=value]:Effect` (repeatable; applied when this process creates the Node).
    #[arg(long = "register-with-taint")]
    taints: Vec<String>,
    /// Every pod hollow: Running with an address, no namespace, no process.
    #[arg(long)]
    hollow: bool,
    /// Container logs go here.
    #[arg(long)]
    root_dir: PathBuf,
    /// First restart delay (doubles per restart, at most 5 min).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    restart_backoff: Duration,
    #[arg(long, default_value = "40s", value_parser = humantime::parse_duration)]
    lease_duration: Duration,
    /// Serving certificate and key (PEM); default: a self-signed one.
    #[arg(long, requires = "tls_private_key_file")]
    tls_cert_file: Option<PathBuf>,
    #[arg(long, requires = "tls_cert_file")]
    tls_private_key_file: Option<PathBuf>,
    /// Also be the node's service proxy: Service cluster IPs DNATed to ready endpoints in an
    /// nftables table of its own in this namespace (removed on shutdown). Only in a namespace
    /// of the node's own (`--netns`).
    #[arg(long, requires = "netns")]
    service_proxy: bool,
}

fn kv(s: &str) -> Result<(String, String)> {
    let (k, v) = s
        .split_once('=')
        .with_context(|| format!("{s:?}: want key=value"))?;
    Ok((k.to_owned(), v.to_owned()))
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let cli = Cli::parse();
    let r = (|| {
        // Before any thread starts: threads inherit the namespace of the one creating them.
        if let Some(ns) = &cli.netns {
            fabric_netns::enter(ns).with_context(|| format!("entering {ns}"))?;
        }
        tokio::runtime::Runtime::new()
            .context("starting the runtime")?
            .block_on(run(cli))
    })();
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<()> {
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API (KUBECONFIG)")?;
    let mut capacity: BTreeMap<String, String> = [
        ("cpu", cli.cpu.clone()),
        ("memory", cli.memory.clone()),
        ("pods", cli.max_pods.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    for c in &cli.capacity {
        let (k, v) = kv(c)?;
        fabric_api::quantity::milli(&v).with_context(|| format!("capacity {c}"))?;
        capacity.insert(k, v);
    }
    let reg = node::Registration {
        name: cli.node_name.clone(),
        ip: cli.node_ip.to_string(),
        kubelet_port: cli.kubelet_port,
        capacity,
        labels: cli.labels.iter().map(|l| kv(l)).collect::<Result<_>>()?,
        taints: cli
            .taints
            .iter()
            .map(|t| node::parse_taint(t))
            .collect::<Result<_>>()?,
        pod_cidr: cli.publish_pod_cidr.then(|| cli.pod_cidr.to_string()),
        lease_duration: cli.lease_duration,
    };
    let logs: pods::LogIndex = Arc::default();
    std::fs::create_dir_all(&cli.root_dir)
        .with_context(|| format!("creating {}", cli.root_dir.display()))?;
    let gateway = cli
        .pod_gateway
        .unwrap_or_else(|| Ipv4Addr::from(u32::from(cli.pod_cidr.network()) + 1));
    let tls = server::Tls {
        cert: cli
            .tls_cert_file
            .clone()
            .zip(cli.tls_private_key_file.clone()),
        sans: vec![cli.node_ip.to_string(), cli.node_name.clone()],
    };
    let addr = SocketAddr::from((cli.node_ip, cli.kubelet_port));
    let srv = tokio::spawn(server::serve(addr, tls, logs.clone()));
    node::register(&client, &reg).await?;
    info!(node = cli.node_name, %addr, pod_cidr = %cli.pod_cidr, "node ready");
    tokio::spawn(node::keep_lease(client.clone(), reg));
    let proxy = cli.service_proxy;
    let proxy_client = client.clone();
    let proxy_task = async move {
        if proxy {
            proxy::run(proxy_client).await
        } else {
            std::future::pending().await
        }
    };
    let state = Arc::new(pods::Node {
        client,
        name: cli.node_name,
        ip: cli.node_ip.to_string(),
        pod_cidr: cli.pod_cidr,
        pod_gateway: gateway,
        hollow: cli.hollow,
        root: cli.root_dir,
        backoff: cli.restart_backoff,
        logs,
        taken: Mutex::new(cli.reserved.into_iter().collect::<BTreeSet<_>>()),
        bin_dir: std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(PathBuf::from)),
        seq: Default::default(),
    });
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("SIGTERM handler")?;
    let r = tokio::select! {
        () = pods::run(state) => Err(anyhow::anyhow!("the pod watch ended")),
        r = srv => r.context("kubelet API task").and_then(|r| r.context("kubelet API")),
        r = proxy_task => r.context("service proxy"),
        // The pods' processes die with this one; their namespaces would stay until a reaper
        // came by.
        _ = term.recv() => Ok(()),
        _ = tokio::signal::ctrl_c() => Ok(()),
    };
    // Also on an error: the pods' processes die with this one.
    podnet::remove_all();
    if proxy {
        proxy::remove();
    }
    r
}
