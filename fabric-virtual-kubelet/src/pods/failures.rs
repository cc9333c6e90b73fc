//! Remote failures as Warning Events at home: the ones a kubelet records on the pod (image
//! pulls, container creation, crash loops), and the provider's scheduler finding no room for
//! the pod (`FailedScheduling`, as kube-scheduler records it). The provider's pod status
//! already comes home, but `kubectl describe pod` and `kubectl get events` are where an
//! application team looks first. Free of I/O: what changed between the home status before and
//! after a write.
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ContainerStatus, PodStatus};

use super::status::{OFFLOADED, reason};

/// Waiting reasons that mean a container cannot run, and the Event reason a kubelet gives
/// each (`Failed` for an attempt that failed, `BackOff` while it waits to try again).
const FAILING: &[(&str, &str)] = &[
    ("ErrImagePull", "Failed"),
    ("ImagePullBackOff", "BackOff"),
    ("InvalidImageName", "InspectFailed"),
    ("ErrImageNeverPull", "ErrImageNeverPull"),
    ("CreateContainerConfigError", "Failed"),
    ("CreateContainerError", "Failed"),
    ("RunContainerError", "Failed"),
    ("PreStartHookError", "Failed"),
    ("PostStartHookError", "FailedPostStartHook"),
    ("CrashLoopBackOff", "BackOff"),
];

/// A Warning Event to record at home.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The kubelet's (or the scheduler's) Event reason.
    pub reason: &'static str,
    /// What was being done: `Run`, `Scheduling`.
    pub action: &'static str,
    pub message: String,
}

/// Why the provider cannot schedule the pod, as the home status says it.
fn unschedulable(s: &PodStatus) -> Option<&str> {
    s.conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == OFFLOADED && c.reason.as_deref() == Some(reason::UNSCHEDULABLE))
        .map(|c| c.message.as_deref().unwrap_or_default())
}

fn waiting(statuses: &[ContainerStatus]) -> BTreeMap<&str, (&str, &str)> {
    statuses
        .iter()
        .filter_map(|c| {
            let w = c.state.as_ref()?.waiting.as_ref()?;
            let reason = w.reason.as_deref()?;
            Some((
                c.name.as_str(),
                (reason, w.message.as_deref().unwrap_or_default()),
            ))
        })
        .collect()
}

fn all(s: &PodStatus) -> Vec<ContainerStatus> {
    [
        &s.init_container_statuses,
        &s.container_statuses,
        &s.ephemeral_container_statuses,
    ]
    .into_iter()
    .flatten()
    .flatten()
    .cloned()
    .collect()
}

/// The failures new between `before` and `after`: containers that entered a failing wait (a
/// container already waiting for the same reason is not told again), and the provider's
/// scheduler turning the pod down (again only when its message changes).
pub fn new_failures(before: Option<&PodStatus>, after: &PodStatus) -> Vec<Failure> {
    let mut out = Vec::new();
    if let Some(why) = unschedulable(after)
        && before.and_then(unschedulable) != Some(why)
    {
        out.push(Failure {
            reason: "FailedScheduling",
            action: "Scheduling",
            message: why.to_owned(),
        });
    }
    let (prev, now) = (before.map(all).unwrap_or_default(), all(after));
    let (prev, now) = (waiting(&prev), waiting(&now));
    out.extend(
        now.into_iter()
            .filter(|(name, (reason, _))| prev.get(name).map(|p| p.0) != Some(*reason))
            .filter_map(|(name, (reason, message))| {
                let (_, event) = FAILING.iter().find(|(w, _)| *w == reason)?;
                let message = if message.is_empty() {
                    format!("container {name} on the provider: {reason}")
                } else {
                    format!("container {name} on the provider: {reason}: {message}")
                };
                Some(Failure {
                    reason: event,
                    action: "Run",
                    message,
                })
            }),
    );
    out
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateWaiting};

    use super::*;

    fn status(containers: &[(&str, Option<(&str, &str)>)]) -> PodStatus {
        PodStatus {
            container_statuses: Some(
                containers
                    .iter()
                    .map(|(name, w)| ContainerStatus {
                        name: (*name).into(),
                        state: Some(ContainerState {
                            waiting: w.map(|(reason, message)| ContainerStateWaiting {
                                reason: Some(reason.into()),
                                message: (!message.is_empty()).then(|| message.into()),
                            }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn a_failing_wait_is_told_once() {
        let creating = status(&[("app", Some(("ContainerCreating", "")))]);
        let pull = status(&[("app", Some(("ErrImagePull", "lookup registry.invalid")))]);
        assert_eq!(
            new_failures(Some(&creating), &pull),
            [Failure {
                reason: "Failed",
                action: "Run",
                message: "container app on the provider: ErrImagePull: lookup registry.invalid"
                    .into()
            }]
        );
        assert_eq!(new_failures(None, &pull).len(), 1);
        // Still the same: nothing new.
        assert!(new_failures(Some(&pull), &pull).is_empty());
        // Backing off is another step.
        let backoff = status(&[("app", Some(("ImagePullBackOff", "")))]);
        assert_eq!(
            new_failures(Some(&pull), &backoff),
            [Failure {
                reason: "BackOff",
                action: "Run",
                message: "container app on the provider: ImagePullBackOff".into()
            }]
        );
        // Not failures: creating, running.
        assert!(new_failures(None, &creating).is_empty());
        assert!(new_failures(Some(&pull), &status(&[("app", None)])).is_empty());
    }

    #[test]
    fn the_providers_scheduler_turning_the_pod_down_is_told_once_per_reason() {
        let waiting = |message: &str| PodStatus {
            conditions: Some(vec![k8s_openapi::api::core::v1::PodCondition {
                type_: OFFLOADED.into(),
                status: "False".into(),
                reason: Some(reason::UNSCHEDULABLE.into()),
                message: Some(message.into()),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let cpu = waiting("0/1 nodes are available: 1 Insufficient cpu.");
        assert_eq!(
            new_failures(Some(&PodStatus::default()), &cpu),
            [Failure {
                reason: "FailedScheduling",
                action: "Scheduling",
                message: "0/1 nodes are available: 1 Insufficient cpu.".into()
            }]
        );
        assert!(new_failures(Some(&cpu), &cpu).is_empty());
        let taint = waiting("0/1 nodes are available: 1 node(s) had untolerated taint.");
        assert_eq!(new_failures(Some(&cpu), &taint).len(), 1);
        // Placed at last: nothing to tell.
        assert!(new_failures(Some(&cpu), &PodStatus::default()).is_empty());
    }

    #[test]
    fn each_container_on_its_own() {
        let before = status(&[("a", Some(("CrashLoopBackOff", ""))), ("b", None)]);
        let after = status(&[
            ("a", Some(("CrashLoopBackOff", ""))),
            (
                "b",
                Some(("CreateContainerConfigError", "secret \"db\" not found")),
            ),
        ]);
        assert_eq!(
            new_failures(Some(&before), &after),
            [Failure {
                reason: "Failed",
                action: "Run",
                message: "container b on the provider: CreateContainerConfigError: secret \"db\" \
                          not found"
                    .into()
            }]
        );
    }
}
