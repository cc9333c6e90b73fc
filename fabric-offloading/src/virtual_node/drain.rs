//! Draining a virtual node that goes (its VirtualNode deleted, by an unpeer or by hand): the
//! pods bound to it must not stay "Running" at home on a Node that no longer exists, with
//! nothing left to report on them (a cluster's pod GC, where there is one, would only catch
//! them long after, and leave their ShadowPods running on the provider).
//!
//! First every such pod is deleted gracefully while the virtual kubelet still runs: it
//! deletes the ShadowPod on the provider and completes the deletion once the real pod is gone,
//! as for any pod deleted at home. Whatever is left after the drain grace (the provider
//! unreachable, the virtual kubelet not running) is abandoned as upstream's pod GC abandons
//! the pods of a vanished node: failed (a `DisruptionTarget` condition says why) and deleted
//! at once. A forced unpeer (the VirtualNode marked [`fabric_api::names::annotation::FORCE_UNPEER`]) says
//! the provider is gone: nothing is waited for. The provider removes what is left there with
//! the tenant, on unpeer.
use std::time::Duration;

use k8s_openapi::{
    api::core::v1::{Pod, PodCondition, PodStatus},
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};
use kube::api::ObjectMeta;

/// How long the graceful deletion through the virtual kubelet may take before the pods are
/// abandoned, unless configured otherwise (`fabric-controller virtual-nodes --drain-grace`).
pub const GRACE: Duration = Duration::from_secs(30);

/// The drain grace of a VirtualNode (its metadata) being deleted: none when its unpeer is
/// forced, else `configured`.
pub fn grace(virtual_node: &ObjectMeta, configured: Duration) -> Duration {
    if fabric_api::names::annotation::unpeer_forced(virtual_node) {
        Duration::ZERO
    } else {
        configured
    }
}

/// The reason of the condition and the phase of an abandoned pod.
pub const REASON: &str = "VirtualNodeRemoved";

/// What to do about one pod bound to the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Delete it gracefully: the virtual kubelet takes it from there.
    Delete,
    /// Past the grace: fail it (unless it finished already) and delete it at once.
    Abandon { fail: bool },
    /// Its graceful deletion runs.
    Wait,
}

fn finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The step for `pod`, bound to a node whose VirtualNode has been deleting for `waited`,
/// with drain grace `grace` ([`grace`]).
pub fn step(pod: &Pod, waited: Duration, grace: Duration) -> Step {
    if waited >= grace {
        return Step::Abandon {
            fail: !finished(pod),
        };
    }
    if pod.metadata.deletion_timestamp.is_some() {
        Step::Wait
    } else {
        Step::Delete
    }
}

/// The status an abandoned pod is failed with (applied under the VirtualNode controller's
/// field manager: only these fields).
pub fn failed_status(node: &str, now: Timestamp) -> PodStatus {
    let message = format!(
        "the virtual node {node} was removed (unpeered) before the pod could be deleted \
         through the provider"
    );
    let condition = |type_: &str, status: &str| PodCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(REASON.into()),
        message: Some(message.clone()),
        last_transition_time: Some(Time(now)),
        ..Default::default()
    };
    PodStatus {
        phase: Some("Failed".into()),
        reason: Some(REASON.into()),
        message: Some(message.clone()),
        conditions: Some(vec![
            condition("DisruptionTarget", "True"),
            condition("Ready", "False"),
        ]),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use fabric_api::names;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    use super::*;

    fn pod(phase: &str, deleting: bool) -> Pod {
        let mut p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-1"},
            "spec": {"nodeName": "fabric-b", "containers": [{"name": "main", "image": "echo"}]},
            "status": {"phase": phase},
        }))
        .unwrap();
        if deleting {
            p.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
        }
        p
    }

    #[test]
    fn pods_are_deleted_through_the_virtual_kubelet_first() {
        let s = Duration::from_secs;
        assert_eq!(step(&pod("Running", false), s(0), GRACE), Step::Delete);
        assert_eq!(step(&pod("Pending", false), s(29), GRACE), Step::Delete);
        assert_eq!(step(&pod("Running", true), s(5), GRACE), Step::Wait);
        assert_eq!(step(&pod("Succeeded", false), s(1), GRACE), Step::Delete);
        // A shorter configured grace is honoured.
        assert_eq!(
            step(&pod("Running", true), s(5), s(3)),
            Step::Abandon { fail: true }
        );
    }

    #[test]
    fn a_forced_unpeer_waits_for_nothing() {
        let configured = Duration::from_secs(30);
        let mut meta = ObjectMeta::default();
        assert_eq!(grace(&meta, configured), configured);
        meta.annotations = Some(
            [(
                names::annotation::FORCE_UNPEER.to_owned(),
                "true".to_owned(),
            )]
            .into(),
        );
        let g = grace(&meta, configured);
        assert_eq!(g, Duration::ZERO);
        // Not even a first graceful deletion: the provider is gone.
        assert_eq!(
            step(&pod("Running", false), Duration::ZERO, g),
            Step::Abandon { fail: true }
        );
    }

    #[test]
    fn what_is_left_after_the_grace_is_failed_and_deleted() {
        let s = Duration::from_secs;
        assert_eq!(
            step(&pod("Running", true), s(30), GRACE),
            Step::Abandon { fail: true }
        );
        assert_eq!(
            step(&pod("Running", false), s(90), GRACE),
            Step::Abandon { fail: true }
        );
        // A finished pod keeps how it ended.
        for phase in ["Succeeded", "Failed"] {
            assert_eq!(
                step(&pod(phase, true), s(30), GRACE),
                Step::Abandon { fail: false }
            );
        }
        let st = failed_status("fabric-b", Timestamp::now());
        assert_eq!(st.phase.as_deref(), Some("Failed"));
        assert_eq!(st.reason.as_deref(), Some(REASON));
        let conds = st.conditions.unwrap();
        assert!(
            conds
                .iter()
                .any(|c| c.type_ == "DisruptionTarget" && c.status == "True")
        );
        assert!(
            conds
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "False")
        );
        assert!(st.message.unwrap().contains("fabric-b"));
    }
}
