//! The real-node provisioner's edge ([`super::Provisioner::decide`] carried out): a controller
//! on every claim, with watch caches of the Nodes (virtual or real) and of the real claims in
//! the storage namespace (a real claim's binding wakes its home claim). The real claim is
//! created once (a sync cut short finds it by name); the virtual volume is created once and
//! only ever deleted when it is ours (our provisioner's, bound to that very claim); deletes are
//! UID-preconditioned.
use std::{sync::Arc, time::Duration};

use fabric_kube::{
    controller::{Backoff, Runner},
    events::{Event, Events},
    meta,
};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams, PostParams},
    runtime::{
        Controller,
        controller::Action,
        reflector::{ObjectRef, Store},
        watcher,
    },
};
use serde_json::json;
use tracing::info;

use super::{FINALIZER, HOME_NAME, HOME_NAMESPACE, Provisioner, Step, node_kind, real_name};

const BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
/// How soon a claim whose selected node is not known yet is looked at again.
const UNKNOWN_NODE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error("PersistentVolume {0} is there and is not this claim's virtual volume")]
    NotOurs(String),
}

struct Ctx {
    client: Client,
    provisioner: Provisioner,
    nodes: Store<Node>,
    reals: Store<PersistentVolumeClaim>,
    events: Events,
}

async fn reconcile(home: Arc<PersistentVolumeClaim>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let p = &ctx.provisioner;
    if home
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        != Some(p.class.as_str())
    {
        return Ok(Action::await_change());
    }
    let uid = home.metadata.uid.clone().unwrap_or_default();
    let node = home
        .annotations()
        .get(fabric_api::names::storage::SELECTED_NODE)
        .map(|n| node_kind(ctx.nodes.get(&ObjectRef::new(n)).as_deref()));
    // Its own by name (what the provisioner makes), else by label: one adopted or handed
    // over by a move.
    let real = ctx
        .reals
        .get(&ObjectRef::new(&real_name(&uid)).within(&p.namespace))
        .filter(|r| super::made_for(r, &home))
        .or_else(|| {
            let all = ctx.reals.state();
            super::real_of(&home, all.iter().map(|r| &**r)).map(|r| Arc::new(r.clone()))
        });
    let volumes: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let real_volume = match real
        .as_ref()
        .and_then(|r| r.spec.as_ref()?.volume_name.clone())
    {
        Some(v) if !v.is_empty() => volumes.get_opt(&v).await?,
        _ => None,
    };
    let step = p.decide(
        &home,
        node.unwrap_or(super::Node::Unknown),
        real.as_deref(),
        real_volume.as_ref(),
    );
    let claims: Api<PersistentVolumeClaim> =
        Api::namespaced(ctx.client.clone(), &home.namespace().unwrap_or_default());
    let reals: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &p.namespace);
    let key = format!(
        "{}/{}",
        home.namespace().unwrap_or_default(),
        home.name_any()
    );
    match step {
        Step::Nothing => {
            if node == Some(super::Node::Unknown) && home.metadata.deletion_timestamp.is_none() {
                return Ok(Action::requeue(UNKNOWN_NODE));
            }
        }
        Step::WaitForReal => {}
        Step::CreateReal(real) => {
            meta::add_finalizer(&claims, &home, FINALIZER).await?;
            match reals.create(&PostParams::default(), &real).await {
                Ok(_) => {}
                // Made by a sync cut short; the cache has not shown it yet.
                Err(e) if meta::is_conflict(&e) => {}
                Err(e) => return Err(e.into()),
            }
            info!(claim = %key, real = %real.name_any(), "real claim made");
            ctx.events
                .publish(
                    &*home,
                    &Event::normal(
                        "Provisioning",
                        "Provision",
                        format!(
                            "its first consumer runs on a real node: claim {}/{} made of class {}",
                            p.namespace,
                            real.name_any(),
                            p.real_class.as_deref().unwrap_or("(the cluster's default)")
                        ),
                    ),
                )
                .await;
        }
        Step::Adopt(name) => {
            meta::add_finalizer(&claims, &home, FINALIZER).await?;
            let patch = json!({"metadata": {"labels": {super::HOME_UID: uid}}});
            reals
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            info!(claim = %key, real = %name, "real claim handed over by a move adopted");
            ctx.events
                .publish(
                    &*home,
                    &Event::normal(
                        "Provisioning",
                        "Provision",
                        format!(
                            "its data is claim {}/{name}, handed over by a move of a claim of \
                             this name",
                            p.namespace
                        ),
                    ),
                )
                .await;
        }
        Step::Bind(volume) => {
            let name = volume.name_any();
            match volumes.create(&PostParams::default(), &volume).await {
                Ok(_) => info!(claim = %key, volume = name, "virtual volume made"),
                Err(e) if meta::is_conflict(&e) => {
                    let have = volumes.get(&name).await?;
                    if !fabric_api::offloading::volumes::fabric_volume_of(&have, &home) {
                        return Err(Error::NotOurs(name));
                    }
                }
                Err(e) => return Err(e.into()),
            }
            let patch = json!({"spec": {"volumeName": name}});
            claims
                .patch(
                    &home.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await?;
            ctx.events
                .publish(
                    &*home,
                    &Event::normal(
                        "ProvisioningSucceeded",
                        "Provision",
                        format!(
                            "bound to {name}, over the real volume of {}/{}",
                            p.namespace,
                            real.as_ref()
                                .map_or_else(|| real_name(&uid), |r| r.name_any())
                        ),
                    ),
                )
                .await;
        }
        Step::Release { real } => {
            let name = fabric_api::names::storage::volume_name(&uid);
            if let Some(pv) = volumes.get_opt(&name).await?
                && fabric_api::offloading::volumes::fabric_volume_of(&pv, &home)
            {
                meta::delete(
                    &volumes,
                    &name,
                    &meta::only_uid(pv.metadata.uid.clone(), None),
                )
                .await?;
                info!(claim = %key, volume = name, "virtual volume deleted");
            }
            if let Some((real_name, real_uid)) = real {
                meta::delete(&reals, &real_name, &meta::only_uid(Some(real_uid), None)).await?;
                info!(claim = %key, real = real_name, "real claim deleted");
            }
            meta::remove_finalizer(&claims, &home, FINALIZER).await?;
        }
    }
    Ok(Action::await_change())
}

/// Runs the provisioner until its watches end (or a signal stops it).
pub async fn run(client: Client, provisioner: Provisioner) -> Result<(), Error> {
    let (nodes, node_task) = fabric_kube::cache::lean(
        Api::<Node>::all(client.clone()),
        watcher::Config::default(),
        "Node",
    );
    let reals_api: Api<PersistentVolumeClaim> =
        Api::namespaced(client.clone(), &provisioner.namespace);
    let (reals, real_changes) = fabric_kube::cache::touched(
        reals_api,
        watcher::Config::default().labels(super::HOME_UID),
    );
    let controller = Controller::new(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        watcher::Config::default(),
    )
    .watches_stream(real_changes, |real: PersistentVolumeClaim| {
        let labels = real.labels();
        match (labels.get(HOME_NAMESPACE), labels.get(HOME_NAME)) {
            (Some(ns), Some(name)) => Some(ObjectRef::new(name).within(ns)),
            _ => None,
        }
    });
    let ctx = Arc::new(Ctx {
        events: Events::new(client.clone(), "fabric-storage", None),
        client,
        provisioner,
        nodes,
        reals,
    });
    Runner::new("storage", BACKOFF)
        .run(controller, reconcile, ctx)
        .await;
    node_task.abort();
    Ok(())
}
