//! A pod's resource requests as kube-scheduler counts them, the one rule for everything that
//! weighs pods: the provider's capacity policy (what its nodes have free), its admission
//! webhook (what a ShadowPod is charged against the grant) and the test scheduler.
//!
//! The rules are upstream's `PodRequests` (`k8s.io/component-helpers/resource`, which
//! `pkg/api/v1/resource` and the scheduler's NodeResourcesFit call), per resource:
//! - regular containers add up, and so do sidecars (init containers with `restartPolicy:
//!   Always`), which run beside them;
//! - an init container runs alone with the sidecars started before it: the pod needs at least
//!   the largest such sum;
//! - pod-level `spec.resources` (PodLevelResources: CPU, memory, hugepages), when set, is the
//!   pod's request for those resources whatever its containers ask;
//! - `spec.overhead` (the RuntimeClass's) comes on top;
//! - and the pod takes one of its node's `pods`.
//!
//! A pod read from the API server has been defaulted; a PodSpec carried in a ShadowPod has
//! not. So the API server's defaulting (`SetDefaults_Pod`) is applied here too, which changes
//! nothing for a defaulted pod: a container's limit stands for the request it does not give,
//! and a pod-level limit without a pod-level request stands for it unless the containers ask
//! for that resource (then their sum does).
//!
//! [`held`] adds what the kubelet reports of a pod being resized in place (the scheduler
//! takes the larger of spec and status while a resize is in flight). Not counted: DRA claims.
//!
//! [`with_defaults`] gives containers that ask for nothing of a resource the provider's
//! default request, as a LimitRange's `defaultRequest` would: what the provider's pods
//! carry and what its webhook charges, so that no pod runs for free.
use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{Container, ContainerStatus, Pod, PodSpec},
    apimachinery::pkg::api::resource::Quantity,
};

use crate::quantity::{Amounts, BadQuantity, amounts};

/// One of the node's `pods`, as an amount.
const ONE_POD: i128 = 1000;

/// Whether pod-level `spec.resources` may set `resource` (upstream's
/// `IsSupportedPodLevelResource`).
pub fn pod_level(resource: &str) -> bool {
    matches!(resource, "cpu" | "memory") || resource.starts_with("hugepages-")
}

/// Whether `c` is a sidecar: an init container that keeps running beside the regular ones.
pub fn sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

fn add(into: &mut Amounts, more: &Amounts) {
    for (k, v) in more {
        *into.entry(k.clone()).or_default() += v;
    }
}

fn max(into: &mut Amounts, other: &Amounts) {
    for (k, v) in other {
        let e = into.entry(k.clone()).or_default();
        *e = (*e).max(*v);
    }
}

/// A container's requests as the API server stores them: its limits stand for the requests it
/// does not give.
fn container(c: &Container) -> Result<Amounts, BadQuantity> {
    let Some(r) = &c.resources else {
        return Ok(Amounts::new());
    };
    let mut out = r
        .limits
        .as_ref()
        .map(amounts)
        .transpose()?
        .unwrap_or_default();
    out.extend(
        r.requests
            .as_ref()
            .map(amounts)
            .transpose()?
            .unwrap_or_default(),
    );
    Ok(out)
}

/// What the containers ask for together (upstream's `AggregateContainerRequests`).
fn containers(spec: &PodSpec) -> Result<Amounts, BadQuantity> {
    let mut out = Amounts::new();
    for c in &spec.containers {
        add(&mut out, &container(c)?);
    }
    // The sidecars started so far, and the most any init container needs with them.
    let mut sidecars = Amounts::new();
    let mut init = Amounts::new();
    for c in spec.init_containers.iter().flatten() {
        let own = container(c)?;
        if sidecar(c) {
            add(&mut out, &own);
            add(&mut sidecars, &own);
            max(&mut init, &sidecars);
        } else {
            let mut with = own;
            add(&mut with, &sidecars);
            max(&mut init, &with);
        }
    }
    max(&mut out, &init);
    Ok(out)
}

/// The pod-level requests once defaulted, for the resources pod level may set.
fn pod_level_requests(spec: &PodSpec, containers: &Amounts) -> Result<Amounts, BadQuantity> {
    let Some(r) = &spec.resources else {
        return Ok(Amounts::new());
    };
    let pick = |list: Option<&BTreeMap<String, Quantity>>| -> Result<Amounts, BadQuantity> {
        let mut a = list.map(amounts).transpose()?.unwrap_or_default();
        a.retain(|k, _| pod_level(k));
        Ok(a)
    };
    let mut out = pick(r.requests.as_ref())?;
    for (k, limit) in pick(r.limits.as_ref())? {
        if !out.contains_key(&k) {
            out.insert(k.clone(), containers.get(&k).copied().unwrap_or(limit));
        }
    }
    Ok(out)
}

/// What `spec`'s pod requests of its node, in thousandths per resource (`pods` included), or
/// the first quantity in it that is not one.
pub fn pod_requests(spec: &PodSpec) -> Result<Amounts, BadQuantity> {
    let mut out = containers(spec)?;
    let pod = pod_level_requests(spec, &out)?;
    out.extend(pod);
    if let Some(overhead) = &spec.overhead {
        add(&mut out, &amounts(overhead)?);
    }
    *out.entry("pods".to_owned()).or_default() += ONE_POD;
    Ok(out)
}

/// Requests a provider gives containers that ask for none of a resource, by resource (a
/// LimitRange's `defaultRequest`).
pub type Defaults = BTreeMap<String, Quantity>;

/// `spec` as the API server's LimitRanger admission leaves it with `defaults` as a
/// LimitRange's `defaultRequest`: every container, init containers and sidecars included,
/// that neither requests nor limits a resource of `defaults` requests the default. A limit
/// already stands for the request (the API server's defaulting, before admission), so a
/// container with one keeps it. A resource the pod-level `spec.resources` sets is left
/// alone: the pod's request for it is that already, and containers asking for more than it
/// would make the pod invalid.
pub fn with_defaults(spec: &PodSpec, defaults: &Defaults) -> PodSpec {
    let mut out = spec.clone();
    if defaults.is_empty() {
        return out;
    }
    let pod_set = |k: &str| {
        pod_level(k)
            && spec.resources.as_ref().is_some_and(|r| {
                [&r.requests, &r.limits]
                    .into_iter()
                    .any(|l| l.as_ref().is_some_and(|l| l.contains_key(k)))
            })
    };
    let fill = |c: &mut Container| {
        let r = c.resources.get_or_insert_with(Default::default);
        let given = |k: &str| {
            [&r.requests, &r.limits]
                .into_iter()
                .any(|l| l.as_ref().is_some_and(|l| l.contains_key(k)))
        };
        let missing: Vec<(&String, &Quantity)> = defaults
            .iter()
            .filter(|(k, _)| !given(k) && !pod_set(k))
            .collect();
        if !missing.is_empty() {
            let requests = r.requests.get_or_insert_with(Default::default);
            for (k, q) in missing {
                requests.insert(k.clone(), q.clone());
            }
        }
        if c.resources
            .as_ref()
            .is_some_and(|r| *r == Default::default())
        {
            c.resources = None;
        }
    };
    out.containers.iter_mut().for_each(&fill);
    out.init_containers.iter_mut().flatten().for_each(&fill);
    out
}

/// What `pod` holds of its node: [`pod_requests`] with each container's requests the
/// larger of its spec's and those its status reports (`allocatedResources`, and
/// `resources.requests`, which the kubelet reports once actuated), as upstream's
/// `PodRequests` with `UseStatusResources` counts a pod being resized.
pub fn held(pod: &Pod) -> Result<Amounts, BadQuantity> {
    let mut spec = pod.spec.clone().unwrap_or_default();
    let status = pod.status.clone().unwrap_or_default();
    fn widen(c: &mut Container, reported: &[ContainerStatus]) -> Result<(), BadQuantity> {
        let Some(st) = reported.iter().find(|s| s.name == c.name) else {
            return Ok(());
        };
        let mut want = container(c)?;
        if let Some(a) = &st.allocated_resources {
            max(&mut want, &amounts(a)?);
        }
        if let Some(r) = st.resources.as_ref().and_then(|r| r.requests.as_ref()) {
            max(&mut want, &amounts(r)?);
        }
        let resources = c.resources.get_or_insert_with(Default::default);
        resources.requests = Some(crate::quantity::quantities(&want));
        Ok(())
    }
    let main = status.container_statuses.unwrap_or_default();
    for c in &mut spec.containers {
        widen(c, &main)?;
    }
    let init = status.init_container_statuses.unwrap_or_default();
    for c in spec.init_containers.iter_mut().flatten() {
        widen(c, &init)?;
    }
    pod_requests(&spec)
}

#[cfg(test)]
mod tests {
    //! Most cases are upstream's, from `k8s.io/component-helpers/resource/helpers_test.go`
    //! (`TestPodRequestsAndLimits`, `TestPodResourceRequests`, `TestPodLevelResourceRequests`),
    //! named as there.
    use serde_json::{Value, json};

    use super::*;

    fn spec(v: Value) -> PodSpec {
        serde_json::from_value(v).unwrap()
    }

    /// A regular or init container asking for `requests`, limited to `limits`.
    fn c(requests: Value, limits: Value) -> Value {
        json!({"name": "c", "resources": {"requests": requests, "limits": limits}})
    }

    /// A sidecar asking for `requests`.
    fn sc(requests: Value) -> Value {
        json!({"name": "s", "restartPolicy": "Always", "resources": {"requests": requests}})
    }

    fn amounts(pairs: &[(&str, i128)]) -> Amounts {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), *v))
            .chain([("pods".to_owned(), ONE_POD)])
            .collect()
    }

    fn cpu(spec_: Value) -> i128 {
        pod_requests(&spec(spec_)).unwrap()["cpu"]
    }

    #[test]
    fn regular_containers_add_up() {
        // "two container no overhead - should just be sum of containers"
        let s = spec(json!({"containers": [
            c(json!({"cpu": "1", "memory": "5"}), json!({"cpu": "2", "memory": "10"})),
            c(json!({"cpu": "4", "memory": "12"}), json!({"cpu": "8", "memory": "24"})),
        ]}));
        assert_eq!(
            pod_requests(&s),
            Ok(amounts(&[("cpu", 5000), ("memory", 17_000)]))
        );
        // A pod asking for nothing still takes one of the node's pods.
        assert_eq!(
            pod_requests(&spec(json!({"containers": [{"name": "c"}]}))),
            Ok(amounts(&[]))
        );
    }

    #[test]
    fn an_init_container_counts_when_it_needs_more_than_the_containers() {
        // "nil options, larger init container" and "nil options, larger containers"
        assert_eq!(
            cpu(
                json!({"initContainers": [c(json!({"cpu": "4"}), json!({}))],
                "containers": [c(json!({"cpu": "1"}), json!({}))]})
            ),
            4000
        );
        assert_eq!(
            cpu(
                json!({"initContainers": [c(json!({"cpu": "2"}), json!({}))],
                "containers": [c(json!({"cpu": "2"}), json!({})), c(json!({"cpu": "3"}), json!({}))]})
            ),
            5000
        );
    }

    #[test]
    fn sidecars_add_to_the_containers_and_to_the_init_containers_after_them() {
        // "restartable init container": the sidecar runs beside the container.
        assert_eq!(
            cpu(json!({"initContainers": [sc(json!({"cpu": "1"}))],
                "containers": [c(json!({"cpu": "1"}), json!({}))]})),
            2000
        );
        // "multiple restartable init containers": max(5, (1+2+3) + 1) = 7.
        assert_eq!(
            cpu(json!({"initContainers": [
                    c(json!({"cpu": "5"}), json!({})),
                    sc(json!({"cpu": "1"})), sc(json!({"cpu": "2"})), sc(json!({"cpu": "3"}))],
                "containers": [c(json!({"cpu": "1"}), json!({}))]})),
            7000
        );
        // "multiple restartable and regular init containers": init-2 runs with the sidecars
        // started before it, 5 + (1+2) = 8; the one started after it does not count there.
        assert_eq!(
            cpu(json!({"initContainers": [
                    c(json!({"cpu": "5"}), json!({})),
                    sc(json!({"cpu": "1"})), sc(json!({"cpu": "2"})),
                    c(json!({"cpu": "5"}), json!({})),
                    sc(json!({"cpu": "3"}))],
                "containers": [c(json!({"cpu": "1"}), json!({}))]})),
            8000
        );
        // "restartable-init, init and regular": max(10 + 100, 10 + 200) = 210.
        assert_eq!(
            cpu(
                json!({"initContainers": [sc(json!({"cpu": "10"})), c(json!({"cpu": "200"}), json!({}))],
                "containers": [c(json!({"cpu": "100"}), json!({}))]})
            ),
            210_000
        );
    }

    #[test]
    fn overhead_comes_on_top() {
        // "req-and-overhead", "just-overhead" and "pod overhead included".
        let s = spec(
            json!({"containers": [c(json!({"cpu": "1", "memory": "10"}), json!({}))],
            "overhead": {"cpu": "5", "memory": "5"}}),
        );
        assert_eq!(
            pod_requests(&s),
            Ok(amounts(&[("cpu", 6000), ("memory", 15_000)]))
        );
        let s =
            spec(json!({"containers": [{"name": "c"}], "overhead": {"cpu": "5", "memory": "5"}}));
        assert_eq!(
            pod_requests(&s),
            Ok(amounts(&[("cpu", 5000), ("memory", 5000)]))
        );
        assert_eq!(
            cpu(
                json!({"initContainers": [c(json!({"cpu": "2"}), json!({"cpu": "2"}))],
                "containers": [c(json!({"cpu": "2"}), json!({})), c(json!({"cpu": "3"}), json!({}))],
                "overhead": {"cpu": "1", "memory": "1Gi"}})
            ),
            6000
        );
    }

    #[test]
    fn limits_stand_for_missing_requests() {
        // What the API server's defaulting stores; "all-req-lim-and-overhead" with requests.
        let s = spec(json!({"containers": [
            c(json!({"cpu": "1"}), json!({"cpu": "2", "memory": "12", "nvidia.com/gpu": "1"})),
        ]}));
        assert_eq!(
            pod_requests(&s),
            Ok(amounts(&[
                ("cpu", 1000),
                ("memory", 12_000),
                ("nvidia.com/gpu", 1000)
            ]))
        );
        // In init containers and sidecars too.
        assert_eq!(
            cpu(json!({"initContainers": [
                    {"name": "s", "restartPolicy": "Always", "resources": {"limits": {"cpu": "1"}}},
                    c(json!({}), json!({"cpu": "4"}))],
                "containers": [c(json!({}), json!({"cpu": "1"}))]})),
            5000
        );
    }

    #[test]
    fn pod_level_resources_take_precedence() {
        // "both container-level and pod-level resources set"
        let s = spec(
            json!({"resources": {"requests": {"memory": "6Mi", "cpu": "8m"}},
            "containers": [c(json!({"memory": "3Mi", "cpu": "2m"}), json!({}))]}),
        );
        assert_eq!(
            pod_requests(&s),
            Ok(amounts(&[("cpu", 8), ("memory", (6 << 20) * 1000)]))
        );
        // "pod level memory and container level cpu resources": each resource on its own.
        let s = spec(json!({"resources": {"requests": {"memory": "2Mi"}},
            "containers": [c(json!({"cpu": "2m"}), json!({}))]}));
        assert_eq!(
            pod_requests(&s),
            Ok(amounts(&[("cpu", 2), ("memory", (2 << 20) * 1000)]))
        );
        // "pod-level resources, container-level resources, init and sidecar container set"
        let s = spec(
            json!({"resources": {"requests": {"memory": "15Mi", "cpu": "18m"}},
            "initContainers": [sc(json!({"memory": "5Mi", "cpu": "4m"})),
                c(json!({"memory": "6Mi", "cpu": "8m"}), json!({}))],
            "containers": [c(json!({"memory": "3Mi", "cpu": "2m"}), json!({}))]}),
        );
        assert_eq!(
            pod_requests(&s),
            Ok(amounts(&[("cpu", 18), ("memory", (15 << 20) * 1000)]))
        );
        // "pod level unsupported resources set at pod-level": not a pod-level resource.
        let s = spec(json!({"resources": {"requests": {"storage": "2Mi"}},
            "containers": [c(json!({"memory": "3Mi"}), json!({}))]}));
        assert_eq!(
            pod_requests(&s),
            Ok(amounts(&[("memory", (3 << 20) * 1000)]))
        );
        // "pod-level resources, container-level resources, hugepage request/limit multiple
        // page sizes between pod-level and container-level"
        let s = spec(json!({
            "resources": {"limits": {"hugepages-2Mi": "10Mi"},
                "requests": {"cpu": "1", "hugepages-2Mi": "10Mi"}},
            "containers": [c(json!({"memory": "4Mi", "hugepages-1Gi": "1Gi"}),
                json!({"hugepages-1Gi": "1Gi"}))]}));
        assert_eq!(
            pod_requests(&s),
            Ok(amounts(&[
                ("cpu", 1000),
                ("memory", (4 << 20) * 1000),
                ("hugepages-2Mi", (10 << 20) * 1000),
                ("hugepages-1Gi", (1 << 30) * 1000),
            ]))
        );
        // Overhead still comes on top of pod-level requests.
        let s = spec(json!({"resources": {"requests": {"cpu": "1"}},
            "containers": [{"name": "c"}], "overhead": {"cpu": "100m"}}));
        assert_eq!(pod_requests(&s), Ok(amounts(&[("cpu", 1100)])));
    }

    #[test]
    fn a_pod_level_limit_stands_for_its_missing_request() {
        // As the API server defaults it: the limit when no container asks for the resource...
        let s = spec(
            json!({"resources": {"limits": {"cpu": "2", "memory": "1Gi"}},
            "containers": [c(json!({"cpu": "500m"}), json!({}))]}),
        );
        assert_eq!(
            pod_requests(&s),
            Ok(amounts(&[("cpu", 500), ("memory", (1 << 30) * 1000)]))
        );
        // ...the containers' sum when they do, even of zero.
        let s = spec(json!({"resources": {"limits": {"cpu": "2"}},
            "containers": [c(json!({"cpu": "0"}), json!({}))]}));
        assert_eq!(pod_requests(&s), Ok(amounts(&[("cpu", 0)])));
    }

    #[test]
    fn a_quantity_that_is_not_one_is_the_error() {
        for s in [
            json!({"containers": [c(json!({"cpu": "lots"}), json!({}))]}),
            json!({"containers": [c(json!({}), json!({"cpu": "lots"}))]}),
            json!({"containers": [], "initContainers": [sc(json!({"cpu": "lots"}))]}),
            json!({"containers": [], "overhead": {"cpu": "lots"}}),
            json!({"containers": [], "resources": {"requests": {"cpu": "lots"}}}),
        ] {
            assert_eq!(
                pod_requests(&spec(s.clone())),
                Err(BadQuantity("lots".into())),
                "{s}"
            );
        }
    }

    #[test]
    fn a_pod_being_resized_holds_the_larger_of_spec_and_what_it_reports() {
        let pod = |status: serde_json::Value| -> Pod {
            serde_json::from_value(json!({
                "spec": {"containers": [c(json!({"cpu": "100m", "memory": "64Mi"}), json!({}))]},
                "status": status,
            }))
            .unwrap()
        };
        let mem = 64 * (1 << 20) * 1000;
        // Nothing reported: the spec.
        assert_eq!(
            held(&pod(json!({}))),
            Ok(amounts(&[("cpu", 100), ("memory", mem)]))
        );
        // Shrunk in the spec, the kubelet still holding 1 CPU: 1 CPU.
        let reported = json!({"containerStatuses": [{"name": "c", "image": "", "imageID": "",
            "ready": true, "restartCount": 0, "allocatedResources": {"cpu": "1"},
            "resources": {"requests": {"cpu": "500m"}}}]});
        assert_eq!(
            held(&pod(reported)),
            Ok(amounts(&[("cpu", 1000), ("memory", mem)]))
        );
        // Once it reports the shrink: the spec again.
        let done = json!({"containerStatuses": [{"name": "c", "image": "", "imageID": "",
            "ready": true, "restartCount": 0, "allocatedResources": {"cpu": "100m"}}]});
        assert_eq!(
            held(&pod(done)),
            Ok(amounts(&[("cpu", 100), ("memory", mem)]))
        );
        // Another container's status counts for nothing.
        let other = json!({"containerStatuses": [{"name": "gone", "image": "", "imageID": "",
            "ready": true, "restartCount": 0, "allocatedResources": {"cpu": "4"}}]});
        assert_eq!(
            held(&pod(other)),
            Ok(amounts(&[("cpu", 100), ("memory", mem)]))
        );
    }

    fn defaults() -> Defaults {
        [("cpu", "100m"), ("memory", "128Mi")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), Quantity(v.to_owned())))
            .collect()
    }

    const MI128: i128 = (128 << 20) * 1000;

    #[test]
    fn a_container_that_asks_for_nothing_gets_the_default_requests() {
        let s = with_defaults(&spec(json!({"containers": [{"name": "c"}]})), &defaults());
        assert_eq!(
            s.containers[0].resources.as_ref().unwrap().requests,
            Some(defaults())
        );
        assert_eq!(
            pod_requests(&s),
            Ok(amounts(&[("cpu", 100), ("memory", MI128)]))
        );
        // Init containers and sidecars too, each counted as the scheduler counts it:
        // max(init 100m, sidecar 100m + container 100m) = 200m.
        let s = with_defaults(
            &spec(
                json!({"initContainers": [{"name": "i"}, {"name": "s", "restartPolicy": "Always"}],
                "containers": [{"name": "c"}]}),
            ),
            &defaults(),
        );
        assert_eq!(
            pod_requests(&s),
            Ok(amounts(&[("cpu", 200), ("memory", 2 * MI128)]))
        );
        // No defaults: nothing changes.
        let bare = spec(json!({"containers": [{"name": "c"}]}));
        assert_eq!(with_defaults(&bare, &Defaults::new()), bare);
    }

    #[test]
    fn what_a_container_asks_or_limits_is_kept() {
        // A request stays; only the resource it does not name is defaulted.
        let s = with_defaults(
            &spec(json!({"containers": [c(json!({"cpu": "2"}), json!({}))]})),
            &defaults(),
        );
        assert_eq!(
            pod_requests(&s),
            Ok(amounts(&[("cpu", 2000), ("memory", MI128)]))
        );
        // A limit stands for the request, as the API server defaults it, even below the
        // default.
        let s = with_defaults(
            &spec(json!({"containers": [c(json!({}), json!({"cpu": "50m", "memory": "1Gi"}))]})),
            &defaults(),
        );
        assert_eq!(
            pod_requests(&s),
            Ok(amounts(&[("cpu", 50), ("memory", (1 << 30) * 1000)]))
        );
        let requests = s.containers[0].resources.as_ref().unwrap().requests.clone();
        assert!(requests.unwrap_or_default().is_empty());
    }

    #[test]
    fn pod_level_resources_are_not_defaulted_over() {
        // Pod-level cpu is the pod's cpu request: its containers get no cpu default (which
        // could go past it, an invalid pod), memory still.
        for pod_level in [
            json!({"requests": {"cpu": "30m"}}),
            json!({"limits": {"cpu": "30m"}}),
        ] {
            let s = with_defaults(
                &spec(
                    json!({"resources": pod_level, "containers": [{"name": "a"}, {"name": "b"}]}),
                ),
                &defaults(),
            );
            assert_eq!(
                pod_requests(&s),
                Ok(amounts(&[("cpu", 30), ("memory", 2 * MI128)])),
                "{pod_level}"
            );
            assert!(s.containers.iter().all(|c| {
                !c.resources
                    .as_ref()
                    .unwrap()
                    .requests
                    .as_ref()
                    .unwrap()
                    .contains_key("cpu")
            }));
        }
    }
}
