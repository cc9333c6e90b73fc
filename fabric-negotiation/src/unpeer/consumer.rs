//! The consumer's unpeer controller: a finalizer on each provider's ForeignCluster; once it
//! is deleted, removes the slices and the VirtualNode, waits for the network controller's
//! finalizer, then deletes its Tenant on the provider (with the identity: the provider's
//! controllers remove the tenant area) and the Identity with its Secret.
use std::{sync::Arc, time::Duration};

use fabric_api::{
    authentication::v1alpha1::{Identity, ResourceSlice, Tenant},
    core::v1alpha1::ForeignCluster,
    names,
    offloading::v1alpha1::VirtualNode,
};
use fabric_kube::{
    controller::Runner,
    events::Event as KubeEvent,
    meta::{GoneOk, add_finalizer, delete_gone_ok, remove_finalizer},
};
use fabric_peering::{Cluster, Side};
use k8s_openapi::{api::core::v1::Secret, jiff::Timestamp};
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams},
    runtime::{Controller, controller::Action, reflector::ObjectRef, watcher},
};
use tracing::{info, warn};

use super::{ConsumerSide, abandon_remote, pending};
use crate::kit::{Ctx, Error, Shared, remote, remote_client};

const FINALIZER: &str = names::finalizer::PEERING;

/// How often a running unpeer looks again at what it waits for.
const WAIT: Duration = Duration::from_millis(500);

/// Marks `obj` (a slice, so that its replicator does not wait for the provider; the
/// VirtualNode, so that its drain does not wait for the pods' deletion through the provider)
/// as forced too.
async fn force<K>(api: &Api<K>, obj: &K) -> Result<(), Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    if names::annotation::unpeer_forced(obj.meta()) {
        return Ok(());
    }
    let patch = serde_json::json!({"metadata": {"annotations": {
        names::annotation::FORCE_UNPEER: "true"
    }}});
    api.patch(
        &obj.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .gone_ok()?;
    Ok(())
}

/// Deletes the consumer's Tenant on the provider: the provider's controllers take the tenant
/// area away.
async fn leave(ctx: &Ctx, fc: &ForeignCluster, provider: &str) -> Result<(), Error> {
    let ids: Api<Identity> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let Some(identity) = ids.get_opt(provider).await? else {
        // Without an identity the provider cannot be reached: nothing to tell it.
        warn!(
            provider,
            "unpeering without an Identity: the provider is not told"
        );
        return Ok(());
    };
    let me = Cluster::read(Side::Local, ctx.client.clone(), &ctx.namespace).await?;
    let tell = async {
        let tenants: Api<Tenant> = Api::namespaced(
            remote_client(ctx, provider).await?,
            &identity.spec.tenant_namespace,
        );
        let delete = async { tenants.delete(me.id(), &Default::default()).await.gone_ok() };
        remote(provider, delete).await
    };
    match tell.await {
        Ok(_) => Ok(()),
        Err(e) if abandon_remote(&fc.metadata, Timestamp::now()) => {
            warn!(provider, error = %e, "unpeering without the provider: its tenant area stays there");
            let note = format!(
                "the provider could not be told ({e}): its tenant area for this cluster stays there"
            );
            ctx.events
                .publish(
                    fc,
                    &KubeEvent::warning("UnpeeredWithoutProvider", "Unpeer", note),
                )
                .await;
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// One step of the unpeer of `fc`: true once everything of this side is gone.
async fn cleanup(fc: &ForeignCluster, ctx: &Ctx) -> Result<bool, Error> {
    let provider = fc.name_any();
    let slices_api: Api<ResourceSlice> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let slices: Vec<ResourceSlice> = slices_api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|s| s.spec.provider_cluster_id == provider)
        .collect();
    for s in &slices {
        if names::annotation::unpeer_forced(&fc.metadata) {
            force(&slices_api, s).await?;
        }
        if s.metadata.deletion_timestamp.is_none() {
            delete_gone_ok(&slices_api, &s.name_any()).await?;
        }
    }
    let vns: Api<VirtualNode> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let vn = vns.get_opt(&provider).await?;
    if let Some(vn) = vn
        .as_ref()
        .filter(|_| names::annotation::unpeer_forced(&fc.metadata))
    {
        force(&vns, vn).await?;
    }
    // The slice replicator deletes it with the last slice; once none is left, nothing
    // re-creates it.
    if slices.is_empty()
        && vn
            .as_ref()
            .is_some_and(|v| v.metadata.deletion_timestamp.is_none())
    {
        delete_gone_ok(&vns, &provider).await?;
    }
    let side = ConsumerSide {
        slices: slices.iter().map(|s| s.name_any()).collect(),
        virtual_node: vn.is_some(),
        network: fc
            .finalizers()
            .iter()
            .any(|f| f == crate::network::FINALIZER),
    };
    let waiting = pending(&side);
    if !waiting.is_empty() {
        let what: Vec<String> = waiting.iter().map(ToString::to_string).collect();
        info!(provider, waiting = ?what, "unpeering");
        return Ok(false);
    }
    leave(ctx, fc, &provider).await?;
    let ids: Api<Identity> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    delete_gone_ok(&ids, &provider).await?;
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), names::namespace::IDENTITIES);
    delete_gone_ok(&secrets, &names::secret::identity(&provider)).await?;
    info!(
        provider,
        "unpeered: slices, virtual node, network and identity removed"
    );
    Ok(true)
}

async fn reconcile(fc: Arc<ForeignCluster>, ctx: Shared) -> Result<Action, Error> {
    let api: Api<ForeignCluster> = Api::all(ctx.client.clone());
    // The cache may lag behind a removal of the finalizer or a force: decide on a fresh copy.
    let Some(fc) = api.get_opt(&fc.name_any()).await? else {
        return Ok(Action::await_change());
    };
    let ours = fc.finalizers().iter().any(|f| f == FINALIZER);
    if fc.metadata.deletion_timestamp.is_none() {
        if fc.spec.role.provides() && !ours {
            add_finalizer(&api, &fc, FINALIZER).await?;
        }
        return Ok(Action::await_change());
    }
    if !ours {
        return Ok(Action::await_change());
    }
    if cleanup(&fc, &ctx).await? {
        remove_finalizer(&api, &fc, FINALIZER).await?;
        return Ok(Action::await_change());
    }
    Ok(Action::requeue(WAIT))
}

/// Runs until the watch ends.
pub async fn run(ctx: Shared) {
    let fcs: Api<ForeignCluster> = Api::all(ctx.client.clone());
    let slices: Api<ResourceSlice> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let vns: Api<VirtualNode> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    // Slices and VirtualNodes going away move a running unpeer on.
    let controller = Controller::new(fcs, watcher::Config::default())
        .watches(slices, watcher::Config::default(), |s| {
            Some(ObjectRef::new(&s.spec.provider_cluster_id))
        })
        .watches(vns, watcher::Config::default(), |v| {
            Some(ObjectRef::new(&v.name_any()))
        });
    Runner::new("unpeer (consumer)", ctx.backoff())
        .run(controller, reconcile, ctx)
        .await;
}
