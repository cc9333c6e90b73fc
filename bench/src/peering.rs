//! `fabric-bench peering`: how long a user waits from `fabricctl peer out-of-band --cpu ...` to
//! the virtual node Ready, and what the sharing stack costs in memory with many peers.
//!
//! Two test API servers with RBAC and client certificates enforced (`KUBELITE_AUTH=1`), a
//! consumer and a provider, each running the sharing stack as processes of this workspace's
//! binaries, each with a token of its own ServiceAccount and the rights deploy/ gives it: on
//! the provider the authentication service (`fabric-controller auth`) and `fabric-controller
//! sharing`; on the consumer `fabric-controller sharing` and `fabric-controller
//! virtual-nodes`, whose virtual kubelet Deployments the
//! [`fabric_tests::deployments`] stand-in runs as processes (as their ServiceAccount). No network
//! fixture: each cluster's gateway identity is published as its operator would, and a stand-in
//! operator reports a Connection `Connected` as soon as a peer's Configuration exists (the
//! tunnel's own time to come up is `fabric-bench control`'s first figure).
//!
//! Each run times, from the command's start, every progress line it prints (authenticated,
//! identity verified, network, resources, virtual node) and the virtual Node's Ready as the
//! consumer's API shows it; then the peering is removed on both sides (as `fabricctl unpeer`
//! does) before the next run. Printed: p50/p90/max per step over the runs. Then 50 peers'
//! virtual kubelets (the real peering plus VirtualNodes of further providers through copies of
//! the identity) and each controller's resident memory, from /proc. Nothing is asserted about
//! time.
use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use fabric_api::{
    authentication::v1alpha1::{Identity, ResourceSlice},
    core::v1alpha1::ForeignCluster,
    names,
    networking::v1alpha1::{Configuration, Connection},
    offloading::v1alpha1::VirtualNode,
};
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

use fabric_tests::{
    ChildGuard,
    apiserver::ApiServer,
    auth_service::AuthService,
    check_interrupt,
    deployments::{self, Deployments},
    figures::{mib, percentile, rss_kib, secs},
    locate_bin,
    process::Bin,
    sharing::{PurgeProbe, install_identity},
    wait::until_done,
};

const NS: &str = names::DEFAULT_NAMESPACE;
const CONSUMER: &str = "consumer";
const PROVIDER: &str = "provider";

#[derive(Debug, Clone)]
pub struct Options {
    /// Timed peerings.
    pub runs: usize,
    /// Virtual kubelets running for the memory figure (the peering's included).
    pub memory_peers: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            runs: 5,
            memory_peers: 50,
        }
    }
}

/// The steps of one run, in the order the command reports them, and the label each is printed
/// under; matched on the start of the command's progress lines.
const STEPS: &[(&str, &str)] = &[
    ("✓ authenticated", "auth (certificate issued)"),
    ("✓ the identity works", "auth (identity verified)"),
    ("✓ network", "network"),
    ("✓ resources", "slice (resources granted)"),
    ("✓ virtual node", "node (reported by the command)"),
];
const NODE_READY: &str = "virtual Node Ready (consumer API)";

struct Controller {
    name: String,
    log: PathBuf,
    child: ChildGuard,
}

/// `fabric-controller ARGS` as its pod runs it: a token of `service_account` (fabric-system)
/// with the rights deploy/ gives it.
fn controller(
    api: &ApiServer,
    name: &str,
    service_account: &str,
    args: &[&str],
    dir: &Path,
) -> Result<Controller> {
    let log = dir.join(format!("{name}.log"));
    let own = fabric_tests::rights::component_kubeconfig(
        api,
        service_account,
        dir.join(format!("{name}.kubeconfig")),
    )?;
    let child = Bin::new("fabric-controller")?
        .args(args)
        .kubeconfig(&own)
        .pod_name(name)
        .log(&log)
        .spawn()?;
    Ok(Controller {
        name: name.to_owned(),
        log,
        child,
    })
}

/// Plays the gateway operator's part the peering waits for: a Connection `Connected` for
/// each peer that has a Configuration here, none for the others.
async fn gateway_stand_in(client: Client) {
    let cfgs: Api<Configuration> = Api::namespaced(client.clone(), NS);
    let conns: Api<Connection> = Api::namespaced(client, NS);
    loop {
        if let (Ok(cfgs), Ok(existing)) = (
            cfgs.list(&ListParams::default()).await,
            conns.list(&ListParams::default()).await,
        ) {
            let peers: Vec<String> = cfgs
                .items
                .iter()
                .map(|c| c.spec.cluster_id.clone())
                .collect();
            for peer in &peers {
                if existing.items.iter().any(|c| &c.spec.cluster_id == peer) {
                    continue;
                }
                let conn: Connection = serde_json::from_value(json!({
                    "apiVersion": "networking.fabric.io/v1alpha1", "kind": "Connection",
                    "metadata": { "name": peer, "namespace": NS },
                    "spec": { "clusterId": peer },
                }))
                .expect("a Connection");
                if conns.create(&PostParams::default(), &conn).await.is_ok() {
                    let _ = conns
                        .patch_status(
                            peer,
                            &PatchParams::default(),
                            &Patch::Merge(json!({ "status": {
                                "value": "Connected", "message": "bench: gateway stand-in" } })),
                        )
                        .await;
                }
            }
            for c in &existing.items {
                // The memory phase's extra providers have no Configuration: keep theirs.
                let name = c.metadata.name.clone().unwrap_or_default();
                if !peers.contains(&c.spec.cluster_id) && !name.starts_with("mem-") {
                    let _ = conns.delete(&name, &DeleteParams::default()).await;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A Ready node with room for what the runs ask, so that the provider's policy grants it.
async fn provider_node(p: &Client) -> Result<()> {
    let nodes: Api<Node> = Api::all(p.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": { "name": "worker-1", "labels": { "kubernetes.io/hostname": "worker-1" } },
    }))?;
    nodes.create(&PostParams::default(), &node).await?;
    let alloc = json!({ "cpu": "16", "memory": "64Gi", "pods": "110" });
    nodes
        .patch_status(
            "worker-1",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": {
                "allocatable": alloc, "capacity": alloc,
                "conditions": [{ "type": "Ready", "status": "True", "reason": "KubeletReady" }],
            } })),
        )
        .await?;
    Ok(())
}

fn fabricctl(api: &ApiServer) -> Result<Command> {
    let mut c = Command::new(locate_bin("fabricctl")?);
    c.env("KUBECONFIG", &api.kubeconfig)
        .env_remove("FABRIC_PEERING_TOKEN");
    Ok(c)
}

/// The virtual node of the provider Ready on the consumer.
async fn node_ready(c: &Client) -> bool {
    let nodes: Api<Node> = Api::all(c.clone());
    let sel = format!("{}={PROVIDER}", names::label::REMOTE_CLUSTER);
    let Ok(list) = nodes.list(&ListParams::default().labels(&sel)).await else {
        return false;
    };
    list.items.iter().any(|n| {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    })
}

/// One peering: the step times (from the command's start) and the Node's Ready.
fn peer_once(
    rt: &tokio::runtime::Runtime,
    stack: &Stack,
    run: usize,
) -> Result<BTreeMap<&'static str, Duration>> {
    let out = fabricctl(&stack.provider)?
        .args(["generate", "peer-command", "--auth-url", &stack.auth.url])
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "generate peer-command: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8(out.stdout)?;
    let words: Vec<&str> = line.split_whitespace().collect();
    anyhow::ensure!(
        words.get(..3) == Some(&["fabricctl", "peer", "out-of-band"][..]),
        "unexpected peer command: {line}"
    );
    let mut cmd = fabricctl(&stack.consumer)?;
    cmd.args(&words[1..])
        .args(["--cpu", "2", "--memory", "4Gi", "--pods", "20"])
        .args(["--timeout-secs", "120"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let t0 = Instant::now();
    let mut child = ChildGuard(cmd.spawn().context("starting fabricctl peer out-of-band")?);
    // The Node's Ready as a user's `kubectl get nodes -w` would see it, beside the command.
    let c = stack.c.clone();
    let watcher = rt.spawn(async move {
        loop {
            if node_ready(&c).await {
                return t0.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let mut times = BTreeMap::new();
    let mut transcript = String::new();
    for line in BufReader::new(child.0.stdout.take().expect("piped")).lines() {
        let line = line?;
        let at = t0.elapsed();
        transcript.push_str(&format!("  [{:>6.2}] {line}\n", at.as_secs_f64()));
        if let Some((_, step)) = STEPS.iter().find(|(prefix, _)| line.starts_with(prefix)) {
            times.entry(*step).or_insert(at);
        }
    }
    let status = child.0.wait()?;
    let command = t0.elapsed();
    if !status.success() {
        let mut err = String::new();
        if let Some(mut e) = child.0.stderr.take() {
            use std::io::Read as _;
            let _ = e.read_to_string(&mut err);
        }
        watcher.abort();
        bail!(
            "run {}: fabricctl peer out-of-band failed:\n{transcript}{err}",
            run + 1
        );
    }
    times.insert("command done", command);
    let ready = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(60), watcher).await })
        .context("the virtual node was not Ready within 60 s of the command's end")??;
    times.insert(NODE_READY, ready);
    if run == 0 {
        println!("  first run's output, with seconds from its start:\n{transcript}");
    }
    Ok(times)
}

async fn gone<K>(api: &Api<K>, name: &str) -> Result<bool>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Ok(api.get_opt(name).await?.is_none())
}

async fn delete<K>(api: &Api<K>, name: &str) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Removes the peering on both sides, as `fabricctl unpeer` does: on the consumer the slice
/// (its replica and grant go), the virtual node, the ForeignCluster (the network objects of
/// both sides go) and the identity; on the provider the consumer's ForeignCluster.
async fn unpeer(c: &Client, p: &Client) -> Result<()> {
    let long = Duration::from_secs(60);
    // Planted first: the consumer's side of the unpeer already has the provider remove its
    // tenant (namespace included), so the namespace may be gone by the provider's step.
    let probe = PurgeProbe::plant(p, CONSUMER).await?;
    let slices: Api<ResourceSlice> = Api::namespaced(c.clone(), NS);
    delete(&slices, PROVIDER).await?;
    until_done("the ResourceSlice removed", long, || {
        gone(&slices, PROVIDER)
    })
    .await?;
    let vns: Api<VirtualNode> = Api::namespaced(c.clone(), NS);
    for vn in vns.list(&ListParams::default()).await?.items {
        if vn.spec.cluster_id == PROVIDER {
            let name = vn.metadata.name.clone().unwrap_or_default();
            delete(&vns, &name).await?;
            until_done("the VirtualNode removed", long, || gone(&vns, &name)).await?;
        }
    }
    let fcs: Api<ForeignCluster> = Api::all(c.clone());
    delete(&fcs, PROVIDER).await?;
    until_done("the provider's ForeignCluster removed", long, || {
        gone(&fcs, PROVIDER)
    })
    .await?;
    delete(&Api::<Identity>::namespaced(c.clone(), NS), PROVIDER).await?;
    delete(
        &Api::<Secret>::namespaced(c.clone(), names::namespace::IDENTITIES),
        &names::secret::identity(PROVIDER),
    )
    .await?;
    // The provider's admin revokes the consumer (its Tenant, RBAC and namespace go with its
    // ForeignCluster); the next run peers afresh once the test API server's late purge of the
    // namespace has passed (see `PurgeProbe`).
    let pfcs: Api<ForeignCluster> = Api::all(p.clone());
    delete(&pfcs, CONSUMER).await?;
    let tenant = names::namespace::tenant(CONSUMER);
    let replicas: Api<ResourceSlice> = Api::namespaced(p.clone(), &tenant);
    until_done(
        "the consumer's ForeignCluster and slice replica removed",
        long,
        || async { Ok(gone(&pfcs, CONSUMER).await? && gone(&replicas, PROVIDER).await?) },
    )
    .await?;
    probe.purged(p).await?;
    let cfgs: Api<Configuration> = Api::namespaced(c.clone(), NS);
    let pcfgs: Api<Configuration> = Api::namespaced(p.clone(), NS);
    until_done("both sides' network objects removed", long, || async {
        Ok(cfgs.list(&ListParams::default()).await?.items.is_empty()
            && pcfgs.list(&ListParams::default()).await?.items.is_empty())
    })
    .await?;
    Ok(())
}

struct Stack {
    consumer: ApiServer,
    provider: ApiServer,
    c: Client,
    p: Client,
    auth: AuthService,
    controllers: Vec<Controller>,
    deployments: Deployments,
    dir: PathBuf,
}

impl Stack {
    fn logs(&self) -> String {
        let mut s = String::new();
        for c in &self.controllers {
            let text = std::fs::read_to_string(&c.log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            s.push_str(&format!(
                "--- {} ---\n{}\n",
                c.name,
                lines[lines.len().saturating_sub(15)..].join("\n")
            ));
        }
        s.push_str(&self.deployments.report());
        s
    }
}

fn start(rt: &tokio::runtime::Runtime) -> Result<Stack> {
    let dir = fabric_netns::testbed::scratch_dir("bench-peering");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let consumer = ApiServer::start_with_auth("bench-peering-c");
    let provider = ApiServer::start_with_auth("bench-peering-p");
    consumer.install_crds();
    provider.install_crds();
    let (c, p) = rt.block_on(async { (consumer.client().await, provider.client().await) });
    rt.block_on(async {
        install_identity(
            &c,
            NS,
            CONSUMER,
            "10.244.0.0/16",
            Some((
                "CCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCA=",
                "192.0.2.1:51820",
            )),
        )
        .await?;
        install_identity(
            &p,
            NS,
            PROVIDER,
            "10.245.0.0/16",
            Some((
                "PPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPA=",
                "198.51.100.2:51821",
            )),
        )
        .await?;
        provider_node(&p).await
    })?;
    // The provider's `sharing` below approves its CSRs.
    let auth = rt.block_on(AuthService::start_as(&provider, PROVIDER, None, false))?;
    // The virtual kubelets serve their kubelet API, as deployed.
    consumer.publish_client_ca()?;
    let controllers = vec![
        controller(
            &provider,
            "provider-sharing",
            "fabric-sharing",
            &["sharing"],
            &dir,
        )?,
        controller(
            &consumer,
            "consumer-sharing",
            "fabric-sharing",
            &["sharing"],
            &dir,
        )?,
        controller(
            &consumer,
            "consumer-virtual-nodes",
            "fabric-virtual-nodes",
            &[
                "virtual-nodes",
                "--virtual-kubelet-image",
                "fabric-virtual-kubelet:bench",
                // The peers' virtual kubelets share the host's loopback.
                "--virtual-kubelet-port",
                "0",
            ],
            &dir,
        )?,
    ];
    let deployments = Deployments::start(deployments::Options {
        admin_kubeconfig: consumer.kubeconfig.clone(),
        component_kubeconfig: consumer.kubeconfig.clone(),
        selector: format!(
            "{}={}",
            fabric_offloading::virtual_node::objects::APP_LABEL,
            fabric_offloading::virtual_node::objects::APP
        ),
        netns: None,
        pod_ip: "127.0.0.1".into(),
        dir: dir.join("pods"),
    })?;
    rt.spawn(gateway_stand_in(c.clone()));
    rt.spawn(gateway_stand_in(p.clone()));
    Ok(Stack {
        consumer,
        provider,
        c,
        p,
        auth,
        controllers,
        deployments,
        dir,
    })
}

/// Further providers' virtual nodes (through copies of the identity, all reaching the one
/// provider) until `total` virtual kubelets run; their resident memory and the controllers'.
fn memory(rt: &tokio::runtime::Runtime, stack: &Stack, total: usize) -> Result<()> {
    let extra = total.saturating_sub(1);
    rt.block_on(async {
        let secrets: Api<Secret> = Api::namespaced(stack.c.clone(), names::namespace::IDENTITIES);
        let mut secret = secrets.get(&names::secret::identity(PROVIDER)).await?;
        let conns: Api<Connection> = Api::namespaced(stack.c.clone(), NS);
        let vns: Api<VirtualNode> = Api::namespaced(stack.c.clone(), NS);
        for i in 0..extra {
            let id = format!("mem-{i}");
            secret.metadata = kube::api::ObjectMeta {
                name: Some(names::secret::identity(&id)),
                namespace: Some(names::namespace::IDENTITIES.to_owned()),
                ..Default::default()
            };
            secrets.create(&PostParams::default(), &secret).await?;
            let conn: Connection = serde_json::from_value(json!({
                "apiVersion": "networking.fabric.io/v1alpha1", "kind": "Connection",
                "metadata": { "name": id, "namespace": NS }, "spec": { "clusterId": id } }))?;
            conns.create(&PostParams::default(), &conn).await?;
            conns
                .patch_status(
                    &id,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "status": { "value": "Connected" } })),
                )
                .await?;
            let vn: VirtualNode = serde_json::from_value(json!({
                "apiVersion": "offloading.fabric.io/v1alpha1", "kind": "VirtualNode",
                "metadata": { "name": id, "namespace": NS },
                "spec": { "clusterId": id, "nodeName": format!("fabric-{id}"), "identity": id,
                          "resources": { "cpu": "2", "memory": "4Gi", "pods": "20" } } }))?;
            vns.create(&PostParams::default(), &vn).await?;
        }
        let nodes: Api<Node> = Api::all(stack.c.clone());
        let sel = format!(
            "{}={}",
            names::label::NODE_TYPE,
            names::label::VIRTUAL_NODE_TYPE
        );
        let t0 = Instant::now();
        until_done(
            &format!("{total} virtual nodes Ready"),
            Duration::from_secs(300),
            || async {
                let ready = nodes
                    .list(&ListParams::default().labels(&sel))
                    .await?
                    .items
                    .iter()
                    .filter(|n| {
                        n.status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .is_some_and(|cs| {
                                cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                            })
                    })
                    .count();
                Ok(ready >= total)
            },
        )
        .await?;
        println!(
            "  {total} virtual nodes Ready {} after their VirtualNodes were created",
            secs(t0.elapsed())
        );
        anyhow::Ok(())
    })?;
    // A few Lease, probe and status rounds (every 10 s) before measuring.
    std::thread::sleep(Duration::from_secs(25));
    let mut rss: Vec<u64> = stack
        .deployments
        .pids()
        .iter()
        .filter_map(|p| rss_kib(*p))
        .collect();
    rss.sort_unstable();
    if rss.is_empty() {
        bail!("no virtual kubelet runs:\n{}", stack.logs());
    }
    let n = rss.len();
    println!(
        "  virtual kubelets: {n}, RSS min {}, p50 {}, max {} (target < 100 MiB each); all together {}",
        mib(rss[0]),
        mib(rss[n / 2]),
        mib(rss[n - 1]),
        mib(rss.iter().sum())
    );
    for c in &stack.controllers {
        if let Some(kib) = rss_kib(c.child.0.id()) {
            println!("  {:<24} {}", c.name, mib(kib));
        }
    }
    if let Some(kib) = stack.auth.pid().and_then(rss_kib) {
        println!("  {:<24} {}", "provider-auth", mib(kib));
    }
    Ok(())
}

pub fn run(opts: &Options) -> Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let profile = fabric_tests::figures::profile();
    println!(
        "peering: fabricctl peer out-of-band to virtual Node Ready, {} runs (binaries: {profile} build)",
        opts.runs
    );
    let t0 = Instant::now();
    let stack = start(&rt)?;
    println!(
        "  stack up in {} (two API servers with RBAC, auth service, sharing x2, virtual-nodes)",
        secs(t0.elapsed())
    );
    let mut all: BTreeMap<&'static str, Vec<Duration>> = BTreeMap::new();
    for run in 0..opts.runs {
        check_interrupt()?;
        let times = peer_once(&rt, &stack, run).with_context(|| stack.logs())?;
        let summary: Vec<String> = times
            .iter()
            .map(|(k, v)| format!("{k} {}", secs(*v)))
            .collect();
        println!("  run {}: {}", run + 1, summary.join(", "));
        for (k, v) in times {
            all.entry(k).or_default().push(v);
        }
        if run + 1 < opts.runs || opts.memory_peers == 0 {
            let u0 = Instant::now();
            rt.block_on(unpeer(&stack.c, &stack.p))
                .with_context(|| stack.logs())?;
            println!("    unpeered in {}", secs(u0.elapsed()));
        }
    }
    println!("\n  step (seconds from the command's start)        p50      p90      max");
    let order = STEPS
        .iter()
        .map(|(_, s)| *s)
        .chain(["command done", NODE_READY]);
    for step in order {
        let Some(v) = all.get_mut(step) else { continue };
        v.sort();
        println!(
            "  {step:<44} {:>6.2}   {:>6.2}   {:>6.2}",
            percentile(v, 0.5).as_secs_f64(),
            percentile(v, 0.9).as_secs_f64(),
            v[v.len() - 1].as_secs_f64()
        );
    }
    if let Some(v) = all.get(NODE_READY) {
        let p50 = percentile(v, 0.5);
        println!(
            "  p50 to the virtual Node Ready: {} ({:.0}% of the 5 s target)",
            secs(p50),
            p50.as_secs_f64() / 5.0 * 100.0
        );
    }
    if opts.memory_peers > 0 {
        println!(
            "\nmemory with {} peers' virtual kubelets:",
            opts.memory_peers
        );
        memory(&rt, &stack, opts.memory_peers).with_context(|| stack.logs())?;
    }
    println!("  (logs in {})", stack.dir.display());
    Ok(())
}
