use fabric_api::offloading::v1alpha1::{
    MappingStrategy, NamespaceOffloadingSpec, OffloadingPhase, PodsCreatedBefore, StorageRetention,
    TwinStatus, VirtualNodeSpec,
};
use k8s_openapi::{
    api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm},
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};
use kube::api::ObjectMeta;

use super::*;

fn vn(provider: &str, labels: &[(&str, &str)]) -> VirtualNode {
    VirtualNode {
        metadata: ObjectMeta {
            name: Some(provider.into()),
            ..Default::default()
        },
        spec: VirtualNodeSpec {
            cluster_id: provider.into(),
            node_name: format!("fabric-{provider}"),
            identity: provider.into(),
            resources: Default::default(),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            at_most_once: None,
            storage: None,
        },
        status: None,
    }
}

fn term(exprs: &[(&str, &str, &[&str])]) -> NodeSelectorTerm {
    NodeSelectorTerm {
        match_expressions: Some(
            exprs
                .iter()
                .map(|(k, op, vs)| NodeSelectorRequirement {
                    key: (*k).into(),
                    operator: (*op).into(),
                    values: (!vs.is_empty()).then(|| vs.iter().map(|v| (*v).to_owned()).collect()),
                })
                .collect(),
        ),
        match_fields: None,
    }
}

fn nso(ns: &str, terms: Option<Vec<NodeSelectorTerm>>) -> NamespaceOffloading {
    NamespaceOffloading {
        metadata: ObjectMeta {
            name: Some("offloading".into()),
            namespace: Some(ns.into()),
            generation: Some(3),
            ..Default::default()
        },
        spec: NamespaceOffloadingSpec {
            cluster_selector: terms.map(|t| NodeSelector {
                node_selector_terms: t,
            }),
            ..Default::default()
        },
        status: None,
    }
}

fn two_providers() -> Providers {
    let vns = [
        vn("eu1", &[("region", "eu")]),
        vn("us1", &[("region", "us")]),
    ];
    // us1's Node exists and carries a label its VirtualNode does not.
    providers(vns.iter(), |name| {
        (name == "fabric-us1").then(|| {
            BTreeMap::from([
                ("region".to_owned(), "us".to_owned()),
                ("gpu".to_owned(), "yes".to_owned()),
            ])
        })
    })
}

#[test]
fn before_its_node_exists_a_virtual_node_has_the_labels_the_virtual_kubelet_will_give_it() {
    let v = vn("p", &[("region", "eu"), ("kubernetes.io/os", "windows")]);
    let l = virtual_node_labels(&v, None);
    assert_eq!(l["region"], "eu");
    assert_eq!(l[label::NODE_TYPE], label::VIRTUAL_NODE_TYPE);
    assert_eq!(l[label::REMOTE_CLUSTER], "p");
    assert_eq!(l[HOSTNAME_LABEL], "fabric-p");
    assert!(!l.contains_key("kubernetes.io/os"), "reserved: {l:?}");
    let node = BTreeMap::from([("x".to_owned(), "y".to_owned())]);
    assert_eq!(virtual_node_labels(&v, Some(&node)), node);
}

#[test]
fn a_provider_is_selected_when_any_of_its_virtual_nodes_is() {
    let mut all = two_providers();
    all.get_mut("eu1")
        .unwrap()
        .push(BTreeMap::from([("zone".to_owned(), "b".to_owned())]));
    // The second virtual node of eu1 matches: selected, whatever the first one says.
    let n = nso("shop", Some(vec![term(&[("zone", "In", &["b"])])]));
    assert_eq!(selected(&n, &all).0, BTreeSet::from(["eu1".to_owned()]));
    // The Node's labels count, not only the VirtualNode's.
    let n = nso("shop", Some(vec![term(&[("gpu", "Exists", &[])])]));
    assert_eq!(selected(&n, &all).0, BTreeSet::from(["us1".to_owned()]));
    let n = nso("shop", None);
    assert_eq!(selected(&n, &all).0.len(), 2);
}

#[test]
fn a_bad_selector_keeps_the_providers_selected_before() {
    let all = two_providers();
    let mut n = nso("shop", Some(vec![term(&[("region", "Near", &["eu"])])]));
    n.status = Some(NamespaceOffloadingStatus {
        clusters: vec![
            ClusterOffloading {
                cluster_id: "eu1".into(),
                selected: true,
                ..Default::default()
            },
            ClusterOffloading {
                cluster_id: "us1".into(),
                selected: false,
                ..Default::default()
            },
        ],
        ..Default::default()
    });
    let (chosen, bad) = selected(&n, &all);
    assert_eq!(chosen, BTreeSet::from(["eu1".to_owned()]));
    assert!(bad.unwrap().to_string().contains("Near"));
    // ... and the map to eu1 keeps the mapping.
    assert_eq!(mappings([&n], "eu1", &all, "me").len(), 1);
    assert!(mappings([&n], "us1", &all, "me").is_empty());
    let st = status(&n, vec![], selected(&n, &all).1.as_ref(), "me");
    assert!(st.message.unwrap().contains("cannot be evaluated"));
}

#[test]
fn a_map_lists_every_live_offloading_selecting_its_provider() {
    let all = two_providers();
    let eu = nso("shop", Some(vec![term(&[("region", "In", &["eu"])])]));
    let any = nso("web", None);
    let mut gone = nso("old", None);
    gone.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
    let mut same = nso("db", None);
    same.spec.namespace_mapping_strategy = MappingStrategy::EnforceSameName;
    same.spec.storage_retention = StorageRetention::Delete;
    let all_nsos = [&eu, &any, &gone, &same];
    let m = mappings(all_nsos, "eu1", &all, "me");
    let pairs: Vec<(&str, &str)> = m
        .iter()
        .map(|m| (m.home.as_str(), m.remote.as_str()))
        .collect();
    assert_eq!(
        pairs,
        [("db", "db"), ("shop", "shop-me"), ("web", "web-me")]
    );
    // Each carries its namespace's retention to the provider (which marks the twin with it).
    let kept: Vec<_> = m.iter().map(|m| m.storage_retention).collect();
    assert_eq!(
        kept,
        [
            Some(StorageRetention::Delete),
            Some(StorageRetention::Retain),
            Some(StorageRetention::Retain)
        ]
    );
    let m = mappings(all_nsos, "us1", &all, "me");
    assert_eq!(m.len(), 2, "{m:?}");
    // A provider without a virtual node is asked for nothing.
    assert!(mappings(all_nsos, "gone", &all, "me").is_empty());
}

fn map_status(home: &str, phase: MappingPhase, reason: Option<&str>) -> NamespaceMapStatus {
    NamespaceMapStatus {
        observed_generation: None,
        namespaces: vec![TwinStatus {
            home: home.into(),
            remote: format!("{home}-me"),
            phase,
            reason: reason.map(str::to_owned),
            message: reason.map(|r| format!("because {r}")),
        }],
        retained: Vec::new(),
    }
}

#[test]
fn each_provider_answer_becomes_its_cluster_entry() {
    let ready = map_status("shop", MappingPhase::Accepted, None);
    let c = cluster("p", true, "shop", Answer::Map(Some(&ready)), None).unwrap();
    assert_eq!((c.twin, c.reason), (Some(TwinPhase::Ready), None));
    let refused = map_status("shop", MappingPhase::Refused, Some("NamespaceExists"));
    let c = cluster("p", true, "shop", Answer::Map(Some(&refused)), None).unwrap();
    assert_eq!(c.twin, Some(TwinPhase::Refused));
    assert_eq!(c.reason.as_deref(), Some("NamespaceExists"));
    assert_eq!(c.message.as_deref(), Some("because NamespaceExists"));
    let c = cluster("p", true, "shop", Answer::Map(None), None).unwrap();
    assert_eq!(c.twin, Some(TwinPhase::Creating));
    // Not selected and no twin there: not listed; not selected with a twin going: listed.
    assert!(cluster("p", false, "shop", Answer::Map(None), None).is_none());
    let going = map_status("shop", MappingPhase::Terminating, None);
    let c = cluster("p", false, "shop", Answer::Map(Some(&going)), None).unwrap();
    assert_eq!((c.selected, c.twin), (false, Some(TwinPhase::Terminating)));
    // Out of reach: the last answer stays, and the message says so.
    let prev = cluster("p", true, "shop", Answer::Map(Some(&refused)), None).unwrap();
    let c = cluster(
        "p",
        true,
        "shop",
        Answer::Unreachable("timeout"),
        Some(&prev),
    )
    .unwrap();
    assert_eq!(c.twin, Some(TwinPhase::Refused));
    assert_eq!(c.reason.as_deref(), Some("NamespaceExists"));
    assert!(c.message.unwrap().contains("out of reach (timeout)"));
    assert!(cluster("p", false, "shop", Answer::Unreachable("x"), None).is_none());
}

#[test]
fn the_status_has_the_phase_the_twin_name_and_the_generation() {
    let n = nso("shop", None);
    let ready = map_status("shop", MappingPhase::Accepted, None);
    let refused = map_status("shop", MappingPhase::Refused, Some("Reserved"));
    let clusters = vec![
        cluster("b", true, "shop", Answer::Map(Some(&refused)), None).unwrap(),
        cluster("a", true, "shop", Answer::Map(Some(&ready)), None).unwrap(),
    ];
    let st = status(&n, clusters.clone(), None, "me");
    assert_eq!(st.phase, Some(OffloadingPhase::SomeFailed));
    assert_eq!(st.remote_namespace_name.as_deref(), Some("shop-me"));
    assert_eq!(st.observed_generation, Some(3));
    assert_eq!(st.clusters[0].cluster_id, "a", "sorted");
    assert_eq!(st.message, None);
    // A refusal is reported once, and again when its reason changes.
    assert_eq!(newly_refused(&[], &st.clusters).len(), 1);
    assert!(newly_refused(&st.clusters, &st.clusters).is_empty());
    let other = map_status("shop", MappingPhase::Refused, Some("TooManyNamespaces"));
    let now = vec![cluster("b", true, "shop", Answer::Map(Some(&other)), None).unwrap()];
    assert_eq!(newly_refused(&st.clusters, &now).len(), 1);
    let st = status(&n, vec![], None, "me");
    assert_eq!(st.phase, Some(OffloadingPhase::NoClusterSelected));
}

#[test]
fn an_unoffload_lets_go_of_a_provider_once_the_twin_is_gone_unpeered_or_out_of_reach_too_long() {
    let going = map_status("shop", MappingPhase::Terminating, None);
    let other = map_status("web", MappingPhase::Accepted, None);
    assert_eq!(
        withdrawal("shop", Some(Answer::Map(Some(&going))), true),
        Withdrawal::Pending
    );
    assert_eq!(
        withdrawal("shop", Some(Answer::Map(Some(&other))), false),
        Withdrawal::Done
    );
    assert_eq!(
        withdrawal("shop", Some(Answer::Map(None)), false),
        Withdrawal::Done
    );
    assert_eq!(withdrawal("shop", None, false), Withdrawal::Unpeered);
    assert_eq!(
        withdrawal("shop", Some(Answer::Unreachable("x")), false),
        Withdrawal::Pending
    );
    assert_eq!(
        withdrawal("shop", Some(Answer::Unreachable("x")), true),
        Withdrawal::Abandoned
    );
}

#[test]
fn pods_go_through_the_webhook_for_the_strategies_that_offload_them() {
    assert!(scheduling_enabled(PodOffloadingStrategy::Remote));
    assert!(scheduling_enabled(PodOffloadingStrategy::LocalAndRemote));
    assert!(!scheduling_enabled(PodOffloadingStrategy::Local));
}

#[test]
fn a_selector_change_says_which_twins_it_removes() {
    let all = two_providers();
    let entry = |id: &str, selected: bool, twin: Option<TwinPhase>| ClusterOffloading {
        cluster_id: id.into(),
        selected,
        twin,
        ..Default::default()
    };
    let before = [
        entry("eu1", true, Some(TwinPhase::Ready)),
        entry("us1", true, Some(TwinPhase::Creating)),
        // Refused: nothing there to remove; gone: said with its unpeering.
        entry("refuser", true, Some(TwinPhase::Refused)),
        entry("gone", true, Some(TwinPhase::Ready)),
    ];
    let eu = |n: &NamespaceOffloading| selected(n, &all).0;
    let only_eu = nso("shop", Some(vec![term(&[("region", "In", &["eu"])])]));
    assert_eq!(deselected(&before, &eu(&only_eu), &all), ["us1"]);
    assert!(deselected(&before, &eu(&nso("shop", None)), &all).is_empty());
    let none = nso("shop", Some(vec![term(&[("region", "In", &["mars"])])]));
    assert_eq!(deselected(&before, &eu(&none), &all), ["eu1", "us1"]);
    // Not selected before (a twin still being removed): not the change's doing.
    let leaving = [entry("eu1", false, Some(TwinPhase::Terminating))];
    assert!(deselected(&leaving, &BTreeSet::new(), &all).is_empty());
}

#[test]
fn a_removal_says_what_goes_with_the_twin_and_what_stays() {
    let mut n = nso("shop", None);
    let retain = removal(&n, "shop-c1", "eu1", Some(2));
    assert!(
        retain.starts_with(
            "provider eu1: namespace shop-c1 is removed with everything in it but the claims"
        ) && retain.contains("2 pod(s) of shop running there will end Failed"),
        "{retain}"
    );
    n.spec.storage_retention = StorageRetention::Delete;
    let delete = removal(&n, "shop-c1", "eu1", None);
    assert!(
        delete.contains("is removed with everything in it;")
            && delete.contains("; the pods of shop"),
        "{delete}"
    );
}

#[test]
fn pods_the_webhook_did_not_place_are_named() {
    let pod = |name: &str, node: Option<&str>, toleration: Option<&str>, phase: &str| -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [{"name": "c"}],
                     "tolerations": toleration.map(|k| vec![serde_json::json!(
                        {"key": k, "operator": "Exists", "effect": "NoExecute"})])},
            "status": {"phase": phase}
        }))
        .unwrap()
    };
    let pods = [
        pod("before", Some("node-a"), None, "Running"),
        pod("pending", None, None, "Pending"),
        pod("placed", None, Some(taint::VIRTUAL_NODE), "Pending"),
        pod("other-toleration", Some("node-a"), Some("gpu"), "Running"),
        pod("done", Some("node-a"), None, "Succeeded"),
        pod("pod-by-pod", Some("fabric-p"), None, "Running"),
    ];
    let names: Vec<String> = not_placed(&pods, |n| n == "fabric-p")
        .iter()
        .map(|p| p.name_any())
        .collect();
    assert_eq!(names, ["before", "pending", "other-toleration"]);
    let note = not_placed_note("shop", PodOffloadingStrategy::Remote);
    assert!(
        note.starts_with(
            "created before namespace shop was offloaded (pod offloading strategy Remote)"
        ),
        "{note}"
    );
}

#[test]
fn the_status_names_the_first_pods_created_before_and_counts_them_all() {
    assert_eq!(PodsCreatedBefore::of([]), None);
    let names: Vec<String> = (0..12).rev().map(|i| format!("web-{i:02}")).collect();
    let st = PodsCreatedBefore::of(names.iter().map(String::as_str)).unwrap();
    assert_eq!(st.count, 12);
    assert_eq!(st.pods.len(), PodsCreatedBefore::SHOWN);
    assert_eq!(st.pods.first().map(String::as_str), Some("web-00"));
    assert_eq!(st.pods.last().map(String::as_str), Some("web-09"));
}
