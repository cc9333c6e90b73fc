//! The pod kind registered on the reflection framework: the home pods bound to this node
//! reflected into the provider (reached through the identity, a new client whenever the
//! identity Secret changes: [`crate::provider::endpoints`]), resynced when the node's
//! readiness or the remap of the peer's pod CIDR (its Configuration) changes. Two
//! reflections: one pair per twin namespace the provider has made (started and stopped as
//! its NamespaceMap says), and the tenant pair for the pods of namespaces not offloaded
//! ([`super::twins`]).
use std::{collections::BTreeMap, sync::Arc, time::Duration};

use anyhow::Result;
use fabric_api::{names, networking::v1alpha1::Configuration, offloading::v1alpha1::Storage};
use fabric_kube::events::Events;
use fabric_reflector::{
    Metrics, Options, Pair, Reachability, Reflection, custom::Customs, mirror::Mirror,
};
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use tokio::{sync::watch, task::JoinHandle};
use tracing::{info, warn};

use crate::{
    conditions::Readiness,
    configs::{self, ConfigMaps, Secrets},
    endpointslices::EndpointSlices,
    networkpolicies::NetworkPolicies,
    services::Services,
    storage::Claims,
};

use super::{
    kind::{Placement, Pods},
    translate::{self, Remap, Untranslatable},
    twins::{self, Twins},
};

/// Pods synced at the same time (each a few calls to either API).
const SYNCS: usize = 32;
/// ConfigMaps, Secrets, and Services, synced at the same time per twin.
const CONFIG_SYNCS: usize = 4;

#[derive(Debug, Clone)]
pub struct Opts {
    pub node_name: String,
    /// The node's address: every offloaded pod's hostIP.
    pub node_ip: String,
    /// The provider's cluster id: the name of its Configuration.
    pub provider_id: String,
    /// Where the peer's Configuration is.
    pub fabric_namespace: String,
    /// How often every pod is looked at again (a ShadowPod deleted while the provider's
    /// watch was down, a quota that freed up).
    pub resync: Duration,
    /// Where the home API server listens on this cluster's network, if offloaded pods are to
    /// reach it ([`crate::home_api`]).
    pub home_api_address: Option<std::net::SocketAddrV4>,
    /// The virtual StorageClass ([`crate::storage`]).
    pub storage_class: String,
    /// The custom kinds reflected into twins, spec out and status back
    /// ([`fabric_reflector::custom`]).
    pub reflect: Vec<kube::discovery::ApiResource>,
    /// Where the provider's refusals of those kinds are reported (the node's conditions).
    pub refusals: fabric_reflector::custom::Refusals,
}

/// Whether the provider answers, as the node's readiness says (not known before the node
/// loop has said it once).
fn reachability(ready: &Option<Readiness>) -> Reachability {
    match ready {
        None => Reachability::Unknown,
        Some(r) if r.ready => Reachability::Reachable,
        Some(_) => Reachability::Unreachable,
    }
}

/// [`reachability`] of every readiness `ready` says.
fn follow_reachability(
    mut ready: watch::Receiver<Option<Readiness>>,
) -> watch::Receiver<Reachability> {
    let (tx, rx) = watch::channel(reachability(&ready.borrow_and_update()));
    tokio::spawn(async move {
        while ready.changed().await.is_ok() {
            let now = reachability(&ready.borrow_and_update());
            tx.send_if_modified(|r| std::mem::replace(r, now) != now);
        }
    });
    rx
}

/// The remap of every Configuration `config` says, computed once per change of it and sent
/// when it changes (the pods are looked at again then, not on every status update of the
/// Configuration). A Configuration that gives none is said in the log once, and in the
/// status of every pod whose address it leaves out.
pub(crate) fn follow_remap(
    mut config: watch::Receiver<Option<Configuration>>,
) -> watch::Receiver<Result<Remap, Untranslatable>> {
    let (tx, rx) = watch::channel(Err(Untranslatable::NoRemap));
    tokio::spawn(async move {
        loop {
            let now = translate::current(config.borrow_and_update().as_ref());
            tx.send_if_modified(|r| {
                if *r == now {
                    return false;
                }
                match &now {
                    Ok(r) => info!(real = %r.real, seen = %r.seen, "the provider's pod CIDR remap"),
                    Err(e @ Untranslatable::BadConfiguration(_)) => {
                        warn!(error = %e, "no remap of the provider's pod CIDR")
                    }
                    Err(_) => {}
                }
                *r = now;
                true
            });
            if config.changed().await.is_err() {
                return;
            }
        }
    });
    rx
}

/// Reflects the pods bound to the node until a reflector ends (it does not).
pub async fn run(
    local: Client,
    opts: Opts,
    secret: watch::Receiver<Option<Secret>>,
    ready: watch::Receiver<Option<Readiness>>,
    storage: watch::Receiver<Option<Storage>>,
    metrics: Arc<Metrics>,
) -> Result<()> {
    let endpoints = crate::provider::endpoints(secret, opts.provider_id.clone());
    let config = fabric_kube::cache::follow(
        Api::<Configuration>::namespaced(local.clone(), &opts.fabric_namespace),
        &opts.provider_id,
    );
    let events = Events::new(
        local.clone(),
        names::field_manager::VIRTUAL_KUBELET,
        Some(opts.node_name.clone()),
    );
    let remap = follow_remap(config);
    let twins = twins::follow(
        twins::follow_offloaded(local.clone()),
        twins::follow_mapped(endpoints.clone()),
    );
    let home_api = match opts.home_api_address {
        Some(address) => Some(crate::home_api::follow(
            local.clone(),
            opts.fabric_namespace.clone(),
            address,
            endpoints.clone(),
            twins.clone(),
        )),
        None => {
            crate::home_api::withdraw(
                local.clone(),
                opts.fabric_namespace.clone(),
                endpoints.clone(),
                twins.clone(),
            );
            None
        }
    };
    let pods = |placement| Pods {
        home_api: home_api.clone(),
        placement,
        twins: twins.clone(),
        node_name: opts.node_name.clone(),
        node_ip: opts.node_ip.clone(),
        ready: ready.clone(),
        remap: remap.clone(),
        made: Default::default(),
    };
    let options = Options::new(SYNCS, opts.resync)
        .resync_on(remap.clone())
        .resync_on(ready.clone());
    let reachability = follow_reachability(ready.clone());
    let mut tenant = Reflection::new(
        local.clone(),
        events.clone(),
        metrics.clone(),
        endpoints.clone(),
        reachability.clone(),
    );
    tenant.register(
        pods(Placement::Tenant),
        options.clone().resync_on(twins.clone()),
    );
    tenant.start(Pair::everywhere_to_tenant());
    // What the node's pods reference decides which ConfigMaps and Secrets go to the twins:
    // no twin pair starts before it is known (a mirror deletes what its forge does not
    // reflect).
    let referenced = configs::refs::follow(local.clone(), &opts.node_name);
    let events_home = {
        let (local, endpoints) = (local.clone(), endpoints.clone());
        move |home: &str, remote: &str| {
            tokio::spawn(crate::events::follow(
                local.clone(),
                home.to_owned(),
                remote.to_owned(),
                endpoints.clone(),
            ))
        }
    };
    // What NetworkPolicies' peers select at home, and where those pods run.
    let inventory = crate::networkpolicies::follow(local.clone(), twins.clone());
    let mut twin = Reflection::new(local, events, metrics, endpoints, reachability);
    let configs = Options::new(CONFIG_SYNCS, opts.resync).resync_on(referenced.clone());
    let twin_options = match &home_api {
        Some(h) => options.resync_on(h.clone()),
        None => options,
    };
    twin.register(pods(Placement::Twin), twin_options)
        .register(Mirror(ConfigMaps(referenced.clone())), configs.clone())
        .register(Mirror(Secrets(referenced.clone())), configs);
    twin.register(Mirror(Services), Options::new(CONFIG_SYNCS, opts.resync))
        .register(
            Mirror(EndpointSlices {
                node_name: opts.node_name.clone(),
            }),
            Options::new(CONFIG_SYNCS, opts.resync),
        )
        .register(
            Mirror(NetworkPolicies {
                node_name: opts.node_name.clone(),
                inventory: inventory.clone(),
            }),
            Options::new(CONFIG_SYNCS, opts.resync).resync_on(inventory.clone()),
        )
        .register(
            Claims {
                node_name: opts.node_name.clone(),
                class: opts.storage_class.clone(),
                storage: storage.clone(),
            },
            Options::new(CONFIG_SYNCS, opts.resync).resync_on(storage),
        );
    for resource in &opts.reflect {
        twin.register(
            Customs::new(resource.clone()).reporting(opts.refusals.clone()),
            Options::new(CONFIG_SYNCS, opts.resync),
        );
    }
    let twin = Arc::new(twin);
    let pairs = twin.clone();
    tokio::spawn(async move {
        let (mut known, mut peers) = (referenced, inventory);
        // Nor before the peers of NetworkPolicies are known: a policy forged from no pods
        // would narrow, then widen again.
        if known.wait_for(Option::is_some).await.is_ok()
            && peers.wait_for(Option::is_some).await.is_ok()
        {
            follow_twins(pairs, twins, events_home).await;
        }
    });
    tokio::select! {
        why = tenant.failure() => anyhow::bail!("{why}"),
        why = twin.failure() => anyhow::bail!("{why}"),
    }
}

/// Runs a pair of the twin reflection for each twin the provider has made, as long as it
/// has it, and brings its Events home (`events_home` starts that).
async fn follow_twins(
    reflection: Arc<Reflection>,
    mut twins: watch::Receiver<Twins>,
    events_home: impl Fn(&str, &str) -> JoinHandle<()>,
) {
    let mut running: BTreeMap<String, String> = BTreeMap::new();
    let mut events: BTreeMap<String, JoinHandle<()>> = BTreeMap::new();
    loop {
        let want = twins.borrow_and_update().accepted();
        for (home, remote) in &running {
            if want.get(home) != Some(remote) {
                info!(
                    home,
                    remote, "twin namespace gone: its pods are no longer reflected there"
                );
                reflection.stop(&Pair::namespaces(home, remote)).await;
                if let Some(t) = events.remove(home) {
                    t.abort();
                }
            }
        }
        for (home, remote) in &want {
            if reflection.start(Pair::namespaces(home, remote)) {
                info!(
                    home,
                    remote, "reflecting the pods of an offloaded namespace into its twin"
                );
                events.insert(home.clone(), events_home(home, remote));
            }
        }
        running = want;
        if twins.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_provider_answers_as_the_node_is_ready() {
        assert_eq!(reachability(&None), Reachability::Unknown);
        let r = |ready| {
            Some(Readiness {
                ready,
                ..Default::default()
            })
        };
        assert_eq!(reachability(&r(true)), Reachability::Reachable);
        assert_eq!(reachability(&r(false)), Reachability::Unreachable);
    }

    #[tokio::test]
    async fn the_remap_changes_when_the_configuration_gives_another() {
        use fabric_api::networking::v1alpha1::{
            ClusterCidrs, ConfigurationSpec, ConfigurationStatus,
        };

        let cfg = |seen: &str, generation: i64| {
            let cidrs = |pod: &str| ClusterCidrs {
                pod: pod.parse().unwrap(),
                external: "10.70.0.0/16".parse().unwrap(),
            };
            let mut c = Configuration::new(
                "b",
                ConfigurationSpec {
                    cluster_id: "b".into(),
                    remote: cidrs("10.244.0.0/16"),
                },
            );
            c.status = Some(ConfigurationStatus {
                remote: Some(cidrs(seen)),
                observed_generation: Some(generation),
                ..Default::default()
            });
            c
        };
        let (tx, config) = watch::channel(None);
        let mut remap = follow_remap(config);
        assert_eq!(*remap.borrow_and_update(), Err(Untranslatable::NoRemap));
        tx.send_replace(Some(cfg("10.71.0.0/16", 1)));
        remap.changed().await.unwrap();
        let first = remap.borrow_and_update().clone().unwrap();
        assert_eq!(first.seen, "10.71.0.0/16".parse().unwrap());
        // Another status of the same remap is not a change; a bad one (a grant not the real
        // CIDR's size) is, and says why.
        tx.send_replace(Some(cfg("10.71.0.0/16", 2)));
        // (The test's runtime has one thread: the follower runs while this one yields.)
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
        assert!(!remap.has_changed().unwrap());
        tx.send_replace(Some(cfg("10.71.0.0/24", 3)));
        remap.changed().await.unwrap();
        assert!(matches!(
            *remap.borrow_and_update(),
            Err(Untranslatable::BadConfiguration(_))
        ));
        assert!(!remap.has_changed().unwrap());
    }
}
