//! The command line.
use std::{ffi::OsString, path::PathBuf};

use fabric_api::offloading::v1alpha1::{MappingStrategy, PodOffloadingStrategy, StorageRetention};

use clap::{
    Parser, Subcommand, ValueEnum,
    builder::StyledStr,
    error::{ContextKind, ContextValue, ErrorKind},
};

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
    /// Peer with a provider whose admin kubeconfig is at hand (`--remote-kubeconfig`): a
    /// one-time token is minted there and the out-of-band flow runs with it, so the end state
    /// is the same (an identity of this cluster's own, negotiated network, resources, virtual
    /// node) and the provider's admin credentials are never kept. `--network-only` connects
    /// the networks of two clusters of one organization directly instead (both directions).
    /// `peer out-of-band` peers with a provider of another organization through its peer
    /// command.
    #[command(subcommand_negates_reqs = true, args_conflicts_with_subcommands = true)]
    Peer {
        #[command(subcommand)]
        flow: Option<PeerFlow>,
        /// The provider's admin kubeconfig (used during the command only, never stored).
        #[arg(long, required = true)]
        remote_kubeconfig: Option<PathBuf>,
        /// Connect the networks only, writing both clusters' network objects directly (for
        /// clusters of one organization: no identity, resources or virtual node).
        #[arg(long)]
        network_only: bool,
        /// Where consumers reach the provider's authentication service (the `fabric-auth`
        /// Service's external address).
        #[arg(
            long,
            env = "FABRIC_AUTH_URL",
            required_unless_present = "network_only"
        )]
        auth_url: Option<String>,
        #[command(flatten)]
        ask: AskArgs,
        /// `--network-only`: which side's gateway listens (the other dials it).
        #[arg(long, value_enum, default_value_t = Side::Remote)]
        server: Side,
        /// How long to wait for the peering to come up (0 with the sharing flow: return once
        /// authenticated).
        #[arg(long, default_value_t = 120)]
        timeout_secs: u64,
    },
    /// Remove a peering. With a provider this cluster consumes from: the slices, the virtual
    /// node, the network and the identity here, and the tenant there (by the provider's
    /// controllers); `--force` when the provider is unreachable. With `--network-only` (or no
    /// sharing peering with the remote): the network objects on both sides.
    Unpeer {
        /// The provider's cluster id (default: the cluster of `--remote-kubeconfig`).
        peer: Option<String>,
        /// The remote cluster's admin kubeconfig: needed with `--network-only`; otherwise used
        /// to wait until the provider's side is gone too.
        #[arg(long, required_unless_present = "peer")]
        remote_kubeconfig: Option<PathBuf>,
        /// Remove a network-only peering (`peer --network-only`).
        #[arg(long, requires = "remote_kubeconfig")]
        network_only: bool,
        /// Remove this side at once, without waiting for the provider to answer (when it is
        /// unreachable); prints what is left there.
        #[arg(long, conflicts_with = "network_only")]
        force: bool,
        /// Unpeer even though the provider keeps claims of this cluster with their data
        /// (storageRetention Retain), which this cluster can no longer see or delete
        /// afterwards: they are left to the provider's admin. Without it, such an unpeer is
        /// refused, naming them (`fabricctl forget volumes` deletes them first).
        #[arg(long, conflicts_with = "network_only")]
        leave_volumes: bool,
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
    /// Offload namespaces to the providers: each gets a twin namespace on the providers its
    /// selector selects, where its pods may run.
    #[command(subcommand)]
    Offload(OffloadCmd),
    /// Stop offloading namespaces: their twins are removed from the providers (said
    /// beforehand), and their pods running there end Failed; the claims of their volumes stay
    /// on the providers under storageRetention Retain (`fabricctl forget volumes`).
    #[command(subcommand)]
    Unoffload(UnoffloadCmd),
    /// Delete what a provider keeps for this cluster.
    #[command(subcommand)]
    Forget(ForgetCmd),
    /// Move what the fabric holds.
    #[command(subcommand)]
    Move(MoveCmd),
    /// This (provider) cluster's working mode: `tethered` hands control of its resources to
    /// its one consumer (docs/modes.md), `autonomous` takes it back.
    #[command(subcommand)]
    Mode(ModeCmd),
}

#[derive(Subcommand)]
pub enum ModeCmd {
    /// Hand this cluster's resources to consumer PEER: it is offered all of what is free (not
    /// the usual share), no other consumer anything, and new local workload pods are refused.
    /// Refused unless PEER is this cluster's only consumer.
    Tethered {
        /// The consumer's cluster id.
        #[arg(long)]
        peer: String,
        /// Also evict the local workload pods running now (their grace periods and
        /// PodDisruptionBudgets honoured); by default they keep running.
        #[arg(long)]
        drain_local: bool,
    },
    /// Take control back: the consumer is offered the usual share again, local pods are
    /// accepted again.
    Autonomous,
}

#[derive(Subcommand)]
pub enum OffloadCmd {
    /// Offload namespaces (a NamespaceOffloading in each), and wait until every selected
    /// provider has made its twin.
    #[command(visible_aliases = ["ns", "namespaces"])]
    Namespace {
        /// The namespaces to offload.
        #[arg(required = true)]
        names: Vec<String>,
        /// How the twins are named: DefaultName (`<namespace>-<this cluster's id>`),
        /// EnforceSameName (the namespace's own name) or SelectedName (see
        /// --remote-namespace-name). Cannot change once offloaded.
        #[arg(long, value_parser = mapping_strategy)]
        namespace_mapping_strategy: Option<MappingStrategy>,
        /// The twin's name on every provider (one namespace only; implies SelectedName).
        #[arg(long)]
        remote_namespace_name: Option<String>,
        /// Where the namespace's pods may run: LocalAndRemote, Remote (the providers only) or
        /// Local (here only; the twins still exist).
        #[arg(long, value_parser = pod_strategy, default_value = "LocalAndRemote")]
        pod_offloading_strategy: PodOffloadingStrategy,
        /// Which providers, over their virtual nodes' labels: `k=v,k2!=v2,k3,!k4,k5 in (a,b)`,
        /// the requirements of one --selector ANDed; repeated, ORed. None: every provider.
        #[arg(long = "selector", short = 'l')]
        selectors: Vec<String>,
        /// What becomes of the claims of the namespace's volumes on a provider when its twin
        /// would go (unoffloaded, no longer selected, unpeered): Retain (kept there, reported
        /// on the ForeignCluster and by `fabricctl info peer`, deleted by `fabricctl forget
        /// volumes`) or Delete (gone with the twin). Cannot change once offloaded.
        #[arg(long, value_parser = retention, default_value = "Retain")]
        storage_retention: StorageRetention,
        /// Print the NamespaceOffloadings instead of applying them.
        #[arg(long, short = 'o', value_parser = ["yaml"])]
        output: Option<String>,
        /// How long to wait for the providers' twins.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "2m")]
        timeout: std::time::Duration,
    },
}

#[derive(Subcommand)]
pub enum MoveCmd {
    /// Move a claim's data (a claim of the fabric's class) from this cluster to a provider,
    /// offline: refused while a pod uses the claim (scale its workload to 0 first). The claim
    /// keeps its name; on any failure the data stays where it was and the claim points to it.
    /// A move from a provider (home, or to another provider) is not available yet: it is
    /// refused, changing nothing.
    Volume {
        /// The claim: NAMESPACE/NAME.
        claim: String,
        /// A provider's cluster id, or `local` (a real node of this cluster).
        #[arg(long)]
        to: String,
        /// The image of the transfer pods: one holding `fabric-volume-transfer` (the
        /// `fabricctl` image of deploy/docker/Dockerfile does).
        #[arg(long, default_value = "fabricctl")]
        image: String,
    },
}

#[derive(Subcommand)]
pub enum ForgetCmd {
    /// Delete the claims a provider keeps after their namespace was unoffloaded (or the
    /// provider no longer selected) under storageRetention Retain, with their data: each
    /// named first; their twins go once empty. `fabricctl info peer` lists them.
    Volumes {
        /// The provider's cluster id.
        #[arg(long)]
        peer: String,
        /// Only this claim: NAMESPACE/NAME (the twin's namespace on the provider, or this
        /// cluster's namespace it came from); default: every one.
        #[arg(long)]
        claim: Option<String>,
        #[arg(long, value_parser = humantime::parse_duration, default_value = "1m")]
        timeout: std::time::Duration,
    },
}

#[derive(Subcommand)]
pub enum UnoffloadCmd {
    /// Unoffload namespaces: say what goes on each provider, delete their
    /// NamespaceOffloadings and wait until the twins are gone.
    #[command(visible_aliases = ["ns", "namespaces"])]
    Namespace {
        #[arg(required = true)]
        names: Vec<String>,
        #[arg(long, value_parser = humantime::parse_duration, default_value = "2m")]
        timeout: std::time::Duration,
    },
}

/// A value of a strategy enum of the API, by its name there.
fn api_enum<T: serde::de::DeserializeOwned>(s: &str, all: &str) -> Result<T, String> {
    serde_json::from_value(serde_json::Value::String(s.to_owned()))
        .map_err(|_| format!("{s:?} is not one of {all}"))
}

fn mapping_strategy(s: &str) -> Result<MappingStrategy, String> {
    api_enum(s, "DefaultName, EnforceSameName, SelectedName")
}

fn retention(s: &str) -> Result<StorageRetention, String> {
    api_enum(s, "Retain, Delete")
}

fn pod_strategy(s: &str) -> Result<PodOffloadingStrategy, String> {
    api_enum(s, "LocalAndRemote, Remote, Local")
}

/// What `peer --remote-kubeconfig X` without `--auth-url` meant before the sharing flow.
const NETWORK_ONLY_TIP: &str = "to connect the networks only, as `peer --remote-kubeconfig` did \
     before peering shared resources, add `--network-only` (no --auth-url needed); to share \
     resources, give the provider's authentication service with --auth-url or FABRIC_AUTH_URL";

impl Cli {
    /// Parses the command line as [`Parser::try_parse_from`] does; a `peer --remote-kubeconfig`
    /// missing `--auth-url` (the old network peering's command line) gets a tip naming
    /// `--network-only`.
    pub fn parse_args<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString>,
    {
        let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
        Self::try_parse_from(&args).map_err(|mut e| {
            let missing_auth_url = e.kind() == ErrorKind::MissingRequiredArgument
                && matches!(
                    e.get(ContextKind::InvalidArg),
                    Some(ContextValue::Strings(missing))
                        if missing.iter().any(|m| m.starts_with("--auth-url"))
                );
            // `peer out-of-band` needs --auth-url too, but conflicts with --remote-kubeconfig.
            let remote_kubeconfig = args.iter().any(|a| {
                a.to_str()
                    .is_some_and(|a| a.starts_with("--remote-kubeconfig"))
            });
            if missing_auth_url && remote_kubeconfig {
                e.insert(
                    ContextKind::Suggested,
                    ContextValue::StyledStrs(vec![StyledStr::from(NETWORK_ONLY_TIP)]),
                );
            }
            e
        })
    }
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
        #[command(flatten)]
        ask: AskArgs,
        /// How long to follow the network, resources and virtual node coming up (0: return
        /// once authenticated).
        #[arg(long, default_value_t = 180)]
        timeout_secs: u64,
    },
}

/// What to ask the provider for.
#[derive(clap::Args, Debug, Default, Clone)]
pub struct AskArgs {
    /// CPU to ask the provider for (e.g. `4`, `500m`); with any resource asked for, the
    /// provider shows up here as a virtual node with what it granted.
    #[arg(long)]
    pub cpu: Option<String>,
    /// Memory to ask for (e.g. `8Gi`).
    #[arg(long)]
    pub memory: Option<String>,
    /// Pods to ask for.
    #[arg(long)]
    pub pods: Option<String>,
    /// Any other resource, `NAME=QUANTITY` (`nvidia.com/gpu=1`); repeatable.
    #[arg(long = "resource")]
    pub resources: Vec<String>,
    /// At-most-once semantics for the pods offloaded there, `PARTITION[,GRACE]` (seconds or
    /// durations, e.g. `60,10` or `2m`; grace 30 s by default): the provider stops them once it
    /// has not heard from this cluster for PARTITION, and only then are they failed here (see
    /// docs/at-most-once.md). The provider may raise PARTITION and lower GRACE to its bounds.
    #[arg(long, value_name = "PARTITION[,GRACE]", value_parser = crate::follow::parse_at_most_once)]
    pub at_most_once: Option<fabric_api::offloading::v1alpha1::AtMostOnce>,
}

impl From<AskArgs> for crate::follow::Ask {
    fn from(a: AskArgs) -> Self {
        Self {
            cpu: a.cpu,
            memory: a.memory,
            pods: a.pods,
            resources: a.resources,
            at_most_once: a.at_most_once,
        }
    }
}

#[derive(Subcommand)]
pub enum GenerateCmd {
    /// Print the command a consumer cluster runs to peer with this (provider) cluster.
    PeerCommand {
        /// Where consumers reach this cluster's authentication service (the `fabric-auth`
        /// Service's external address).
        #[arg(long, env = "FABRIC_AUTH_URL")]
        auth_url: String,
        /// Give the command a one-time token of its own that expires after this long (e.g.
        /// `1h`, `7d`); default: the cluster's standing token (any number of consumers, for
        /// 7 days, or until `fabricctl token rotate`).
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Option<std::time::Duration>,
        /// Only the consumer with this cluster id may use the command (a one-time token,
        /// valid for --ttl, default 1 day). Without it, a one-time token is bound to the
        /// first cluster id that uses it.
        #[arg(long)]
        consumer_id: Option<String>,
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
        let cli = Cli::try_parse_from([
            "fabricctl",
            "peer",
            "--remote-kubeconfig",
            "b.yaml",
            "--network-only",
        ])
        .unwrap();
        assert_eq!(cli.namespace, "fabric-system");
        let Cmd::Peer {
            server,
            timeout_secs,
            flow: None,
            network_only: true,
            ..
        } = cli.cmd
        else {
            panic!("peer expected")
        };
        assert_eq!((server, timeout_secs), (Side::Remote, 120));
        // The sharing flow (the default) needs the provider's authentication service.
        if std::env::var_os("FABRIC_AUTH_URL").is_none() {
            assert!(
                Cli::try_parse_from(["fabricctl", "peer", "--remote-kubeconfig", "b.yaml"])
                    .is_err()
            );
        }
        let cli = Cli::try_parse_from([
            "fabricctl",
            "peer",
            "--remote-kubeconfig",
            "b.yaml",
            "--auth-url",
            "https://x",
            "--cpu",
            "2",
        ])
        .unwrap();
        assert!(matches!(
            cli.cmd,
            Cmd::Peer {
                network_only: false,
                auth_url: Some(_),
                ask: AskArgs { cpu: Some(_), .. },
                ..
            }
        ));
        // unpeer: a provider by id, or the remote kubeconfig's cluster; --force not with
        // --network-only.
        let cli = Cli::try_parse_from(["fabricctl", "unpeer", "prov", "--force"]).unwrap();
        assert!(matches!(
            cli.cmd,
            Cmd::Unpeer {
                peer: Some(_),
                force: true,
                remote_kubeconfig: None,
                ..
            }
        ));
        assert!(Cli::try_parse_from(["fabricctl", "unpeer"]).is_err());
        assert!(
            Cli::try_parse_from([
                "fabricctl",
                "unpeer",
                "--remote-kubeconfig",
                "b",
                "--network-only",
                "--force"
            ])
            .is_err()
        );
        assert!(Cli::try_parse_from(["fabricctl", "unpeer", "--remote-kubeconfig", "b"]).is_ok());
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
    fn the_old_network_peering_is_pointed_to_network_only() {
        if std::env::var_os("FABRIC_AUTH_URL").is_some() {
            return; // --auth-url is given then
        }
        let err = |args: &[&str]| {
            Cli::parse_args(std::iter::once("fabricctl").chain(args.iter().copied()))
                .err()
                .expect("fails")
                .to_string()
        };
        let e = err(&["peer", "--remote-kubeconfig", "b.yaml"]);
        assert!(e.contains("--auth-url") && e.contains("tip:"), "{e}");
        assert!(e.contains("add `--network-only`"), "{e}");
        let e = err(&["peer", "--remote-kubeconfig=b.yaml", "--cpu", "2"]);
        assert!(e.contains("--network-only"), "{e}");
        // Another flow missing --auth-url: no network peering to point to.
        let e = err(&["peer", "out-of-band", "--cluster-id", "p", "--token", "t"]);
        assert!(
            e.contains("--auth-url") && !e.contains("--network-only"),
            "{e}"
        );
        // Other mistakes are clap's own.
        let e = err(&["peer", "--remote-kubeconfig", "b.yaml", "--server", "x"]);
        assert!(!e.contains("--network-only"), "{e}");
        assert!(
            Cli::parse_args([
                "fabricctl",
                "peer",
                "--remote-kubeconfig",
                "b",
                "--network-only"
            ])
            .is_ok()
        );
    }

    #[test]
    fn the_printed_peer_command_parses() {
        let cmd = fabric_auth::token::PeerCommand {
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
            matches!(cli.cmd, Cmd::Generate(GenerateCmd::PeerCommand { ttl: Some(t), consumer_id: None, .. }) if t.as_secs() == 3600)
        );
        assert!(matches!(
            Cli::try_parse_from(["fabricctl", "token", "rotate"])
                .unwrap()
                .cmd,
            Cmd::Token(TokenCmd::Rotate)
        ));
    }
}
