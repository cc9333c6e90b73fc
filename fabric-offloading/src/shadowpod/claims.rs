//! A tenant's claims charged against the storage it was granted (issue 21): pure; the I/O in
//! [`super::webhook`].
//!
//! The provider lends StorageClasses by amount (resources `storage.fabric.io/CLASS` in the
//! ResourceSlices' grants, [`fabric_api::offloading::lent`]). What a tenant has claimed of a
//! class is the sum of the sizes (`spec.resources.requests.storage`) of its claims of that
//! class across its namespaces, as a fresh listing shows them, plus the claims admitted lately
//! that the listing does not show yet (kept on its Tenant, `status.claims`, each counted until
//! the listing shows it with the size it was charged for, or `ttl` has passed: its creation
//! failed further down). A creation, or an expansion, that takes the tenant past its grant of
//! the class is refused, naming the claim, the class, the size asked and what is left. The
//! status to write carries the new charge; the webhook writes it with the Tenant's
//! resourceVersion as precondition, so that two replicas cannot both take the last share.
//! Deleted claims release their share on their own: the listing no longer shows them.
use std::{collections::BTreeMap, time::Duration};

use fabric_api::{
    authentication::v1alpha1::{Charge, Resources, TenantStatus},
    offloading::lent,
    quantity::{Amounts, amounts, milli, quantity},
};
use k8s_openapi::{
    api::core::v1::PersistentVolumeClaim, apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp,
};
use kube::ResourceExt;

use super::admission::{Denial, OverStorage};

/// A claim as the charge counts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub namespace: String,
    pub name: String,
    pub class: String,
    /// Its size, in thousandths of a byte.
    pub size: i128,
}

impl Claim {
    /// From a claim as admission or a listing sees it; why it cannot be charged otherwise
    /// (the field and the rule).
    pub fn of(pvc: &PersistentVolumeClaim, namespace: &str) -> Result<Self, Denial> {
        let spec = pvc.spec.as_ref();
        let class = spec
            .and_then(|s| s.storage_class_name.as_deref())
            .filter(|c| !c.is_empty())
            .ok_or_else(|| {
                Denial::Claim(
                    "spec.storageClassName: a consumer's claim names the StorageClass it takes (this provider does not lend a default one)"
                        .to_owned(),
                )
            })?;
        let size = spec
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .ok_or_else(|| {
                Denial::Claim(
                    "spec.resources.requests.storage: a consumer's claim says its size".to_owned(),
                )
            })?;
        let size = milli(&size.0)
            .map_err(|e| Denial::Claim(format!("spec.resources.requests.storage: {e}")))?;
        Ok(Self {
            namespace: namespace.to_owned(),
            name: pvc.name_any(),
            class: class.to_owned(),
            size: size.max(0),
        })
    }

    fn key(&self) -> (&str, &str) {
        (&self.namespace, &self.name)
    }
}

fn expired(c: &Charge, now: Timestamp, ttl: Duration) -> bool {
    let age = now.duration_since(c.at.0);
    // A charge stamped by a clock ahead of this one's is not old.
    !age.is_negative() && age.unsigned_abs() >= ttl
}

/// Whether charge `c` is counted by `listed` already: its claim is listed with the size (and
/// class) it was charged for. A charge whose quantities do not parse was not written by this
/// webhook: None.
fn visible(c: &Charge, listed: &[Claim]) -> Option<bool> {
    let asked = amounts(&c.requests).ok()?;
    Some(listed.iter().any(|l| {
        l.key() == (c.namespace.as_str(), c.name.as_str())
            && asked == Amounts::from([(lent::resource(&l.class), l.size)])
    }))
}

/// The charges of `claims` (a Tenant's `status.claims`) still to count, given `listed`, a
/// fresh listing of the tenant's claims: those neither lapsed nor listed. A claim listed once
/// is counted by the listing from then on, and released by it when deleted: its charge must
/// not outlive it (else a claim deleted soon after its creation would hold its share until
/// the charge lapses). The usage reconciler writes this, as a charge does.
pub fn settle(claims: &[Charge], listed: &[Claim], now: Timestamp, ttl: Duration) -> Vec<Charge> {
    claims
        .iter()
        .filter(|c| !expired(c, now, ttl) && visible(c, listed) == Some(false))
        .cloned()
        .collect()
}

/// The status once claim `namespace/name` is being deleted (its deletion admitted: it was
/// stored, and goes): its pending charges dropped, as a listing would no longer count it.
/// None when it has none (nothing to write).
pub fn release(status: &TenantStatus, namespace: &str, name: &str) -> Option<TenantStatus> {
    let claims: Vec<Charge> = status
        .claims
        .iter()
        .filter(|c| (c.namespace.as_str(), c.name.as_str()) != (namespace, name))
        .cloned()
        .collect();
    (claims.len() != status.claims.len()).then(|| TenantStatus {
        claims,
        ..status.clone()
    })
}

/// Charges `ask` (a claim of `consumer` created, or grown from `old` bytes) against what was
/// `granted`, given the Tenant's `status` as last read and `listed`, a fresh listing of the
/// tenant's claims: the status to write (the charges still counting and this one), or why
/// it goes past the grant.
pub fn charge(
    status: &TenantStatus,
    consumer: &str,
    ask: &Claim,
    listed: &[Claim],
    granted: &Resources,
    now: Timestamp,
    ttl: Duration,
) -> Result<TenantStatus, Denial> {
    let resource = lent::resource(&ask.class);
    // Per claim of the class: its size as listed, or as charged while the listing lags.
    let mut claimed: BTreeMap<(String, String), i128> = listed
        .iter()
        .filter(|c| c.class == ask.class)
        .map(|c| ((c.namespace.clone(), c.name.clone()), c.size))
        .collect();
    let mut kept = Vec::new();
    for c in &status.claims {
        if expired(c, now, ttl) {
            continue;
        }
        // A charge whose quantities do not parse was not written by this webhook.
        let Ok(asked) = amounts(&c.requests) else {
            continue;
        };
        if visible(c, listed) == Some(true) {
            continue;
        }
        if let Some(v) = asked.get(&resource) {
            let slot = claimed
                .entry((c.namespace.clone(), c.name.clone()))
                .or_default();
            *slot = (*slot).max(*v);
        }
        kept.push(c.clone());
    }
    // The claim asked for stands in its own place (an expansion replaces its old size).
    claimed.remove(&(ask.namespace.clone(), ask.name.clone()));
    kept.retain(|c| (c.namespace.as_str(), c.name.as_str()) != ask.key());
    let in_use: i128 = claimed.values().sum();
    let Some(limit) = granted.get(&resource) else {
        let classes: Vec<&str> = granted.keys().filter_map(|r| lent::class_of(r)).collect();
        return Err(Denial::NotGranted {
            cluster: consumer.to_owned(),
            claim: format!("{}/{}", ask.namespace, ask.name),
            class: ask.class.clone(),
            granted: if classes.is_empty() {
                "none".to_owned()
            } else {
                classes.join(", ")
            },
        });
    };
    let limit = milli(&limit.0)?;
    if in_use + ask.size > limit {
        let shown = |v: i128| quantity(&resource, v).0;
        return Err(Denial::OverStorage(Box::new(OverStorage {
            cluster: consumer.to_owned(),
            claim: format!("{}/{}", ask.namespace, ask.name),
            class: ask.class.clone(),
            asked: shown(ask.size),
            claimed: shown(in_use),
            granted: shown(limit),
            left: shown((limit - in_use).max(0)),
        })));
    }
    kept.push(Charge {
        namespace: ask.namespace.clone(),
        name: ask.name.clone(),
        at: Time(now),
        requests: Resources::from([(resource.clone(), quantity(&resource, ask.size))]),
        bytes: 0,
    });
    Ok(TenantStatus {
        claims: kept,
        ..status.clone()
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use serde_json::json;

    use super::*;

    const TTL: Duration = Duration::from_secs(30);
    const GI: i128 = 1000 << 30;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn claim(ns: &str, name: &str, class: &str, gi: i128) -> Claim {
        Claim {
            namespace: ns.into(),
            name: name.into(),
            class: class.into(),
            size: gi * GI,
        }
    }

    fn granted(items: &[(&str, &str)]) -> Resources {
        items
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
            .collect()
    }

    fn grant() -> Resources {
        granted(&[
            ("cpu", "2"),
            ("storage.fabric.io/standard", "10Gi"),
            ("storage.fabric.io/fast", "1Gi"),
        ])
    }

    #[test]
    fn claims_across_the_tenant_s_namespaces_add_up_to_the_grant_of_their_class() {
        let listed = [
            claim("twin-a", "a", "standard", 4),
            claim("twin-b", "b", "standard", 4),
            // Another class counts against its own grant only.
            claim("twin-b", "f", "fast", 1),
        ];
        let st = TenantStatus::default();
        // 2Gi is left of standard: exactly that fits ...
        let ok = charge(
            &st,
            "alpha",
            &claim("twin-a", "c", "standard", 2),
            &listed,
            &grant(),
            t(0),
            TTL,
        )
        .unwrap();
        assert_eq!(ok.claims.len(), 1);
        assert_eq!(
            ok.claims[0].requests,
            granted(&[("storage.fabric.io/standard", "2Gi")])
        );
        // ... a byte more does not, and the refusal says the class, the size and what is left.
        let mut big = claim("twin-a", "c", "standard", 2);
        big.size += 1000;
        let e = charge(&st, "alpha", &big, &listed, &grant(), t(0), TTL).unwrap_err();
        assert!(matches!(e, Denial::OverStorage(_)));
        let e = charge(
            &st,
            "alpha",
            &claim("twin-a", "c", "standard", 3),
            &listed,
            &grant(),
            t(0),
            TTL,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "claim twin-a/c: 3Gi of StorageClass standard asked; consumer \"alpha\" was granted 10Gi of it, 8Gi is claimed, 2Gi is left"
        );
        // A class not granted at all: said so, with those that are.
        let e = charge(
            &st,
            "alpha",
            &claim("twin-a", "c", "gold", 1),
            &listed,
            &grant(),
            t(0),
            TTL,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "claim twin-a/c: this provider does not lend StorageClass gold to consumer \"alpha\" (granted: fast, standard)"
        );
    }

    #[test]
    fn a_charge_not_listed_yet_counts_until_it_is_or_lapses() {
        let st = charge(
            &TenantStatus::default(),
            "alpha",
            &claim("twin-a", "a", "standard", 6),
            &[],
            &grant(),
            t(0),
            TTL,
        )
        .unwrap();
        // A second replica, before the listing shows the first claim: it sees the charge.
        let second = claim("twin-b", "b", "standard", 6);
        let e = charge(&st, "alpha", &second, &[], &grant(), t(1), TTL).unwrap_err();
        assert!(e.to_string().contains("6Gi is claimed, 4Gi is left"), "{e}");
        // Listed: the charge is dropped, the listing counts it (once).
        let listed = [claim("twin-a", "a", "standard", 6)];
        let e = charge(&st, "alpha", &second, &listed, &grant(), t(1), TTL).unwrap_err();
        assert!(e.to_string().contains("6Gi is claimed"), "{e}");
        let st2 = charge(
            &st,
            "alpha",
            &claim("twin-b", "b", "standard", 4),
            &listed,
            &grant(),
            t(1),
            TTL,
        )
        .unwrap();
        assert_eq!(st2.claims.len(), 1, "the listed one's charge is gone");
        assert_eq!(st2.claims[0].name, "b");
        // Its creation failed: after the ttl it no longer counts.
        let ok = charge(&st, "alpha", &second, &[], &grant(), t(30), TTL).unwrap();
        assert_eq!(ok.claims.len(), 1);
        assert_eq!(ok.claims[0].name, "b");
        // Deleted claims release their share: the listing no longer shows them.
        assert!(charge(&st2, "alpha", &second, &[], &grant(), t(40), TTL).is_ok());
    }

    #[test]
    fn a_claim_deleted_before_any_listing_showed_it_releases_its_charge() {
        let st = charge(
            &TenantStatus::default(),
            "alpha",
            &claim("twin-a", "a", "standard", 6),
            &[],
            &grant(),
            t(0),
            TTL,
        )
        .unwrap();
        let st = charge(
            &st,
            "alpha",
            &claim("twin-a", "b", "standard", 1),
            &[],
            &grant(),
            t(0),
            TTL,
        )
        .unwrap();
        let released = release(&st, "twin-a", "a").expect("a's charge dropped");
        assert_eq!(released.claims.len(), 1);
        assert_eq!(released.claims[0].name, "b");
        assert!(
            release(&released, "twin-a", "a").is_none(),
            "nothing left to drop"
        );
        assert!(release(&st, "twin-b", "a").is_none(), "another namespace's");
        // Its 6Gi free at once, not after the ttl.
        let next = charge(
            &released,
            "alpha",
            &claim("twin-b", "c", "standard", 9),
            &[],
            &grant(),
            t(1),
            TTL,
        );
        assert!(next.is_ok(), "{next:?}");
    }

    #[test]
    fn a_charge_settles_once_its_claim_is_listed_so_a_deletion_frees_its_share_at_once() {
        let st = charge(
            &TenantStatus::default(),
            "alpha",
            &claim("twin-a", "a", "standard", 6),
            &[],
            &grant(),
            t(0),
            TTL,
        )
        .unwrap();
        // Not listed yet (its creation goes on): it still counts.
        assert_eq!(settle(&st.claims, &[], t(1), TTL), st.claims);
        // Listed with the size charged: the listing counts it from now on.
        let listed = [claim("twin-a", "a", "standard", 6)];
        assert!(settle(&st.claims, &listed, t(1), TTL).is_empty());
        // Listed at another size (an expansion charged, not stored yet): still pending.
        let smaller = [claim("twin-a", "a", "standard", 2)];
        assert_eq!(settle(&st.claims, &smaller, t(1), TTL), st.claims);
        // Never listed (its creation failed): it lapses.
        assert!(settle(&st.claims, &[], t(30), TTL).is_empty());
        // Settled, then the claim deleted well within the ttl: the whole grant is free again.
        let settled = TenantStatus {
            claims: settle(&st.claims, &listed, t(1), TTL),
            ..st.clone()
        };
        let all = charge(
            &settled,
            "alpha",
            &claim("twin-b", "b", "standard", 10),
            &[],
            &grant(),
            t(2),
            TTL,
        );
        assert!(all.is_ok(), "{all:?}");
        // Without settling, the deleted claim's charge holds 6Gi until it lapses.
        let held = charge(
            &st,
            "alpha",
            &claim("twin-b", "b", "standard", 10),
            &[],
            &grant(),
            t(2),
            TTL,
        );
        assert!(held.is_err());
        // A charge whose quantities do not parse was not this webhook's: dropped.
        let mut odd = st.claims.clone();
        odd[0].requests = Resources::from([(
            "storage.fabric.io/standard".to_owned(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("lots".into()),
        )]);
        assert!(settle(&odd, &[], t(1), TTL).is_empty());
    }

    #[test]
    fn an_expansion_is_charged_its_new_size_in_place_of_the_old() {
        let listed = [
            claim("twin-a", "a", "standard", 4),
            claim("twin-a", "b", "standard", 4),
        ];
        let st = TenantStatus::default();
        // a: 4Gi -> 6Gi fits (4 + 6 = 10) ...
        assert!(
            charge(
                &st,
                "alpha",
                &claim("twin-a", "a", "standard", 6),
                &listed,
                &grant(),
                t(0),
                TTL
            )
            .is_ok()
        );
        // ... 7Gi does not.
        let e = charge(
            &st,
            "alpha",
            &claim("twin-a", "a", "standard", 7),
            &listed,
            &grant(),
            t(0),
            TTL,
        )
        .unwrap_err();
        assert!(e.to_string().contains("4Gi is claimed, 6Gi is left"), "{e}");
    }

    #[test]
    fn a_claim_is_read_from_its_spec_or_refused_naming_the_field() {
        let pvc = |spec: serde_json::Value| -> PersistentVolumeClaim {
            serde_json::from_value(json!({"metadata": {"name": "data"}, "spec": spec})).unwrap()
        };
        let c = Claim::of(
            &pvc(json!({"storageClassName": "fast",
                        "resources": {"requests": {"storage": "1Gi"}}})),
            "twin",
        )
        .unwrap();
        assert_eq!(c, claim("twin", "data", "fast", 1));
        let e = Claim::of(
            &pvc(json!({"resources": {"requests": {"storage": "1Gi"}}})),
            "t",
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("spec.storageClassName:"), "{e}");
        let e = Claim::of(&pvc(json!({"storageClassName": "fast"})), "t").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("spec.resources.requests.storage:"),
            "{e}"
        );
    }
}
