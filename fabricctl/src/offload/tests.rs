use fabric_api::offloading::v1alpha1::NamespaceOffloadingStatus;

use super::*;

fn reqs(t: &NodeSelectorTerm) -> Vec<(String, String, Vec<String>)> {
    t.match_expressions
        .iter()
        .flatten()
        .map(|r| {
            (
                r.key.clone(),
                r.operator.clone(),
                r.values.clone().unwrap_or_default(),
            )
        })
        .collect()
}

fn v(s: &[&str]) -> Vec<String> {
    s.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn a_selector_term_ands_its_requirements() {
    let t = term("region=eu,tier!=gold,gpu,!spot, zone in (a, b),os notin (windows)").unwrap();
    assert_eq!(
        reqs(&t),
        [
            ("region".into(), "In".into(), v(&["eu"])),
            ("tier".into(), "NotIn".into(), v(&["gold"])),
            ("gpu".into(), "Exists".into(), v(&[])),
            ("spot".into(), "DoesNotExist".into(), v(&[])),
            ("zone".into(), "In".into(), v(&["a", "b"])),
            ("os".into(), "NotIn".into(), v(&["windows"])),
        ]
    );
    let t = term("topology.kubernetes.io/zone==z1").unwrap();
    assert_eq!(
        reqs(&t),
        [(
            "topology.kubernetes.io/zone".into(),
            "In".into(),
            v(&["z1"])
        )]
    );
}

#[test]
fn a_bad_selector_is_refused_naming_the_bad_part() {
    for (input, says) in [
        ("region=eu,,tier=1", "an empty requirement"),
        ("region=eu,zone in (a,b", "unbalanced parentheses"),
        ("zone in a,b", "wants a list in parentheses"),
        ("zone near (a)", "\"zone near (a)\""),
        ("bad key=x", "\"bad key\" is not a label key"),
        ("region=e u", "\"e u\" is not a label value"),
        ("Bad_Prefix/x=1", "is not a DNS subdomain"),
        ("zone in (a,,b)", "an empty value"),
    ] {
        let e = term(input).unwrap_err();
        assert!(e.contains(says), "{input}: {e}");
        assert!(e.contains(&format!("{input:?}")), "names the selector: {e}");
    }
}

fn request(names: &[&str]) -> Request {
    Request {
        names: v(names),
        ..Default::default()
    }
}

#[test]
fn the_offloadings_asked_for_are_checked() {
    let mut r = request(&["shop", "web"]);
    r.selectors = v(&["region=eu", "gpu"]);
    let o = offloadings(&r).unwrap();
    assert_eq!(o.len(), 2);
    assert_eq!(o[1].namespace().as_deref(), Some("web"));
    assert_eq!(o[0].name_any(), "offloading");
    let terms = &o[0]
        .spec
        .cluster_selector
        .as_ref()
        .unwrap()
        .node_selector_terms;
    assert_eq!(terms.len(), 2, "one term per --selector, ORed");
    assert_eq!(
        o[0].spec.namespace_mapping_strategy,
        MappingStrategy::DefaultName
    );
    assert!(offloadings(&request(&[])).is_err());
    // A remote name: one namespace only, and it means SelectedName.
    r.remote_name = Some("mine".into());
    let e = offloadings(&r).unwrap_err().to_string();
    assert!(
        e.contains("one at a time") && e.contains("shop, web"),
        "{e}"
    );
    let mut one = request(&["shop"]);
    one.remote_name = Some("mine".into());
    let o = offloadings(&one).unwrap();
    assert_eq!(
        o[0].spec.namespace_mapping_strategy,
        MappingStrategy::SelectedName
    );
    one.mapping = Some(MappingStrategy::EnforceSameName);
    assert!(offloadings(&one).is_err());
    one.remote_name = None;
    one.mapping = Some(MappingStrategy::SelectedName);
    let e = offloadings(&one).unwrap_err().to_string();
    assert!(e.contains("needs --remote-namespace-name"), "{e}");
    one.mapping = None;
    one.remote_name = Some("Not_A_Name".into());
    assert!(offloadings(&one).is_err());
    let mut bad = request(&["shop"]);
    bad.selectors = v(&["region=eu", "zone in (a"]);
    let e = offloadings(&bad).unwrap_err().to_string();
    assert!(e.contains("zone in (a"), "{e}");
}

#[test]
fn yaml_output_is_the_objects_each_ending_a_document() {
    let o = offloadings(&request(&["shop", "web"])).unwrap();
    let y = to_yaml(&o).unwrap();
    assert_eq!(y.matches("---\n").count(), 2, "{y}");
    assert!(y.contains("kind: NamespaceOffloading"), "{y}");
    assert!(y.contains("namespace: web"), "{y}");
    let back: NamespaceOffloading =
        serde_saphyr::from_str(y.split("---\n").next().unwrap()).unwrap();
    assert_eq!(back.spec, o[0].spec);
    assert_eq!(back.namespace(), o[0].namespace());
}

fn with_status(
    generation: i64,
    observed: i64,
    phase: OffloadingPhase,
    clusters: Vec<ClusterOffloading>,
) -> NamespaceOffloading {
    let mut n = offloading("shop", NamespaceOffloadingSpec::default());
    n.metadata.generation = Some(generation);
    n.status = Some(NamespaceOffloadingStatus {
        observed_generation: Some(observed),
        phase: Some(phase),
        remote_namespace_name: Some("shop-me".into()),
        message: None,
        clusters,
        created_before: None,
    });
    n
}

fn c(id: &str, selected: bool, twin: Option<TwinPhase>, reason: Option<&str>) -> ClusterOffloading {
    ClusterOffloading {
        cluster_id: id.into(),
        selected,
        twin,
        reason: reason.map(str::to_owned),
        message: reason.map(|r| format!("{r} says the provider")),
    }
}

#[test]
fn an_offload_is_done_once_its_generation_is_answered() {
    let ready = vec![
        c("a", true, Some(TwinPhase::Ready), None),
        c("b", false, None, None),
    ];
    let n = with_status(2, 1, OffloadingPhase::Ready, ready.clone());
    assert_eq!(
        outcome(&n),
        Outcome::Waiting,
        "an older generation's answer"
    );
    let n = with_status(2, 2, OffloadingPhase::Ready, ready);
    assert_eq!(
        outcome(&n),
        Outcome::Ready("✓ shop offloaded to a as shop-me".into())
    );
    let n = with_status(1, 1, OffloadingPhase::NoClusterSelected, vec![]);
    assert!(matches!(outcome(&n), Outcome::Warn(w) if w.contains("selects no provider")));
    let n = with_status(
        1,
        1,
        OffloadingPhase::AllFailed,
        vec![c(
            "a",
            true,
            Some(TwinPhase::Refused),
            Some("NamespaceExists"),
        )],
    );
    let Outcome::Failed(why) = outcome(&n) else {
        panic!("failed expected")
    };
    assert!(
        why.contains("provider a") && why.contains("NamespaceExists"),
        "{why}"
    );
    let n = with_status(1, 1, OffloadingPhase::InProgress, vec![]);
    assert_eq!(outcome(&n), Outcome::Waiting);
}

#[test]
fn progress_is_printed_per_provider_as_it_changes() {
    let mut p = Progress::default();
    let n = with_status(
        1,
        1,
        OffloadingPhase::InProgress,
        vec![
            c("a", true, Some(TwinPhase::Creating), None),
            c("b", false, None, None),
        ],
    );
    let lines = p.observe(&n);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].contains("provider a twin Creating"), "{lines:?}");
    assert!(lines[1].contains("provider b not selected"), "{lines:?}");
    assert!(p.observe(&n).is_empty(), "nothing changed");
    let n = with_status(
        1,
        1,
        OffloadingPhase::Ready,
        vec![
            c("a", true, Some(TwinPhase::Ready), None),
            c("b", false, None, None),
        ],
    );
    assert_eq!(p.observe(&n), ["shop: ✓ provider a twin Ready"]);
}

#[test]
fn an_unoffload_says_what_goes_on_each_provider() {
    let n = with_status(
        1,
        1,
        OffloadingPhase::Ready,
        vec![
            c("a", true, Some(TwinPhase::Ready), None),
            c("b", false, None, None),
        ],
    );
    let lines = removal(&n, &BTreeMap::from([("a".to_owned(), 3)]));
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("provider a: namespace shop-me is removed")
            && lines[0].contains("3 pod(s) of shop"),
        "{lines:?}"
    );
    assert!(
        lines[0].contains("but the claims of this namespace's volumes"),
        "Retain by default: {lines:?}"
    );
    let mut deleting = n.clone();
    deleting.spec.storage_retention = StorageRetention::Delete;
    let lines = removal(&deleting, &BTreeMap::new());
    assert!(
        lines[0].contains("is removed with everything in it;"),
        "Delete: {lines:?}"
    );
    let none = with_status(1, 1, OffloadingPhase::NoClusterSelected, vec![]);
    assert!(removal(&none, &BTreeMap::new())[0].contains("nothing is removed"));
}
