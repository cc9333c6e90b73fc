//! The IPAM controller: for every peer `Configuration`, grants the CIDRs under which this
//! cluster sees the peer's pod and external networks, and a data-plane peer id.
//!
//! Every grant is made in the ledger ([`ledger`], the ConfigMap `fabric-ipam-ledger`) before
//! anything shows it, computed from the ledger as stored and written back conditionally on its
//! resourceVersion ([`store`]): two replicas that both believe they lead (one paused or cut
//! off past the Lease) cannot grant the same range, the stale one's write fails and it grants
//! again from what the other wrote. Grants are also recorded as `Network` objects (owned by
//! the Configuration) for people and tools; the ledger is made from them when it is missing.
use std::{collections::BTreeMap, sync::Arc, time::Duration};

use fabric_api::{
    names::{field_manager, finalizer::IPAM as FINALIZER, label},
    networking::v1alpha1::{
        ClusterCidrs, Configuration, ConfigurationStatus, Network, NetworkSpec, NetworkStatus,
    },
};
use fabric_kube::{
    FieldManager,
    controller::{Backoff, FinalizerError, Runner, finalized},
    meta::delete_gone_ok,
    status::{Verdict, with_condition},
};
use ipnetwork::Ipv4Network;
use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Condition, jiff::Timestamp};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ListParams, ObjectMeta},
    runtime::{Controller, controller::Action, watcher},
};
use tracing::info;

pub mod ledger;
pub mod store;

/// Everything IPAM writes (Configuration status, `Network` records, `IP` status).
pub const FIELD_MANAGER: FieldManager = FieldManager(field_manager::IPAM);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Finalizer(#[from] FinalizerError),
    #[error("{0}")]
    Invalid(String),
    #[error("IPAM ledger: {0}")]
    Ledger(#[from] ledger::Unreadable),
    #[error("the IPAM ledger kept changing under this replica (another replica allocating?)")]
    Contended,
}

/// What the cluster itself uses, and where remapped CIDRs come from.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The fabric's namespace: the only one whose Configurations are served (a Configuration
    /// elsewhere, e.g. in a tenant's namespace, gets nothing).
    pub namespace: String,
    pub pools: Vec<Ipv4Network>,
    pub reserved: Vec<Ipv4Network>,
    /// The largest claim granted: a peer CIDR with a shorter prefix is refused.
    pub largest_claim: u8,
}

pub struct Ctx {
    pub client: Client,
    pub settings: Settings,
    pub ledger: store::Store,
}

fn key(cfg: &Configuration) -> String {
    format!("{}/{}", cfg.namespace().unwrap_or_default(), cfg.name_any())
}

fabric_kube::reasons! {
    /// Why a Configuration or an `IP` is (not) Ready: what IPAM granted.
    pub enum Ready {
        Allocated = "Allocated",
        IpamFailed = "IPAMFailed",
        ExternalCidrFull = "ExternalCIDRFull",
    }
}

/// The Ready condition to apply, from `current`: its lastTransitionTime only moves when its
/// status does, so re-applying an unchanged grant writes nothing new. Only Ready: the others
/// (the gateway operator's) are their owners' to apply, and applying them here would take
/// them over.
pub(crate) fn ready(
    current: &[Condition],
    verdict: Verdict<Ready>,
    generation: Option<i64>,
) -> Vec<Condition> {
    let mine: Vec<Condition> = current
        .iter()
        .filter(|c| c.type_ == READY)
        .cloned()
        .collect();
    with_condition(
        &mine,
        verdict.condition(READY, generation, Timestamp::now()),
    )
}

/// The condition type IPAM writes.
pub const READY: &str = "Ready";

async fn patch_status(
    api: &Api<Configuration>,
    name: &str,
    status: ConfigurationStatus,
) -> Result<(), Error> {
    Ok(FIELD_MANAGER.apply_status(api, name, status).await?)
}

/// The addresses this cluster is seen using, which no grant may cover: its Nodes' (so no node
/// routes its own subnet into a tunnel; found from the Nodes, not a hand-kept list) and the
/// API server's (the `kubernetes` Service's endpoints).
async fn in_use(client: &Client) -> Result<Vec<std::net::Ipv4Addr>, Error> {
    let mut out = Vec::new();
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    for n in nodes.list(&ListParams::default()).await? {
        let addrs = n.status.and_then(|s| s.addresses).unwrap_or_default();
        out.extend(
            addrs
                .iter()
                .filter_map(|a| a.address.parse::<std::net::Ipv4Addr>().ok()),
        );
    }
    let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
        Api::namespaced(client.clone(), "default");
    let api_server = ListParams::default().labels("kubernetes.io/service-name=kubernetes");
    for s in slices.list(&api_server).await? {
        for e in s.endpoints.into_iter().flatten() {
            out.extend(
                e.addresses
                    .iter()
                    .filter_map(|a| a.parse::<std::net::Ipv4Addr>().ok()),
            );
        }
    }
    Ok(out)
}

/// Writes the grant as a Network object (spec: what was asked; status: what was granted).
async fn persist(
    client: &Client,
    cfg: &Configuration,
    role: &str,
    wanted: Ipv4Network,
    granted: Ipv4Network,
) -> Result<(), Error> {
    let ns = cfg.namespace().unwrap_or_default();
    let api: Api<Network> = Api::namespaced(client.clone(), &ns);
    let name = format!("{}-{role}", cfg.name_any());
    let net = Network {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(ns),
            labels: Some(BTreeMap::from([
                (label::CONFIGURATION.to_owned(), cfg.name_any()),
                (label::ROLE.to_owned(), role.to_owned()),
                (label::PEER.to_owned(), cfg.spec.cluster_id.clone()),
            ])),
            owner_references: cfg.controller_owner_ref(&()).map(|o| vec![o]),
            ..Default::default()
        },
        spec: NetworkSpec { cidr: wanted },
        status: None,
    };
    FIELD_MANAGER.apply(&api, &net).await?;
    let status = NetworkStatus {
        cidr: Some(granted),
        conditions: vec![],
    };
    FIELD_MANAGER.apply_status(&api, &name, status).await?;
    Ok(())
}

async fn apply(cfg: Arc<Configuration>, ctx: &Ctx) -> Result<Action, Error> {
    let api: Api<Configuration> =
        Api::namespaced(ctx.client.clone(), &cfg.namespace().unwrap_or_default());
    let k = key(&cfg);
    let generation = cfg.metadata.generation;
    let conditions = cfg
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let (pod, ext) = (cfg.spec.remote.pod, cfg.spec.remote.external);
    // Read afresh on every allocation: a node added since must never be covered by a grant.
    let in_use = in_use(&ctx.client).await?;
    let granted = ctx
        .ledger
        .update(|l| l.grant(&ctx.settings, &in_use, &k, pod, ext))
        .await?;
    let ledger::Grant {
        pod: gp,
        external: ge,
        id,
    } = match granted {
        Ok(g) => g,
        Err(e) => {
            let status = ConfigurationStatus {
                conditions: ready(
                    conditions,
                    Verdict::not(Ready::IpamFailed, e.to_string()),
                    generation,
                ),
                observed_generation: generation,
                ..Default::default()
            };
            patch_status(&api, &cfg.name_any(), status).await?;
            return Ok(Action::requeue(Duration::from_secs(30)));
        }
    };
    persist(&ctx.client, &cfg, "pod", pod, gp).await?;
    persist(&ctx.client, &cfg, "external", ext, ge).await?;
    let status = ConfigurationStatus {
        remote: Some(ClusterCidrs {
            pod: gp,
            external: ge,
        }),
        peer_id: Some(id as i32),
        observed_generation: generation,
        conditions: ready(
            conditions,
            Verdict::ok(
                Ready::Allocated,
                format!("pod {pod} seen as {gp}, external {ext} seen as {ge}"),
            ),
            generation,
        ),
    };
    patch_status(&api, &cfg.name_any(), status).await?;
    Ok(Action::requeue(Duration::from_secs(600)))
}

async fn cleanup(cfg: Arc<Configuration>, ctx: &Ctx) -> Result<Action, Error> {
    let k = key(&cfg);
    let ns = cfg.namespace().unwrap_or_default();
    let nets: Api<Network> = Api::namespaced(ctx.client.clone(), &ns);
    for role in ["pod", "external"] {
        delete_gone_ok(&nets, &format!("{}-{role}", cfg.name_any())).await?;
    }
    ctx.ledger
        .update(|l| {
            l.release(&k);
            Ok::<_, std::convert::Infallible>(())
        })
        .await?
        .unwrap_or_else(|never| match never {});
    info!(configuration = %k, "released CIDRs and peer id");
    Ok(Action::await_change())
}

async fn reconcile(cfg: Arc<Configuration>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let api: Api<Configuration> =
        Api::namespaced(ctx.client.clone(), &cfg.namespace().unwrap_or_default());
    finalized(
        &api,
        FINALIZER,
        cfg,
        |c| apply(c, &ctx),
        |c| cleanup(c, &ctx),
    )
    .await
}

/// How IPAM's controllers retry: every 5 s at most (a grant waits on nothing slower).
pub(crate) const BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(5));

/// Reconciles the Configurations of the fabric's namespace until the stream ends, granting
/// through the ledger there.
pub async fn run(client: Client, settings: Settings) -> Result<(), Error> {
    let cfgs: Api<Configuration> = Api::namespaced(client.clone(), &settings.namespace);
    let nets: Api<Network> = Api::namespaced(client.clone(), &settings.namespace);
    let ctx = Arc::new(Ctx {
        ledger: store::Store::new(client.clone(), &settings.namespace),
        client,
        settings,
    });
    let controller =
        Controller::new(cfgs, watcher::Config::default()).owns(nets, watcher::Config::default());
    Runner::new("ipam", BACKOFF)
        .run(controller, reconcile, ctx)
        .await;
    Ok(())
}
