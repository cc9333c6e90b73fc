use fabric_api::authentication::v1alpha1::ResourceSliceSpec;
use k8s_openapi::{
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::Condition},
    jiff::Timestamp,
};

use fabric_kube::status::Reason;

use super::*;

fn res(items: &[(&str, &str)]) -> Resources {
    items
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
        .collect()
}

fn accepted_cond(ok: bool, reason: &str) -> Condition {
    fabric_kube::status::condition(
        slice_condition::ACCEPTED,
        ok,
        reason,
        String::new(),
        None,
        Timestamp::UNIX_EPOCH,
    )
}

fn slice(
    name: &str,
    provider: &str,
    granted: &[(&str, &str)],
    reason: Option<&str>,
) -> ResourceSlice {
    let mut s = ResourceSlice::new(
        name,
        ResourceSliceSpec {
            consumer_cluster_id: "cons".into(),
            provider_cluster_id: provider.into(),
            resources: res(&[("cpu", "8")]),
            at_most_once: None,
        },
    );
    s.metadata.namespace = Some("fabric-system".into());
    s.status = reason.map(|r| ResourceSliceStatus {
        granted: res(granted),
        node_labels: BTreeMap::from([("node-type".to_owned(), "gpu".to_owned())]),
        at_most_once: None,
        default_storage_class: None,
        mode: Default::default(),
        observed_generation: None,
        conditions: vec![accepted_cond(r != "Refused", r)],
    });
    s
}

#[test]
fn the_replica_carries_the_spec_only_into_the_tenant_namespace() {
    let mut s = slice("s1", "prov", &[("cpu", "2")], Some("Granted"));
    s.metadata.finalizers = Some(vec![FINALIZER.into()]);
    let r = replica(&s, "fabric-tenant-cons");
    assert_eq!(r.metadata.namespace.as_deref(), Some("fabric-tenant-cons"));
    assert_eq!(r.metadata.name.as_deref(), Some("s1"));
    assert_eq!(r.spec, s.spec);
    assert!(r.status.is_none(), "status comes from the provider only");
    assert!(r.metadata.finalizers.is_none());
}

#[test]
fn the_virtual_node_sums_the_accepted_grants_of_its_provider() {
    let slices = [
        slice(
            "a",
            "prov",
            &[("cpu", "2"), ("memory", "1Gi")],
            Some("Granted"),
        ),
        slice("b", "prov", &[("cpu", "1500m")], Some("PartiallyGranted")),
        slice("c", "prov", &[], Some("Refused")),
        slice("d", "prov", &[("cpu", "1")], None),
        slice("e", "other", &[("cpu", "7")], Some("Granted")),
    ];
    let vn = virtual_node("prov", "fabric-system", &slices).unwrap();
    assert_eq!(vn.metadata.name.as_deref(), Some("prov"));
    assert_eq!(vn.spec.node_name, "fabric-prov");
    assert_eq!(vn.spec.identity, "prov");
    assert_eq!(
        vn.spec.resources,
        res(&[("cpu", "3500m"), ("memory", "1Gi")])
    );
    assert_eq!(
        vn.spec.labels.get("node-type").map(String::as_str),
        Some("gpu")
    );
    assert!(virtual_node("prov", "fabric-system", &slices[2..4]).is_none());
    assert!(virtual_node("nobody", "fabric-system", &slices).is_none());
}

#[test]
fn the_virtual_node_waits_for_the_longest_at_most_once_terms_agreed() {
    use fabric_api::offloading::v1alpha1::AtMostOnce;
    let with = |name, agreed: Option<AtMostOnce>| {
        let mut s = slice(name, "prov", &[("cpu", "1")], Some("Granted"));
        s.status.as_mut().unwrap().at_most_once = agreed;
        s
    };
    let terms = |p, g| AtMostOnce {
        partition_seconds: p,
        grace_seconds: g,
    };
    let off = [with("a", None)];
    assert_eq!(
        virtual_node("prov", "ns", &off).unwrap().spec.at_most_once,
        None
    );
    let on = [
        with("a", Some(terms(10, 7))),
        with("b", Some(terms(30, 2))),
        with("c", None),
    ];
    assert_eq!(
        virtual_node("prov", "ns", &on).unwrap().spec.at_most_once,
        Some(terms(30, 7))
    );
}

#[test]
fn resources_granted_says_the_best_answer() {
    let g = slice("a", "p", &[("cpu", "1")], Some("Granted"));
    let p = slice("b", "p", &[("cpu", "1")], Some("PartiallyGranted"));
    let r = slice("c", "p", &[], Some("Refused"));
    let n = slice("d", "p", &[], None);
    let of = |s: &[&ResourceSlice]| {
        let v = resources_granted(s.iter().map(|s| s.status.as_ref()));
        (v.ok, v.reason.as_str().to_owned(), v.message)
    };
    assert_eq!(of(&[&p, &g]).1, "Granted");
    assert_eq!(of(&[&r, &p]).1, "PartiallyGranted");
    let (ok, reason, _) = of(&[&r]);
    assert!(!ok && reason == "Refused");
    assert_eq!(of(&[&n]).1, "Pending");
    assert_eq!(of(&[]).1, "NoSlice");
}

#[test]
fn granted_storage_is_the_virtual_node_s_storage_not_its_resources() {
    let with = |name, granted: &[(&str, &str)], default: Option<&str>| {
        let mut s = slice(name, "prov", granted, Some("Granted"));
        s.status.as_mut().unwrap().default_storage_class = default.map(str::to_owned);
        s
    };
    let slices = [
        with(
            "a",
            &[("cpu", "1"), ("storage.fabric.io/standard", "10Gi")],
            Some("standard"),
        ),
        with("b", &[("storage.fabric.io/fast", "1Gi")], Some("fast")),
    ];
    let vn = virtual_node("prov", "ns", &slices).unwrap();
    assert_eq!(
        vn.spec.resources,
        res(&[("cpu", "1")]),
        "no pod asks for it"
    );
    let storage = vn.spec.storage.unwrap();
    assert_eq!(storage.classes, vec!["fast", "standard"]);
    assert_eq!(
        storage.default.as_deref(),
        Some("standard"),
        "the first said"
    );

    // A default the provider did not grant is never taken: the first class granted is.
    let odd = [with(
        "a",
        &[("cpu", "1"), ("storage.fabric.io/fast", "1Gi")],
        Some("standard"),
    )];
    let storage = virtual_node("prov", "ns", &odd)
        .unwrap()
        .spec
        .storage
        .unwrap();
    assert_eq!(storage.default.as_deref(), Some("fast"));

    // No storage granted: none (the virtual kubelet sends claims back to the scheduler).
    let none = [with("a", &[("cpu", "1")], None)];
    assert_eq!(
        virtual_node("prov", "ns", &none).unwrap().spec.storage,
        None
    );
}
