//! Resource negotiation (`ResourceSlice`).
//!
//! The consumer creates ResourceSlices in its fabric namespace; [`consumer`] replicates each
//! one's spec into its tenant namespace on the provider (with its identity), brings the
//! provider's status back, and turns what is granted into the `VirtualNode` of that provider.
//! [`provider`] answers the replicas by [`crate::policy`]. Spec flows from the origin, status
//! from the destination, never the other way.
//!
//! This module is the pure part.
use std::collections::BTreeMap;

use fabric_api::{
    authentication::v1alpha1::{
        ResourceSlice, ResourceSliceStatus, Resources, WorkingMode, slice_condition,
    },
    names::{self, label},
    offloading::{
        at_most_once::most_patient,
        lent,
        v1alpha1::{Storage, VirtualNode, VirtualNodeSpec},
    },
    quantity::{milli, quantity},
};
use fabric_kube::status::Verdict;
use kube::{ResourceExt, api::ObjectMeta};

use crate::{
    policy::Amounts,
    reasons::{Mode, ResourcesGranted as Granted},
};

pub mod consumer;
pub mod provider;

/// On the consumer's ResourceSlices: the replica on the provider is removed before they go.
pub const FINALIZER: &str = "sharing.fabric.io/replica";

/// The replica of a consumer's slice in its tenant namespace: the same name, the spec only.
pub fn replica(origin: &ResourceSlice, tenant_namespace: &str) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(origin.name_any()),
            namespace: Some(tenant_namespace.to_owned()),
            labels: Some(BTreeMap::from([(
                label::REMOTE_CLUSTER.to_owned(),
                origin.spec.consumer_cluster_id.clone(),
            )])),
            ..Default::default()
        },
        spec: origin.spec.clone(),
        status: None,
    }
}

/// Whether the provider accepted the slice (granted something).
pub fn accepted(status: &ResourceSliceStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == slice_condition::ACCEPTED && c.status == "True")
        && status
            .granted
            .values()
            .any(|q| milli(&q.0).is_ok_and(|v| v > 0))
}

/// The VirtualNode standing for `provider`: the sum of what its accepted slices grant, with
/// the labels they advertise and the longest at-most-once terms the provider agreed to in
/// them; None when nothing is granted. Storage granted (`storage.fabric.io/CLASS`) is not a
/// resource of the Node (no pod requests it) but its `spec.storage`: the classes granted and
/// the default the provider named (the first granted class should it name none of them).
pub fn virtual_node<'a>(
    provider: &str,
    namespace: &str,
    slices: impl IntoIterator<Item = &'a ResourceSlice>,
) -> Option<VirtualNode> {
    let mut total = Amounts::new();
    let mut labels = BTreeMap::new();
    let mut terms = Vec::new();
    let mut defaults = Vec::new();
    for s in slices {
        let Some(st) = s.status.as_ref().filter(|st| accepted(st)) else {
            continue;
        };
        if s.spec.provider_cluster_id != provider {
            continue;
        }
        for (r, q) in &st.granted {
            *total.entry(r.clone()).or_default() += milli(&q.0).unwrap_or(0).max(0);
        }
        labels.extend(st.node_labels.clone());
        terms.extend(st.at_most_once);
        defaults.extend(st.default_storage_class.clone());
    }
    let (storage, resources): (Vec<_>, Vec<_>) = total
        .iter()
        .filter(|(_, v)| **v > 0)
        .partition(|(r, _)| lent::class_of(r).is_some());
    if resources.is_empty() && storage.is_empty() {
        return None;
    }
    let resources: Resources = resources
        .into_iter()
        .map(|(r, v)| (r.clone(), quantity(r, *v)))
        .collect();
    let classes: Vec<String> = storage
        .iter()
        .filter_map(|(r, _)| lent::class_of(r).map(str::to_owned))
        .collect();
    let storage = (!classes.is_empty()).then(|| Storage {
        default: defaults
            .into_iter()
            .find(|d| classes.contains(d))
            .or_else(|| classes.first().cloned()),
        classes,
    });
    Some(VirtualNode {
        metadata: ObjectMeta {
            name: Some(provider.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([(
                label::REMOTE_CLUSTER.to_owned(),
                provider.to_owned(),
            )])),
            ..Default::default()
        },
        spec: VirtualNodeSpec {
            cluster_id: provider.to_owned(),
            node_name: names::node::virtual_node(provider),
            identity: provider.to_owned(),
            resources,
            labels,
            at_most_once: most_patient(&terms),
            storage,
        },
        status: None,
    })
}

/// The ResourcesGranted condition of a peer from the Accepted conditions of the slices with
/// it: granted when any slice is, else the first answer's reason, else pending.
pub fn resources_granted<'a>(
    statuses: impl IntoIterator<Item = Option<&'a ResourceSliceStatus>>,
) -> Verdict<Granted> {
    let mut first = None;
    let mut any = false;
    let mut best: Option<Verdict<Granted>> = None;
    for st in statuses {
        any = true;
        let Some(answer) =
            st.and_then(|st| Verdict::<Granted>::find(&st.conditions, slice_condition::ACCEPTED))
        else {
            continue;
        };
        if answer.ok {
            // Granted beats PartiallyGranted.
            if best.as_ref().is_none_or(|b| b.reason != Granted::Granted) {
                best = Some(answer);
            }
        } else if first.is_none() {
            first = Some(answer);
        }
    }
    match (best, first, any) {
        (Some(v), _, _) | (None, Some(v), _) => v,
        (None, None, true) => Verdict::not(Granted::Pending, "the provider has not answered yet"),
        (None, None, false) => Verdict::not(Granted::NoSlice, "no resources asked for"),
    }
}

/// The Tethered condition of a ForeignCluster from the answers of the slices with that peer:
/// tethered when the provider says so in any of them (it says so in all of the one
/// consumer's, or in none).
pub fn mode<'a>(
    statuses: impl IntoIterator<Item = Option<&'a ResourceSliceStatus>>,
) -> Verdict<Mode> {
    if statuses
        .into_iter()
        .flatten()
        .any(|s| s.mode == WorkingMode::Tethered)
    {
        Verdict::ok(
            Mode::Tethered,
            "the provider is tethered to the consumer: it offers all of its free capacity, to \
             it alone, and refuses new local workload pods",
        )
    } else {
        Verdict::not(
            Mode::Autonomous,
            "the provider keeps control of its resources",
        )
    }
}

#[cfg(test)]
mod tests;
