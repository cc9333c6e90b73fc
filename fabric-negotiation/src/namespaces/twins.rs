//! What the provider makes of a consumer's NamespaceMap, decided without I/O: whether the map
//! is served at all, which twin each mapping gets (or why not), which twins go, the map's
//! status and the Events an operator should see, and the objects of a twin (its Namespace and
//! RoleBindings). [`super::provider`] reads the cluster, calls [`plan`] and writes the result.
use std::collections::{BTreeMap, BTreeSet};

use fabric_api::{
    authentication::v1alpha1::PodSecurity,
    names::{self, annotation, label},
    offloading::v1alpha1::{
        ClaimRef, MappingPhase, NamespaceMapping, RetainedClaim, StorageRetention, TwinStatus,
        twin_reason,
    },
};
use k8s_openapi::api::{
    core::v1::Namespace,
    rbac::v1::{RoleBinding, RoleRef, Subject},
};
use kube::api::ObjectMeta;

use super::retention::{self, Claim, Fate};

/// The ClusterRole (deploy/base/sharing.yaml) the consumer's peering group gets in each of its
/// twins: its ShadowPods and their pods' streams, as the tenant Role gives them.
pub const TWIN_ROLE: &str = "fabric-consumer-twin";

/// The ClusterRole (deploy/base/sharing.yaml) the consumer's peering group gets in each of its
/// twins beside [`TWIN_ROLE`]: the custom resource kinds the provider's admin lets tenants
/// write there (opt-in reflection of custom resources): its rules are the admin's (none by
/// default: nothing granted; no status subresource, policy fabric-consumer-reflection-rules).
/// Bound by name, so the admin's choice applies to every twin at once and changes without
/// the twins being touched.
pub const REFLECTION_ROLE: &str = "fabric-consumer-reflection";

/// How many twins a tenant may have unless the provider's admin says otherwise.
pub const DEFAULT_MAX_PER_TENANT: u32 = 32;

/// The provider's limits on twins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Where the fabric runs (reserved).
    pub fabric_namespace: String,
    /// Names the admin keeps beyond the built-in ones (`--reserved-namespaces`).
    pub reserved: BTreeSet<String>,
    pub max_per_tenant: u32,
}

impl Limits {
    pub fn new(fabric_namespace: &str) -> Self {
        Self {
            fabric_namespace: fabric_namespace.to_owned(),
            reserved: BTreeSet::new(),
            max_per_tenant: DEFAULT_MAX_PER_TENANT,
        }
    }

    /// Whether the provider keeps `name` for itself: its system's, the fabric's, every
    /// tenant namespace, and what the admin adds.
    pub fn reserved(&self, name: &str) -> bool {
        name == "default"
            || name.starts_with("kube-")
            || name == self.fabric_namespace
            || name.starts_with(&names::namespace::tenant(""))
            || name == names::namespace::PEERING_TOKENS
            || name == names::namespace::IDENTITIES
            || self.reserved.contains(name)
    }
}

/// The value of [`annotation::TWIN_OF_MAP`] on the twins of map `name` in namespace `ns`.
pub fn map_key(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

/// Why a map is not served (its consumer gets nothing from it).
pub fn not_served(
    map_namespace: &str,
    map_name: &str,
    cluster_id: &str,
    tenant_active: bool,
) -> Option<String> {
    if map_name != cluster_id {
        return Some(format!(
            "a NamespaceMap is named after its consumer: this one is {map_name:?}, for consumer {cluster_id:?}"
        ));
    }
    if names::namespace::tenant(cluster_id) != map_namespace {
        return Some(format!(
            "namespace {map_namespace} is not the tenant namespace of consumer {cluster_id}"
        ));
    }
    if !tenant_active {
        return Some(format!(
            "consumer {cluster_id} is no tenant of this cluster (no Tenant in {map_namespace}, or it is being removed)"
        ));
    }
    None
}

/// A namespace that exists on the provider under a name some mapping asks for, or one this
/// map made, as the decision needs it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Existing {
    /// Its [`annotation::TWIN_OF_MAP`].
    pub twin_of: Option<String>,
    /// Its [`annotation::TWIN_HOME`].
    pub home: Option<String>,
    pub deleting: bool,
    /// Its [`annotation::STORAGE_RETENTION`] ([`retention::retention_of`]).
    pub retention: StorageRetention,
    /// The claims the fabric made in it ([`retention::fabric_made`]), looked at for the twins
    /// this map no longer asks for ([`given_up`]) only.
    pub claims: Vec<Claim>,
}

impl Existing {
    pub fn of(ns: &Namespace) -> Self {
        let ann = |k: &str| ns.metadata.annotations.as_ref()?.get(k).cloned();
        Self {
            twin_of: ann(annotation::TWIN_OF_MAP),
            home: ann(annotation::TWIN_HOME),
            deleting: ns.metadata.deletion_timestamp.is_some(),
            retention: retention::retention_of(ns),
            claims: Vec::new(),
        }
    }

    /// Whether it is the twin of `home` this map (`key`) made.
    fn twin_of(&self, key: &str, home: &str) -> bool {
        self.twin_of.as_deref() == Some(key) && self.home.as_deref() == Some(home)
    }
}

/// What to do for a served map.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    /// Twins to make (absent).
    pub create: Vec<NamespaceMapping>,
    /// Twins that exist and stay: their labels and RoleBindings kept as they should be.
    pub keep: Vec<NamespaceMapping>,
    /// Twins of this map no mapping wants any more: deleted with their content.
    pub delete: Vec<String>,
    /// Twins of this map no mapping wants any more, kept for the fabric's claims in them
    /// (`Retain`): the consumer's rights there and its ShadowPods go, the claims stay.
    pub retain: Vec<String>,
    /// The claims kept in [`Plan::retain`]'s twins (the map's `status.retained`).
    pub retained: Vec<RetainedClaim>,
    /// Retained claims the map's `spec.forget` gives up: deleted, UID-preconditioned.
    pub forget: Vec<ClaimRef>,
    /// The map's status, once the above is done.
    pub status: Vec<TwinStatus>,
}

fn refused(m: &NamespaceMapping, reason: &str, message: String) -> TwinStatus {
    TwinStatus {
        home: m.home.clone(),
        remote: m.remote.clone(),
        phase: MappingPhase::Refused,
        reason: Some(reason.to_owned()),
        message: Some(message),
    }
}

/// The twins of map `key` that no mapping of `mappings` asks for (by name): whose fate
/// depends on the claims in them, so the only ones whose claims are looked at.
pub fn given_up(
    key: &str,
    mappings: &[NamespaceMapping],
    existing: &BTreeMap<String, Existing>,
) -> Vec<String> {
    existing
        .iter()
        .filter(|(name, e)| {
            e.twin_of.as_deref() == Some(key)
                && e.home.as_ref().is_some_and(|home| {
                    !mappings
                        .iter()
                        .any(|m| &m.remote == *name && &m.home == home)
                })
        })
        .map(|(name, _)| name.clone())
        .collect()
}

/// Decides map `key` (`<namespace>/<name>`) with `mappings` (its spec) and `forget` (the
/// retained claims its consumer gives up), given `existing`: the provider's namespaces named
/// by a mapping or made by this map (by name), with their claims for those [`given_up`].
pub fn plan(
    key: &str,
    mappings: &[NamespaceMapping],
    forget: &[ClaimRef],
    existing: &BTreeMap<String, Existing>,
    limits: &Limits,
) -> Plan {
    let mut plan = Plan::default();
    let mut asked: BTreeMap<&str, usize> = BTreeMap::new();
    for m in mappings {
        *asked.entry(m.remote.as_str()).or_default() += 1;
    }
    // Twins this map has that stay: they keep their place within the limit whatever the
    // order of the spec.
    let ours = |m: &NamespaceMapping| {
        existing
            .get(&m.remote)
            .is_some_and(|e| e.twin_of(key, &m.home))
    };
    let mut count = mappings
        .iter()
        .filter(|m| ours(m) && !existing[&m.remote].deleting && asked[m.remote.as_str()] == 1)
        .count() as u32;
    let mut wanted: BTreeSet<(&str, &str)> = BTreeSet::new();
    for m in mappings {
        let status = if limits.reserved(&m.remote) {
            refused(
                m,
                twin_reason::RESERVED,
                format!("namespace {} is reserved on this cluster", m.remote),
            )
        } else if asked[m.remote.as_str()] > 1 {
            refused(
                m,
                twin_reason::DUPLICATE,
                format!(
                    "another namespace of this map asks for twin {} too: each twin has one home namespace",
                    m.remote
                ),
            )
        } else if let Some(e) = existing.get(&m.remote).filter(|e| !e.twin_of(key, &m.home)) {
            let whose = if e.twin_of.as_deref() == Some(key) {
                format!(
                    "; it is this map's twin of {}, being removed: asked again once it is gone",
                    e.home.as_deref().unwrap_or("another namespace")
                )
            } else {
                String::new()
            };
            refused(
                m,
                twin_reason::NOT_OURS,
                format!(
                    "namespace {} exists on this cluster and is not this consumer's twin of {}: it is never adopted{whose}",
                    m.remote, m.home
                ),
            )
        } else if let Some(e) = existing.get(&m.remote) {
            wanted.insert((&m.remote, &m.home));
            if e.deleting {
                TwinStatus {
                    home: m.home.clone(),
                    remote: m.remote.clone(),
                    phase: MappingPhase::Terminating,
                    reason: None,
                    message: Some(
                        "the twin is still being removed: made again once it is gone".to_owned(),
                    ),
                }
            } else {
                plan.keep.push(m.clone());
                accepted(m)
            }
        } else if count >= limits.max_per_tenant {
            refused(
                m,
                twin_reason::TOO_MANY,
                format!(
                    "this consumer has {} twin namespaces, as many as this cluster allows",
                    limits.max_per_tenant
                ),
            )
        } else {
            count += 1;
            wanted.insert((&m.remote, &m.home));
            plan.create.push(m.clone());
            accepted(m)
        };
        plan.status.push(status);
    }
    let mut homes: BTreeSet<String> = mappings.iter().map(|m| m.home.clone()).collect();
    for (name, e) in existing {
        if e.twin_of.as_deref() != Some(key) {
            continue;
        }
        // Both marks, or it is not one this map made.
        let Some(home) = e.home.clone() else {
            continue;
        };
        if wanted.contains(&(name.as_str(), home.as_str())) {
            continue;
        }
        if !e.deleting {
            match retention::fate(name, &home, e.retention, &e.claims) {
                Fate::Delete => plan.delete.push(name.clone()),
                Fate::Retain { claims } => {
                    // No status entry: the twin is no longer the consumer's (its
                    // unoffloading is done), the claims are reported on their own.
                    plan.retain.push(name.clone());
                    plan.retained.extend(claims);
                    continue;
                }
            }
        }
        // The status is a map by home: a home asking for another twin now has its entry (and
        // of two old twins of one home, the first tells).
        if homes.insert(home.clone()) {
            plan.status.push(TwinStatus {
                home,
                remote: name.clone(),
                phase: MappingPhase::Terminating,
                reason: None,
                message: Some("no longer asked for: removed with everything in it".to_owned()),
            });
        }
    }
    plan.forget = retention::forgotten(&plan.retained, forget);
    plan
}

fn accepted(m: &NamespaceMapping) -> TwinStatus {
    TwinStatus {
        home: m.home.clone(),
        remote: m.remote.clone(),
        phase: MappingPhase::Accepted,
        reason: None,
        message: None,
    }
}

/// The status of an unserved map: every mapping refused, saying why.
pub fn refused_all(mappings: &[NamespaceMapping], why: &str) -> Vec<TwinStatus> {
    mappings
        .iter()
        .map(|m| refused(m, twin_reason::NOT_SERVED, why.to_owned()))
        .collect()
}

/// What an operator should see of a change of the map's status from `old` to `new`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Created {
        home: String,
        remote: String,
    },
    Refused {
        home: String,
        remote: String,
        message: String,
    },
    Removed {
        home: String,
        remote: String,
    },
}

/// The changes from `old` to `new`: twins newly accepted, mappings newly refused (or refused
/// for another reason), twins whose removal ended (their entry gone after Terminating).
pub fn changes(old: &[TwinStatus], new: &[TwinStatus]) -> Vec<Change> {
    let find = |list: &[TwinStatus], s: &TwinStatus| {
        list.iter()
            .find(|o| o.home == s.home && o.remote == s.remote)
            .cloned()
    };
    let mut out = Vec::new();
    for s in new {
        let before = find(old, s);
        let (home, remote) = (s.home.clone(), s.remote.clone());
        match s.phase {
            MappingPhase::Accepted
                if before.as_ref().map(|b| b.phase) != Some(MappingPhase::Accepted) =>
            {
                out.push(Change::Created { home, remote })
            }
            MappingPhase::Refused
                if before
                    .as_ref()
                    .is_none_or(|b| b.phase != MappingPhase::Refused || b.reason != s.reason) =>
            {
                out.push(Change::Refused {
                    home,
                    remote,
                    message: s.message.clone().unwrap_or_default(),
                })
            }
            _ => {}
        }
    }
    for s in old {
        if s.phase == MappingPhase::Terminating && find(new, s).is_none() {
            out.push(Change::Removed {
                home: s.home.clone(),
                remote: s.remote.clone(),
            });
        }
    }
    out
}

fn twin_labels(consumer: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (label::REMOTE_CLUSTER.to_owned(), consumer.to_owned()),
        (label::TWIN_NAMESPACE.to_owned(), "true".to_owned()),
    ])
}

/// The labels a twin of `consumer`'s carries: its consumer's (the ShadowPod webhook admits
/// that consumer's ShadowPods there and counts them on its Tenant), the twin mark, and Pod
/// Security admission's at the tenant's level.
pub fn namespace_labels(consumer: &str, level: PodSecurity) -> BTreeMap<String, String> {
    let mut labels = twin_labels(consumer);
    for (k, v) in fabric_auth::tenant::POD_SECURITY_LABELS {
        let v = if k == "pod-security.kubernetes.io/enforce" {
            level.as_str()
        } else {
            v
        };
        labels.insert(k.to_owned(), v.to_owned());
    }
    labels
}

/// The twin `m` of `consumer`'s map `key`.
pub fn namespace(consumer: &str, key: &str, m: &NamespaceMapping, level: PodSecurity) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(m.remote.clone()),
            labels: Some(namespace_labels(consumer, level)),
            annotations: Some(BTreeMap::from([
                (annotation::TWIN_OF_MAP.to_owned(), key.to_owned()),
                (annotation::TWIN_HOME.to_owned(), m.home.clone()),
                // Marked once, when made (the sharing controllers write no namespace after,
                // fabric-sharing-namespace-label): the NamespaceOffloading's retention cannot
                // change, so the mark stays its.
                (
                    annotation::STORAGE_RETENTION.to_owned(),
                    retention::mark(m.storage_retention.unwrap_or_default()).to_owned(),
                ),
            ])),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn binding(consumer: &str, twin: &str, name: &str, subjects: Vec<Subject>) -> RoleBinding {
    RoleBinding {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(twin.to_owned()),
            labels: Some(twin_labels(consumer)),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "ClusterRole".to_owned(),
            name: match name {
                fabric_auth::tenant::ROLE => TWIN_ROLE.to_owned(),
                other => other.to_owned(),
            },
        },
        subjects: Some(subjects),
    }
}

/// The consumer's rights in `twin`: [`TWIN_ROLE`] bound to `subjects`, those of its tenant
/// namespace's RoleBinding (its current peering group; none while it has none).
pub fn consumer_binding(consumer: &str, twin: &str, subjects: Vec<Subject>) -> RoleBinding {
    binding(consumer, twin, fabric_auth::tenant::ROLE, subjects)
}

/// The custom resource kinds the provider lets the consumer write in `twin`: [`REFLECTION_ROLE`]
/// bound to the same `subjects` as [`consumer_binding`] (and dropped with it).
pub fn reflection_binding(consumer: &str, twin: &str, subjects: Vec<Subject>) -> RoleBinding {
    binding(consumer, twin, REFLECTION_ROLE, subjects)
}

/// The sharing controllers' pods in `twin`, as [`fabric_auth::tenant::sharing_binding`] gives
/// them in the tenant namespace: the ShadowPod controller runs the consumer's pods there.
pub fn sharing_binding(consumer: &str, twin: &str, fabric_namespace: &str) -> RoleBinding {
    let tenant = fabric_auth::tenant::sharing_binding(consumer, fabric_namespace);
    binding(
        consumer,
        twin,
        fabric_auth::tenant::SHARING_ROLE,
        tenant.subjects.unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests;
