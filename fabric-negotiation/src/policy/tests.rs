use k8s_openapi::{
    api::core::v1::{Container, NodeSpec, NodeStatus, PodSpec, PodStatus, ResourceRequirements},
    apimachinery::pkg::api::resource::Quantity,
};
use kube::api::ObjectMeta;

use super::*;

fn res(items: &[(&str, &str)]) -> Resources {
    items
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
        .collect()
}

fn node(name: &str, alloc: &[(&str, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus {
            allocatable: Some(res(alloc)),
            ..Default::default()
        }),
    }
}

fn virtual_node(name: &str, alloc: &[(&str, &str)]) -> Node {
    let mut n = node(name, alloc);
    n.metadata.labels = Some(BTreeMap::from([(
        label::NODE_TYPE.to_owned(),
        label::VIRTUAL_NODE_TYPE.to_owned(),
    )]));
    n
}

fn pod(node: &str, requests: &[(&str, &str)]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("p".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            containers: vec![Container {
                name: "c".into(),
                resources: Some(ResourceRequirements {
                    requests: Some(res(requests)),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        }),
    }
}

fn tenant(id: &str, state: TenantState, caps: &[(&str, &str)]) -> TenantView {
    TenantView {
        cluster_id: id.into(),
        state,
        caps: caps
            .iter()
            .map(|(k, v)| ((*k).to_owned(), milli(v).unwrap()))
            .collect(),
    }
}

fn slice(consumer: &str, asked: &[(&str, &str)]) -> SliceView {
    SliceView {
        key: (
            fabric_api::names::namespace::tenant(consumer),
            "s".to_owned(),
        ),
        consumer: consumer.into(),
        provider: "prov".into(),
        tenant: Some(tenant(consumer, TenantState::Active, &[])),
        requested: res(asked),
        granted: Resources::new(),
        created: None,
        at_most_once: None,
    }
}

fn at(secs: i64) -> Option<Timestamp> {
    Some(Timestamp::from_second(secs).unwrap())
}

fn settings() -> Settings {
    Settings::new("prov")
}

fn one(s: &SliceView, cap: &Capacity) -> Offer {
    decide(&settings(), cap, std::slice::from_ref(s))
        .remove(&s.key)
        .unwrap()
}

fn g(o: &Offer, r: &str) -> String {
    o.granted.get(r).map(|q| q.0.clone()).unwrap_or_default()
}

fn cap(nodes: &[Node], pods: &[Pod]) -> Capacity {
    Capacity::of(nodes, pods)
}

#[test]
fn offers_ninety_percent_of_what_is_free_on_real_nodes() {
    let nodes = [
        node("n1", &[("cpu", "4"), ("memory", "8Gi"), ("pods", "110")]),
        node("n2", &[("cpu", "4"), ("memory", "8Gi"), ("pods", "110")]),
        // A virtual node lends nothing of this cluster.
        virtual_node("vk", &[("cpu", "100"), ("memory", "1Ti")]),
    ];
    let pods = [
        pod("n1", &[("cpu", "2"), ("memory", "4Gi")]),
        // On the virtual node: not on a real node, not counted.
        pod("vk", &[("cpu", "50")]),
    ];
    let c = cap(&nodes, &pods);
    // cpu: 8 - 2 = 6 free, 90% = 5.4; memory 12Gi free -> 10.8Gi; pods 219 free -> 197.1
    let o = one(
        &slice(
            "c1",
            &[("cpu", "100"), ("memory", "100Gi"), ("pods", "1000")],
        ),
        &c,
    );
    assert_eq!(g(&o, "cpu"), "5400m");
    assert_eq!(
        milli(&g(&o, "memory")).unwrap(),
        12 * (1i128 << 30) * 1000 * 9 / 10
    );
    assert_eq!(g(&o, "pods"), "197100m");
    assert_eq!(o.verdict, Verdict::PartiallyGranted);
    assert!(
        o.message.contains("cpu: 5400m of 100 (capacity"),
        "{}",
        o.message
    );
}

#[test]
fn the_request_caps_the_offer_and_a_full_grant_says_so() {
    let c = cap(&[node("n1", &[("cpu", "8"), ("memory", "16Gi")])], &[]);
    let o = one(&slice("c1", &[("cpu", "2"), ("memory", "1Gi")]), &c);
    assert_eq!(g(&o, "cpu"), "2");
    assert_eq!(g(&o, "memory"), "1Gi");
    assert_eq!(o.verdict, Verdict::Granted);
}

#[test]
fn finished_offloaded_and_unbound_pods_hold_nothing() {
    let nodes = [node("n1", &[("cpu", "10")])];
    let mut done = pod("n1", &[("cpu", "5")]);
    done.status.as_mut().unwrap().phase = Some("Succeeded".into());
    let mut offloaded = pod("n1", &[("cpu", "5")]);
    offloaded.metadata.labels = Some(BTreeMap::from([(
        label::REMOTE_CLUSTER.to_owned(),
        "c1".to_owned(),
    )]));
    let pending = pod("", &[("cpu", "5")]);
    let c = cap(&nodes, &[done, offloaded, pending]);
    assert_eq!(c.used.get("cpu").copied().unwrap_or(0), 0);
    assert_eq!(c.offerable(90)["cpu"], 9000);
}

#[test]
fn unschedulable_nodes_lend_nothing() {
    let mut cordoned = node("n2", &[("cpu", "10")]);
    cordoned.spec.as_mut().unwrap().unschedulable = Some(true);
    let c = cap(&[node("n1", &[("cpu", "10")]), cordoned], &[]);
    assert_eq!(c.allocatable["cpu"], 10_000);
}

#[test]
fn init_containers_and_overhead_count_as_the_scheduler_counts_them() {
    let mut p = pod("n1", &[("cpu", "1")]);
    let spec = p.spec.as_mut().unwrap();
    spec.init_containers = Some(vec![Container {
        name: "init".into(),
        resources: Some(ResourceRequirements {
            requests: Some(res(&[("cpu", "3")])),
            ..Default::default()
        }),
        ..Default::default()
    }]);
    spec.overhead = Some(res(&[("cpu", "100m")]));
    let r = pod_requests(&p);
    assert_eq!(r["cpu"], 3100);
    assert_eq!(r["pods"], 1000);
}

#[test]
fn sidecars_and_pod_level_requests_hold_capacity_as_the_scheduler_counts_them() {
    // A sidecar runs beside the containers: 1 + 2 held, not max(1, 2) (as counted before,
    // when the provider offered capacity its scheduler then did not find).
    let mut p = pod("n1", &[("cpu", "1")]);
    p.spec.as_mut().unwrap().init_containers = Some(vec![Container {
        name: "proxy".into(),
        restart_policy: Some("Always".into()),
        resources: Some(ResourceRequirements {
            requests: Some(res(&[("cpu", "2")])),
            ..Default::default()
        }),
        ..Default::default()
    }]);
    let c = cap(&[node("n1", &[("cpu", "10")])], &[p]);
    assert_eq!(c.used["cpu"], 3000);
    // Pod-level requests are the pod's, whatever its containers ask.
    let mut p = pod("n1", &[("cpu", "1")]);
    p.spec.as_mut().unwrap().resources = Some(ResourceRequirements {
        requests: Some(res(&[("cpu", "4")])),
        ..Default::default()
    });
    let c = cap(&[node("n1", &[("cpu", "10")])], &[p]);
    assert_eq!(c.used["cpu"], 4000);
    assert_eq!(c.offerable(90)["cpu"], 5400);
}

#[test]
fn the_offer_follows_capacity_as_nodes_and_pods_come_and_go() {
    let s = slice("c1", &[("cpu", "20")]);
    let small = cap(&[node("n1", &[("cpu", "10")])], &[]);
    assert_eq!(g(&one(&s, &small), "cpu"), "9");
    let bigger = cap(
        &[node("n1", &[("cpu", "10")]), node("n2", &[("cpu", "10")])],
        &[],
    );
    assert_eq!(g(&one(&s, &bigger), "cpu"), "18");
    let busier = cap(
        &[node("n1", &[("cpu", "10")]), node("n2", &[("cpu", "10")])],
        &[pod("n2", &[("cpu", "10")])],
    );
    // An existing grant shrinks with capacity too: never more than is there.
    let mut held = s.clone();
    held.granted = res(&[("cpu", "18")]);
    assert_eq!(g(&one(&held, &busier), "cpu"), "9");
}

#[test]
fn two_consumers_never_over_commit_together() {
    let c = cap(&[node("n1", &[("cpu", "10"), ("memory", "10Gi")])], &[]);
    let mut a = slice("a", &[("cpu", "6"), ("memory", "8Gi")]);
    a.created = at(100);
    let mut b = slice("b", &[("cpu", "6"), ("memory", "8Gi")]);
    b.created = at(200);
    let out = decide(&settings(), &c, &[b.clone(), a.clone()]);
    let (oa, ob) = (&out[&a.key], &out[&b.key]);
    // The older slice first, the newer gets what is left of 9 cpus.
    assert_eq!(g(oa, "cpu"), "6");
    assert_eq!(g(ob, "cpu"), "3");
    let mem: i128 = [oa, ob]
        .iter()
        .map(|o| milli(&g(o, "memory")).unwrap())
        .sum();
    assert!(mem <= 10 * (1i128 << 30) * 1000 * 9 / 10);
    assert_eq!(ob.verdict, Verdict::PartiallyGranted);
    // The same answer whatever order the caches list them in.
    assert_eq!(decide(&settings(), &c, &[a.clone(), b.clone()]), out);
}

#[test]
fn existing_grants_are_kept_before_new_ones() {
    let c = cap(&[node("n1", &[("cpu", "10")])], &[]);
    let mut old = slice("old", &[("cpu", "6")]);
    old.created = at(500);
    old.granted = res(&[("cpu", "6")]);
    // Created earlier, but holds nothing yet (e.g. its grant was answered after): it waits.
    let mut new = slice("new", &[("cpu", "6")]);
    new.created = at(100);
    let out = decide(&settings(), &c, &[new.clone(), old.clone()]);
    assert_eq!(g(&out[&old.key], "cpu"), "6");
    assert_eq!(g(&out[&new.key], "cpu"), "3");
}

#[test]
fn tenant_caps_bound_the_total_of_its_slices() {
    let c = cap(&[node("n1", &[("cpu", "100"), ("memory", "100Gi")])], &[]);
    let mut s1 = slice("c1", &[("cpu", "10"), ("memory", "1Gi")]);
    s1.tenant = Some(tenant("c1", TenantState::Active, &[("cpu", "4")]));
    s1.created = at(1);
    let mut s2 = s1.clone();
    s2.key.1 = "s2".into();
    s2.created = at(2);
    let out = decide(&settings(), &c, &[s1.clone(), s2.clone()]);
    assert_eq!(g(&out[&s1.key], "cpu"), "4");
    assert_eq!(g(&out[&s1.key], "memory"), "1Gi");
    assert_eq!(g(&out[&s2.key], "cpu"), "");
    assert!(
        out[&s2.key]
            .message
            .contains("cpu: 0 of 10 (the tenant's cap)"),
        "{}",
        out[&s2.key].message
    );
    assert_eq!(out[&s2.key].verdict, Verdict::PartiallyGranted);
}

#[test]
fn a_zero_cap_refuses_that_resource() {
    let c = cap(
        &[node("n1", &[("cpu", "100"), ("nvidia.com/gpu", "4")])],
        &[],
    );
    let mut s = slice("c1", &[("nvidia.com/gpu", "1")]);
    s.tenant = Some(tenant(
        "c1",
        TenantState::Active,
        &[("nvidia.com/gpu", "0")],
    ));
    let o = one(&s, &c);
    assert_eq!(o.verdict, Verdict::Refused);
    assert!(o.message.contains("tenant's cap"), "{}", o.message);
}

#[test]
fn cordoned_tenants_keep_what_they_have_and_get_nothing_new() {
    let c = cap(&[node("n1", &[("cpu", "100")])], &[]);
    let mut s = slice("c1", &[("cpu", "10")]);
    s.tenant = Some(tenant("c1", TenantState::Cordoned, &[]));
    s.granted = res(&[("cpu", "3")]);
    let o = one(&s, &c);
    assert_eq!(g(&o, "cpu"), "3");
    assert!(o.message.contains("cordoned"), "{}", o.message);
    let mut fresh = slice("c1", &[("cpu", "10")]);
    fresh.tenant = s.tenant.clone();
    let o = one(&fresh, &c);
    assert_eq!(o.verdict, Verdict::Refused);
    assert!(o.granted.is_empty());
}

#[test]
fn drained_tenants_get_zero() {
    let c = cap(&[node("n1", &[("cpu", "100")])], &[]);
    let mut s = slice("c1", &[("cpu", "10")]);
    s.tenant = Some(tenant("c1", TenantState::Drained, &[]));
    s.granted = res(&[("cpu", "3")]);
    let o = one(&s, &c);
    assert!(o.granted.is_empty());
    assert_eq!(o.verdict, Verdict::Refused);
    assert!(o.message.contains("drained"));
}

#[test]
fn a_slice_speaking_for_another_consumer_or_provider_is_refused() {
    let c = cap(&[node("n1", &[("cpu", "100")])], &[]);
    let mut liar = slice("c1", &[("cpu", "1")]);
    liar.consumer = "c2".into();
    let o = one(&liar, &c);
    assert_eq!(o.verdict, Verdict::Refused);
    assert!(o.message.contains("belongs to \"c1\""), "{}", o.message);
    let mut elsewhere = slice("c1", &[("cpu", "1")]);
    elsewhere.provider = "other".into();
    assert_eq!(one(&elsewhere, &c).verdict, Verdict::Refused);
    let mut stranger = slice("c1", &[("cpu", "1")]);
    stranger.tenant = None;
    assert!(one(&stranger, &c).message.contains("no Tenant"));
}

#[test]
fn resources_no_node_has_and_bad_quantities_are_named() {
    let c = cap(&[node("n1", &[("cpu", "100")])], &[]);
    let o = one(
        &slice(
            "c1",
            &[("cpu", "1"), ("nvidia.com/gpu", "1"), ("memory", "lots")],
        ),
        &c,
    );
    assert_eq!(o.verdict, Verdict::PartiallyGranted);
    assert!(
        o.message.contains("nvidia.com/gpu: 0 of 1 (no node"),
        "{}",
        o.message
    );
    assert!(
        o.message.contains("memory: 0 of lots (not a quantity)"),
        "{}",
        o.message
    );
}

#[test]
fn labels_are_the_configured_ones_plus_gpu_when_a_gpu_is_granted() {
    let c = cap(
        &[node("n1", &[("cpu", "100"), ("nvidia.com/gpu", "2")])],
        &[],
    );
    let mut st = settings();
    st.labels
        .insert("topology.kubernetes.io/region".into(), "eu".into());
    let s = slice("c1", &[("cpu", "1"), ("nvidia.com/gpu", "1")]);
    let o = decide(&st, &c, std::slice::from_ref(&s))
        .remove(&s.key)
        .unwrap();
    assert_eq!(o.labels.get("node-type").map(String::as_str), Some("gpu"));
    assert_eq!(o.labels.len(), 2);
    let cpu_only = slice("c1", &[("cpu", "1")]);
    let o = decide(&st, &c, std::slice::from_ref(&cpu_only))
        .remove(&cpu_only.key)
        .unwrap();
    assert!(!o.labels.contains_key("node-type"));
}

#[test]
fn an_unchanged_offer_writes_the_same_status() {
    let c = cap(&[node("n1", &[("cpu", "10")])], &[]);
    let o = one(&slice("c1", &[("cpu", "1")]), &c);
    let t0 = Timestamp::from_second(1000).unwrap();
    let s1 = status(&o, None, Some(1), t0);
    assert_eq!(s1.conditions[0].reason, "Granted");
    assert_eq!(s1.conditions[0].status, "True");
    let s2 = status(
        &o,
        Some(&s1),
        Some(1),
        Timestamp::from_second(2000).unwrap(),
    );
    assert_eq!(s1, s2);
}

#[test]
fn at_most_once_is_agreed_within_bounds_and_written_in_the_status() {
    use fabric_api::offloading::v1alpha1::AtMostOnce;
    let cap = cap(&[node("n1", &[("cpu", "4")])], &[]);
    let mut s = slice("alpha", &[("cpu", "1")]);
    assert_eq!(one(&s, &cap).at_most_once, None);
    s.at_most_once = Some(AtMostOnce {
        partition_seconds: 1,
        grace_seconds: 3,
    });
    let offer = one(&s, &cap);
    let agreed = Some(AtMostOnce {
        partition_seconds: 5,
        grace_seconds: 3,
    });
    assert_eq!(offer.at_most_once, agreed);
    assert_eq!(
        status(&offer, None, None, Timestamp::UNIX_EPOCH).at_most_once,
        agreed
    );
    // A refused slice agrees to nothing.
    let none = Capacity::default();
    assert_eq!(one(&s, &none).verdict, Verdict::Refused);
    assert_eq!(one(&s, &none).at_most_once, None);
    s.tenant = None;
    assert_eq!(one(&s, &cap).at_most_once, None);
}

#[test]
fn storage_lent_is_offered_whole_shared_out_and_names_the_default_class() {
    let mut c = cap(&[node("n1", &[("cpu", "10")])], &[]);
    c.lent = fabric_api::offloading::lent::Lent::parse("standard=100Gi,fast=10Gi", None).unwrap();
    let mut a = slice(
        "a",
        &[
            ("cpu", "1"),
            ("storage.fabric.io/standard", "60Gi"),
            ("storage.fabric.io/fast", "4Gi"),
        ],
    );
    a.created = at(1);
    let mut b = slice(
        "b",
        &[
            ("storage.fabric.io/standard", "60Gi"),
            ("storage.fabric.io/fast", "1Gi"),
            ("storage.fabric.io/gold", "1Gi"),
        ],
    );
    b.created = at(2);
    let out = decide(&settings(), &c, &[a.clone(), b.clone()]);
    let (oa, ob) = (&out[&a.key], &out[&b.key]);
    // Not 90%: the admin said how much it lends; in binary units, as storage is written.
    assert_eq!(g(oa, "storage.fabric.io/standard"), "60Gi");
    assert_eq!(g(oa, "storage.fabric.io/fast"), "4Gi");
    assert_eq!(oa.verdict, Verdict::Granted);
    assert_eq!(oa.default_storage_class.as_deref(), Some("standard"));
    // The two together never more than is lent.
    assert_eq!(g(ob, "storage.fabric.io/standard"), "40Gi");
    assert_eq!(g(ob, "storage.fabric.io/fast"), "1Gi");
    assert_eq!(ob.verdict, Verdict::PartiallyGranted);
    assert!(
        ob.message.contains(
            "storage.fabric.io/standard: 40Gi of 60Gi (what this cluster lends of that StorageClass is granted)"
        ),
        "{}",
        ob.message
    );
    assert!(
        ob.message.contains(
            "storage.fabric.io/gold: 0 of 1Gi (this cluster does not lend that StorageClass)"
        ),
        "{}",
        ob.message
    );
    let st = status(ob, None, Some(1), Timestamp::from_second(0).unwrap());
    assert_eq!(st.default_storage_class.as_deref(), Some("standard"));

    // The provider's default not granted: the first class granted is the default.
    let only_fast = slice("c", &[("storage.fabric.io/fast", "1Gi")]);
    assert_eq!(
        one(&only_fast, &c).default_storage_class.as_deref(),
        Some("fast")
    );
    // No storage granted, no default class.
    let none = one(&slice("d", &[("cpu", "1")]), &c);
    assert_eq!(none.default_storage_class, None);
    // Nothing lent: storage is refused, saying so.
    let bare = cap(&[node("n1", &[("cpu", "10")])], &[]);
    let o = one(&only_fast, &bare);
    assert_eq!(o.verdict, Verdict::Refused);
    assert!(o.message.contains("does not lend"), "{}", o.message);
}

fn tethered_to(peer: &str) -> Settings {
    Settings {
        tethered: Some(peer.to_owned()),
        ..settings()
    }
}

#[test]
fn tethered_offers_all_of_what_is_free_to_its_peer_alone() {
    let c = cap(
        &[node("n1", &[("cpu", "10"), ("pods", "100")])],
        &[pod("n1", &[("cpu", "2")])],
    );
    let mut x = slice("x", &[("cpu", "100"), ("pods", "1000")]);
    let mut y = slice("y", &[("cpu", "1")]);
    y.created = at(10);
    x.created = at(20);

    // Autonomous: 90% of the 8 free (7.2), the older slice (y) served first.
    let o = decide(&settings(), &c, &[x.clone(), y.clone()]);
    assert_eq!(g(&o[&y.key], "cpu"), "1");
    assert_eq!(g(&o[&x.key], "cpu"), "6200m");
    assert_eq!(o[&x.key].mode, WorkingMode::Autonomous);
    x.granted = o[&x.key].granted.clone();
    y.granted = o[&y.key].granted.clone();

    // Tethered to x: all 8 free to x, even over y's existing grant; y refused, saying why.
    let o = decide(&tethered_to("x"), &c, &[x.clone(), y.clone()]);
    assert_eq!(g(&o[&x.key], "cpu"), "8");
    // The pod running there takes one of the 100 pods.
    assert_eq!(g(&o[&x.key], "pods"), "99");
    assert_eq!(o[&x.key].mode, WorkingMode::Tethered);
    assert_eq!(o[&y.key].verdict, Verdict::Refused);
    assert!(o[&y.key].granted.is_empty());
    assert_eq!(o[&y.key].mode, WorkingMode::Autonomous);
    assert!(
        o[&y.key].message.contains("tethered to \"x\""),
        "{}",
        o[&y.key].message
    );
    let st = status(&o[&x.key], None, Some(1), Timestamp::now());
    assert_eq!(st.mode, WorkingMode::Tethered);
    x.granted = o[&x.key].granted.clone();

    // Back to autonomous: the existing grant is kept only within 90%.
    let o = decide(&settings(), &c, std::slice::from_ref(&x));
    assert_eq!(g(&o[&x.key], "cpu"), "7200m");
    assert_eq!(o[&x.key].mode, WorkingMode::Autonomous);
    assert_eq!(
        status(&o[&x.key], None, None, Timestamp::now()).mode,
        WorkingMode::Autonomous
    );
}

#[test]
fn tethered_still_honours_the_tenants_caps_and_the_request() {
    let c = cap(&[node("n1", &[("cpu", "10")])], &[]);
    let mut x = slice("x", &[("cpu", "4")]);
    assert_eq!(g(&one(&x, &c), "cpu"), "4");
    let o = decide(&tethered_to("x"), &c, std::slice::from_ref(&x));
    assert_eq!(g(&o[&x.key], "cpu"), "4");
    x.requested = res(&[("cpu", "20")]);
    x.tenant = Some(tenant("x", TenantState::Active, &[("cpu", "9500m")]));
    let o = decide(&tethered_to("x"), &c, std::slice::from_ref(&x));
    assert_eq!(g(&o[&x.key], "cpu"), "9500m");
}
