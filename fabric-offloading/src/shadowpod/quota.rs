//! A tenant's usage of its grant, kept on its Tenant (`status.used`, `status.pending`) the way
//! upstream's ResourceQuota admission keeps it on the ResourceQuota: pure functions here, the
//! I/O in [`super::webhook`].
//!
//! - Admission ([`charge`]) adds what a creation or resize asks for to `used`, refusing it when
//!   that goes past the grant, and records the charge in `pending`. The webhook writes the
//!   result with the Tenant's resourceVersion as precondition and starts again on a conflict,
//!   so two replicas racing for the last share cannot both take it: the API server orders
//!   their writes, and the second sees the first's charge.
//! - The reconciler ([`recount`]) recomputes `used` from a fresh listing of the tenant's
//!   ShadowPods: finished and deleted ones release their share, and a charge whose creation
//!   failed after admission (refused further down, or a conflict) counts only until
//!   `pending_ttl` has passed. A pending charge stops counting on its own once the listing
//!   shows its ShadowPod with the requests it was charged for; until then it counts, so a
//!   creation admitted but not stored yet is never recounted away.
//! - The other kinds a consumer creates (ResourceSlices, PeeringNetworks) are bounded in
//!   number per namespace ([`charge_object`]): those a fresh listing shows plus the creations
//!   admitted since (`status.pendingObjects`), written on the Tenant the same way, so that
//!   replicas racing for the last place are ordered by the API server too.
use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use fabric_api::{
    authentication::v1alpha1::{Charge, ObjectCharge, Resources, TenantStatus},
    offloading::v1alpha1::ShadowPod,
    quantity::{Amounts, BadQuantity, amounts, quantities},
    requests::Defaults,
};
use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use kube::ResourceExt;

use super::{
    admission::{Denial, requested, shown, within_count},
    decide::terminal,
};

/// Charges `ask` (a ShadowPod of `consumer` that asks for `more` than it had, all of its
/// `requests` for a creation) against what was `granted`, given the Tenant's `status` as
/// last read: the status to write (with the charge in `used` and `pending`), or why it goes
/// past the grant, or, for a creation, past the number of ShadowPods a tenant may have
/// (those counted at the last recount and those charged since).
pub fn charge(
    status: &TenantStatus,
    consumer: &str,
    ask: &Ask,
    now: Timestamp,
) -> Result<TenantStatus, Denial> {
    let Ask {
        namespace,
        name,
        requests,
        more,
        granted,
        limit,
        bytes,
    } = ask;
    if let Some(max) = *limit {
        let objects = u64::from(status.shadow_pods) + status.pending.len() as u64;
        if objects >= u64::from(max) {
            return Err(Denial::TooMany {
                cluster: consumer.to_owned(),
                max,
            });
        }
    }
    if bytes.grown > 0 {
        let pending: u64 = status.pending.iter().map(|c| c.bytes).sum();
        let stored = status.shadow_pod_bytes.saturating_add(pending);
        if stored.saturating_add(bytes.grown) > bytes.max {
            return Err(Denial::OverBytes {
                cluster: consumer.to_owned(),
                bytes: bytes.grown,
                stored,
                max: bytes.max,
            });
        }
    }
    let mut used = amounts(&status.used)?;
    let granted = amounts(granted)?;
    for (resource, asked) in more.iter().filter(|(_, v)| **v > 0) {
        let in_use = used.get(resource).copied().unwrap_or(0);
        let limit = granted.get(resource).copied().unwrap_or(0);
        if in_use + asked > limit {
            return Err(Denial::OverQuota {
                cluster: consumer.to_owned(),
                resource: resource.clone(),
                requested: shown(*asked),
                used: shown(in_use),
                granted: shown(limit),
            });
        }
    }
    for (resource, asked) in more.iter().filter(|(_, v)| **v > 0) {
        *used.entry(resource.clone()).or_default() += asked;
    }
    let mut out = status.clone();
    out.used = quantities(&used);
    out.pending.push(Charge {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        at: Time(now),
        requests: quantities(requests),
        bytes: bytes.grown,
    });
    Ok(out)
}

/// One admission's charge, queued to be written with others of the same consumer.
#[derive(Debug, Clone)]
pub struct Ask {
    pub namespace: String,
    pub name: String,
    pub requests: Amounts,
    pub more: Amounts,
    /// The grant as read when this admission was decided.
    pub granted: Resources,
    /// For a creation: how many ShadowPods the tenant may have in all.
    pub limit: Option<u32>,
    pub bytes: Bytes,
}

/// What an admission adds to the size of a tenant's ShadowPods, and how large they may be
/// together.
#[derive(Debug, Clone, Copy, Default)]
pub struct Bytes {
    /// All of the ShadowPod's [`size`] for a creation, what it grew by for an update.
    pub grown: u64,
    pub max: u64,
}

/// A ShadowPod's size as the provider stores it, its status aside (the provider writes that):
/// what a consumer puts into the provider's store with it.
pub fn size(s: &ShadowPod) -> u64 {
    let mut s = s.clone();
    s.status = None;
    s.metadata.managed_fields = None;
    serde_json::to_vec(&s).map_or(0, |v| v.len() as u64)
}

/// Charges `asks` in order on `status`, as [`charge`] one after the other: each admitted one
/// counts against those after it, one over the grant is refused alone. The status to write
/// (all the admitted charges in it), and each ask's verdict.
pub fn charge_batch(
    status: &TenantStatus,
    consumer: &str,
    asks: &[Ask],
    now: Timestamp,
) -> (TenantStatus, Vec<Result<(), Denial>>) {
    let mut out = status.clone();
    let verdicts = asks
        .iter()
        .map(|a| {
            let next = charge(&out, consumer, a, now)?;
            out = next;
            Ok(())
        })
        .collect();
    (out, verdicts)
}

/// A creation of an object that is not a ShadowPod, to be counted against the bound of its
/// kind in its namespace.
#[derive(Debug, Clone, Copy)]
pub struct ObjectAsk<'a> {
    /// Who creates it: only consumers are bounded.
    pub user: &'a str,
    /// `group/Kind`, what its charge records.
    pub kind: &'a str,
    /// The kind as a refusal names it.
    pub kind_name: &'a str,
    pub namespace: &'a str,
    /// Its name, or the request's uid when the name is not known yet.
    pub name: &'a str,
    pub max: u32,
}

/// Charges the creation `ask` on the Tenant's `status` as last read, where `listed` are the
/// names of the objects of its kind in its namespace in a listing made *after* that read (so
/// that a charge dropped by another admission was dropped because an earlier listing showed
/// its object, which this one then shows too). Counted: those listed, and the charges of the
/// same kind and namespace that the listing does not show yet and that are younger than
/// `ttl` (a creation refused further down stops counting then). At `ask.max` the creation is
/// refused; otherwise the status to write: its charge added, and the charges of that kind and
/// namespace that were listed or lapsed dropped (they count no more).
pub fn charge_object(
    status: &TenantStatus,
    ask: &ObjectAsk<'_>,
    listed: &BTreeSet<String>,
    now: Timestamp,
    ttl: Duration,
) -> Result<TenantStatus, Denial> {
    let mine = |c: &ObjectCharge| c.kind == ask.kind && c.namespace == ask.namespace;
    let mut out = status.clone();
    out.pending_objects
        .retain(|c| !mine(c) || (!listed.contains(&c.name) && !lapsed(&c.at, now, ttl)));
    let pending = out.pending_objects.iter().filter(|c| mine(c)).count();
    within_count(
        ask.user,
        ask.kind_name,
        ask.namespace,
        listed.len() + pending,
        ask.max,
    )?;
    out.pending_objects.push(ObjectCharge {
        kind: ask.kind.to_owned(),
        namespace: ask.namespace.to_owned(),
        name: ask.name.to_owned(),
        at: Time(now),
    });
    Ok(out)
}

fn expired(c: &Charge, now: Timestamp, ttl: Duration) -> bool {
    lapsed(&c.at, now, ttl)
}

fn lapsed(at: &Time, now: Timestamp, ttl: Duration) -> bool {
    let age = now.duration_since(at.0);
    // A charge stamped by a clock ahead of this one's is not old.
    !age.is_negative() && age.unsigned_abs() >= ttl
}

/// The Tenant's status with `used` recomputed for `consumer` from `listed` (a fresh listing
/// of the ShadowPods in its namespaces) and the pending charges still to count: per
/// ShadowPod, the larger of what its listed spec requests (nothing once it finished) and what
/// charges not yet visible in the listing ask for; both with the provider's `defaults` for
/// what containers leave out, as admission charged them.
pub fn recount<'a>(
    status: &TenantStatus,
    consumer: &str,
    listed: impl IntoIterator<Item = &'a ShadowPod>,
    now: Timestamp,
    ttl: Duration,
    defaults: &Defaults,
) -> Result<TenantStatus, BadQuantity> {
    type Key = (String, String);
    // Per ShadowPod: its requests as listed, what it is charged, and whether it still runs.
    let mut seen: BTreeMap<Key, (Amounts, Amounts, bool)> = BTreeMap::new();
    let mut bytes = 0u64;
    for s in listed {
        if s.spec.cluster_id != consumer {
            continue;
        }
        bytes = bytes.saturating_add(size(s));
        let live = !terminal(s.status.as_ref().and_then(|st| st.phase.as_deref()));
        // A ShadowPod whose requests do not parse was not admitted by this webhook (the
        // provider's admin made it): it counts for nothing rather than stopping the count.
        let r = requested(&s.spec, defaults).unwrap_or_default();
        seen.insert(
            (s.namespace().unwrap_or_default(), s.name_any()),
            (r, charged(s, defaults), live),
        );
    }
    let mut counted: BTreeMap<Key, Amounts> = seen
        .iter()
        .filter(|(_, (_, _, live))| *live)
        .map(|(k, (_, c, _))| (k.clone(), c.clone()))
        .collect();
    let mut pending = Vec::new();
    for c in &status.pending {
        let key = (c.namespace.clone(), c.name.clone());
        let asked = amounts(&c.requests)?;
        let visible = seen
            .get(&key)
            .is_some_and(|(r, _, _)| r.iter().filter(|(_, v)| **v != 0).eq(asked.iter()));
        if visible || expired(c, now, ttl) {
            continue;
        }
        let slot = counted.entry(key).or_default();
        for (k, v) in &asked {
            let e = slot.entry(k.clone()).or_default();
            *e = (*e).max(*v);
        }
        pending.push(c.clone());
    }
    let mut used = Amounts::new();
    for r in counted.values() {
        for (k, v) in r {
            *used.entry(k.clone()).or_default() += v;
        }
    }
    // Object charges are dropped by the next admission of their kind once listed; those
    // that lapsed go here, so that none stays behind when no admission follows.
    let pending_objects = status
        .pending_objects
        .iter()
        .filter(|c| !lapsed(&c.at, now, ttl))
        .cloned()
        .collect();
    Ok(TenantStatus {
        used: quantities(&used),
        pending,
        pending_objects,
        shadow_pods: u32::try_from(seen.len()).unwrap_or(u32::MAX),
        shadow_pod_bytes: bytes,
        ..status.clone()
    })
}

/// What a ShadowPod is charged while it lives: per resource the larger of what its pod asks
/// for (with the provider's `defaults` for what its containers leave out) and what its real pod was last seen to hold (`status.reserved`, written by the
/// provider's controller; the consumer cannot write status). A shrink thus frees its share
/// only once the real pod has shrunk, and a change the pod never took (a resize the API
/// server refused) frees nothing. Quantities that do not parse count as none (the ShadowPod
/// cannot have been admitted by this webhook with them).
pub fn charged(s: &ShadowPod, defaults: &Defaults) -> Amounts {
    let mut out = requested(&s.spec, defaults).unwrap_or_default();
    let held = s
        .status
        .as_ref()
        .and_then(|st| amounts(&st.reserved).ok())
        .unwrap_or_default();
    for (k, v) in held {
        let e = out.entry(k).or_default();
        *e = (*e).max(v);
    }
    out
}

/// When the first pending charge stops counting, if any: the reconciler looks again then.
pub fn next_expiry(status: &TenantStatus, ttl: Duration) -> Option<Timestamp> {
    let ttl = k8s_openapi::jiff::SignedDuration::try_from(ttl).ok()?;
    status
        .pending
        .iter()
        .map(|c| &c.at)
        .chain(status.pending_objects.iter().map(|c| &c.at))
        .filter_map(|at| at.0.checked_add(ttl).ok())
        .min()
}

#[cfg(test)]
mod tests {
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
        assert!(
            matches!(&verdicts[1], Err(Denial::OverQuota { resource, .. }) if resource == "cpu")
        );
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
}
