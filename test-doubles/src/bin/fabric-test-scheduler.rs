//! The test clusters' scheduler: binds pending pods (no `spec.nodeName`) to a node that fits
//! through the `pods/binding` subresource, or marks them `PodScheduled=False`, reason
//! `Unschedulable`, with kube-scheduler's kind of message. Decisions are
//! `fabric_test_doubles::sched`'s; this is the I/O around them: watches of pods and nodes (reflector
//! stores) and a pass over the pending pods after every change, so an unschedulable pod is
//! retried as soon as a node or another pod changes. Any Node object counts, also ones that
//! other components register later.
//!
//! Volumes as kube-scheduler's VolumeBinding plugin (`fabric_test_doubles::sched::volumes`): claims,
//! PVs and StorageClasses are watched too; on choosing a node for a pod with unbound
//! `WaitForFirstConsumer` claims, the scheduler writes the claims' selected node (or a
//! matching PV's `claimRef`), and binds the pod only once every claim is bound (upstream's
//! PreBind), giving up after [`BIND_TIMEOUT`] to decide again.
use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use clap::Parser;
use fabric_test_doubles::sched::volumes::{self, Prebind, Volumes};
use fabric_test_doubles::sched::{self, Decision};
use futures::StreamExt;
use k8s_openapi::api::{
    core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod},
    storage::v1::StorageClass,
};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, reflector, reflector::Store, watcher},
};
use tokio::sync::Notify;
use tracing::{info, warn};

#[derive(Parser)]
#[command(about = "Test scheduler: binds pending pods to fitting nodes")]
struct Cli {
    /// Pods whose `spec.schedulerName` is this (or empty) are scheduled.
    #[arg(long, default_value = sched::DEFAULT_SCHEDULER)]
    name: String,
}

fn watch<K>(api: Api<K>, changed: Arc<Notify>) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    tokio::spawn(async move {
        let mut s = watcher(api, watcher::Config::default())
            .default_backoff()
            .reflect(writer)
            .boxed();
        while let Some(ev) = s.next().await {
            match ev {
                Ok(_) => changed.notify_one(),
                Err(e) => warn!(error = %e, kind = %K::kind(&()), "watch"),
            }
        }
    });
    reader
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match run(Cli::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<()> {
    let client = Client::try_default()
        .await
        .context("connecting to the Kubernetes API (KUBECONFIG)")?;
    let changed = Arc::new(Notify::new());
    let pods = watch(Api::<Pod>::all(client.clone()), changed.clone());
    let nodes = watch(Api::<Node>::all(client.clone()), changed.clone());
    let storage = Storage {
        claims: watch(
            Api::<PersistentVolumeClaim>::all(client.clone()),
            changed.clone(),
        ),
        volumes: watch(
            Api::<PersistentVolume>::all(client.clone()),
            changed.clone(),
        ),
        classes: watch(Api::<StorageClass>::all(client.clone()), changed.clone()),
    };
    pods.wait_until_ready().await.context("pod watch")?;
    nodes.wait_until_ready().await.context("node watch")?;
    storage
        .claims
        .wait_until_ready()
        .await
        .context("PVC watch")?;
    storage
        .volumes
        .wait_until_ready()
        .await
        .context("PV watch")?;
    storage
        .classes
        .wait_until_ready()
        .await
        .context("StorageClass watch")?;
    info!(scheduler = cli.name, "watching pods, nodes and storage");
    // Bindings this process made that the pod store may not show yet: they count against
    // their node so that a burst of pods is not all bound to the same one.
    let mut assumed: HashMap<String, (String, Instant)> = HashMap::new();
    // Pods whose claims are being bound for the node chosen (PreBind), since when.
    let mut waiting: HashMap<String, (String, Instant)> = HashMap::new();
    loop {
        pass(
            &client,
            &cli.name,
            (&pods, &nodes, &storage),
            &mut assumed,
            &mut waiting,
        )
        .await;
        // Coalesce bursts of events into one pass; while pods wait for their claims, look
        // again by their deadline too.
        let tick = if waiting.is_empty() {
            Duration::from_secs(3600)
        } else {
            Duration::from_secs(1)
        };
        let _ = tokio::time::timeout(tick, changed.notified()).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How long a pod waits for its claims to be bound on the chosen node before it is decided
/// again (upstream's `bindTimeoutSeconds` is 600; tests want an answer sooner).
const BIND_TIMEOUT: Duration = Duration::from_secs(30);

struct Storage {
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    classes: Store<StorageClass>,
}

async fn pass(
    client: &Client,
    name: &str,
    (pods, nodes, storage): (&Store<Pod>, &Store<Node>, &Storage),
    assumed: &mut HashMap<String, (String, Instant)>,
    waiting: &mut HashMap<String, (String, Instant)>,
) {
    let mut all: Vec<Pod> = pods.state().iter().map(|p| (**p).clone()).collect();
    let live: std::collections::HashSet<String> = all.iter().filter_map(|p| p.uid()).collect();
    assumed.retain(|uid, (_, at)| live.contains(uid) && at.elapsed() < Duration::from_secs(30));
    waiting.retain(|uid, (node, at)| {
        let keep = live.contains(uid) && at.elapsed() < BIND_TIMEOUT;
        if !keep && live.contains(uid) {
            warn!(
                pod = uid,
                node, "binding volumes: timed out; deciding again"
            );
        }
        keep
    });
    let (claims, pvs, classes) = (
        storage.claims.state(),
        storage.volumes.state(),
        storage.classes.state(),
    );
    let claim_refs: Vec<&PersistentVolumeClaim> = claims.iter().map(|c| &**c).collect();
    let pv_refs: Vec<&PersistentVolume> = pvs.iter().map(|v| &**v).collect();
    let class_refs: Vec<&StorageClass> = classes.iter().map(|c| &**c).collect();
    let vols = Volumes {
        claims: &claim_refs,
        volumes: &pv_refs,
        classes: &class_refs,
    };
    for p in &mut all {
        let Some(uid) = p.uid() else { continue };
        let Some(spec) = p.spec.as_mut() else {
            continue;
        };
        if spec.node_name.as_deref().unwrap_or_default().is_empty() {
            if let Some((node, _)) = assumed.get(&uid) {
                spec.node_name = Some(node.clone());
            }
        } else {
            assumed.remove(&uid);
        }
    }
    let node_list: Vec<Arc<Node>> = nodes.state();
    let node_refs: Vec<&Node> = node_list.iter().map(|n| &**n).collect();
    let mut pending: Vec<usize> = (0..all.len())
        .filter(|&i| {
            sched::wants_scheduling(&all[i])
                && all[i]
                    .spec
                    .as_ref()
                    .and_then(|s| s.scheduler_name.as_deref())
                    .is_none_or(|s| s.is_empty() || s == name)
        })
        .collect();
    // Oldest first, as a FIFO queue would.
    pending.sort_by_key(|&i| all[i].metadata.creation_timestamp.clone().map(|t| t.0));
    for i in pending {
        let uid = all[i].uid().unwrap_or_default();
        let decision = if let Some((node, _)) = waiting.get(&uid) {
            if !volumes::all_bound(&all[i], &claim_refs) {
                continue;
            }
            let node = node.clone();
            waiting.remove(&uid);
            Decision::Bind(node)
        } else {
            let refs: Vec<&Pod> = all.iter().collect();
            sched::decide(&all[i], &node_refs, &refs, &vols)
        };
        let pod = &all[i];
        let (ns, pname, uid) = (
            pod.namespace().unwrap_or_default(),
            pod.name_any(),
            pod.uid().unwrap_or_default(),
        );
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        match decision {
            Decision::Bind(node) if !volumes::all_bound(pod, &claim_refs) => {
                let Some(n) = node_refs.iter().find(|n| n.name_any() == node) else {
                    continue;
                };
                let writes = volumes::pre_filter(pod, &vols)
                    .map_err(|e| anyhow::anyhow!(e))
                    .and_then(|c| {
                        volumes::filter(&c, n, &vols).map_err(|m| anyhow::anyhow!("{m:?}"))
                    });
                let writes = match writes {
                    Ok(w) => w,
                    Err(e) => {
                        warn!(pod = %format!("{ns}/{pname}"), node, error = %e, "volumes");
                        continue;
                    }
                };
                let mut ok = true;
                for w in writes {
                    if let Err(e) = prebind(client, &w).await {
                        warn!(pod = %format!("{ns}/{pname}"), node, error = %format!("{e:#}"), "binding volumes");
                        ok = false;
                    }
                }
                if ok {
                    info!(pod = %format!("{ns}/{pname}"), node, "waiting for its claims to be bound");
                    // Not in `assumed`: the pod must stay pending for the next passes.
                    waiting.insert(uid, (node.clone(), Instant::now()));
                    if let Some(s) = all[i].spec.as_mut() {
                        s.node_name = Some(node);
                    }
                }
            }
            Decision::Bind(node) => match bind(&api, &pname, &uid, &node).await {
                Ok(()) => {
                    info!(pod = %format!("{ns}/{pname}"), node, "bound");
                    assumed.insert(uid, (node.clone(), Instant::now()));
                    if let Some(s) = all[i].spec.as_mut() {
                        s.node_name = Some(node);
                    }
                }
                Err(e) => {
                    warn!(pod = %format!("{ns}/{pname}"), node, error = %format!("{e:#}"), "binding")
                }
            },
            Decision::Unschedulable(msg) => {
                if let Err(e) = mark_unschedulable(&api, pod, &msg).await {
                    warn!(pod = %format!("{ns}/{pname}"), error = %format!("{e:#}"), "status");
                }
            }
        }
    }
}

/// A PreBind write: the claim's selected node, or a PV's claimRef.
async fn prebind(client: &Client, w: &Prebind) -> Result<()> {
    let pp = PatchParams::default();
    match w {
        Prebind::SelectNode {
            namespace,
            claim,
            node,
        } => {
            let patch = serde_json::json!({ "metadata": { "annotations": {
                fabric_test_doubles::storage::SELECTED_NODE: node } } });
            Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace)
                .patch(claim, &pp, &Patch::Merge(&patch))
                .await
                .context("annotating the claim")?;
        }
        Prebind::ClaimVolume {
            volume,
            namespace,
            claim,
            uid,
        } => {
            let patch = fabric_test_doubles::storage::claim_volume(namespace, claim, uid);
            Api::<PersistentVolume>::all(client.clone())
                .patch(volume, &pp, &Patch::Merge(&patch))
                .await
                .context("claiming the volume")?;
        }
    }
    Ok(())
}

async fn bind(api: &Api<Pod>, pod: &str, uid: &str, node: &str) -> Result<()> {
    let binding = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": { "name": pod, "uid": uid },
        "target": { "apiVersion": "v1", "kind": "Node", "name": node },
    });
    match api
        .create_subresource::<_, serde_json::Value>(
            "binding",
            pod,
            &PostParams::default(),
            &binding,
        )
        .await
    {
        Ok(_) => Ok(()),
        // Someone (or an earlier pass) bound it already.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e).context("pods/binding"),
    }
}

async fn mark_unschedulable(api: &Api<Pod>, pod: &Pod, msg: &str) -> Result<()> {
    let mut conds = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    if conds.iter().any(|c| {
        c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable")
            && c.message.as_deref() == Some(msg)
    }) {
        return Ok(());
    }
    conds.retain(|c| c.type_ != "PodScheduled");
    conds.push(k8s_openapi::api::core::v1::PodCondition {
        type_: "PodScheduled".into(),
        status: "False".into(),
        reason: Some("Unschedulable".into()),
        message: Some(msg.to_owned()),
        last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        )),
        ..Default::default()
    });
    let patch = serde_json::json!({
        "status": { "phase": "Pending", "conditions": conds },
    });
    api.patch_status(
        &pod.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .context("pods/status")?;
    info!(pod = %pod.name_any(), msg, "unschedulable");
    Ok(())
}
