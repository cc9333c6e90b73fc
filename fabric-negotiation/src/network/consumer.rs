//! The consumer's network negotiation: for each ForeignCluster of a provider with an
//! Identity, the PeeringNetwork on the provider (with the identity), and once the provider
//! has answered, this cluster's network objects for it (it dials). Unpeering (deleting the
//! ForeignCluster) removes both; the local ones go even when the provider cannot be reached
//! (after [`super::REMOTE_GRACE`], or at once when the unpeer is forced). A provider that
//! already dials this cluster (it peered with this cluster first, as consumer) is reached
//! through that tunnel ([`Route::OtherWay`]): nothing is negotiated, and its objects stay with
//! the peering that made them.
use std::sync::Arc;

use fabric_api::{
    authentication::v1alpha1::Identity,
    core::v1alpha1::{ForeignCluster, condition::NETWORK},
    networking::v1alpha1::{Connection, GatewayClient, GatewayServer, PeeringNetwork},
};
use fabric_kube::{
    controller::{Runner, finalized},
    events::Event as KubeEvent,
    meta::{GoneOk, age},
    status::Verdict,
};
use fabric_peering::{
    Cluster, Side,
    plan::{Member, params},
};
use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, ResourceExt,
    api::DeleteParams,
    runtime::{Controller, controller::Action, reflector::ObjectRef, watcher},
};
use tracing::{info, warn};

use super::{FINALIZER, READY, Route, consumer_objects, network_ready, route};
use crate::kit::{
    Ctx, Error, FIELD_MANAGER, Shared, answer_poll, remote, remote_client, set_fc_condition,
};
use crate::reasons::Network;

async fn condition(ctx: &Ctx, fc: &str, verdict: Verdict<Network>) -> Result<(), Error> {
    set_fc_condition(&ctx.client, fc, NETWORK, &verdict).await
}

/// How this cluster reaches `provider` now (read afresh: the decision must not follow a
/// stale cache into a second network).
async fn current_route(ctx: &Ctx, provider: &str) -> Result<Route, Error> {
    let servers: Api<GatewayServer> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let clients: Api<GatewayClient> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    Ok(route(
        servers.get_opt(provider).await?.is_some(),
        clients.get_opt(provider).await?.is_some(),
    ))
}

async fn apply(fc: Arc<ForeignCluster>, ctx: &Ctx) -> Result<Action, Error> {
    let provider = fc.name_any();
    let ids: Api<Identity> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let Some(identity) = ids.get_opt(&provider).await? else {
        let msg = format!("no Identity {provider} in {} yet", ctx.namespace);
        condition(ctx, &provider, Verdict::not(Network::NoIdentity, msg)).await?;
        return Ok(Action::await_change());
    };
    let conns: Api<Connection> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    if current_route(ctx, &provider).await? == Route::OtherWay {
        let conn = conns.get_opt(&provider).await?;
        let mut ready = network_ready(conn.as_ref().and_then(|c| c.status.as_ref()));
        ready.message = format!(
            "{} (the network {provider} peered with this cluster)",
            ready.message
        );
        condition(ctx, &provider, ready).await?;
        return Ok(Action::requeue(ctx.remote_poll * 10));
    }
    let local = Cluster::read(Side::Local, ctx.client.clone(), &ctx.namespace).await?;
    local.ensure_gateway_key().await?;
    let Some(gateway) = local.gateway_identity().await? else {
        let msg = "this cluster's gateway has not published its key and endpoint yet";
        condition(
            ctx,
            &provider,
            Verdict::not(Network::WaitingForGateway, msg),
        )
        .await?;
        return Ok(Action::requeue(ctx.remote_poll));
    };
    let ours = params(Member {
        cluster: &local.identity,
        gateway: &gateway,
    });
    let pn = super::peering_network(ours, &identity.spec.tenant_namespace);
    let api: Api<PeeringNetwork> = Api::namespaced(
        remote_client(ctx, &provider).await?,
        &identity.spec.tenant_namespace,
    );
    let stored = remote(&provider, FIELD_MANAGER.apply(&api, &pn)).await?;
    let waited = age(&stored.metadata, Timestamp::now());
    let status = stored.status.unwrap_or_default();
    let Some(answer) = status.provider else {
        // The provider's reason, carried as it wrote it.
        let waiting = match Verdict::<Network>::find(&status.conditions, READY) {
            Some(v) if !v.ok => v,
            _ => Verdict::not(
                Network::WaitingForProvider,
                "the provider has not answered yet",
            ),
        };
        condition(ctx, &provider, waiting).await?;
        return Ok(Action::requeue(answer_poll(ctx.remote_poll, waited)));
    };
    let objects = match consumer_objects(&answer, &fc.spec.cluster_id) {
        Ok(o) => o,
        Err(e) => {
            let unusable = Verdict::not(Network::UnusableAnswer, e.to_string());
            condition(ctx, &provider, unusable).await?;
            return Ok(Action::requeue(ctx.remote_poll));
        }
    };
    local.apply_peer(&objects, FIELD_MANAGER.0).await?;
    let conn = conns.get_opt(&provider).await?;
    let ready = network_ready(conn.as_ref().and_then(|c| c.status.as_ref()));
    condition(ctx, &provider, ready).await?;
    // The provider's answer may change (a new gateway key or endpoint): look again now and then.
    Ok(Action::requeue(ctx.remote_poll * 10))
}

async fn cleanup(fc: Arc<ForeignCluster>, ctx: &Ctx) -> Result<Action, Error> {
    let provider = fc.name_any();
    if current_route(ctx, &provider).await? == Route::OtherWay {
        // Nothing of ours: the network belongs to the provider's PeeringNetwork here, whose
        // removal removes it.
        info!(
            provider,
            "the network is the provider's peering with this cluster: left to it"
        );
        return Ok(Action::await_change());
    }
    let local = Cluster::read(Side::Local, ctx.client.clone(), &ctx.namespace).await?;
    let remote_delete = async {
        let ids: Api<Identity> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
        let Some(identity) = ids.get_opt(&provider).await? else {
            // No identity, no way to reach the provider: nothing to try.
            return Err(Error::NoIdentity {
                provider: provider.clone(),
            });
        };
        let api: Api<PeeringNetwork> = Api::namespaced(
            remote_client(ctx, &provider).await?,
            &identity.spec.tenant_namespace,
        );
        let delete = async {
            api.delete(local.id(), &DeleteParams::default())
                .await
                .gone_ok()
        };
        remote(&provider, delete).await.map(|_| ())
    };
    if let Err(e) = remote_delete.await {
        if !crate::unpeer::abandon_remote(&fc.metadata, Timestamp::now()) {
            return Err(e);
        }
        warn!(provider, error = %e, "unpeering without the provider: its PeeringNetwork stays there");
        let note = format!("the provider could not be reached ({e}); its side is left as it is");
        ctx.events
            .publish(
                fc.as_ref(),
                &KubeEvent::warning("UnpeeredWithoutProvider", "Unpeer", note),
            )
            .await;
    }
    local.delete_peer(&provider).await?;
    info!(provider, "network objects for the provider removed");
    Ok(Action::await_change())
}

async fn reconcile(fc: Arc<ForeignCluster>, ctx: Shared) -> Result<Action, Error> {
    let ours = fc.finalizers().iter().any(|f| f == FINALIZER);
    if !fc.spec.role.provides() && !ours {
        return Ok(Action::await_change());
    }
    let api: Api<ForeignCluster> = Api::all(ctx.client.clone());
    finalized(
        &api,
        FINALIZER,
        fc,
        |fc| apply(fc, &ctx),
        |fc| cleanup(fc, &ctx),
    )
    .await
}

/// Runs until the watch ends.
pub async fn run(ctx: Shared) {
    let fcs: Api<ForeignCluster> = Api::all(ctx.client.clone());
    let ids: Api<Identity> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let conns: Api<Connection> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    // Identities and Connections are named after the provider, as its ForeignCluster is.
    let (gateway, gateway_watch) = super::own_gateway_identity(&ctx);
    let controller = Controller::new(fcs, watcher::Config::default());
    let peers = controller.store();
    let controller = controller
        .watches(ids, watcher::Config::default(), |i| {
            Some(ObjectRef::new(&i.name_any()))
        })
        .watches(conns, watcher::Config::default(), |c| {
            Some(ObjectRef::new(&c.name_any()))
        })
        // Every PeeringNetwork carries this cluster's gateway key and endpoint.
        .watches(gateway, gateway_watch, move |_| {
            peers
                .state()
                .iter()
                .map(|fc| ObjectRef::from_obj(fc.as_ref()))
                .collect::<Vec<_>>()
        });
    Runner::new("network negotiation (consumer)", ctx.backoff())
        .run(controller, reconcile, ctx)
        .await;
}
