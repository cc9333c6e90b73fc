//! Namespace offloading, the parts every reader shares: the name of a namespace's twin on a
//! provider ([`twin_name`]), which providers a `clusterSelector` selects ([`selects`]), and
//! the phase of a NamespaceOffloading from its providers' answers ([`phase`]). Pure: the
//! consumer's controller, `fabricctl`, the virtual kubelet and the pod webhook all decide
//! with these.
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};

use super::v1alpha1::{
    ClusterOffloading, MappingStrategy, NamespaceOffloadingSpec, OffloadingPhase, TwinPhase,
};
use crate::names;

/// The only name a NamespaceOffloading may have: one per namespace.
pub const NAME: &str = "offloading";

/// The namespace `home` (of consumer `consumer`) maps to on every provider: `home` itself
/// (`EnforceSameName`), the chosen name (`SelectedName`) or `<home>-<consumer>`
/// (`DefaultName`), shortened with a hash past 63 characters instead of failing. `None`:
/// `SelectedName` without a name (the CRD refuses it).
pub fn twin_name(spec: &NamespaceOffloadingSpec, home: &str, consumer: &str) -> Option<String> {
    match spec.namespace_mapping_strategy {
        MappingStrategy::EnforceSameName => Some(home.to_owned()),
        MappingStrategy::SelectedName => spec.remote_namespace_name.clone(),
        MappingStrategy::DefaultName => {
            Some(names::namespace::bounded(&format!("{home}-{consumer}")))
        }
    }
}

/// A selector that cannot be evaluated: the NamespaceOffloading's status and an Event say
/// why, and no provider is selected or dropped because of it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadSelector {
    #[error(
        "term {term}: operator {operator:?} of key {key:?} is not one of In, NotIn, Exists, DoesNotExist, Gt, Lt"
    )]
    Operator {
        term: usize,
        key: String,
        operator: String,
    },
    #[error("term {term}: {operator} of key {key:?} needs {wants}")]
    Values {
        term: usize,
        key: String,
        operator: String,
        wants: &'static str,
    },
    #[error(
        "term {term}: matchFields are not supported on virtual nodes (use matchExpressions on their labels)"
    )]
    Fields { term: usize },
}

/// Whether a virtual node with `labels` is selected by `selector`: terms ORed, the
/// expressions of a term ANDed, no selector or no terms selects every node (the rules of
/// a pod's required node affinity). A term with no expressions selects nothing, as in
/// Kubernetes.
pub fn selects(
    selector: Option<&NodeSelector>,
    labels: &BTreeMap<String, String>,
) -> Result<bool, BadSelector> {
    let Some(selector) = selector else {
        return Ok(true);
    };
    if selector.node_selector_terms.is_empty() {
        return Ok(true);
    }
    validate(selector)?;
    Ok(selector
        .node_selector_terms
        .iter()
        .any(|t| term_selects(t, labels)))
}

/// Why `selector` cannot be evaluated, if it cannot.
pub fn validate(selector: &NodeSelector) -> Result<(), BadSelector> {
    for (i, term) in selector.node_selector_terms.iter().enumerate() {
        if term.match_fields.as_ref().is_some_and(|f| !f.is_empty()) {
            return Err(BadSelector::Fields { term: i });
        }
        for r in term.match_expressions.iter().flatten() {
            check(i, r)?;
        }
    }
    Ok(())
}

fn check(term: usize, r: &NodeSelectorRequirement) -> Result<(), BadSelector> {
    let values = r.values.as_deref().unwrap_or_default();
    let bad = |wants| BadSelector::Values {
        term,
        key: r.key.clone(),
        operator: r.operator.clone(),
        wants,
    };
    match r.operator.as_str() {
        "In" | "NotIn" if values.is_empty() => Err(bad("at least one value")),
        "Exists" | "DoesNotExist" if !values.is_empty() => Err(bad("no values")),
        "Gt" | "Lt" if values.len() != 1 || values[0].parse::<i64>().is_err() => {
            Err(bad("one integer value"))
        }
        "In" | "NotIn" | "Exists" | "DoesNotExist" | "Gt" | "Lt" => Ok(()),
        other => Err(BadSelector::Operator {
            term,
            key: r.key.clone(),
            operator: other.to_owned(),
        }),
    }
}

fn term_selects(term: &NodeSelectorTerm, labels: &BTreeMap<String, String>) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    !exprs.is_empty() && exprs.iter().all(|r| requirement_holds(r, labels))
}

fn requirement_holds(r: &NodeSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let value = labels.get(&r.key);
    let number = |v: &str| v.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => !value.is_some_and(|v| values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => {
            matches!((value.and_then(|v| number(v)), values.first().and_then(|v| number(v))), (Some(a), Some(b)) if a > b)
        }
        "Lt" => {
            matches!((value.and_then(|v| number(v)), values.first().and_then(|v| number(v))), (Some(a), Some(b)) if a < b)
        }
        _ => false,
    }
}

/// The phase of a NamespaceOffloading (being deleted: `deleting`) whose providers answer as
/// `clusters` says: the order of the anchor (Terminating, NoClusterSelected, Ready,
/// AllFailed, SomeFailed, InProgress), counting only selected providers.
pub fn phase(deleting: bool, clusters: &[ClusterOffloading]) -> OffloadingPhase {
    if deleting {
        return OffloadingPhase::Terminating;
    }
    let selected: Vec<_> = clusters.iter().filter(|c| c.selected).collect();
    let ready = selected
        .iter()
        .filter(|c| c.twin == Some(TwinPhase::Ready))
        .count();
    let failed = selected
        .iter()
        .filter(|c| c.twin == Some(TwinPhase::Refused))
        .count();
    match selected.len() {
        0 => OffloadingPhase::NoClusterSelected,
        n if ready == n => OffloadingPhase::Ready,
        n if failed == n => OffloadingPhase::AllFailed,
        _ if failed > 0 => OffloadingPhase::SomeFailed,
        _ => OffloadingPhase::InProgress,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(strategy: MappingStrategy, selected: Option<&str>) -> NamespaceOffloadingSpec {
        NamespaceOffloadingSpec {
            namespace_mapping_strategy: strategy,
            remote_namespace_name: selected.map(str::to_owned),
            ..Default::default()
        }
    }

    #[test]
    fn each_strategy_names_the_twin_and_long_names_are_shortened_not_refused() {
        assert_eq!(
            twin_name(&spec(MappingStrategy::DefaultName, None), "shop", "alpha").unwrap(),
            "shop-alpha"
        );
        assert_eq!(
            twin_name(
                &spec(MappingStrategy::EnforceSameName, None),
                "shop",
                "alpha"
            )
            .unwrap(),
            "shop"
        );
        assert_eq!(
            twin_name(
                &spec(MappingStrategy::SelectedName, Some("mine")),
                "shop",
                "alpha"
            )
            .unwrap(),
            "mine"
        );
        assert_eq!(
            twin_name(&spec(MappingStrategy::SelectedName, None), "shop", "alpha"),
            None
        );
        let long = twin_name(
            &spec(MappingStrategy::DefaultName, None),
            &"n".repeat(63),
            &"c".repeat(63),
        )
        .unwrap();
        assert!(long.len() <= 63, "{long}");
        assert!(crate::identity::is_dns_label(&long), "{long}");
        let other = twin_name(
            &spec(MappingStrategy::DefaultName, None),
            &"n".repeat(63),
            &"d".repeat(63),
        )
        .unwrap();
        assert_ne!(long, other);
    }

    fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| (*v).to_owned()).collect()),
        }
    }

    fn sel(terms: Vec<Vec<NodeSelectorRequirement>>) -> NodeSelector {
        NodeSelector {
            node_selector_terms: terms
                .into_iter()
                .map(|e| NodeSelectorTerm {
                    match_expressions: Some(e),
                    match_fields: None,
                })
                .collect(),
        }
    }

    #[test]
    fn terms_are_ored_and_expressions_anded_and_nothing_selects_all() {
        let labels = BTreeMap::from([
            ("region".to_owned(), "eu".to_owned()),
            ("tier".to_owned(), "3".to_owned()),
        ]);
        assert!(selects(None, &labels).unwrap());
        assert!(selects(Some(&sel(vec![])), &labels).unwrap());
        let eu_gold = sel(vec![vec![
            req("region", "In", &["eu"]),
            req("gold", "Exists", &[]),
        ]]);
        assert!(!selects(Some(&eu_gold), &labels).unwrap());
        let or = sel(vec![
            vec![req("region", "In", &["eu"]), req("gold", "Exists", &[])],
            vec![req("tier", "Gt", &["2"])],
        ]);
        assert!(selects(Some(&or), &labels).unwrap());
        assert!(
            selects(
                Some(&sel(vec![vec![
                    req("region", "NotIn", &["us"]),
                    req("gpu", "DoesNotExist", &[])
                ]])),
                &labels
            )
            .unwrap()
        );
        assert!(!selects(Some(&sel(vec![vec![req("tier", "Lt", &["3"])]])), &labels).unwrap());
        assert!(
            !selects(Some(&sel(vec![vec![]])), &labels).unwrap(),
            "an empty term selects nothing"
        );
    }

    #[test]
    fn a_selector_that_cannot_be_evaluated_says_why() {
        let labels = BTreeMap::new();
        let e = selects(Some(&sel(vec![vec![req("a", "Near", &["b"])]])), &labels).unwrap_err();
        assert!(e.to_string().contains("\"Near\""), "{e}");
        let e = selects(Some(&sel(vec![vec![req("a", "In", &[])]])), &labels).unwrap_err();
        assert!(e.to_string().contains("at least one value"), "{e}");
        let e = selects(Some(&sel(vec![vec![req("a", "Gt", &["x"])]])), &labels).unwrap_err();
        assert!(e.to_string().contains("one integer value"), "{e}");
        let fields = NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: None,
                match_fields: Some(vec![req("metadata.name", "In", &["n"])]),
            }],
        };
        assert_eq!(
            selects(Some(&fields), &labels).unwrap_err(),
            BadSelector::Fields { term: 0 }
        );
    }

    fn cluster(id: &str, selected: bool, twin: Option<TwinPhase>) -> ClusterOffloading {
        ClusterOffloading {
            cluster_id: id.into(),
            selected,
            twin,
            ..Default::default()
        }
    }

    #[test]
    fn the_phase_counts_selected_providers_only() {
        use OffloadingPhase::*;
        assert_eq!(phase(true, &[]), Terminating);
        assert_eq!(
            phase(false, &[cluster("a", false, Some(TwinPhase::Refused))]),
            NoClusterSelected
        );
        assert_eq!(
            phase(
                false,
                &[
                    cluster("a", true, Some(TwinPhase::Ready)),
                    cluster("b", false, None)
                ]
            ),
            Ready
        );
        assert_eq!(
            phase(false, &[cluster("a", true, Some(TwinPhase::Refused))]),
            AllFailed
        );
        assert_eq!(
            phase(
                false,
                &[
                    cluster("a", true, Some(TwinPhase::Refused)),
                    cluster("b", true, None)
                ]
            ),
            SomeFailed
        );
        assert_eq!(
            phase(
                false,
                &[
                    cluster("a", true, Some(TwinPhase::Ready)),
                    cluster("b", true, Some(TwinPhase::Creating))
                ]
            ),
            InProgress
        );
    }
}
