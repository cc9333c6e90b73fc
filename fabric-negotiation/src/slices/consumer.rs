//! The consumer's slice replicator: pushes each local ResourceSlice's spec to the provider's
//! tenant namespace (with the identity), brings the provider's status back, keeps the
//! provider's VirtualNode at what is granted and the ForeignCluster's ResourcesGranted
//! condition. Deleting a slice deletes its replica (after [`crate::network::REMOTE_GRACE`]
//! without a reachable provider, or at once when forced, the local slice goes anyway).
use std::sync::Arc;

use fabric_api::{
    authentication::v1alpha1::{Identity, ResourceSlice},
    core::v1alpha1::condition::{RESOURCES, RETAINED_VOLUMES, TETHERED},
    names,
    offloading::v1alpha1::{NamespaceMap, VirtualNode},
};
use fabric_kube::{
    controller::{Runner, finalized},
    events::Event as KubeEvent,
    meta::{GoneOk, age},
};
use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, ResourceExt,
    api::DeleteParams,
    runtime::{
        Controller,
        controller::Action,
        reflector::{ObjectRef, Store},
        watcher,
    },
};

use super::{FINALIZER, replica, resources_granted, virtual_node};
use crate::kit::{Ctx, Error, FIELD_MANAGER, FcConditions, answer_poll, remote, remote_client};
use crate::namespaces::retention;

struct SliceCtx {
    ctx: Arc<Ctx>,
    /// The local slices, as the controller's watch sees them.
    slices: Store<ResourceSlice>,
}

/// The provider's VirtualNode and ForeignCluster condition from the local slices, with
/// `fresh` (just read back from the provider) in place of its cached copy, and without
/// `gone` (being deleted). Returns the ForeignCluster as read for its conditions.
async fn sync_provider(
    sc: &SliceCtx,
    provider: &str,
    fresh: Option<&ResourceSlice>,
    gone: Option<&str>,
) -> Result<FcConditions, Error> {
    let ctx = &sc.ctx;
    let skip = |s: &ResourceSlice| {
        let n = s.name_any();
        gone == Some(n.as_str()) || fresh.is_some_and(|f| f.name_any() == n)
    };
    let cached = sc.slices.state();
    let mine: Vec<&ResourceSlice> = cached
        .iter()
        .map(|s| s.as_ref())
        .filter(|s| s.spec.provider_cluster_id == provider && !skip(s))
        .chain(fresh)
        .collect();
    let vns: Api<VirtualNode> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    match virtual_node(provider, &ctx.namespace, mine.iter().copied()) {
        Some(vn) => {
            FIELD_MANAGER.apply(&vns, &vn).await?;
        }
        None => {
            vns.delete(provider, &DeleteParams::default())
                .await
                .gone_ok()?;
        }
    }
    let granted = resources_granted(mine.iter().map(|s| s.status.as_ref()));
    let fc = FcConditions::read(&ctx.client, provider).await?;
    fc.set(RESOURCES, &granted).await?;
    let tethered = super::mode(mine.iter().map(|s| s.status.as_ref()));
    fc.set(TETHERED, &tethered).await?;
    Ok(fc)
}

async fn tenant_api(ctx: &Ctx, provider: &str) -> Result<Api<ResourceSlice>, Error> {
    let ids: Api<Identity> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let identity = ids
        .get_opt(provider)
        .await?
        .ok_or_else(|| Error::NoIdentity {
            provider: provider.to_owned(),
        })?;
    Ok(Api::namespaced(
        remote_client(ctx, provider).await?,
        &identity.spec.tenant_namespace,
    ))
}

/// The claims `provider` keeps of this cluster's after their twins were given up (its
/// NamespaceMap's `status.retained`, read with the identity as the slices are, in tenant
/// namespace `ns`, where the map is named after this cluster) on the ForeignCluster's
/// `RetainedVolumes` condition. Read with the slices: they are polled as long as the peering
/// lasts, when no namespace is offloaded any more too.
async fn report_retained(
    fc: &FcConditions,
    provider: &str,
    slices: &Api<ResourceSlice>,
    ns: &str,
) -> Result<(), Error> {
    let Some(me) = ns.strip_prefix(&names::namespace::tenant("")) else {
        return Ok(());
    };
    let maps: Api<NamespaceMap> = Api::namespaced(slices.clone().into_client(), ns);
    let retained = remote(provider, maps.get_opt(me))
        .await?
        .and_then(|m| m.status)
        .map(|s| s.retained)
        .unwrap_or_default();
    fc.set(RETAINED_VOLUMES, &retention::verdict(&retained))
        .await
}

async fn apply(slice: Arc<ResourceSlice>, sc: &SliceCtx) -> Result<Action, Error> {
    let ctx = &sc.ctx;
    let provider = slice.spec.provider_cluster_id.clone();
    let api = tenant_api(ctx, &provider).await?;
    let ns = api.namespace().unwrap_or_default().to_owned();
    let stored = remote(&provider, FIELD_MANAGER.apply(&api, &replica(&slice, &ns))).await?;
    let next = match &stored.status {
        Some(_) => ctx.remote_poll,
        None => answer_poll(ctx.remote_poll, age(&stored.metadata, Timestamp::now())),
    };
    let mut fresh = (*slice).clone();
    if let Some(status) = stored.status.filter(|s| slice.status.as_ref() != Some(s)) {
        let local: Api<ResourceSlice> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
        FIELD_MANAGER
            .apply_status(&local, &slice.name_any(), &status)
            .await?;
        fresh.status = Some(status);
    }
    let fc = sync_provider(sc, &provider, Some(&fresh), None).await?;
    report_retained(&fc, &provider, &api, &ns).await?;
    // The provider's answer follows its capacity: look again now and then.
    Ok(Action::requeue(next))
}

async fn cleanup(slice: Arc<ResourceSlice>, sc: &SliceCtx) -> Result<Action, Error> {
    let ctx = &sc.ctx;
    let provider = slice.spec.provider_cluster_id.clone();
    let name = slice.name_any();
    let delete = async {
        let api = tenant_api(ctx, &provider).await?;
        let delete = async { api.delete(&name, &DeleteParams::default()).await.gone_ok() };
        remote(&provider, delete).await.map(|_| ())
    };
    if let Err(e) = delete.await {
        if !crate::unpeer::abandon_remote(&slice.metadata, Timestamp::now()) {
            return Err(e);
        }
        let note = format!("the provider could not be reached ({e}); its replica is left there");
        ctx.events
            .publish(
                slice.as_ref(),
                &KubeEvent::warning("DeletedWithoutProvider", "Delete", note),
            )
            .await;
    }
    sync_provider(sc, &provider, None, Some(&name)).await?;
    Ok(Action::await_change())
}

async fn reconcile(slice: Arc<ResourceSlice>, sc: Arc<SliceCtx>) -> Result<Action, Error> {
    let api: Api<ResourceSlice> = Api::namespaced(sc.ctx.client.clone(), &sc.ctx.namespace);
    finalized(
        &api,
        FINALIZER,
        slice,
        |s| apply(s, &sc),
        |s| cleanup(s, &sc),
    )
    .await
}

/// Runs until the watch ends.
pub async fn run(ctx: Arc<Ctx>) {
    let slices: Api<ResourceSlice> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let ids: Api<Identity> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let controller = Controller::new(slices, watcher::Config::default());
    let store = controller.store();
    let sc = Arc::new(SliceCtx {
        ctx: ctx.clone(),
        slices: store.clone(),
    });
    // A new or renewed identity: the slices for that provider try again at once.
    let controller = controller.watches(ids, watcher::Config::default(), move |i| {
        let provider = i.name_any();
        store
            .state()
            .into_iter()
            .filter(|s| s.spec.provider_cluster_id == provider)
            .map(|s| ObjectRef::from_obj(s.as_ref()))
            .collect::<Vec<_>>()
    });
    Runner::new("resource negotiation (consumer)", ctx.backoff())
        .run(controller, reconcile, sc)
        .await;
}
