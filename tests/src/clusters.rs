//! Two whole clusters for end-to-end tests and the demo: each has its own API server
//! (kubelite, see [`crate::apiserver`]) and its own network in namespaces — a gateway with a
//! bridge as the cluster network, N nodes, one pod per node — and runs the real binaries as
//! separate processes: the IPAM controller, the gateway operator, the gateway and one agent per
//! node. Both clusters use pod CIDR 10.244.0.0/16 and the same pod addresses.
//!
//! Addresses in cluster i (1 or 2): gateway 10.0.i.1 on the cluster bridge, node k
//! 10.0.i.(10+k), pod k 10.244.(k+1).10 behind node k; gateways meet on the underlay
//! 192.168.77.0/24 (192.168.77.i).
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{Testbed, apiserver::ApiServer, locate_bin};

pub const POD_CIDR: &str = "10.244.0.0/16";
pub const EXTERNAL_CIDR: &str = "10.70.0.0/16";
pub const SERVICE_CIDR: &str = "10.96.0.0/12";
pub const POOL: &str = "10.64.0.0/12";

pub struct Cluster {
    pub index: u8,
    pub id: String,
    pub api: ApiServer,
    pub gw: String,
    pub nodes: Vec<String>,
    pub pods: Vec<String>,
    pub dir: PathBuf,
}

impl Cluster {
    /// Address of pod `k` (the same in both clusters).
    pub fn pod_ip(k: usize) -> String {
        format!("10.244.{}.10", k + 1)
    }

    pub fn gateway_ip(&self) -> String {
        format!("10.0.{}.1", self.index)
    }
}

struct Proc {
    name: String,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    child: Option<Child>,
}

pub struct PeeredClusters {
    pub a: Cluster,
    pub b: Cluster,
    procs: Vec<Proc>,
    pub logs: PathBuf,
    // Dropped last: the namespaces go after the processes that live in them.
    pub tb: Testbed,
}

fn bin(name: &str) -> Result<String> {
    Ok(locate_bin(name)?.display().to_string())
}

impl PeeredClusters {
    /// Builds both clusters and starts everything but the gateways (their operators need the
    /// key that `fabricctl peer` creates before they can write a configuration).
    pub fn new(nodes: usize) -> Result<Self> {
        let mut tb = Testbed::new()?;
        let logs = std::env::temp_dir().join(format!("{}-clusters", tb.id()));
        std::fs::create_dir_all(&logs)?;
        let a = Self::cluster(&mut tb, 1, "cluster-a", nodes, &logs)?;
        let b = Self::cluster(&mut tb, 2, "cluster-b", nodes, &logs)?;
        tb.veth(&a.gw, "ul", &b.gw, "ul")?;
        tb.ip(&a.gw, &["addr", "add", "192.168.77.1/24", "dev", "ul"])?;
        tb.ip(&b.gw, &["addr", "add", "192.168.77.2/24", "dev", "ul"])?;
        let mut me = Self {
            a,
            b,
            procs: Vec::new(),
            logs,
            tb,
        };
        for which in [1u8, 2] {
            let (kc, dir, nodes, i) = {
                let c = me.cluster_ref(which);
                (
                    c.api.kubeconfig.display().to_string(),
                    c.dir.display().to_string(),
                    c.nodes.clone(),
                    c.index,
                )
            };
            let env = vec![("KUBECONFIG".to_owned(), kc)];
            me.spawn(
                &format!("ipam{i}"),
                vec![
                    bin("fabric-controller")?,
                    "ipam".into(),
                    "--pod-cidr".into(),
                    POD_CIDR.into(),
                    "--service-cidr".into(),
                    SERVICE_CIDR.into(),
                    "--external-cidr".into(),
                    EXTERNAL_CIDR.into(),
                    "--pools".into(),
                    POOL.into(),
                ],
                env.clone(),
            )?;
            me.spawn(
                &format!("operator{i}"),
                vec![
                    bin("fabric-controller")?,
                    "gateway".into(),
                    "--name".into(),
                    format!("gw{i}"),
                    "--interval".into(),
                    "300ms".into(),
                    "--advertise".into(),
                    format!("192.168.77.{i}:51820"),
                    "--config".into(),
                    format!("{dir}/gateway.toml"),
                    "--key-file".into(),
                    format!("{dir}/private.key"),
                    "--control-dir".into(),
                    dir.clone(),
                    "--gateway-bin".into(),
                    bin("fabric-gateway")?,
                ],
                env.clone(),
            )?;
            for (k, node) in nodes.iter().enumerate() {
                me.spawn(
                    &format!("agent{i}-{k}"),
                    vec![
                        bin("fabric-agent")?,
                        "run".into(),
                        "--gateway".into(),
                        format!("10.0.{i}.1"),
                        "--interval".into(),
                        "500ms".into(),
                        "--route-netns".into(),
                        node.clone(),
                    ],
                    env.clone(),
                )?;
            }
        }
        Ok(me)
    }

    fn cluster(tb: &mut Testbed, i: u8, id: &str, nodes: usize, logs: &Path) -> Result<Cluster> {
        let api = ApiServer::start(&format!("{id}-{}", tb.id()));
        let crds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
        api.kubectl_ok(&["apply", "-k", &crds.display().to_string()]);
        api.kubectl_ok(&["create", "namespace", "fabric-system"]);
        api.kubectl_ok(&[
            "create",
            "configmap",
            "fabric-cluster",
            "-n",
            "fabric-system",
            &format!("--from-literal=FABRIC_CLUSTER_ID={id}"),
            &format!("--from-literal=FABRIC_POD_CIDR={POD_CIDR}"),
            &format!("--from-literal=FABRIC_SERVICE_CIDR={SERVICE_CIDR}"),
            &format!("--from-literal=FABRIC_EXTERNAL_CIDR={EXTERNAL_CIDR}"),
        ]);
        api.kubectl_ok(&[
            "wait",
            "--for",
            "condition=established",
            "crd",
            "--all",
            "--timeout=30s",
        ]);
        let gw = tb.add_netns(&format!("gw{i}"))?;
        tb.ip(&gw, &["link", "add", "br0", "type", "bridge"])?;
        tb.ip(
            &gw,
            &["addr", "add", &format!("10.0.{i}.1/24"), "dev", "br0"],
        )?;
        tb.ip(&gw, &["link", "set", "br0", "up"])?;
        tb.sysctl(&gw, "net.ipv4.ip_forward", "1")?;
        tb.sysctl(&gw, "net.ipv4.conf.all.rp_filter", "0")?;
        let (mut node_ns, mut pod_ns) = (Vec::new(), Vec::new());
        for k in 0..nodes {
            let node = tb.add_netns(&format!("n{i}{k}"))?;
            let pod = tb.add_netns(&format!("p{i}{k}"))?;
            let port = format!("n{k}");
            tb.veth(&gw, &port, &node, "lan")?;
            tb.ip(&gw, &["link", "set", &port, "master", "br0"])?;
            let node_ip = format!("10.0.{i}.{}", 10 + k);
            tb.ip(
                &node,
                &["addr", "add", &format!("{node_ip}/24"), "dev", "lan"],
            )?;
            tb.veth(&node, "pod", &pod, "eth0")?;
            tb.ip(
                &node,
                &[
                    "addr",
                    "add",
                    &format!("10.244.{}.1/24", k + 1),
                    "dev",
                    "pod",
                ],
            )?;
            tb.ip(
                &pod,
                &[
                    "addr",
                    "add",
                    &format!("{}/24", Cluster::pod_ip(k)),
                    "dev",
                    "eth0",
                ],
            )?;
            tb.ip(
                &pod,
                &[
                    "route",
                    "add",
                    "default",
                    "via",
                    &format!("10.244.{}.1", k + 1),
                ],
            )?;
            // What the CNI would do: every node's pod subnet is reachable through that node.
            tb.ip(
                &gw,
                &[
                    "route",
                    "add",
                    &format!("10.244.{}.0/24", k + 1),
                    "via",
                    &node_ip,
                ],
            )?;
            tb.sysctl(&node, "net.ipv4.ip_forward", "1")?;
            tb.sysctl(&node, "net.ipv4.conf.all.rp_filter", "0")?;
            node_ns.push(node);
            pod_ns.push(pod);
        }
        let dir = logs.join(id);
        std::fs::create_dir_all(&dir)?;
        Ok(Cluster {
            index: i,
            id: id.to_owned(),
            api,
            gw,
            nodes: node_ns,
            pods: pod_ns,
            dir,
        })
    }

    fn cluster_ref(&self, i: u8) -> &Cluster {
        if i == 1 { &self.a } else { &self.b }
    }

    fn spawn(&mut self, name: &str, argv: Vec<String>, env: Vec<(String, String)>) -> Result<()> {
        let mut p = Proc {
            name: name.to_owned(),
            argv,
            env,
            child: None,
        };
        Self::start(&self.logs, &mut p)?;
        self.procs.push(p);
        Ok(())
    }

    fn start(logs: &Path, p: &mut Proc) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(logs.join(format!("{}.log", p.name)))?;
        let child = Command::new(&p.argv[0])
            .args(&p.argv[1..])
            .envs(p.env.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", p.name))?;
        p.child = Some(child);
        Ok(())
    }

    /// Kills a component (SIGKILL: no clean shutdown) and starts it again.
    pub fn restart(&mut self, name: &str) -> Result<()> {
        let p = self
            .procs
            .iter_mut()
            .find(|p| p.name == name)
            .with_context(|| format!("no process {name}"))?;
        if let Some(mut c) = p.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        Self::start(&self.logs, p)
    }

    /// Starts both gateways once their operators have written a configuration.
    fn start_gateways(&mut self) -> Result<()> {
        for i in [1u8, 2] {
            let (gw, dir) = {
                let c = self.cluster_ref(i);
                (c.gw.clone(), c.dir.display().to_string())
            };
            let cfg = format!("{dir}/gateway.toml");
            let t0 = Instant::now();
            while !Path::new(&cfg).exists() {
                if t0.elapsed() > Duration::from_secs(30) {
                    bail!(
                        "operator {i} wrote no gateway configuration\n{}",
                        self.log_tails()
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            // The gateway runs in the gateway namespace (its TUN devices and the remap
            // programs live there); it never talks to the API, its operator does.
            self.spawn(
                &format!("gateway{i}"),
                vec![
                    "ip".into(),
                    "netns".into(),
                    "exec".into(),
                    gw,
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

    /// `fabricctl peer` from A to B (gateways start while it waits); returns its output.
    pub fn peer(&mut self) -> Result<Output> {
        let (ka, kb) = (self.a.api.kubeconfig.clone(), self.b.api.kubeconfig.clone());
        let ctl = locate_bin("fabricctl")?;
        let h = std::thread::spawn(move || {
            Command::new(ctl)
                .env("KUBECONFIG", ka)
                .arg("peer")
                .arg("--remote-kubeconfig")
                .arg(kb)
                .args(["--timeout-secs", "60"])
                .output()
        });
        self.start_gateways()?;
        Ok(h.join()
            .map_err(|_| anyhow::anyhow!("fabricctl thread"))??)
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
        for p in &self.procs {
            let text = std::fs::read_to_string(self.logs.join(format!("{}.log", p.name)))
                .unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let from = lines.len().saturating_sub(12);
            s += &format!("--- {} ---\n{}\n", p.name, lines[from..].join("\n"));
        }
        s
    }

    /// Pings until it answers or `timeout` passes; returns how long it took.
    pub fn wait_reachable(&self, from_pod: &str, dst: &str, timeout: Duration) -> Result<Duration> {
        let t0 = Instant::now();
        loop {
            if self
                .tb
                .exec_any(from_pod, &["ping", "-c", "1", "-W", "1", dst])?
                .status
                .success()
            {
                return Ok(t0.elapsed());
            }
            if t0.elapsed() > timeout {
                bail!(
                    "{from_pod} cannot reach {dst} after {timeout:?}\n{}",
                    self.log_tails()
                );
            }
        }
    }
}

impl Drop for PeeredClusters {
    fn drop(&mut self) {
        for p in &mut self.procs {
            if let Some(c) = &mut p.child {
                // SIGTERM first: the gateway removes its devices and pins on a clean exit.
                unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            }
        }
        let t0 = Instant::now();
        for p in &mut self.procs {
            if let Some(mut c) = p.child.take() {
                while t0.elapsed() < Duration::from_secs(3) {
                    if let Ok(Some(_)) = c.try_wait() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.logs);
    }
}
