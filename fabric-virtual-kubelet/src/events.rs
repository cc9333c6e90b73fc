//! Events of a twin namespace brought home (issue 20): what the provider's kubelet, scheduler
//! and controllers say about an offloaded pod, or an object reflected for it (ConfigMaps,
//! Secrets, Services, claims, EndpointSlices), is recorded at home on the home object, as `kubectl describe` shows it. Updates come too
//! (★ the series count and last time of a repeated Event, not only its first occurrence).
//! [`forge`] is pure; [`follow`] watches one twin and writes home.
use std::collections::BTreeMap;

use fabric_api::names::label;
use fabric_reflector::Endpoint;
use futures::StreamExt;
use k8s_openapi::api::{
    core::v1::{ConfigMap, ObjectReference, PersistentVolumeClaim, Pod, Secret, Service},
    discovery::v1::EndpointSlice,
    events::v1::Event,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ApiResource, DynamicObject, ObjectMeta, Patch, PatchParams},
    runtime::{WatchStreamExt, watcher},
};
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::FIELD_MANAGER;

/// The kinds whose Events come home: the home object of the same kind and name (a ShadowPod's
/// stand for its pod's, a ShadowEndpointSlice's for the home EndpointSlice it carries).
pub fn home_kind(kind: &str) -> Option<&'static str> {
    match kind {
        "Pod" | "ShadowPod" => Some("Pod"),
        "ConfigMap" => Some("ConfigMap"),
        "Secret" => Some("Secret"),
        "Service" => Some("Service"),
        "PersistentVolumeClaim" => Some("PersistentVolumeClaim"),
        "ShadowEndpointSlice" => Some("EndpointSlice"),
        _ => None,
    }
}

/// The API of a kind [`home_kind`] names.
fn home_api(kind: &str) -> Option<ApiResource> {
    Some(match kind {
        "Pod" => ApiResource::erase::<Pod>(&()),
        "ConfigMap" => ApiResource::erase::<ConfigMap>(&()),
        "Secret" => ApiResource::erase::<Secret>(&()),
        "Service" => ApiResource::erase::<Service>(&()),
        "PersistentVolumeClaim" => ApiResource::erase::<PersistentVolumeClaim>(&()),
        "EndpointSlice" => ApiResource::erase::<EndpointSlice>(&()),
        _ => return None,
    })
}

/// The home Event standing for `remote` (an Event in the twin of `home_ns` on provider
/// `provider`), about home object `regarding`: the same name, reason, note, type, action,
/// time and series, the reporter named as the provider's.
pub fn forge(remote: &Event, home_ns: &str, regarding: ObjectReference, provider: &str) -> Event {
    let controller = remote.reporting_controller.clone().unwrap_or_default();
    let instance = remote.reporting_instance.clone().unwrap_or_default();
    Event {
        metadata: ObjectMeta {
            name: remote.metadata.name.clone(),
            namespace: Some(home_ns.to_owned()),
            labels: Some(BTreeMap::from([(
                label::REFLECTED_FROM.to_owned(),
                provider.to_owned(),
            )])),
            ..Default::default()
        },
        event_time: remote.event_time.clone(),
        series: remote.series.clone(),
        reporting_controller: Some(if controller.is_empty() {
            format!("{provider}/unknown")
        } else {
            controller
        }),
        reporting_instance: Some(format!("{provider}/{instance}")),
        action: remote.action.clone(),
        reason: remote.reason.clone(),
        regarding: Some(regarding),
        related: None,
        note: remote.note.clone(),
        type_: remote.type_.clone(),
        deprecated_count: remote.deprecated_count,
        deprecated_first_timestamp: remote.deprecated_first_timestamp.clone(),
        deprecated_last_timestamp: remote.deprecated_last_timestamp.clone(),
        deprecated_source: None,
    }
}

/// The home object an Event of the twin is about, if it is one whose Events come home and it
/// exists.
async fn home_object(
    local: &Client,
    home_ns: &str,
    remote: &Event,
) -> kube::Result<Option<ObjectReference>> {
    let Some(r) = &remote.regarding else {
        return Ok(None);
    };
    let (Some(kind), Some(name)) = (r.kind.as_deref().and_then(home_kind), r.name.as_deref())
    else {
        return Ok(None);
    };
    let Some(ar) = home_api(kind) else {
        return Ok(None);
    };
    let api: Api<DynamicObject> = Api::namespaced_with(local.clone(), home_ns, &ar);
    Ok(api.get_opt(name).await?.map(|o| o.object_ref(&ar)))
}

/// Brings the Events of twin `twin` (of home namespace `home_ns`) home, through whichever
/// identity `endpoint` holds, until the task is dropped.
pub async fn follow(
    local: Client,
    home_ns: String,
    twin: String,
    mut endpoint: watch::Receiver<Option<Endpoint>>,
) {
    let home: Api<Event> = Api::namespaced(local.clone(), &home_ns);
    loop {
        let current = endpoint.borrow_and_update().clone();
        let Some(ep) = current else {
            if endpoint.changed().await.is_err() {
                return;
            }
            continue;
        };
        let provider = ep.marks.destination().to_owned();
        let remote: Api<Event> = Api::namespaced(ep.client.clone(), &twin);
        let stream = watcher(remote, watcher::Config::default())
            .default_backoff()
            .applied_objects();
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
                    Some(Err(e)) => warn!(error = %e, twin, "watching the twin's Events"),
                    Some(Ok(ev)) => {
                        if ev.metadata.labels.as_ref().is_some_and(|l| l.contains_key(label::REFLECTED_FROM)) {
                            // Brought there from elsewhere: never brought back.
                            continue;
                        }
                        match home_object(&local, &home_ns, &ev).await {
                            Ok(Some(regarding)) => {
                                let name = ev.name_any();
                                let want = forge(&ev, &home_ns, regarding, &provider);
                                let patch = PatchParams::apply(FIELD_MANAGER.0).force();
                                if let Err(e) = home.patch(&name, &patch, &Patch::Apply(&want)).await {
                                    warn!(error = %e, event = name, "recording a twin's Event at home");
                                } else {
                                    debug!(event = name, twin, "Event home");
                                }
                            }
                            Ok(None) => {}
                            Err(e) => warn!(error = %e, "looking up the home object of a twin's Event"),
                        }
                    }
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::events::v1::EventSeries, apimachinery::pkg::apis::meta::v1::MicroTime, jiff::Timestamp,
    };

    use super::*;

    #[test]
    fn a_twin_s_event_is_recorded_on_the_home_object_with_its_series() {
        let now = MicroTime(Timestamp::now());
        let remote = Event {
            metadata: ObjectMeta {
                name: Some("web.1".into()),
                namespace: Some("shop-a".into()),
                ..Default::default()
            },
            event_time: Some(now.clone()),
            reason: Some("BackOff".into()),
            note: Some("Back-off restarting failed container".into()),
            type_: Some("Warning".into()),
            action: Some("Restarting".into()),
            reporting_controller: Some("kubelet".into()),
            reporting_instance: Some("node-1".into()),
            series: Some(EventSeries {
                count: 7,
                last_observed_time: now.clone(),
            }),
            regarding: Some(ObjectReference {
                kind: Some("Pod".into()),
                name: Some("web".into()),
                namespace: Some("shop-a".into()),
                uid: Some("remote-uid".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let home_ref = ObjectReference {
            kind: Some("Pod".into()),
            name: Some("web".into()),
            namespace: Some("shop".into()),
            uid: Some("home-uid".into()),
            api_version: Some("v1".into()),
            ..Default::default()
        };
        let e = forge(&remote, "shop", home_ref.clone(), "cluster-b");
        assert_eq!(e.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(e.metadata.name.as_deref(), Some("web.1"));
        assert_eq!(e.regarding, Some(home_ref));
        assert_eq!(
            e.series.unwrap().count,
            7,
            "updates come home, not only the first"
        );
        assert_eq!(e.reason.as_deref(), Some("BackOff"));
        assert_eq!(e.reporting_instance.as_deref(), Some("cluster-b/node-1"));
        assert_eq!(
            e.metadata.labels.unwrap()[label::REFLECTED_FROM],
            "cluster-b"
        );
        assert_eq!(home_kind("ShadowPod"), Some("Pod"));
        assert_eq!(home_kind("ShadowEndpointSlice"), Some("EndpointSlice"));
        assert_eq!(home_kind("Deployment"), None);
        for kind in [
            "Pod",
            "ConfigMap",
            "Secret",
            "Service",
            "PersistentVolumeClaim",
        ] {
            let ar = home_api(home_kind(kind).unwrap()).unwrap();
            assert_eq!((ar.kind.as_str(), ar.version.as_str()), (kind, "v1"));
        }
        let slices = home_api("EndpointSlice").unwrap();
        assert_eq!(slices.api_version, "discovery.k8s.io/v1");
    }
}
