//! The provider's ShadowEndpointSlice controller (I/O edge of [`super::translate`]): from
//! watch caches of ShadowEndpointSlices, of the real slices it writes (by our managed-by
//! label), of the namespaces of consumers (who a shadow's consumer is), and of the
//! Configurations and Connections in the fabric's namespace (how the consumer's addresses
//! are seen here, whether its tunnel is up: a change of either re-translates all of that
//! consumer's slices), and of the consumers' heartbeat Leases (whether their virtual kubelets
//! still vouch for what they reflected: when each last changed is noted by this process's
//! clock, and a slice whose consumer could turn silent is looked at again then; only a change
//! of what a heartbeat vouches for re-translates the consumer's slices, not each renewal). The real slice is server-side applied under one field manager, never
//! over a slice that is not ours (the provider's own endpoint controller's), and deleted
//! with its shadow (a finalizer: the test API server, like some clusters, runs no garbage
//! collector). Refused addresses are said in a Warning Event on the shadow.
use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use fabric_api::{
    names::{
        endpoint_slice::{self, MANAGED_BY, REFLECTED},
        field_manager, finalizer, label, lease,
    },
    networking::{
        remap::{BadConfiguration, Remaps},
        v1alpha1::{Configuration, Connection},
    },
    offloading::v1alpha1::ShadowEndpointSlice,
};
use fabric_kube::{
    cache,
    controller::{Backoff, FinalizerError, Runner, finalized},
    events::{Event, Events},
    meta,
};
use k8s_openapi::api::{
    coordination::v1::Lease, core::v1::Namespace, discovery::v1::EndpointSlice,
};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{
        Controller,
        controller::Action,
        reflector::{ObjectRef, Store},
        watcher,
    },
};
use tracing::{debug, info};

use super::translate::{self, Heartbeat, NotVouched, Refused, SILENT_AFTER, Translated};
use crate::shadowpod::partition::{Heartbeats, tenant_namespace};

/// The Event reason on a shadow whose consumer's network is not configured here yet.
pub const WAITING_FOR_NETWORK: &str = "WaitingForNetwork";

const BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Finalizer(#[from] FinalizerError),
    #[error("no Configuration for consumer {0} here yet: its addresses cannot be translated")]
    NoConfiguration(String),
    #[error("the Configuration of consumer {0} gives no remap: {1}")]
    NoRemap(String, BadConfiguration),
}

struct Ctx {
    client: Client,
    fabric_namespace: String,
    namespaces: Store<Namespace>,
    configurations: Store<Configuration>,
    connections: Store<Connection>,
    leases: Store<Lease>,
    /// Our own real slices (by our managed-by label).
    slices: Store<EndpointSlice>,
    heartbeats: Arc<Mutex<Heartbeats>>,
    events: Events,
}

impl Ctx {
    fn consumer_of(&self, ns: &str) -> Option<String> {
        translate::consumer_of(&*self.namespaces.get(&ObjectRef::new(ns))?)
    }

    fn remaps(&self, consumer: &str) -> Result<Remaps, Error> {
        let cfg = self
            .configurations
            .get(&ObjectRef::new(consumer).within(&self.fabric_namespace))
            .filter(|c| c.spec.cluster_id == consumer)
            .ok_or_else(|| Error::NoConfiguration(consumer.to_owned()))?;
        Remaps::of(&cfg).map_err(|e| match e {
            BadConfiguration::NotGranted(_) => Error::NoConfiguration(consumer.to_owned()),
            e => Error::NoRemap(consumer.to_owned(), e),
        })
    }

    fn heartbeat(&self, consumer: &str) -> Heartbeat {
        let tenant = tenant_namespace(consumer);
        let lease = self
            .leases
            .get(&ObjectRef::new(lease::CONSUMER).within(&tenant));
        let still = self
            .heartbeats
            .lock()
            .expect("heartbeats poisoned")
            .still_for(&tenant, Instant::now());
        translate::heartbeat(lease.as_deref(), still)
    }
}

async fn apply(shadow: Arc<ShadowEndpointSlice>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = shadow.namespace().unwrap_or_default();
    let name = endpoint_slice::reflected(&shadow.name_any());
    let Some(consumer) = ctx.consumer_of(&ns) else {
        let note = format!(
            "namespace {ns} is not a consumer's twin or tenant namespace: no EndpointSlice is written for it"
        );
        ctx.events
            .publish(
                &*shadow,
                &Event::warning("NotAConsumerNamespace", "Translate", note),
            )
            .await;
        return Ok(Action::await_change());
    };
    let remaps = match ctx.remaps(&consumer) {
        Ok(r) => r,
        Err(e) => {
            // Said on the shadow, where whoever looks for the missing endpoints looks.
            let ev = match &e {
                Error::NoConfiguration(_) => {
                    Event::normal(WAITING_FOR_NETWORK, "Translate", e.to_string())
                }
                _ => Event::warning("BadConfiguration", "Translate", e.to_string()),
            };
            ctx.events.publish(&*shadow, &ev).await;
            return Err(e);
        }
    };
    let tunnel_up = translate::alive(&consumer, ctx.connections.state().iter().map(|c| &**c));
    let heartbeat = ctx.heartbeat(&consumer);
    let liveness = translate::liveness(tunnel_up, heartbeat);
    let alive = liveness.is_ok();
    let Translated { slice, refused } = translate::real_slice(&shadow, &remaps, alive);
    let slices: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), &ns);
    // Our own slices are cached (by our label): one known there is ours and, if it already
    // says what the shadow says, wants no write at all. Only a name not in the cache is looked
    // up, so that a slice someone else wrote under that name is never taken over.
    let cached = ctx.slices.get(&ObjectRef::new(&name).within(&ns));
    if cached
        .as_ref()
        .is_some_and(|c| translate::written(c, &slice))
    {
        return said(&ctx, &shadow, &consumer, &refused, liveness).await;
    }
    let theirs = match cached {
        Some(_) => None,
        None => slices.get_opt(&name).await?.filter(|s| !translate::ours(s)),
    };
    if let Some(theirs) = theirs {
        let note = format!(
            "EndpointSlice {ns}/{name} exists and is not the fabric's (managed by {:?}): left alone",
            theirs.labels().get(MANAGED_BY)
        );
        ctx.events
            .publish(&*shadow, &Event::warning("NotOurs", "Translate", note))
            .await;
        return Ok(Action::await_change());
    }
    let pp = PatchParams::apply(field_manager::SHADOW_ENDPOINT_SLICE).force();
    slices.patch(&name, &pp, &Patch::Apply(&slice)).await?;
    debug!(slice = %format!("{ns}/{name}"), consumer, alive, refused = refused.len(), "EndpointSlice written");
    said(&ctx, &shadow, &consumer, &refused, liveness).await
}

/// The Events that say what the written (or already right) slice leaves out and why.
async fn said(
    ctx: &Ctx,
    shadow: &ShadowEndpointSlice,
    consumer: &str,
    refused: &[Refused],
    liveness: Result<(), NotVouched>,
) -> Result<Action, Error> {
    if !refused.is_empty() {
        let list: Vec<String> = refused
            .iter()
            .map(|r| format!("{}: {}", r.address, r.why))
            .collect();
        let note = format!(
            "addresses refused (not consumer {consumer}'s pod or external addresses), left out of the EndpointSlice: {}",
            list.join("; ")
        );
        ctx.events
            .publish(shadow, &Event::warning("AddressRefused", "Translate", note))
            .await;
    }
    if let Err(why) = liveness {
        let note = format!("consumer {consumer}'s endpoints are not ready here: {why}");
        ctx.events
            .publish(shadow, &Event::warning(why.reason(), "Translate", note))
            .await;
    }
    Ok(Action::await_change())
}

async fn cleanup(shadow: Arc<ShadowEndpointSlice>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = shadow.namespace().unwrap_or_default();
    let name = endpoint_slice::reflected(&shadow.name_any());
    let slices: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), &ns);
    if let Some(s) = slices.get_opt(&name).await?.filter(translate::ours)
        && meta::delete(&slices, &name, &meta::only_uid(s.uid(), None)).await?
            == meta::Deleted::Asked
    {
        info!(slice = %format!("{ns}/{name}"), "its ShadowEndpointSlice went: EndpointSlice deleted");
    }
    Ok(Action::await_change())
}

async fn reconcile(shadow: Arc<ShadowEndpointSlice>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let api: Api<ShadowEndpointSlice> =
        Api::namespaced(ctx.client.clone(), &shadow.namespace().unwrap_or_default());
    let c = ctx.clone();
    finalized(
        &api,
        finalizer::SHADOW_ENDPOINT_SLICE,
        shadow,
        |s| apply(s, c),
        |s| cleanup(s, ctx),
    )
    .await
}

/// The shadows of the consumer a Configuration or Connection named `consumer` is about.
fn of_consumer(
    shadows: &Store<ShadowEndpointSlice>,
    namespaces: &Store<Namespace>,
    consumer: &str,
) -> Vec<ObjectRef<ShadowEndpointSlice>> {
    shadows
        .state()
        .iter()
        .filter(|s| {
            s.namespace()
                .and_then(|ns| namespaces.get(&ObjectRef::new(&ns)))
                .and_then(|ns| translate::consumer_of(&ns))
                .is_some_and(|c| c == consumer)
        })
        .map(|s| ObjectRef::from_obj(&**s))
        .collect()
}

/// How often the heartbeats are looked at for one that turned silent.
const SILENCE_CHECK: Duration = Duration::from_secs(5);

/// The Leases of the consumers whose heartbeats turned silent since the last look, every
/// [`SILENCE_CHECK`]: silence is no watch event, so it is made one (their shadows are then
/// translated again, not ready).
fn turned_silent(
    leases: Store<Lease>,
    heartbeats: Arc<Mutex<Heartbeats>>,
) -> impl futures::Stream<Item = Result<Lease, watcher::Error>> + Send + 'static {
    let tick = tokio::time::interval(SILENCE_CHECK);
    use futures::StreamExt as _;
    futures::stream::unfold((tick, BTreeSet::new()), move |(mut tick, before)| {
        let (leases, heartbeats) = (leases.clone(), heartbeats.clone());
        async move {
            tick.tick().await;
            let now = Instant::now();
            let all = leases.state();
            let silent: BTreeSet<String> = {
                let hb = heartbeats.lock().expect("heartbeats poisoned");
                all.iter()
                    .filter_map(|l| l.namespace())
                    .filter(|ns| hb.still_for(ns, now).is_some_and(|d| d >= SILENT_AFTER))
                    .collect()
            };
            let newly: Vec<Result<Lease, watcher::Error>> = all
                .iter()
                .filter(|l| {
                    l.namespace()
                        .is_some_and(|ns| silent.contains(&ns) && !before.contains(&ns))
                })
                .map(|l| Ok((**l).clone()))
                .collect();
            Some((futures::stream::iter(newly), (tick, silent)))
        }
    })
    .flatten()
}

/// Runs the controller until its watches end; `fabric_namespace`: where the Configurations
/// and Connections are.
pub async fn run(client: Client, fabric_namespace: String) -> Result<(), Error> {
    let shadows: Api<ShadowEndpointSlice> = Api::all(client.clone());
    let ours = watcher::Config::default().labels(&format!("{MANAGED_BY}={REFLECTED}"));
    let (written, slices) = cache::touched(Api::<EndpointSlice>::all(client.clone()), ours);
    let (namespaces, _ns_task) = cache::lean(
        Api::<Namespace>::all(client.clone()),
        watcher::Config::default().labels(label::REMOTE_CLUSTER),
        "Namespace",
    );
    let (configurations, configs) = cache::touched(
        Api::<Configuration>::namespaced(client.clone(), &fabric_namespace),
        watcher::Config::default(),
    );
    let (connections, conns) = cache::touched(
        Api::<Connection>::namespaced(client.clone(), &fabric_namespace),
        watcher::Config::default(),
    );
    // Watched cluster-wide by name, as the at-most-once fence does (RBAC cannot narrow
    // namespaces by prefix).
    let (leases, lease_changes) = cache::touched(
        Api::<Lease>::all(client.clone()),
        watcher::Config::default().fields(&format!("metadata.name={}", lease::CONSUMER)),
    );
    let heartbeats = Arc::new(Mutex::new(Heartbeats::default()));
    let lease_changes = futures::stream::select(
        lease_changes,
        turned_silent(leases.clone(), heartbeats.clone()),
    );
    let controller = Controller::new(shadows, watcher::Config::default()).owns_stream(slices);
    let store = controller.store();
    let (s1, n1) = (store.clone(), namespaces.clone());
    let (s2, n2) = (store.clone(), namespaces.clone());
    let (s3, n3, h3) = (store, namespaces.clone(), heartbeats.clone());
    // What each consumer's heartbeat vouched for when its slices were last sent to be
    // translated (by tenant namespace).
    let vouched: Mutex<HashMap<String, Heartbeat>> = Mutex::default();
    let controller = controller
        .watches_stream(configs, move |c: Configuration| {
            of_consumer(&s1, &n1, &c.spec.cluster_id)
        })
        .watches_stream(conns, move |c: Connection| {
            of_consumer(&s2, &n2, &c.spec.cluster_id)
        })
        .watches_stream(lease_changes, move |l: Lease| {
            let tenant = l.namespace().unwrap_or_default();
            // First seen counts as a change now: after this process starts, a silent
            // consumer is taken as silent only once the limit has passed here. (A Lease
            // from `turned_silent` is the same version: nothing noted.)
            let now = Instant::now();
            let still = {
                let mut h = h3.lock().expect("heartbeats poisoned");
                h.observe(
                    &tenant,
                    &l.resource_version().unwrap_or_default(),
                    Duration::ZERO,
                    now,
                );
                h.still_for(&tenant, now)
            };
            let now_says = translate::heartbeat(Some(&l), still);
            let before = vouched
                .lock()
                .expect("vouched poisoned")
                .insert(tenant.clone(), now_says);
            if !translate::vouches_differently(before, now_says) {
                return Vec::new();
            }
            let consumer = n3
                .get(&ObjectRef::new(&tenant))
                .and_then(|ns| translate::consumer_of(&ns));
            consumer.map_or_else(Vec::new, |c| of_consumer(&s3, &n3, &c))
        });
    if namespaces.wait_until_ready().await.is_err() {
        return Ok(());
    }
    let events = Events::new(client.clone(), field_manager::SHADOW_ENDPOINT_SLICE, None);
    let ctx = Arc::new(Ctx {
        client,
        fabric_namespace,
        namespaces,
        configurations,
        connections,
        leases,
        slices: written,
        heartbeats,
        events,
    });
    Runner::new("shadowendpointslices", BACKOFF)
        // A consumer's network not configured here yet: its slices wait for it.
        .waits(|e| matches!(e, Error::NoConfiguration(_)).then_some(Duration::from_secs(5)))
        .run(controller, reconcile, ctx)
        .await;
    Ok(())
}
