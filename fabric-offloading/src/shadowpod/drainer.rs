//! The provider's drain of tenants (I/O edge of [`super::lifetime::drained`] and
//! [`super::lifetime::drain`]), in the sharing controller: it records on each Tenant since
//! when it is drained (its Drained condition), and once the provider admin's grace has passed
//! it deletes the tenant's ShadowPods itself (their pods go through the ShadowPod
//! controller's finalizer), says so in an Event and the condition, and keeps deleting any
//! that appear while it stays drained. Nothing here waits on the consumer: a consumer that
//! keeps its ShadowPods is drained all the same. A tenant set back to Active or Cordoned
//! within the grace loses nothing.
//!
//! The same for a provider leaving tethered mode (docs/modes.md): it records when (the
//! Tenant's Tethered condition, `Leaving`), and once the grace has passed it deletes the
//! tenant's ShadowPods beyond its grant (which the offer policy shrank back to the share),
//! newest first ([`lifetime::excess`]), says so in an Event, and marks it done.
use std::{sync::Arc, time::Duration};

use fabric_api::{
    authentication::v1alpha1::{ResourceSlice, Tenant, TenantState},
    names::{self, field_manager},
    offloading::v1alpha1::ShadowPod,
    quantity::{Amounts, milli},
    requests::Defaults,
};
use fabric_kube::{
    controller::{Backoff, Runner},
    events::{Event, Events},
    meta::{Deleted, delete, only_uid},
    status::FieldManager,
};
use k8s_openapi::jiff::Timestamp;
use kube::{Api, Client, ResourceExt, api::ListParams, runtime::controller::Action};
use tracing::info;

use super::{
    decide::terminal,
    lifetime::{self, Drain},
    quota,
    webhook::usage,
};

const STATUS: FieldManager = FieldManager(field_manager::TENANT_DRAIN);

/// While a drained tenant stays drained past its grace: how often its namespaces are looked
/// at again (beside every ShadowPod event), for one the watch missed.
const RESYNC: Duration = Duration::from_secs(60);

struct Ctx {
    client: Client,
    events: Events,
    grace: Duration,
    /// The provider's default requests, charged as admission charges them.
    defaults: Defaults,
}

/// What `consumer`'s slices are granted now, summed; None while one of them still holds the
/// tethered grant (the offer policy, another controller, has not shrunk it yet).
async fn granted(client: &Client, consumer: &str) -> kube::Result<Option<Amounts>> {
    let slices: Api<ResourceSlice> =
        Api::namespaced(client.clone(), &names::namespace::tenant(consumer));
    let mut out = Amounts::new();
    for s in slices.list(&ListParams::default()).await? {
        let status = s.status.unwrap_or_default();
        if !status.mode.is_autonomous() {
            return Ok(None);
        }
        for (r, q) in status.granted {
            *out.entry(r).or_default() += milli(&q.0).unwrap_or(0).max(0);
        }
    }
    Ok(Some(out))
}

/// After leaving tethered mode, past the grace: the tenant's ShadowPods beyond its grant go,
/// newest first. Returns how many were deleted; None while its grant is still the tethered
/// one (to be looked at again: judged against that grant, nothing would be beyond it, and
/// the excess would stay for good).
async fn stop_excess(tenant: &Tenant, consumer: &str, ctx: &Ctx) -> kube::Result<Option<usize>> {
    let Some(grant) = granted(&ctx.client, consumer).await? else {
        return Ok(None);
    };
    let live: Vec<ShadowPod> = usage::shadow_pods(&ctx.client, consumer)
        .await?
        .into_iter()
        .filter(|s| {
            s.spec.cluster_id == consumer
                && s.metadata.deletion_timestamp.is_none()
                && !terminal(s.status.as_ref().and_then(|st| st.phase.as_deref()))
        })
        .collect();
    let weighed: Vec<(String, Option<Timestamp>, Amounts)> = live
        .iter()
        .map(|s| {
            (
                format!("{}/{}", s.namespace().unwrap_or_default(), s.name_any()),
                s.metadata.creation_timestamp.as_ref().map(|t| t.0),
                quota::charged(s, &ctx.defaults),
            )
        })
        .collect();
    let victims = lifetime::excess(&weighed, &grant);
    let mut deleted = 0;
    for s in live.iter().filter(|s| {
        victims.contains(&format!(
            "{}/{}",
            s.namespace().unwrap_or_default(),
            s.name_any()
        ))
    }) {
        let shadows: Api<ShadowPod> =
            Api::namespaced(ctx.client.clone(), &s.namespace().unwrap_or_default());
        if delete(
            &shadows,
            &s.name_any(),
            &only_uid(s.metadata.uid.clone(), None),
        )
        .await?
            == Deleted::Asked
        {
            deleted += 1;
        }
    }
    if deleted > 0 {
        info!(
            consumer,
            deleted,
            ?victims,
            "left tethered mode: deleted the ShadowPods beyond the grant"
        );
        let note = format!(
            "the provider left tethered mode {}s ago: it deleted {deleted} ShadowPods beyond the \
             grant, newest first ({})",
            ctx.grace.as_secs(),
            victims.join(", ")
        );
        ctx.events
            .publish(tenant, &Event::normal("PodsBeyondGrant", "Drain", note))
            .await;
    }
    Ok(Some(deleted))
}

async fn reconcile(tenant: Arc<Tenant>, ctx: Arc<Ctx>) -> Result<Action, kube::Error> {
    let Some(consumer) = usage::consumer_of(&tenant) else {
        return Ok(Action::await_change());
    };
    let state = tenant.spec.state;
    let prev = tenant.status.clone().unwrap_or_default().conditions;
    let generation = tenant.metadata.generation;
    let now = Timestamp::now();
    let tenants: Api<Tenant> =
        Api::namespaced(ctx.client.clone(), &tenant.namespace().unwrap_or_default());
    let write = |conditions: Vec<_>| {
        let tenants = tenants.clone();
        let name = tenant.name_any();
        async move {
            STATUS
                .apply_status(
                    &tenants,
                    &name,
                    serde_json::json!({ "conditions": conditions }),
                )
                .await
        }
    };
    // Recorded first, so that the grace is counted from a time the API server holds.
    let was_stopped = lifetime::stopped(&prev);
    let now_conditions = lifetime::drained(&prev, state, was_stopped, ctx.grace, generation, now);
    let now_conditions = lifetime::tethered(
        &now_conditions,
        tenant.spec.mode,
        ctx.grace,
        generation,
        now,
    );
    if now_conditions != prev {
        write(now_conditions.clone()).await?;
        if state == TenantState::Drained && !was_stopped {
            info!(consumer, grace = ?ctx.grace, "the tenant is drained; its pods are stopped after the grace");
        }
        // The condition's own event brings it back with the time as written.
        return Ok(Action::await_change());
    }
    match lifetime::drain(state, &prev, ctx.grace, now) {
        Drain::Keep => match lifetime::leaving(&prev, ctx.grace, now) {
            Drain::Keep => Ok(Action::await_change()),
            Drain::Wait(left) => Ok(Action::requeue(left + Duration::from_millis(100))),
            Drain::Stop => {
                // Read afresh: the cache may not show this controller's own `settled` yet,
                // and a second pass would then find nothing beyond the grant (the first one
                // deleted it) and say so over what the first one said.
                let fresh = tenants.get(&tenant.name_any()).await?;
                let now_conditions = fresh.status.unwrap_or_default().conditions;
                if lifetime::leaving(&now_conditions, ctx.grace, now) != Drain::Stop {
                    return Ok(Action::await_change());
                }
                match stop_excess(&tenant, consumer, &ctx).await? {
                    Some(deleted) => {
                        write(lifetime::settled(&now_conditions, deleted, generation, now)).await?;
                        Ok(Action::await_change())
                    }
                    None => Ok(Action::requeue(Duration::from_secs(1))),
                }
            }
        },
        Drain::Wait(left) => Ok(Action::requeue(left + Duration::from_millis(100))),
        Drain::Stop => {
            let mut deleted = 0;
            for s in usage::shadow_pods(&ctx.client, consumer).await? {
                if s.spec.cluster_id != consumer || s.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                let shadows: Api<ShadowPod> =
                    Api::namespaced(ctx.client.clone(), &s.namespace().unwrap_or_default());
                let dp = only_uid(s.metadata.uid.clone(), None);
                if delete(&shadows, &s.name_any(), &dp).await? == Deleted::Asked {
                    deleted += 1;
                }
            }
            if deleted > 0 {
                info!(
                    consumer,
                    deleted, "the tenant was drained past its grace: deleted its ShadowPods"
                );
                let note = format!(
                    "drained for {}s: the provider deleted {deleted} of its ShadowPods (their pods are stopped)",
                    ctx.grace.as_secs()
                );
                ctx.events
                    .publish(&*tenant, &Event::normal("PodsStopped", "Drain", note))
                    .await;
            }
            let conditions = lifetime::drained(&prev, state, true, ctx.grace, generation, now);
            if conditions != prev {
                write(conditions).await?;
            }
            Ok(Action::requeue(RESYNC))
        }
    }
}

/// Runs the drain of tenants until the task is dropped: a drained tenant's ShadowPods are
/// deleted `grace` after it was drained.
pub async fn run(client: Client, grace: Duration, defaults: Defaults) {
    // A ShadowPod that appears for a tenant already drained goes too.
    let controller = usage::tenants_and_their_shadow_pods(&client);
    let events = Events::new(client.clone(), field_manager::TENANT_DRAIN, None);
    Runner::new(
        "tenant-drain",
        Backoff::new(Duration::from_secs(1), Duration::from_secs(10)),
    )
    .until_dropped()
    .run(
        controller,
        reconcile,
        Arc::new(Ctx {
            client,
            events,
            grace,
            defaults,
        }),
    )
    .await;
}
