//! The provider's network negotiation: answers each consumer's PeeringNetwork in its tenant
//! namespace. A consumer speaks only for itself (see [`super::check`]); for an honest one this
//! cluster creates its network objects for the consumer (it listens) and answers with its own
//! parameters in status. Deleting the PeeringNetwork removes those objects.
use std::sync::Arc;

use fabric_api::{
    authentication::v1alpha1::Tenant,
    core::v1alpha1::condition::NETWORK,
    names,
    networking::v1alpha1::{Connection, PeeringNetwork, PeeringNetworkStatus},
};
use fabric_kube::{
    controller::{Runner, finalized},
    events::Event as KubeEvent,
    status::{self, Verdict},
};
use fabric_peering::{
    Cluster, Side,
    plan::{Member, params},
};
use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, ResourceExt,
    api::ListParams,
    runtime::{Controller, controller::Action, reflector::ObjectRef, watcher},
};
use tracing::{info, warn};

use super::{FINALIZER, READY, check, network_ready, provider_objects};
use crate::{
    kit::{Ctx, Error, FIELD_MANAGER, Shared, set_fc_condition},
    reasons::{Answer, Network},
};

async fn answer(
    api: &Api<PeeringNetwork>,
    pn: &PeeringNetwork,
    provider: Option<fabric_api::networking::v1alpha1::PeerNetworkParams>,
    verdict: Verdict<Answer>,
) -> Result<(), Error> {
    let generation = pn.metadata.generation;
    let current = pn
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or(&[]);
    let st = PeeringNetworkStatus {
        provider,
        observed_generation: generation,
        conditions: status::with_condition(
            current,
            verdict.condition(READY, generation, Timestamp::now()),
        ),
    };
    if pn.status.as_ref() != Some(&st) {
        FIELD_MANAGER.apply_status(api, &pn.name_any(), st).await?;
    }
    Ok(())
}

async fn apply(pn: Arc<PeeringNetwork>, ctx: &Ctx) -> Result<Action, Error> {
    let ns = pn.namespace().unwrap_or_default();
    let api: Api<PeeringNetwork> = Api::namespaced(ctx.client.clone(), &ns);
    let tenants: Api<Tenant> = Api::namespaced(ctx.client.clone(), &ns);
    let tenants = tenants.list(&ListParams::default()).await?.items;
    if let Err(refusal) = check(&pn, &ns, &tenants) {
        warn!(namespace = ns, peering_network = %pn.name_any(), %refusal, "refused");
        let note = refusal.to_string();
        ctx.events
            .publish(
                pn.as_ref(),
                &KubeEvent::warning("Refused", "Negotiate", note.clone()),
            )
            .await;
        answer(&api, &pn, None, Verdict::not(Answer::Refused, note)).await?;
        return Ok(Action::await_change());
    }
    let consumer = pn.spec.consumer.cluster_id.clone();
    let local = Cluster::read(Side::Local, ctx.client.clone(), &ctx.namespace).await?;
    local.ensure_gateway_key().await?;
    let Some(gateway) = local.gateway_identity().await? else {
        let msg = "this cluster's gateway has not published its key and endpoint yet";
        answer(
            &api,
            &pn,
            None,
            Verdict::not(Answer::WaitingForGateway, msg),
        )
        .await?;
        return Ok(Action::requeue(ctx.remote_poll));
    };
    local
        .apply_peer(
            &provider_objects(&pn.spec.consumer, gateway.endpoint.port()),
            FIELD_MANAGER.0,
        )
        .await?;
    let ours = params(Member {
        cluster: &local.identity,
        gateway: &gateway,
    });
    let msg = format!(
        "network objects for {consumer} created; dial {}",
        gateway.endpoint
    );
    answer(&api, &pn, Some(ours), Verdict::ok(Answer::Answered, msg)).await?;
    let conns: Api<Connection> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let conn = conns.get_opt(&consumer).await?;
    let ready = network_ready(conn.as_ref().and_then(|c| c.status.as_ref()));
    set_fc_condition(&ctx.client, &consumer, NETWORK, &ready).await?;
    Ok(Action::await_change())
}

async fn cleanup(pn: Arc<PeeringNetwork>, ctx: &Ctx) -> Result<Action, Error> {
    let ns = pn.namespace().unwrap_or_default();
    let consumer = &pn.spec.consumer.cluster_id;
    // Only the consumer's own PeeringNetwork stands for its objects (the Tenant may already be
    // gone with its namespace: the names alone say whose it is).
    if names::namespace::tenant(consumer) != ns || pn.name_any() != *consumer {
        return Ok(Action::await_change());
    }
    let local = Cluster::read(Side::Local, ctx.client.clone(), &ctx.namespace).await?;
    local.delete_peer(consumer).await?;
    let unpeered = Verdict::not(Network::Unpeered, "the consumer removed its PeeringNetwork");
    set_fc_condition(&ctx.client, consumer, NETWORK, &unpeered).await?;
    info!(consumer, "network objects for the consumer removed");
    Ok(Action::await_change())
}

async fn reconcile(pn: Arc<PeeringNetwork>, ctx: Shared) -> Result<Action, Error> {
    let api: Api<PeeringNetwork> =
        Api::namespaced(ctx.client.clone(), &pn.namespace().unwrap_or_default());
    finalized(
        &api,
        FINALIZER,
        pn,
        |pn| apply(pn, &ctx),
        |pn| cleanup(pn, &ctx),
    )
    .await
}

/// Runs until the watch ends.
pub async fn run(ctx: Shared) {
    let pns: Api<PeeringNetwork> = Api::all(ctx.client.clone());
    let conns: Api<Connection> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let tenants: Api<Tenant> = Api::all(ctx.client.clone());
    // A consumer's PeeringNetwork is named after it, in its tenant namespace; so are its
    // Connection (here) and its Tenant.
    let of = |id: &str| Some(ObjectRef::new(id).within(&names::namespace::tenant(id)));
    let (gateway, gateway_watch) = super::own_gateway_identity(&ctx);
    let controller = Controller::new(pns, watcher::Config::default());
    let answered = controller.store();
    let controller = controller
        .watches(
            conns,
            watcher::Config::default(),
            move |c| of(&c.name_any()),
        )
        .watches(tenants, watcher::Config::default(), move |t| {
            of(&t.spec.cluster_id)
        })
        // Every answer carries this cluster's gateway key and endpoint.
        .watches(gateway, gateway_watch, move |_| {
            answered
                .state()
                .iter()
                .map(|pn| ObjectRef::from_obj(pn.as_ref()))
                .collect::<Vec<_>>()
        });
    Runner::new("network negotiation (provider)", ctx.backoff())
        .run(controller, reconcile, ctx)
        .await;
}
