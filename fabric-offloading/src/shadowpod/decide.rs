//! What the provider's ShadowPod controller does, as pure functions of the ShadowPod and the
//! real pod it sees: create the pod (again, if it vanished before finishing) only from a
//! pod that keeps to the provider's [`super::policy`], never revive one that finished, and
//! copy the pod's status. How a pod ended is recorded in the ShadowPod's status before the
//! pod may go (a finalizer on it: [`held`], [`recorded`]), never inferred from its absence.
use fabric_api::{
    names::{finalizer, label},
    offloading::v1alpha1::{
        ShadowPod, ShadowPodStatus,
        shadow_pod_condition::{POD_CREATED, POLICY_COMPLIANT},
    },
};
use fabric_kube::status::{Verdict, with_condition};
use k8s_openapi::{
    api::core::v1::{Pod, PodSpec},
    jiff::Timestamp,
};
use kube::{Resource, ResourceExt, api::ObjectMeta};

use super::policy::{self, Refusal, Rules};

fabric_kube::reasons! {
    /// Why a ShadowPod's PodCreated condition says what it does.
    pub enum PodCreated {
        Created = "Created",
        /// The pod had vanished before it finished and was made again.
        Recreated = "Recreated",
        /// The pod ended and is never revived.
        Finished = "Finished",
        /// Stopped by the at-most-once semantics, never run again (fabric-api's
        /// `shadow_pod_condition::PARTITIONED`).
        Partitioned = "Partitioned",
        /// The pod breaks the provider's policy: not made (the message names field and
        /// rule) until the ShadowPod's pod is changed to keep to it.
        Disallowed = "Disallowed",
    } else {
        /// The pod could not be created: the API server's reason (`Invalid`, `Forbidden`,
        /// `QuotaExceeded`).
        Refused(String),
    }
}

fabric_kube::reasons! {
    /// Why a ShadowPod's PolicyCompliant condition says what it does.
    pub enum PolicyCompliance {
        Compliant = "Compliant",
        /// Made under a looser policy than the provider's current one.
        BreaksCurrentPolicy = "BreaksCurrentPolicy",
    }
}

/// Whether `shadow`'s pod keeps to the provider's `rules` as they are now.
pub fn compliance(shadow: &ShadowPod, rules: &Rules) -> Verdict<PolicyCompliance> {
    match allowed(shadow, rules) {
        Ok(()) => Verdict::ok(
            PolicyCompliance::Compliant,
            "the pod keeps to the provider's current policy",
        ),
        Err(refusal) => Verdict::not(
            PolicyCompliance::BreaksCurrentPolicy,
            format!(
                "the pod was made under a looser policy and breaks the provider's current one ({refusal}): it runs on, but is never made again"
            ),
        ),
    }
}

/// `status` with its PolicyCompliant condition, for a pod that runs (made and not finished):
/// the provider's admin may have tightened the policy since the pod was made.
pub fn with_compliance(
    mut status: ShadowPodStatus,
    shadow: &ShadowPod,
    rules: &Rules,
    generation: Option<i64>,
    now: Timestamp,
) -> ShadowPodStatus {
    if status.pod_uid.is_some() && !terminal(status.phase.as_deref()) {
        let c = compliance(shadow, rules).condition(POLICY_COMPLIANT, generation, now);
        status.conditions = with_condition(&status.conditions, c);
    }
    status
}

/// The message of a pod that breaks the current policy in `next` and did not in `prev`: what
/// a Warning Event says, once.
pub fn newly_breaking(prev: &ShadowPodStatus, next: &ShadowPodStatus) -> Option<String> {
    let breaks = |s: &ShadowPodStatus| {
        Verdict::<PolicyCompliance>::find(&s.conditions, POLICY_COMPLIANT)
            .filter(|v| v.reason == PolicyCompliance::BreaksCurrentPolicy)
            .map(|v| v.message)
    };
    breaks(next).filter(|_| breaks(prev).is_none())
}

/// What to do about a ShadowPod.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// There is no real pod and it never finished: make it (`again` when one existed before).
    Create { again: bool },
    /// The real pod finished and is gone: it stays gone.
    Finished,
    /// The real pod exists: copy its status.
    Mirror,
    /// A pod of that name exists but is not this ShadowPod's: leave it alone and say so.
    Foreign,
    /// There is no real pod and the ShadowPod's pod breaks the provider's policy (it got in
    /// past the webhook: before it was installed, or written by someone it does not judge):
    /// it is not made, and the status says why.
    Disallowed(Refusal),
}

/// A pod phase after which the pod never runs again.
pub fn terminal(phase: Option<&str>) -> bool {
    matches!(phase, Some("Succeeded" | "Failed"))
}

/// What to do about `shadow` with its real pod `pod`; a pod is only made from a spec that
/// keeps to the provider's `rules`.
pub fn decide(shadow: &ShadowPod, pod: Option<&Pod>, rules: &Rules) -> Decision {
    let status = shadow.status.clone().unwrap_or_default();
    match pod {
        Some(pod) if owned_by(pod, shadow) => Decision::Mirror,
        Some(_) => Decision::Foreign,
        None if terminal(status.phase.as_deref()) => Decision::Finished,
        None => match allowed(shadow, rules) {
            Err(refusal) => Decision::Disallowed(refusal),
            Ok(()) => Decision::Create {
                again: status.pod_uid.is_some(),
            },
        },
    }
}

/// Whether the provider's `rules` let `shadow`'s pod be made.
fn allowed(shadow: &ShadowPod, rules: &Rules) -> Result<(), Refusal> {
    policy::check(&shadow.spec.pod.spec, rules)?;
    policy::check_annotations(&shadow.spec.pod.annotations, rules.level)
}

/// Whether `pod` is `shadow`'s own real pod.
pub fn owned_by(pod: &Pod, shadow: &ShadowPod) -> bool {
    let uid = shadow.meta().uid.as_deref();
    pod.owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && Some(o.uid.as_str()) == uid)
}

/// Whether `pod` carries the controller's finalizer ([`finalizer::REAL_POD`]).
pub fn held(pod: &Pod) -> bool {
    pod.finalizers().iter().any(|f| f == finalizer::REAL_POD)
}

/// The merge patch that adds ([`held`] wanted) or removes the controller's finalizer on
/// `pod`, keeping the others, conditioned on the pod's resourceVersion (a 409 when another
/// writer changed them meanwhile); None when there is nothing to change.
pub fn finalizer_patch(pod: &Pod, hold: bool) -> Option<serde_json::Value> {
    if held(pod) == hold {
        return None;
    }
    let mut finalizers: Vec<&String> = pod
        .finalizers()
        .iter()
        .filter(|f| *f != finalizer::REAL_POD)
        .collect();
    let ours = finalizer::REAL_POD.to_owned();
    if hold {
        finalizers.push(&ours);
    }
    Some(serde_json::json!({ "metadata": {
        "resourceVersion": pod.metadata.resource_version,
        "finalizers": finalizers,
    } }))
}

/// Whether the controller may let `pod`, being deleted, go: `status` (the ShadowPod's, as
/// written) records it as it is now, so that a pod that finished is known to have finished
/// once it is gone ([`decide`] never makes it again).
pub fn recorded(status: &ShadowPodStatus, pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    status.pod_uid == pod.metadata.uid && status.phase.as_deref() == phase
}

/// `shadow`'s pod spec with the provider's default requests where its containers ask for
/// none: what the real pod runs with, so the provider's scheduler counts what the webhook
/// charged. Its resources are compared with the real pod's ([`super::resize::patch`]), so a
/// default the consumer never wrote is not a resize.
pub fn wanted(shadow: &ShadowPod, rules: &Rules) -> PodSpec {
    fabric_api::requests::with_defaults(&shadow.spec.pod.spec, &rules.default_requests)
}

/// The real pod of `shadow`: same name and namespace, owned (and, where a garbage collector
/// runs, deleted with it) by the ShadowPod, labelled with the consumer, with the [`wanted`]
/// resources, placed where the provider admin's `rules` say, held by the controller's
/// finalizer until its end is recorded ([`recorded`]).
pub fn real_pod(shadow: &ShadowPod, rules: &Rules) -> Pod {
    let mut labels = shadow.spec.pod.labels.clone();
    labels.insert(
        label::REMOTE_CLUSTER.to_owned(),
        shadow.spec.cluster_id.clone(),
    );
    let mut spec = PodSpec {
        // The provider issues no tokens to tenants' pods: forced rather than refused,
        // since leaving it out means true.
        automount_service_account_token: Some(false),
        ..wanted(shadow, rules)
    };
    rules.placement.apply(&mut spec);
    Pod {
        metadata: ObjectMeta {
            name: shadow.meta().name.clone(),
            namespace: shadow.meta().namespace.clone(),
            labels: Some(labels),
            annotations: (!shadow.spec.pod.annotations.is_empty())
                .then(|| shadow.spec.pod.annotations.clone()),
            owner_references: shadow.controller_owner_ref(&()).map(|o| vec![o]),
            finalizers: Some(vec![finalizer::REAL_POD.to_owned()]),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// The status of a ShadowPod whose real pod is `pod`; `created_again`: the pod was just made
/// after its predecessor vanished.
pub fn mirrored(
    prev: &ShadowPodStatus,
    pod: &Pod,
    created_again: bool,
    generation: Option<i64>,
    now: Timestamp,
) -> ShadowPodStatus {
    let s = pod.status.clone().unwrap_or_default();
    let recreations = prev.recreations + u32::from(created_again);
    let created = if terminal(s.phase.as_deref()) {
        Verdict::ok(
            PodCreated::Finished,
            format!(
                "the pod ended ({}) and is not run again",
                s.phase.as_deref().unwrap_or_default()
            ),
        )
    } else if recreations > 0 {
        Verdict::ok(
            PodCreated::Recreated,
            format!(
                "the pod vanished before it finished and was created again {recreations} time(s)"
            ),
        )
    } else {
        Verdict::ok(PodCreated::Created, "the pod exists on the provider")
    };
    ShadowPodStatus {
        observed_generation: generation,
        finished_at: super::lifetime::finished_at(prev, s.phase.as_deref(), now),
        phase: s.phase,
        reason: s.reason,
        message: s.message,
        pod_uid: pod.metadata.uid.clone(),
        pod_ip: s.pod_ip,
        pod_ips: s.pod_ips.into_iter().flatten().map(|p| p.ip).collect(),
        start_time: s.start_time,
        pod_conditions: s.conditions.unwrap_or_default(),
        container_statuses: s.container_statuses.unwrap_or_default(),
        init_container_statuses: s.init_container_statuses.unwrap_or_default(),
        recreations,
        // A pod the API server stored has quantities that parse; should one not, the last
        // figure stands rather than none.
        reserved: fabric_api::requests::held(pod)
            .map(|r| fabric_api::quantity::quantities(&r))
            .unwrap_or_else(|_| prev.reserved.clone()),
        conditions: with_condition(
            &prev.conditions,
            created.condition(POD_CREATED, generation, now),
        ),
    }
}

/// What the controller may do from its watch cache's copy of a ShadowPod and its cache of
/// owned pods alone (no fresh read): mirror the status of a pod it owns, the write
/// conditioned on that copy's resourceVersion so that a copy behind the stored object is
/// refused (409) rather than undo what came after it; and make the first pod of a ShadowPod
/// that never had one (a second one is refused by its name). Anything else (re-creating a
/// pod, a finished pod, a pod to stop, labels or resources to carry over) is decided on a
/// fresh read.
#[derive(Debug, Clone, PartialEq)]
pub enum Cached {
    /// The status already says what the pod does: nothing to write.
    Settled,
    /// Write this status, conditioned on the copy's resourceVersion (boxed: the other
    /// variants are empty).
    Write(Box<ShadowPodStatus>),
    /// No pod, and the copy says none was ever made: make it, the status written
    /// conditioned on the copy's resourceVersion.
    Create,
    /// Read the ShadowPod afresh and decide on that.
    Fresh,
}

/// [`Cached`] for `shadow` as the watch cache has it and `pod` as just read; `stopping`: the
/// consumer has been silent past its at-most-once partition time (its pods are being
/// stopped); `resize`: whether the pod's resources differ from what the ShadowPod asks.
pub fn from_cache(
    shadow: &ShadowPod,
    pod: Option<&Pod>,
    stopping: bool,
    resize: bool,
    rules: &Rules,
    now: Timestamp,
) -> Cached {
    let prev = shadow.status.clone().unwrap_or_default();
    if shadow.metadata.deletion_timestamp.is_some()
        || shadow.metadata.resource_version.is_none()
        || stopping
        || super::partition::partitioned(&prev)
    {
        return Cached::Fresh;
    }
    let Some(pod) = pod else {
        // A pod that existed once (it may have finished, its re-creation is counted) is
        // only made again on a fresh read; one the policy refuses is said there.
        return if prev.pod_uid.is_none()
            && !terminal(prev.phase.as_deref())
            && allowed(shadow, rules).is_ok()
        {
            Cached::Create
        } else {
            Cached::Fresh
        };
    };
    // A pod being deleted is let go, and one without the finalizer (made by an earlier
    // release) gets it, on a fresh read.
    if !owned_by(pod, shadow)
        || resize
        || metadata_patch(shadow, pod).is_some()
        || pod.metadata.deletion_timestamp.is_some()
        || !held(pod)
    {
        return Cached::Fresh;
    }
    let generation = shadow.metadata.generation;
    let status = with_compliance(
        mirrored(&prev, pod, false, generation, now),
        shadow,
        rules,
        generation,
        now,
    );
    if shadow.status.as_ref() == Some(&status) {
        Cached::Settled
    } else {
        Cached::Write(Box::new(status))
    }
}

/// The merge patch that brings the real pod's labels and annotations to what the ShadowPod
/// says now (the consumer propagates them after creation), if they differ. Labels the
/// template no longer has are removed; annotations are only set, since the provider's own
/// admission may add some of its own.
pub fn metadata_patch(shadow: &ShadowPod, pod: &Pod) -> Option<serde_json::Value> {
    let want = real_pod(shadow, &Rules::default()).metadata;
    let want_labels = want.labels.unwrap_or_default();
    let want_annotations = want.annotations.unwrap_or_default();
    let have_labels = pod.metadata.labels.clone().unwrap_or_default();
    let have_annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let mut labels = serde_json::Map::new();
    for (k, v) in &want_labels {
        if have_labels.get(k) != Some(v) {
            labels.insert(k.clone(), v.clone().into());
        }
    }
    for k in have_labels.keys().filter(|k| !want_labels.contains_key(*k)) {
        labels.insert(k.clone(), serde_json::Value::Null);
    }
    let mut annotations = serde_json::Map::new();
    for (k, v) in &want_annotations {
        if have_annotations.get(k) != Some(v) {
            annotations.insert(k.clone(), v.clone().into());
        }
    }
    (!labels.is_empty() || !annotations.is_empty()).then(
        || serde_json::json!({ "metadata": { "labels": labels, "annotations": annotations } }),
    )
}

/// The status of a ShadowPod whose pod could not be created (`reason`: the API server's,
/// e.g. `Forbidden` for an admission or quota refusal, `Invalid` for a bad spec).
pub fn refused(
    prev: &ShadowPodStatus,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
) -> ShadowPodStatus {
    not_created(
        prev,
        PodCreated::Refused(reason.to_owned()),
        message,
        generation,
        now,
    )
}

/// `prev` with its PodCreated condition false for `reason`.
fn not_created(
    prev: &ShadowPodStatus,
    reason: PodCreated,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
) -> ShadowPodStatus {
    ShadowPodStatus {
        observed_generation: generation,
        conditions: with_condition(
            &prev.conditions,
            Verdict::not(reason, message).condition(POD_CREATED, generation, now),
        ),
        ..prev.clone()
    }
}

/// The status of a ShadowPod whose pod breaks the provider's policy: not made, and why.
pub fn disallowed(
    prev: &ShadowPodStatus,
    refusal: &Refusal,
    generation: Option<i64>,
    now: Timestamp,
) -> ShadowPodStatus {
    let message = format!("spec.pod.{refusal}");
    not_created(prev, PodCreated::Disallowed, message, generation, now)
}

/// The status of a ShadowPod whose name is taken by a pod it does not own.
pub fn foreign(prev: &ShadowPodStatus, generation: Option<i64>, now: Timestamp) -> ShadowPodStatus {
    refused(
        prev,
        "NameTaken",
        "a pod of this name exists and is not this ShadowPod's".to_owned(),
        generation,
        now,
    )
}

#[cfg(test)]
mod tests {
    use fabric_api::offloading::v1alpha1::{HomePod, PodTemplate, ShadowPodSpec};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use serde_json::json;

    use super::*;

    fn now() -> Timestamp {
        "2026-01-01T00:00:00Z".parse().unwrap()
    }

    fn shadow(status: Option<ShadowPodStatus>) -> ShadowPod {
        let mut s = ShadowPod::new(
            "web",
            ShadowPodSpec {
                cluster_id: "alpha".into(),
                home: HomePod {
                    namespace: "shop".into(),
                    name: "web".into(),
                    uid: "home-uid".into(),
                },
                pod: PodTemplate {
                    labels: [("app".to_owned(), "web".to_owned())].into(),
                    ..Default::default()
                },
            },
        );
        s.metadata.namespace = Some("fabric-tenant-alpha".into());
        s.metadata.uid = Some("shadow-uid".into());
        s.status = status;
        s
    }

    fn pod_of(shadow: &ShadowPod, uid: &str, phase: &str) -> Pod {
        let mut p = real_pod(shadow, &Rules::default());
        p.metadata.uid = Some(uid.into());
        p.status = Some(
            serde_json::from_value(json!({
                "phase": phase, "podIP": "10.0.0.7", "podIPs": [{"ip": "10.0.0.7"}],
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "main", "image": "echo", "imageID": "",
                    "ready": true, "restartCount": 2}],
            }))
            .unwrap(),
        );
        p
    }

    #[test]
    fn a_new_shadowpod_gets_its_pod_owned_and_labelled() {
        let s = shadow(None);
        assert_eq!(
            decide(&s, None, &Rules::default()),
            Decision::Create { again: false }
        );
        let p = real_pod(&s, &Rules::default());
        assert_eq!(p.metadata.name.as_deref(), Some("web"));
        assert_eq!(p.metadata.namespace.as_deref(), Some("fabric-tenant-alpha"));
        let labels = p.metadata.labels.unwrap();
        assert_eq!(labels[label::REMOTE_CLUSTER], "alpha");
        assert_eq!(labels["app"], "web");
        let owner = &p.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (owner.uid.as_str(), owner.controller),
            ("shadow-uid", Some(true))
        );
        assert_eq!(owner.kind, "ShadowPod");
    }

    #[test]
    fn a_container_asking_for_nothing_runs_with_the_default_requests_and_is_not_resized() {
        let mut s = shadow(None);
        s.spec.pod.spec = serde_json::from_value(json!({"containers": [
            {"name": "main", "image": "echo"},
            {"name": "side", "image": "echo", "resources": {"limits": {"cpu": "2"}}},
        ]}))
        .unwrap();
        let rules = Rules {
            default_requests: [("cpu".to_owned(), Quantity("100m".into()))].into(),
            ..Rules::default()
        };
        let p = real_pod(&s, &rules);
        let spec = p.spec.unwrap();
        let requests = |i: usize| {
            spec.containers[i]
                .resources
                .as_ref()
                .and_then(|r| r.requests.clone())
        };
        assert_eq!(requests(0), Some(rules.default_requests.clone()));
        // A limit stands for the request: kept as it is.
        assert_eq!(requests(1), None);
        // The running pod has what the ShadowPod wants: no resize.
        assert_eq!(
            super::super::resize::patch(&wanted(&s, &rules), &spec),
            None
        );
    }

    #[test]
    fn a_pod_goes_only_once_its_end_is_recorded() {
        let s = shadow(None);
        let mut p = pod_of(&s, "pod-1", "Succeeded");
        assert!(held(&p), "made with the finalizer");
        p.metadata.finalizers = Some(vec!["other/one".into(), finalizer::REAL_POD.into()]);
        p.metadata.resource_version = Some("7".into());
        // Not recorded while the status says Running, or another pod's.
        let running = mirrored(
            &ShadowPodStatus::default(),
            &pod_of(&s, "pod-1", "Running"),
            false,
            None,
            now(),
        );
        assert!(!recorded(&running, &p));
        let other = mirrored(
            &ShadowPodStatus::default(),
            &pod_of(&s, "pod-0", "Succeeded"),
            false,
            None,
            now(),
        );
        assert!(!recorded(&other, &p));
        let done = mirrored(&ShadowPodStatus::default(), &p, false, None, now());
        assert!(recorded(&done, &p));
        // Let go: the others' finalizers kept, over the version read.
        assert_eq!(
            finalizer_patch(&p, false),
            Some(json!({"metadata": {"resourceVersion": "7", "finalizers": ["other/one"]}}))
        );
        assert_eq!(finalizer_patch(&p, true), None);
        p.metadata.finalizers = None;
        assert_eq!(
            finalizer_patch(&p, true),
            Some(
                json!({"metadata": {"resourceVersion": "7", "finalizers": [finalizer::REAL_POD]}})
            )
        );
        assert_eq!(finalizer_patch(&p, false), None);
    }

    #[test]
    fn status_is_copied_from_the_pod() {
        let s = shadow(None);
        let p = pod_of(&s, "pod-1", "Running");
        assert_eq!(decide(&s, Some(&p), &Rules::default()), Decision::Mirror);
        let st = mirrored(&ShadowPodStatus::default(), &p, false, Some(1), now());
        assert_eq!(st.phase.as_deref(), Some("Running"));
        assert_eq!(st.pod_ip.as_deref(), Some("10.0.0.7"));
        assert_eq!(st.pod_ips, vec!["10.0.0.7"]);
        assert_eq!(st.pod_uid.as_deref(), Some("pod-1"));
        assert_eq!(st.pod_conditions[0].type_, "Ready");
        assert_eq!(st.container_statuses[0].restart_count, 2);
        assert_eq!(st.recreations, 0);
        assert_eq!(st.conditions[0].reason, "Created");
    }

    #[test]
    fn a_vanished_running_pod_is_created_again_and_counted() {
        let first = mirrored(
            &ShadowPodStatus::default(),
            &pod_of(&shadow(None), "pod-1", "Running"),
            false,
            None,
            now(),
        );
        let s = shadow(Some(first.clone()));
        assert_eq!(
            decide(&s, None, &Rules::default()),
            Decision::Create { again: true }
        );
        let again = mirrored(&first, &pod_of(&s, "pod-2", "Pending"), true, None, now());
        assert_eq!(again.recreations, 1);
        assert_eq!(again.pod_uid.as_deref(), Some("pod-2"));
        assert_eq!(again.conditions[0].reason, "Recreated");
    }

    #[test]
    fn a_finished_pod_is_never_revived() {
        for phase in ["Succeeded", "Failed"] {
            let done = mirrored(
                &ShadowPodStatus::default(),
                &pod_of(&shadow(None), "pod-1", phase),
                false,
                None,
                now(),
            );
            assert_eq!(done.conditions[0].reason, "Finished");
            assert_eq!(
                decide(&shadow(Some(done)), None, &Rules::default()),
                Decision::Finished
            );
        }
    }

    #[test]
    fn a_pod_is_made_only_from_a_spec_the_policy_allows() {
        // Stored past the webhook (before it was installed, or by a user it does not see).
        let mut s = shadow(None);
        s.metadata.resource_version = Some("1".into());
        s.spec.pod.spec = serde_json::from_value(json!({
            "hostPID": true,
            "containers": [{"name": "main", "image": "echo"}],
        }))
        .unwrap();
        let Decision::Disallowed(refusal) = decide(&s, None, &Rules::default()) else {
            panic!("a hostPID pod is made");
        };
        assert_eq!(refusal.field, "spec.hostPID");
        assert_eq!(
            from_cache(&s, None, false, false, &Rules::default(), now()),
            Cached::Fresh,
            "never made from the cache either"
        );
        let st = disallowed(&ShadowPodStatus::default(), &refusal, Some(1), now());
        assert_eq!(st.pod_uid, None);
        assert_eq!(st.conditions[0].status, "False");
        assert_eq!(st.conditions[0].reason, "Disallowed");
        assert_eq!(
            st.conditions[0].message,
            "spec.pod.spec.hostPID: sharing the host's namespaces is not allowed (provider \
             policy baseline)"
        );
        // Made again once the pod keeps to it; the token is never mounted.
        s.spec.pod.spec.host_pid = None;
        s.spec.pod.spec.automount_service_account_token = Some(true);
        assert_eq!(
            decide(&s, None, &Rules::default()),
            Decision::Create { again: false }
        );
        let pod = real_pod(&s, &Rules::default()).spec.unwrap();
        assert_eq!(pod.automount_service_account_token, Some(false));
    }

    #[test]
    fn a_pod_owned_by_another_is_left_alone() {
        let s = shadow(None);
        let mut p = pod_of(&s, "pod-1", "Running");
        p.metadata.owner_references = None;
        assert_eq!(decide(&s, Some(&p), &Rules::default()), Decision::Foreign);
        let st = foreign(&ShadowPodStatus::default(), None, now());
        assert_eq!(st.conditions[0].status, "False");
    }

    #[test]
    fn labels_and_annotations_follow_the_shadowpod() {
        let mut s = shadow(None);
        let p = pod_of(&s, "pod-1", "Running");
        assert_eq!(metadata_patch(&s, &p), None);
        s.spec.pod.labels = [("tier".to_owned(), "front".to_owned())].into();
        s.spec.pod.annotations = [("note".to_owned(), "x".to_owned())].into();
        let patch = metadata_patch(&s, &p).unwrap();
        assert_eq!(
            patch,
            json!({ "metadata": {
                "labels": { "tier": "front", "app": null },
                "annotations": { "note": "x" },
            }})
        );
    }

    #[test]
    fn the_cache_alone_only_mirrors_an_owned_pod() {
        let mut s = shadow(None);
        s.metadata.resource_version = Some("7".into());
        // No pod yet and none ever made: the first one is made from the cache.
        assert_eq!(
            from_cache(&s, None, false, false, &Rules::default(), now()),
            Cached::Create
        );
        assert_eq!(
            from_cache(&s, None, true, false, &Rules::default(), now()),
            Cached::Fresh
        );
        let p = pod_of(&s, "pod-1", "Running");
        // No pod where one was made (vanished, or finished: counted or never revived) or
        // where it finished: decided on a fresh read.
        for phase in ["Running", "Succeeded"] {
            let mut had = s.clone();
            had.status = Some(mirrored(
                &ShadowPodStatus::default(),
                &pod_of(&s, "pod-0", phase),
                false,
                None,
                now(),
            ));
            assert_eq!(
                from_cache(&had, None, false, false, &Rules::default(), now()),
                Cached::Fresh
            );
            had.status.as_mut().unwrap().pod_uid = None;
            let expect = if phase == "Running" {
                Cached::Create
            } else {
                Cached::Fresh
            };
            assert_eq!(
                from_cache(&had, None, false, false, &Rules::default(), now()),
                expect
            );
        }
        let Cached::Write(st) = from_cache(&s, Some(&p), false, false, &Rules::default(), now())
        else {
            panic!("an owned pod's status is mirrored from the cache");
        };
        assert_eq!(
            *st,
            with_compliance(
                mirrored(&ShadowPodStatus::default(), &p, false, None, now()),
                &s,
                &Rules::default(),
                None,
                now()
            )
        );
        // Once written (and echoed back), nothing more.
        s.status = Some(*st);
        assert_eq!(
            from_cache(&s, Some(&p), false, false, &Rules::default(), now()),
            Cached::Settled
        );
        // A re-creation counted stays counted: a later mirror keeps the count.
        s.status.as_mut().unwrap().recreations = 2;
        let Cached::Write(st) = from_cache(&s, Some(&p), false, false, &Rules::default(), now())
        else {
            panic!("the reason changes with the count");
        };
        assert_eq!(st.recreations, 2);
        // Stopping, resizing, labels to carry, a foreign pod, a deletion: fresh.
        assert_eq!(
            from_cache(&s, Some(&p), true, false, &Rules::default(), now()),
            Cached::Fresh
        );
        assert_eq!(
            from_cache(&s, Some(&p), false, true, &Rules::default(), now()),
            Cached::Fresh
        );
        let mut relabelled = s.clone();
        relabelled
            .spec
            .pod
            .labels
            .insert("tier".into(), "front".into());
        assert_eq!(
            from_cache(
                &relabelled,
                Some(&p),
                false,
                false,
                &Rules::default(),
                now()
            ),
            Cached::Fresh
        );
        let mut foreign_pod = p.clone();
        foreign_pod.metadata.owner_references = None;
        assert_eq!(
            from_cache(
                &s,
                Some(&foreign_pod),
                false,
                false,
                &Rules::default(),
                now()
            ),
            Cached::Fresh
        );
        let mut going = s.clone();
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
        assert_eq!(
            from_cache(&going, Some(&p), false, false, &Rules::default(), now()),
            Cached::Fresh
        );
        // Without a resourceVersion the write could not be conditioned.
        let mut unversioned = s.clone();
        unversioned.metadata.resource_version = None;
        assert_eq!(
            from_cache(
                &unversioned,
                Some(&p),
                false,
                false,
                &Rules::default(),
                now()
            ),
            Cached::Fresh
        );
    }

    #[test]
    fn a_refusal_keeps_what_was_known() {
        let prev = ShadowPodStatus {
            recreations: 3,
            ..Default::default()
        };
        let st = refused(&prev, "Forbidden", "exceeded quota".into(), None, now());
        assert_eq!(st.recreations, 3);
        assert_eq!(st.conditions[0].reason, "Forbidden");
        assert_eq!(st.conditions[0].message, "exceeded quota");
    }

    #[test]
    fn a_running_pod_made_under_a_looser_level_is_flagged_once() {
        let mut s = shadow(None);
        s.spec.pod.spec = serde_json::from_value(json!({"containers": [
            {"name": "main", "image": "echo"}]}))
        .unwrap();
        let running = mirrored(
            &ShadowPodStatus::default(),
            &pod_of(&s, "pod-1", "Running"),
            false,
            Some(1),
            now(),
        );
        let baseline = Rules::default();
        let restricted = baseline.for_tenant(Some(
            fabric_api::authentication::v1alpha1::PodSecurity::Restricted,
        ));
        let ok = with_compliance(running.clone(), &s, &baseline, Some(1), now());
        let v = Verdict::<PolicyCompliance>::find(&ok.conditions, POLICY_COMPLIANT).unwrap();
        assert!(v.ok, "{v:?}");
        let flagged = with_compliance(ok.clone(), &s, &restricted, Some(1), now());
        let v = Verdict::<PolicyCompliance>::find(&flagged.conditions, POLICY_COMPLIANT).unwrap();
        assert!(!v.ok);
        assert_eq!(v.reason, PolicyCompliance::BreaksCurrentPolicy);
        assert!(v.message.contains("restricted"), "{}", v.message);
        // Said once: on the change, not again while it stays so.
        assert!(newly_breaking(&ok, &flagged).is_some());
        assert!(newly_breaking(&flagged, &flagged).is_none());
        assert!(newly_breaking(&ok, &ok).is_none());
        // A pod not made, or finished, is not judged: it is never made again anyway.
        let unmade = with_compliance(ShadowPodStatus::default(), &s, &restricted, Some(1), now());
        assert!(Verdict::<PolicyCompliance>::find(&unmade.conditions, POLICY_COMPLIANT).is_none());
        let done = mirrored(
            &ShadowPodStatus::default(),
            &pod_of(&s, "pod-1", "Succeeded"),
            false,
            Some(1),
            now(),
        );
        let done = with_compliance(done, &s, &restricted, Some(1), now());
        assert!(Verdict::<PolicyCompliance>::find(&done.conditions, POLICY_COMPLIANT).is_none());
    }
}
