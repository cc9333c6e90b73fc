//! The provider's offer policy: what each consumer's ResourceSlice is granted. Pure: a
//! function of the provider's Nodes and Pods, the slices and the Tenants; the controller
//! ([`crate::slices::provider`]) feeds it from watch caches and writes what it decides.
//!
//! - **Capacity** is what real nodes have free: allocatable of every Node that is not a
//!   virtual node (label `fabric.io/type=virtual-node`) and not unschedulable, minus the
//!   requests of the pods bound to those nodes that still run and are not offloaded (a pod
//!   labelled `fabric.io/remote-cluster-id` runs for a consumer: it lives inside that
//!   consumer's grant, and counting it again would take the grant away twice).
//! - **The offer** is a share of that (by default 90%), capped by each slice's request and by
//!   its Tenant's caps. Offers to all consumers together never exceed it: slices are served
//!   in a fixed order, existing grants first (kept before anything new is handed out), then
//!   in creation order, each from what the previous ones left.
//! - **Tenant state**: Active tenants get what is there; Cordoned ones keep what they have
//!   (never more) and get nothing new; Drained ones get zero.
//! - **Tethered** (docs/modes.md): while this cluster is tethered to one consumer (its
//!   Tenant's `spec.mode`, see [`fabric_api::authentication::mode`]), that consumer is offered
//!   all of what is free (100%, not the share) and every other consumer's slice is refused
//!   saying so: the cluster has handed its resources to that one peer. Leaving it, the share
//!   applies again and existing grants are kept only within it (pass 1 below).
//! - **Storage** is what the provider's admin lends (ConfigMap `fabric-storage`, see
//!   [`fabric_api::offloading::lent`]): resources `storage.fabric.io/CLASS`, offered whole
//!   (the admin said how much; no node frees or takes any of it), shared out as the rest.
//!   A grant with storage names the class a claim gets by default: the provider's default
//!   when it is granted, else the first granted.
//! - **Labels**: the slice's status carries the provider's configured labels, plus
//!   `node-type=gpu` when the grant includes a GPU (a resource named `*/gpu`, such as
//!   `nvidia.com/gpu`), so that workloads can select a virtual node by what it offers.
//!
//! Amounts are integers in thousandths of their unit (see [`fabric_api::quantity`]).
use std::{collections::BTreeMap, fmt};

use fabric_api::{
    authentication::v1alpha1::{
        ResourceSliceStatus, Resources, TenantState, WorkingMode, slice_condition::ACCEPTED,
    },
    names::label,
    offloading::{at_most_once, lent},
    quantity::{milli, quantity},
    requests,
};
use k8s_openapi::{
    api::core::v1::{Node, Pod},
    jiff::Timestamp,
};

/// Resource name → thousandths of its unit.
pub use fabric_api::quantity::Amounts;

/// The label added when a grant includes a GPU, and its value.
pub const GPU_LABEL: (&str, &str) = ("node-type", "gpu");

/// How the provider offers.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// This cluster's id: slices addressed to another provider are refused.
    pub cluster_id: String,
    /// The share of free capacity offered, in percent.
    pub percent: u8,
    /// Labels every offer carries.
    pub labels: BTreeMap<String, String>,
    /// What it agrees to of at-most-once requests.
    pub at_most_once: at_most_once::Bounds,
    /// The consumer this cluster is tethered to, if any (from the Tenants, per decision).
    pub tethered: Option<String>,
}

impl Settings {
    pub fn new(cluster_id: impl Into<String>) -> Self {
        Self {
            cluster_id: cluster_id.into(),
            percent: 90,
            labels: BTreeMap::new(),
            at_most_once: Default::default(),
            tethered: None,
        }
    }

    /// The share of free capacity offered: all of it while tethered, else `percent`.
    pub fn share(&self) -> u8 {
        if self.tethered.is_some() {
            100
        } else {
            self.percent
        }
    }
}

/// Whether a Node is one of the fabric's virtual nodes (it lends nothing of this cluster).
pub fn is_virtual(node: &Node) -> bool {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(label::NODE_TYPE))
        .is_some_and(|t| t == label::VIRTUAL_NODE_TYPE)
}

fn add(into: &mut Amounts, name: &str, v: i128) {
    *into.entry(name.to_owned()).or_default() += v;
}

/// A pod's requests as the scheduler counts them ([`fabric_api::requests`]). The API server
/// stores no quantity that does not parse; should one not, the pod still takes its `pods`.
pub fn pod_requests(pod: &Pod) -> Amounts {
    let Some(spec) = &pod.spec else {
        return Amounts::new();
    };
    requests::pod_requests(spec).unwrap_or_else(|_| Amounts::from([("pods".to_owned(), 1000)]))
}

/// Whether a pod holds its node's resources: bound, not finished, not offloaded.
fn holds_resources(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    let offloaded = pod
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(label::REMOTE_CLUSTER));
    !offloaded && !matches!(phase, Some("Succeeded" | "Failed"))
}

/// What the real nodes have free.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Capacity {
    /// Allocatable of the real, schedulable nodes.
    pub allocatable: Amounts,
    /// Requests of the pods holding resources on them.
    pub used: Amounts,
    /// The storage the admin lends: offered whole.
    pub lent: lent::Lent,
}

impl Capacity {
    /// From the cluster's Nodes and Pods.
    pub fn of<'a>(
        nodes: impl IntoIterator<Item = &'a Node>,
        pods: impl IntoIterator<Item = &'a Pod>,
    ) -> Self {
        let mut c = Capacity::default();
        let mut real = std::collections::BTreeSet::new();
        for n in nodes {
            let unschedulable = n
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false);
            if is_virtual(n) || unschedulable {
                continue;
            }
            real.insert(n.metadata.name.clone().unwrap_or_default());
            for (k, q) in n
                .status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref())
                .into_iter()
                .flatten()
            {
                add(&mut c.allocatable, k, milli(&q.0).unwrap_or(0));
            }
        }
        for p in pods {
            let node = p.spec.as_ref().and_then(|s| s.node_name.as_deref());
            if node.is_some_and(|n| real.contains(n)) && holds_resources(p) {
                for (k, v) in pod_requests(p) {
                    add(&mut c.used, &k, v);
                }
            }
        }
        c
    }

    /// What may be offered of each resource: `percent` of what is free, rounded down; the
    /// storage lent, whole.
    pub fn offerable(&self, percent: u8) -> Amounts {
        let mut out: Amounts = self
            .allocatable
            .iter()
            .map(|(k, a)| {
                let free = (a - self.used.get(k).copied().unwrap_or(0)).max(0);
                (k.clone(), free * i128::from(percent.min(100)) / 100)
            })
            .collect();
        out.extend(self.lent.amounts());
        out
    }

    /// Whether this cluster has any of `resource` at all.
    fn has(&self, resource: &str) -> bool {
        match lent::class_of(resource) {
            Some(class) => self.lent.classes.iter().any(|(c, v)| c == class && *v > 0),
            None => self.allocatable.get(resource).is_some_and(|&a| a > 0),
        }
    }
}

/// A Tenant as the policy needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantView {
    pub cluster_id: String,
    pub state: TenantState,
    /// Upper bounds of the tenant's total grant (unparseable caps count as zero: a cap the
    /// admin wrote wrong refuses rather than lets everything through).
    pub caps: Amounts,
}

impl TenantView {
    pub fn from_tenant(t: &fabric_api::authentication::v1alpha1::Tenant) -> Self {
        Self {
            cluster_id: t.spec.cluster_id.clone(),
            state: t.spec.state,
            caps: t
                .spec
                .caps
                .iter()
                .map(|(k, q)| (k.clone(), milli(&q.0).unwrap_or(0).max(0)))
                .collect(),
        }
    }
}

/// Identifies a slice: (namespace, name).
pub type SliceKey = (String, String);

/// One ResourceSlice replica as the policy needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct SliceView {
    pub key: SliceKey,
    /// `spec.consumerClusterId`.
    pub consumer: String,
    /// `spec.providerClusterId`.
    pub provider: String,
    /// The Tenant of the slice's namespace, if there is one.
    pub tenant: Option<TenantView>,
    /// What is asked, as written (quantities are parsed here, so a bad one is reported).
    pub requested: Resources,
    /// What its status grants now.
    pub granted: Resources,
    /// The at-most-once semantics it asks for.
    pub at_most_once: Option<fabric_api::offloading::v1alpha1::AtMostOnce>,
    pub created: Option<Timestamp>,
}

/// Why a resource got less than asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shortfall {
    /// What is left of the offerable share of free capacity.
    Capacity,
    /// The tenant's cap.
    TenantCap,
    /// No real node has any.
    NotOffered,
    /// What is lent of a StorageClass is granted to others.
    Lent,
    /// The StorageClass is not lent.
    NotLent,
    /// The tenant is cordoned: it keeps what it had, nothing more.
    Cordoned,
    /// The request is not a quantity.
    Invalid,
}

impl fmt::Display for Shortfall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Shortfall::Capacity => "capacity: no more is free on this cluster's nodes",
            Shortfall::TenantCap => "the tenant's cap",
            Shortfall::NotOffered => "no node of this cluster has it",
            Shortfall::Lent => "what this cluster lends of that StorageClass is granted",
            Shortfall::NotLent => "this cluster does not lend that StorageClass",
            Shortfall::Cordoned => "the tenant is cordoned: it keeps what it had",
            Shortfall::Invalid => "not a quantity",
        })
    }
}

fabric_kube::reasons! {
    /// The provider's answer, as the `Accepted` condition's reason.
    pub enum Verdict {
        Granted = "Granted",
        PartiallyGranted = "PartiallyGranted",
        Refused = "Refused",
    }
}

/// What one slice gets.
#[derive(Debug, Clone, PartialEq)]
pub struct Offer {
    /// Non-zero grants only.
    pub granted: Resources,
    pub labels: BTreeMap<String, String>,
    pub verdict: Verdict,
    pub message: String,
    /// The at-most-once semantics agreed to (absent on a refused slice).
    pub at_most_once: Option<fabric_api::offloading::v1alpha1::AtMostOnce>,
    /// With storage granted: the class a claim gets when it names none.
    pub default_storage_class: Option<String>,
    /// `Tethered` on the slices of the consumer this cluster is tethered to.
    pub mode: WorkingMode,
}

/// Why a whole slice is refused.
fn refusal(s: &SliceView, settings: &Settings) -> Option<String> {
    if s.provider != settings.cluster_id {
        return Some(format!(
            "the slice is addressed to provider {:?}, this cluster is {:?}",
            s.provider, settings.cluster_id
        ));
    }
    let Some(t) = &s.tenant else {
        return Some(format!(
            "namespace {} has no Tenant: this cluster does not know the consumer",
            s.key.0
        ));
    };
    if t.cluster_id != s.consumer {
        return Some(format!(
            "the slice speaks for consumer {:?} but namespace {} belongs to {:?}",
            s.consumer, s.key.0, t.cluster_id
        ));
    }
    if t.state == TenantState::Drained {
        return Some("the tenant is drained: nothing is granted".to_owned());
    }
    if let Some(peer) = settings.tethered.as_deref().filter(|p| *p != t.cluster_id) {
        return Some(format!(
            "this cluster is tethered to {peer:?}: it offers its resources to that consumer \
             alone until its admin sets it autonomous again (fabricctl mode autonomous)"
        ));
    }
    None
}

/// Per slice, one resource: what it may take in this pass.
struct Want {
    resource: String,
    amount: i128,
}

/// Decides every slice's offer at once (offers never over-commit together).
pub fn decide(
    settings: &Settings,
    capacity: &Capacity,
    slices: &[SliceView],
) -> BTreeMap<SliceKey, Offer> {
    let mut left = capacity.offerable(settings.share());
    // Per tenant namespace: what its cap still allows.
    let mut caps_left: BTreeMap<String, Amounts> = BTreeMap::new();
    let mut order: Vec<&SliceView> = slices.iter().collect();
    let has_grant = |s: &SliceView| s.granted.values().any(|q| milli(&q.0).unwrap_or(0) > 0);
    order.sort_by(|a, b| {
        (!has_grant(a), a.created, &a.key).cmp(&(!has_grant(b), b.created, &b.key))
    });

    let mut granted: BTreeMap<SliceKey, Amounts> = BTreeMap::new();
    let mut short: BTreeMap<SliceKey, BTreeMap<String, Shortfall>> = BTreeMap::new();
    let mut refused: BTreeMap<SliceKey, String> = BTreeMap::new();
    let mut requested: BTreeMap<SliceKey, Amounts> = BTreeMap::new();
    for s in &order {
        if let Some(why) = refusal(s, settings) {
            refused.insert(s.key.clone(), why);
            continue;
        }
        let mut req = Amounts::new();
        for (r, q) in &s.requested {
            match milli(&q.0) {
                Ok(v) => {
                    req.insert(r.clone(), v.max(0));
                }
                Err(_) => {
                    req.insert(r.clone(), 0);
                    short
                        .entry(s.key.clone())
                        .or_default()
                        .insert(r.clone(), Shortfall::Invalid);
                }
            }
        }
        requested.insert(s.key.clone(), req);
        if let Some(t) = &s.tenant {
            caps_left
                .entry(s.key.0.clone())
                .or_insert_with(|| t.caps.clone());
        }
    }

    // Pass 1 keeps existing grants (within today's capacity); pass 2 hands out the rest to
    // active tenants, in order.
    for pass in [1, 2] {
        for s in &order {
            let Some(req) = requested.get(&s.key) else {
                continue;
            };
            let state = s.tenant.as_ref().map(|t| t.state);
            let wants: Vec<Want> = req
                .iter()
                .map(|(r, &asked)| {
                    let have = granted
                        .get(&s.key)
                        .and_then(|g| g.get(r))
                        .copied()
                        .unwrap_or(0);
                    let target = if pass == 1 {
                        let existing = s.granted.get(r).and_then(|q| milli(&q.0).ok());
                        existing.unwrap_or(0).clamp(0, asked)
                    } else if state == Some(TenantState::Active) {
                        asked
                    } else {
                        have
                    };
                    Want {
                        resource: r.clone(),
                        amount: (target - have).max(0),
                    }
                })
                .collect();
            for w in wants {
                let cap = caps_left
                    .get(&s.key.0)
                    .and_then(|c| c.get(&w.resource))
                    .copied();
                let free = left.get(&w.resource).copied();
                let mut give = w.amount;
                if let Some(c) = cap {
                    give = give.min(c);
                }
                give = give.min(free.unwrap_or(0));
                if give > 0 {
                    *left.get_mut(&w.resource).expect("free implies an entry") -= give;
                    if let Some(c) = caps_left
                        .get_mut(&s.key.0)
                        .and_then(|c| c.get_mut(&w.resource))
                    {
                        *c -= give;
                    }
                    add(granted.entry(s.key.clone()).or_default(), &w.resource, give);
                }
            }
        }
    }

    // Why each resource fell short, first reason that applies.
    let mut out = BTreeMap::new();
    for s in slices {
        if let Some(why) = refused.remove(&s.key) {
            out.insert(
                s.key.clone(),
                Offer {
                    granted: Resources::new(),
                    labels: BTreeMap::new(),
                    verdict: Verdict::Refused,
                    message: why,
                    at_most_once: None,
                    default_storage_class: None,
                    mode: WorkingMode::Autonomous,
                },
            );
            continue;
        }
        let req = requested.remove(&s.key).unwrap_or_default();
        let got = granted.remove(&s.key).unwrap_or_default();
        let mut shorts = short.remove(&s.key).unwrap_or_default();
        let state = s.tenant.as_ref().map(|t| t.state);
        for (r, &asked) in &req {
            let g = got.get(r).copied().unwrap_or(0);
            if g >= asked || shorts.contains_key(r) {
                continue;
            }
            let cap = caps_left.get(&s.key.0).and_then(|c| c.get(r)).copied();
            let storage = lent::class_of(r).is_some();
            let why = if !capacity.has(r) {
                if storage {
                    Shortfall::NotLent
                } else {
                    Shortfall::NotOffered
                }
            } else if state == Some(TenantState::Cordoned) {
                Shortfall::Cordoned
            } else if cap == Some(0) {
                Shortfall::TenantCap
            } else if storage {
                Shortfall::Lent
            } else {
                Shortfall::Capacity
            };
            shorts.insert(r.clone(), why);
        }
        let any = got.values().any(|&v| v > 0);
        let verdict = match (any, shorts.is_empty()) {
            (_, true) => Verdict::Granted,
            (true, false) => Verdict::PartiallyGranted,
            (false, false) => Verdict::Refused,
        };
        let message = if shorts.is_empty() {
            "everything asked for is granted".to_owned()
        } else {
            shorts
                .iter()
                .map(|(r, why)| {
                    let g = got.get(r).copied().unwrap_or(0);
                    let asked = s.requested.get(r).map(|q| q.0.as_str()).unwrap_or("");
                    format!("{r}: {} of {asked} ({why})", quantity(r, g).0)
                })
                .collect::<Vec<_>>()
                .join("; ")
        };
        let granted: Resources = got
            .iter()
            .filter(|(_, v)| **v > 0)
            .map(|(r, &v)| (r.clone(), quantity(r, v)))
            .collect();
        let classes: Vec<&str> = granted.keys().filter_map(|r| lent::class_of(r)).collect();
        let default_storage_class = capacity
            .lent
            .default
            .as_deref()
            .filter(|d| classes.contains(d))
            .or(classes.first().copied())
            .map(str::to_owned);
        let mut labels = settings.labels.clone();
        if granted.keys().any(|r| r.ends_with("/gpu")) {
            labels.insert(GPU_LABEL.0.to_owned(), GPU_LABEL.1.to_owned());
        }
        out.insert(
            s.key.clone(),
            Offer {
                granted,
                labels,
                verdict,
                message,
                at_most_once: at_most_once::agree(
                    s.at_most_once.filter(|_| verdict != Verdict::Refused),
                    &settings.at_most_once,
                ),
                default_storage_class,
                mode: match &settings.tethered {
                    Some(p) if *p == s.consumer => WorkingMode::Tethered,
                    _ => WorkingMode::Autonomous,
                },
            },
        );
    }
    out
}

/// The slice's status for `offer`: the Accepted condition keeps its transition time while
/// its status does not change, so an unchanged offer writes an identical status.
pub fn status(
    offer: &Offer,
    current: Option<&ResourceSliceStatus>,
    generation: Option<i64>,
    now: Timestamp,
) -> ResourceSliceStatus {
    let accepted = fabric_kube::status::Verdict {
        ok: offer.verdict != Verdict::Refused,
        reason: offer.verdict,
        message: offer.message.clone(),
    };
    let conditions = fabric_kube::status::with_condition(
        current.map(|s| s.conditions.as_slice()).unwrap_or(&[]),
        accepted.condition(ACCEPTED, generation, now),
    );
    ResourceSliceStatus {
        granted: offer.granted.clone(),
        node_labels: offer.labels.clone(),
        at_most_once: offer.at_most_once,
        default_storage_class: offer.default_storage_class.clone(),
        mode: offer.mode,
        observed_generation: generation,
        conditions,
    }
}

#[cfg(test)]
mod tests;
