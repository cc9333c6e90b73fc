//! The test scheduler's volume binding, as kube-scheduler's VolumeBinding plugin, free of I/O:
//! - [`pre_filter`]: every `persistentVolumeClaim` volume's claim must exist and not be
//!   deleted, and an unbound claim of a class that binds at once must be bound already
//!   (upstream's messages, which make the pod unschedulable on every node);
//! - [`filter`]: a bound claim's PV must exist and its required node affinity match the node;
//!   an unbound `WaitForFirstConsumer` claim needs an `Available` PV matching it (class, size,
//!   access modes) whose affinity matches the node, or a class with a provisioner;
//! - [`prebind`]: on the chosen node, what to write before binding the pod: the matching PV's
//!   `claimRef` (the PV controller completes the binding), or the claim's
//!   `volume.kubernetes.io/selected-node` for its provisioner. The scheduler then waits until
//!   every claim is bound before it binds the pod (upstream's PreBind).
//!
//! Virtual nodes are nodes like any other: the fabric's provisioner acts on a selected node
//! that is its virtual node.
use std::collections::BTreeSet;

use k8s_openapi::api::{
    core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod},
    storage::v1::StorageClass,
};
use kube::ResourceExt;

use super::{Misfit, term_matches};
use crate::storage::{self, WAIT_FOR_FIRST_CONSUMER};

/// What the scheduler knows of the cluster's storage.
#[derive(Default, Clone, Copy)]
pub struct Volumes<'a> {
    pub claims: &'a [&'a PersistentVolumeClaim],
    pub volumes: &'a [&'a PersistentVolume],
    pub classes: &'a [&'a StorageClass],
}

/// A claim of the pod, as the plugin's PreFilter sorts them.
#[derive(Debug, Clone, Copy)]
pub enum Claim<'a> {
    /// `spec.volumeName` set: the PV named there (which may be missing).
    Bound(&'a PersistentVolumeClaim, &'a str),
    /// Unbound, of a `WaitForFirstConsumer` class.
    Delayed(&'a PersistentVolumeClaim, &'a StorageClass),
}

/// The names of the claims `pod` mounts.
pub fn claim_names(pod: &Pod) -> Vec<String> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .map(|c| c.claim_name.clone())
        .collect()
}

/// The pod's claims, or the message that makes it unschedulable everywhere.
pub fn pre_filter<'a>(pod: &Pod, v: &Volumes<'a>) -> Result<Vec<Claim<'a>>, String> {
    let ns = pod.namespace().unwrap_or_default();
    let mut out = Vec::new();
    let mut immediate = false;
    for name in claim_names(pod) {
        let Some(c) = v
            .claims
            .iter()
            .copied()
            .find(|c| c.namespace().as_deref() == Some(&ns) && c.name_any() == name)
        else {
            return Err(format!("persistentvolumeclaim \"{name}\" not found"));
        };
        if c.metadata.deletion_timestamp.is_some() {
            return Err(format!("persistentvolumeclaim \"{name}\" is being deleted"));
        }
        let spec = c.spec.as_ref();
        let bound = spec
            .and_then(|s| s.volume_name.as_deref())
            .unwrap_or_default();
        if !bound.is_empty() {
            out.push(Claim::Bound(c, bound));
            continue;
        }
        let class = spec
            .and_then(|s| s.storage_class_name.as_deref())
            .unwrap_or_default();
        if class.is_empty() {
            immediate = true;
            continue;
        }
        let Some(k) = v.classes.iter().copied().find(|k| k.name_any() == class) else {
            return Err(format!("storageclass.storage.k8s.io \"{class}\" not found"));
        };
        if k.volume_binding_mode.as_deref() == Some(WAIT_FOR_FIRST_CONSUMER) {
            out.push(Claim::Delayed(c, k));
        } else {
            immediate = true;
        }
    }
    if immediate {
        return Err("pod has unbound immediate PersistentVolumeClaims".into());
    }
    Ok(out)
}

/// Does the PV's required node affinity admit `node` (no affinity: every node)?
pub fn volume_fits(pv: &PersistentVolume, node: &Node) -> bool {
    let required = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref());
    match required {
        Some(sel) => sel
            .node_selector_terms
            .iter()
            .any(|t| term_matches(t, node)),
        None => true,
    }
}

/// What to write before binding the pod to the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prebind {
    /// Set this PV's `claimRef` to the claim.
    ClaimVolume {
        volume: String,
        namespace: String,
        claim: String,
        uid: String,
    },
    /// Annotate the claim with the selected node, for its provisioner.
    SelectNode {
        namespace: String,
        claim: String,
        node: String,
    },
}

/// The node's misfits for the pod's claims, and when it fits, the writes due on choosing it.
pub fn filter(claims: &[Claim<'_>], node: &Node, v: &Volumes<'_>) -> Result<Vec<Prebind>, Misfit> {
    let mut writes = Vec::new();
    let mut taken = BTreeSet::new();
    let node_name = node.name_any();
    for c in claims {
        match *c {
            Claim::Bound(_, pv) => {
                let Some(pv) = v.volumes.iter().find(|v| v.name_any() == pv) else {
                    return Err(Misfit::VolumeMissing);
                };
                if !volume_fits(pv, node) {
                    return Err(Misfit::VolumeNodeAffinity);
                }
            }
            Claim::Delayed(claim, class) => {
                let (ns, name) = (claim.namespace().unwrap_or_default(), claim.name_any());
                if claim
                    .annotations()
                    .get(storage::SELECTED_NODE)
                    .is_some_and(|n| *n == node_name)
                {
                    // Already selected for this node: its provisioner is at work.
                    continue;
                }
                let fitting: Vec<&PersistentVolume> = v
                    .volumes
                    .iter()
                    .copied()
                    .filter(|pv| volume_fits(pv, node) && !taken.contains(&pv.name_any()))
                    .collect();
                if let Some(pv) = storage::best_match(claim, &class.name_any(), &fitting) {
                    taken.insert(pv.name_any());
                    writes.push(Prebind::ClaimVolume {
                        volume: pv.name_any(),
                        namespace: ns,
                        claim: name,
                        uid: claim.uid().unwrap_or_default(),
                    });
                } else if !class.provisioner.is_empty()
                    && class.provisioner != "kubernetes.io/no-provisioner"
                {
                    writes.push(Prebind::SelectNode {
                        namespace: ns,
                        claim: name,
                        node: node_name.clone(),
                    });
                } else {
                    return Err(Misfit::NoVolumeToBind);
                }
            }
        }
    }
    Ok(writes)
}

/// Are all the pod's claims bound (PreBind's wait)?
pub fn all_bound(pod: &Pod, claims: &[&PersistentVolumeClaim]) -> bool {
    let ns = pod.namespace().unwrap_or_default();
    claim_names(pod).iter().all(|name| {
        claims.iter().any(|c| {
            c.namespace().as_deref() == Some(&ns)
                && c.name_any() == *name
                && c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
                && c.spec
                    .as_ref()
                    .and_then(|s| s.volume_name.as_deref())
                    .is_some_and(|v| !v.is_empty())
        })
    })
}
