use fabric_api::offloading::v1alpha1::{HomePod, PodTemplate, ShadowPodSpec, ShadowPodStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::json;

use super::*;
use crate::shadowpod::admission::{self, Verdict};

const NS: &str = "fabric-tenant-alpha";
const USER: &str = "fabric.io:consumer:alpha";
const TTL: Duration = Duration::from_secs(30);

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn spec(cpu: &str) -> ShadowPodSpec {
    ShadowPodSpec {
        cluster_id: "alpha".into(),
        home: HomePod::default(),
        pod: PodTemplate {
            spec: serde_json::from_value(json!({"containers": [
                {"name": "a", "resources": {"requests": {"cpu": cpu}}},
            ]}))
            .unwrap(),
            ..Default::default()
        },
    }
}

fn shadow(name: &str, cpu: &str, phase: Option<&str>) -> ShadowPod {
    let mut s = ShadowPod::new(name, spec(cpu));
    s.metadata.namespace = Some(NS.into());
    s.status = Some(ShadowPodStatus {
        phase: phase.map(Into::into),
        ..Default::default()
    });
    s
}

fn granted() -> Resources {
    [
        ("cpu".to_owned(), Quantity("1".into())),
        ("pods".to_owned(), Quantity("10".into())),
    ]
    .into()
}

/// Admission of a creation of `name` asking for `cpu`, against `status`.
fn create(
    status: &TenantStatus,
    name: &str,
    cpu: &str,
    now: Timestamp,
) -> Result<TenantStatus, Denial> {
    resize(status, name, None, cpu, now)
}

fn resize(
    status: &TenantStatus,
    name: &str,
    old: Option<&str>,
    cpu: &str,
    now: Timestamp,
) -> Result<TenantStatus, Denial> {
    let old = old.map(|cpu| ShadowPod::new(name, spec(cpu)));
    match admission::admit_change(
        USER,
        NS,
        Some("alpha"),
        &spec(cpu),
        old.as_ref(),
        &Defaults::new(),
    )? {
        Verdict::Charge {
            consumer,
            requests,
            more,
        } => charge(
            status,
            &consumer,
            &Ask {
                namespace: NS.into(),
                name: name.into(),
                requests,
                more,
                granted: granted(),
                limit: None,
                bytes: Bytes::default(),
            },
            now,
        ),
        Verdict::Within | Verdict::Unlimited => Ok(status.clone()),
    }
}

fn cpu(s: &TenantStatus) -> Option<&str> {
    s.used.get("cpu").map(|q| q.0.as_str())
}

fn ask(name: &str, cpu: &str) -> Ask {
    match admission::admit_change(USER, NS, Some("alpha"), &spec(cpu), None, &Defaults::new())
        .unwrap()
    {
        Verdict::Charge { requests, more, .. } => Ask {
            namespace: NS.into(),
            name: name.into(),
            requests,
            more,
            granted: granted(),
            limit: Some(3),
            bytes: Bytes::default(),
        },
        v => panic!("{v:?}"),
    }
}

#[test]
fn a_batch_is_charged_in_order_each_against_those_before_it() {
    let asks = [ask("a", "600m"), ask("b", "600m"), ask("c", "400m")];
    let (s, verdicts) = charge_batch(&TenantStatus::default(), "alpha", &asks, t(0));
    // b would go past the grant after a: refused alone; c fits beside a.
    assert!(verdicts[0].is_ok() && verdicts[2].is_ok());
    assert!(matches!(&verdicts[1], Err(Denial::OverQuota { resource, .. }) if resource == "cpu"));
    assert_eq!(cpu(&s), Some("1"));
    assert_eq!(s.used["pods"], Quantity("2".into()));
    let pending: Vec<&str> = s.pending.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(pending, ["a", "c"]);
    // The same as charging them one by one.
    let one = create(&TenantStatus::default(), "a", "600m", t(0)).unwrap();
    assert!(create(&one, "b", "600m", t(0)).is_err());
    assert_eq!(create(&one, "c", "400m", t(0)).unwrap(), s);
}

#[test]
fn a_tenant_has_so_many_shadowpods_at_most_finished_ones_included() {
    // Two counted at the last recount; `ask` allows three in all.
    let counted = TenantStatus {
        shadow_pods: 2,
        ..Default::default()
    };
    let s = charge(&counted, "alpha", &ask("a", "1m"), t(0)).unwrap();
    let e = charge(&s, "alpha", &ask("b", "1m"), t(0)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "consumer \"alpha\" has 3 ShadowPods here, as many as a tenant may have: delete \
         finished ones"
    );
    // A resize is not a new object.
    let resize = Ask {
        limit: None,
        bytes: Bytes::default(),
        ..ask("a", "2m")
    };
    assert!(charge(&s, "alpha", &resize, t(0)).is_ok());
    // The recount counts every listed ShadowPod of the consumer, finished ones too.
    let mut done = ShadowPod::new("done", spec("1m"));
    done.metadata.namespace = Some(NS.into());
    done.status = Some(fabric_api::offloading::v1alpha1::ShadowPodStatus {
        phase: Some("Succeeded".into()),
        ..Default::default()
    });
    let mut live = ShadowPod::new("live", spec("1m"));
    live.metadata.namespace = Some(NS.into());
    let r = recount(
        &TenantStatus::default(),
        "alpha",
        [&done, &live],
        t(0),
        Duration::from_secs(30),
        &Defaults::new(),
    )
    .unwrap();
    assert_eq!((r.shadow_pods, cpu(&r)), (2, Some("1m")));
}

#[test]
fn a_tenants_shadowpods_are_bounded_in_bytes_stored_and_pending() {
    let sized = |name: &str, grown: u64| Ask {
        bytes: Bytes { grown, max: 1000 },
        ..ask(name, "1m")
    };
    // 600 stored at the last recount, 300 admitted since: 100 more fit, 101 do not.
    let stored = TenantStatus {
        shadow_pod_bytes: 600,
        ..Default::default()
    };
    let s = charge(&stored, "alpha", &sized("a", 300), t(0)).unwrap();
    assert_eq!(s.pending[0].bytes, 300);
    assert!(charge(&s, "alpha", &sized("b", 100), t(0)).is_ok());
    let e = charge(&s, "alpha", &sized("b", 101), t(0)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the ShadowPods of consumer \"alpha\" take 900 bytes here; 101 more would pass the \
         1000 a tenant may store"
    );
    // The recount measures what is listed, status aside.
    let listed = [shadow("a", "1m", Some("Running"))];
    let r = recount(&s, "alpha", &listed, t(1), TTL, &Defaults::new()).unwrap();
    assert_eq!(r.shadow_pod_bytes, size(&listed[0]));
    let mut bare = listed[0].clone();
    bare.status = None;
    assert_eq!(
        size(&listed[0]),
        serde_json::to_vec(&bare).unwrap().len() as u64
    );
}

#[test]
fn within_the_grant_is_charged_and_remembered() {
    let s = create(&TenantStatus::default(), "a", "600m", t(0)).unwrap();
    assert_eq!(cpu(&s), Some("600m"));
    assert_eq!(s.used["pods"], Quantity("1".into()));
    assert_eq!(s.pending.len(), 1);
    assert_eq!(s.pending[0].name, "a");
    assert_eq!(s.pending[0].requests["cpu"], Quantity("600m".into()));
}

#[test]
fn two_racing_for_the_last_share_cannot_both_have_it() {
    // Both read the same status; the API server takes one write, the other conflicts
    // and admission runs again on the status the first wrote.
    let read = create(&TenantStatus::default(), "a", "500m", t(0)).unwrap();
    let first = create(&read, "b", "500m", t(1)).unwrap();
    assert!(create(&read, "c", "500m", t(1)).is_ok(), "each alone fits");
    let e = create(&first, "c", "500m", t(1)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "cpu: 500m requested, 1 in use by live ShadowPods, 1 granted to consumer \"alpha\""
    );
}

#[test]
fn resources_not_granted_are_refused() {
    let mut s = spec("100m");
    s.pod.spec = serde_json::from_value(json!({"containers": [
        {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
    ]}))
    .unwrap();
    let Verdict::Charge { requests, more, .. } =
        admission::admit_change(USER, NS, Some("alpha"), &s, None, &Defaults::new()).unwrap()
    else {
        panic!("a creation is charged")
    };
    let ask = Ask {
        namespace: NS.into(),
        name: "g".into(),
        requests,
        more,
        granted: granted(),
        limit: None,
        bytes: Bytes::default(),
    };
    let e = charge(&TenantStatus::default(), "alpha", &ask, t(0)).unwrap_err();
    assert!(
        matches!(e, Denial::OverQuota { ref resource, .. } if resource == "nvidia.com/gpu"),
        "{e}"
    );
}

#[test]
fn a_resize_is_charged_with_what_it_adds() {
    let s = create(&TenantStatus::default(), "a", "600m", t(0)).unwrap();
    let s = resize(&s, "a", Some("600m"), "900m", t(1)).unwrap();
    assert_eq!(cpu(&s), Some("900m"));
    let e = resize(&s, "a", Some("900m"), "1200m", t(2)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "cpu: 300m requested, 900m in use by live ShadowPods, 1 granted to consumer \"alpha\""
    );
    assert_eq!(
        resize(&s, "a", Some("900m"), "100m", t(2)).unwrap(),
        s,
        "a shrink waits for the recount"
    );
}

#[test]
fn the_recount_keeps_admitted_creations_the_listing_does_not_show_yet() {
    let s = create(&TenantStatus::default(), "a", "600m", t(0)).unwrap();
    let r = recount(&s, "alpha", &[], t(5), TTL, &Defaults::new()).unwrap();
    assert_eq!(cpu(&r), Some("600m"), "admitted, not stored yet");
    assert_eq!(r.pending.len(), 1);
    assert_eq!(next_expiry(&r, TTL), Some(t(30)));
    let listed = [shadow("a", "600m", Some("Pending"))];
    let r = recount(&r, "alpha", &listed, t(6), TTL, &Defaults::new()).unwrap();
    assert_eq!(cpu(&r), Some("600m"), "stored: counted from the listing");
    assert!(r.pending.is_empty());
    assert_eq!(next_expiry(&r, TTL), None);
}

#[test]
fn a_charge_whose_creation_failed_counts_for_a_while_only() {
    let s = create(&TenantStatus::default(), "a", "600m", t(0)).unwrap();
    let r = recount(&s, "alpha", &[], t(29), TTL, &Defaults::new()).unwrap();
    assert_eq!(cpu(&r), Some("600m"));
    let r = recount(&s, "alpha", &[], t(30), TTL, &Defaults::new()).unwrap();
    assert_eq!(cpu(&r), None);
    assert!(r.pending.is_empty() && r.used.is_empty());
    // Then the share is there again.
    assert!(create(&r, "b", "1", t(31)).is_ok());
}

#[test]
fn finished_and_deleted_shadowpods_release_their_share() {
    let stale = TenantStatus {
        used: [("cpu".to_owned(), Quantity("2".into()))].into(),
        ..Default::default()
    };
    let listed = [
        shadow("a", "800m", Some("Succeeded")),
        shadow("b", "800m", Some("Failed")),
        shadow("c", "300m", Some("Running")),
        shadow("d", "100m", None),
    ];
    let r = recount(&stale, "alpha", &listed, t(0), TTL, &Defaults::new()).unwrap();
    assert_eq!(cpu(&r), Some("400m"));
    assert_eq!(r.used["pods"], Quantity("2".into()));
    // Other consumers' ShadowPods are theirs.
    let mut other = shadow("e", "5", None);
    other.spec.cluster_id = "beta".into();
    let r = recount(&stale, "alpha", &[other], t(0), TTL, &Defaults::new()).unwrap();
    assert!(r.used.is_empty());
}

#[test]
fn a_resize_not_stored_yet_counts_at_its_new_size() {
    let listed = [shadow("a", "600m", Some("Running"))];
    let s = recount(
        &TenantStatus::default(),
        "alpha",
        &listed,
        t(0),
        TTL,
        &Defaults::new(),
    )
    .unwrap();
    let s = resize(&s, "a", Some("600m"), "900m", t(1)).unwrap();
    let r = recount(&s, "alpha", &listed, t(2), TTL, &Defaults::new()).unwrap();
    assert_eq!(
        cpu(&r),
        Some("900m"),
        "the listing still shows the old size"
    );
    let resized = [shadow("a", "900m", Some("Running"))];
    let r = recount(&r, "alpha", &resized, t(3), TTL, &Defaults::new()).unwrap();
    assert_eq!(cpu(&r), Some("900m"));
    assert!(r.pending.is_empty());
    // A resize that was not stored after all: back to the listed size once it expired.
    let r = recount(&s, "alpha", &listed, t(31), TTL, &Defaults::new()).unwrap();
    assert_eq!(cpu(&r), Some("600m"));
}

#[test]
fn the_recount_keeps_what_others_wrote_in_the_status() {
    let s = TenantStatus {
        user: Some("fabric.io:consumer:alpha".into()),
        ..Default::default()
    };
    let r = recount(
        &s,
        "alpha",
        &[shadow("a", "1", None)],
        t(0),
        TTL,
        &Defaults::new(),
    )
    .unwrap();
    assert_eq!(r.user, s.user);
    assert_eq!(cpu(&r), Some("1"));
}

const SLICES: &str = "authentication.fabric.io/ResourceSlice";

fn slice_ask<'a>(name: &'a str, max: u32) -> ObjectAsk<'a> {
    ObjectAsk {
        user: USER,
        kind: SLICES,
        kind_name: "ResourceSlice",
        namespace: NS,
        name,
        max,
    }
}

fn names(n: usize) -> BTreeSet<String> {
    (0..n).map(|i| format!("x{i}")).collect()
}

fn pending_names(s: &TenantStatus) -> Vec<&str> {
    s.pending_objects.iter().map(|c| c.name.as_str()).collect()
}

#[test]
fn two_racing_for_the_last_object_place_cannot_both_have_it() {
    let listed = names(3);
    let first = charge_object(
        &TenantStatus::default(),
        &slice_ask("a", 4),
        &listed,
        t(0),
        TTL,
    )
    .unwrap();
    assert_eq!(pending_names(&first), ["a"]);
    // The second, on the status the first wrote (as the API server's precondition makes
    // it read), with a listing that does not show the first's object yet: refused.
    let e = charge_object(&first, &slice_ask("b", 4), &listed, t(1), TTL).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "consumer \"alpha\" has 4 ResourceSlices in namespace \"{NS}\", as many as a \
             tenant may have: delete one first"
        )
    );
    // Once the listing shows it, it is counted once, not twice, and its charge goes.
    let mut stored = listed.clone();
    stored.insert("a".into());
    let e = charge_object(&first, &slice_ask("b", 4), &stored, t(2), TTL).unwrap_err();
    assert!(matches!(e, Denial::TooManyObjects { max: 4, .. }), "{e}");
    let next = charge_object(&first, &slice_ask("b", 5), &stored, t(2), TTL).unwrap();
    assert_eq!(pending_names(&next), ["b"]);
}

#[test]
fn an_object_charge_whose_creation_failed_counts_for_a_while_only() {
    let listed = names(3);
    let s = charge_object(
        &TenantStatus::default(),
        &slice_ask("a", 4),
        &listed,
        t(0),
        TTL,
    )
    .unwrap();
    assert!(charge_object(&s, &slice_ask("b", 4), &listed, t(29), TTL).is_err());
    let s = charge_object(&s, &slice_ask("b", 4), &listed, t(30), TTL).unwrap();
    assert_eq!(pending_names(&s), ["b"], "a's charge lapsed and went");
    // The reconciler drops lapsed ones too (no admission may follow), and wakes for them.
    assert_eq!(next_expiry(&s, TTL), Some(t(60)), "when b's charge lapses");
    let r = recount(&s, "alpha", &[], t(59), TTL, &Defaults::new()).unwrap();
    assert_eq!(pending_names(&r), ["b"]);
    let r = recount(&s, "alpha", &[], t(60), TTL, &Defaults::new()).unwrap();
    assert!(r.pending_objects.is_empty());
}

#[test]
fn object_charges_count_within_their_kind_and_namespace_only() {
    let s = charge_object(
        &TenantStatus::default(),
        &slice_ask("a", 1),
        &BTreeSet::new(),
        t(0),
        TTL,
    )
    .unwrap();
    // A PeeringNetwork, and a ResourceSlice elsewhere: their own places, and a's charge
    // (not listed where they look) stays.
    let network = ObjectAsk {
        kind: "networking.fabric.io/PeeringNetwork",
        kind_name: "PeeringNetwork",
        ..slice_ask("n", 1)
    };
    let s = charge_object(&s, &network, &names(0), t(1), TTL).unwrap();
    let elsewhere = ObjectAsk {
        namespace: "fabric-tenant-alpha-2",
        ..slice_ask("a", 1)
    };
    let s = charge_object(&s, &elsewhere, &names(0), t(2), TTL).unwrap();
    assert_eq!(pending_names(&s), ["a", "n", "a"]);
    // Counted against the bound of its own kind and namespace only.
    let e = charge_object(&s, &slice_ask("b", 1), &names(0), t(3), TTL).unwrap_err();
    assert!(
        matches!(&e, Denial::TooManyObjects { kind, namespace, .. }
            if kind == "ResourceSlice" && namespace == NS),
        "{e}"
    );
    assert_eq!(
        s.used,
        Resources::default(),
        "no share of the grant charged"
    );
}
