//! The VirtualNode controller's edge: for each VirtualNode, applies its virtual kubelet
//! ([`super::objects`]) and reports its Node ([`super::status`]); on deletion (finalizer)
//! cordons the Node, drains it ([`super::drain`]), and removes the Node, the Deployment and
//! the RBAC.
use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use fabric_api::{
    core::v1alpha1::ForeignCluster,
    names::{field_manager, finalizer::VIRTUAL_NODE as FINALIZER, label},
    offloading::v1alpha1::{NamespaceOffloading, VirtualNode, VirtualNodeStatus},
};
use fabric_kube::{
    FieldManager,
    controller::{Backoff, FinalizerError, Runner, finalized},
    events::{Event, Events},
    meta::{self, GoneOk, deleting_for},
};
use futures::{FutureExt, StreamExt};
use k8s_openapi::{
    api::{
        apps::v1::Deployment,
        coordination::v1::Lease,
        core::v1::{Node, NodeSpec, Pod, ServiceAccount},
        rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
    },
    jiff::Timestamp,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ListParams, ObjectMeta},
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use serde::{Serialize, de::DeserializeOwned};
use tracing::{info, warn};

use super::{
    applied, drain,
    objects::{self, APP, APP_LABEL, Settings},
    status,
};

pub const FIELD_MANAGER: FieldManager = FieldManager(field_manager::VIRTUAL_NODES);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Finalizer(#[from] FinalizerError),
    /// Not a failure: the finalizer stays while pods are still bound to the node (a cleanup
    /// that returns Ok has its finalizer removed).
    #[error("{0} pod(s) still bound to the node, being deleted")]
    Draining(usize),
}

pub struct Ctx {
    pub client: Client,
    pub settings: Settings,
    pub events: Events,
    /// How long a drain waits for the pods' deletion through the provider ([`drain::GRACE`]
    /// by default).
    pub drain_grace: Duration,
    /// What was last applied per VirtualNode (by uid).
    pub applied: Mutex<HashMap<String, applied::Applied>>,
    /// The offloaded namespaces (those with a NamespaceOffloading), as watched.
    pub offloadings: Store<NamespaceOffloading>,
    /// The offloaded namespaces each VirtualNode's virtual kubelet was last granted (by uid).
    pub granted: Mutex<HashMap<String, BTreeSet<String>>>,
}

fn key(vn: &VirtualNode) -> String {
    format!("{}/{}", vn.namespace().unwrap_or_default(), vn.name_any())
}

async fn delete<K>(api: &Api<K>, name: &str) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    meta::delete_gone_ok(api, name).await?;
    Ok(())
}

async fn apply<K>(api: &Api<K>, obj: &K) -> Result<(), Error>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    FIELD_MANAGER.apply(api, obj).await?;
    Ok(())
}

/// The Node of the VirtualNode's name, whoever registered it (see [`status::is_ours`]).
async fn node_named(ctx: &Ctx, vn: &VirtualNode) -> Result<Option<Node>, Error> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    Ok(nodes.get_opt(&vn.spec.node_name).await?)
}

async fn set_foreign_cluster(
    ctx: &Ctx,
    vn: &VirtualNode,
    vn_conditions: Option<&[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]>,
) {
    let fcs: Api<ForeignCluster> = Api::all(ctx.client.clone());
    let id = &vn.spec.cluster_id;
    let fc = match fcs.get_opt(id).await {
        Ok(Some(fc)) => fc,
        Ok(None) => return,
        Err(e) => {
            warn!(foreign_cluster = %id, error = %e, "reading the ForeignCluster");
            return;
        }
    };
    let current = fc
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    // Only this condition, under this controller's own field manager: the other modules'
    // conditions are theirs. None (the VirtualNode is going) withdraws it.
    let conditions = match vn_conditions {
        Some(c) => status::foreign_cluster_condition(vn, current, c, Timestamp::now()),
        None => vec![],
    };
    let patch = serde_json::json!({ "conditions": conditions });
    if let Err(e) = FIELD_MANAGER.apply_status(&fcs, id, patch).await {
        warn!(foreign_cluster = %id, error = %e, "writing VirtualNodeReady");
    }
}

/// The virtual kubelet's objects, as [`objects`] makes them.
#[derive(Serialize)]
struct Desired {
    service_account: ServiceAccount,
    cluster_role: ClusterRole,
    cluster_role_binding: ClusterRoleBinding,
    reflection_binding: ClusterRoleBinding,
    roles: Vec<(Role, RoleBinding)>,
    deployment: Deployment,
}

fn deployment_version(d: &Deployment) -> applied::DeploymentVersion {
    (
        d.metadata.uid.clone().unwrap_or_default(),
        d.metadata.generation.unwrap_or_default(),
    )
}

/// Applies the virtual kubelet's ServiceAccount, RBAC and Deployment, unless they were applied
/// as they are already ([`applied`]): a Node event then costs one read.
async fn apply_objects(ctx: &Ctx, vn: &VirtualNode) -> Result<(), Error> {
    let ns = vn.namespace().unwrap_or_default();
    let c = &ctx.client;
    let desired = Desired {
        service_account: objects::service_account(vn),
        cluster_role: objects::cluster_role(vn),
        cluster_role_binding: objects::cluster_role_binding(vn),
        reflection_binding: objects::reflection_binding(vn),
        roles: objects::roles(vn, &ctx.settings),
        deployment: objects::deployment(vn, &ctx.settings),
    };
    let fingerprint = applied::fingerprint(&desired);
    let uid = vn.metadata.uid.clone().unwrap_or_default();
    let deployments = Api::<Deployment>::namespaced(c.clone(), &ns);
    let last = ctx.applied.lock().unwrap().get(&uid).cloned();
    if last.is_some() {
        let now = deployments
            .get_opt(&objects::name(vn))
            .await?
            .map(|d| deployment_version(&d));
        if !applied::needs_apply(last.as_ref(), fingerprint, now.as_ref(), Instant::now()) {
            return Ok(());
        }
    }
    apply(
        &Api::<ServiceAccount>::namespaced(c.clone(), &ns),
        &desired.service_account,
    )
    .await?;
    apply(&Api::<ClusterRole>::all(c.clone()), &desired.cluster_role).await?;
    apply(
        &Api::<ClusterRoleBinding>::all(c.clone()),
        &desired.cluster_role_binding,
    )
    .await?;
    apply(
        &Api::<ClusterRoleBinding>::all(c.clone()),
        &desired.reflection_binding,
    )
    .await?;
    for (role, binding) in &desired.roles {
        let rns = role.metadata.namespace.clone().unwrap_or_default();
        apply(&Api::<Role>::namespaced(c.clone(), &rns), role).await?;
        apply(&Api::<RoleBinding>::namespaced(c.clone(), &rns), binding).await?;
    }
    let deployment = FIELD_MANAGER
        .apply(&deployments, &desired.deployment)
        .await?;
    ctx.applied.lock().unwrap().insert(
        uid,
        applied::Applied {
            fingerprint,
            deployment: deployment_version(&deployment),
            at: Instant::now(),
        },
    );
    Ok(())
}

/// Lets the virtual kubelet read the ConfigMaps and Secrets of the offloaded namespaces, and
/// of those only: a RoleBinding in each ([`objects::offloaded_binding`]), those of namespaces
/// no longer offloaded deleted.
async fn grant_offloaded(ctx: &Ctx, vn: &VirtualNode) -> Result<(), Error> {
    // Not listed yet: nothing is revoked on an empty cache (its listing reconciles again).
    if ctx.offloadings.wait_until_ready().now_or_never().is_none() {
        return Ok(());
    }
    let want: BTreeSet<String> = ctx
        .offloadings
        .state()
        .iter()
        .filter_map(|o| o.namespace())
        .collect();
    let uid = vn.metadata.uid.clone().unwrap_or_default();
    let had = ctx.granted.lock().unwrap().get(&uid).cloned();
    let had = match had {
        Some(h) => h,
        // First look since this process started: what exists.
        None => Api::<RoleBinding>::all(ctx.client.clone())
            .list(&ListParams::default().labels(&objects::selector(vn)))
            .await?
            .items
            .into_iter()
            .filter(|b| b.role_ref.name == objects::OFFLOADED_ROLE)
            .filter_map(|b| b.namespace())
            .collect(),
    };
    let name = objects::name(vn);
    for ns in want.difference(&had) {
        let api = Api::<RoleBinding>::namespaced(ctx.client.clone(), ns);
        apply(&api, &objects::offloaded_binding(vn, ns)).await?;
    }
    for ns in had.difference(&want) {
        delete(
            &Api::<RoleBinding>::namespaced(ctx.client.clone(), ns),
            &name,
        )
        .await?;
    }
    ctx.granted.lock().unwrap().insert(uid, want);
    Ok(())
}

async fn reconcile_apply(vn: Arc<VirtualNode>, ctx: &Ctx) -> Result<Action, Error> {
    let ns = vn.namespace().unwrap_or_default();
    let c = &ctx.client;
    let node = node_named(ctx, &vn).await?;
    let taken = node.as_ref().is_some_and(|n| !status::is_ours(&vn, n));
    if !taken {
        apply_objects(ctx, &vn).await?;
        grant_offloaded(ctx, &vn).await?;
    }
    let current = vn
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    let conditions = status::conditions(&vn, &current, node.as_ref(), Timestamp::now());
    let vns: Api<VirtualNode> = Api::namespaced(c.clone(), &ns);
    FIELD_MANAGER
        .apply_status(
            &vns,
            &vn.name_any(),
            VirtualNodeStatus {
                observed_generation: vn.metadata.generation,
                conditions: conditions.clone(),
            },
        )
        .await?;
    if let Some((ready, message)) = status::ready_transition(&current, &conditions) {
        let ev = if ready {
            Event::normal("NodeReady", "Reconcile", message)
        } else {
            Event::warning("NodeNotReady", "Reconcile", message)
        };
        ctx.events.publish(vn.as_ref(), &ev).await;
    }
    if let Some(message) = status::labels_refused(&current, &conditions) {
        warn!(virtual_node = %key(&vn), %message, "advertised labels refused");
        let ev = Event::warning(status::LABELS_REFUSED, "Reconcile", message);
        ctx.events.publish(vn.as_ref(), &ev).await;
    }
    set_foreign_cluster(ctx, &vn, Some(&conditions)).await;
    // Node changes wake this up; the requeue only guards against a missed watch event.
    Ok(Action::requeue(Duration::from_secs(300)))
}

async fn reconcile_cleanup(vn: Arc<VirtualNode>, ctx: &Ctx) -> Result<Action, Error> {
    let ns = vn.namespace().unwrap_or_default();
    let c = &ctx.client;
    let name = objects::name(&vn);
    let named = node_named(ctx, &vn).await?;
    // A Node of that name that is not this VirtualNode's (a real one, or another's) is left
    // alone, and so are the pods bound to it: they were never this virtual node's.
    let taken = named.as_ref().is_some_and(|n| !status::is_ours(&vn, n));
    let node = named.filter(|n| status::is_ours(&vn, n));
    let nodes: Api<Node> = Api::all(c.clone());
    if node.is_some() {
        // Cordoned first, so nothing new lands there while it goes.
        let cordon = Node {
            metadata: ObjectMeta {
                name: Some(vn.spec.node_name.clone()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                unschedulable: Some(true),
                ..Default::default()
            }),
            status: None,
        };
        apply(&nodes, &cordon).await?;
    }
    // Drained while the virtual kubelet runs, so that it deletes the pods' ShadowPods.
    if taken {
        warn!(virtual_node = %key(&vn), node = %vn.spec.node_name, "a Node of that name is not this virtual node: not drained");
    } else {
        drain(ctx, &vn).await?;
    }
    // The virtual kubelet next, so that it stops writing the Node (it also stops on seeing
    // the VirtualNode being deleted).
    delete(&Api::<Deployment>::namespaced(c.clone(), &ns), &name).await?;
    if node.is_some() {
        delete(&nodes, &vn.spec.node_name).await?;
        delete(
            &Api::<Lease>::namespaced(c.clone(), objects::LEASE_NAMESPACE),
            &vn.spec.node_name,
        )
        .await?;
    }
    let offloaded = Api::<RoleBinding>::all(c.clone())
        .list(&ListParams::default().labels(&objects::selector(&vn)))
        .await?;
    for b in offloaded
        .items
        .iter()
        .filter(|b| b.role_ref.name == objects::OFFLOADED_ROLE)
    {
        let bns = b.namespace().unwrap_or_default();
        delete(&Api::<RoleBinding>::namespaced(c.clone(), &bns), &name).await?;
    }
    if let Some(uid) = &vn.metadata.uid {
        ctx.granted.lock().unwrap().remove(uid);
    }
    for rns in objects::role_namespaces(&vn, &ctx.settings) {
        delete(&Api::<RoleBinding>::namespaced(c.clone(), &rns), &name).await?;
        delete(&Api::<Role>::namespaced(c.clone(), &rns), &name).await?;
    }
    delete(&Api::<ClusterRoleBinding>::all(c.clone()), &name).await?;
    let reflection = objects::reflection_binding(&vn).name_any();
    delete(&Api::<ClusterRoleBinding>::all(c.clone()), &reflection).await?;
    delete(&Api::<ClusterRole>::all(c.clone()), &name).await?;
    delete(&Api::<ServiceAccount>::namespaced(c.clone(), &ns), &name).await?;
    set_foreign_cluster(ctx, &vn, None).await;
    if let Some(uid) = &vn.metadata.uid {
        ctx.applied.lock().unwrap().remove(uid);
    }
    info!(virtual_node = %key(&vn), node = %vn.spec.node_name, "virtual node removed");
    Ok(Action::await_change())
}

/// One round of [`super::drain`] on the pods bound to the VirtualNode's node; Err(Draining)
/// while any is left.
async fn drain(ctx: &Ctx, vn: &VirtualNode) -> Result<(), Error> {
    let node = &vn.spec.node_name;
    let all: Api<Pod> = Api::all(ctx.client.clone());
    let bound = all
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await?
        .items;
    if bound.is_empty() {
        return Ok(());
    }
    let waited = deleting_for(&vn.metadata, Timestamp::now());
    let grace = drain::grace(&vn.metadata, ctx.drain_grace);
    for pod in &bound {
        let pods: Api<Pod> =
            Api::namespaced(ctx.client.clone(), &pod.namespace().unwrap_or_default());
        let name = pod.name_any();
        let key = format!("{}/{name}", pod.namespace().unwrap_or_default());
        let only_this = meta::only_uid(pod.metadata.uid.clone(), None);
        match drain::step(pod, waited, grace) {
            drain::Step::Wait => continue,
            drain::Step::Delete => {
                info!(pod = %key, node = %node, "draining the virtual node: deleting the pod");
                meta::delete(&pods, &name, &only_this).await?;
            }
            drain::Step::Abandon { fail } => {
                warn!(pod = %key, node = %node, "not deleted through the provider in time: failed and deleted");
                if fail {
                    let status = drain::failed_status(node, Timestamp::now());
                    let applied = FIELD_MANAGER.apply_status(&pods, &name, status).await;
                    if applied.gone_ok()?.is_none() {
                        continue;
                    }
                    let ev = Event::warning(
                        drain::REASON,
                        "Drain",
                        format!("the virtual node {node} was removed: the pod failed"),
                    );
                    ctx.events.publish(pod, &ev).await;
                }
                let now = meta::only_uid(pod.metadata.uid.clone(), Some(0));
                meta::delete(&pods, &name, &now).await?;
            }
        }
    }
    Err(Error::Draining(bound.len()))
}

async fn reconcile(vn: Arc<VirtualNode>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let api: Api<VirtualNode> =
        Api::namespaced(ctx.client.clone(), &vn.namespace().unwrap_or_default());
    finalized(
        &api,
        FINALIZER,
        vn,
        |v| reconcile_apply(v, &ctx),
        |v| reconcile_cleanup(v, &ctx),
    )
    .await
}

/// Retries after 1 s, then at most every 5 s.
const BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(5));

/// Reconciles the VirtualNodes of the fabric's namespace (where the sharing controllers
/// create them, and where the virtual kubelets run) until interrupted; a VirtualNode anywhere
/// else gets no virtual kubelet. A VirtualNode's pods are abandoned after `drain_grace` if
/// they could not be deleted through the provider ([`drain`]).
pub async fn run(client: Client, settings: Settings, drain_grace: Duration) {
    let vns: Api<VirtualNode> = Api::namespaced(client.clone(), &settings.fabric_namespace);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &settings.fabric_namespace);
    // The offloaded namespaces: every virtual kubelet is granted reads there.
    let (offloadings, writer) = reflector::store::<NamespaceOffloading>();
    let offloading_events = reflector::reflector(
        writer,
        watcher(
            Api::<NamespaceOffloading>::all(client.clone()),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .touched_objects()
    .filter_map(|r| async move { r.ok().map(|_| ()) });
    let ctx = Arc::new(Ctx {
        events: Events::new(client.clone(), field_manager::VIRTUAL_NODES, None),
        client: client.clone(),
        settings,
        drain_grace,
        applied: Mutex::default(),
        offloadings,
        granted: Mutex::default(),
    });
    let nodes: Api<Node> = Api::all(client);
    let controller = Controller::new(vns, watcher::Config::default());
    let store = controller.store();
    let virtual_nodes = format!("{}={}", label::NODE_TYPE, label::VIRTUAL_NODE_TYPE);
    let controller = controller
        .owns(
            deployments,
            watcher::Config::default().labels(&format!("{APP_LABEL}={APP}")),
        )
        // A Node is its VirtualNode's by name (the virtual kubelet does not know the
        // VirtualNode's namespace in its labels, nor need it).
        .watches(
            nodes,
            watcher::Config::default().labels(&virtual_nodes),
            move |node: Node| {
                let name = node.name_any();
                store
                    .state()
                    .into_iter()
                    .filter(|vn| vn.spec.node_name == name)
                    .map(|vn| ObjectRef::from_obj(vn.as_ref()))
                    .collect::<Vec<_>>()
            },
        )
        // A namespace offloaded or unoffloaded: every virtual kubelet's grants change.
        .reconcile_all_on(offloading_events);
    Runner::new("virtual nodes", BACKOFF)
        // A drain is a wait, not a failure: looked at every second.
        .waits(|e| matches!(e, Error::Draining(_)).then_some(Duration::from_secs(1)))
        .run(controller, reconcile, ctx)
        .await;
}
