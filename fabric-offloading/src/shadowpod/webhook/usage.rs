//! The reconciler of tenants' usage (I/O edge of [`quota::recount`]): whenever a Tenant or
//! one of its consumer's ShadowPods changes, and when a pending charge is due to lapse, it
//! recomputes the Tenant's `status.used` from a fresh listing of the ShadowPods in the
//! consumer's namespaces and writes it with the Tenant's resourceVersion as precondition, so
//! a charge admitted meanwhile is never overwritten (the write conflicts, and it counts again).
//! Finished and deleted ShadowPods release their share this way, and charges whose creation
//! failed stop counting. Claims' charges (`status.claims`) are settled the same way
//! ([`claims::settle`]): dropped once a listing of the tenant's claims shows theirs, so that
//! a claim deleted soon after its creation gives its share back at once; while any is
//! pending the Tenant is looked at again every [`CLAIM_POLL`] (claims are not watched).
use std::{sync::Arc, time::Duration};

use fabric_api::{
    authentication::v1alpha1::Tenant,
    names::{self, label},
    offloading::v1alpha1::ShadowPod,
    quantity::BadQuantity,
    requests::Defaults,
};
use k8s_openapi::{
    api::core::v1::{Namespace, PersistentVolumeClaim},
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, PostParams},
    runtime::{Controller, controller::Action, reflector::ObjectRef, watcher},
};
use tracing::info;

use fabric_kube::{
    controller::{Backoff, Runner},
    meta::is_conflict,
};

use super::USAGE_MANAGER;
use crate::shadowpod::{claims, quota};

/// How often a Tenant is recounted when nothing happens (drift: a ShadowPod changed while
/// the watch was down).
const RESYNC: Duration = Duration::from_secs(300);
/// How soon a Tenant with claims' charges pending is looked at again: until the listing
/// shows their claims (created moments after the charge), then they settle.
const CLAIM_POLL: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Quantity(#[from] BadQuantity),
}

struct Ctx {
    client: Client,
    ttl: Duration,
    /// The provider's default requests, charged as admission charges them.
    defaults: Defaults,
}

/// The consumer whose usage `tenant` keeps: only the Tenant the webhook charges (named after
/// the consumer, in its tenant namespace).
pub(crate) fn consumer_of(tenant: &Tenant) -> Option<&str> {
    let consumer = tenant.spec.cluster_id.as_str();
    (tenant.name_any() == consumer
        && tenant.namespace().as_deref() == Some(&names::namespace::tenant(consumer)))
    .then_some(consumer)
}

/// A fresh listing of the ShadowPods in `consumer`'s namespaces (those carrying its label).
pub(crate) async fn shadow_pods(client: &Client, consumer: &str) -> kube::Result<Vec<ShadowPod>> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let theirs = ListParams::default().labels(&format!("{}={consumer}", label::REMOTE_CLUSTER));
    let mut listed: Vec<ShadowPod> = Vec::new();
    for ns in namespaces.list(&theirs).await? {
        let shadows: Api<ShadowPod> = Api::namespaced(client.clone(), &ns.name_any());
        listed.extend(shadows.list(&ListParams::default()).await?);
    }
    Ok(listed)
}

/// A fresh listing of the claims in `consumer`'s namespaces, as the charge counts them (those
/// it cannot read count as nothing: the webhook admitted none such).
async fn claims_of(client: &Client, consumer: &str) -> kube::Result<Vec<claims::Claim>> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let theirs = ListParams::default().labels(&format!("{}={consumer}", label::REMOTE_CLUSTER));
    let mut out = Vec::new();
    for ns in namespaces.list(&theirs).await? {
        let name = ns.name_any();
        let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &name);
        for pvc in api.list(&ListParams::default()).await? {
            out.extend(claims::Claim::of(&pvc, &name).ok());
        }
    }
    Ok(out)
}

async fn reconcile(tenant: Arc<Tenant>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let Some(consumer) = consumer_of(&tenant) else {
        return Ok(Action::await_change());
    };
    let tenants: Api<Tenant> =
        Api::namespaced(ctx.client.clone(), &tenant.namespace().unwrap_or_default());
    // Read in this order: every charge in the Tenant as read was admitted before the listing,
    // so the listing shows its ShadowPod if it was stored.
    let Some(mut fresh) = tenants.get_opt(&tenant.name_any()).await? else {
        return Ok(Action::await_change());
    };
    let listed = shadow_pods(&ctx.client, consumer).await?;
    let status = fresh.status.clone().unwrap_or_default();
    let now = Timestamp::now();
    let mut recounted = quota::recount(&status, consumer, &listed, now, ctx.ttl, &ctx.defaults)?;
    // Listed after the Tenant was read, as the ShadowPods: a charge read was admitted before.
    if !status.claims.is_empty() {
        let stored = claims_of(&ctx.client, consumer).await?;
        recounted.claims = claims::settle(&status.claims, &stored, now, ctx.ttl);
    }
    if recounted != status {
        fresh.status = Some(recounted.clone());
        fresh.metadata.managed_fields = None;
        let pp = PostParams {
            field_manager: Some(USAGE_MANAGER.to_owned()),
            ..Default::default()
        };
        tenants
            .replace_status(&fresh.name_any(), &pp, &fresh)
            .await?;
        info!(consumer, used = ?recounted.used, pending = recounted.pending.len(), "recounted the usage");
    }
    let resync = if recounted.claims.is_empty() {
        RESYNC
    } else {
        CLAIM_POLL
    };
    Ok(match quota::next_expiry(&recounted, ctx.ttl) {
        Some(at) => {
            let wait = at.duration_since(now).unsigned_abs() + Duration::from_millis(100);
            Action::requeue(wait.min(resync))
        }
        None => Action::requeue(resync),
    })
}

/// A controller of every Tenant, each also reconciled when a ShadowPod naming its consumer
/// changes.
pub(crate) fn tenants_and_their_shadow_pods(client: &Client) -> Controller<Tenant> {
    let tenants: Api<Tenant> = Api::all(client.clone());
    let shadows: Api<ShadowPod> = Api::all(client.clone());
    Controller::new(tenants, watcher::Config::default()).watches(
        shadows,
        watcher::Config::default(),
        |s: ShadowPod| {
            let consumer = s.spec.cluster_id.clone();
            Some(ObjectRef::<Tenant>::new(&consumer).within(&names::namespace::tenant(&consumer)))
        },
    )
}

/// Runs the reconciler until the task is dropped.
pub async fn run(client: Client, ttl: Duration, defaults: Defaults) {
    let controller = tenants_and_their_shadow_pods(&client);
    Runner::new(
        "usage",
        Backoff::new(Duration::from_secs(1), Duration::from_secs(5)),
    )
    // A charge came in between: count again at once.
    .waits(|e| match e {
        Error::Kube(k) if is_conflict(k) => Some(Duration::from_millis(50)),
        _ => None,
    })
    // The webhook's process ends with SIGTERM's default: no handler here.
    .until_dropped()
    .run(
        controller,
        reconcile,
        Arc::new(Ctx {
            client,
            ttl,
            defaults,
        }),
    )
    .await;
}
