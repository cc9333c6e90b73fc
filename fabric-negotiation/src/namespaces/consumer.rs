//! The consumer's NamespaceOffloading controller: for each provider with a virtual node, one
//! NamespaceMap on it (in its tenant namespace, named after this cluster, written with the
//! identity) whose full list of mappings is computed from every NamespaceOffloading in the
//! cache, so that concurrent reconciles converge; each NamespaceOffloading's status from the
//! providers' answers (polled, as slices are); the namespace's scheduling label; and, on
//! deletion, the mapping withdrawn everywhere before the finalizer goes. The decisions are
//! [`super::offloading`]'s.
use std::{collections::BTreeMap, sync::Arc, time::Duration};

use fabric_api::{
    authentication::v1alpha1::Identity,
    names::{field_manager, finalizer, label},
    offloading::{
        namespaces,
        v1alpha1::{
            ClusterOffloading, NamespaceMap, NamespaceMapSpec, NamespaceOffloading,
            OffloadingPhase, PodsCreatedBefore, TwinPhase, VirtualNode,
        },
    },
};
use fabric_kube::{
    FieldManager,
    cache::events,
    controller::Runner,
    events::Event as KubeEvent,
    meta::{GoneOk, add_finalizer, age, remove_finalizer},
};
use futures::{StreamExt, future::join_all};
use k8s_openapi::{
    api::core::v1::{Namespace, Node, Pod},
    jiff::Timestamp,
};
use kube::{
    Api, ResourceExt,
    api::{ObjectMeta, Patch, PatchParams},
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        predicates,
        reflector::{ObjectRef, Store},
        watcher,
    },
};

use super::offloading::{
    Answer, Providers, Withdrawal, cluster, deselected, live, mappings, newly_refused, not_placed,
    not_placed_note, providers, removal, scheduling_enabled, selected, status, withdrawal,
};
use crate::kit::{Ctx, Error, answer_poll, remote, remote_client};

/// Everything this controller writes: the NamespaceMaps on the providers, NamespaceOffloading
/// status, the namespaces' scheduling label.
pub const FIELD_MANAGER: FieldManager = FieldManager(field_manager::NAMESPACE_OFFLOADING);

/// How long a reconcile waits for the watch caches' first full list before it tries again.
const CACHE_WAIT: Duration = Duration::from_secs(5);

/// How often an unoffload looks at its providers at most while they remove its twins.
const UNOFFLOAD_POLL: Duration = Duration::from_secs(1);

struct NsCtx {
    ctx: Arc<Ctx>,
    /// This cluster's id: the maps' name and `spec.clusterId`, the default twin names.
    me: String,
    offloadings: Store<NamespaceOffloading>,
    virtual_nodes: Store<VirtualNode>,
    nodes: Store<Node>,
    /// One lock per provider: its map is written by one reconcile at a time.
    writing: std::sync::Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl NsCtx {
    fn providers(&self) -> Providers {
        let vns = self.virtual_nodes.state();
        providers(vns.iter().map(|v| v.as_ref()), |name| {
            self.nodes
                .get(&ObjectRef::new(name))
                .map(|n| n.labels().clone())
        })
    }
}

/// The NamespaceMaps of this cluster on `provider` (its tenant namespace there); None when
/// this cluster has no Identity for it any more (unpeered).
async fn maps(ctx: &Ctx, provider: &str) -> Result<Option<Api<NamespaceMap>>, Error> {
    let ids: Api<Identity> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let Some(identity) = ids.get_opt(provider).await? else {
        return Ok(None);
    };
    Ok(Some(Api::namespaced(
        remote_client(ctx, provider).await?,
        &identity.spec.tenant_namespace,
    )))
}

/// Writes this cluster's whole map on `provider` (every live NamespaceOffloading of the
/// cache) and returns it as stored there. The writes to one provider are one at a time, each
/// computed from the cache as it is then: a reconcile that read the cache earlier cannot write
/// over a later one's map and drop a namespace it had not seen yet (its twin would go).
async fn sync_map(
    nc: &NsCtx,
    provider: &str,
    all: &Providers,
) -> Result<Option<NamespaceMap>, Error> {
    let Some(api) = maps(&nc.ctx, provider).await? else {
        return Ok(None);
    };
    let lock = nc
        .writing
        .lock()
        .expect("not poisoned")
        .entry(provider.to_owned())
        .or_default()
        .clone();
    let _one_at_a_time = lock.lock().await;
    let cached = nc.offloadings.state();
    let offloadings = cached.iter().map(|n| n.as_ref());
    let map = NamespaceMap {
        metadata: ObjectMeta {
            name: Some(nc.me.clone()),
            namespace: api.namespace().map(str::to_owned),
            labels: Some(BTreeMap::from([(
                label::REMOTE_CLUSTER.to_owned(),
                nc.me.clone(),
            )])),
            ..Default::default()
        },
        spec: NamespaceMapSpec {
            cluster_id: nc.me.clone(),
            namespaces: mappings(offloadings, provider, all, &nc.me),
            // `fabricctl forget volumes`'s, under its own field manager: not this apply's.
            forget: Vec::new(),
        },
        status: None,
    };
    remote(provider, FIELD_MANAGER.apply(&api, &map))
        .await
        .map(Some)
}

/// Publishes `ev` on `obj` (a failure is logged by the publisher, never fails the reconcile).
async fn say<K: kube::Resource<DynamicType = ()>>(nc: &NsCtx, obj: &K, ev: KubeEvent) {
    nc.ctx.events.publish(obj, &ev).await;
}

/// Sets or removes the scheduling label of namespace `name` (a merge patch: a namespace that
/// is gone is not made again).
async fn label_namespace(ctx: &Ctx, name: &str, enabled: bool) -> Result<(), Error> {
    let api: Api<Namespace> = Api::all(ctx.client.clone());
    let value = enabled.then_some("true");
    let patch =
        serde_json::json!({ "metadata": { "labels": { label::SCHEDULING_ENABLED: value } } });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.0.to_owned()),
        ..Default::default()
    };
    api.patch(name, &params, &Patch::Merge(&patch))
        .await
        .gone_ok()?;
    Ok(())
}

/// The answer of each provider of `ids`: its map as stored there (None: unpeered) or why it could
/// not be reached.
async fn answers(
    nc: &NsCtx,
    all: &Providers,
    ids: &[String],
) -> Vec<(String, Result<Option<NamespaceMap>, String>)> {
    let calls = ids.iter().map(|id| async move {
        let r = sync_map(nc, id, all).await.map_err(|e| e.to_string());
        (id.clone(), r)
    });
    join_all(calls).await
}

/// The providers a NamespaceOffloading concerns: every one with a virtual node, and those its
/// status names (a twin may be left there).
fn concerned(nso: &NamespaceOffloading, all: &Providers) -> Vec<String> {
    let mut ids: Vec<String> = all.keys().cloned().collect();
    for c in nso.status.iter().flat_map(|s| &s.clusters) {
        if !ids.contains(&c.cluster_id) {
            ids.push(c.cluster_id.clone());
        }
    }
    ids
}

fn previous(nso: &NamespaceOffloading) -> &[ClusterOffloading] {
    nso.status
        .as_ref()
        .map(|s| s.clusters.as_slice())
        .unwrap_or_default()
}

async fn write_status(
    nc: &NsCtx,
    nso: &NamespaceOffloading,
    st: fabric_api::offloading::v1alpha1::NamespaceOffloadingStatus,
) -> Result<(), Error> {
    if nso.status.as_ref() == Some(&st) {
        return Ok(());
    }
    let api: Api<NamespaceOffloading> =
        Api::namespaced(nc.ctx.client.clone(), &nso.namespace().unwrap_or_default());
    FIELD_MANAGER
        .apply_status(&api, &nso.name_any(), &st)
        .await
        .gone_ok()?;
    Ok(())
}

async fn apply(nso: Arc<NamespaceOffloading>, nc: &NsCtx) -> Result<Action, Error> {
    let home = nso.namespace().unwrap_or_default();
    label_namespace(
        &nc.ctx,
        &home,
        scheduling_enabled(nso.spec.pod_offloading_strategy),
    )
    .await?;
    let observed = nso.status.as_ref().and_then(|s| s.observed_generation);
    let fresh = observed != nso.metadata.generation;
    let named = nso
        .status
        .as_ref()
        .is_some_and(|s| s.created_before.is_some());
    // Looked for with each new generation, and again while some are named, so that the
    // status clears as they are created again; not at every pass.
    let created_before = if scheduling_enabled(nso.spec.pod_offloading_strategy) && (fresh || named)
    {
        created_before(nc, &nso, &home, fresh).await?
    } else {
        None
    };
    let all = nc.providers();
    let (chosen, bad) = selected(&nso, &all);
    let before = previous(&nso);
    // Said before the maps are written: the providers remove the twins after.
    for id in deselected(before, &chosen, &all) {
        let note = format!(
            "the clusterSelector no longer selects {id}: {}",
            removal(&nso, &twin_of(&nso, &nc.me), &id, None)
        );
        say(
            nc,
            nso.as_ref(),
            KubeEvent::warning("Deselected", "Select", note),
        )
        .await;
    }
    let mut clusters = Vec::new();
    let mut waiting = false;
    for (id, answer) in answers(nc, &all, &concerned(&nso, &all)).await {
        let is_selected = chosen.contains(&id) && all.contains_key(&id);
        let answer = match &answer {
            Ok(Some(map)) => Answer::Map(map.status.as_ref()),
            // Unpeered: no twin there any more.
            Ok(None) => continue,
            Err(why) => Answer::Unreachable(why),
        };
        let prev = before.iter().find(|c| c.cluster_id == id);
        if let Some(c) = cluster(&id, is_selected, &home, answer, prev) {
            waiting |= c.twin == Some(TwinPhase::Creating);
            clusters.push(c);
        }
    }
    let mut st = status(&nso, clusters, bad.as_ref(), &nc.me);
    st.created_before = created_before;
    let said = nso.status.as_ref().and_then(|s| s.message.as_ref());
    if let Some(message) = st.message.as_ref().filter(|m| said != Some(*m)) {
        say(
            nc,
            nso.as_ref(),
            KubeEvent::warning("InvalidSelector", "Select", message.clone()),
        )
        .await;
    }
    for c in newly_refused(before, &st.clusters) {
        let note = format!(
            "provider {} refused the twin {}: {} ({})",
            c.cluster_id,
            st.remote_namespace_name.as_deref().unwrap_or_default(),
            c.reason.as_deref().unwrap_or("no reason given"),
            c.message.as_deref().unwrap_or_default(),
        );
        say(
            nc,
            nso.as_ref(),
            KubeEvent::warning("TwinRefused", "Offload", note),
        )
        .await;
    }
    write_status(nc, &nso, st).await?;
    let next = if waiting {
        answer_poll(nc.ctx.remote_poll, age(&nso.metadata, Timestamp::now()))
    } else {
        nc.ctx.remote_poll
    };
    Ok(Action::requeue(next))
}

/// The pods of `home` its offloading did not place (created before, so left where they run),
/// for the status; with an Event on each when `tell` (once per generation of the
/// NamespaceOffloading).
async fn created_before(
    nc: &NsCtx,
    nso: &NamespaceOffloading,
    home: &str,
    tell: bool,
) -> Result<Option<PodsCreatedBefore>, Error> {
    let pods = Api::<Pod>::namespaced(nc.ctx.client.clone(), home)
        .list(&Default::default())
        .await?
        .items;
    let vns = nc.virtual_nodes.state();
    let is_virtual = |node: &str| vns.iter().any(|v| v.spec.node_name == node);
    let early = not_placed(&pods, is_virtual);
    if tell {
        let note = not_placed_note(home, nso.spec.pod_offloading_strategy);
        for pod in &early {
            say(
                nc,
                *pod,
                KubeEvent::normal("CreatedBeforeOffloading", "Place", note.clone()),
            )
            .await;
        }
    }
    Ok(PodsCreatedBefore::of(
        early.iter().filter_map(|p| p.metadata.name.as_deref()),
    ))
}

/// Unoffloads: the label goes, the mapping is withdrawn from every provider (the cache
/// excludes a deleting NamespaceOffloading), and the finalizer goes once each provider no
/// longer lists the twin, is unpeered, or has been out of reach longer than the grace.
async fn cleanup(nso: Arc<NamespaceOffloading>, nc: &NsCtx) -> Result<bool, Error> {
    let home = nso.namespace().unwrap_or_default();
    label_namespace(&nc.ctx, &home, false).await?;
    let all = nc.providers();
    let abandon = crate::unpeer::abandon_remote(&nso.metadata, Timestamp::now());
    let before = previous(&nso);
    let first = nso.status.as_ref().and_then(|s| s.phase) != Some(OffloadingPhase::Terminating);
    let twins: Vec<String> = before
        .iter()
        .filter(|c| c.twin.is_some_and(|t| t != TwinPhase::Refused))
        .map(|c| removal(&nso, &twin_of(&nso, &nc.me), &c.cluster_id, None))
        .collect();
    if first && !twins.is_empty() {
        // Said once, as the withdrawal starts (the status says Terminating from then on).
        say(
            nc,
            nso.as_ref(),
            KubeEvent::normal("Unoffloading", "Unoffload", twins.join("; ")),
        )
        .await;
    }
    let mut clusters = Vec::new();
    let mut pending = Vec::new();
    let mut removed = Vec::new();
    for (id, answer) in answers(nc, &all, &concerned(&nso, &all)).await {
        // What that provider keeps of this namespace's claims (storageRetention Retain).
        let kept: Vec<String> = match &answer {
            Ok(Some(map)) => map
                .status
                .iter()
                .flat_map(|s| &s.retained)
                .filter(|c| c.home == home)
                .map(super::retention::describe)
                .collect(),
            _ => Vec::new(),
        };
        let answer = match &answer {
            Ok(Some(map)) => Some(Answer::Map(map.status.as_ref())),
            Ok(None) => None,
            Err(why) => Some(Answer::Unreachable(why)),
        };
        match withdrawal(&home, answer, abandon) {
            Withdrawal::Done if kept.is_empty() => removed.push(id.clone()),
            Withdrawal::Done => removed.push(format!(
                "{id} (its claims kept there, out of this cluster's reach: {}; `fabricctl forget volumes --peer {id}` deletes them)",
                kept.join(", ")
            )),
            Withdrawal::Unpeered => {}
            Withdrawal::Abandoned => removed.push(format!("{id} (out of reach: left there)")),
            Withdrawal::Pending => pending.push(id.clone()),
        }
        let prev = before.iter().find(|c| c.cluster_id == id);
        if let Some(c) = answer.and_then(|a| cluster(&id, false, &home, a, prev)) {
            clusters.push(c);
        }
    }
    let twin = twin_of(&nso, &nc.me);
    if !pending.is_empty() {
        write_status(nc, &nso, status(&nso, clusters, None, &nc.me)).await?;
        return Ok(false);
    }
    let note = if removed.is_empty() {
        format!("{home} was offloaded nowhere: nothing to remove")
    } else {
        format!(
            "removed the twin {twin} of {home} from {}",
            removed.join(", ")
        )
    };
    say(
        nc,
        nso.as_ref(),
        KubeEvent::normal("Unoffloaded", "Unoffload", note),
    )
    .await;
    Ok(true)
}

/// The twin's name on the providers (this cluster `me`'s).
fn twin_of(nso: &NamespaceOffloading, me: &str) -> String {
    namespaces::twin_name(&nso.spec, &nso.namespace().unwrap_or_default(), me).unwrap_or_default()
}

async fn reconcile(nso: Arc<NamespaceOffloading>, nc: Arc<NsCtx>) -> Result<Action, Error> {
    if nso.name_any() != namespaces::NAME {
        return Ok(Action::await_change());
    }
    // Every map is computed from the caches whole: before they have listed everything once, a
    // namespace or a provider not seen yet would be withdrawn (and its twin removed).
    let ready = async {
        let _ = nc.offloadings.wait_until_ready().await;
        let _ = nc.virtual_nodes.wait_until_ready().await;
        let _ = nc.nodes.wait_until_ready().await;
    };
    if tokio::time::timeout(CACHE_WAIT, ready).await.is_err() {
        tracing::debug!("namespace offloading: caches not filled yet");
        return Ok(Action::requeue(CACHE_WAIT));
    }
    let api: Api<NamespaceOffloading> =
        Api::namespaced(nc.ctx.client.clone(), &nso.namespace().unwrap_or_default());
    let ours = nso
        .finalizers()
        .iter()
        .any(|f| f == finalizer::NAMESPACE_OFFLOADING);
    if !live(&nso) {
        if !ours {
            return Ok(Action::await_change());
        }
        if !cleanup(nso.clone(), &nc).await? {
            // The providers are not polled faster while they remove a twin with its content.
            return Ok(Action::requeue(nc.ctx.remote_poll.min(UNOFFLOAD_POLL)));
        }
        remove_finalizer(&api, nso.as_ref(), finalizer::NAMESPACE_OFFLOADING).await?;
        return Ok(Action::await_change());
    }
    if !ours {
        add_finalizer(&api, nso.as_ref(), finalizer::NAMESPACE_OFFLOADING).await?;
    }
    apply(nso, &nc).await
}

/// Every NamespaceOffloading: a provider's virtual node (or its Node) changed.
fn everyone(store: &Store<NamespaceOffloading>) -> Vec<ObjectRef<NamespaceOffloading>> {
    store
        .state()
        .iter()
        .map(|n| ObjectRef::from_obj(n.as_ref()))
        .collect()
}

/// The object of a watch event: created, changed and deleted alike (each may select or drop
/// a provider).
async fn changed<K>(
    e: Result<watcher::Event<K>, watcher::Error>,
) -> Option<Result<K, watcher::Error>> {
    match e {
        Ok(watcher::Event::Apply(o) | watcher::Event::Delete(o)) => Some(Ok(o)),
        Ok(_) => None,
        Err(e) => Some(Err(e)),
    }
}

/// Runs until the watch ends. `me`: this cluster's id.
pub async fn run(ctx: Arc<Ctx>, me: String) {
    let api: Api<NamespaceOffloading> = Api::all(ctx.client.clone());
    let by_name = watcher::Config::default().fields(&format!("metadata.name={}", namespaces::NAME));
    let controller = Controller::new(api, by_name);
    let offloadings = controller.store();
    let (virtual_nodes, vn_events) = events(
        Api::<VirtualNode>::namespaced(ctx.client.clone(), &ctx.namespace),
        watcher::Config::default(),
    );
    let virtual_only = format!("{}={}", label::NODE_TYPE, label::VIRTUAL_NODE_TYPE);
    let (nodes, node_events) = events(
        Api::<Node>::all(ctx.client.clone()),
        watcher::Config::default().labels(&virtual_only),
    );
    let (s1, s2) = (offloadings.clone(), offloadings.clone());
    let controller = controller
        .watches_stream(vn_events.filter_map(changed), move |_: VirtualNode| {
            everyone(&s1)
        })
        .watches_stream(
            // Their labels only: a Node's status changes with every heartbeat.
            node_events
                .filter_map(changed)
                .predicate_filter(predicates::labels, Default::default()),
            move |_: Node| everyone(&s2),
        );
    let nc = Arc::new(NsCtx {
        ctx: ctx.clone(),
        me,
        offloadings,
        virtual_nodes,
        nodes,
        writing: Default::default(),
    });
    Runner::new("namespace offloading (consumer)", ctx.backoff())
        .run(controller, reconcile, nc)
        .await;
}
