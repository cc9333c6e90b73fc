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
mod tests;
