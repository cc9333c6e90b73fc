//! `fabric-bench offload`: how long a pod bound to the virtual node takes to show Running at
//! home, against the same burst bound to one of the provider's own nodes, and what the virtual
//! kubelet weighs with many offloaded pods.
//!
//! Two test API servers on the host with RBAC enforced, as `tests/tests/api/offload.rs`: the
//! consumer runs `fabric-controller virtual-nodes` and the virtual kubelet it deploys (as its
//! ServiceAccount, through [`fabric_tests::deployments`]), with graceful pod deletion on; the provider
//! runs `fabric-controller sharing` (the ShadowPod controller) and one test node in **hollow**
//! mode (`fabric-test-node --hollow`: a pod is reported Running with an address, no namespace
//! and no process, so a thousand pods cost the machine no more than their API objects).
//! No scheduler is measured: the bench binds pods itself through `pods/binding`, the home pods
//! to the virtual node and, playing a scheduler that decides at once, the provider's unbound
//! pods (the ShadowPods' real pods) to the hollow node.
//!
//! For each burst size N: N pods created unbound at home, then bound to the virtual node
//! together; per pod, the time from its binding to `Running` as the consumer's API shows it
//! (p50, p99) and the time until all N run. Then the same burst in a namespace of the provider
//! bound to its hollow node, and the ratio offloaded/local. After the largest burst, the
//! virtual kubelet's resident memory (from /proc) with those pods offloaded. Between bursts the
//! pods are deleted at home (through the provider) and the deletion timed. Nothing is asserted
//! about time: the figures are printed beside their targets, with the API requests each
//! server served per pod of the burst (from its `apiserver_request_total`).
//!
//! With `--webhook`, the provider also runs its ShadowPod webhook as deployed
//! ([`fabric_tests::webhook`]): every ShadowPod is admitted against the consumer's grant (a
//! ResourceSlice asking room for every burst, granted by the provider's negotiation) and
//! charged on its Tenant's status.
use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use fabric_api::{
    authentication::v1alpha1::{ResourceSlice, ResourceSliceSpec},
    names,
    offloading::v1alpha1::{ShadowPod, VirtualNode, VirtualNodeSpec},
};
use fabric_auth::identity::Credentials;
use fabric_offloading::virtual_node::objects;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, ObjectMeta, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

mod report;
pub(crate) mod watch;

use report::{Burst, Deletion};
use watch::{Stage, Step, first_event, first_seen, provider_stages};

use crate::apimetrics;
use fabric_tests::{
    ChildGuard,
    apiserver::ApiServer,
    check_interrupt,
    deployments::Deployments,
    figures::{cpu_secs, mib, percentile, rss_kib, secs},
    process::Bin,
    sharing,
    wait::until_done,
};

const NS: &str = names::DEFAULT_NAMESPACE;
const CONSUMER: &str = "cluster-a";
const PROVIDER: &str = "cluster-b";
const VIRTUAL_NODE: &str = "fabric-cluster-b";
const HOLLOW_NODE: &str = "worker-1";
/// API calls the bench itself makes at once (creating, binding, deleting pods).
const CONCURRENCY: usize = 32;

#[derive(Debug, Clone)]
pub struct Options {
    /// Burst sizes, in order; the virtual kubelet is weighed after the last.
    pub sizes: Vec<usize>,
    /// How long one burst may take to be all Running before the bench gives up.
    pub timeout: Duration,
    /// Run the provider's ShadowPod webhook as deployed (every ShadowPod admitted against
    /// the tenant's grant, charged on the Tenant's status), the consumer granted room for
    /// every burst.
    pub webhook: bool,
    /// Delete the offloaded pods at home with this grace period (the graceful path: each
    /// stays terminating at home until its real pod is gone), instead of their own 0 (gone
    /// at home at once, the ShadowPod deleted as an orphan).
    pub grace: Option<u32>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            sizes: vec![1, 100, 1000],
            timeout: Duration::from_secs(600),
            webhook: false,
            grace: None,
        }
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

#[track_caller]
fn apply(api: &ApiServer, obj: &Value) -> Result<()> {
    let o = api.kubectl_stdin(&["apply", "--server-side", "-f", "-"], &obj.to_string());
    if !o.status.success() {
        bail!("apply {obj}: {}", String::from_utf8_lossy(&o.stderr));
    }
    Ok(())
}

/// The two clusters the offload and reflection benches run on (see the module's doc).
pub(crate) struct Stack {
    pub(crate) consumer: ApiServer,
    pub(crate) provider: ApiServer,
    pub(crate) c: Client,
    pub(crate) p: Client,
    pub(crate) deployments: Deployments,
    /// The provider's `sharing` and test node.
    pub(crate) children: Vec<ChildGuard>,
    binder: JoinHandle<()>,
    pub(crate) dir: PathBuf,
    /// The consumer's identity on the provider (what its controllers write there with).
    pub(crate) creds: Credentials,
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.binder.abort();
    }
}

impl Stack {
    /// Both API servers' request counts now (consumer, provider).
    pub(crate) fn requests(&self) -> Result<(apimetrics::Counts, apimetrics::Counts)> {
        Ok((
            apimetrics::snapshot(&self.consumer)?,
            apimetrics::snapshot(&self.provider)?,
        ))
    }

    /// The requests each API server served since `before`, per `unit` (`n` of them: e.g. the
    /// pods of a burst; the bench's own creations, bindings and watches included).
    pub(crate) fn print_requests(
        &self,
        before: &(apimetrics::Counts, apimetrics::Counts),
        n: usize,
        unit: &str,
    ) -> Result<()> {
        let (c, p) = self.requests()?;
        let (c, p) = (
            apimetrics::delta(&before.0, &c),
            apimetrics::delta(&before.1, &p),
        );
        for (label, d) in [("consumer", &c), ("provider", &p)] {
            println!(
                "          {label} API requests per {unit}: {}",
                apimetrics::summary(d, n)
            );
        }
        let both = apimetrics::merge(&c, &p);
        println!(
            "          both API servers, requests per {unit}: {}",
            apimetrics::summary(&both, n)
        );
        let errors = apimetrics::errors(&both);
        println!(
            "          request errors (any answer but 2xx), both sides: {}",
            if errors.is_empty() {
                "0".to_owned()
            } else {
                apimetrics::summary(&errors, 1)
            }
        );
        Ok(())
    }

    pub(crate) fn logs(&self) -> String {
        let tail = |f: &str| {
            let text = std::fs::read_to_string(self.dir.join(f)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            format!(
                "--- {f} ---\n{}\n",
                lines[lines.len().saturating_sub(15)..].join("\n")
            )
        };
        let mut s = String::new();
        for f in [
            "consumer-virtual-nodes.log",
            "provider-sharing.log",
            "provider-test-node.log",
        ] {
            s.push_str(&tail(f));
        }
        s.push_str(&self.deployments.report());
        s
    }
}

/// Binds every unbound pod of the tenant namespace (the ShadowPods' real pods) to the hollow
/// node as soon as it is seen: a scheduler that costs nothing, so that the bursts measure the
/// offloading path.
async fn binder(p: Client) {
    let pods: Api<Pod> = Api::namespaced(p.clone(), &names::namespace::tenant(CONSUMER));
    let bound: Arc<Mutex<std::collections::HashSet<String>>> = Arc::default();
    let stream = watcher(pods, watcher::Config::default())
        .default_backoff()
        .applied_objects();
    stream
        .for_each_concurrent(CONCURRENCY, |ev| {
            let (p, bound) = (p.clone(), bound.clone());
            async move {
                let Ok(pod) = ev else { return };
                let unbound = pod
                    .spec
                    .as_ref()
                    .is_some_and(|s| s.node_name.as_deref().unwrap_or_default().is_empty());
                let Some(uid) = pod.uid() else { return };
                if !unbound
                    || pod.metadata.deletion_timestamp.is_some()
                    || !bound.lock().unwrap_or_else(|e| e.into_inner()).insert(uid)
                {
                    return;
                }
                let api: Api<Pod> = Api::namespaced(p, &pod.namespace().unwrap_or_default());
                let _ = bind(&api, &pod, HOLLOW_NODE).await;
            }
        })
        .await;
}

async fn bind(api: &Api<Pod>, pod: &Pod, node: &str) -> Result<()> {
    let name = pod.name_any();
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": { "name": name, "uid": pod.uid() },
        "target": { "apiVersion": "v1", "kind": "Node", "name": node },
    });
    api.create_subresource::<_, Value>("binding", &name, &PostParams::default(), &binding)
        .await
        .with_context(|| format!("binding {name} to {node}"))?;
    Ok(())
}

fn ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Both clusters up (logs in a scratch directory named after `tag`), the provider's
/// ShadowPod webhook too with `webhook`; the virtual node, the hollow node and the grant with
/// room for `pods` pods at once (a burst offloaded while its local twin runs beside it: the
/// hollow node holds both). See [`Stack::wait_ready`].
pub(crate) fn start(
    rt: &tokio::runtime::Runtime,
    tag: &str,
    webhook: bool,
    pods: usize,
) -> Result<Stack> {
    // The hollow node holds a burst's real pods and its local twin at once, with room to spare
    // for pods still terminating from the burst before.
    let node_pods = (4 * pods).max(5000).to_string();
    // Capacity for the grant `--webhook` asks (see [`grant`]).
    let (node_cpu, node_memory) = (
        pods.max(1000).to_string(),
        format!("{}Gi", pods.max(1000) * 4),
    );
    let dir = fabric_netns::testbed::scratch_dir(tag);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;

    // The provider: the consumer's tenant and identity, the ShadowPod controller, a hollow
    // node with room for every burst.
    // The API server presents its client certificate to the webhook, as the webhook requires.
    let caller = fabric_tests::webhook::Caller::new(&dir.join("webhook-caller"))?;
    let provider = ApiServer::start_with_auth_args(&format!("{tag}-p"), &caller.kubelite_args());
    provider.install_crds();
    fabric_tests::auth_service::prepare_cluster(&provider, PROVIDER);
    let p = rt.block_on(provider.client());
    rt.block_on(sharing::admit_tenant(&p, CONSUMER))?;
    let creds = sharing::consumer_credentials(&provider, CONSUMER)?;
    // As its pod: its ServiceAccount's token, with the rights deploy/ gives it.
    let sharing_kubeconfig = fabric_tests::rights::component_kubeconfig(
        &provider,
        "fabric-sharing",
        dir.join("sharing.kubeconfig"),
    )?;
    let mut children = vec![
        Bin::new("fabric-controller")?
            .arg("sharing")
            .kubeconfig(&sharing_kubeconfig)
            .pod_name("controller-0")
            .log(dir.join("provider-sharing.log"))
            .spawn()?,
    ];
    children.push(
        Bin::new("fabric-test-node")?
            .args(["--node-name", HOLLOW_NODE, "--node-ip", "127.0.0.1"])
            .args(["--kubelet-port", &free_port()?.to_string()])
            .args([
                "--pod-cidr",
                "10.244.0.0/16",
                "--hollow",
                "--max-pods",
                &node_pods,
            ])
            .args(["--cpu", &node_cpu, "--memory", &node_memory])
            .arg("--root-dir")
            .arg(dir.join("node"))
            .kubeconfig(&provider.kubeconfig)
            .pod_name("controller-0")
            .log(dir.join("provider-test-node.log"))
            .spawn()?,
    );

    if webhook {
        rt.block_on(grant(&p, pods))
            .with_context(|| format!("logs in {}", dir.display()))?;
        children.push(fabric_tests::webhook::start(
            &provider,
            &caller,
            &dir.join("provider-webhook.log"),
        )?);
    }

    // The consumer: what the sharing and network layers have made by the time a VirtualNode
    // exists (the provider connected, its pod CIDR remapped), and the VirtualNode controller.
    let consumer = fabric_tests::offload_fixture::start_consumer(&format!("{tag}-c"), true)?;
    // The virtual kubelet serves its kubelet API, as deployed.
    consumer.publish_client_ca()?;
    let virtual_nodes = fabric_tests::offload_fixture::start_virtual_nodes(&consumer, &dir, &[])?;
    children.push(virtual_nodes.controller);
    let deployments = virtual_nodes.deployments;
    fabric_tests::offload_fixture::set_identity(&consumer, &creds)?;
    apply(
        &consumer,
        &json!({ "apiVersion": "offloading.fabric.io/v1alpha1", "kind": "VirtualNode",
                 "metadata": { "name": PROVIDER, "namespace": NS },
                 "spec": { "clusterId": PROVIDER, "nodeName": VIRTUAL_NODE, "identity": PROVIDER,
                           "resources": { "cpu": node_cpu, "memory": node_memory, "pods": node_pods } } }),
    )?;
    let c = rt.block_on(consumer.client());
    let binder = rt.spawn(binder(p.clone()));
    Ok(Stack {
        consumer,
        provider,
        c,
        p,
        deployments,
        children,
        binder,
        dir,
        creds,
    })
}

/// Room for every burst asked in a ResourceSlice, as the consumer asks, and granted by the
/// provider's negotiation (`sharing`, from the hollow node's capacity): what the webhook
/// admits ShadowPods against. Returns once granted.
async fn grant(p: &Client, pods: usize) -> Result<()> {
    let ns = names::namespace::tenant(CONSUMER);
    let slices: Api<ResourceSlice> = Api::namespaced(p.clone(), &ns);
    // The pods ask for nothing, and the provider charges each its default requests (100m,
    // 128Mi): room for twice the largest burst (at least 2000) of them.
    let room = (2 * pods).max(2000);
    let asked: Value = json!({ "cpu": (room / 5).to_string(), "memory": format!("{}Gi", room / 4),
                               "pods": room.to_string() });
    let mut slice = ResourceSlice::new(
        CONSUMER,
        ResourceSliceSpec {
            consumer_cluster_id: CONSUMER.into(),
            provider_cluster_id: PROVIDER.into(),
            resources: serde_json::from_value(asked)?,
            at_most_once: None,
        },
    );
    slice.metadata.namespace = Some(ns);
    slices.create(&PostParams::default(), &slice).await?;
    until_done(
        "the provider granting the bench's ResourceSlice",
        Duration::from_secs(60),
        || async {
            Ok(slices
                .get(CONSUMER)
                .await?
                .status
                .is_some_and(|s| s.granted.contains_key("pods")))
        },
    )
    .await
}

/// The pod a burst is made of: bound later, tolerating the virtual node's taint.
fn burst_pod(name: &str) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "labels": { "app": "bench" } },
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "tolerations": [{ "key": names::taint::VIRTUAL_NODE, "operator": "Exists" }],
            "containers": [{ "name": "main", "image": "echo",
                             "command": ["fabric-test-pod", "echo", "--port", "8080"] }],
        },
    }))?)
}

/// Creates `n` pods in `ns` of `client`'s cluster, binds them all to `node` at once, and
/// times each from its binding to Running as that cluster's API shows it.
async fn burst(
    client: &Client,
    ns: &str,
    n: usize,
    node: &str,
    extra: Vec<Stage>,
    cpu: &[(&'static str, Vec<i32>)],
    timeout: Duration,
) -> Result<Burst> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let nso: Namespace = serde_json::from_value(json!({ "metadata": { "name": ns } }))?;
    namespaces.create(&PostParams::default(), &nso).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let names: Vec<String> = (0..n).map(|i| format!("p{i:04}")).collect();
    let created: Vec<Pod> = futures::stream::iter(names.iter())
        .map(|name| {
            let pods = pods.clone();
            async move {
                pods.create(&PostParams::default(), &burst_pod(name)?)
                    .await
                    .with_context(|| format!("creating {name}"))
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await?;

    // Running as the API shows it, seen through watches started before the first binding.
    let (running, watch) = first_seen(pods.clone(), |p: &Pod| {
        (p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .then(|| p.name_any())
    })
    .await;
    let mut stages = Vec::new();
    for st in extra {
        stages.push((st.label, st.start().await));
    }
    let cpu0 = cpu
        .iter()
        .map(|(_, pids)| cpu_secs(pids))
        .collect::<Vec<_>>();
    let bound_at: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let t0 = Instant::now();
    futures::stream::iter(created.iter())
        .map(|pod| {
            let (pods, bound_at) = (pods.clone(), bound_at.clone());
            async move {
                let at = Instant::now();
                bind(&pods, pod, node).await?;
                bound_at
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(pod.name_any(), at);
                anyhow::Ok(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<()>()
        .await?;
    let r = until_done(&format!("{n} pods Running in {ns}"), timeout, || async {
        Ok(running.lock().unwrap_or_else(|e| e.into_inner()).len() >= n)
    })
    .await;
    watch.abort();
    r?;
    // What each stage had seen by then (its own last change may come after the home's).
    let stage_times: Vec<(&'static str, HashMap<String, Instant>)> = stages
        .into_iter()
        .map(|(label, (seen, task))| {
            task.abort();
            let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
            (label, seen)
        })
        .collect();
    let cpu = cpu
        .iter()
        .zip(cpu0)
        .map(|((label, pids), before)| (*label, cpu_secs(pids) - before))
        .collect();
    let running = running.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let bound_at = bound_at.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut latencies: Vec<Duration> = bound_at
        .iter()
        .map(|(name, at)| running[name].saturating_duration_since(*at))
        .collect();
    latencies.sort();
    let stages = stage_times
        .into_iter()
        .map(|(label, seen)| {
            let mut d: Vec<Duration> = bound_at
                .iter()
                .filter_map(|(name, at)| Some(seen.get(name)?.saturating_duration_since(*at)))
                .collect();
            d.sort();
            (label, d)
        })
        .collect();
    let last = running.values().max().copied().unwrap_or(t0);
    Ok(Burst {
        latencies,
        all: last.saturating_duration_since(t0),
        stages,
        cpu,
    })
}

/// Deletes every pod of `ns` of `client`'s cluster and waits until it, the provider's
/// ShadowPods and their real pods are all gone; with `offloaded`, also times each pod's way
/// through the provider (its ShadowPod and real pod, named `<ns>.<name>` there).
async fn clear(
    stack: &Stack,
    client: &Client,
    ns: &str,
    offloaded: bool,
    grace: Option<u32>,
    timeout: Duration,
) -> Result<Deletion> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let names: Vec<String> = pods
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    let tenant = names::namespace::tenant(CONSUMER);
    let (gone, watch) = first_event(pods.clone(), |p: &Pod, gone| gone.then(|| p.name_any())).await;
    let mut stages = Vec::new();
    if offloaded {
        let steps = [
            ("ShadowPod deleting (provider)", Step::ShadowPodDeleting),
            ("real pod deleting (provider)", Step::PodDeleting),
            ("real pod gone (provider)", Step::PodGone),
            ("ShadowPod gone (provider)", Step::ShadowPodGone),
        ];
        for st in provider_stages(stack, ns, &steps) {
            stages.push((st.label, st.start().await));
        }
    }
    let deleted_at: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let t0 = Instant::now();
    futures::stream::iter(names.iter())
        .map(|name| {
            let (pods, deleted_at) = (pods.clone(), deleted_at.clone());
            async move {
                let at = Instant::now();
                let dp = DeleteParams {
                    grace_period_seconds: grace,
                    ..Default::default()
                };
                let r = match pods.delete(name, &dp).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                    Err(e) => Err(e),
                };
                deleted_at
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(name.clone(), at);
                r
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<()>()
        .await?;
    let shadows: Api<ShadowPod> = Api::namespaced(stack.p.clone(), &tenant);
    let remote: Api<Pod> = Api::namespaced(stack.p.clone(), &tenant);
    let empty_after: Mutex<[Option<Duration>; 3]> = Mutex::default();
    let r = until_done(&format!("the pods of {ns} deleted"), timeout, || async {
        let one = ListParams::default().limit(1);
        let empty = [
            pods.list(&one).await?.items.is_empty(),
            remote.list(&one).await?.items.is_empty(),
            shadows.list(&one).await?.items.is_empty(),
        ];
        let mut after = empty_after.lock().unwrap_or_else(|e| e.into_inner());
        for (a, e) in after.iter_mut().zip(empty) {
            if e && a.is_none() {
                *a = Some(t0.elapsed());
            }
        }
        Ok(after.iter().all(Option::is_some))
    })
    .await;
    let end = Instant::now();
    watch.abort();
    let stages: Vec<(&'static str, HashMap<String, Instant>)> = stages
        .into_iter()
        .map(|(label, (seen, task))| {
            task.abort();
            let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
            (label, seen)
        })
        .collect();
    r?;
    let gone = gone.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let deleted_at = deleted_at.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let since = |seen: &HashMap<String, Instant>, name: &str, at: Instant| {
        seen.get(name).map(|t| t.saturating_duration_since(at))
    };
    // A deletion a watch missed (it listed again meanwhile) counts until all were seen gone.
    let mut per_pod: Vec<Duration> = deleted_at
        .iter()
        .map(|(name, at)| {
            let mut d = since(&gone, name, *at).unwrap_or(end.saturating_duration_since(*at));
            if let Some((_, shadow_gone)) = stages.last() {
                d = d.max(
                    since(shadow_gone, name, *at).unwrap_or(end.saturating_duration_since(*at)),
                );
            }
            d
        })
        .collect();
    per_pod.sort();
    let stages = stages
        .iter()
        .map(|(label, seen)| {
            let mut d: Vec<Duration> = deleted_at
                .iter()
                .filter_map(|(name, at)| since(seen, name, *at))
                .collect();
            d.sort();
            (*label, d)
        })
        .collect();
    let [home, real, shadows] = empty_after
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .map(Option::unwrap_or_default);
    Ok(Deletion {
        all: end.saturating_duration_since(t0),
        per_pod,
        stages,
        empty_after: [home, real, shadows],
    })
}

impl Stack {
    /// Waits for the virtual node and the hollow node to be Ready.
    pub(crate) fn wait_ready(&self, rt: &tokio::runtime::Runtime) -> Result<()> {
        rt.block_on(async {
            let nodes: Api<Node> = Api::all(self.c.clone());
            let pnodes: Api<Node> = Api::all(self.p.clone());
            until_done(
                "the virtual node and the hollow node Ready",
                Duration::from_secs(120),
                || async {
                    Ok(nodes
                        .get_opt(VIRTUAL_NODE)
                        .await?
                        .is_some_and(|n| ready(&n))
                        && pnodes
                            .get_opt(HOLLOW_NODE)
                            .await?
                            .is_some_and(|n| ready(&n)))
                },
            )
            .await
        })
        .with_context(|| self.logs())
    }

    /// The processes whose CPU time is counted, by what they are.
    pub(crate) fn components(&self) -> Vec<(&'static str, Vec<i32>)> {
        let pid = |c: &ChildGuard| c.0.id() as i32;
        let vk = self
            .deployments
            .pid(NS, &vk_name())
            .map(|p| vec![p as i32])
            .unwrap_or_default();
        vec![
            ("consumer API", self.consumer.daemon_pids()),
            ("virtual kubelet", vk),
            ("provider API", self.provider.daemon_pids()),
            ("provider sharing", vec![pid(&self.children[0])]),
            ("test node", vec![pid(&self.children[1])]),
            (
                "provider webhook",
                self.children
                    .get(2)
                    .map(|c| vec![pid(c)])
                    .unwrap_or_default(),
            ),
            ("bench", vec![std::process::id() as i32]),
        ]
    }
}

pub(crate) fn vk_name() -> String {
    objects::name(&VirtualNode::new(
        PROVIDER,
        VirtualNodeSpec {
            cluster_id: PROVIDER.into(),
            node_name: VIRTUAL_NODE.into(),
            identity: PROVIDER.into(),
            resources: Default::default(),
            labels: Default::default(),
            at_most_once: None,
            storage: None,
        },
    ))
}

pub fn run(opts: &Options) -> Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let profile = fabric_tests::figures::profile();
    println!(
        "offload: pods bound to the virtual node until Running at home, bursts of {:?} (binaries: {profile} build)",
        opts.sizes
    );
    println!(
        "  the provider's node is a hollow test node (fabric-test-node --hollow: pods Running without a process);"
    );
    println!("  every binding through pods/binding by the bench, no scheduler measured");
    let t0 = Instant::now();
    if opts.webhook {
        println!(
            "  with the provider's ShadowPod webhook as deployed (admission against the grant, charged on the Tenant)"
        );
    }
    let largest = opts.sizes.iter().copied().max().unwrap_or(1);
    let stack = start(&rt, "bench-offload", opts.webhook, largest)?;
    stack.wait_ready(&rt)?;
    println!(
        "  stack up in {} (two API servers with RBAC, sharing, virtual-nodes, the virtual kubelet, a hollow node)",
        secs(t0.elapsed())
    );
    let mut rows = Vec::new();
    let last = opts.sizes.len().saturating_sub(1);
    for (i, &n) in opts.sizes.iter().enumerate() {
        check_interrupt()?;
        let off_ns = format!("offload-{n}");
        let local_ns = format!("local-{n}");
        let components = stack.components();
        let stages = provider_stages(
            &stack,
            &off_ns,
            &[
                ("ShadowPod created (provider)", Step::ShadowPodCreated),
                ("real pod created (provider)", Step::PodCreated),
                ("real pod bound (provider)", Step::PodBound),
                ("real pod Running (provider)", Step::PodRunning),
                ("ShadowPod Running (provider)", Step::ShadowPodRunning),
            ],
        );
        let requests0 = stack.requests()?;
        let off = rt
            .block_on(burst(
                &stack.c,
                &off_ns,
                n,
                VIRTUAL_NODE,
                stages,
                &components,
                opts.timeout,
            ))
            .with_context(|| stack.logs())?;
        println!("  {n:>5} offloaded: {}", off.line());
        println!("{}", off.details());
        stack.print_requests(&requests0, n, "pod")?;
        if i == last {
            let pids = stack.deployments.pids();
            let vk = stack.deployments.pid(NS, &vk_name());
            match vk.or(pids.first().copied()).and_then(rss_kib) {
                Some(kib) => println!(
                    "        virtual kubelet RSS with {n} offloaded pods: {} (target < 300 MiB at 10000)",
                    mib(kib)
                ),
                None => println!("        virtual kubelet RSS: not found"),
            }
            match rss_kib(stack.children[0].0.id()) {
                Some(kib) => println!(
                    "        provider's controllers (sharing) RSS with {n} offloaded pods: {} (target < 500 MiB at 10000)",
                    mib(kib)
                ),
                None => println!("        provider's controllers (sharing) RSS: not found"),
            }
        }
        let requests0 = stack.requests()?;
        let local = rt
            .block_on(burst(
                &stack.p,
                &local_ns,
                n,
                HOLLOW_NODE,
                vec![],
                &components,
                opts.timeout,
            ))
            .with_context(|| stack.logs())?;
        println!("  {n:>5} local:     {}", local.line());
        println!("{}", local.details());
        stack.print_requests(&requests0, n, "pod")?;
        let cleared = rt
            .block_on(async {
                let off = clear(&stack, &stack.c, &off_ns, true, opts.grace, opts.timeout).await?;
                let local = clear(&stack, &stack.p, &local_ns, false, None, opts.timeout).await?;
                anyhow::Ok((off, local))
            })
            .with_context(|| stack.logs())?;
        println!(
            "  {n:>5} offloaded deleted at home{}, gone on both sides: {}",
            opts.grace
                .map(|g| format!(" (grace period {g} s)"))
                .unwrap_or_default(),
            cleared.0.line()
        );
        print!("{}", cleared.0.details());
        println!("  {n:>5} local deleted:  {}", cleared.1.line());
        rows.push((n, off, local, cleared.0.all));
    }
    println!(
        "\n  pods   offloaded p50    p99     all  |  local p50    p99     all  |  ratio all (p50)  |  offloaded deleted"
    );
    for (n, off, local, deleted) in &rows {
        let p50 = |b: &Burst| percentile(&b.latencies, 0.5).as_secs_f64();
        let p99 = |b: &Burst| percentile(&b.latencies, 0.99).as_secs_f64();
        println!(
            "  {n:>5}   {:>9.2} {:>7.2} {:>7.2}  |  {:>9.2} {:>6.2} {:>7.2}  |  {:>5.2} ({:.2})  |  {:>9.2}",
            p50(off),
            p99(off),
            off.all.as_secs_f64(),
            p50(local),
            p99(local),
            local.all.as_secs_f64(),
            off.all.as_secs_f64() / local.all.as_secs_f64().max(1e-3),
            p50(off) / p50(local).max(1e-3),
            deleted.as_secs_f64(),
        );
    }
    println!(
        "  targets: 10000 pods all Running < 10 min and all deleted < 5 min, requests per offloaded pod (both sides) <= 9, no request errors"
    );
    println!("  (logs in {})", stack.dir.display());
    let _ = (&stack.consumer, &stack.provider);
    Ok(())
}
