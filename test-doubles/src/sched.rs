//! The test scheduler's decisions, free of I/O: whether a pod fits a node (node selector,
//! required node affinity, taints and tolerations, resource requests against what is left of
//! the node's allocatable, unschedulable nodes), which node to pick, and the message an
//! unschedulable pod gets, worded as kube-scheduler's. The binary
//! (`fabric-test-scheduler`) feeds it from watches and binds through `pods/binding`.
use std::collections::{BTreeMap, BTreeSet};

use fabric_api::{quantity::BadQuantity, requests};
use k8s_openapi::api::core::v1::{
    Node, NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSpec, Taint, Toleration,
};

use fabric_api::quantity::milli;

pub mod volumes;

/// Why a pod does not fit a node; several reasons are counted per kind in the message.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Misfit {
    Unschedulable,
    /// `nodeSelector` or required node affinity.
    Affinity,
    /// A NoSchedule/NoExecute taint the pod does not tolerate (`key=value:effect`).
    Taint(String),
    /// Not enough of this resource left.
    Insufficient(String),
    /// A request or an allocatable amount that is not a quantity.
    BadQuantity(String),
    /// A bound claim's PV does not admit the node.
    VolumeNodeAffinity,
    /// A bound claim's PV does not exist.
    VolumeMissing,
    /// An unbound claim has neither a PV for the node nor a provisioner.
    NoVolumeToBind,
}

impl Misfit {
    fn describe(&self) -> String {
        match self {
            Misfit::Unschedulable => "node(s) were unschedulable".into(),
            Misfit::Affinity => "node(s) didn't match Pod's node affinity/selector".into(),
            Misfit::Taint(t) => format!("node(s) had untolerated taint {{{t}}}"),
            Misfit::Insufficient(r) => format!("Insufficient {r}"),
            Misfit::BadQuantity(q) => format!("invalid quantity {q}"),
            Misfit::VolumeNodeAffinity => "node(s) had volume node affinity conflict".into(),
            Misfit::VolumeMissing => {
                "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)".into()
            }
            Misfit::NoVolumeToBind => {
                "node(s) didn't find available persistent volumes to bind".into()
            }
        }
    }
}

/// Resource amounts in thousandths (see [`fabric_api::quantity`]), by resource name.
pub type Resources = fabric_api::quantity::Amounts;

/// Is a pod still holding its node's resources (bound and not finished)?
pub fn holds_resources(p: &Pod) -> bool {
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded" | "Failed"))
}

/// The pod's requests as kube-scheduler counts them ([`fabric_api::requests`]).
pub fn pod_requests(p: &Pod) -> Result<Resources, Misfit> {
    let none = PodSpec::default();
    requests::pod_requests(p.spec.as_ref().unwrap_or(&none))
        .map_err(|BadQuantity(q)| Misfit::BadQuantity(q))
}

fn allocatable(n: &Node) -> Result<Resources, Misfit> {
    let st = n.status.as_ref();
    let map = st
        .and_then(|s| s.allocatable.as_ref())
        .or(st.and_then(|s| s.capacity.as_ref()));
    let mut r = Resources::new();
    for (k, q) in map.into_iter().flatten() {
        r.insert(
            k.clone(),
            milli(&q.0).map_err(|_| Misfit::BadQuantity(q.0.clone()))?,
        );
    }
    Ok(r)
}

fn labels(n: &Node) -> BTreeMap<String, String> {
    n.metadata.labels.clone().unwrap_or_default()
}

fn requirement_holds(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let num = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => !value.is_some_and(|v| values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (value.and_then(num), values.first().and_then(|b| num(b)))
            else {
                return false;
            };
            if r.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

fn term_matches(t: &NodeSelectorTerm, n: &Node) -> bool {
    let labels = labels(n);
    let exprs = t.match_expressions.as_deref().unwrap_or_default();
    let fields = t.match_fields.as_deref().unwrap_or_default();
    // An empty term matches nothing, as upstream.
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    exprs
        .iter()
        .all(|r| requirement_holds(r, labels.get(&r.key).map(String::as_str)))
        && fields.iter().all(|r| {
            let v = (r.key == "metadata.name")
                .then_some(n.metadata.name.as_deref())
                .flatten();
            requirement_holds(r, v)
        })
}

fn affinity_matches(p: &Pod, n: &Node) -> bool {
    let Some(spec) = &p.spec else { return true };
    let labels = labels(n);
    if let Some(sel) = &spec.node_selector
        && !sel.iter().all(|(k, v)| labels.get(k) == Some(v))
    {
        return false;
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    match required {
        Some(sel) => sel.node_selector_terms.iter().any(|t| term_matches(t, n)),
        None => true,
    }
}

/// Does `t` tolerate `taint` (upstream's `ToleratesTaint`)?
pub fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if t.effect
        .as_deref()
        .is_some_and(|e| !e.is_empty() && e != taint.effect)
    {
        return false;
    }
    let key = t.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        // An empty key with Equal is refused by validation; treat it as matching nothing.
        "Equal" => {
            !key.is_empty()
                && t.value.as_deref().unwrap_or_default()
                    == taint.value.as_deref().unwrap_or_default()
        }
        _ => false,
    }
}

fn untolerated_taint(p: &Pod, n: &Node) -> Option<String> {
    let tols = p
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    let taints = n
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default();
    taints
        .iter()
        .filter(|t| matches!(t.effect.as_str(), "NoSchedule" | "NoExecute"))
        .find(|taint| !tols.iter().any(|t| tolerates(t, taint)))
        .map(|t| {
            let value = t
                .value
                .as_deref()
                .map(|v| format!("={v}"))
                .unwrap_or_default();
            format!("{}{value}:{}", t.key, t.effect)
        })
}

/// Every reason `pod` does not fit `node`, given the pods already bound there; empty when it
/// fits.
pub fn misfits(pod: &Pod, node: &Node, bound: &[&Pod]) -> Vec<Misfit> {
    let mut out = Vec::new();
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        out.push(Misfit::Unschedulable);
    }
    if !affinity_matches(pod, node) {
        out.push(Misfit::Affinity);
    }
    if let Some(t) = untolerated_taint(pod, node) {
        out.push(Misfit::Taint(t));
    }
    let want = match pod_requests(pod) {
        Ok(w) => w,
        Err(m) => {
            out.push(m);
            return out;
        }
    };
    let mut free = match allocatable(node) {
        Ok(a) => a,
        Err(m) => {
            out.push(m);
            return out;
        }
    };
    for b in bound.iter().filter(|b| holds_resources(b)) {
        match pod_requests(b) {
            Ok(r) => {
                for (k, v) in r {
                    *free.entry(k).or_default() -= v;
                }
            }
            // A bound pod's bad request was already refused when it was scheduled.
            Err(_) => continue,
        }
    }
    for (res, amount) in want.iter().filter(|(_, v)| **v > 0) {
        if free.get(res).copied().unwrap_or(0) < *amount {
            out.push(Misfit::Insufficient(res.clone()));
        }
    }
    out
}

/// The scheduler's verdict for one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Bind(String),
    /// The `PodScheduled=False` message, as kube-scheduler words it.
    Unschedulable(String),
}

/// Picks a node for `pod` among `nodes`, given every pod known (bound ones count against
/// their node) and the cluster's storage ([`volumes`]). Among the nodes that fit, the one with
/// the fewest pods bound wins (then the name), which spreads pods as the default scoring
/// roughly does.
pub fn decide(pod: &Pod, nodes: &[&Node], pods: &[&Pod], vols: &volumes::Volumes<'_>) -> Decision {
    let claims = match volumes::pre_filter(pod, vols) {
        Ok(c) => c,
        Err(msg) => {
            return Decision::Unschedulable(format!(
                "0/{} nodes are available: {msg}.",
                nodes.len()
            ));
        }
    };
    let mut counts: BTreeMap<Misfit, usize> = BTreeMap::new();
    let mut best: Option<(usize, &str)> = None;
    for n in nodes {
        let Some(name) = n.metadata.name.as_deref() else {
            continue;
        };
        let bound: Vec<&Pod> = pods
            .iter()
            .copied()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name))
            .collect();
        let mut m = misfits(pod, n, &bound);
        if let Err(v) = volumes::filter(&claims, n, vols) {
            m.push(v);
        }
        if m.is_empty() {
            let load = bound.iter().filter(|b| holds_resources(b)).count();
            if best.is_none_or(|(l, bn)| (load, name) < (l, bn)) {
                best = Some((load, name));
            }
        } else {
            // One node counts once per kind of reason.
            for r in m.into_iter().collect::<BTreeSet<_>>() {
                *counts.entry(r).or_default() += 1;
            }
        }
    }
    if let Some((_, name)) = best {
        return Decision::Bind(name.to_owned());
    }
    let mut reasons: Vec<String> = counts
        .iter()
        .map(|(m, c)| format!("{c} {}", m.describe()))
        .collect();
    reasons.sort();
    let mut msg = format!("0/{} nodes are available", nodes.len());
    if !reasons.is_empty() {
        msg += &format!(": {}", reasons.join(", "));
    }
    msg.push('.');
    Decision::Unschedulable(msg)
}

/// Whether the scheduler should look at this pod: not bound, not being deleted, not finished,
/// and addressed to it (`spec.schedulerName` empty or `default-scheduler`).
pub fn wants_scheduling(p: &Pod) -> bool {
    let Some(spec) = &p.spec else { return false };
    spec.node_name.as_deref().unwrap_or_default().is_empty()
        && p.metadata.deletion_timestamp.is_none()
        && holds_resources(p)
        && matches!(
            spec.scheduler_name.as_deref(),
            None | Some("") | Some(DEFAULT_SCHEDULER)
        )
}

pub const DEFAULT_SCHEDULER: &str = "default-scheduler";

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn node(v: serde_json::Value) -> Node {
        let mut base = json!({
            "metadata": {"name": "n", "labels": {}},
            "spec": {},
            "status": {"allocatable": {"cpu": "2", "memory": "1Gi", "pods": "10"}},
        });
        merge(&mut base, v);
        serde_json::from_value(base).unwrap()
    }

    fn pod(v: serde_json::Value) -> Pod {
        let mut base = json!({
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "c"}]},
        });
        merge(&mut base, v);
        serde_json::from_value(base).unwrap()
    }

    fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn requesting(cpu: &str, extra: serde_json::Value) -> Pod {
        pod(json!({"spec": {"containers": [
            {"name": "c", "resources": {"requests": merge_into(json!({"cpu": cpu}), extra)}}
        ]}}))
    }

    fn merge_into(mut a: serde_json::Value, b: serde_json::Value) -> serde_json::Value {
        merge(&mut a, b);
        a
    }

    #[test]
    fn a_plain_pod_fits_a_plain_node() {
        assert!(misfits(&pod(json!({})), &node(json!({})), &[]).is_empty());
    }

    #[test]
    fn node_selector_must_match_every_label() {
        let n = node(json!({"metadata": {"labels": {"zone": "a", "gpu": "yes"}}}));
        let fits = pod(json!({"spec": {"nodeSelector": {"zone": "a"}}}));
        let misses = pod(json!({"spec": {"nodeSelector": {"zone": "a", "gpu": "no"}}}));
        assert!(misfits(&fits, &n, &[]).is_empty());
        assert_eq!(misfits(&misses, &n, &[]), vec![Misfit::Affinity]);
    }

    #[test]
    fn required_node_affinity_operators() {
        let n = node(json!({"metadata": {"labels": {"zone": "a", "size": "5"}}}));
        let with = |exprs: serde_json::Value| {
            pod(json!({"spec": {"affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": exprs}]}}}}}))
        };
        let ok = |exprs| misfits(&with(exprs), &n, &[]).is_empty();
        assert!(ok(
            json!([{"key": "zone", "operator": "In", "values": ["a", "b"]}])
        ));
        assert!(!ok(
            json!([{"key": "zone", "operator": "In", "values": ["b"]}])
        ));
        assert!(ok(
            json!([{"key": "zone", "operator": "NotIn", "values": ["b"]}])
        ));
        assert!(!ok(
            json!([{"key": "zone", "operator": "NotIn", "values": ["a"]}])
        ));
        assert!(ok(json!([{"key": "zone", "operator": "Exists"}])));
        assert!(!ok(json!([{"key": "gpu", "operator": "Exists"}])));
        assert!(ok(json!([{"key": "gpu", "operator": "DoesNotExist"}])));
        assert!(!ok(json!([{"key": "zone", "operator": "DoesNotExist"}])));
        assert!(ok(
            json!([{"key": "size", "operator": "Gt", "values": ["4"]}])
        ));
        assert!(!ok(
            json!([{"key": "size", "operator": "Lt", "values": ["4"]}])
        ));
        // Expressions of a term are ANDed.
        assert!(!ok(json!([
            {"key": "zone", "operator": "Exists"},
            {"key": "gpu", "operator": "Exists"}
        ])));
        // Terms are ORed.
        let either = pod(json!({"spec": {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}
        ]}}}}}));
        assert!(misfits(&either, &n, &[]).is_empty());
    }

    #[test]
    fn taints_need_tolerations() {
        let n = node(json!({"spec": {"taints": [
            {"key": "virtual-node.fabric.io/not-allowed", "value": "true", "effect": "NoExecute"},
            {"key": "soft", "effect": "PreferNoSchedule"}
        ]}}));
        let plain = pod(json!({}));
        assert_eq!(
            misfits(&plain, &n, &[]),
            vec![Misfit::Taint(
                "virtual-node.fabric.io/not-allowed=true:NoExecute".into()
            )]
        );
        for tol in [
            json!({"key": "virtual-node.fabric.io/not-allowed", "operator": "Exists"}),
            json!({"key": "virtual-node.fabric.io/not-allowed", "value": "true"}),
            json!({"operator": "Exists"}),
            json!({"operator": "Exists", "effect": "NoExecute"}),
        ] {
            let p = pod(json!({"spec": {"tolerations": [tol.clone()]}}));
            assert!(misfits(&p, &n, &[]).is_empty(), "{tol}");
        }
        for tol in [
            json!({"key": "virtual-node.fabric.io/not-allowed", "value": "false"}),
            json!({"operator": "Exists", "effect": "NoSchedule"}),
            json!({"key": "other", "operator": "Exists"}),
        ] {
            let p = pod(json!({"spec": {"tolerations": [tol.clone()]}}));
            assert!(!misfits(&p, &n, &[]).is_empty(), "{tol}");
        }
    }

    /// The pods the consumer's pod webhook places ([`fabric_offloading::pod_placement`]) go
    /// where kube-scheduler sends them: the selected virtual nodes (tainted, labelled as
    /// such), the real nodes too with LocalAndRemote, the real nodes only with Local; a pod's
    /// own matchFields still narrow the choice.
    #[test]
    fn offloaded_pods_go_where_the_webhook_placed_them() {
        use fabric_api::{
            names::{label, taint},
            offloading::v1alpha1::{NamespaceOffloading, NamespaceOffloadingSpec},
        };
        let virtual_node = |name: &str, region: &str| {
            node(json!({"metadata": {"name": name, "labels": {
                    label::NODE_TYPE: label::VIRTUAL_NODE_TYPE, "region": region}},
                "spec": {"taints": [{"key": taint::VIRTUAL_NODE, "value": "true",
                                     "effect": "NoExecute"}]}}))
        };
        let eu = virtual_node("v-eu", "eu");
        let us = virtual_node("v-us", "us");
        let real = node(json!({"metadata": {"name": "r1", "labels": {"region": "eu"}}}));
        let placed = |strategy: &str, own: serde_json::Value| {
            let spec: NamespaceOffloadingSpec = serde_json::from_value(json!({
                "podOffloadingStrategy": strategy,
                "clusterSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "region", "operator": "In", "values": ["eu"]}]}]},
            }))
            .unwrap();
            let o = NamespaceOffloading::new("offloading", spec);
            let mut p = serde_json::to_value(pod(own)).unwrap();
            if let Some(patch) =
                fabric_offloading::pod_placement::mutate("shop", &p, Some(&o)).unwrap()
            {
                json_patch::patch(&mut p, &patch.0).unwrap();
            }
            serde_json::from_value::<Pod>(p).unwrap()
        };
        let fits = |p: &Pod| -> Vec<&str> {
            [&eu, &us, &real]
                .into_iter()
                .filter(|n| misfits(p, n, &[]).is_empty())
                .map(|n| n.metadata.name.as_deref().unwrap())
                .collect()
        };
        assert_eq!(fits(&placed("Remote", json!({}))), ["v-eu"]);
        assert_eq!(fits(&placed("LocalAndRemote", json!({}))), ["v-eu", "r1"]);
        assert_eq!(fits(&placed("Local", json!({}))), ["r1"]);
        let pinned = json!({"spec": {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["r1"]}]}
        ]}}}}});
        assert_eq!(fits(&placed("LocalAndRemote", pinned.clone())), ["r1"]);
        assert!(fits(&placed("Remote", pinned)).is_empty());
    }

    #[test]
    fn requests_count_against_what_bound_pods_left() {
        let n = node(json!({"status": {"allocatable": {"nvidia.com/gpu": "1"}}}));
        let big = requesting("1500m", json!({}));
        assert!(misfits(&big, &n, &[]).is_empty());
        let mut running = requesting("1", json!({}));
        assert_eq!(
            misfits(&big, &n, &[&running]),
            vec![Misfit::Insufficient("cpu".into())]
        );
        // A finished pod gives its share back.
        running.status = Some(serde_json::from_value(json!({"phase": "Succeeded"})).unwrap());
        assert!(misfits(&big, &n, &[&running]).is_empty());
        let gpu = requesting("100m", json!({"nvidia.com/gpu": "1"}));
        assert!(misfits(&gpu, &n, &[]).is_empty());
        assert_eq!(
            misfits(&gpu, &n, &[&gpu]),
            vec![Misfit::Insufficient("nvidia.com/gpu".into())]
        );
        // A resource the node does not have at all.
        let fpga = requesting("100m", json!({"example.com/fpga": "1"}));
        assert_eq!(
            misfits(&fpga, &n, &[]),
            vec![Misfit::Insufficient("example.com/fpga".into())]
        );
        let mem = requesting("1m", json!({"memory": "2Gi"}));
        assert_eq!(
            misfits(&mem, &n, &[]),
            vec![Misfit::Insufficient("memory".into())]
        );
    }

    #[test]
    fn the_pod_count_is_a_resource_and_limits_stand_in_for_requests() {
        let n = node(json!({"status": {"allocatable": {"pods": "1"}}}));
        let a = pod(json!({}));
        assert!(misfits(&a, &n, &[]).is_empty());
        assert_eq!(
            misfits(&a, &n, &[&a]),
            vec![Misfit::Insufficient("pods".into())]
        );
        let limited = pod(json!({"spec": {"containers": [
            {"name": "c", "resources": {"limits": {"cpu": "3"}}}]}}));
        assert_eq!(pod_requests(&limited).unwrap()["cpu"], 3000);
        let init = pod(json!({"spec": {
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
            "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "2"}}}]}}));
        assert_eq!(pod_requests(&init).unwrap()["cpu"], 2000);
    }

    #[test]
    fn sidecars_overhead_and_pod_level_requests_count_as_kube_scheduler_counts_them() {
        // Each was left out before: a pod the real scheduler would refuse was bound.
        let n = node(json!({"status": {"allocatable": {"cpu": "2"}}}));
        let sidecar = pod(json!({"spec": {
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1500m"}}}],
            "initContainers": [{"name": "s", "restartPolicy": "Always",
                "resources": {"requests": {"cpu": "1"}}}]}}));
        assert_eq!(pod_requests(&sidecar).unwrap()["cpu"], 2500);
        assert_eq!(
            misfits(&sidecar, &n, &[]),
            vec![Misfit::Insufficient("cpu".into())]
        );
        let overhead = pod(json!({"spec": {
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1500m"}}}],
            "overhead": {"cpu": "600m"}}}));
        assert_eq!(
            misfits(&overhead, &n, &[]),
            vec![Misfit::Insufficient("cpu".into())]
        );
        let pod_level = pod(json!({"spec": {"resources": {"requests": {"cpu": "3"}}}}));
        assert_eq!(
            misfits(&pod_level, &n, &[]),
            vec![Misfit::Insufficient("cpu".into())]
        );
    }

    #[test]
    fn unschedulable_nodes_are_skipped() {
        let n = node(json!({"spec": {"unschedulable": true}}));
        assert_eq!(
            misfits(&pod(json!({})), &n, &[]),
            vec![Misfit::Unschedulable]
        );
    }

    #[test]
    fn decide_spreads_and_explains() {
        let a = node(json!({"metadata": {"name": "a"}}));
        let b = node(json!({"metadata": {"name": "b"}}));
        let on_a = pod(json!({"metadata": {"name": "x"}, "spec": {"nodeName": "a"}}));
        assert_eq!(
            decide(
                &pod(json!({})),
                &[&a, &b],
                &[&on_a],
                &volumes::Volumes::default()
            ),
            Decision::Bind("b".into())
        );
        let tainted = node(json!({"metadata": {"name": "t"},
            "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}}));
        let picky = pod(json!({"spec": {"nodeSelector": {"zone": "z"},
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "64"}}}]}}));
        assert_eq!(
            decide(
                &picky,
                &[&a, &b, &tainted],
                &[],
                &volumes::Volumes::default()
            ),
            Decision::Unschedulable(
                "0/3 nodes are available: 1 node(s) had untolerated taint {k:NoSchedule}, \
                 3 Insufficient cpu, 3 node(s) didn't match Pod's node affinity/selector."
                    .into()
            )
        );
        assert_eq!(
            decide(&pod(json!({})), &[], &[], &volumes::Volumes::default()),
            Decision::Unschedulable("0/0 nodes are available.".into())
        );
    }

    mod storage_binding {
        use k8s_openapi::api::{
            core::v1::{PersistentVolume, PersistentVolumeClaim},
            storage::v1::StorageClass,
        };

        use super::*;
        use crate::sched::volumes::{Prebind, Volumes, filter, pre_filter};

        fn with_claim() -> Pod {
            pod(json!({"spec": {"volumes": [
                {"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]}}))
        }

        fn claim(v: serde_json::Value) -> PersistentVolumeClaim {
            let mut base = json!({
                "metadata": {"name": "data", "namespace": "default", "uid": "u1"},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "standard",
                         "resources": {"requests": {"storage": "1Gi"}}},
            });
            merge(&mut base, v);
            serde_json::from_value(base).unwrap()
        }

        fn pv_on(node: &str, class: &str) -> PersistentVolume {
            serde_json::from_value(json!({
                "metadata": {"name": format!("pv-{node}")},
                "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
                         "storageClassName": class, "hostPath": {"path": "/x"},
                         "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                             {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}},
                "status": {"phase": "Available"},
            }))
            .unwrap()
        }

        fn class(name: &str, mode: &str, provisioner: &str) -> StorageClass {
            serde_json::from_value(json!({"metadata": {"name": name},
                "provisioner": provisioner, "volumeBindingMode": mode}))
            .unwrap()
        }

        fn nodes() -> (Node, Node) {
            let n = |name: &str| {
                node(json!({"metadata": {"name": name,
                    "labels": {"kubernetes.io/hostname": name}}}))
            };
            (n("a"), n("b"))
        }

        fn decide_with(
            claims: &[&PersistentVolumeClaim],
            pvs: &[&PersistentVolume],
            classes: &[&StorageClass],
        ) -> Decision {
            let (a, b) = nodes();
            let v = Volumes {
                claims,
                volumes: pvs,
                classes,
            };
            decide(&with_claim(), &[&a, &b], &[], &v)
        }

        #[test]
        fn a_missing_or_immediate_unbound_claim_is_refused_with_upstreams_message() {
            assert_eq!(
                decide_with(&[], &[], &[]),
                Decision::Unschedulable(
                    "0/2 nodes are available: persistentvolumeclaim \"data\" not found.".into()
                )
            );
            let fast = class("fast", "Immediate", "fabric-test/hostpath");
            let c = claim(json!({"spec": {"storageClassName": "fast"}}));
            assert_eq!(
                decide_with(&[&c], &[], &[&fast]),
                Decision::Unschedulable(
                    "0/2 nodes are available: pod has unbound immediate PersistentVolumeClaims."
                        .into()
                )
            );
        }

        #[test]
        fn a_bound_claim_pulls_the_pod_to_its_volumes_node() {
            let pv = pv_on("b", "standard");
            let c = claim(json!({"spec": {"volumeName": "pv-b"}}));
            // Without the volume, "a" would win on the name.
            assert_eq!(decide_with(&[&c], &[&pv], &[]), Decision::Bind("b".into()));
            let elsewhere = pv_on("c", "standard");
            let c = claim(json!({"spec": {"volumeName": "pv-c"}}));
            assert_eq!(
                decide_with(&[&c], &[&elsewhere], &[]),
                Decision::Unschedulable(
                    "0/2 nodes are available: 2 node(s) had volume node affinity conflict.".into()
                )
            );
        }

        #[test]
        fn a_delayed_claim_selects_the_node_or_a_volume_there() {
            let wffc = class("standard", "WaitForFirstConsumer", "fabric-test/hostpath");
            let c = claim(json!({}));
            assert_eq!(
                decide_with(&[&c], &[], &[&wffc]),
                Decision::Bind("a".into())
            );
            let (a, b) = nodes();
            let (claims, classes) = ([&c], [&wffc]);
            let v = Volumes {
                claims: &claims,
                volumes: &[],
                classes: &classes,
            };
            let found = pre_filter(&with_claim(), &v).unwrap();
            assert_eq!(
                filter(&found, &a, &v),
                Ok(vec![Prebind::SelectNode {
                    namespace: "default".into(),
                    claim: "data".into(),
                    node: "a".into()
                }])
            );
            // A static volume on "b" and no provisioner: only "b" fits, by claiming it.
            let local = class(
                "standard",
                "WaitForFirstConsumer",
                "kubernetes.io/no-provisioner",
            );
            let pv = pv_on("b", "standard");
            assert_eq!(
                decide_with(&[&c], &[&pv], &[&local]),
                Decision::Bind("b".into())
            );
            let (pvs, classes) = ([&pv], [&local]);
            let v = Volumes {
                claims: &claims,
                volumes: &pvs,
                classes: &classes,
            };
            let found = pre_filter(&with_claim(), &v).unwrap();
            assert_eq!(
                filter(&found, &b, &v),
                Ok(vec![Prebind::ClaimVolume {
                    volume: "pv-b".into(),
                    namespace: "default".into(),
                    claim: "data".into(),
                    uid: "u1".into()
                }])
            );
            assert_eq!(
                decide_with(&[&c], &[], &[&local]),
                Decision::Unschedulable(
                    "0/2 nodes are available: 2 node(s) didn't find available persistent volumes to bind."
                        .into()
                )
            );
        }
    }

    #[test]
    fn only_unbound_live_pods_of_the_default_scheduler_are_wanted() {
        assert!(wants_scheduling(&pod(json!({}))));
        assert!(!wants_scheduling(&pod(json!({"spec": {"nodeName": "a"}}))));
        assert!(!wants_scheduling(&pod(
            json!({"spec": {"schedulerName": "other"}})
        )));
        assert!(!wants_scheduling(&pod(json!({"metadata": {
            "deletionTimestamp": "2026-01-01T00:00:00Z"}}))));
    }
}
