//! The provider's ShadowNetworkPolicy controller (I/O edge of [`super::translate`]): from
//! watch caches of ShadowNetworkPolicies, of the real NetworkPolicies it writes (by our
//! managed-by label), of the consumers' namespaces (who a shadow's consumer is, which
//! namespaces are that consumer's: a twin made or gone re-translates that consumer's
//! policies) and of the Configurations in the fabric's namespace (how the consumer's
//! addresses are seen here: a change re-translates its policies). The real policy is
//! server-side applied under one field manager, never over a policy that is not ours (the
//! provider's admin's), and deleted with its shadow (a finalizer: the test API server, like
//! some clusters, runs no garbage collector). What is refused is said in a Warning Event on
//! the shadow.
use std::{sync::Arc, time::Duration};

use fabric_api::{
    names::{
        field_manager, finalizer, label,
        network_policy::{MANAGED_BY, REFLECTED},
    },
    networking::{
        remap::{BadConfiguration, Remaps},
        v1alpha1::Configuration,
    },
    offloading::v1alpha1::ShadowNetworkPolicy,
};
use fabric_kube::{
    cache,
    controller::{Backoff, FinalizerError, Runner, finalized},
    events::{Event, Events},
    meta,
};
use k8s_openapi::api::{core::v1::Namespace, networking::v1::NetworkPolicy};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        reflector::{ObjectRef, Store},
        watcher,
    },
};
use tracing::{debug, info};

use super::translate::{self, ClusterDns, Translated};
use crate::endpointslices::{controller::WAITING_FOR_NETWORK, translate::consumer_of};

/// The Event reason of what a consumer's policy asked for and was refused here.
pub const REFUSED: &str = "PolicyPartlyRefused";

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
    /// Our own real policies (by our managed-by label).
    policies: Store<NetworkPolicy>,
    events: Events,
    dns: ClusterDns,
}

impl Ctx {
    fn consumer_of(&self, ns: &str) -> Option<String> {
        consumer_of(&*self.namespaces.get(&ObjectRef::new(ns))?)
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
}

async fn apply(shadow: Arc<ShadowNetworkPolicy>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = shadow.namespace().unwrap_or_default();
    let name = shadow.name_any();
    let Some(consumer) = ctx.consumer_of(&ns) else {
        let note = format!(
            "namespace {ns} is not a consumer's twin or tenant namespace: no NetworkPolicy is written for it"
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
    let ours = |n: &str| ctx.consumer_of(n).as_deref() == Some(consumer.as_str());
    let Translated { policy, refused } = translate::real_policy(&shadow, &remaps, &ours, &ctx.dns);
    let api: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), &ns);
    // Ours are cached (by our label): one known there is ours and, if it already says what
    // the shadow says, wants no write. Only a name not in the cache is looked up, so that a
    // policy the provider's admin wrote under that name is never taken over.
    let cached = ctx.policies.get(&ObjectRef::new(&name).within(&ns));
    if !cached
        .as_ref()
        .is_some_and(|c| translate::written(c, &policy))
    {
        let theirs = match cached {
            Some(_) => None,
            None => api.get_opt(&name).await?.filter(|p| !translate::ours(p)),
        };
        if theirs.is_some() {
            let note =
                format!("NetworkPolicy {ns}/{name} exists and is not the fabric's: left alone");
            ctx.events
                .publish(&*shadow, &Event::warning("NotOurs", "Translate", note))
                .await;
            return Ok(Action::await_change());
        }
        let pp = PatchParams::apply(field_manager::SHADOW_NETWORK_POLICY).force();
        api.patch(&name, &pp, &Patch::Apply(&policy)).await?;
        debug!(policy = %format!("{ns}/{name}"), consumer, refused = refused.len(), "NetworkPolicy written");
    }
    if !refused.is_empty() {
        let note = format!(
            "consumer {consumer}'s policy is narrower here: {}",
            refused.join("; ")
        );
        ctx.events
            .publish(&*shadow, &Event::warning(REFUSED, "Translate", note))
            .await;
    }
    Ok(Action::await_change())
}

async fn cleanup(shadow: Arc<ShadowNetworkPolicy>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = shadow.namespace().unwrap_or_default();
    let name = shadow.name_any();
    let api: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), &ns);
    if let Some(p) = api.get_opt(&name).await?.filter(translate::ours)
        && meta::delete(&api, &name, &meta::only_uid(p.uid(), None)).await? == meta::Deleted::Asked
    {
        info!(policy = %format!("{ns}/{name}"), "its ShadowNetworkPolicy went: NetworkPolicy deleted");
    }
    Ok(Action::await_change())
}

async fn reconcile(shadow: Arc<ShadowNetworkPolicy>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let api: Api<ShadowNetworkPolicy> =
        Api::namespaced(ctx.client.clone(), &shadow.namespace().unwrap_or_default());
    let c = ctx.clone();
    finalized(
        &api,
        finalizer::SHADOW_NETWORK_POLICY,
        shadow,
        |s| apply(s, c),
        |s| cleanup(s, ctx),
    )
    .await
}

/// The shadows of consumer `consumer`.
fn of_consumer(
    shadows: &Store<ShadowNetworkPolicy>,
    namespaces: &Store<Namespace>,
    consumer: &str,
) -> Vec<ObjectRef<ShadowNetworkPolicy>> {
    shadows
        .state()
        .iter()
        .filter(|s| {
            s.namespace()
                .and_then(|ns| namespaces.get(&ObjectRef::new(&ns)))
                .and_then(|ns| consumer_of(&ns))
                .is_some_and(|c| c == consumer)
        })
        .map(|s| ObjectRef::from_obj(&**s))
        .collect()
}

/// Runs the controller until its watches end; `fabric_namespace`: where the Configurations
/// are.
/// Runs the controller; `dns` is where this cluster's DNS pods are (see [`ClusterDns`]).
pub async fn run(client: Client, fabric_namespace: String, dns: ClusterDns) -> Result<(), Error> {
    let shadows: Api<ShadowNetworkPolicy> = Api::all(client.clone());
    let ours = watcher::Config::default().labels(&format!("{MANAGED_BY}={REFLECTED}"));
    let (written, policies) = cache::touched(Api::<NetworkPolicy>::all(client.clone()), ours);
    // The store fills on its own (it is awaited below, before the controller polls
    // anything); the changes come from a watch of their own.
    let consumers = watcher::Config::default().labels(label::REMOTE_CLUSTER);
    let (namespaces, _ns_task) = cache::lean(
        Api::<Namespace>::all(client.clone()),
        consumers.clone(),
        "Namespace",
    );
    let ns_changes = watcher::watcher(Api::<Namespace>::all(client.clone()), consumers)
        .default_backoff()
        .applied_objects();
    let (configurations, configs) = cache::touched(
        Api::<Configuration>::namespaced(client.clone(), &fabric_namespace),
        watcher::Config::default(),
    );
    let controller = Controller::new(shadows, watcher::Config::default()).owns_stream(policies);
    let store = controller.store();
    let (s1, n1) = (store.clone(), namespaces.clone());
    let (s2, n2) = (store, namespaces.clone());
    let controller = controller
        .watches_stream(configs, move |c: Configuration| {
            of_consumer(&s1, &n1, &c.spec.cluster_id)
        })
        // A twin made or gone: a peer naming it is allowed, or no longer.
        .watches_stream(ns_changes, move |n: Namespace| {
            consumer_of(&n).map_or_else(Vec::new, |c| of_consumer(&s2, &n2, &c))
        });
    if namespaces.wait_until_ready().await.is_err() {
        return Ok(());
    }
    let events = Events::new(client.clone(), field_manager::SHADOW_NETWORK_POLICY, None);
    let ctx = Arc::new(Ctx {
        client,
        fabric_namespace,
        namespaces,
        configurations,
        policies: written,
        events,
        dns,
    });
    Runner::new("shadownetworkpolicies", BACKOFF)
        .waits(|e| matches!(e, Error::NoConfiguration(_)).then_some(Duration::from_secs(5)))
        .run(controller, reconcile, ctx)
        .await;
    Ok(())
}
