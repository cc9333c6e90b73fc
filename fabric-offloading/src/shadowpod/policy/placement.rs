//! Where tenants' pods run on the provider, and with which priority and runtime: the
//! provider admin's choice, never the consumer's. A consumer's pod may repeat what the admin
//! set (a node selector entry, a toleration, the tenants' priority class, a runtime class on
//! the allow-list) and nothing else; the real pod always gets the admin's node selector,
//! tolerations and priority class ([`Placement::apply`]), so a pod the consumer wrote without
//! them still lands only where the admin lends nodes.
//!
//! Why so strict: a toleration of `node-role.kubernetes.io/control-plane`, a node affinity to
//! one node or a node selector outside the lent pool puts a tenant's pod beside the
//! provider's own control plane or another tenant's workload; a priority class can preempt
//! the provider's own pods; a runtime class can pick an unsandboxed runtime.
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Affinity, PodAffinityTerm, PodSpec, Toleration};

use super::Rule;

/// What the provider admin sets for every tenant's pod.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Placement {
    /// Added to every real pod's node selector (over the consumer's entries of the same key):
    /// the nodes lent to tenants.
    pub node_selector: BTreeMap<String, String>,
    /// Added to every real pod: the taints of the lent nodes tenants' pods tolerate. The only
    /// tolerations a consumer's pod may carry, besides the API server's defaults
    /// ([`DEFAULT_TOLERATIONS`]).
    pub tolerations: Vec<Toleration>,
    /// The priority class of every tenant's pod, if the admin sets one.
    pub priority_class: Option<String>,
    /// Runtime classes a tenant's pod may name.
    pub runtime_classes: BTreeSet<String>,
}

/// The tolerations the API server's `DefaultTolerationSeconds` admission adds to every pod:
/// they only delay eviction from a failing node, so a consumer's pod may carry them.
pub const DEFAULT_TOLERATIONS: [&str; 2] = [
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
];

/// The default scheduler's name: the only one a tenant's pod may ask for.
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";

impl Placement {
    /// The first placement field of `spec` the admin did not allow, as (path under `spec`,
    /// rule).
    pub fn check(&self, spec: &PodSpec) -> Option<(String, Rule)> {
        fn set(v: Option<&String>) -> Option<&String> {
            v.filter(|v| !v.is_empty())
        }
        if let Some(name) = set(spec.priority_class_name.as_ref())
            && self.priority_class.as_ref() != Some(name)
        {
            return Some(("priorityClassName".into(), Rule::Priority));
        }
        // The class's value is the API server's to fill in; a pod stating its own outranks it.
        if spec.priority.is_some() {
            return Some(("priority".into(), Rule::Priority));
        }
        if let Some(class) = set(spec.runtime_class_name.as_ref())
            && !self.runtime_classes.contains(class)
        {
            return Some(("runtimeClassName".into(), Rule::RuntimeClass));
        }
        if let Some(name) = set(spec.scheduler_name.as_ref())
            && name != DEFAULT_SCHEDULER
        {
            return Some(("schedulerName".into(), Rule::Scheduler));
        }
        for (k, v) in spec.node_selector.iter().flatten() {
            if self.node_selector.get(k) != Some(v) {
                return Some((format!("nodeSelector[{k:?}]"), Rule::NodeSelector));
            }
        }
        if let Some(a) = &spec.affinity {
            if a.node_affinity.is_some() {
                return Some(("affinity.nodeAffinity".into(), Rule::NodeSelector));
            }
            // Terms over other namespaces would place the pod by (and so reveal) where other
            // tenants' or the provider's own pods run.
            let all = affinity_terms(a);
            for (path, term) in all {
                if term.namespace_selector.is_some() {
                    return Some((format!("{path}.namespaceSelector"), Rule::OtherNamespaces));
                }
                if term.namespaces.as_ref().is_some_and(|n| !n.is_empty()) {
                    return Some((format!("{path}.namespaces"), Rule::OtherNamespaces));
                }
            }
        }
        for (i, t) in spec.tolerations.iter().flatten().enumerate() {
            if !self.tolerates(t) {
                return Some((format!("tolerations[{i}]"), Rule::Toleration));
            }
        }
        None
    }

    /// Whether a tenant's pod may carry toleration `t`: one the admin set (its
    /// `tolerationSeconds` may only shorten the admin's), or a default one.
    fn tolerates(&self, t: &Toleration) -> bool {
        let op = |t: &Toleration| t.operator.clone().unwrap_or_else(|| "Equal".into());
        let same = |a: &Toleration| {
            a.key == t.key
                && op(a) == op(t)
                && (op(t) == "Exists" || a.value == t.value)
                && a.effect == t.effect
                && match (a.toleration_seconds, t.toleration_seconds) {
                    (None, _) => true,
                    (Some(max), Some(s)) => s <= max,
                    (Some(_), None) => false,
                }
        };
        let default = t
            .key
            .as_deref()
            .is_some_and(|k| DEFAULT_TOLERATIONS.contains(&k))
            && t.effect.as_deref() == Some("NoExecute");
        default || self.tolerations.iter().any(same)
    }

    /// The admin's placement added to a real pod's `spec`: its node selector over the
    /// consumer's, its tolerations beside the consumer's (which [`Self::check`] allowed),
    /// its priority class.
    pub fn apply(&self, spec: &mut PodSpec) {
        if !self.node_selector.is_empty() {
            let mut selector = spec.node_selector.take().unwrap_or_default();
            selector.extend(self.node_selector.clone());
            spec.node_selector = Some(selector);
        }
        if !self.tolerations.is_empty() {
            let mut tolerations = spec.tolerations.take().unwrap_or_default();
            for t in &self.tolerations {
                if !tolerations.contains(t) {
                    tolerations.push(t.clone());
                }
            }
            spec.tolerations = Some(tolerations);
        }
        if let Some(class) = &self.priority_class {
            spec.priority_class_name = Some(class.clone());
        }
    }
}

/// Every pod (anti-)affinity term of `a`, with its path under `spec`.
fn affinity_terms(a: &Affinity) -> Vec<(String, &PodAffinityTerm)> {
    let mut all = Vec::new();
    let kinds = [
        (
            "podAffinity",
            a.pod_affinity.as_ref().map(|p| {
                (
                    &p.required_during_scheduling_ignored_during_execution,
                    &p.preferred_during_scheduling_ignored_during_execution,
                )
            }),
        ),
        (
            "podAntiAffinity",
            a.pod_anti_affinity.as_ref().map(|p| {
                (
                    &p.required_during_scheduling_ignored_during_execution,
                    &p.preferred_during_scheduling_ignored_during_execution,
                )
            }),
        ),
    ];
    for (kind, terms) in kinds {
        let Some((required, preferred)) = terms else {
            continue;
        };
        for (i, t) in required.iter().flatten().enumerate() {
            all.push((
                format!("affinity.{kind}.requiredDuringSchedulingIgnoredDuringExecution[{i}]"),
                t,
            ));
        }
        for (i, w) in preferred.iter().flatten().enumerate() {
            all.push((
                format!(
                    "affinity.{kind}.preferredDuringSchedulingIgnoredDuringExecution[{i}].podAffinityTerm"
                ),
                &w.pod_affinity_term,
            ));
        }
    }
    all
}

/// A toleration as `kubectl taint` writes a taint: `KEY=VALUE:EFFECT` (operator `Equal`) or
/// `KEY:EFFECT` (operator `Exists`), the effect one of `NoSchedule`, `PreferNoSchedule`,
/// `NoExecute`.
pub fn parse_toleration(s: &str) -> Result<Toleration, String> {
    let (kv, effect) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("{s:?}: expected KEY[=VALUE]:EFFECT"))?;
    if !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect) {
        return Err(format!(
            "{s:?}: effect {effect:?} is not NoSchedule, PreferNoSchedule or NoExecute"
        ));
    }
    let (key, value) = match kv.split_once('=') {
        Some((k, v)) => (k, Some(v.to_owned())),
        None => (kv, None),
    };
    if key.is_empty() {
        return Err(format!("{s:?}: the key is empty"));
    }
    Ok(Toleration {
        key: Some(key.to_owned()),
        operator: Some(if value.is_some() { "Equal" } else { "Exists" }.into()),
        value,
        effect: Some(effect.to_owned()),
        toleration_seconds: None,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn spec(v: serde_json::Value) -> PodSpec {
        let mut base = json!({"containers": [{"name": "main", "image": "echo"}]});
        base.as_object_mut()
            .unwrap()
            .extend(v.as_object().unwrap().clone());
        serde_json::from_value(base).unwrap()
    }

    fn lent() -> Placement {
        Placement {
            node_selector: BTreeMap::from([("pool".into(), "tenants".into())]),
            tolerations: vec![parse_toleration("dedicated=tenants:NoSchedule").unwrap()],
            priority_class: Some("tenant-pods".into()),
            runtime_classes: BTreeSet::from(["gvisor".into()]),
        }
    }

    #[test]
    fn only_what_the_admin_set_may_be_repeated() {
        let cases: Vec<(serde_json::Value, Option<(&str, Rule)>)> = vec![
            (json!({}), None),
            (json!({"nodeSelector": {"pool": "tenants"}}), None),
            (
                json!({"nodeSelector": {"pool": "system"}}),
                Some(("nodeSelector[\"pool\"]", Rule::NodeSelector)),
            ),
            (
                json!({"nodeSelector": {"node-role.kubernetes.io/control-plane": ""}}),
                Some((
                    "nodeSelector[\"node-role.kubernetes.io/control-plane\"]",
                    Rule::NodeSelector,
                )),
            ),
            (
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["cp-0"]}]}]}}}}),
                Some(("affinity.nodeAffinity", Rule::NodeSelector)),
            ),
            (
                json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "web"}}}]}}}),
                None,
            ),
            (
                json!({"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "namespaceSelector": {}}}]}}}),
                Some((
                    "affinity.podAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm.namespaceSelector",
                    Rule::OtherNamespaces,
                )),
            ),
            (
                json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname", "namespaces": ["kube-system"]}]}}}),
                Some((
                    "affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].namespaces",
                    Rule::OtherNamespaces,
                )),
            ),
            (
                json!({"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "tenants", "effect": "NoSchedule"}]}),
                None,
            ),
            (
                json!({"tolerations": [{"key": "dedicated", "value": "tenants", "effect": "NoSchedule"}]}),
                None,
            ),
            (
                json!({"tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]}),
                Some(("tolerations[0]", Rule::Toleration)),
            ),
            (
                json!({"tolerations": [{"operator": "Exists"}]}),
                Some(("tolerations[0]", Rule::Toleration)),
            ),
            (
                json!({"tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}]}),
                Some(("tolerations[0]", Rule::Toleration)),
            ),
            (
                json!({"tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]}),
                None,
            ),
            (
                json!({"tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoSchedule"}]}),
                Some(("tolerations[0]", Rule::Toleration)),
            ),
            (json!({"priorityClassName": "tenant-pods"}), None),
            (
                json!({"priorityClassName": "system-node-critical"}),
                Some(("priorityClassName", Rule::Priority)),
            ),
            (
                json!({"priority": 1000}),
                Some(("priority", Rule::Priority)),
            ),
            (json!({"runtimeClassName": "gvisor"}), None),
            (
                json!({"runtimeClassName": "runc"}),
                Some(("runtimeClassName", Rule::RuntimeClass)),
            ),
            (json!({"schedulerName": "default-scheduler"}), None),
            (
                json!({"schedulerName": "tenant-picks"}),
                Some(("schedulerName", Rule::Scheduler)),
            ),
        ];
        for (extra, want) in cases {
            let got = lent().check(&spec(extra.clone()));
            assert_eq!(got, want.map(|(f, r)| (f.to_owned(), r)), "{extra}");
        }
    }

    #[test]
    fn with_nothing_set_nothing_may_be_chosen() {
        let none = Placement::default();
        for extra in [
            json!({"nodeSelector": {"pool": "tenants"}}),
            json!({"tolerations": [{"key": "dedicated", "value": "tenants", "effect": "NoSchedule"}]}),
            json!({"priorityClassName": "tenant-pods"}),
            json!({"runtimeClassName": "gvisor"}),
        ] {
            assert!(none.check(&spec(extra.clone())).is_some(), "{extra}");
        }
    }

    #[test]
    fn a_shorter_toleration_of_the_admins_is_allowed_a_longer_one_is_not() {
        let mut p = Placement::default();
        let mut t = parse_toleration("maintenance:NoExecute").unwrap();
        t.toleration_seconds = Some(60);
        p.tolerations.push(t);
        let with = |s: Option<i64>| {
            spec(
                json!({"tolerations": [{"key": "maintenance", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": s}]}),
            )
        };
        assert_eq!(p.check(&with(Some(30))), None);
        assert!(p.check(&with(Some(600))).is_some());
        assert!(p.check(&with(None)).is_some(), "forever is longer");
    }

    #[test]
    fn the_real_pod_gets_the_admins_placement_over_the_consumers() {
        let mut s = spec(json!({
            "nodeSelector": {"pool": "anything", "zone": "a"},
            "tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}],
        }));
        lent().apply(&mut s);
        assert_eq!(
            s.node_selector,
            Some(BTreeMap::from([
                ("pool".into(), "tenants".into()),
                ("zone".into(), "a".into())
            ]))
        );
        let keys: Vec<_> = s.tolerations.unwrap().into_iter().map(|t| t.key).collect();
        assert_eq!(
            keys,
            [
                Some("node.kubernetes.io/unreachable".to_owned()),
                Some("dedicated".to_owned())
            ]
        );
        assert_eq!(s.priority_class_name.as_deref(), Some("tenant-pods"));

        let mut bare = spec(json!({}));
        Placement::default().apply(&mut bare);
        assert_eq!(bare, spec(json!({})), "nothing set, nothing added");
    }

    #[test]
    fn flags_parse_as_kubectl_writes_taints_and_bad_ones_say_why() {
        let t = parse_toleration("dedicated=tenants:NoSchedule").unwrap();
        assert_eq!(
            (t.key.as_deref(), t.operator.as_deref(), t.value.as_deref()),
            (Some("dedicated"), Some("Equal"), Some("tenants"))
        );
        let t = parse_toleration("gpu:NoExecute").unwrap();
        assert_eq!(
            (t.operator.as_deref(), t.value, t.effect.as_deref()),
            (Some("Exists"), None, Some("NoExecute"))
        );
        for bad in [
            "dedicated",
            "dedicated=x:Sometimes",
            ":NoSchedule",
            "=x:NoSchedule",
        ] {
            assert!(parse_toleration(bad).is_err(), "{bad}");
        }
    }
}
