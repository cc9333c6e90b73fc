//! fabric-agent: the per-node agent. For now it owns the data plane on a device set: apply a
//! configuration, show maps and counters, and reset.
use std::{
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand, ValueEnum};
use fabric_dataplane::{DEFAULT_PIN_DIR, Dataplane, DataplaneConfig, Maps, sys};

mod health;
mod run;

#[derive(Parser)]
#[command(name = "fabric-agent", version, about = "fabric node agent")]
struct Cli {
    /// Run inside this network namespace (a name under /run/netns, or a path). The agent
    /// enters it itself, keeping the host's BPF filesystem mount (unlike `ip netns exec`).
    #[arg(long, global = true, env = "FABRIC_NETNS")]
    netns: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the node agent: keep a route to the gateway for every remapped peer CIDR the
    /// cluster's Configurations grant, and repair it when it drifts.
    #[command(group(clap::ArgGroup::new("next_hop").required(true).args(["gateway", "gateway_from_lease"])))]
    Run {
        /// Next hop for the peer CIDRs (the gateway, or what reaches it).
        #[arg(long, env = "FABRIC_GATEWAY_IP")]
        gateway: Option<Ipv4Addr>,
        /// Route to the active gateway replica instead: the address its operator publishes on
        /// this Lease (NAMESPACE/NAME, or NAME in fabric-system; without a value the gateway
        /// Lease), followed as replicas take over.
        #[arg(
            long,
            env = "FABRIC_GATEWAY_LEASE",
            num_args = 0..=1,
            default_missing_value = fabric_api::names::lease::GATEWAY
        )]
        gateway_from_lease: Option<run::LeaseRef>,
        /// The fabric's namespace: the only one whose Configurations the agent reads (it
        /// routes what they grant, so nobody who may write objects elsewhere can steer it).
        #[arg(long, env = "FABRIC_NAMESPACE", default_value = fabric_api::names::DEFAULT_NAMESPACE)]
        namespace: String,
        /// Full re-check period (route changes trigger one at once).
        #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
        interval: Duration,
        /// Serve /metrics and /healthz here.
        #[arg(long, env = "FABRIC_METRICS_ADDR")]
        metrics_addr: Option<SocketAddr>,
        /// Manage routes in this network namespace (a name under /run/netns, or a path)
        /// while talking to the API from the agent's own.
        #[arg(long)]
        route_netns: Option<String>,
        /// Reach the gateway through a VXLAN overlay (device fabric.vx) instead of routing to
        /// its address directly: needed unless the gateway's address is on a subnet of every
        /// node (flat network or host-network gateway). The gateway operator must run with
        /// --overlay too.
        #[arg(long, env = "FABRIC_OVERLAY", requires = "node_ip")]
        overlay: bool,
        /// This node's address on the cluster network: the overlay's local endpoint (the
        /// downward API's status.hostIP).
        #[arg(long, env = "NODE_IP")]
        node_ip: Option<Ipv4Addr>,
        /// Pin the overlay guard here (a directory on a BPF filesystem) so that it keeps
        /// guarding the overlay port while the agent restarts.
        #[arg(
            long,
            env = "FABRIC_GUARD_PIN_DIR",
            default_value = "/sys/fs/bpf/fabric-overlay-guard"
        )]
        guard_pin_dir: PathBuf,
        #[command(flatten)]
        overlay_args: fabric_routing::overlay::OverlayArgs,
        /// /healthz fails (and the liveness probe restarts the agent) once a watch of the API,
        /// the routes or the overlay has kept failing this long.
        #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
        unhealthy_after: Duration,
    },
    /// The eBPF data plane (remap programs and their maps).
    #[command(subcommand)]
    Datapath(Datapath),
}

#[derive(Subcommand)]
enum Datapath {
    /// Load and attach the programs and make the maps match a configuration file. Idempotent;
    /// running it again reloads the programs in place without dropping traffic.
    Apply {
        #[arg(long, short = 'c')]
        config: PathBuf,
        #[arg(long, default_value = DEFAULT_PIN_DIR, env = "FABRIC_PIN_DIR")]
        pin_dir: PathBuf,
    },
    /// Show peers, remaps, external mappings, counters and drops.
    Show {
        #[arg(long, default_value = DEFAULT_PIN_DIR, env = "FABRIC_PIN_DIR")]
        pin_dir: PathBuf,
        #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Check a configuration file without touching the kernel.
    Check {
        #[arg(long, short = 'c')]
        config: PathBuf,
    },
    /// Measure the programs' per-packet cost in the kernel (BPF_PROG_TEST_RUN), against a
    /// pass-through baseline from the same run. Touches no device and no pinned map.
    Bench {
        #[arg(long, default_value_t = 1_000_000)]
        repeat: u32,
        #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Detach the programs from every device and remove every pin.
    Reset {
        #[arg(long, default_value = DEFAULT_PIN_DIR, env = "FABRIC_PIN_DIR")]
        pin_dir: PathBuf,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The long-running agent reports what it does; one-shot commands stay quiet.
    let default = if matches!(cli.cmd, Cmd::Run { .. }) {
        "info"
    } else {
        "warn"
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default)),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    if let Some(ns) = &cli.netns {
        sys::enter_netns(ns)?;
    }
    match cli.cmd {
        Cmd::Run {
            gateway,
            gateway_from_lease,
            namespace,
            interval,
            metrics_addr,
            route_netns,
            overlay,
            node_ip,
            guard_pin_dir,
            overlay_args,
            unhealthy_after,
        } => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            rt.block_on(async {
                let client = kube::Client::try_default()
                    .await
                    .context("connecting to the Kubernetes API (in-cluster or KUBECONFIG)")?;
                run::run(
                    client,
                    run::Opts {
                        gateway: match (gateway, gateway_from_lease) {
                            (Some(ip), _) => run::NextHop::Fixed(ip),
                            (None, Some(lease)) => run::NextHop::Lease(lease),
                            (None, None) => {
                                anyhow::bail!("--gateway or --gateway-from-lease is required")
                            }
                        },
                        namespace,
                        interval,
                        metrics_addr,
                        route_netns,
                        overlay: match (overlay, node_ip) {
                            (true, Some(node_ip)) => Some(run::OverlayOpts {
                                overlay: overlay_args.overlay(),
                                node_ip,
                                guard_pin_dir: Some(guard_pin_dir),
                            }),
                            (true, None) => anyhow::bail!("--overlay needs --node-ip (NODE_IP)"),
                            (false, _) => None,
                        },
                        unhealthy_after,
                    },
                )
                .await
            })?;
        }
        Cmd::Datapath(Datapath::Apply { config, pin_dir }) => {
            let cfg = DataplaneConfig::from_file(&config)?;
            warn_about(&config, &cfg);
            let r = Dataplane::load_and_apply(&pin_dir, &cfg).with_context(|| {
                format!("applying the data plane (pins in {})", pin_dir.display())
            })?;
            println!(
                "applied {}: {} map writes; attached {:?}, reloaded {:?}, detached {:?}",
                config.display(),
                r.map_writes,
                r.attached,
                r.replaced,
                r.detached
            );
        }
        Cmd::Datapath(Datapath::Show { pin_dir, output }) => {
            let snap = Maps::open_pinned(&pin_dir)?.snapshot()?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&snap)?),
                Output::Table => print!("{}", snap.to_table()),
            }
        }
        Cmd::Datapath(Datapath::Check { config }) => {
            let cfg = DataplaneConfig::from_file(&config)?;
            warn_about(&config, &cfg);
            println!(
                "{}: ok ({} peers, {} external mappings)",
                config.display(),
                cfg.peers.len(),
                cfg.externals.len()
            );
        }
        Cmd::Datapath(Datapath::Bench { repeat, output }) => {
            let rows = fabric_dataplane::bench::run(repeat)?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
                Output::Table => {
                    let base = rows.first().map_or(1.0, |r| r.ns_per_packet.max(1.0));
                    println!(
                        "{:<28} {:<8} {:>10} {:>14}",
                        "CASE", "DIR", "NS/PKT", "VS BASELINE"
                    );
                    for r in &rows {
                        println!(
                            "{:<28} {:<8} {:>10.1} {:>13.2}x",
                            r.case,
                            if r.egress { "egress" } else { "ingress" },
                            r.ns_per_packet,
                            r.ns_per_packet / base
                        );
                    }
                    println!(
                        "({repeat} runs per case; baseline = a frame the program passes at its first check)"
                    );
                }
            }
        }
        Cmd::Datapath(Datapath::Reset { pin_dir }) => {
            let detached = Dataplane::reset(&pin_dir)?;
            println!("reset {}: detached from {detached:?}", pin_dir.display());
        }
    }
    Ok(())
}

/// A configuration that is valid but probably not meant (e.g. peers that may reach no local
/// pod) still runs; whoever runs it is told on stderr.
fn warn_about(path: &Path, cfg: &DataplaneConfig) {
    for w in cfg.warnings() {
        eprintln!("warning: {}: {w}", path.display());
    }
}
