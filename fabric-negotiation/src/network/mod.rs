//! Network negotiation over the consumer's identity (`PeeringNetwork`).
//!
//! The consumer writes its side's parameters (real CIDRs, gateway key and endpoint) into a
//! `PeeringNetwork` named after itself in its tenant namespace on the provider; the provider
//! checks that the consumer speaks for itself, creates its local network objects for the
//! consumer (it listens) and answers with its own parameters in status; the consumer then
//! creates its own (it dials). Both sides' objects are `fabric_peering::plan`'s, so a
//! negotiated peering is the same as one made by `fabricctl peer`.
//!
//! This module is the pure part; [`consumer`] and [`provider`] are the controllers.
use std::{net::SocketAddr, time::Duration};

use fabric_api::{
    authentication::v1alpha1::Tenant,
    names,
    networking::v1alpha1::{
        ConnectionState, ConnectionStatus, PeerNetworkParams, PeeringNetwork, PeeringNetworkSpec,
    },
};
use fabric_kube::status::Verdict;
use fabric_peering::plan::{PeerObjects, endpoint_addr, objects_for};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, api::ObjectMeta, runtime::watcher};

use crate::{kit::Ctx, reasons::Network};

pub mod consumer;
pub mod provider;

/// On ForeignClusters (consumer) and PeeringNetworks (provider): this side's network objects
/// for the peer are removed before they go.
pub const FINALIZER: &str = "sharing.fabric.io/network";

/// The PeeringNetwork's condition type (provider's answer).
pub const READY: &str = "Ready";

/// How long an unpeer keeps trying to delete the consumer's PeeringNetwork on an unreachable
/// provider before it removes the local objects anyway.
pub const REMOTE_GRACE: Duration = Duration::from_secs(30);

/// This cluster's gateway identity ConfigMap (public key and endpoint, published by the
/// gateway operator), to watch: a rotated key or a moved endpoint is negotiated again at once,
/// on both sides, instead of leaving the peer dialing with the old key until someone edits
/// its PublicKey by hand.
pub fn own_gateway_identity(ctx: &Ctx) -> (Api<ConfigMap>, watcher::Config) {
    (
        Api::namespaced(ctx.client.clone(), &ctx.namespace),
        watcher::Config::default().fields(&format!(
            "metadata.name={}",
            names::config_map::GATEWAY_IDENTITY
        )),
    )
}

/// The PeeringNetwork the consumer writes on its provider, in its tenant namespace.
pub fn peering_network(consumer: PeerNetworkParams, tenant_namespace: &str) -> PeeringNetwork {
    PeeringNetwork {
        metadata: ObjectMeta {
            name: Some(consumer.cluster_id.clone()),
            namespace: Some(tenant_namespace.to_owned()),
            ..Default::default()
        },
        spec: PeeringNetworkSpec { consumer },
        status: None,
    }
}

/// Why a provider does not answer a PeeringNetwork.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("namespace {namespace} has no Tenant: this cluster does not know the consumer")]
    NoTenant { namespace: String },
    #[error(
        "the PeeringNetwork speaks for consumer {claimed:?}, but namespace {namespace} belongs \
         to {tenant:?}: a consumer can only speak for itself"
    )]
    Impersonation {
        claimed: String,
        tenant: String,
        namespace: String,
    },
    #[error("a PeeringNetwork is named after its consumer ({expected:?}), not {name:?}")]
    Name { name: String, expected: String },
}

/// Whether `pn` (in `namespace`) may be answered, given the Tenant(s) of that namespace: the
/// namespace must be the tenant namespace of the Tenant it holds, and the PeeringNetwork must
/// name that consumer (and be named after it, so two cannot share the same local objects).
pub fn check(pn: &PeeringNetwork, namespace: &str, tenants: &[Tenant]) -> Result<(), Refusal> {
    let tenant = tenants
        .iter()
        .find(|t| names::namespace::tenant(&t.spec.cluster_id) == namespace)
        .ok_or_else(|| Refusal::NoTenant {
            namespace: namespace.to_owned(),
        })?;
    let claimed = &pn.spec.consumer.cluster_id;
    if claimed != &tenant.spec.cluster_id {
        return Err(Refusal::Impersonation {
            claimed: claimed.clone(),
            tenant: tenant.spec.cluster_id.clone(),
            namespace: namespace.to_owned(),
        });
    }
    let name = pn.metadata.name.clone().unwrap_or_default();
    if &name != claimed {
        return Err(Refusal::Name {
            name,
            expected: claimed.clone(),
        });
    }
    Ok(())
}

/// The provider's answer lacks what the consumer needs to dial.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unusable {
    #[error("the answer comes from cluster {got:?}, the provider is {expected:?}")]
    WrongCluster { got: String, expected: String },
    #[error("the provider's answer has no usable gateway endpoint")]
    NoEndpoint,
}

/// The consumer's local objects about `provider` (it dials the provider's gateway), from
/// the provider's answer.
pub fn consumer_objects(
    answer: &PeerNetworkParams,
    provider_id: &str,
) -> Result<PeerObjects, Unusable> {
    if answer.cluster_id != provider_id {
        return Err(Unusable::WrongCluster {
            got: answer.cluster_id.clone(),
            expected: provider_id.to_owned(),
        });
    }
    let dial: SocketAddr = answer
        .endpoint
        .as_ref()
        .and_then(endpoint_addr)
        .ok_or(Unusable::NoEndpoint)?;
    Ok(objects_for(answer, Some(dial), 0))
}

/// The provider's local objects about the consumer: it listens on its own gateway's port.
pub fn provider_objects(consumer: &PeerNetworkParams, own_port: u16) -> PeerObjects {
    objects_for(consumer, None, own_port)
}

/// The NetworkReady condition from the gateway's `Connection` to the peer.
pub fn network_ready(conn: Option<&ConnectionStatus>) -> Verdict<Network> {
    match conn {
        None => Verdict::not(
            Network::NoTunnel,
            "the gateway reports no tunnel to the peer yet",
        ),
        Some(s) => match s.value {
            ConnectionState::Connected => Verdict::ok(
                Network::Connected,
                match &s.latency {
                    Some(l) => format!("tunnel up, round trip {l}"),
                    None => "tunnel up".to_owned(),
                },
            ),
            ConnectionState::Connecting => Verdict::not(
                Network::Connecting,
                s.message
                    .clone()
                    .unwrap_or_else(|| "the gateway is handshaking with the peer".to_owned()),
            ),
            ConnectionState::Error => Verdict::not(
                Network::TunnelError,
                s.message
                    .clone()
                    .unwrap_or_else(|| "the gateway reports an error".to_owned()),
            ),
        },
    }
}

/// Which network a consumer reaches its provider through. Two clusters have one network
/// peering between them (one Configuration, one tunnel), whichever way they peered first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Negotiate it: write this cluster's PeeringNetwork on the provider and dial the
    /// gateway it answers with.
    Negotiate,
    /// The provider is also this cluster's consumer and already dials this cluster's gateway
    /// (it negotiated the network as consumer): that tunnel is the network of both
    /// peerings; negotiating a second would give the pair a second, conflicting set of
    /// network objects.
    OtherWay,
}

/// How the consumer reaches its provider, from what this cluster holds about it: a
/// GatewayServer (the provider dials here) and a GatewayClient (this side dials it). Once
/// this side dials, it keeps negotiating its own answer.
pub fn route(listens_for_provider: bool, dials_provider: bool) -> Route {
    if listens_for_provider && !dials_provider {
        Route::OtherWay
    } else {
        Route::Negotiate
    }
}

/// Whether an unpeer that cannot delete the remote PeeringNetwork goes on without it: once
/// the ForeignCluster has been deleting for `grace`.
pub fn give_up_remote(deleting_for: Duration, grace: Duration) -> bool {
    deleting_for >= grace
}

#[cfg(test)]
mod tests;
