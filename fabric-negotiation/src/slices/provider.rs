//! The provider's slice controller: answers every ResourceSlice replica by
//! [`crate::policy`], from watch caches of Nodes, Pods, ResourceSlices and Tenants. Offers
//! depend on each other (together they never exceed what is free), so any change to any of
//! them decides all slices again, and only the statuses that change are written.
//! The storage the admin lends is read from ConfigMap `fabric-storage` in the fabric's
//! namespace (watched by name): a change to it is answered at once; one that does not parse
//! lends nothing and says why in the log.
use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};

use fabric_api::{
    authentication::{
        mode::{TenantRef, Tether},
        v1alpha1::{ResourceSlice, Tenant},
    },
    core::v1alpha1::condition::{RESOURCES, TETHERED},
    names,
    offloading::lent::{self, Lent},
};
use fabric_kube::status::Verdict;
use futures::{Stream, StreamExt};
use k8s_openapi::{
    api::core::v1::{ConfigMap, Node, Pod},
    jiff::Timestamp,
};
use kube::{
    Api, Resource, ResourceExt,
    runtime::{reflector::Store, watcher},
};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tracing::{info, warn};

use super::resources_granted;
use crate::{
    kit::{Ctx, Error, FIELD_MANAGER, set_fc_condition},
    policy::{self, Capacity, SliceView, TenantView},
    reasons,
};

/// A burst of changes (a node with its pods) is decided once, this long after it starts.
const SETTLE: Duration = Duration::from_millis(200);

/// A watch cache of `K` that pokes `changed` on every change it sees.
fn cache<K>(
    api: Api<K>,
    config: watcher::Config,
    changed: Arc<Notify>,
) -> (Store<K>, impl Stream<Item = ()>)
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (store, events) = fabric_kube::cache::events(api, config);
    let stream = events.map(move |ev| {
        if let Err(e) = ev {
            warn!(error = %e, "watch");
        }
        changed.notify_one();
    });
    (store, stream)
}

struct Caches {
    nodes: Store<Node>,
    pods: Store<Pod>,
    slices: Store<ResourceSlice>,
    tenants: Store<Tenant>,
    /// ConfigMap `fabric-storage` alone.
    storage: Store<ConfigMap>,
}

/// What the admin lends, from the ConfigMap; nothing when it is missing or wrong (`told`: the
/// error last logged, so that each is said once).
fn lent(c: &Caches, told: &mut Option<lent::LentError>) -> Lent {
    let map = c.storage.state().into_iter().next();
    match Lent::from_data(map.as_ref().and_then(|m| m.data.as_ref())) {
        Ok(l) => {
            *told = None;
            l
        }
        Err(e) => {
            if told.as_ref() != Some(&e) {
                warn!(error = %e, "the storage lent is not understood: none is offered");
                *told = Some(e);
            }
            Lent::default()
        }
    }
}

/// The slice replicas the policy decides: those outside this cluster's own fabric namespace
/// (where its own slices, as a consumer, live).
fn views(c: &Caches, own_namespace: &str) -> (Vec<Arc<ResourceSlice>>, Vec<SliceView>) {
    let tenants = c.tenants.state();
    let slices: Vec<Arc<ResourceSlice>> = c
        .slices
        .state()
        .into_iter()
        .filter(|s| s.namespace().is_some_and(|ns| ns != own_namespace))
        .collect();
    let views = slices
        .iter()
        .map(|s| {
            let ns = s.namespace().unwrap_or_default();
            let tenant = tenants
                .iter()
                .find(|t| {
                    t.namespace().as_deref() == Some(ns.as_str())
                        && names::namespace::tenant(&t.spec.cluster_id) == ns
                })
                .map(|t| TenantView::from_tenant(t));
            SliceView {
                key: (ns, s.name_any()),
                consumer: s.spec.consumer_cluster_id.clone(),
                provider: s.spec.provider_cluster_id.clone(),
                tenant,
                requested: s.spec.resources.clone(),
                granted: s
                    .status
                    .as_ref()
                    .map(|st| st.granted.clone())
                    .unwrap_or_default(),
                at_most_once: s.spec.at_most_once,
                created: s.metadata.creation_timestamp.as_ref().map(|t| t.0),
            }
        })
        .collect();
    (slices, views)
}

/// The working mode from the Tenants: the consumer this cluster is tethered to, if any (a
/// conflict is said once and honoured for neither).
fn tether(c: &Caches, told: &mut Option<Tether>) -> Option<String> {
    let refs: Vec<TenantRef> = c.tenants.state().iter().map(|t| TenantRef::of(t)).collect();
    let tether = Tether::of(&refs);
    if told.as_ref() != Some(&tether) {
        match &tether {
            Tether::Conflict(peers) => warn!(
                ?peers,
                "more than one Tenant says Tethered: tethered to none until all but one are set back"
            ),
            Tether::To(peer) => info!(peer, "tethered: all of what is free is offered to it alone"),
            Tether::Autonomous => info!("autonomous"),
        }
        *told = Some(tether.clone());
    }
    tether.peer().map(str::to_owned)
}

/// What a pass has already said: the conditions written per consumer, the storage lent that
/// did not parse, the mode.
#[derive(Default)]
struct Told {
    granted: HashMap<String, Verdict<reasons::ResourcesGranted>>,
    mode: HashMap<String, Verdict<reasons::Mode>>,
    bad_lent: Option<lent::LentError>,
    tether: Option<Tether>,
}

/// One decision over everything; writes the statuses (and ForeignCluster conditions) that
/// changed. `told` remembers what was already written or logged.
async fn pass(
    ctx: &Ctx,
    settings: &policy::Settings,
    c: &Caches,
    told: &mut Told,
) -> Result<(), Error> {
    let nodes = c.nodes.state();
    let pods = c.pods.state();
    let mut capacity = Capacity::of(
        nodes.iter().map(|n| n.as_ref()),
        pods.iter().map(|p| p.as_ref()),
    );
    capacity.lent = lent(c, &mut told.bad_lent);
    let settings = policy::Settings {
        tethered: tether(c, &mut told.tether),
        ..settings.clone()
    };
    let (slices, views) = views(c, &ctx.namespace);
    let offers = policy::decide(&settings, &capacity, &views);
    let now = Timestamp::now();
    let mut per_consumer: BTreeMap<String, Vec<_>> = BTreeMap::new();
    let mut failed = None;
    for (s, v) in slices.iter().zip(&views) {
        let Some(offer) = offers.get(&v.key) else {
            continue;
        };
        let status = policy::status(offer, s.status.as_ref(), s.metadata.generation, now);
        if s.status.as_ref() != Some(&status) {
            let api: Api<ResourceSlice> = Api::namespaced(ctx.client.clone(), &v.key.0);
            match FIELD_MANAGER.apply_status(&api, &v.key.1, &status).await {
                Ok(()) => info!(
                    namespace = v.key.0, slice = v.key.1, answer = %offer.verdict,
                    granted = ?offer.granted, "answered"
                ),
                Err(e) => failed = Some(e),
            }
        }
        if let Some(t) = &v.tenant {
            per_consumer
                .entry(t.cluster_id.clone())
                .or_default()
                .push(status);
        }
    }
    for (consumer, statuses) in per_consumer {
        let cond = resources_granted(statuses.iter().map(Some));
        if told.granted.get(&consumer) != Some(&cond) {
            set_fc_condition(&ctx.client, &consumer, RESOURCES, &cond).await?;
            told.granted.insert(consumer.clone(), cond);
        }
        let mode = super::mode(statuses.iter().map(Some));
        if told.mode.get(&consumer) != Some(&mode) {
            set_fc_condition(&ctx.client, &consumer, TETHERED, &mode).await?;
            told.mode.insert(consumer, mode);
        }
    }
    match failed {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

/// Runs until the watches end or SIGTERM/SIGINT. `settings.cluster_id` is this cluster's.
pub async fn run(ctx: Arc<Ctx>, settings: policy::Settings) {
    let changed = Arc::new(Notify::new());
    let client = ctx.client.clone();
    let all = watcher::Config::default;
    let (nodes, n) = cache(Api::<Node>::all(client.clone()), all(), changed.clone());
    let (pods, p) = cache(Api::<Pod>::all(client.clone()), all(), changed.clone());
    let (slices, s) = cache(
        Api::<ResourceSlice>::all(client.clone()),
        all(),
        changed.clone(),
    );
    let (tenants, t) = cache(Api::<Tenant>::all(client.clone()), all(), changed.clone());
    // By name: RBAC grants this ConfigMap alone.
    let (storage, m) = cache(
        Api::<ConfigMap>::namespaced(client, &ctx.namespace),
        all().fields(&format!("metadata.name={}", lent::CONFIG_MAP)),
        changed.clone(),
    );
    let caches = Caches {
        nodes,
        pods,
        slices,
        tenants,
        storage,
    };
    let watches =
        futures::stream::select_all([n.boxed(), p.boxed(), s.boxed(), t.boxed(), m.boxed()])
            .for_each(|()| async {});
    let decide = async {
        for store in [
            caches.nodes.wait_until_ready().await,
            caches.pods.wait_until_ready().await,
            caches.slices.wait_until_ready().await,
            caches.tenants.wait_until_ready().await,
            caches.storage.wait_until_ready().await,
        ] {
            if store.is_err() {
                return;
            }
        }
        let mut told = Told::default();
        loop {
            changed.notified().await;
            tokio::time::sleep(SETTLE).await;
            if let Err(e) = pass(&ctx, &settings, &caches, &mut told).await {
                warn!(error = %e, "answering ResourceSlices failed; retrying");
                told.granted.clear();
                told.mode.clear();
                tokio::time::sleep(ctx.remote_poll).await;
                changed.notify_one();
            }
        }
    };
    tokio::select! {
        () = watches => {}
        () = decide => {}
        // As the other negotiation controllers, which kube-runtime stops on these signals.
        () = fabric_kube::controller::shutdown_signal() => {}
    }
}
