//! The command line.
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(
    name = "fabricctl",
    version,
    about = "Peer Kubernetes clusters through the fabric"
)]
pub struct Cli {
    /// Kubeconfig of the local cluster (default: $KUBECONFIG or ~/.kube/config).
    #[arg(long, global = true, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Namespace the fabric runs in.
    #[arg(long, short = 'n', global = true, default_value = fabric_api::names::DEFAULT_NAMESPACE)]
    pub namespace: String,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
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
pub enum NetworkCmd {
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

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Side {
    Local,
    Remote,
}

impl From<Side> for fabric_peering::Side {
    fn from(s: Side) -> Self {
        match s {
            Side::Local => Self::Local,
            Side::Remote => Self::Remote,
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Output {
    Table,
    Json,
    Yaml,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults() {
        let cli =
            Cli::try_parse_from(["fabricctl", "peer", "--remote-kubeconfig", "b.yaml"]).unwrap();
        assert_eq!(cli.namespace, "fabric-system");
        let Cmd::Peer {
            server,
            timeout_secs,
            ..
        } = cli.cmd
        else {
            panic!("peer expected")
        };
        assert_eq!((server, timeout_secs), (Side::Remote, 120));
        let cli = Cli::try_parse_from(["fabricctl", "status", "-o", "json", "-n", "x"]).unwrap();
        assert_eq!(cli.namespace, "x");
        assert!(matches!(
            cli.cmd,
            Cmd::Status {
                output: Output::Json
            }
        ));
        assert!(Cli::try_parse_from(["fabricctl", "peer"]).is_err());
    }
}
