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

// Parsed once at start-up; boxing the larger variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub enum Cmd {
    /// Peer the local cluster with a remote one (both directions) and wait until connected;
    /// `peer out-of-band` peers with a provider of another organization through its peer
    /// command instead.
    #[command(subcommand_negates_reqs = true, args_conflicts_with_subcommands = true)]
    Peer {
        #[command(subcommand)]
        flow: Option<PeerFlow>,
        #[arg(long, required = true)]
        remote_kubeconfig: Option<PathBuf>,
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
    /// This cluster and the clusters it knows, each module of each peering (authentication,
    /// network, resources, virtual node) at a glance; `info peer [ID]` for one peer in detail.
    Info {
        #[command(subcommand)]
        what: Option<InfoCmd>,
        #[arg(long, short = 'o', value_enum, default_value_t = Output::Table, global = true)]
        output: Output,
    },
    /// What the fabric programmed on this machine (run it on a node or gateway host).
    #[command(subcommand)]
    Network(NetworkCmd),
    /// Generate what another cluster needs to peer with this one.
    #[command(subcommand)]
    Generate(GenerateCmd),
    /// Peering tokens of this (provider) cluster.
    #[command(subcommand)]
    Token(TokenCmd),
}

#[derive(Subcommand)]
pub enum PeerFlow {
    /// Authenticate to a provider with the command its admin printed (`fabricctl generate
    /// peer-command` there): this cluster gets an identity of its own on the provider, and
    /// no cluster holds the other's admin credentials.
    OutOfBand {
        /// The provider's authentication service.
        #[arg(long)]
        auth_url: String,
        /// The provider's cluster id.
        #[arg(long)]
        cluster_id: String,
        /// The peering token.
        #[arg(long, env = "FABRIC_PEERING_TOKEN", hide_env_values = true)]
        token: String,
        /// The SHA-256 of the authentication service's certificate (`sha256:<hex>`).
        #[arg(long, conflicts_with = "auth_ca")]
        auth_pin: Option<String>,
        /// Verify the authentication service's certificate with this CA (PEM) instead.
        #[arg(long)]
        auth_ca: Option<PathBuf>,
        /// CPU to ask the provider for (e.g. `4`, `500m`); with any resource asked for, the
        /// provider shows up here as a virtual node with what it granted.
        #[arg(long)]
        cpu: Option<String>,
        /// Memory to ask for (e.g. `8Gi`).
        #[arg(long)]
        memory: Option<String>,
        /// Pods to ask for.
        #[arg(long)]
        pods: Option<String>,
        /// Any other resource, `NAME=QUANTITY` (`nvidia.com/gpu=1`); repeatable.
        #[arg(long = "resource")]
        resources: Vec<String>,
        /// How long to follow the network, resources and virtual node coming up (0: return
        /// once authenticated).
        #[arg(long, default_value_t = 180)]
        timeout_secs: u64,
    },
}

#[derive(Subcommand)]
pub enum GenerateCmd {
    /// Print the command a consumer cluster runs to peer with this (provider) cluster.
    PeerCommand {
        /// Where consumers reach this cluster's authentication service (the `fabric-auth`
        /// Service's external address).
        #[arg(long, env = "FABRIC_AUTH_URL")]
        auth_url: String,
        /// Give the command its own token that expires after this long (e.g. `1h`, `7d`);
        /// default: the cluster's standing token, valid until `fabricctl token rotate`.
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Option<std::time::Duration>,
    },
}

#[derive(Subcommand)]
pub enum TokenCmd {
    /// Revoke every peering token (commands printed before are refused from then on) and
    /// create a new standing one.
    Rotate,
}

#[derive(Subcommand)]
pub enum InfoCmd {
    /// One peer (or every known one): authentication, network, resources and virtual node.
    Peer {
        /// The peer's cluster id (default: every known peer).
        id: Option<String>,
    },
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
            flow: None,
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
        let cli = Cli::try_parse_from(["fabricctl", "info", "peer", "b", "-o", "yaml"]).unwrap();
        assert!(matches!(
            cli.cmd,
            Cmd::Info {
                what: Some(InfoCmd::Peer { id: Some(_) }),
                output: Output::Yaml
            }
        ));
    }

    #[test]
    fn the_printed_peer_command_parses() {
        let cmd = fabric_sharing::auth::token::PeerCommand {
            auth_url: "https://192.0.2.1:31443".to_owned(),
            cluster_id: "provider".to_owned(),
            token: "ab".repeat(32),
            auth_pin: Some(format!("sha256:{}", "0".repeat(64))),
        };
        let cli =
            Cli::try_parse_from(std::iter::once("fabricctl".to_owned()).chain(cmd.args())).unwrap();
        let Cmd::Peer {
            flow:
                Some(PeerFlow::OutOfBand {
                    cluster_id,
                    auth_pin: Some(_),
                    auth_ca: None,
                    ..
                }),
            remote_kubeconfig: None,
            ..
        } = cli.cmd
        else {
            panic!("peer out-of-band expected")
        };
        assert_eq!(cluster_id, "provider");
        assert!(
            Cli::try_parse_from([
                "fabricctl",
                "peer",
                "out-of-band",
                "--auth-url",
                "https://x",
                "--cluster-id",
                "p",
                "--token",
                "t",
                "--auth-pin",
                "p",
                "--auth-ca",
                "c"
            ])
            .is_err()
        );
        let cli = Cli::try_parse_from([
            "fabricctl",
            "generate",
            "peer-command",
            "--auth-url",
            "https://x",
            "--ttl",
            "1h",
        ])
        .unwrap();
        assert!(
            matches!(cli.cmd, Cmd::Generate(GenerateCmd::PeerCommand { ttl: Some(t), .. }) if t.as_secs() == 3600)
        );
        assert!(matches!(
            Cli::try_parse_from(["fabricctl", "token", "rotate"])
                .unwrap()
                .cmd,
            Cmd::Token(TokenCmd::Rotate)
        ));
    }
}
