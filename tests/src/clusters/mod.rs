//! Two whole clusters for end-to-end tests and the demo: each has its own network in
//! namespaces — a bridge as the cluster network, its API server (kubelite, see
//! [`crate::apiserver`]) on it, one or more gateway replicas, N nodes, one pod per node — and
//! runs the real binaries as separate processes inside that network, reaching the API server
//! over it as in a real cluster: the IPAM controller and, per gateway replica, the gateway
//! operator and the gateway in the replica's namespace, one agent in each node's namespace.
//! The tests and `fabricctl` (host namespace) reach both API servers through forwarders on the
//! host loopback. Both clusters use pod CIDR 10.244.0.0/16 and the same pod addresses.
//!
//! The API servers enforce RBAC, client certificates and ServiceAccount tokens, and every
//! fabric component holds a token of its own ServiceAccount with the rights `deploy/` gives it
//! ([`crate::rights`]), nothing else; the stand-ins (the test scheduler, the EndpointSlice
//! controller of [`crate::endpoints`], the test nodes, which are also the nodes' service proxy)
//! and the tests are the cluster's admin. [`PeeredClusters::for_sharing`] builds the same
//! clusters, optionally with a third cluster C (index 3) built by the same code, for the
//! sharing layer (see [`crate::peering_stack`]).
//!
//! Addresses in cluster i (1, 2, or 3 for C): gateway replica r 10.0.i.(1+r) on the cluster bridge, node
//! k 10.0.i.(10+k), API server 10.0.i.100, pod k 10.244.(k+1).10 behind node k; every gateway
//! replica is also on the underlay bridge 192.168.77.0/24 as 192.168.77.(i+10r). Replicas run
//! active/passive (the operators compete for the `fabric-gateway` Lease); with more than one,
//! the agents follow the Lease to the active replica, with one they route to 10.0.i.1.
use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use fabric_api::{identity::cluster_key, names};
use ipnetwork::Ipv4Network;

mod build;
mod lb;

pub use lb::{LB_VIP, LoadBalancer};

use crate::{
    Testbed,
    apiserver::ApiServer,
    locate_bin,
    manifests::{Container, Manifests},
    wait::try_eventually_blocking,
};

pub const POD_CIDR: &str = "10.244.0.0/16";
pub const EXTERNAL_CIDR: &str = "10.70.0.0/16";
pub const SERVICE_CIDR: &str = "10.96.0.0/12";
pub const POOL: &str = "10.64.0.0/12";
/// The Lease the gateway replicas of a cluster compete for (in [`NAMESPACE`]).
pub const GATEWAY_LEASE: &str = names::lease::GATEWAY;
/// Where the fabric runs in the test clusters.
pub const NAMESPACE: &str = names::DEFAULT_NAMESPACE;

/// One gateway replica: a gateway and its operator, as one pod of the gateway Deployment.
#[derive(Debug, Clone)]
pub struct Replica {
    /// Network namespace the gateway runs in (its TUN devices and remap programs live there).
    pub ns: String,
    /// Its operator's holderIdentity in the gateway Lease (what the pod name would be); also
    /// the gateway's process name.
    pub identity: String,
    /// Process name of its operator.
    pub operator: String,
    /// Address on the cluster network: the nodes' next hop while it is active.
    pub ip: String,
    /// Address on the underlay.
    pub underlay_ip: String,
    /// Configuration, key file, control and UAPI sockets.
    pub dir: PathBuf,
}

pub struct Cluster {
    pub index: u8,
    pub id: String,
    /// Its `kubeconfig` is for the host namespace, `in_cluster_kubeconfig` for the components.
    pub api: ApiServer,
    /// Namespace the API server (and its etcd) runs in, on the cluster network.
    pub api_ns: String,
    /// The first gateway replica's namespace (the only one unless more were asked for).
    pub gw: String,
    pub replicas: Vec<Replica>,
    /// Namespace holding the cluster network's bridge.
    pub lan: String,
    pub nodes: Vec<String>,
    pub pods: Vec<String>,
    pub dir: PathBuf,
    /// Where the provider's ShadowPod webhook runs, and the API server's credentials towards
    /// it (its admission configuration).
    pub webhook: WebhookSite,
}

/// A namespace on the cluster network for the ShadowPod webhook's pod (the sharing layer
/// starts the webhook there: [`crate::peering_stack`]), and the API server as its caller.
pub struct WebhookSite {
    pub ns: String,
    pub ip: String,
    pub caller: crate::webhook::Caller,
}

/// A cluster's namespaces for its API server and webhook, made before its API server starts.
struct Site {
    lan: String,
    api_ns: String,
    api_ip: String,
    hook_ns: String,
    hook_ip: String,
    caller: crate::webhook::Caller,
}

impl Cluster {
    /// Address of pod `k` (the same in both clusters).
    pub fn pod_ip(k: usize) -> String {
        format!("10.244.{}.10", k + 1)
    }

    /// Name of node `k`'s Node object.
    pub fn node_name(k: usize) -> String {
        format!("node{k}")
    }

    /// The pod range of node `k` (the same in both clusters): its test node gives pods
    /// addresses from it (not .1, the pods' gateway, nor .10, the fixed pod's).
    pub fn node_pod_cidr(k: usize) -> String {
        format!("10.244.{}.0/24", k + 1)
    }

    /// Where its API server listens on the cluster network (`IP:PORT`): the admin's
    /// `--home-api-address`.
    pub fn api_address(&self) -> String {
        format!(
            "10.0.{}.100:{}",
            self.index,
            crate::apiserver::NETNS_API_PORT
        )
    }

    /// The first gateway replica's address on the cluster network.
    pub fn gateway_ip(&self) -> String {
        self.replicas[0].ip.clone()
    }

    /// Address of node `k` of cluster `i` on the cluster network.
    pub fn node_ip(i: u8, k: usize) -> String {
        format!("10.0.{i}.{}", 10 + k)
    }

    /// This cluster's admin lends storage to its consumers as `lent` says (`CLASS=SIZE`,
    /// comma-separated), in the ConfigMap `fabric-storage` that deploy/ ships lending nothing.
    pub fn lend_storage(&self, lent: &str) -> Result<()> {
        let cm = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "fabric-storage", "namespace": NAMESPACE},
            "data": {"lent": lent}});
        crate::kube_sync::apply(&self.api.kubeconfig, "fabric-tests", true, &[cm])
            .with_context(|| format!("lending storage ({lent}) on {}", self.id))
    }

    /// The CIDR this cluster sees peer `peer`'s pods under: the remapped pod CIDR its IPAM
    /// granted (the status of the peer's Configuration), once there is one (up to `timeout`).
    pub fn remote_pod_cidr(&self, peer: &str, timeout: Duration) -> Result<Ipv4Network> {
        let cidr = try_eventually_blocking(
            &format!("{}'s remapped pod CIDR for {peer}", self.id),
            timeout,
            || {
                let c = self.api.get_json("configuration", Some(NAMESPACE), peer)?;
                c["status"]["remote"]["pod"].as_str().map(str::to_owned)
            },
        )
        .map_err(anyhow::Error::msg)?;
        cidr.parse()
            .with_context(|| format!("the remapped pod CIDR {cidr:?} for {peer}"))
    }

    /// The gateway Lease as (holderIdentity, published gateway address); None while it does
    /// not exist. Empty strings for fields not set.
    pub fn gateway_lease(&self) -> Option<(String, String)> {
        let v = self.api.get_json("lease", Some(NAMESPACE), GATEWAY_LEASE)?;
        Some((
            v["spec"]["holderIdentity"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            v["metadata"]["annotations"][names::annotation::GATEWAY_IP]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        ))
    }

    /// The API server's address on the cluster network.
    pub fn api_ip(&self) -> String {
        format!("10.0.{}.100", self.index)
    }

    /// The replica holding the gateway Lease, if any.
    pub fn active_replica(&self) -> Option<&Replica> {
        let (holder, _) = self.gateway_lease()?;
        self.replicas.iter().find(|r| r.identity == holder)
    }

    /// With two replicas: (the one holding the Lease, the other one).
    pub fn active_and_standby(&self) -> Option<(Replica, Replica)> {
        let active = self.active_replica()?.clone();
        let standby = self
            .replicas
            .iter()
            .find(|r| r.identity != active.identity)?
            .clone();
        Some((active, standby))
    }
}

struct Proc {
    name: String,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    /// The container of deploy/ it runs as (through `setpriv`), for [`PeeredClusters::check_credentials`].
    container: Option<Container>,
    child: Option<Child>,
}

/// The containers of deploy/ the fixtures run, with what the manifests give them.
pub struct Containers {
    pub ipam: Container,
    pub operator: Container,
    pub gateway: Container,
    pub agent: Container,
    /// The sharing layer's, which [`crate::peering_stack`] runs.
    pub auth: Container,
    pub sharing: Container,
    pub virtual_nodes: Container,
    pub webhook: Container,
    /// The storage fabric's real-node provisioner.
    pub storage: Container,
}

impl Containers {
    fn from_manifests(api: &ApiServer) -> Result<Self> {
        let m = Manifests::render(api)?;
        let me = Self {
            ipam: m.container("fabric-controller", "controller")?,
            operator: m.container("fabric-gateway", "operator")?,
            gateway: m.container("fabric-gateway", "gateway")?,
            agent: m.container("fabric-agent", "agent")?,
            auth: m.container("fabric-auth", "auth")?,
            sharing: m.container("fabric-sharing", "sharing")?,
            virtual_nodes: m.container("fabric-virtual-nodes", "controller")?,
            webhook: m.container("fabric-shadowpod-webhook", "webhook")?,
            storage: m.container("fabric-storage", "controller")?,
        };
        // One directory per replica stands for the emptyDirs of the gateway pod (its
        // configuration, key file, control and UAPI sockets): both containers mount them all.
        anyhow::ensure!(
            me.gateway.empty_dirs() == me.operator.empty_dirs(),
            "the gateway mounts emptyDirs {:?}, its operator {:?}: the fixture shares one \
             directory between them",
            me.gateway.empty_dirs(),
            me.operator.empty_dirs()
        );
        Ok(me)
    }
}

/// `argv` run in namespace `ns` as `container` runs (see [`Container::enter`]); `keep` is a
/// scratch directory of its own.
fn in_container(
    ns: &str,
    container: &Container,
    keep: &Path,
    argv: Vec<String>,
) -> Result<Vec<String>> {
    Ok(container.enter(ns, keep)?.into_iter().chain(argv).collect())
}

/// How [`PeeredClusters::with_options`] builds the two clusters.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Nodes (each with one pod) per cluster.
    pub nodes: usize,
    /// Gateway replicas of A (dials) and B (listens).
    pub replicas_a: usize,
    pub replicas_b: usize,
    /// Gateways behind a router, reached through the overlay (see `with_overlay`).
    pub overlay: bool,
    /// B's replicas behind a load balancer (see `with_listening_replicas`).
    pub listener_lb: bool,
}

pub struct PeeredClusters {
    /// B's gateway Service, when B's replicas sit behind one. First: stops before the rest.
    pub lb: Option<LoadBalancer>,
    pub a: Cluster,
    pub b: Cluster,
    /// A third cluster (`cluster-c`, index 3), built only by [`PeeredClusters::for_sharing`].
    pub c: Option<Cluster>,
    procs: Vec<Proc>,
    containers: Containers,
    pub logs: PathBuf,
    // Dropped last: the namespaces go after the processes that live in them.
    pub tb: Testbed,
}

/// `spec.schedulerName` of the Pod objects the fixture runs itself (the gateway replicas'),
/// so that the test scheduler leaves them alone.
pub const FIXTURE_SCHEDULER: &str = "fabric-fixture";

fn bin(name: &str) -> Result<String> {
    Ok(locate_bin(name)?.display().to_string())
}

impl PeeredClusters {
    /// Builds both clusters, one gateway replica each, and starts everything but the gateways
    /// (their operators need the key that `fabricctl peer` creates before they can write a
    /// configuration).
    pub fn new(nodes: usize) -> Result<Self> {
        Self::with_replicas(nodes, 1)
    }

    /// Like [`PeeredClusters::new`], with `replicas_a` gateway replicas in cluster A (the side
    /// that dials: `fabricctl peer` runs against A and B's gateway listens).
    pub fn with_replicas(nodes: usize, replicas_a: usize) -> Result<Self> {
        Self::build(nodes, replicas_a, 1, false, false)
    }

    /// B (the listening side) with `replicas_b` gateway replicas behind a load balancer (see
    /// [`LoadBalancer`]): every B replica advertises its address, as they would advertise a
    /// LoadBalancer Service's. Each B replica also has a Pod object that its operator labels.
    pub fn with_listening_replicas(nodes: usize, replicas_b: usize) -> Result<Self> {
        Self::build(nodes, 1, replicas_b, false, true)
    }

    /// Clusters whose nodes cannot reach the gateway's address directly: the gateway replicas
    /// sit on a subnet of their own (10.1.i.0/24) behind a router (10.0.i.254 / 10.1.i.254)
    /// that knows nothing of pod addresses, as on a routed node network or with a pod network
    /// of its own. Agents and operators run with `--overlay`; the Node objects name each
    /// node's address and pod CIDR, as the kubelet and the node IPAM would, except for the
    /// second node, which has none: its pod is reached through its Pod object's address.
    pub fn with_overlay(nodes: usize) -> Result<Self> {
        Self::build(nodes, 1, 1, true, false)
    }

    /// Any combination of the above.
    pub fn with_options(o: Options) -> Result<Self> {
        Self::build(
            o.nodes,
            o.replicas_a,
            o.replicas_b,
            o.overlay,
            o.listener_lb,
        )
    }

    /// Clusters for the sharing layer: one gateway replica each, and with `third` a cluster
    /// C besides A and B. Nothing of the sharing layer runs yet: see
    /// [`crate::peering_stack::PeeringStack`].
    pub fn for_sharing(nodes: usize, third: bool) -> Result<Self> {
        Self::build_with(nodes, 1, 1, false, false, third)
    }

    fn build(
        nodes: usize,
        replicas_a: usize,
        replicas_b: usize,
        overlay: bool,
        lb: bool,
    ) -> Result<Self> {
        Self::build_with(nodes, replicas_a, replicas_b, overlay, lb, false)
    }

    /// Cluster `i` (1: A, 2: B, 3: C).
    pub fn cluster(&self, i: u8) -> &Cluster {
        match i {
            1 => &self.a,
            3 => self.c.as_ref().expect("cluster C was built"),
            _ => &self.b,
        }
    }

    /// The indices of the clusters built (1 and 2, and 3 with C).
    pub fn indices(&self) -> Vec<u8> {
        let mut v = vec![1u8, 2];
        v.extend(self.c.as_ref().map(|c| c.index));
        v
    }

    fn spawn(&mut self, name: &str, argv: Vec<String>, env: Vec<(String, String)>) -> Result<()> {
        self.push(Proc {
            name: name.to_owned(),
            argv,
            env,
            container: None,
            child: None,
        })
    }

    /// Starts `argv` in namespace `ns` as `container` of deploy/ runs.
    fn spawn_as(
        &mut self,
        name: &str,
        ns: &str,
        container: &Container,
        argv: Vec<String>,
        env: Vec<(String, String)>,
    ) -> Result<()> {
        self.push(Proc {
            name: name.to_owned(),
            argv: in_container(ns, container, &self.logs.join(format!("{name}.mnt")), argv)?,
            env,
            container: Some(container.clone()),
            child: None,
        })
    }

    fn push(&mut self, mut p: Proc) -> Result<()> {
        Self::start(&self.logs, &mut p)?;
        self.procs.push(p);
        Ok(())
    }

    /// The containers of deploy/ (as rendered when the fixture started) its components run as.
    pub fn containers(&self) -> &Containers {
        &self.containers
    }

    /// Checks that every running component has the user, groups and capabilities its
    /// container in deploy/ gives it (they are started so; this proves it).
    pub fn check_credentials(&self) -> Result<()> {
        let mut checked = 0;
        for p in &self.procs {
            if let (Some(c), Some(child)) = (&p.container, &p.child) {
                c.check_process(child.id())
                    .with_context(|| format!("component {}", p.name))?;
                checked += 1;
            }
        }
        anyhow::ensure!(checked > 0, "no component runs as a container of deploy/");
        Ok(())
    }

    fn start(logs: &Path, p: &mut Proc) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(logs.join(format!("{}.log", p.name)))?;
        let mut c = Command::new(&p.argv[0]);
        c.args(&p.argv[1..])
            .envs(p.env.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // Dies with the test process, even when that is SIGKILLed.
        let child =
            fabric_netns::process::spawn(c).with_context(|| format!("starting {}", p.name))?;
        p.child = Some(child);
        Ok(())
    }

    /// The process id of a running component (e.g. `gateway1`), for its CPU time: the
    /// namespace and credential wrappers exec, so it is the component's own.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.procs
            .iter()
            .find(|p| p.name == name)?
            .child
            .as_ref()
            .map(Child::id)
    }

    fn proc(&self, name: &str) -> Result<&Proc> {
        self.procs
            .iter()
            .find(|p| p.name == name)
            .with_context(|| format!("no process {name}"))
    }

    /// Kills a component (SIGKILL: no clean shutdown), as when its pod dies; it stays down.
    pub fn kill(&mut self, name: &str) -> Result<()> {
        let p = named(&mut self.procs, name)?;
        if let Some(mut c) = p.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        Ok(())
    }

    /// Stops a component cleanly (SIGTERM, then SIGKILL after 5 s) and leaves it down: a
    /// gateway removes its devices and pins on the way, as when its pod is deleted. For
    /// putting something else in its place (the other gateways of `bench fabric`).
    pub fn stop(&mut self, name: &str) -> Result<()> {
        let p = named(&mut self.procs, name)?;
        if let Some(mut c) = p.child.take() {
            // SAFETY: a child of ours not yet waited for, so the pid is still its own.
            unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
            crate::process::reap_by(&mut c, Instant::now() + Duration::from_secs(5));
        }
        Ok(())
    }

    /// Sends `sig` to a running component: SIGSTOP makes it hang as a wedged process would
    /// (alive, its sockets open, answering nothing), SIGCONT lets it go on.
    pub fn signal(&self, name: &str, sig: i32) -> Result<()> {
        let p = self.proc(name)?;
        let pid = p
            .child
            .as_ref()
            .with_context(|| format!("{name} is not running"))?
            .id();
        // SAFETY: a child of ours not yet waited for, so the pid is still its own.
        if unsafe { libc::kill(pid as libc::pid_t, sig) } != 0 {
            bail!(
                "signal {sig} to {name}: {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(())
    }

    /// Kills a component (SIGKILL: no clean shutdown) and starts it again.
    pub fn restart(&mut self, name: &str) -> Result<()> {
        self.kill(name)?;
        let p = named(&mut self.procs, name)?;
        Self::start(&self.logs, p)
    }

    /// Brings a dead gateway replica back as the Deployment would replace its pod: a fresh
    /// configuration directory (an emptyDir), the operator first, the gateway once the
    /// operator has written its configuration.
    pub fn replace_replica(&mut self, rep: &Replica) -> Result<()> {
        self.kill(&rep.identity)?;
        self.kill(&rep.operator)?;
        let cfg = rep.dir.join("gateway.toml");
        match std::fs::remove_file(&cfg) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("removing {}", cfg.display()));
            }
            _ => {}
        }
        self.restart(&rep.operator)?;
        self.wait_config(&rep.operator, &cfg)?;
        self.restart(&rep.identity)
    }

    /// Waits for `operator` to write the gateway configuration `cfg`.
    fn wait_config(&self, operator: &str, cfg: &Path) -> Result<()> {
        try_eventually_blocking(
            &format!("{operator} to write a gateway configuration"),
            Duration::from_secs(30),
            || cfg.exists().then_some(()),
        )
        .map_err(|e| anyhow::anyhow!("{e}\n{}", self.log_tails()))
    }

    /// Starts every gateway replica once its operator has written a configuration.
    /// (Also for peerings made without `fabricctl`, e.g. negotiated by the sharing
    /// controllers: call it once something has created the gateway keys.)
    pub fn start_gateways(&mut self) -> Result<()> {
        for i in self.indices() {
            self.start_gateways_of(i)?;
        }
        Ok(())
    }

    /// Starts the gateway replicas of cluster `i` (1, 2 or 3) once their operators have
    /// written a configuration (which takes the gateway key a peering creates).
    pub fn start_gateways_of(&mut self, i: u8) -> Result<()> {
        let replicas = self.cluster(i).replicas.clone();
        for rep in replicas {
            let dir = rep.dir.display().to_string();
            let cfg = format!("{dir}/gateway.toml");
            self.wait_config(&rep.operator, Path::new(&cfg))?;
            // The gateway runs in its namespace (its TUN devices and the remap programs
            // live there); it never talks to the API, its operator does.
            let gateway = self.containers.gateway.clone();
            self.spawn_as(
                &rep.identity,
                &rep.ns,
                &gateway,
                vec![
                    bin("fabric-gateway")?,
                    "run".into(),
                    "--config".into(),
                    cfg,
                    "--control-dir".into(),
                    dir.clone(),
                    "--uapi-dir".into(),
                    dir,
                ],
                vec![],
            )?;
        }
        Ok(())
    }

    /// `fabricctl peer --network-only` from A to B (gateways start while it waits); returns
    /// its output.
    pub fn peer(&mut self) -> Result<Output> {
        let (ka, kb) = (self.a.api.kubeconfig.clone(), self.b.api.kubeconfig.clone());
        let ctl = locate_bin("fabricctl")?;
        let h = std::thread::spawn(move || {
            fabric_netns::process::die_with_parent(&mut Command::new(ctl))
                .env("KUBECONFIG", ka)
                .args(["peer", "--network-only"])
                .arg("--remote-kubeconfig")
                .arg(kb)
                .args(["--timeout-secs", "60"])
                .output()
        });
        self.start_gateways()?;
        Ok(h.join()
            .map_err(|_| anyhow::anyhow!("fabricctl thread"))??)
    }

    /// [`PeeredClusters::peer`], failing with fabricctl's output and the components' logs
    /// unless it succeeds; returns its standard output.
    pub fn peer_ok(&mut self) -> Result<String> {
        let out = self.peer()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            bail!(
                "fabricctl peer failed:\n{text}{}\n{}",
                String::from_utf8_lossy(&out.stderr),
                self.log_tails()
            );
        }
        Ok(text)
    }

    /// Runs fabricctl against cluster A.
    pub fn fabricctl(&self, args: &[&str]) -> Result<Output> {
        Ok(Command::new(locate_bin("fabricctl")?)
            .env("KUBECONFIG", &self.a.api.kubeconfig)
            .args(args)
            .output()?)
    }

    /// The last lines of every component's log, for failure messages.
    pub fn log_tails(&self) -> String {
        let mut s = String::new();
        // First the components the kernel refused something: with the credentials deploy/
        // gives them, that names the container whose manifest gives too little.
        for p in &self.procs {
            let Some(c) = &p.container else { continue };
            let text = std::fs::read_to_string(self.logs.join(format!("{}.log", p.name)))
                .unwrap_or_default();
            if let Some(line) = crate::manifests::first_denial(&text) {
                s += &format!(
                    "REFUSED: {} runs as {} and was refused: {line}\n",
                    p.name,
                    c.describe()
                );
            }
        }
        for p in &self.procs {
            let text = std::fs::read_to_string(self.logs.join(format!("{}.log", p.name)))
                .unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let from = lines.len().saturating_sub(12);
            match &p.container {
                Some(c) => s += &format!("--- {} (as {}) ---\n", p.name, c.describe()),
                None => s += &format!("--- {} ---\n", p.name),
            }
            s += &lines[from..].join("\n");
            s += "\n";
        }
        s
    }

    /// Pings until it answers or `timeout` passes; returns how long it took.
    pub fn wait_reachable(&self, from_pod: &str, dst: &str, timeout: Duration) -> Result<Duration> {
        let t0 = Instant::now();
        try_eventually_blocking(
            &format!("{from_pod} to reach {dst}"),
            timeout,
            || match self
                .tb
                .exec_any(from_pod, &["ping", "-c", "1", "-W", "1", dst])
            {
                Err(e) => Some(Err(e)),
                Ok(o) => o.status.success().then_some(Ok(())),
            },
        )
        .map_err(|e| anyhow::anyhow!("{e}\n{}", self.log_tails()))??;
        Ok(t0.elapsed())
    }
}

/// `addr` as seen through `cidr`: its network bits replaced by `cidr`'s, its host bits kept
/// (how a peer's pod address looks through the CIDR IPAM remapped that peer's pods to).
pub fn remap(addr: Ipv4Addr, cidr: Ipv4Network) -> Ipv4Addr {
    let mask = u32::from(cidr.mask());
    Ipv4Addr::from((u32::from(cidr.network()) & mask) | (u32::from(addr) & !mask))
}

/// The component called `name` among `procs` (a function of the field alone, so that the
/// rest of the fixture can be borrowed beside it).
fn named<'a>(procs: &'a mut [Proc], name: &str) -> Result<&'a mut Proc> {
    procs
        .iter_mut()
        .find(|p| p.name == name)
        .with_context(|| format!("no process {name}"))
}

impl Drop for PeeredClusters {
    fn drop(&mut self) {
        for p in &mut self.procs {
            if let Some(c) = &mut p.child {
                // SIGTERM first: the gateway removes its devices and pins on a clean exit.
                unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            }
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        for p in &mut self.procs {
            if let Some(mut c) = p.child.take() {
                crate::process::reap_by(&mut c, deadline);
            }
        }
        let _ = std::fs::remove_dir_all(&self.logs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remapped_address_keeps_its_host_bits() {
        let a = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        let n = |s: &str| s.parse::<Ipv4Network>().unwrap();
        assert_eq!(remap(a("10.244.1.10"), n("10.64.0.0/16")), a("10.64.1.10"));
        assert_eq!(
            remap(a("10.244.1.10"), n("10.70.32.0/20")),
            a("10.70.33.10")
        );
        // A CIDR written with host bits set still names its network.
        assert_eq!(remap(a("10.244.1.10"), n("10.64.9.9/16")), a("10.64.1.10"));
    }
}
