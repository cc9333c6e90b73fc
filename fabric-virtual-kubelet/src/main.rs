//! fabric-virtual-kubelet: stands for one provider cluster as a Node of this cluster (see the
//! library's documentation).
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::Parser;
use fabric_api::names;
use fabric_virtual_kubelet::{conditions::Policy, node::Settings, run, server};

#[derive(Parser)]
#[command(
    name = "fabric-virtual-kubelet",
    version,
    about = "fabric virtual kubelet: a provider cluster as a Node"
)]
struct Cli {
    /// The VirtualNode this process stands for.
    #[arg(long)]
    virtual_node: String,
    /// The VirtualNode's namespace.
    #[arg(long, env = "FABRIC_NAMESPACE", default_value = names::DEFAULT_NAMESPACE)]
    namespace: String,
    /// Where the gateway operator reports the tunnels' Connections.
    #[arg(long, default_value = names::DEFAULT_NAMESPACE)]
    fabric_namespace: String,
    /// This process's address (its pod IP): the Node's InternalIP.
    #[arg(long, env = "POD_IP")]
    node_ip: String,
    /// The port of its kubelet API, published in the Node's daemonEndpoints; 0: a free one
    /// the system chooses (several virtual kubelets on one host network).
    #[arg(long, default_value_t = 10250)]
    kubelet_port: u16,
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    probe_interval: Duration,
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    probe_timeout: Duration,
    /// How long the node stays Ready through failed probes after the provider last answered.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    grace: Duration,
    /// leaseDurationSeconds of the node Lease (the kubelet's default).
    #[arg(long, default_value = "40s", value_parser = humantime::parse_duration)]
    lease_duration: Duration,
    /// How often the Lease is renewed (the kubelet renews at a quarter of its duration).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    lease_renew: Duration,
    /// How often the node status is written when nothing changed.
    #[arg(long, default_value = "1m", value_parser = humantime::parse_duration)]
    status_refresh: Duration,
    /// How often every offloaded pod is looked at again besides the watches' events.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pod_resync: Duration,
    /// Where this cluster's API server listens on the cluster network (IP:PORT, reachable
    /// from the gateway): offloaded pods of twin namespaces reach it there through the
    /// fabric, as `kubernetes.default.svc`. Without it they are given nothing of it.
    #[arg(long, env = "FABRIC_HOME_API_ADDRESS")]
    home_api_address: Option<std::net::SocketAddrV4>,
    /// The virtual StorageClass: its claims whose first consumer lands on this node are
    /// provisioned on the provider (as `deploy/base/storage.yaml` names it).
    #[arg(long, default_value = names::storage::CLASS)]
    storage_class: String,
    /// A custom kind reflected into the twin namespaces, spec out and status back, as
    /// RESOURCE.GROUP/VERSION (`widgets.example.com/v1`; repeatable; namespaced kinds only,
    /// resolved through this cluster's discovery at start).
    #[arg(
        long = "reflect-custom-resource",
        value_name = "RESOURCE.GROUP/VERSION"
    )]
    reflect_custom_resource: Vec<fabric_api::reflection::CustomResource>,
    #[command(flatten)]
    server: ServerArgs,
}

/// The kubelet API (logs, exec, attach, port-forward), with the kubelet's flag names.
#[derive(clap::Args)]
struct ServerArgs {
    /// Serving certificate (PEM) of the kubelet API; without it, a self-signed one.
    #[arg(long, requires = "tls_private_key_file")]
    tls_cert_file: Option<std::path::PathBuf>,
    #[arg(long, requires = "tls_cert_file")]
    tls_private_key_file: Option<std::path::PathBuf>,
    /// CA bundle (PEM) of the API server's kubelet client certificate: only clients with a
    /// certificate it signed are served. Default: `client-ca-file` of ConfigMap
    /// kube-system/extension-apiserver-authentication (the API server's client CA).
    #[arg(long, env = "FABRIC_KUBELET_CLIENT_CA")]
    client_ca_file: Option<std::path::PathBuf>,
    /// Let clients in with a bearer token (no client certificate) that this cluster's API
    /// server authenticates (TokenReview), as a kubelet with this flag does.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    authentication_token_webhook: bool,
    /// How long a TokenReview's answer is kept.
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    authentication_token_webhook_cache_ttl: Duration,
    /// How long an allowed SubjectAccessReview answer is kept.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    authorization_webhook_cache_authorized_ttl: Duration,
    /// How long a denied SubjectAccessReview answer is kept.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    authorization_webhook_cache_unauthorized_ttl: Duration,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    match run_cli().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run_cli() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let cli = Cli::parse();
    anyhow::ensure!(
        cli.lease_renew < cli.lease_duration,
        "--lease-renew must be shorter than --lease-duration"
    );
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API (in-cluster or KUBECONFIG)")?;
    let ip: std::net::IpAddr = cli
        .node_ip
        .parse()
        .with_context(|| format!("--node-ip {:?} is not an IP address", cli.node_ip))?;
    let address = std::net::SocketAddr::new(ip, cli.kubelet_port);
    let (listen, kubelet_port) = if cli.kubelet_port == 0 {
        let l = tokio::net::TcpListener::bind(address)
            .await
            .with_context(|| format!("binding the kubelet API on {address}"))?;
        let port = l.local_addr().context("the kubelet API's address")?.port();
        (server::Listen::Bound(l), port)
    } else {
        (server::Listen::At(address), cli.kubelet_port)
    };
    // A kind that does not resolve costs only that kind: said in the log and on the Node
    // (CustomResourcesNotServed), looked up again until it resolves.
    let (reflect, unresolved) =
        fabric_virtual_kubelet::custom::resolve_each(&client, &cli.reflect_custom_resource).await;
    for u in &unresolved {
        tracing::error!(error = %u, "a custom kind not reflected until this cluster serves it");
    }
    let unserved_kinds: std::collections::BTreeMap<String, String> = unresolved
        .iter()
        .map(|u| (u.flag().to_string(), u.to_string()))
        .collect();
    let pending: Vec<_> = unresolved.iter().map(|u| u.flag().clone()).collect();
    let client_for_kinds = client.clone();
    let metrics = std::sync::Arc::new(fabric_reflector::Metrics::new());
    let server = server::Config {
        cert: cli
            .server
            .tls_cert_file
            .zip(cli.server.tls_private_key_file),
        sans: vec![cli.node_ip.clone()],
        client_ca: match cli.server.client_ca_file {
            Some(path) => server::access::ClientCa::File(path),
            None => server::access::ClientCa::Cluster,
        },
        authz_ttl: server::authz::Ttl {
            allowed: cli.server.authorization_webhook_cache_authorized_ttl,
            denied: cli.server.authorization_webhook_cache_unauthorized_ttl,
        },
        token_review: cli
            .server
            .authentication_token_webhook
            .then_some(cli.server.authentication_token_webhook_cache_ttl),
        virtual_node: cli.virtual_node.clone(),
        namespace: cli.namespace.clone(),
        metrics: metrics.clone(),
    };
    let server = tokio::spawn(server::serve(client.clone(), server, listen));
    let opts = run::Opts {
        virtual_node: cli.virtual_node,
        namespace: cli.namespace,
        fabric_namespace: cli.fabric_namespace,
        settings: Settings {
            address: cli.node_ip,
            kubelet_port: i32::from(kubelet_port),
        },
        probe_interval: cli.probe_interval,
        probe_timeout: cli.probe_timeout,
        lease_duration: cli.lease_duration,
        lease_renew: cli.lease_renew,
        status_refresh: cli.status_refresh,
        policy: Policy { grace: cli.grace },
        pod_resync: cli.pod_resync,
        metrics,
        home_api_address: cli.home_api_address,
        storage_class: cli.storage_class,
        reflect,
        unserved_kinds,
    };
    // On SIGTERM (a rollout, a drain) the Node and its conditions stay as they are: the next
    // replica carries on from them, and a Node that flapped NotReady on every restart would
    // have its pods evicted. Only the VirtualNode's deletion removes the Node.
    tokio::select! {
        r = run::run(client, opts) => r,
        r = server => r.context("the kubelet API server")?.context("the kubelet API server"),
        cr = fabric_virtual_kubelet::custom::served_at_last(client_for_kinds, pending) => {
            tracing::info!(kind = %cr, "a custom kind is served now: restarting to reflect it");
            Ok(())
        }
        () = fabric_kube::controller::shutdown_signal() => {
            tracing::info!("stopping: leaving the Node as it is");
            Ok(())
        }
    }
}
