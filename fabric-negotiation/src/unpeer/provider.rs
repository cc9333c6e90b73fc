//! The provider's tenant controller: a finalizer on each Tenant; once it is deleted (by the
//! consumer leaving, or by the provider's admin), removes the tenant area: the RoleBinding
//! and Role (the consumer's access ends), the replicas in the tenant namespace (each through
//! its own controller's finalizer, for at most [`CONTENT_GRACE`]), the twin namespaces of its
//! NamespaceMap, the consumer's
//! ForeignCluster (or its Consumer role, when it is also a provider here) and CSRs, and the
//! namespace. The provider's admin removes a tenant the same way: `kubectl delete tenant`.
use std::{sync::Arc, time::Duration};

use fabric_api::{
    authentication::v1alpha1::{ResourceSlice, Tenant},
    core::v1alpha1::{DiscoveryMethod, ForeignCluster, ForeignClusterSpec, PeerRole},
    names,
    networking::v1alpha1::PeeringNetwork,
    offloading::v1alpha1::{NamespaceMap, ShadowPod},
};
use fabric_kube::{
    FieldManager,
    controller::Runner,
    meta::{add_finalizer, delete_gone_ok, deleting_for, remove_finalizer},
};
use k8s_openapi::{
    api::{
        certificates::v1::CertificateSigningRequest,
        core::v1::Namespace,
        rbac::v1::{Role, RoleBinding},
    },
    jiff::Timestamp,
};
use kube::{
    Api, Resource, ResourceExt,
    api::ListParams,
    runtime::{Controller, controller::Action, reflector::ObjectRef, watcher},
};
use serde::de::DeserializeOwned;
use tracing::{info, warn};

use super::CONTENT_GRACE;
use crate::kit::{Ctx, Error, Shared};

const FINALIZER: &str = names::finalizer::TENANT;
const WAIT: Duration = Duration::from_millis(500);

/// Deletes every `K` in `ns`; how many are left (deleting).
async fn delete_all<K>(ctx: &Ctx, ns: &str) -> Result<usize, Error>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), ns);
    let items = api.list(&ListParams::default()).await?.items;
    for o in &items {
        if o.meta().deletion_timestamp.is_none() {
            delete_gone_ok(&api, &o.name_any()).await?;
        }
    }
    Ok(items.len())
}

/// The consumer's ForeignCluster without the Consumer role: gone when nothing else is left
/// of it (peered by hand, not a provider here), else kept with the role it has left.
async fn forget(ctx: &Ctx, consumer: &str) -> Result<(), Error> {
    let fcs: Api<ForeignCluster> = Api::all(ctx.client.clone());
    let Some(fc) = fcs.get_opt(consumer).await? else {
        return Ok(());
    };
    let role = fc.spec.role.without(PeerRole::Consumer);
    if role == PeerRole::Unknown && fc.spec.discovered_by == DiscoveryMethod::Manual {
        return Ok(delete_gone_ok(&fcs, consumer).await?);
    }
    if role != fc.spec.role && fc.metadata.deletion_timestamp.is_none() {
        let spec = ForeignClusterSpec {
            role,
            ..fc.spec.clone()
        };
        // The authentication service's manager: it is the one that added the role.
        FieldManager(names::field_manager::AUTH)
            .apply(&fcs, &ForeignCluster::new(consumer, spec))
            .await?;
    }
    Ok(())
}

/// One step of the removal of `tenant`'s area: true once only the namespace is left.
async fn cleanup(tenant: &Tenant, ctx: &Ctx) -> Result<bool, Error> {
    let consumer = tenant.spec.cluster_id.clone();
    let ns = tenant.namespace().unwrap_or_default();
    // A Tenant outside its consumer's namespace stands for nothing of it.
    if names::namespace::tenant(&consumer) != ns {
        return Ok(true);
    }
    delete_gone_ok(
        &Api::<RoleBinding>::namespaced(ctx.client.clone(), &ns),
        fabric_auth::tenant::ROLE,
    )
    .await?;
    delete_gone_ok(
        &Api::<Role>::namespaced(ctx.client.clone(), &ns),
        fabric_auth::tenant::ROLE,
    )
    .await?;
    let left = delete_all::<PeeringNetwork>(ctx, &ns).await?
        + delete_all::<ResourceSlice>(ctx, &ns).await?
        + delete_all::<ShadowPod>(ctx, &ns).await?
        + delete_all::<NamespaceMap>(ctx, &ns).await?;
    if left > 0 {
        let waited = deleting_for(&tenant.metadata, Timestamp::now());
        if waited < CONTENT_GRACE {
            info!(
                consumer,
                left, "removing the tenant: waiting for its replicas to go"
            );
            return Ok(false);
        }
        warn!(
            consumer,
            left,
            "the tenant's replicas did not go within {CONTENT_GRACE:?}: deleting the namespace with them"
        );
    }
    // The maps' twins, also when a map went without its finalizer (an API server that
    // deletes a namespace's content at once) or did not finish within the grace: no twin
    // outlives its tenant.
    // Only the map named after the consumer is ever served.
    let key = crate::namespaces::twins::map_key(&ns, &consumer);
    let twins = crate::namespaces::provider::remove_twins(&ctx.client, &key).await?;
    if twins > 0 {
        info!(
            consumer,
            twins, "removing the tenant: waiting for its twins to go"
        );
        return Ok(false);
    }
    forget(ctx, &consumer).await?;
    let csrs: Api<CertificateSigningRequest> = Api::all(ctx.client.clone());
    let selector = format!("{}={consumer}", names::label::REMOTE_CLUSTER);
    for csr in csrs
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
    {
        delete_gone_ok(&csrs, &csr.name_any()).await?;
    }
    Ok(true)
}

/// Deletes the tenant namespace, once the Tenant is gone: with the Tenant's finalizer still on,
/// an API server that deletes a namespace's contents at once (no Terminating phase) would
/// leave the Tenant behind. Nothing triggers a later attempt, so a few are made here.
async fn delete_namespace(ctx: &Ctx, consumer: &str, ns: &str) -> Result<(), Error> {
    let api = Api::<Namespace>::all(ctx.client.clone());
    let mut attempt = 0;
    loop {
        match delete_gone_ok(&api, ns).await {
            Ok(()) => {
                info!(consumer, namespace = ns, "tenant removed");
                return Ok(());
            }
            Err(e) if attempt < 4 => {
                warn!(consumer, namespace = ns, error = %e, "deleting the tenant namespace; retrying");
                attempt += 1;
                tokio::time::sleep(WAIT * (1 << attempt)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

async fn reconcile(tenant: Arc<Tenant>, ctx: Shared) -> Result<Action, Error> {
    let ns = tenant.namespace().unwrap_or_default();
    let api: Api<Tenant> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(tenant) = api.get_opt(&tenant.name_any()).await? else {
        return Ok(Action::await_change());
    };
    let ours = tenant.finalizers().iter().any(|f| f == FINALIZER);
    if tenant.metadata.deletion_timestamp.is_none() {
        if !ours {
            add_finalizer(&api, &tenant, FINALIZER).await?;
        }
        return Ok(Action::await_change());
    }
    if !ours {
        return Ok(Action::await_change());
    }
    if cleanup(&tenant, &ctx).await? {
        remove_finalizer(&api, &tenant, FINALIZER).await?;
        let consumer = &tenant.spec.cluster_id;
        if names::namespace::tenant(consumer) == ns {
            delete_namespace(&ctx, consumer, &ns).await?;
        }
        return Ok(Action::await_change());
    }
    Ok(Action::requeue(WAIT))
}

/// Runs until the watch ends.
pub async fn run(ctx: Shared) {
    let tenants: Api<Tenant> = Api::all(ctx.client.clone());
    let pns: Api<PeeringNetwork> = Api::all(ctx.client.clone());
    // A consumer's Tenant is named after it in its tenant namespace; its replicas going away
    // move a running removal on.
    let of = |id: &str| Some(ObjectRef::new(id).within(&names::namespace::tenant(id)));
    let controller = Controller::new(tenants, watcher::Config::default()).watches(
        pns,
        watcher::Config::default(),
        move |p| of(&p.spec.consumer.cluster_id),
    );
    Runner::new("tenant removal (provider)", ctx.backoff())
        .run(controller, reconcile, ctx)
        .await;
}
