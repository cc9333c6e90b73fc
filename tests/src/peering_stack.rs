//! The sharing layer of every cluster of a [`PeeredClusters`] (built with
//! [`PeeredClusters::for_sharing`]: RBAC and client certificates enforced), run as a
//! deployment would run it, so that the out-of-band peering can be tested end to end:
//!
//! - the authentication service (`fabric-controller auth`), which a consumer's `fabricctl peer
//!   out-of-band` reaches on the host loopback (see [`crate::auth_service`]);
//! - `fabric-controller sharing` (network and resource negotiation, ShadowPods);
//! - `fabric-controller shadowpod-webhook`, in a namespace of its own on the cluster network,
//!   registered as deploy/ registers it and called by the API server with the client
//!   certificate it requires ([`crate::webhook`]);
//! - `fabric-controller storage`, the storage fabric's real-node provisioner;
//! - `fabric-controller virtual-nodes`, and the [`crate::deployments`] stand-in, which runs
//!   the virtual kubelet Deployment that controller creates as a process, with a token of the
//!   Deployment's ServiceAccount (so RBAC applies to it as to a pod).
//!
//! Which API server each process reaches, and how:
//!
//! | process (cluster X)          | runs in         | X's API server                    | a peer's API server                    |
//! |------------------------------|-----------------|-----------------------------------|----------------------------------------|
//! | `auth`                       | host namespace  | its ServiceAccount token, host forwarder | —                               |
//! | `sharing`, `virtual-nodes`   | host namespace  | its ServiceAccount token, host forwarder | X's identity on it: the forwarder URL the peer's `auth` handed out, X's client certificate |
//! | `storage`                    | host namespace  | its ServiceAccount token, host forwarder | —                                      |
//! | `shadowpod-webhook`          | its own, on the cluster network | its ServiceAccount token, in-cluster | — (the API server calls it) |
//! | virtual kubelet (Deployment) | host namespace  | its ServiceAccount token, host forwarder | the identity Secret (as above) |
//! | `fabricctl` (the test)       | host namespace  | admin kubeconfig, host forwarder  | only the authentication service        |
//!
//! The host forwarders are the loopback ends of [`crate::apiserver::ApiServer::start_in_netns`]
//! (their certificates name 127.0.0.1). The network components of each cluster (IPAM, gateway
//! operators, agents) stay where [`crate::clusters`] runs them, inside the cluster network with
//! their own ServiceAccounts' tokens (the test nodes there with the admin's). The virtual kubelet's Node address is
//! 127.0.0.1, its pod address here, and its port a free one (`--virtual-kubelet-port 0`:
//! every cluster's virtual kubelets share the host's loopback), which the API server reaches
//! from its namespace through [`HostKubelets`]; its kubelet API lets in the API server's
//! kubelet client certificate ([`ApiServer::publish_client_ca`]).
//!
//! [`ApiServer::publish_client_ca`]: crate::apiserver::ApiServer::publish_client_ca
use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};
use fabric_offloading::virtual_node::objects;

use crate::{
    ChildGuard,
    auth_service::AuthService,
    clusters::{Cluster, Containers, PeeredClusters},
    deployments::{self, Deployments},
    die_with_parent,
    host_kubelets::HostKubelets,
    locate_bin,
    manifests::Container,
};

/// The virtual kubelet's image as the VirtualNode controller is configured with (the
/// Deployment stand-in runs the workspace's binary of the container's command instead).
pub const VIRTUAL_KUBELET_IMAGE: &str = "fabric-virtual-kubelet:test";

/// Where the ShadowPod webhook listens (deploy/'s container port).
const WEBHOOK_PORT: u16 = 9443;

/// A label every offer of cluster X advertises (`--advertise-label`), with value X: the
/// consumer's virtual node for X carries it.
pub const ADVERTISED_LABEL: &str = "example.com/provider";

/// Starts `cmd` as a component's pod runs: `kubeconfig` its only credentials, its output to
/// `log`, dying with this process.
fn spawn_as_pod(
    mut cmd: std::process::Command,
    kubeconfig: &Path,
    log: std::fs::File,
) -> Result<std::process::Child> {
    cmd.env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // From the process-long spawner thread: members start on threads of their own.
    Ok(fabric_netns::process::spawn(cmd)?)
}

/// One cluster's sharing layer.
pub struct Member {
    pub id: String,
    pub auth: AuthService,
    pub deployments: Deployments,
    /// `sharing`, `virtual-nodes`, `storage` and the webhook, by name, with the container of
    /// deploy/ each runs as.
    procs: Vec<(String, ChildGuard, Container)>,
    /// The authentication service's container.
    auth_container: Container,
    /// The API server's way to its virtual kubelets' API (`kubectl logs/exec` on offloaded
    /// pods).
    _host_kubelets: HostKubelets,
    dir: PathBuf,
}

impl Member {
    async fn start(cluster: &Cluster, containers: &Containers, dir: &Path) -> Result<Self> {
        let dir = dir.join(&cluster.id);
        std::fs::create_dir_all(&dir)?;
        let auth = AuthService::start_as(&cluster.api, &cluster.id, Some(&containers.auth), false)
            .await
            .with_context(|| format!("the authentication service of {}", cluster.id))?;
        let kubeconfig = cluster.api.kubeconfig.clone();
        // The virtual kubelets serve their kubelet API to the API server's client certificate.
        cluster.api.publish_client_ca()?;
        let mut procs = Vec::new();
        for (name, service_account, container, args) in [
            (
                "sharing",
                "fabric-sharing",
                &containers.sharing,
                vec![
                    "sharing".to_owned(),
                    "--identity".into(),
                    format!("sharing-{}", cluster.id),
                    // Consumers look at their providers' answers often: tests wait for them.
                    "--remote-poll".into(),
                    "500ms".into(),
                    "--advertise-label".into(),
                    format!("{ADVERTISED_LABEL}={}", cluster.id),
                ],
            ),
            (
                "virtual-nodes",
                "fabric-virtual-nodes",
                &containers.virtual_nodes,
                vec![
                    "virtual-nodes".to_owned(),
                    "--virtual-kubelet-image".into(),
                    VIRTUAL_KUBELET_IMAGE.into(),
                    // Every cluster's virtual kubelets share the host's loopback.
                    "--virtual-kubelet-port".into(),
                    "0".into(),
                    // Offloaded pods reach the API server where it is on the cluster network.
                    "--home-api-address".into(),
                    cluster.api_address(),
                ],
            ),
            (
                "storage",
                "fabric-storage",
                &containers.storage,
                vec!["storage".to_owned()],
            ),
        ] {
            let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
            // As its pod: its ServiceAccount's token, with the rights deploy/ gives it.
            let own = crate::rights::component_kubeconfig(
                &cluster.api,
                service_account,
                dir.join(format!("{name}.kubeconfig")),
            )?;
            let mut cmd = container.command(&locate_bin("fabric-controller")?)?;
            cmd.args(&args);
            let child = spawn_as_pod(cmd, &own, log)
                .with_context(|| format!("starting fabric-controller {name}"))?;
            procs.push((name.to_owned(), ChildGuard(child), container.clone()));
        }
        // The provider's ShadowPod webhook, in its pod's namespace on the cluster network,
        // called by the API server with the client certificate it requires.
        {
            let site = &cluster.webhook;
            let listen = format!("{}:{WEBHOOK_PORT}", site.ip);
            crate::webhook::register(&cluster.api, &site.ip, WEBHOOK_PORT)?;
            let own = dir.join("shadowpod-webhook.kubeconfig");
            crate::rights::token_kubeconfig(
                &cluster.api.kubeconfig,
                &cluster.api.in_cluster_kubeconfig,
                fabric_api::names::DEFAULT_NAMESPACE,
                &containers.webhook.service_account,
                &own,
            )?;
            let log_path = dir.join("shadowpod-webhook.log");
            let argv: Vec<String> = containers
                .webhook
                .enter(&site.ns, &dir.join("shadowpod-webhook.mnt"))?
                .into_iter()
                .chain([locate_bin("fabric-controller")?.display().to_string()])
                .chain(crate::webhook::args(&listen, &site.caller))
                .collect();
            let mut cmd = std::process::Command::new(&argv[0]);
            cmd.args(&argv[1..]);
            let child = spawn_as_pod(cmd, &own, std::fs::File::create(&log_path)?)
                .context("starting the ShadowPod webhook")?;
            procs.push((
                "shadowpod-webhook".to_owned(),
                ChildGuard(child),
                containers.webhook.clone(),
            ));
            crate::webhook::wait_ready(&cluster.api, &log_path)
                .with_context(|| format!("the ShadowPod webhook of {}", cluster.id))?;
        }
        let deployments = Deployments::start(deployments::Options {
            admin_kubeconfig: kubeconfig.clone(),
            component_kubeconfig: kubeconfig,
            selector: format!("{}={}", objects::APP_LABEL, objects::APP),
            netns: None,
            pod_ip: "127.0.0.1".into(),
            dir: dir.join("pods"),
        })?;
        let host_kubelets = HostKubelets::start(&cluster.api_ns, &cluster.api.kubeconfig)?;
        Ok(Self {
            id: cluster.id.clone(),
            auth,
            deployments,
            procs,
            auth_container: containers.auth.clone(),
            _host_kubelets: host_kubelets,
            dir,
        })
    }

    /// Checks that its controllers and authentication service run with the user, groups and
    /// capabilities their containers in deploy/ give them, and its virtual kubelets with what
    /// their Deployments give them. Returns how many virtual kubelets it checked.
    pub fn check_credentials(&self) -> Result<usize> {
        let auth = self
            .auth
            .pid()
            .context("the authentication service has no process")?;
        self.auth_container
            .check_process(auth)
            .with_context(|| format!("the authentication service of {}", self.id))?;
        for (name, child, container) in &self.procs {
            container
                .check_process(child.0.id())
                .with_context(|| format!("{name} of {}", self.id))?;
        }
        // The virtual kubelets, as the Deployments the virtual-nodes controller made say.
        self.deployments
            .check_credentials()
            .with_context(|| format!("the Deployments of {}", self.id))
    }

    /// The last lines of its controllers' and authentication service's logs, and what the
    /// Deployment stand-in runs.
    pub fn log_tails(&self) -> String {
        let mut s = String::new();
        let tail = |text: &str| {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(15)..].join("\n")
        };
        for (name, _, container) in &self.procs {
            let text =
                std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default();
            s += &format!(
                "--- {} {name} (as {}) ---\n{}\n",
                self.id,
                container.describe(),
                tail(&text)
            );
        }
        s += &format!("--- {} auth ---\n{}\n", self.id, tail(&self.auth.logs()));
        s += &format!(
            "--- {} deployments ---\n{}\n",
            self.id,
            self.deployments.report()
        );
        s
    }
}

/// The fixture's clusters with their sharing layers, as the demo and the benchmarks build them
/// ([`PeeredClusters::for_sharing`] and a [`PeeringStack`] on it), and the runtime the stack
/// runs on.
pub struct SharingClusters {
    // Fields drop in order: the stack stops before the clusters whose API servers it uses.
    pub stack: PeeringStack,
    pub cl: PeeredClusters,
    pub rt: tokio::runtime::Runtime,
}

impl SharingClusters {
    /// Clusters A and B (and C with `third`), `nodes` nodes each, and their sharing layers.
    pub fn start(nodes: usize, third: bool) -> Result<Self> {
        let rt = tokio::runtime::Runtime::new()?;
        let cl = PeeredClusters::for_sharing(nodes, third)?;
        let stack = match rt.block_on(PeeringStack::start(&cl)) {
            Ok(s) => s,
            Err(e) => bail!("{e:#}\n{}", cl.log_tails()),
        };
        Ok(Self { stack, cl, rt })
    }

    /// The tails of every component's log, for failure messages.
    pub fn logs(&self) -> String {
        format!("{}{}", self.cl.log_tails(), self.stack.log_tails())
    }
}

/// The sharing layer of every cluster of a fixture.
pub struct PeeringStack {
    pub members: Vec<Member>,
    dir: PathBuf,
}

impl PeeringStack {
    /// Starts it for every cluster of `cl` (A, B, and C when built), each with its own
    /// authentication service, controllers and Deployment stand-in.
    pub async fn start(cl: &PeeredClusters) -> Result<Self> {
        let dir = cl.logs.join("sharing");
        let clusters: Vec<&Cluster> = [Some(&cl.a), Some(&cl.b), cl.c.as_ref()]
            .into_iter()
            .flatten()
            .collect();
        // Each member waits for its processes (and runs kubectl) for seconds: all at once, each
        // on a thread of its own driving its start on this runtime.
        let rt = tokio::runtime::Handle::current();
        let containers = cl.containers();
        let members = tokio::task::block_in_place(|| {
            std::thread::scope(|s| {
                let started: Vec<_> = clusters
                    .iter()
                    .map(|c| s.spawn(|| rt.block_on(Member::start(c, containers, &dir))))
                    .collect();
                started
                    .into_iter()
                    .map(|h| h.join().expect("a sharing layer's start panicked"))
                    .collect::<Result<Vec<_>>>()
            })
        })?;
        Ok(Self { members, dir })
    }

    /// The sharing layer of cluster `id`.
    pub fn member(&self, id: &str) -> &Member {
        self.members
            .iter()
            .find(|m| m.id == id)
            .unwrap_or_else(|| panic!("no cluster {id} in the peering stack"))
    }

    /// Every member's [`Member::check_credentials`]. Call it once a virtual kubelet runs somewhere: it fails when none was checked.
    pub fn check_credentials(&self) -> Result<()> {
        let mut kubelets = 0;
        for m in &self.members {
            kubelets += m.check_credentials()?;
        }
        anyhow::ensure!(kubelets > 0, "no virtual kubelet runs: none checked");
        Ok(())
    }

    /// Every member's [`Member::log_tails`], for failure messages.
    pub fn log_tails(&self) -> String {
        self.members.iter().map(Member::log_tails).collect()
    }

    /// Where the logs are (under the fixture's log dir, removed with it).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The words of the command `fabricctl generate peer-command` (with `extra`) prints on
    /// provider cluster `p` of `cl`, for its authentication service.
    pub fn peer_command(&self, cl: &PeeredClusters, p: u8, extra: &[&str]) -> Result<Vec<String>> {
        let provider = cl.cluster(p);
        let url = &self.member(&provider.id).auth.url;
        let mut args = vec!["generate", "peer-command", "--auth-url", url];
        args.extend(extra);
        let o = crate::process::fabricctl(&provider.api.kubeconfig, &args);
        let line = String::from_utf8_lossy(&o.stdout).into_owned();
        if !o.status.success() {
            bail!(
                "fabricctl generate peer-command failed: {line}{}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        let words: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        if words.get(..3) != Some(&["fabricctl".into(), "peer".into(), "out-of-band".into()][..]) {
            bail!("not a peer command: {line}");
        }
        Ok(words)
    }

    /// Consumer cluster `c` runs a provider's peer command (`words`, from
    /// [`Self::peer_command`]) with `ask` added, as a user would, while the gateways of the
    /// clusters in `start` come up (as their Deployments would, once the peering made their
    /// keys). Each line it prints goes to `on_line` as it comes; returns them all, or fails
    /// with what it said.
    pub fn run_peer_command(
        cl: &mut PeeredClusters,
        c: u8,
        words: &[String],
        ask: &[&str],
        start: &[u8],
        mut on_line: impl FnMut(&str),
    ) -> Result<String> {
        let mut child = die_with_parent(&mut Command::new(locate_bin("fabricctl")?))
            .env("KUBECONFIG", &cl.cluster(c).api.kubeconfig)
            .env_remove("FABRIC_PEERING_TOKEN")
            .args(words.get(1..).unwrap_or_default())
            .args(ask)
            .args(["--timeout-secs", "90"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting fabricctl peer out-of-band")?;
        let stdout = child.stdout.take().context("fabricctl's stdout")?;
        let stderr = child.stderr.take().context("fabricctl's stderr")?;
        let err = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
        if let Err(e) = start.iter().try_for_each(|&i| cl.start_gateways_of(i)) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e.context("starting the gateways while peering"));
        }
        let mut out = String::new();
        for l in BufReader::new(stdout).lines().map_while(Result::ok) {
            on_line(&l);
            out.push_str(&l);
            out.push('\n');
        }
        let status = child.wait().context("waiting for fabricctl")?;
        let err = err.join().unwrap_or_default();
        if !status.success() {
            bail!("fabricctl peer out-of-band failed ({status}):\n{out}{err}");
        }
        Ok(out)
    }
}
