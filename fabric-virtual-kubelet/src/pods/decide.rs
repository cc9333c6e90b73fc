//! What the virtual kubelet does about one pod bound to its node, as a pure function of the
//! home pod, what it knows of the pod's ShadowPod on the provider, and whether the provider
//! answers. The I/O edge ([`super::act`]) carries the step out and reports the status
//! [`super::status`] computes.
use std::collections::BTreeMap;

use fabric_api::{names::label, offloading::v1alpha1::ShadowPod};
use fabric_offloading::shadowpod::{forge, resize};
use k8s_openapi::api::core::v1::Pod;

use super::status::{self, OFFLOADED};

/// What the provider holds for a home pod, as far as this process knows.
#[derive(Debug, Clone, Copy)]
pub enum Remote<'a> {
    /// The provider's ShadowPods have not been listed (unreachable since this process
    /// started): nothing may be concluded from their absence.
    Unknown,
    /// Listed, and there is no ShadowPod of that name.
    Absent,
    Present(&'a ShadowPod),
}

impl<'a> Remote<'a> {
    /// From a lookup in the provider's listed ShadowPods (`None`: not listed yet).
    pub fn of(listed: Option<Option<&'a ShadowPod>>) -> Self {
        match listed {
            None => Remote::Unknown,
            Some(None) => Remote::Absent,
            Some(Some(s)) => Remote::Present(s),
        }
    }
}

/// One step towards what the home pod asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing to do on either side beyond reporting the status.
    Report,
    /// Forge the ShadowPod and create it.
    Create,
    /// The ShadowPod's labels or annotations lag behind the home pod's.
    UpdateMetadata,
    /// The home pod's container resources changed (an in-place resize): the ShadowPod's
    /// follow, if the provider's webhook admits what they add.
    Resize,
    /// The home pod is going: delete its ShadowPod gracefully (the provider deletes the real
    /// pod, then the ShadowPod).
    DeleteRemote { grace_seconds: Option<i64> },
    /// A ShadowPod of that name stands for an earlier pod of the same name (a StatefulSet's
    /// replacement, say): it goes first.
    DeleteStale,
    /// The home pod is going and nothing runs for it any more: complete its deletion as a
    /// kubelet does (grace period 0).
    FinishDeletion,
    /// The pod had been offloaded and its ShadowPod is gone: it failed (once confirmed by a
    /// fresh read, never from a cache alone).
    Vanished,
    /// Waiting for the provider (unreachable, or its pod still terminating).
    Wait,
    /// Not this reflection's pod (the twin pair's, or not known yet which): nothing at all,
    /// not even its status.
    Skip,
    /// Its namespace is offloaded and has no twin on the provider: it waits, its status says
    /// why ([`super::twins::Route::NoTwin`]).
    AwaitTwin(String),
    /// Its twin's Service of the home API server has no cluster IP yet: it waits, its status
    /// says why.
    AwaitHomeApi(String),
    /// Under at-most-once, the provider has not had the heartbeat lately: it waits (why).
    AwaitHeartbeat(String),
    /// It ran in its namespace's twin, which is gone: it failed (once a fresh read confirms
    /// it was not offloaded pod by pod instead).
    Aborted(String),
}

/// What the `Offloaded` Event on a home pod of namespace `ns` says: into its namespace's twin
/// (`twin`), or alone into the tenant namespace, without what its namespace holds.
pub fn offloaded_note(shadow_name: &str, ns: &str, twin: bool) -> String {
    if twin {
        return format!("ShadowPod {shadow_name} created on the provider");
    }
    format!(
        "ShadowPod {shadow_name} created in the provider's tenant namespace: namespace {ns} is \
         not offloaded, so the pod runs there alone (its Services, ConfigMaps, Secrets and \
         tokens do not follow it; `fabricctl offload namespace {ns}` makes them follow)"
    )
}

/// Whether the ShadowPod stands for this very pod (not an earlier one of the same name).
pub fn owns(shadow: &ShadowPod, pod: &Pod) -> bool {
    pod.metadata.uid.as_deref() == Some(shadow.spec.home.uid.as_str())
}

pub(crate) fn terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Whether this process declared the pod stopped by the provider (at-most-once).
fn declared_partitioned(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.reason.as_deref())
        .is_some_and(|r| r == status::reason::PARTITIONED)
}

/// Whether a ShadowPod was ever created for this pod (the home status records it).
pub fn offloaded(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.type_ == OFFLOADED
                    && !matches!(
                        c.reason.as_deref(),
                        Some(
                            status::reason::REFUSED
                                | status::reason::FORBIDDEN
                                | status::reason::NO_TWIN
                                | status::reason::NO_TOKEN
                                | status::reason::NO_HOME_API
                                | status::reason::NO_HEARTBEAT
                                | status::reason::NO_VOLUME
                        )
                    )
            })
        })
}

/// The labels and annotations the ShadowPod's real pod should carry for `pod`.
pub fn wanted_metadata(
    pod: &Pod,
    consumer: &str,
) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let mut labels = pod.metadata.labels.clone().unwrap_or_default();
    labels.insert(label::REMOTE_CLUSTER.to_owned(), consumer.to_owned());
    (labels, forge::template_annotations(pod))
}

/// Whether `shadow` stands for no pod at home any more: `home` is the home pod of its name as
/// known (`None`: there is none), and the ShadowPod is not already going.
pub fn orphaned(shadow: &ShadowPod, home: Option<&Pod>) -> bool {
    shadow.metadata.deletion_timestamp.is_none() && !home.is_some_and(|h| owns(shadow, h))
}

pub fn decide(pod: &Pod, remote: Remote<'_>, reachable: bool) -> Step {
    let own = match remote {
        Remote::Present(s) if owns(s, pod) => Some(s),
        _ => None,
    };
    if pod.metadata.deletion_timestamp.is_some() {
        return match (remote, own) {
            (Remote::Unknown, _) => Step::Wait,
            (_, Some(s)) if s.metadata.deletion_timestamp.is_some() => Step::Wait,
            (_, Some(_)) if !reachable => Step::Wait,
            (_, Some(_)) => Step::DeleteRemote {
                grace_seconds: pod.metadata.deletion_grace_period_seconds,
            },
            // Never offloaded, or its ShadowPod is gone: nothing runs for it.
            _ => Step::FinishDeletion,
        };
    }
    if terminal(pod) {
        // Declared stopped while out of reach (at-most-once) and still running there after
        // all (the provider's controller was not running, say): it goes before it runs twice.
        let runs_there = own.is_some_and(|s| {
            s.metadata.deletion_timestamp.is_none()
                && !matches!(
                    s.status.as_ref().and_then(|st| st.phase.as_deref()),
                    Some("Succeeded" | "Failed")
                )
        });
        if declared_partitioned(pod) && reachable && runs_there {
            return Step::DeleteRemote {
                grace_seconds: Some(0),
            };
        }
        // Finished pods stay as they ended; the ShadowPod goes with the home pod.
        return Step::Report;
    }
    match remote {
        Remote::Unknown => Step::Wait,
        Remote::Present(s) if own.is_none() => {
            if s.metadata.deletion_timestamp.is_some() || !reachable {
                Step::Wait
            } else {
                Step::DeleteStale
            }
        }
        Remote::Present(s) => {
            let (labels, annotations) = wanted_metadata(pod, &s.spec.cluster_id);
            let current = (
                s.metadata.labels.clone().unwrap_or_default(),
                s.metadata.annotations.clone().unwrap_or_default(),
            );
            let template = (&s.spec.pod.labels, &s.spec.pod.annotations);
            let drifted = template != (&labels, &annotations)
                || !labels.iter().all(|(k, v)| current.0.get(k) == Some(v));
            let resized = pod
                .spec
                .as_ref()
                .is_some_and(|spec| resize::resized(spec, &s.spec.pod.spec).is_some());
            match (
                reachable && s.metadata.deletion_timestamp.is_none(),
                drifted,
                resized,
            ) {
                (true, true, _) => Step::UpdateMetadata,
                (true, false, true) => Step::Resize,
                _ => Step::Report,
            }
        }
        Remote::Absent if offloaded(pod) => Step::Vanished,
        Remote::Absent if !reachable => Step::Wait,
        Remote::Absent => Step::Create,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use fabric_api::offloading::v1alpha1::{HomePod, PodTemplate, ShadowPodSpec};
    use k8s_openapi::{
        api::core::v1::{PodCondition, PodStatus},
        apimachinery::pkg::apis::meta::v1::Time,
        jiff::Timestamp,
    };
    use serde_json::json;

    use super::*;

    pub fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-1",
                         "labels": {"app": "web"}},
            "spec": {"nodeName": "fabric-b", "containers": [{"name": "main", "image": "echo"}]},
        }))
        .unwrap()
    }

    fn offloaded_pod() -> Pod {
        let mut p = pod();
        p.status = Some(PodStatus {
            phase: Some("Pending".into()),
            conditions: Some(vec![PodCondition {
                type_: OFFLOADED.into(),
                status: "True".into(),
                reason: Some("Created".into()),
                ..Default::default()
            }]),
            ..Default::default()
        });
        p
    }

    pub fn shadow(uid: &str) -> ShadowPod {
        let mut labels = BTreeMap::from([("app".to_owned(), "web".to_owned())]);
        labels.insert(label::REMOTE_CLUSTER.into(), "a".into());
        let mut s = ShadowPod::new(
            "shop.web",
            ShadowPodSpec {
                cluster_id: "a".into(),
                home: HomePod {
                    namespace: "shop".into(),
                    name: "web".into(),
                    uid: uid.into(),
                },
                pod: PodTemplate {
                    labels: labels.clone(),
                    annotations: forge::template_annotations(&pod()),
                    ..Default::default()
                },
            },
        );
        s.metadata.labels = Some(labels);
        s
    }

    fn deleting(mut p: Pod) -> Pod {
        p.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        p.metadata.deletion_grace_period_seconds = Some(30);
        p
    }

    #[test]
    fn a_new_pod_is_offloaded_once() {
        assert_eq!(decide(&pod(), Remote::Absent, true), Step::Create);
        let s = shadow("u-1");
        assert_eq!(decide(&pod(), Remote::Present(&s), true), Step::Report);
        // Restarted, and the provider not listed yet: no blind creation.
        assert_eq!(decide(&pod(), Remote::Unknown, true), Step::Wait);
        assert_eq!(decide(&pod(), Remote::Absent, false), Step::Wait);
    }

    #[test]
    fn a_shadow_pod_that_vanished_fails_the_pod() {
        assert_eq!(
            decide(&offloaded_pod(), Remote::Absent, true),
            Step::Vanished
        );
        // Even unreachable: the listing said it is gone (the edge reads again first).
        assert_eq!(
            decide(&offloaded_pod(), Remote::Absent, false),
            Step::Vanished
        );
        // A refused pod was never offloaded: it is tried again.
        let mut p = offloaded_pod();
        p.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].reason =
            Some(status::reason::FORBIDDEN.into());
        assert_eq!(decide(&p, Remote::Absent, true), Step::Create);
        // Nor one whose token could not be made.
        p.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].reason =
            Some(status::reason::NO_TOKEN.into());
        assert_eq!(decide(&p, Remote::Absent, true), Step::Create);
        // Nor one waiting for its way to the home API server.
        p.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].reason =
            Some(status::reason::NO_HOME_API.into());
        assert_eq!(decide(&p, Remote::Absent, true), Step::Create);
        // Nor one waiting for the heartbeat.
        p.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].reason =
            Some(status::reason::NO_HEARTBEAT.into());
        assert_eq!(decide(&p, Remote::Absent, true), Step::Create);
    }

    #[test]
    fn deletion_goes_through_the_provider() {
        let s = shadow("u-1");
        let p = deleting(offloaded_pod());
        assert_eq!(
            decide(&p, Remote::Present(&s), true),
            Step::DeleteRemote {
                grace_seconds: Some(30)
            }
        );
        // Not while unreachable: nothing is deleted on a provider that cannot be asked.
        assert_eq!(decide(&p, Remote::Present(&s), false), Step::Wait);
        assert_eq!(decide(&p, Remote::Unknown, true), Step::Wait);
        let mut going = s.clone();
        going.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        assert_eq!(decide(&p, Remote::Present(&going), true), Step::Wait);
        assert_eq!(decide(&p, Remote::Absent, true), Step::FinishDeletion);
        // Never offloaded: it goes at once.
        assert_eq!(
            decide(&deleting(pod()), Remote::Absent, false),
            Step::FinishDeletion
        );
    }

    #[test]
    fn a_pod_deleted_outright_takes_its_shadow_pod_along() {
        // Gone from the home cache: its ShadowPod goes (the reflection framework deletes it
        // only while both caches listed and the provider answers: `Gate::may_delete_orphans`).
        let s = shadow("u-1");
        assert!(orphaned(&s, None));
        // Not twice.
        let mut going = s.clone();
        going.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        assert!(!orphaned(&going, None));
        // The pod read afresh: still there, it keeps its ShadowPod; a new pod of the same
        // name does not.
        assert!(!orphaned(&s, Some(&pod())));
        // Terminating at home: its ShadowPod goes gracefully (Step::DeleteRemote).
        assert!(!orphaned(&s, Some(&deleting(pod()))));
        assert!(orphaned(&shadow("u-0"), Some(&pod())));
        assert!(orphaned(&s, None));
    }

    #[test]
    fn an_earlier_pods_shadow_pod_goes_first() {
        let old = shadow("u-0");
        assert_eq!(
            decide(&pod(), Remote::Present(&old), true),
            Step::DeleteStale
        );
        assert_eq!(decide(&pod(), Remote::Present(&old), false), Step::Wait);
        // It is not this pod's: deleting this pod does not wait for it.
        assert_eq!(
            decide(&deleting(pod()), Remote::Present(&old), true),
            Step::FinishDeletion
        );
    }

    #[test]
    fn labels_follow_after_creation() {
        let s = shadow("u-1");
        let mut p = pod();
        p.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("tier".into(), "front".into());
        assert_eq!(decide(&p, Remote::Present(&s), true), Step::UpdateMetadata);
        assert_eq!(decide(&p, Remote::Present(&s), false), Step::Report);
        p.metadata.annotations = Some(BTreeMap::from([("note".into(), "x".into())]));
        p.metadata.labels = pod().metadata.labels;
        assert_eq!(decide(&p, Remote::Present(&s), true), Step::UpdateMetadata);
    }

    #[test]
    fn a_resize_follows_once_the_labels_did() {
        let mut s = shadow("u-1");
        s.spec.pod.spec = pod().spec.unwrap();
        let mut p = pod();
        assert_eq!(decide(&p, Remote::Present(&s), true), Step::Report);
        p.spec.as_mut().unwrap().containers[0].resources =
            Some(serde_json::from_value(json!({"requests": {"cpu": "800m"}})).unwrap());
        assert_eq!(decide(&p, Remote::Present(&s), true), Step::Resize);
        assert_eq!(decide(&p, Remote::Present(&s), false), Step::Report);
        p.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("tier".into(), "front".into());
        assert_eq!(decide(&p, Remote::Present(&s), true), Step::UpdateMetadata);
    }

    #[test]
    fn a_pod_declared_stopped_that_still_runs_there_goes_on_reconnection() {
        let mut p = offloaded_pod();
        let st = p.status.as_mut().unwrap();
        st.phase = Some("Failed".into());
        st.reason = Some(status::reason::PARTITIONED.into());
        let mut s = shadow("u-1");
        s.status = Some(fabric_api::offloading::v1alpha1::ShadowPodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        });
        assert_eq!(
            decide(&p, Remote::Present(&s), true),
            Step::DeleteRemote {
                grace_seconds: Some(0)
            }
        );
        assert_eq!(decide(&p, Remote::Present(&s), false), Step::Report);
        // Stopped there as agreed: nothing to do.
        s.status.as_mut().unwrap().phase = Some("Failed".into());
        assert_eq!(decide(&p, Remote::Present(&s), true), Step::Report);
    }

    #[test]
    fn a_finished_pod_is_left_as_it_ended() {
        let mut p = offloaded_pod();
        p.status.as_mut().unwrap().phase = Some("Failed".into());
        assert_eq!(decide(&p, Remote::Absent, true), Step::Report);
    }

    #[test]
    fn a_pod_offloaded_alone_is_told_what_does_not_follow_it() {
        assert_eq!(
            offloaded_note("web", "shop", true),
            "ShadowPod web created on the provider"
        );
        let alone = offloaded_note("shop.web", "shop", false);
        assert!(
            alone.contains("namespace shop is not offloaded")
                && alone.contains("fabricctl offload namespace shop"),
            "{alone}"
        );
    }
}
