//! What becomes of a twin's claims when the twin would go, decided without I/O (issue 21):
//! under [`StorageRetention::Retain`] (the default, and what a twin without the mark gets) a
//! twin that still holds claims the fabric made is kept for them, under `Delete` it goes with
//! everything in it. Only the fabric's claims (the reflector's ownership marks, naming the
//! twin's consumer) hold a twin: a claim the provider's admin put there does not.
use fabric_api::{
    names::{annotation, label},
    offloading::v1alpha1::{ClaimRef, NamespaceMapping, RetainedClaim, StorageRetention},
};
use fabric_kube::status::Verdict;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim};
use kube::ResourceExt;

fabric_kube::reasons! {
    /// Why a consumer's ForeignCluster says what its provider keeps.
    pub enum Retained {
        Retained = "VolumesRetained",
        None = "NoneRetained",
    }
}

/// The retention twin `ns` was made with ([`annotation::STORAGE_RETENTION`]). Absent (a twin
/// made before the mark existed) or a value that is not `Delete`: `Retain`, so that no mark
/// lost or mangled ever deletes data.
pub fn retention_of(ns: &Namespace) -> StorageRetention {
    match ns
        .annotations()
        .get(annotation::STORAGE_RETENTION)
        .map(String::as_str)
    {
        Some("Delete") => StorageRetention::Delete,
        _ => StorageRetention::Retain,
    }
}

/// The value of [`annotation::STORAGE_RETENTION`] for `r`.
pub fn mark(r: StorageRetention) -> &'static str {
    match r {
        StorageRetention::Retain => "Retain",
        StorageRetention::Delete => "Delete",
    }
}

/// Whether `pvc` is a claim the fabric made for `consumer` (the consumer's virtual kubelet
/// reflected it): both ownership marks, the origin its consumer's.
pub fn fabric_made(pvc: &PersistentVolumeClaim, consumer: &str) -> bool {
    let labels = pvc.labels();
    labels.get(label::REFLECTED_FROM).map(String::as_str) == Some(consumer)
        && labels
            .get(label::REFLECTED_TO)
            .is_some_and(|to| !to.is_empty())
}

/// A claim of the fabric's in a twin, as the decision needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub name: String,
    pub uid: String,
    pub size: Option<String>,
    pub class: Option<String>,
    pub deleting: bool,
}

impl Claim {
    pub fn of(pvc: &PersistentVolumeClaim) -> Self {
        let spec = pvc.spec.as_ref();
        Self {
            name: pvc.name_any(),
            uid: pvc.uid().unwrap_or_default(),
            size: spec
                .and_then(|s| s.resources.as_ref())
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("storage"))
                .map(|q| q.0.clone()),
            class: spec.and_then(|s| s.storage_class_name.clone()),
            deleting: pvc.metadata.deletion_timestamp.is_some(),
        }
    }
}

/// The fate of a twin that is no longer asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    /// It goes with everything in it.
    Delete,
    /// It stays for its claims (those not being deleted are `claims`; a twin whose claims are
    /// all being deleted stays until they are gone, then goes).
    Retain { claims: Vec<RetainedClaim> },
}

/// What becomes of twin `twin` (of home namespace `home`), made with `retention`, holding
/// `claims` of the fabric's.
pub fn fate(twin: &str, home: &str, retention: StorageRetention, claims: &[Claim]) -> Fate {
    if retention == StorageRetention::Delete || claims.is_empty() {
        return Fate::Delete;
    }
    let mut kept: Vec<RetainedClaim> = claims
        .iter()
        .filter(|c| !c.deleting)
        .map(|c| RetainedClaim {
            namespace: twin.to_owned(),
            home: home.to_owned(),
            name: c.name.clone(),
            uid: c.uid.clone(),
            size: c.size.clone(),
            class: c.class.clone(),
        })
        .collect();
    kept.sort();
    Fate::Retain { claims: kept }
}

/// The retained claims `forget` names, by namespace, name and UID alike (an entry for a claim
/// made since under that name, or for anything not retained, names nothing).
pub fn forgotten(retained: &[RetainedClaim], forget: &[ClaimRef]) -> Vec<ClaimRef> {
    retained
        .iter()
        .map(|c| ClaimRef {
            namespace: c.namespace.clone(),
            name: c.name.clone(),
            uid: c.uid.clone(),
        })
        .filter(|r| forget.contains(r))
        .collect()
}

/// What the provider keeps of `consumer` once their peering ends: the claims it retains
/// already, and the fabric's claims in each twin still mapped (`claims`, by twin name), under
/// that mapping's retention: the Tenant's removal gives those twins up as an unoffload does.
/// Nobody at home can see or forget them afterwards (no identity is left), which is why
/// `fabricctl unpeer` says so first. Sorted, each claim once.
pub fn kept_after_unpeer(
    consumer: &str,
    retained: &[RetainedClaim],
    mappings: &[NamespaceMapping],
    claims: &[(String, Vec<PersistentVolumeClaim>)],
) -> Vec<RetainedClaim> {
    let mut kept = retained.to_vec();
    for m in mappings {
        let fabric: Vec<Claim> = claims
            .iter()
            .filter(|(twin, _)| *twin == m.remote)
            .flat_map(|(_, pvcs)| pvcs)
            .filter(|pvc| fabric_made(pvc, consumer))
            .map(Claim::of)
            .collect();
        let retention = m.storage_retention.unwrap_or(StorageRetention::Retain);
        if let Fate::Retain { claims } = fate(&m.remote, &m.home, retention, &fabric) {
            kept.extend(claims);
        }
    }
    kept.sort();
    kept.dedup_by(|a, b| a.namespace == b.namespace && a.name == b.name);
    kept
}

/// One line per retained claim: `namespace/name (size, class)`, as the ForeignCluster's
/// condition, the Events and `fabricctl info peer` say it.
pub fn describe(c: &RetainedClaim) -> String {
    format!(
        "{}/{} ({}, {})",
        c.namespace,
        c.name,
        c.size.as_deref().unwrap_or("size unknown"),
        c.class.as_deref().unwrap_or("the provider's default class"),
    )
}

/// The consumer's `RetainedVolumes` condition from what its provider's map reports: True,
/// naming each claim, while it keeps any.
pub fn verdict(retained: &[RetainedClaim]) -> Verdict<Retained> {
    if retained.is_empty() {
        return Verdict::not(
            Retained::None,
            "the provider keeps no claim of this cluster's",
        );
    }
    let listed: Vec<String> = retained.iter().map(describe).collect();
    Verdict::ok(
        Retained::Retained,
        format!(
            "kept after their namespaces were unoffloaded (storageRetention Retain), no longer reachable from here: {}; `fabricctl forget volumes --peer <id>` deletes them",
            listed.join(", ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn claim(name: &str, deleting: bool) -> Claim {
        Claim {
            name: name.into(),
            uid: format!("uid-{name}"),
            size: Some("1Gi".into()),
            class: Some("standard".into()),
            deleting,
        }
    }

    fn ns(mark: Option<&str>) -> Namespace {
        let mut n = Namespace::default();
        if let Some(m) = mark {
            n.metadata.annotations = Some(BTreeMap::from([(
                annotation::STORAGE_RETENTION.to_owned(),
                m.to_owned(),
            )]));
        }
        n
    }

    #[test]
    fn the_mark_says_delete_only_when_it_says_so() {
        assert_eq!(retention_of(&ns(Some("Delete"))), StorageRetention::Delete);
        assert_eq!(retention_of(&ns(Some("Retain"))), StorageRetention::Retain);
        assert_eq!(retention_of(&ns(None)), StorageRetention::Retain);
        assert_eq!(retention_of(&ns(Some("delete"))), StorageRetention::Retain);
        assert_eq!(retention_of(&ns(Some(""))), StorageRetention::Retain);
        for r in [StorageRetention::Retain, StorageRetention::Delete] {
            assert_eq!(retention_of(&ns(Some(mark(r)))), r);
        }
    }

    #[test]
    fn only_the_consumer_s_reflected_claims_are_the_fabric_s() {
        let pvc = |labels: &[(&str, &str)]| {
            let mut p = PersistentVolumeClaim::default();
            p.metadata.labels = Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            );
            p
        };
        let both = [(label::REFLECTED_FROM, "c"), (label::REFLECTED_TO, "p")];
        assert!(fabric_made(&pvc(&both), "c"));
        assert!(!fabric_made(&pvc(&both), "other"), "another consumer's");
        assert!(!fabric_made(&pvc(&[(label::REFLECTED_FROM, "c")]), "c"));
        assert!(!fabric_made(
            &pvc(&[(label::REFLECTED_FROM, "c"), (label::REFLECTED_TO, "")]),
            "c"
        ));
        assert!(
            !fabric_made(&pvc(&[("owner", "admin")]), "c"),
            "the admin's"
        );
    }

    #[test]
    fn retain_keeps_a_twin_holding_claims() {
        let Fate::Retain { claims } = fate(
            "shop-c",
            "shop",
            StorageRetention::Retain,
            &[claim("b", false), claim("a", false)],
        ) else {
            panic!("kept");
        };
        assert_eq!(
            claims.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(claims[0].namespace, "shop-c");
        assert_eq!(claims[0].home, "shop");
        assert_eq!(claims[0].uid, "uid-a");
        assert_eq!(describe(&claims[0]), "shop-c/a (1Gi, standard)");
    }

    #[test]
    fn the_condition_names_every_retained_claim() {
        let Fate::Retain { claims } = fate(
            "shop-c",
            "shop",
            StorageRetention::Retain,
            &[claim("a", false), claim("b", false)],
        ) else {
            panic!("kept");
        };
        let v = verdict(&claims);
        assert!(v.ok);
        assert_eq!(v.reason, Retained::Retained);
        assert!(
            v.message
                .contains("shop-c/a (1Gi, standard), shop-c/b (1Gi, standard)"),
            "{}",
            v.message
        );
        let none = verdict(&[]);
        assert!(!none.ok);
        assert_eq!(none.reason, Retained::None);
    }

    #[test]
    fn retain_without_claims_and_delete_remove_the_twin() {
        assert_eq!(
            fate("t", "h", StorageRetention::Retain, &[]),
            Fate::Delete,
            "nothing to keep"
        );
        assert_eq!(
            fate("t", "h", StorageRetention::Delete, &[claim("a", false)]),
            Fate::Delete,
            "Delete is explicit"
        );
    }

    #[test]
    fn claims_being_deleted_hold_the_twin_but_are_not_reported() {
        assert_eq!(
            fate("t", "h", StorageRetention::Retain, &[claim("a", true)]),
            Fate::Retain { claims: vec![] }
        );
    }

    #[test]
    fn forget_names_a_retained_claim_by_its_uid() {
        let Fate::Retain { claims } = fate(
            "t",
            "h",
            StorageRetention::Retain,
            &[claim("a", false), claim("b", false)],
        ) else {
            panic!("kept");
        };
        let r = |ns: &str, name: &str, uid: &str| ClaimRef {
            namespace: ns.into(),
            name: name.into(),
            uid: uid.into(),
        };
        assert_eq!(
            forgotten(&claims, &[r("t", "a", "uid-a")]),
            [r("t", "a", "uid-a")]
        );
        assert!(
            forgotten(&claims, &[r("t", "a", "another")]).is_empty(),
            "a claim made since"
        );
        assert!(
            forgotten(&claims, &[r("other", "a", "uid-a")]).is_empty(),
            "not retained here"
        );
        assert!(forgotten(&claims, &[]).is_empty());
    }

    #[test]
    fn an_unpeer_keeps_what_is_retained_and_the_fabric_s_claims_of_retained_twins() {
        let pvc = |name: &str, from: &str| {
            let mut p = PersistentVolumeClaim::default();
            p.metadata.name = Some(name.into());
            p.metadata.uid = Some(format!("uid-{name}"));
            p.metadata.labels = Some(BTreeMap::from([
                (label::REFLECTED_FROM.to_owned(), from.to_owned()),
                (label::REFLECTED_TO.to_owned(), "p".to_owned()),
            ]));
            p
        };
        let mapping = |home: &str, r: Option<StorageRetention>| NamespaceMapping {
            home: home.into(),
            remote: format!("{home}-c"),
            storage_retention: r,
        };
        let earlier = RetainedClaim {
            namespace: "old-c".into(),
            home: "old".into(),
            name: "logs".into(),
            uid: "uid-logs".into(),
            size: None,
            class: None,
        };
        let mut admin_s = pvc("admin", "c");
        admin_s.metadata.labels = None;
        let kept = kept_after_unpeer(
            "c",
            std::slice::from_ref(&earlier),
            &[
                mapping("shop", None),
                mapping("cache", Some(StorageRetention::Delete)),
                mapping("db", Some(StorageRetention::Retain)),
            ],
            &[
                (
                    "shop-c".into(),
                    vec![pvc("data", "c"), admin_s, pvc("x", "other")],
                ),
                ("cache-c".into(), vec![pvc("tmp", "c")]),
                ("db-c".into(), vec![pvc("wal", "c")]),
                // A twin no longer mapped is the provider's to report (in `retained`).
                ("gone-c".into(), vec![pvc("y", "c")]),
            ],
        );
        let names: Vec<String> = kept
            .iter()
            .map(|c| format!("{}/{} of {}", c.namespace, c.name, c.home))
            .collect();
        assert_eq!(
            names,
            ["db-c/wal of db", "old-c/logs of old", "shop-c/data of shop"],
            "the default is Retain; Delete twins, the admin's and other consumers' claims go"
        );
        assert!(kept_after_unpeer("c", &[], &[mapping("shop", None)], &[]).is_empty());
        let twice = kept_after_unpeer(
            "c",
            &[RetainedClaim {
                namespace: "shop-c".into(),
                home: "shop".into(),
                name: "data".into(),
                uid: "uid-data".into(),
                size: None,
                class: None,
            }],
            &[mapping("shop", None)],
            &[("shop-c".into(), vec![pvc("data", "c")])],
        );
        assert_eq!(twice.len(), 1, "{twice:?}");
    }
}
