//! The test clusters' scheduler: binds pending pods (no `spec.nodeName`) to a node that fits
//! through the `pods/binding` subresource, or marks them `PodScheduled=False`, reason
//! `Unschedulable`, with kube-scheduler's kind of message. Decisions are
//! `fabric_tests::sched`'s; this is the I/O around them: watches of pods and nodes (reflector
//! stores) and a pass over the pending pods after every change, so an unschedulable pod is
//! retried as soon as a node or another pod changes. Any Node object counts, also ones that
//! other components register later.
use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use clap::Parser;
use fabric_tests::sched::{self, Decision};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
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
    pods.wait_until_ready().await.context("pod watch")?;
    nodes.wait_until_ready().await.context("node watch")?;
    info!(scheduler = cli.name, "watching pods and nodes");
    // Bindings this process made that the pod store may not show yet: they count against
    // their node so that a burst of pods is not all bound to the same one.
    let mut assumed: HashMap<String, (String, Instant)> = HashMap::new();
    loop {
        pass(&client, &cli.name, &pods, &nodes, &mut assumed).await;
        // Coalesce bursts of events into one pass.
        changed.notified().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn pass(
    client: &Client,
    name: &str,
    pods: &Store<Pod>,
    nodes: &Store<Node>,
    assumed: &mut HashMap<String, (String, Instant)>,
) {
    let mut all: Vec<Pod> = pods.state().iter().map(|p| (**p).clone()).collect();
    let live: std::collections::HashSet<String> = all.iter().filter_map(|p| p.uid()).collect();
    assumed.retain(|uid, (_, at)| live.contains(uid) && at.elapsed() < Duration::from_secs(30));
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
        let decision = {
            let refs: Vec<&Pod> = all.iter().collect();
            sched::decide(&all[i], &node_refs, &refs)
        };
        let pod = &all[i];
        let (ns, pname, uid) = (
            pod.namespace().unwrap_or_default(),
            pod.name_any(),
            pod.uid().unwrap_or_default(),
        );
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        match decision {
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
