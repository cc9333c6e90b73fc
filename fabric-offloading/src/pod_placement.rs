//! Where the pods of an offloaded namespace may run (consumer): what the pod webhook
//! ([`names::webhook::PODS_PATH`]) does to a pod created in a namespace labelled
//! [`label::SCHEDULING_ENABLED`], as a pure function of the pod and the namespace's
//! NamespaceOffloading ([`mutate`]).
//!
//! - `Local`: nothing; the virtual nodes' taint keeps the pod home.
//! - `Remote`: the toleration of the virtual nodes' taint, and a required node affinity for
//!   virtual nodes only: every term of the `clusterSelector` (none: one empty term) gets
//!   `fabric.io/type In [virtual-node]`.
//! - `LocalAndRemote`: the toleration; without selector terms no affinity (every node fits);
//!   otherwise the selector's terms plus one ORed term `fabric.io/type NotIn [virtual-node]`
//!   (the real nodes).
//!
//! The imposed terms are merged into the pod's own required terms as a cross product (each
//! pod term ANDed with each imposed term: their expressions concatenated, the pod term's
//! `matchFields` and anything else it carries kept). A pod term that is empty matches no node
//! in Kubernetes and is kept as it is, so that it still matches none. Preferred affinity and
//! every other field are untouched: the pod is handled as JSON, so that fields this build's
//! Kubernetes types do not know survive the patch.
//!
//! A NamespaceOffloading being deleted (unoffload) imposes nothing: its twins are going, new
//! pods stay home.
//!
//! A volume-transfer pod of `fabricctl move volume` ([`is_volume_transfer`]: labelled
//! [`names::storage::TRANSFER`] with the name of a claim it mounts) is left as it is: its
//! sender must run at home beside the data (the claim's volume keeps its consumers off
//! virtual nodes) and its receiver is bound by name to the provider's virtual node, whatever
//! the strategy. Under `Remote` the imposed "virtual nodes only" would contradict the
//! volume's affinity and the sender could never be scheduled. Whoever can create pods in the
//! namespace can set that label; what it buys is a pod placed by its own spec, which is not a
//! boundary: where pods run at home is this cluster's own placement policy (its users' pods
//! run at home in every namespace not offloaded), and a pod bound for a provider still goes
//! through the provider's ShadowPod policy, unchanged.
#[cfg(doc)]
use fabric_api::names;
use fabric_api::{
    names::{label, storage, taint},
    offloading::{
        namespaces::{self, BadSelector},
        v1alpha1::{NamespaceOffloading, PodOffloadingStrategy},
    },
};
use serde_json::{Value, json};

/// Why a pod is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "namespace {namespace:?} is labelled {label}=true but has no NamespaceOffloading: it is \
         being offloaded (create the pod again in a moment) or was left labelled; offload it \
         (fabricctl offload namespace {namespace}) or remove the label (kubectl label namespace \
         {namespace} {label}-)",
        label = label::SCHEDULING_ENABLED
    )]
    NotOffloaded { namespace: String },
    #[error(
        "the clusterSelector of NamespaceOffloading {namespace}/offloading cannot place pods: \
         {error}; fix the selector (or unoffload and offload the namespace again)"
    )]
    BadSelector {
        namespace: String,
        error: BadSelector,
    },
    #[error("the NamespaceOffloading of namespace {namespace:?} could not be read: {error}")]
    Unreadable { namespace: String, error: String },
    #[error("the pod cannot be placed: {0}")]
    Malformed(String),
}

const REQUIRED: &str = "requiredDuringSchedulingIgnoredDuringExecution";

/// The toleration of the virtual nodes' taint that offloaded pods get.
pub fn toleration() -> Value {
    json!({"key": taint::VIRTUAL_NODE, "operator": "Exists", "effect": "NoExecute"})
}

/// The node selector terms a pod of a namespace offloaded with `offloading` must satisfy (one
/// of them), `None` when nothing is imposed.
pub fn imposed_terms(
    namespace: &str,
    offloading: &NamespaceOffloading,
) -> Result<Option<Vec<Value>>, Refusal> {
    let spec = &offloading.spec;
    let selector_terms = match &spec.cluster_selector {
        Some(selector) => {
            namespaces::validate(selector).map_err(|error| Refusal::BadSelector {
                namespace: namespace.to_owned(),
                error,
            })?;
            selector
                .node_selector_terms
                .iter()
                .map(|t| serde_json::to_value(t).expect("a NodeSelectorTerm serializes"))
                .collect()
        }
        None => Vec::new(),
    };
    let node_type = |operator: &str| json!({"key": label::NODE_TYPE, "operator": operator, "values": [label::VIRTUAL_NODE_TYPE]});
    Ok(match spec.pod_offloading_strategy {
        PodOffloadingStrategy::Local => None,
        PodOffloadingStrategy::Remote => {
            let mut terms = selector_terms;
            if terms.is_empty() {
                terms.push(json!({}));
            }
            for t in &mut terms {
                with_expressions(t, std::slice::from_ref(&node_type("In")));
            }
            Some(terms)
        }
        PodOffloadingStrategy::LocalAndRemote if selector_terms.is_empty() => None,
        PodOffloadingStrategy::LocalAndRemote => {
            let mut terms = selector_terms;
            terms.push(json!({"matchExpressions": [node_type("NotIn")]}));
            Some(terms)
        }
    })
}

/// Appends `extra` to the `matchExpressions` of term `t`.
fn with_expressions(t: &mut Value, extra: &[Value]) {
    let Some(obj) = t.as_object_mut() else {
        return;
    };
    let exprs = obj
        .entry("matchExpressions")
        .or_insert_with(|| Value::Array(Vec::new()));
    if !exprs.is_array() {
        *exprs = Value::Array(Vec::new());
    }
    exprs
        .as_array_mut()
        .expect("made an array above")
        .extend_from_slice(extra);
}

fn is_empty_term(t: &Value) -> bool {
    let empty = |k: &str| t.get(k).and_then(Value::as_array).is_none_or(Vec::is_empty);
    empty("matchExpressions") && empty("matchFields")
}

/// The pod's required terms merged with `imposed`: `imposed` itself when the pod has none,
/// otherwise the cross product (see the module's doc).
pub fn merge_terms(own: &[Value], imposed: &[Value]) -> Vec<Value> {
    if own.is_empty() {
        return imposed.to_vec();
    }
    let mut out = Vec::new();
    for p in own {
        if is_empty_term(p) {
            out.push(p.clone());
            continue;
        }
        for i in imposed {
            let mut t = p.clone();
            let extra = i
                .get("matchExpressions")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            with_expressions(&mut t, &extra);
            out.push(t);
        }
    }
    out
}

/// Whether `pod` is a volume-transfer pod of `fabricctl move volume`: labelled
/// [`storage::TRANSFER`] with the name of a claim it mounts, or whose landing claim it mounts
/// (a move home's receiver; see the module's doc).
pub fn is_volume_transfer(pod: &Value) -> bool {
    let Some(claim) = pod
        .pointer("/metadata/labels")
        .and_then(|l| l.get(storage::TRANSFER))
        .and_then(Value::as_str)
        .filter(|c| !c.is_empty())
    else {
        return false;
    };
    pod.pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|v| {
            v.pointer("/persistentVolumeClaim/claimName")
                .and_then(Value::as_str)
                .is_some_and(|c| c == claim || c == storage::landing(claim))
        })
}

/// The JSON patch that places `pod` (as the API server sent it) as the NamespaceOffloading of
/// its namespace `namespace` says; `None` when the pod is left as it is. `offloading` is `None`
/// when the namespace has none (the webhook is only called for labelled namespaces: refused).
pub fn mutate(
    namespace: &str,
    pod: &Value,
    offloading: Option<&NamespaceOffloading>,
) -> Result<Option<json_patch::Patch>, Refusal> {
    let Some(offloading) = offloading else {
        return Err(Refusal::NotOffloaded {
            namespace: namespace.to_owned(),
        });
    };
    if offloading.spec.pod_offloading_strategy == PodOffloadingStrategy::Local
        || offloading.metadata.deletion_timestamp.is_some()
        || is_volume_transfer(pod)
    {
        return Ok(None);
    }
    let imposed = imposed_terms(namespace, offloading)?;
    let mut placed = pod.clone();
    let spec = placed
        .get_mut("spec")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| Refusal::Malformed("it has no spec".into()))?;

    let tolerations = spec
        .entry("tolerations")
        .or_insert_with(|| Value::Array(Vec::new()));
    if tolerations.is_null() {
        *tolerations = Value::Array(Vec::new());
    }
    let tolerations = tolerations
        .as_array_mut()
        .ok_or_else(|| Refusal::Malformed("spec.tolerations is not a list".into()))?;
    let has = |t: &Value| {
        t.get("key").and_then(Value::as_str) == Some(taint::VIRTUAL_NODE)
            && t.get("operator").and_then(Value::as_str) == Some("Exists")
            && t.get("effect").and_then(Value::as_str) == Some("NoExecute")
    };
    if !tolerations.iter().any(has) {
        tolerations.push(toleration());
    }

    if let Some(imposed) = imposed {
        let mut node_affinity = spec
            .get("affinity")
            .and_then(|a| a.get("nodeAffinity"))
            .cloned()
            .unwrap_or_else(|| json!({}));
        let own: Vec<Value> = node_affinity
            .get(REQUIRED)
            .and_then(|r| r.get("nodeSelectorTerms"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let terms = merge_terms(&own, &imposed);
        let na = node_affinity.as_object_mut().ok_or_else(|| {
            Refusal::Malformed("spec.affinity.nodeAffinity is not an object".into())
        })?;
        let required = na.entry(REQUIRED).or_insert_with(|| json!({}));
        if !required.is_object() {
            *required = json!({});
        }
        required["nodeSelectorTerms"] = Value::Array(terms);
        let affinity = spec.entry("affinity").or_insert_with(|| json!({}));
        if !affinity.is_object() {
            *affinity = json!({});
        }
        affinity["nodeAffinity"] = node_affinity;
    }

    let patch = json_patch::diff(pod, &placed);
    Ok((!patch.0.is_empty()).then_some(patch))
}

#[cfg(test)]
mod tests {
    use fabric_api::offloading::v1alpha1::NamespaceOffloadingSpec;
    use k8s_openapi::{
        api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm},
        apimachinery::pkg::apis::meta::v1::Time,
    };

    use super::*;

    const NS: &str = "shop";

    fn offloading(
        strategy: PodOffloadingStrategy,
        selector: Option<Vec<NodeSelectorTerm>>,
    ) -> NamespaceOffloading {
        NamespaceOffloading::new(
            "offloading",
            NamespaceOffloadingSpec {
                pod_offloading_strategy: strategy,
                cluster_selector: selector.map(|node_selector_terms| NodeSelector {
                    node_selector_terms,
                }),
                ..Default::default()
            },
        )
    }

    fn req(key: &str, operator: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    fn term(exprs: Vec<NodeSelectorRequirement>) -> NodeSelectorTerm {
        NodeSelectorTerm {
            match_expressions: Some(exprs),
            match_fields: None,
        }
    }

    fn jreq(key: &str, operator: &str, values: &[&str]) -> Value {
        serde_json::to_value(req(key, operator, values)).unwrap()
    }

    fn virtual_only() -> Value {
        jreq(label::NODE_TYPE, "In", &[label::VIRTUAL_NODE_TYPE])
    }

    fn real_only() -> Value {
        jreq(label::NODE_TYPE, "NotIn", &[label::VIRTUAL_NODE_TYPE])
    }

    /// The pod after `mutate`'s patch (itself when there is none).
    fn placed(pod: &Value, o: Option<&NamespaceOffloading>) -> Result<Value, Refusal> {
        let mut out = pod.clone();
        if let Some(patch) = mutate(NS, pod, o)? {
            json_patch::patch(&mut out, &patch.0).unwrap();
        }
        Ok(out)
    }

    fn required(pod: &Value) -> Option<&Value> {
        pod["spec"]["affinity"]["nodeAffinity"]
            .get(REQUIRED)
            .map(|r| &r["nodeSelectorTerms"])
    }

    /// Every strategy × selector × pod affinity × toleration present, against the terms and
    /// tolerations worked out by hand.
    #[test]
    fn every_strategy_selector_affinity_and_toleration() {
        let selector = vec![
            term(vec![req("region", "In", &["eu"])]),
            term(vec![req("gpu", "Exists", &[])]),
        ];
        let region = jreq("region", "In", &["eu"]);
        let gpu = jreq("gpu", "Exists", &[]);
        let zone = jreq("zone", "In", &["a"]);
        let host = jreq("metadata.name", "In", &["n1"]);
        let disk = jreq("disk", "In", &["ssd"]);
        let preferred = json!([{"weight": 1, "preference": {"matchExpressions": [disk]}}]);

        // The pod's own required terms: none, expressions, expressions and matchFields (two
        // terms, one of them with fields only).
        let own: [(&str, Option<Value>); 3] = [
            ("no affinity", None),
            ("expressions", Some(json!([{"matchExpressions": [zone]}]))),
            (
                "fields",
                Some(json!([
                    {"matchExpressions": [zone], "matchFields": [host]},
                    {"matchFields": [host]},
                ])),
            ),
        ];
        let other_toleration =
            json!({"key": "dedicated", "operator": "Equal", "value": "x", "effect": "NoSchedule"});
        for strategy in [
            PodOffloadingStrategy::Local,
            PodOffloadingStrategy::Remote,
            PodOffloadingStrategy::LocalAndRemote,
        ] {
            for with_selector in [false, true] {
                let o = offloading(strategy, with_selector.then(|| selector.clone()));
                // What is imposed, worked out by hand from the module's rules.
                let imposed: Option<Vec<Value>> = match (strategy, with_selector) {
                    (PodOffloadingStrategy::Local, _) => None,
                    (PodOffloadingStrategy::Remote, false) => {
                        Some(vec![json!({"matchExpressions": [virtual_only()]})])
                    }
                    (PodOffloadingStrategy::Remote, true) => Some(vec![
                        json!({"matchExpressions": [region, virtual_only()]}),
                        json!({"matchExpressions": [gpu, virtual_only()]}),
                    ]),
                    (PodOffloadingStrategy::LocalAndRemote, false) => None,
                    (PodOffloadingStrategy::LocalAndRemote, true) => Some(vec![
                        json!({"matchExpressions": [region]}),
                        json!({"matchExpressions": [gpu]}),
                        json!({"matchExpressions": [real_only()]}),
                    ]),
                };
                for (what, terms) in &own {
                    for tolerated in [false, true] {
                        let case = format!(
                            "{strategy:?}, selector {with_selector}, {what}, tolerated {tolerated}"
                        );
                        let mut tolerations = vec![other_toleration.clone()];
                        if tolerated {
                            tolerations.push(toleration());
                        }
                        let mut pod = json!({
                            "apiVersion": "v1", "kind": "Pod",
                            "metadata": {"name": "web", "namespace": NS},
                            "spec": {
                                "containers": [{"name": "a", "image": "x"}],
                                "tolerations": tolerations,
                                "futureField": {"kept": true},
                            },
                        });
                        if let Some(terms) = terms {
                            pod["spec"]["affinity"] = json!({
                                "nodeAffinity": {
                                    REQUIRED: {"nodeSelectorTerms": terms},
                                    "preferredDuringSchedulingIgnoredDuringExecution": preferred,
                                },
                                "podAntiAffinity": {"x": 1},
                            });
                        }
                        let out = placed(&pod, Some(&o)).unwrap();

                        // Every other field as it was.
                        let mut rest = out.clone();
                        let mut before = pod.clone();
                        for p in [&mut rest, &mut before] {
                            let spec = p["spec"].as_object_mut().unwrap();
                            spec.remove("tolerations");
                            if let Some(na) = spec
                                .get_mut("affinity")
                                .and_then(|a| a.get_mut("nodeAffinity"))
                                .and_then(Value::as_object_mut)
                            {
                                na.remove(REQUIRED);
                            }
                            if spec.get("affinity") == Some(&json!({"nodeAffinity": {}})) {
                                spec.remove("affinity");
                            }
                        }
                        assert_eq!(
                            rest, before,
                            "{case}: only tolerations and required terms change"
                        );

                        // The toleration: once when offloadable, never when Local.
                        let count = out["spec"]["tolerations"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .filter(|t| **t == toleration())
                            .count();
                        let wanted = if strategy == PodOffloadingStrategy::Local {
                            usize::from(tolerated)
                        } else {
                            1
                        };
                        assert_eq!(count, wanted, "{case}: {}", out["spec"]["tolerations"]);
                        assert!(
                            out["spec"]["tolerations"]
                                .as_array()
                                .unwrap()
                                .contains(&other_toleration),
                            "{case}"
                        );

                        // The required terms: the pod's own, the imposed, or the cross product.
                        let expected: Option<Value> = match (&imposed, terms) {
                            (None, t) => t.clone(),
                            (Some(i), None) => Some(Value::Array(i.clone())),
                            (Some(i), Some(t)) => Some(Value::Array(
                                t.as_array()
                                    .unwrap()
                                    .iter()
                                    .flat_map(|p| {
                                        i.iter().map(move |i| {
                                            let mut c = p.clone();
                                            let mut exprs = p
                                                .get("matchExpressions")
                                                .and_then(Value::as_array)
                                                .cloned()
                                                .unwrap_or_default();
                                            exprs.extend(
                                                i["matchExpressions"].as_array().unwrap().clone(),
                                            );
                                            c["matchExpressions"] = Value::Array(exprs);
                                            c
                                        })
                                    })
                                    .collect(),
                            )),
                        };
                        assert_eq!(required(&out).cloned(), expected, "{case}");
                        if let (Some(imposed), Some(terms)) = (&imposed, terms) {
                            // matchFields kept on every product of a term that had them.
                            let with_fields = required(&out)
                                .unwrap()
                                .as_array()
                                .unwrap()
                                .iter()
                                .filter(|t| t.get("matchFields") == Some(&json!([host])))
                                .count();
                            let own_with_fields = terms
                                .as_array()
                                .unwrap()
                                .iter()
                                .filter(|t| t.get("matchFields").is_some())
                                .count();
                            assert_eq!(with_fields, own_with_fields * imposed.len(), "{case}");
                        }

                        // Nothing to do: no patch at all.
                        let unchanged = strategy == PodOffloadingStrategy::Local
                            || (tolerated && imposed.is_none());
                        assert_eq!(
                            mutate(NS, &pod, Some(&o)).unwrap().is_none(),
                            unchanged,
                            "{case}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_labelled_namespace_without_offloading_refuses_and_says_how_to_fix() {
        let pod = json!({"spec": {"containers": []}});
        let e = mutate(NS, &pod, None).unwrap_err();
        assert_eq!(
            e,
            Refusal::NotOffloaded {
                namespace: NS.into()
            }
        );
        let message = e.to_string();
        for needed in [
            "no NamespaceOffloading",
            "fabricctl offload namespace shop",
            "kubectl label namespace shop offloading.fabric.io/scheduling-enabled-",
        ] {
            assert!(message.contains(needed), "{message}");
        }
    }

    #[test]
    fn a_selector_validate_refuses_refuses_the_pod_with_why() {
        let pod = json!({"spec": {"containers": []}});
        let bad = offloading(
            PodOffloadingStrategy::Remote,
            Some(vec![term(vec![req("region", "Sometimes", &["eu"])])]),
        );
        let e = mutate(NS, &pod, Some(&bad)).unwrap_err();
        assert!(matches!(e, Refusal::BadSelector { .. }), "{e:?}");
        let message = e.to_string();
        assert!(
            message.contains("\"Sometimes\"") && message.contains("shop/offloading"),
            "{message}"
        );
        let fields = offloading(
            PodOffloadingStrategy::LocalAndRemote,
            Some(vec![NodeSelectorTerm {
                match_expressions: None,
                match_fields: Some(vec![req("metadata.name", "In", &["n"])]),
            }]),
        );
        assert!(
            mutate(NS, &pod, Some(&fields))
                .unwrap_err()
                .to_string()
                .contains("matchFields")
        );
        // Local places nothing: its selector is the controller's business only.
        let local = offloading(
            PodOffloadingStrategy::Local,
            Some(vec![term(vec![req("region", "Sometimes", &["eu"])])]),
        );
        assert_eq!(mutate(NS, &pod, Some(&local)), Ok(None));
    }

    #[test]
    fn an_empty_own_term_still_matches_nothing_and_an_unoffloading_namespace_imposes_nothing() {
        let pod = json!({"spec": {"containers": [], "affinity": {"nodeAffinity": {REQUIRED:
            {"nodeSelectorTerms": [{}, {"matchExpressions": [jreq("zone", "In", &["a"])]}]}}}}});
        let o = offloading(PodOffloadingStrategy::Remote, None);
        let out = placed(&pod, Some(&o)).unwrap();
        assert_eq!(
            required(&out).unwrap(),
            &json!([{}, {"matchExpressions": [jreq("zone", "In", &["a"]), virtual_only()]}])
        );

        let mut going = offloading(PodOffloadingStrategy::Remote, None);
        going.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        assert_eq!(mutate(NS, &pod, Some(&going)), Ok(None));
    }

    /// A transfer pod (the mark naming a claim it mounts) is left where fabricctl put it under
    /// every strategy; the mark alone, or naming another claim, places the pod as any.
    #[test]
    fn a_volume_transfer_pod_is_left_where_fabricctl_put_it() {
        let sender = |mark: Option<&str>| {
            let mut p = json!({"metadata": {"name": "move-data-send", "labels": {}},
                "spec": {"containers": [{"name": "transfer"}],
                    "affinity": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [
                        {"matchExpressions": [real_only()]}]}}},
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}});
            if let Some(m) = mark {
                p["metadata"]["labels"][storage::TRANSFER] = json!(m);
            }
            p
        };
        for strategy in [
            PodOffloadingStrategy::Remote,
            PodOffloadingStrategy::LocalAndRemote,
            PodOffloadingStrategy::Local,
        ] {
            for selector in [None, Some(vec![term(vec![req("region", "In", &["eu"])])])] {
                let o = offloading(strategy, selector);
                assert!(is_volume_transfer(&sender(Some("data"))));
                assert_eq!(mutate(NS, &sender(Some("data")), Some(&o)), Ok(None));
            }
        }
        let remote = offloading(PodOffloadingStrategy::Remote, None);
        for not_one in [None, Some("other"), Some("")] {
            let p = sender(not_one);
            assert!(!is_volume_transfer(&p), "{p}");
            let out = placed(&p, Some(&remote)).unwrap();
            assert_eq!(
                required(&out).unwrap(),
                &json!([{"matchExpressions": [real_only(), virtual_only()]}]),
                "{not_one:?}: placed as any pod (and so unschedulable, as the sender was)"
            );
        }
        // A move home's receiver mounts the landing claim of the claim it names.
        let mut receiver = sender(Some("data"));
        receiver["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] =
            json!(storage::landing("data"));
        assert!(is_volume_transfer(&receiver));
        assert_eq!(mutate(NS, &receiver, Some(&remote)), Ok(None));
        receiver["metadata"]["labels"][storage::TRANSFER] = json!("logs");
        assert!(!is_volume_transfer(&receiver), "{receiver}");
        // Still refused in a labelled namespace that is not offloaded.
        assert!(mutate(NS, &sender(Some("data")), None).is_err());
    }

    #[test]
    fn explicit_empty_selector_and_empty_required_terms_count_as_none() {
        let o = offloading(PodOffloadingStrategy::Remote, Some(vec![]));
        let pod = json!({"spec": {"containers": [], "tolerations": null,
            "affinity": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": []}}}}});
        let out = placed(&pod, Some(&o)).unwrap();
        assert_eq!(
            required(&out).unwrap(),
            &json!([{"matchExpressions": [virtual_only()]}])
        );
        assert_eq!(out["spec"]["tolerations"], json!([toleration()]));
        let o = offloading(PodOffloadingStrategy::LocalAndRemote, Some(vec![]));
        let out = placed(&pod, Some(&o)).unwrap();
        assert_eq!(required(&out).unwrap(), &json!([]));
        assert!(matches!(
            mutate(NS, &json!({}), Some(&o)),
            Err(Refusal::Malformed(_))
        ));
    }
}
