//! fabric-controller: runs the cluster-level controllers (IPAM and peer ids for now).
use anyhow::{Context as _, Result};
use clap::Parser;
use fabric_controller::ipam;
use ipnetwork::Ipv4Network;

#[derive(Parser)]
#[command(
    name = "fabric-controller",
    version,
    about = "fabric cluster controllers"
)]
struct Cli {
    /// This cluster's pod CIDR (never granted to a peer).
    #[arg(long, env = "FABRIC_POD_CIDR")]
    pod_cidr: Ipv4Network,
    /// This cluster's service CIDR.
    #[arg(long, env = "FABRIC_SERVICE_CIDR")]
    service_cidr: Ipv4Network,
    /// This cluster's external CIDR.
    #[arg(long, env = "FABRIC_EXTERNAL_CIDR")]
    external_cidr: Ipv4Network,
    /// Further ranges in use here (node subnets, ...), comma separated.
    #[arg(long, env = "FABRIC_RESERVED", value_delimiter = ',', value_parser = cidr_or_empty)]
    reserved: Vec<Option<Ipv4Network>>,
    /// Where remapped CIDRs are carved from, comma separated.
    #[arg(
        long,
        env = "FABRIC_POOLS",
        value_delimiter = ',',
        default_value = "10.64.0.0/10"
    )]
    pools: Vec<Ipv4Network>,
}

/// An empty item (as in `FABRIC_RESERVED=` from a ConfigMap) means none.
fn cidr_or_empty(s: &str) -> Result<Option<Ipv4Network>, String> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(None);
    }
    s.parse().map(Some).map_err(|e| format!("{s:?}: {e}"))
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let cli = Cli::parse();
    let mut reserved = vec![cli.pod_cidr, cli.service_cidr, cli.external_cidr];
    reserved.extend(cli.reserved.into_iter().flatten());
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API (in-cluster or KUBECONFIG)")?;
    ipam::run(
        client,
        ipam::Settings {
            pools: cli.pools,
            reserved,
        },
    )
    .await
    .context("IPAM controller")
}
