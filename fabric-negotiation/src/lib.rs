//! Negotiation in the sharing layer (consumer → provider peering), see
//! `shared/design/sharing-layer.md`: over the identity a consumer holds on its provider, the
//! network ([`network`]: PeeringNetwork, each side's objects from `fabric_peering::plan`) and
//! resources ([`slices`]: ResourceSlice replication and the VirtualNode of a grant, decided
//! by the provider's [`policy`], a pure function), the twin namespaces a provider makes for
//! a consumer's NamespaceMap ([`namespaces`]), and their end ([`unpeer`]); [`kit`] is
//! what these controllers share. [`run`] runs them together, as `fabric-controller sharing`
//! does, each with its consumer and provider half (a cluster can be both).
//!
//! It builds on `fabric-auth` (the identities it reaches a provider with, the tenant areas it
//! removes) and on `fabric_api` for what it shares with offloading (the at-most-once terms it
//! agrees, quantities, the forced-unpeer annotation): offloading runs what is agreed here and
//! does not depend on it, nor this on offloading.
use std::{collections::BTreeMap, sync::Arc, time::Duration};

use fabric_kube::events::Events;
use fabric_peering::{Cluster, Side};
use kube::Client;

use crate::kit::{Ctx, Error};

pub mod kit;
pub mod namespaces;
pub mod network;
pub mod policy;
pub mod reasons;
pub mod slices;
pub mod unpeer;

/// How the negotiation controllers run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where the fabric runs in this cluster.
    pub namespace: String,
    /// How often a consumer looks at its providers' answers.
    pub remote_poll: Duration,
    /// Share of free capacity offered to consumers, in percent.
    pub percent: u8,
    /// Labels every offer advertises.
    pub labels: BTreeMap<String, String>,
    /// This replica, as its Events name it.
    pub instance: Option<String>,
    /// What the provider agrees to of consumers' at-most-once requests.
    pub at_most_once: fabric_api::offloading::at_most_once::Bounds,
    /// Namespace names the provider keeps beyond its own ([`namespaces::twins::Limits`]):
    /// never a consumer's twin.
    pub reserved_namespaces: Vec<String>,
    /// How many twin namespaces a consumer may have.
    pub max_namespaces_per_tenant: u32,
}

/// Runs the negotiation controllers and the unpeer ones until their watches end.
pub async fn run(client: Client, settings: Settings) -> Result<(), Error> {
    let local = Cluster::read(Side::Local, client.clone(), &settings.namespace).await?;
    let ctx = Arc::new(Ctx {
        events: Events::new(client.clone(), "fabric-sharing", settings.instance.clone()),
        client,
        namespace: settings.namespace.clone(),
        remote_poll: settings.remote_poll,
        remote_clients: Default::default(),
    });
    let policy = policy::Settings {
        percent: settings.percent,
        labels: settings.labels.clone(),
        at_most_once: settings.at_most_once,
        ..policy::Settings::new(local.id())
    };
    let twins = namespaces::twins::Limits {
        reserved: settings.reserved_namespaces.iter().cloned().collect(),
        max_per_tenant: settings.max_namespaces_per_tenant,
        ..namespaces::twins::Limits::new(&settings.namespace)
    };
    tokio::join!(
        network::consumer::run(ctx.clone()),
        network::provider::run(ctx.clone()),
        slices::consumer::run(ctx.clone()),
        slices::provider::run(ctx.clone(), policy),
        namespaces::provider::run(ctx.clone(), twins),
        unpeer::consumer::run(ctx.clone()),
        unpeer::revoke::run(ctx.clone()),
        unpeer::provider::run(ctx.clone()),
        namespaces::consumer::run(ctx, local.id().to_owned()),
    );
    Ok(())
}
