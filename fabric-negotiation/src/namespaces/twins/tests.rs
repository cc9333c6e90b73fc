use super::*;

const KEY: &str = "fabric-tenant-alpha/alpha";

fn m(home: &str, remote: &str) -> NamespaceMapping {
    NamespaceMapping {
        home: home.to_owned(),
        remote: remote.to_owned(),
        storage_retention: None,
    }
}

fn ours(home: &str) -> Existing {
    Existing {
        twin_of: Some(KEY.to_owned()),
        home: Some(home.to_owned()),
        deleting: false,
        ..Default::default()
    }
}

fn limits() -> Limits {
    Limits::new("fabric-system")
}

fn phase_of<'a>(p: &'a Plan, home: &str) -> &'a TwinStatus {
    p.status.iter().find(|s| s.home == home).unwrap()
}

#[test]
fn a_new_mapping_is_made_and_accepted() {
    let p = plan(
        KEY,
        &[m("shop", "shop-alpha")],
        &[],
        &BTreeMap::new(),
        &limits(),
    );
    assert_eq!(p.create, [m("shop", "shop-alpha")]);
    assert!(p.keep.is_empty() && p.delete.is_empty());
    assert_eq!(phase_of(&p, "shop").phase, MappingPhase::Accepted);
}

#[test]
fn the_providers_own_names_are_reserved() {
    let mut l = limits();
    l.reserved.insert("prod".to_owned());
    for name in [
        "default",
        "kube-system",
        "kube-public",
        "fabric-system",
        "fabric-tenant-beta",
        "fabric-peering-tokens",
        "fabric-identities",
        "prod",
    ] {
        let p = plan(KEY, &[m("x", name)], &[], &BTreeMap::new(), &l);
        assert!(p.create.is_empty(), "{name}");
        let s = phase_of(&p, "x");
        assert_eq!(s.phase, MappingPhase::Refused);
        assert_eq!(s.reason.as_deref(), Some(twin_reason::RESERVED), "{name}");
    }
    assert!(!l.reserved("kubernetes-dashboard-twin"));
}

#[test]
fn a_namespace_that_is_not_this_maps_twin_of_that_home_is_never_adopted() {
    let others = [
        // An admin's.
        Existing {
            twin_of: None,
            home: None,
            deleting: false,
            ..Default::default()
        },
        // Another tenant's twin.
        Existing {
            twin_of: Some("fabric-tenant-beta/beta".to_owned()),
            home: Some("shop".to_owned()),
            deleting: false,
            ..Default::default()
        },
        // This map's, of another home namespace.
        ours("web"),
        // Someone copied the map annotation but not the home.
        Existing {
            twin_of: Some(KEY.to_owned()),
            home: None,
            deleting: false,
            ..Default::default()
        },
    ];
    for e in others {
        let existing = BTreeMap::from([("prod".to_owned(), e.clone())]);
        let p = plan(KEY, &[m("shop", "prod")], &[], &existing, &limits());
        assert!(p.create.is_empty() && p.keep.is_empty(), "{e:?}");
        let s = phase_of(&p, "shop");
        assert_eq!(s.reason.as_deref(), Some(twin_reason::NOT_OURS), "{e:?}");
        // Only a twin this map made (named by both annotations) may go.
        let may_go = e.twin_of.as_deref() == Some(KEY) && e.home.as_deref() == Some("web");
        assert_eq!(
            p.delete,
            if may_go {
                vec!["prod".to_owned()]
            } else {
                vec![]
            }
        );
    }
}

#[test]
fn two_mappings_asking_for_one_twin_are_both_refused() {
    let p = plan(
        KEY,
        &[m("a", "same"), m("b", "same"), m("c", "other")],
        &[],
        &BTreeMap::new(),
        &limits(),
    );
    assert_eq!(p.create, [m("c", "other")]);
    for home in ["a", "b"] {
        assert_eq!(
            phase_of(&p, home).reason.as_deref(),
            Some(twin_reason::DUPLICATE)
        );
    }
}

#[test]
fn past_the_limit_new_twins_are_refused_and_existing_ones_keep_their_place() {
    let l = Limits {
        max_per_tenant: 2,
        ..limits()
    };
    // The existing twin comes last in the spec: it still counts first.
    let existing = BTreeMap::from([("t3".to_owned(), ours("h3"))]);
    let p = plan(
        KEY,
        &[m("h1", "t1"), m("h2", "t2"), m("h3", "t3")],
        &[],
        &existing,
        &l,
    );
    assert_eq!(p.create, [m("h1", "t1")]);
    assert_eq!(p.keep, [m("h3", "t3")]);
    assert_eq!(
        phase_of(&p, "h2").reason.as_deref(),
        Some(twin_reason::TOO_MANY)
    );
    assert_eq!(phase_of(&p, "h3").phase, MappingPhase::Accepted);
}

#[test]
fn a_dropped_mapping_removes_its_twin_and_shows_terminating_until_gone() {
    let existing = BTreeMap::from([
        ("shop-alpha".to_owned(), ours("shop")),
        ("web-alpha".to_owned(), ours("web")),
    ]);
    let p = plan(KEY, &[m("shop", "shop-alpha")], &[], &existing, &limits());
    assert_eq!(p.delete, ["web-alpha"]);
    assert_eq!(p.keep, [m("shop", "shop-alpha")]);
    assert_eq!(phase_of(&p, "web").phase, MappingPhase::Terminating);

    // Being deleted: not deleted again, still shown.
    let mut existing = existing;
    existing.get_mut("web-alpha").unwrap().deleting = true;
    let p = plan(KEY, &[m("shop", "shop-alpha")], &[], &existing, &limits());
    assert!(p.delete.is_empty());
    assert_eq!(phase_of(&p, "web").phase, MappingPhase::Terminating);

    // Gone: the entry goes.
    existing.remove("web-alpha");
    let p = plan(KEY, &[m("shop", "shop-alpha")], &[], &existing, &limits());
    assert!(p.status.iter().all(|s| s.home != "web"));
}

#[test]
fn a_home_moved_to_another_twin_has_one_status_entry_and_its_old_twin_goes() {
    let existing = BTreeMap::from([("old".to_owned(), ours("shop"))]);
    let p = plan(KEY, &[m("shop", "new")], &[], &existing, &limits());
    assert_eq!(p.delete, ["old"]);
    assert_eq!(p.create, [m("shop", "new")]);
    assert_eq!(p.status.iter().filter(|s| s.home == "shop").count(), 1);
}

#[test]
fn twins_of_other_maps_are_never_deleted() {
    let existing = BTreeMap::from([(
        "theirs".to_owned(),
        Existing {
            twin_of: Some("fabric-tenant-beta/beta".to_owned()),
            home: Some("shop".to_owned()),
            deleting: false,
            ..Default::default()
        },
    )]);
    let p = plan(KEY, &[], &[], &existing, &limits());
    assert!(p.delete.is_empty() && p.status.is_empty());
}

#[test]
fn a_map_is_served_only_as_its_consumers_in_its_tenant_namespace_with_a_tenant() {
    assert_eq!(
        not_served("fabric-tenant-alpha", "alpha", "alpha", true),
        None
    );
    assert!(not_served("fabric-tenant-alpha", "beta", "beta", true).is_some());
    assert!(not_served("fabric-tenant-alpha", "other", "alpha", true).is_some());
    assert!(not_served("default", "alpha", "alpha", true).is_some());
    assert!(not_served("fabric-tenant-alpha", "alpha", "alpha", false).is_some());
}

#[test]
fn changes_tell_created_refused_and_removed_once() {
    let acc = |h: &str| TwinStatus {
        home: h.into(),
        remote: format!("{h}-x"),
        phase: MappingPhase::Accepted,
        reason: None,
        message: None,
    };
    let term = |h: &str| TwinStatus {
        phase: MappingPhase::Terminating,
        ..acc(h)
    };
    let refused = |h: &str, r: &str| TwinStatus {
        phase: MappingPhase::Refused,
        reason: Some(r.into()),
        message: Some("why".into()),
        ..acc(h)
    };
    let old = vec![acc("a"), term("b"), refused("c", twin_reason::RESERVED)];
    let new = vec![
        acc("a"),
        refused("c", twin_reason::RESERVED),
        acc("d"),
        refused("e", twin_reason::TOO_MANY),
    ];
    assert_eq!(
        changes(&old, &new),
        [
            Change::Created {
                home: "d".into(),
                remote: "d-x".into()
            },
            Change::Refused {
                home: "e".into(),
                remote: "e-x".into(),
                message: "why".into()
            },
            Change::Removed {
                home: "b".into(),
                remote: "b-x".into()
            },
        ]
    );
    assert!(changes(&new, &new).is_empty());
}

#[test]
fn a_twin_carries_its_consumer_its_map_and_the_tenants_pod_security_level() {
    let ns = namespace(
        "alpha",
        KEY,
        &m("shop", "shop-alpha"),
        PodSecurity::Restricted,
    );
    let labels = ns.metadata.labels.as_ref().unwrap();
    assert_eq!(labels[label::REMOTE_CLUSTER], "alpha");
    assert_eq!(labels[label::TWIN_NAMESPACE], "true");
    assert_eq!(labels["pod-security.kubernetes.io/enforce"], "restricted");
    let e = Existing::of(&ns);
    assert!(e.twin_of(KEY, "shop") && !e.twin_of(KEY, "web"));
}

#[test]
fn the_twins_bindings_name_only_the_twin_role_the_reflection_role_and_the_sharing_role() {
    let subjects = fabric_auth::tenant::role_binding("alpha", "g")
        .subjects
        .unwrap();
    let b = consumer_binding("alpha", "shop-alpha", subjects.clone());
    assert_eq!(b.metadata.namespace.as_deref(), Some("shop-alpha"));
    assert_eq!(b.role_ref.kind, "ClusterRole");
    assert_eq!(b.role_ref.name, TWIN_ROLE);
    assert_eq!(b.subjects.unwrap(), subjects);
    let r = reflection_binding("alpha", "shop-alpha", subjects.clone());
    assert_eq!(r.metadata.name.as_deref(), Some(REFLECTION_ROLE));
    assert_eq!(r.metadata.namespace.as_deref(), Some("shop-alpha"));
    assert_eq!(r.role_ref.kind, "ClusterRole");
    assert_eq!(r.role_ref.name, REFLECTION_ROLE);
    assert_eq!(r.subjects.unwrap(), subjects);
    let s = sharing_binding("alpha", "shop-alpha", "fabric-system");
    assert_eq!(s.role_ref.name, fabric_auth::tenant::SHARING_ROLE);
    assert_eq!(s.subjects.unwrap()[0].name, "fabric-sharing");
}

fn claim(name: &str) -> Claim {
    Claim {
        name: name.to_owned(),
        uid: format!("uid-{name}"),
        size: Some("1Gi".to_owned()),
        class: Some("standard".to_owned()),
        deleting: false,
    }
}

fn holding(home: &str, retention: StorageRetention, claims: &[&str]) -> Existing {
    Existing {
        retention,
        claims: claims.iter().map(|c| claim(c)).collect(),
        ..ours(home)
    }
}

#[test]
fn only_twins_no_mapping_asks_for_have_their_claims_looked_at() {
    let existing = BTreeMap::from([
        ("shop-alpha".to_owned(), ours("shop")),
        ("old".to_owned(), ours("web")),
        ("moved".to_owned(), ours("db")),
        ("theirs".to_owned(), Existing::default()),
    ]);
    let mappings = [m("shop", "shop-alpha"), m("db", "db-alpha"), m("web", "x")];
    assert_eq!(given_up(KEY, &mappings, &existing), ["moved", "old"]);
}

#[test]
fn a_twin_given_up_under_retain_stays_for_the_fabrics_claims() {
    let existing = BTreeMap::from([(
        "shop-alpha".to_owned(),
        holding("shop", StorageRetention::Retain, &["data"]),
    )]);
    let p = plan(KEY, &[], &[], &existing, &limits());
    assert!(p.delete.is_empty(), "{p:?}");
    assert_eq!(p.retain, ["shop-alpha"]);
    assert_eq!(p.retained.len(), 1);
    let r = &p.retained[0];
    assert_eq!(
        (r.namespace.as_str(), r.home.as_str(), r.name.as_str()),
        ("shop-alpha", "shop", "data")
    );
    assert_eq!(r.size.as_deref(), Some("1Gi"));
    assert_eq!(r.class.as_deref(), Some("standard"));
    // Not listed: the consumer's unoffloading is over there.
    assert!(p.status.is_empty(), "{:?}", p.status);
    assert!(p.forget.is_empty());
}

#[test]
fn a_twin_given_up_goes_under_delete_or_without_claims() {
    for e in [
        holding("shop", StorageRetention::Delete, &["data"]),
        holding("shop", StorageRetention::Retain, &[]),
    ] {
        let existing = BTreeMap::from([("shop-alpha".to_owned(), e.clone())]);
        let p = plan(KEY, &[], &[], &existing, &limits());
        assert_eq!(p.delete, ["shop-alpha"], "{e:?}");
        assert!(p.retain.is_empty() && p.retained.is_empty(), "{e:?}");
        assert_eq!(phase_of(&p, "shop").phase, MappingPhase::Terminating);
    }
}

#[test]
fn a_retained_twin_asked_for_again_is_the_consumers_again() {
    let existing = BTreeMap::from([(
        "shop-alpha".to_owned(),
        holding("shop", StorageRetention::Retain, &["data"]),
    )]);
    let p = plan(KEY, &[m("shop", "shop-alpha")], &[], &existing, &limits());
    assert_eq!(p.keep, [m("shop", "shop-alpha")]);
    assert!(p.retain.is_empty() && p.retained.is_empty() && p.delete.is_empty());
    assert_eq!(phase_of(&p, "shop").phase, MappingPhase::Accepted);
}

#[test]
fn forget_gives_up_retained_claims_only() {
    let existing = BTreeMap::from([
        (
            "shop-alpha".to_owned(),
            holding("shop", StorageRetention::Retain, &["data", "logs"]),
        ),
        (
            "web-alpha".to_owned(),
            holding("web", StorageRetention::Retain, &["live"]),
        ),
    ]);
    let r = |ns: &str, name: &str| ClaimRef {
        namespace: ns.to_owned(),
        name: name.to_owned(),
        uid: format!("uid-{name}"),
    };
    // web is still offloaded: its claims are the consumer's to delete, not forgotten here.
    let forget = [r("shop-alpha", "data"), r("web-alpha", "live")];
    let p = plan(KEY, &[m("web", "web-alpha")], &forget, &existing, &limits());
    assert_eq!(p.forget, [r("shop-alpha", "data")]);
    assert_eq!(p.retain, ["shop-alpha"]);
}
