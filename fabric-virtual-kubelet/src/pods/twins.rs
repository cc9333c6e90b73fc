//! Where each home pod's ShadowPod goes (issue 20): into the twin of its namespace on the
//! provider, under the pod's own name, when the namespace is offloaded there; into the tenant
//! namespace as `<namespace>.<name>` (pod by pod, as before namespaces were offloaded) when its
//! namespace is not offloaded at all. Two reflections of the pod kind run side by side: one
//! pair per twin the provider has accepted, and the tenant pair for everything else. Which of
//! them looks after a pod is decided here, purely, from what this process knows ([`Twins`]):
//! the home NamespaceOffloadings and the provider's answer in its NamespaceMap. A pod already
//! offloaded into the tenant namespace stays there until it ends (its namespace offloaded
//! later does not move it); the twin pair then never makes a second ShadowPod for it
//! ([`super::act`] looks before it creates).
use std::collections::{BTreeMap, BTreeSet};

use fabric_api::offloading::v1alpha1::{
    MappingPhase, NamespaceMap, NamespaceOffloading, TwinStatus,
};
use fabric_reflector::Endpoint;
use futures::StreamExt;
use kube::{
    Api, Client, ResourceExt,
    runtime::{WatchStreamExt, reflector, watcher},
};
use tokio::sync::watch;
use tracing::warn;

/// What this process knows of the namespaces offloaded to its provider.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Twins {
    /// The home namespaces that have a NamespaceOffloading (being deleted included); `None`:
    /// not listed yet.
    pub offloaded: Option<BTreeSet<String>>,
    /// The provider's answer for each home namespace mapped there; `None`: not read yet.
    pub mapped: Option<BTreeMap<String, TwinStatus>>,
}

impl Twins {
    /// The twins the provider has made: home namespace → twin.
    pub fn accepted(&self) -> BTreeMap<String, String> {
        self.mapped
            .iter()
            .flatten()
            .filter(|(_, t)| t.phase == MappingPhase::Accepted)
            .map(|(home, t)| (home.clone(), t.remote.clone()))
            .collect()
    }

    /// Who looks after the not-yet-placed pods of home namespace `ns` in the tenant pair.
    pub fn route(&self, ns: &str) -> Route {
        let Some(offloaded) = &self.offloaded else {
            return Route::Unknown;
        };
        if !offloaded.contains(ns) {
            return Route::Tenant;
        }
        let Some(mapped) = &self.mapped else {
            return Route::Unknown;
        };
        match mapped.get(ns) {
            Some(t) if t.phase == MappingPhase::Accepted => Route::Twin,
            Some(t) => Route::NoTwin(match (&t.reason, &t.message) {
                (_, Some(m)) => format!(
                    "the provider has no twin of namespace {ns} ({:?}): {m}",
                    t.phase
                ),
                (Some(r), None) => format!(
                    "the provider has no twin of namespace {ns} ({:?}, {r})",
                    t.phase
                ),
                _ => format!("the provider has no twin of namespace {ns} ({:?})", t.phase),
            }),
            None => Route::NoTwin(format!(
                "namespace {ns} is offloaded, and the provider has made no twin of it yet (see its NamespaceOffloading)"
            )),
        }
    }
}

/// Where the pods of a namespace go, as the tenant pair sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Not known yet (a restarted process before its first listings): decide nothing.
    Unknown,
    /// Not offloaded: pod by pod into the tenant namespace.
    Tenant,
    /// Offloaded and its twin exists: the twin pair's.
    Twin,
    /// Offloaded, without a twin on this provider: pods wait, saying why; those that ran in
    /// a twin now gone fail (their controllers re-create them).
    NoTwin(String),
}

/// Every namespace that has a NamespaceOffloading at home, as the watch sees them.
pub fn follow_offloaded(local: Client) -> watch::Receiver<Option<BTreeSet<String>>> {
    let (tx, rx) = watch::channel(None);
    let (store, writer) = reflector::store::<NamespaceOffloading>();
    let stream = reflector::reflector(
        writer,
        watcher(
            Api::<NamespaceOffloading>::all(local),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .touched_objects();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let ready = store.wait_until_ready();
        let mut ready = std::pin::pin!(ready);
        let mut listed = false;
        loop {
            tokio::select! {
                r = &mut ready, if !listed => {
                    if r.is_err() {
                        return;
                    }
                    listed = true;
                }
                ev = stream.next() => match ev {
                    None => return,
                    Some(Err(e)) => {
                        warn!(error = %e, "watching NamespaceOffloadings");
                        continue;
                    }
                    Some(Ok(_)) => {}
                },
            }
            if !listed {
                continue;
            }
            let now: BTreeSet<String> =
                store.state().iter().filter_map(|o| o.namespace()).collect();
            tx.send_if_modified(|v| {
                let changed = v.as_ref() != Some(&now);
                *v = Some(now);
                changed
            });
        }
    });
    rx
}

/// The provider's answer in this cluster's NamespaceMap (named after it, in the tenant
/// namespace), followed through whichever identity `endpoint` holds: `Some(empty)` once the
/// provider says there is none.
pub fn follow_mapped(
    mut endpoint: watch::Receiver<Option<Endpoint>>,
) -> watch::Receiver<Option<BTreeMap<String, TwinStatus>>> {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        loop {
            let current = endpoint.borrow_and_update().clone();
            let Some(ep) = current else {
                if endpoint.changed().await.is_err() {
                    return;
                }
                continue;
            };
            let api: Api<NamespaceMap> = Api::default_namespaced(ep.client.clone());
            let stream = watcher::watch_object(api, ep.marks.origin()).default_backoff();
            let mut stream = std::pin::pin!(stream);
            loop {
                tokio::select! {
                    changed = endpoint.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        break;
                    }
                    ev = stream.next() => match ev {
                        None => break,
                        Some(Err(e)) => warn!(error = %e, "watching the provider's NamespaceMap"),
                        Some(Ok(map)) => {
                            let now: BTreeMap<String, TwinStatus> = map
                                .and_then(|m| m.status)
                                .map(|s| s.namespaces)
                                .unwrap_or_default()
                                .into_iter()
                                .map(|t| (t.home.clone(), t))
                                .collect();
                            tx.send_if_modified(|v| {
                                let changed = v.as_ref() != Some(&now);
                                *v = Some(now);
                                changed
                            });
                        }
                    },
                }
            }
        }
    });
    rx
}

/// [`Twins`] from both followers, sent when either changes.
pub fn follow(
    mut offloaded: watch::Receiver<Option<BTreeSet<String>>>,
    mut mapped: watch::Receiver<Option<BTreeMap<String, TwinStatus>>>,
) -> watch::Receiver<Twins> {
    let (tx, rx) = watch::channel(Twins::default());
    tokio::spawn(async move {
        loop {
            let now = Twins {
                offloaded: offloaded.borrow_and_update().clone(),
                mapped: mapped.borrow_and_update().clone(),
            };
            tx.send_if_modified(|v| {
                let changed = *v != now;
                *v = now;
                changed
            });
            tokio::select! {
                r = offloaded.changed() => if r.is_err() { return },
                r = mapped.changed() => if r.is_err() { return },
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn twin(home: &str, phase: MappingPhase, reason: Option<&str>) -> TwinStatus {
        TwinStatus {
            home: home.into(),
            remote: format!("{home}-a"),
            phase,
            reason: reason.map(str::to_owned),
            message: None,
        }
    }

    fn twins(offloaded: Option<&[&str]>, mapped: Option<Vec<TwinStatus>>) -> Twins {
        Twins {
            offloaded: offloaded.map(|o| o.iter().map(|s| (*s).to_owned()).collect()),
            mapped: mapped.map(|m| m.into_iter().map(|t| (t.home.clone(), t)).collect()),
        }
    }

    #[test]
    fn nothing_is_routed_before_the_listings_and_unoffloaded_namespaces_go_pod_by_pod() {
        assert_eq!(twins(None, None).route("shop"), Route::Unknown);
        assert_eq!(twins(Some(&[]), None).route("shop"), Route::Tenant);
        assert_eq!(twins(Some(&["shop"]), None).route("shop"), Route::Unknown);
        assert_eq!(twins(Some(&["shop"]), None).route("other"), Route::Tenant);
    }

    #[test]
    fn an_offloaded_namespace_goes_to_its_twin_or_waits_saying_why() {
        let t = twins(
            Some(&["shop", "db", "new"]),
            Some(vec![
                twin("shop", MappingPhase::Accepted, None),
                twin("db", MappingPhase::Refused, Some("NamespaceExists")),
            ]),
        );
        assert_eq!(t.route("shop"), Route::Twin);
        let Route::NoTwin(why) = t.route("db") else {
            panic!()
        };
        assert!(
            why.contains("Refused") && why.contains("NamespaceExists"),
            "{why}"
        );
        let Route::NoTwin(why) = t.route("new") else {
            panic!()
        };
        assert!(why.contains("no twin of it yet"), "{why}");
        assert_eq!(
            t.accepted(),
            BTreeMap::from([("shop".to_owned(), "shop-a".to_owned())])
        );
    }
}
