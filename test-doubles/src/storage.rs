//! The test clusters' storage, free of I/O: the stand-in for kube-controller-manager's PV
//! controller (binder) and a hostpath provisioner (the test API server runs no controllers).
//! `fabric-test-storage` feeds [`plan`] from watches of PVCs, PVs and StorageClasses and
//! carries out its [`Action`]s; [`start`] runs that binary against an API server.
//!
//! As upstream:
//! - A PVC without `storageClassName` gets the default class (annotation
//!   [`IS_DEFAULT_CLASS`]). Upstream's DefaultStorageClass admission does this on create and
//!   the PV controller retroactively for claims made before a default existed; here the
//!   stand-in patches the claim (there is no admission plugin to do it).
//! - A claim whose class has a provisioner that is not in-tree (`kubernetes.io/*`) gets
//!   [`STORAGE_PROVISIONER`] and [`BETA_STORAGE_PROVISIONER`] when provisioning is due:
//!   at once for `Immediate` classes when no Available PV matches, for `WaitForFirstConsumer`
//!   only once the scheduler wrote [`SELECTED_NODE`]. External provisioners (the fabric's) key
//!   on them.
//! - Its own provisioner ([`PROVISIONER`]) then makes PV `pvc-<uid>`: a `hostPath` directory
//!   `<root>/<pv name>`, required node affinity `kubernetes.io/hostname In [<selected node>]`
//!   (none for `Immediate`: every test node shares the host's filesystem), the requested size,
//!   the claim's access modes and volume mode, the class's reclaim policy, a `claimRef` with the
//!   claim's uid and [`PROVISIONED_BY`].
//! - Binding, for any PV (the fabric's too): a PV whose `claimRef` names a claim and a claim whose
//!   `volumeName` names a PV are completed on both sides (`claimRef.uid`, `volumeName`,
//!   [`BIND_COMPLETED`], [`BOUND_BY_CONTROLLER`] on the side the controller filled in), phases
//!   `Bound`, the claim's status capacity and access modes those of the PV. An unbound claim of
//!   an `Immediate` class (or without class) takes the smallest `Available` PV of its class with
//!   enough capacity and every access mode it asks for.
//! - A PV whose claim (by uid) is gone is `Released`; `Delete` removes a PV of its own
//!   provisioner and its directory, `Retain` keeps both (a `Delete` PV of another provisioner
//!   is that provisioner's to delete). A claim whose PV went away after binding is `Lost`.
//!
//! Not done, as tests do not need it: volume expansion, selectors on claims, data sources,
//! `allowedTopologies`, storage capacity tracking, the `Recycle` policy.
use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use k8s_openapi::{
    api::{
        core::v1::{PersistentVolume, PersistentVolumeClaim},
        storage::v1::StorageClass,
    },
    apimachinery::pkg::api::resource::Quantity,
};
use kube::ResourceExt;
use serde_json::{Value, json};

use fabric_api::quantity::milli;

/// The test provisioner's name (a class's `provisioner`).
pub const PROVISIONER: &str = "fabric-test/hostpath";
/// The class the fixture makes, the cluster's default.
pub const DEFAULT_CLASS: &str = "standard";
pub const IS_DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
pub const STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
pub const BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
pub const BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
pub const BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
pub const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
pub const WAIT_FOR_FIRST_CONSUMER: &str = "WaitForFirstConsumer";

/// A class of the test provisioner (`standard` is [`default_class`]).
pub fn class(name: &str, binding_mode: &str, reclaim: &str, default: bool) -> Value {
    let mut c = json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": { "name": name },
        "provisioner": PROVISIONER,
        "volumeBindingMode": binding_mode,
        "reclaimPolicy": reclaim,
    });
    if default {
        c["metadata"]["annotations"] = json!({ IS_DEFAULT_CLASS: "true" });
    }
    c
}

/// The fixture's default class: `standard`, `WaitForFirstConsumer`, `Delete`.
pub fn default_class() -> Value {
    class(DEFAULT_CLASS, WAIT_FOR_FIRST_CONSUMER, "Delete", true)
}

/// One write the controller makes.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// A JSON merge patch of a claim (metadata, spec).
    PatchClaim {
        namespace: String,
        name: String,
        patch: Value,
    },
    /// A claim's status (merge patch of `status`).
    ClaimStatus {
        namespace: String,
        name: String,
        status: Value,
    },
    /// A new PV (its directory made first when it has one).
    CreateVolume {
        pv: Box<PersistentVolume>,
        dir: Option<PathBuf>,
    },
    /// A JSON merge patch of a PV (metadata, spec).
    PatchVolume { name: String, patch: Value },
    /// A PV's phase.
    VolumePhase { name: String, phase: String },
    /// Delete a PV (with the uid it was seen with) and then its directory.
    DeleteVolume {
        name: String,
        uid: String,
        dir: Option<PathBuf>,
    },
}

/// The default class: the newest of those annotated default, as upstream picks among several.
pub fn default_class_name(classes: &[&StorageClass]) -> Option<String> {
    classes
        .iter()
        .filter(|c| c.annotations().get(IS_DEFAULT_CLASS).map(String::as_str) == Some("true"))
        .max_by_key(|c| {
            (
                c.metadata.creation_timestamp.clone().map(|t| t.0),
                c.name_any(),
            )
        })
        .map(|c| c.name_any())
}

fn key(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

fn claim_key(c: &PersistentVolumeClaim) -> String {
    key(&c.namespace().unwrap_or_default(), &c.name_any())
}

fn volume_name(c: &PersistentVolumeClaim) -> &str {
    c.spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .unwrap_or_default()
}

fn claim_class(c: &PersistentVolumeClaim) -> Option<&str> {
    c.spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
}

fn volume_class(v: &PersistentVolume) -> &str {
    v.spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .unwrap_or_default()
}

/// The claim's requested storage, in thousandths (0 when absent or not a quantity).
pub fn requested(c: &PersistentVolumeClaim) -> i128 {
    request_quantity(c)
        .and_then(|q| milli(&q.0).ok())
        .unwrap_or(0)
}

fn request_quantity(c: &PersistentVolumeClaim) -> Option<&Quantity> {
    c.spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
}

fn capacity(v: &PersistentVolume) -> i128 {
    v.spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .and_then(|q| milli(&q.0).ok())
        .unwrap_or(0)
}

fn modes_of(m: Option<&Vec<String>>) -> BTreeSet<String> {
    m.into_iter().flatten().cloned().collect()
}

fn claim_modes(c: &PersistentVolumeClaim) -> BTreeSet<String> {
    modes_of(c.spec.as_ref().and_then(|s| s.access_modes.as_ref()))
}

fn volume_modes(v: &PersistentVolume) -> BTreeSet<String> {
    modes_of(v.spec.as_ref().and_then(|s| s.access_modes.as_ref()))
}

fn claim_ref(v: &PersistentVolume) -> Option<&k8s_openapi::api::core::v1::ObjectReference> {
    v.spec.as_ref().and_then(|s| s.claim_ref.as_ref())
}

fn phase_of_volume(v: &PersistentVolume) -> &str {
    v.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

fn phase_of_claim(c: &PersistentVolumeClaim) -> &str {
    c.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

fn reclaim_policy(v: &PersistentVolume) -> &str {
    v.spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        .unwrap_or("Retain")
}

/// Does `v` fit `c` for static binding (upstream's `FindMatchingVolume`, without
/// selectors): same class, not claimed by another, enough capacity, every access mode asked.
pub fn matches(c: &PersistentVolumeClaim, class: &str, v: &PersistentVolume) -> bool {
    let free = match claim_ref(v) {
        None => true,
        // Pre-bound to this claim.
        Some(r) => {
            r.namespace.as_deref() == c.namespace().as_deref()
                && r.name.as_deref() == Some(&c.name_any())
        }
    };
    let mode = |m: Option<&str>| m.unwrap_or("Filesystem").to_owned();
    free && v.metadata.deletion_timestamp.is_none()
        && matches!(phase_of_volume(v), "" | "Available" | "Pending")
        && volume_class(v) == class
        && capacity(v) >= requested(c)
        && claim_modes(c).is_subset(&volume_modes(v))
        && mode(c.spec.as_ref().and_then(|s| s.volume_mode.as_deref()))
            == mode(v.spec.as_ref().and_then(|s| s.volume_mode.as_deref()))
}

/// The smallest matching PV, by capacity then name (upstream prefers the smallest fit).
pub fn best_match<'a>(
    c: &PersistentVolumeClaim,
    class: &str,
    volumes: &[&'a PersistentVolume],
) -> Option<&'a PersistentVolume> {
    volumes
        .iter()
        .copied()
        .filter(|v| matches(c, class, v))
        .min_by_key(|v| (capacity(v), v.name_any()))
}

/// An in-tree provisioner (`kubernetes.io/...`, also `no-provisioner`) is not annotated.
fn external(provisioner: &str) -> bool {
    !provisioner.is_empty() && !provisioner.starts_with("kubernetes.io/")
}

/// The host directory of a PV (`hostPath` or `local`).
pub fn volume_dir(v: &PersistentVolume) -> Option<PathBuf> {
    let s = v.spec.as_ref()?;
    s.host_path
        .as_ref()
        .map(|h| PathBuf::from(&h.path))
        .or_else(|| s.local.as_ref().map(|l| PathBuf::from(&l.path)))
}

/// PV `pvc-<uid>` of the test provisioner for `c` (class `class`), under `root`.
pub fn provision(
    c: &PersistentVolumeClaim,
    class: &StorageClass,
    node: Option<&str>,
    root: &Path,
) -> PersistentVolume {
    let name = format!("pvc-{}", c.uid().unwrap_or_default());
    let dir = root.join(&name);
    let spec = c.spec.clone().unwrap_or_default();
    let size = request_quantity(c)
        .cloned()
        .unwrap_or_else(|| Quantity("0".into()));
    let mut pv = json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": { "name": name, "annotations": { PROVISIONED_BY: PROVISIONER } },
        "spec": {
            "capacity": { "storage": size },
            "accessModes": spec.access_modes.unwrap_or_default(),
            "volumeMode": spec.volume_mode.unwrap_or_else(|| "Filesystem".into()),
            "persistentVolumeReclaimPolicy": class.reclaim_policy.clone().unwrap_or_else(|| "Delete".into()),
            "storageClassName": class.name_any(),
            "hostPath": { "path": dir.display().to_string(), "type": "DirectoryOrCreate" },
            "claimRef": {
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "namespace": c.namespace(), "name": c.name_any(), "uid": c.uid(),
                "resourceVersion": c.resource_version(),
            },
        },
    });
    if let Some(node) = node {
        pv["spec"]["nodeAffinity"] = json!({ "required": { "nodeSelectorTerms": [
            { "matchExpressions": [{ "key": HOSTNAME_LABEL, "operator": "In", "values": [node] }] }
        ] } });
    }
    serde_json::from_value(pv).expect("a well-formed PersistentVolume")
}

/// Every write due, given all claims, volumes and classes; `root` holds the provisioner's
/// directories. Each call looks at the state afresh: writes already made show in the next
/// state and are not repeated.
pub fn plan(
    claims: &[&PersistentVolumeClaim],
    volumes: &[&PersistentVolume],
    classes: &[&StorageClass],
    root: &Path,
) -> Vec<Action> {
    let mut out = Vec::new();
    let default = default_class_name(classes);
    let class_of = |name: &str| classes.iter().copied().find(|c| c.name_any() == name);
    let by_key: BTreeMap<String, &PersistentVolumeClaim> =
        claims.iter().map(|c| (claim_key(c), *c)).collect();
    let by_name: BTreeMap<String, &PersistentVolume> =
        volumes.iter().map(|v| (v.name_any(), *v)).collect();
    // Volumes given to a claim in this pass, so two claims do not take the same one.
    let mut taken: BTreeSet<String> = BTreeSet::new();

    for v in volumes {
        let name = v.name_any();
        if v.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(r) = claim_ref(v) else {
            if phase_of_volume(v) != "Available" {
                out.push(Action::VolumePhase {
                    name,
                    phase: "Available".into(),
                });
            }
            continue;
        };
        let claim = by_key
            .get(&key(
                r.namespace.as_deref().unwrap_or_default(),
                r.name.as_deref().unwrap_or_default(),
            ))
            .copied();
        let want_uid = r.uid.as_deref().unwrap_or_default();
        let claim = claim.filter(|c| want_uid.is_empty() || c.uid().as_deref() == Some(want_uid));
        let Some(claim) = claim else {
            if want_uid.is_empty() {
                // Pre-bound to a claim that does not exist yet.
                if phase_of_volume(v) != "Available" {
                    out.push(Action::VolumePhase {
                        name,
                        phase: "Available".into(),
                    });
                }
                continue;
            }
            // Its claim is gone: released, then reclaimed.
            let ours = v.annotations().get(PROVISIONED_BY).map(String::as_str) == Some(PROVISIONER);
            if reclaim_policy(v) == "Delete" && ours {
                out.push(Action::DeleteVolume {
                    name,
                    uid: v.uid().unwrap_or_default(),
                    dir: volume_dir(v),
                });
            } else if phase_of_volume(v) != "Released" {
                out.push(Action::VolumePhase {
                    name,
                    phase: "Released".into(),
                });
            }
            continue;
        };
        taken.insert(name.clone());
        let bound_to = volume_name(claim);
        if !bound_to.is_empty() && bound_to != name {
            // The claim is bound to another volume: this one waits (upstream unbinds it only
            // when the controller had bound it).
            continue;
        }
        if want_uid.is_empty() {
            out.push(Action::PatchVolume {
                name: name.clone(),
                patch: json!({ "spec": { "claimRef": { "uid": claim.uid() } } }),
            });
        }
        bind_claim(claim, v, bound_to.is_empty(), &mut out);
        if phase_of_volume(v) != "Bound" {
            out.push(Action::VolumePhase {
                name,
                phase: "Bound".into(),
            });
        }
    }

    for c in claims {
        if c.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let (ns, name) = (c.namespace().unwrap_or_default(), c.name_any());
        let bound_to = volume_name(c);
        if !bound_to.is_empty() {
            match by_name.get(bound_to) {
                // Bound from the PV's side above when its claimRef names this claim.
                Some(v) if claim_ref(v).is_some() => {}
                Some(v) => {
                    // The claim names a volume with no claimRef: the controller claims it.
                    out.push(Action::PatchVolume {
                        name: bound_to.to_owned(),
                        patch: claim_volume(&ns, &name, &c.uid().unwrap_or_default()),
                    });
                    bind_claim(c, v, false, &mut out);
                    out.push(Action::VolumePhase {
                        name: bound_to.to_owned(),
                        phase: "Bound".into(),
                    });
                }
                None => {
                    let phase = if phase_of_claim(c) == "Bound" || phase_of_claim(c) == "Lost" {
                        "Lost"
                    } else {
                        "Pending"
                    };
                    pending(c, phase, &mut out);
                }
            }
            continue;
        }
        if volumes
            .iter()
            .any(|v| by_key_ref(v).as_deref() == Some(&claim_key(c)) && claim_matches_uid(v, c))
        {
            // A PV names this claim: bound from the PV's side above.
            continue;
        }
        let Some(class_name) = claim_class(c).map(str::to_owned).or(default.clone()) else {
            pending(c, "Pending", &mut out);
            continue;
        };
        if claim_class(c).is_none() {
            out.push(Action::PatchClaim {
                namespace: ns.clone(),
                name: name.clone(),
                patch: json!({ "spec": { "storageClassName": class_name } }),
            });
        }
        pending(c, "Pending", &mut out);
        let class = class_of(&class_name);
        let delayed =
            class.and_then(|k| k.volume_binding_mode.as_deref()) == Some(WAIT_FOR_FIRST_CONSUMER);
        let selected = c.annotations().get(SELECTED_NODE).cloned();
        if delayed && selected.is_none() {
            // The scheduler chooses (a matching PV or provisioning) with the first consumer.
            continue;
        }
        if !delayed {
            let free: Vec<&PersistentVolume> = volumes
                .iter()
                .copied()
                .filter(|v| !taken.contains(&v.name_any()))
                .collect();
            if let Some(v) = best_match(c, &class_name, &free) {
                taken.insert(v.name_any());
                out.push(Action::PatchVolume {
                    name: v.name_any(),
                    patch: claim_volume(&ns, &name, &c.uid().unwrap_or_default()),
                });
                continue;
            }
        }
        let Some(class) = class else { continue };
        if !external(&class.provisioner) {
            continue;
        }
        let anns = c.annotations();
        if anns.get(STORAGE_PROVISIONER) != Some(&class.provisioner)
            || anns.get(BETA_STORAGE_PROVISIONER) != Some(&class.provisioner)
        {
            out.push(Action::PatchClaim {
                namespace: ns.clone(),
                name: name.clone(),
                patch: json!({ "metadata": { "annotations": {
                    STORAGE_PROVISIONER: class.provisioner,
                    BETA_STORAGE_PROVISIONER: class.provisioner,
                } } }),
            });
        }
        if class.provisioner == PROVISIONER {
            let pv = provision(c, class, selected.as_deref().filter(|_| delayed), root);
            if !by_name.contains_key(&pv.name_any()) {
                let dir = volume_dir(&pv);
                out.push(Action::CreateVolume {
                    pv: Box::new(pv),
                    dir,
                });
            }
        }
    }
    out
}

/// The merge patch by which a controller binds a PV to a claim: its `claimRef` (with the
/// claim's uid) and [`BOUND_BY_CONTROLLER`].
pub fn claim_volume(namespace: &str, claim: &str, uid: &str) -> Value {
    json!({
        "metadata": { "annotations": { BOUND_BY_CONTROLLER: "yes" } },
        "spec": { "claimRef": {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "namespace": namespace, "name": claim, "uid": uid,
        } },
    })
}

fn by_key_ref(v: &PersistentVolume) -> Option<String> {
    claim_ref(v).map(|r| {
        key(
            r.namespace.as_deref().unwrap_or_default(),
            r.name.as_deref().unwrap_or_default(),
        )
    })
}

fn claim_matches_uid(v: &PersistentVolume, c: &PersistentVolumeClaim) -> bool {
    let uid = claim_ref(v)
        .and_then(|r| r.uid.as_deref())
        .unwrap_or_default();
    uid.is_empty() || c.uid().as_deref() == Some(uid)
}

fn pending(c: &PersistentVolumeClaim, phase: &str, out: &mut Vec<Action>) {
    if phase_of_claim(c) != phase {
        out.push(Action::ClaimStatus {
            namespace: c.namespace().unwrap_or_default(),
            name: c.name_any(),
            status: json!({ "phase": phase }),
        });
    }
}

/// The claim's side of a binding to `v`: `volumeName` (when the controller fills it in, with
/// [`BOUND_BY_CONTROLLER`]), [`BIND_COMPLETED`], status `Bound` with the PV's capacity and
/// access modes.
fn bind_claim(
    c: &PersistentVolumeClaim,
    v: &PersistentVolume,
    set_name: bool,
    out: &mut Vec<Action>,
) {
    let (ns, name) = (c.namespace().unwrap_or_default(), c.name_any());
    let anns = c.annotations();
    let mut annotations = serde_json::Map::new();
    if anns.get(BIND_COMPLETED).map(String::as_str) != Some("yes") {
        annotations.insert(BIND_COMPLETED.into(), "yes".into());
    }
    if set_name {
        annotations.insert(BOUND_BY_CONTROLLER.into(), "yes".into());
    }
    if set_name || !annotations.is_empty() {
        let mut patch = json!({ "metadata": { "annotations": annotations } });
        if set_name {
            patch["spec"] = json!({ "volumeName": v.name_any() });
        }
        out.push(Action::PatchClaim {
            namespace: ns.clone(),
            name: name.clone(),
            patch,
        });
    }
    let spec = v.spec.clone().unwrap_or_default();
    let status = json!({
        "phase": "Bound",
        "capacity": spec.capacity.unwrap_or_default(),
        "accessModes": spec.access_modes.unwrap_or_default(),
    });
    let now = c.status.as_ref();
    let same = now.and_then(|s| s.phase.as_deref()) == Some("Bound")
        && serde_json::to_value(now.and_then(|s| s.capacity.clone()).unwrap_or_default()).ok()
            == Some(status["capacity"].clone())
        && serde_json::to_value(now.and_then(|s| s.access_modes.clone()).unwrap_or_default()).ok()
            == Some(status["accessModes"].clone());
    if !same {
        out.push(Action::ClaimStatus {
            namespace: ns,
            name,
            status,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(v: Value) -> PersistentVolumeClaim {
        let mut base = json!({
            "metadata": { "name": "data", "namespace": "app", "uid": "u1" },
            "spec": { "accessModes": ["ReadWriteOnce"],
                      "resources": { "requests": { "storage": "1Gi" } } },
        });
        merge(&mut base, v);
        serde_json::from_value(base).unwrap()
    }

    fn volume(v: Value) -> PersistentVolume {
        let mut base = json!({
            "metadata": { "name": "pv1", "uid": "v1" },
            "spec": { "accessModes": ["ReadWriteOnce"], "capacity": { "storage": "2Gi" },
                      "storageClassName": "manual", "hostPath": { "path": "/srv/pv1" } },
            "status": { "phase": "Available" },
        });
        merge(&mut base, v);
        serde_json::from_value(base).unwrap()
    }

    fn sc(v: Value) -> StorageClass {
        serde_json::from_value(v).unwrap()
    }

    fn merge(a: &mut Value, b: Value) {
        match (a, b) {
            (Value::Object(a), Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn run(c: &[PersistentVolumeClaim], v: &[PersistentVolume], k: &[StorageClass]) -> Vec<Action> {
        plan(
            &c.iter().collect::<Vec<_>>(),
            &v.iter().collect::<Vec<_>>(),
            &k.iter().collect::<Vec<_>>(),
            Path::new("/root"),
        )
    }

    fn claim_patches(a: &[Action]) -> Vec<Value> {
        a.iter()
            .filter_map(|a| match a {
                Action::PatchClaim { patch, .. } => Some(patch.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_claim_without_class_gets_the_default_and_waits_for_its_consumer() {
        let a = run(&[claim(json!({}))], &[], &[sc(default_class())]);
        assert_eq!(
            claim_patches(&a),
            vec![json!({ "spec": { "storageClassName": "standard" } })]
        );
        assert!(a.contains(&Action::ClaimStatus {
            namespace: "app".into(),
            name: "data".into(),
            status: json!({ "phase": "Pending" }),
        }));
        // Neither annotated nor provisioned before the scheduler selects a node.
        assert!(!a.iter().any(|a| matches!(a, Action::CreateVolume { .. })));
    }

    #[test]
    fn a_selected_node_gets_the_provisioner_annotations_and_a_pinned_hostpath_volume() {
        let c = claim(
            json!({ "metadata": { "annotations": { SELECTED_NODE: "node-b" } },
                              "spec": { "storageClassName": "standard" } }),
        );
        let a = run(&[c], &[], &[sc(default_class())]);
        assert_eq!(
            claim_patches(&a),
            vec![json!({ "metadata": { "annotations": {
                STORAGE_PROVISIONER: PROVISIONER, BETA_STORAGE_PROVISIONER: PROVISIONER } } })]
        );
        let (pv, dir) = a
            .iter()
            .find_map(|a| match a {
                Action::CreateVolume { pv, dir } => Some((pv.clone(), dir.clone())),
                _ => None,
            })
            .unwrap();
        assert_eq!(dir, Some(PathBuf::from("/root/pvc-u1")));
        let pv = serde_json::to_value(&pv).unwrap();
        assert_eq!(pv["metadata"]["name"], "pvc-u1");
        assert_eq!(pv["metadata"]["annotations"][PROVISIONED_BY], PROVISIONER);
        assert_eq!(pv["spec"]["capacity"]["storage"], "1Gi");
        assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Delete");
        assert_eq!(pv["spec"]["claimRef"]["uid"], "u1");
        assert_eq!(pv["spec"]["hostPath"]["path"], "/root/pvc-u1");
        assert_eq!(
            pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0],
            json!({ "key": HOSTNAME_LABEL, "operator": "In", "values": ["node-b"] })
        );
    }

    #[test]
    fn another_provisioner_is_annotated_but_not_provisioned() {
        let fabric = sc(
            json!({ "metadata": { "name": "fabric" }, "provisioner": "fabric.io/storage",
                                "volumeBindingMode": WAIT_FOR_FIRST_CONSUMER }),
        );
        let c = claim(
            json!({ "metadata": { "annotations": { SELECTED_NODE: "virtual" } },
                              "spec": { "storageClassName": "fabric" } }),
        );
        let a = run(&[c], &[], &[fabric]);
        assert_eq!(
            claim_patches(&a),
            vec![json!({ "metadata": { "annotations": {
                STORAGE_PROVISIONER: "fabric.io/storage",
                BETA_STORAGE_PROVISIONER: "fabric.io/storage" } } })]
        );
        assert!(!a.iter().any(|a| matches!(a, Action::CreateVolume { .. })));
    }

    #[test]
    fn immediate_takes_the_smallest_fitting_volume_or_provisions_unpinned() {
        let imm = sc(class("fast", "Immediate", "Retain", false));
        let c = claim(json!({ "spec": { "storageClassName": "fast" } }));
        let small = volume(json!({ "metadata": { "name": "small" },
            "spec": { "storageClassName": "fast", "capacity": { "storage": "512Mi" } } }));
        let fits = volume(json!({ "metadata": { "name": "fits" },
            "spec": { "storageClassName": "fast", "capacity": { "storage": "1Gi" } } }));
        let big = volume(json!({ "metadata": { "name": "big" },
            "spec": { "storageClassName": "fast", "capacity": { "storage": "10Gi" } } }));
        let rwx = volume(json!({ "metadata": { "name": "other-class" } }));
        let a = run(
            std::slice::from_ref(&c),
            &[big, fits, small, rwx],
            std::slice::from_ref(&imm),
        );
        let claimed: Vec<&str> = a
            .iter()
            .filter_map(|a| match a {
                Action::PatchVolume { name, .. } => Some(name.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(claimed, vec!["fits"]);
        let a = run(&[c], &[], &[imm]);
        let pv = a
            .iter()
            .find_map(|a| match a {
                Action::CreateVolume { pv, .. } => Some(serde_json::to_value(pv).unwrap()),
                _ => None,
            })
            .unwrap();
        assert_eq!(pv["spec"]["nodeAffinity"], Value::Null);
        assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Retain");
    }

    #[test]
    fn access_modes_must_all_be_offered() {
        let c = claim(json!({ "spec": { "accessModes": ["ReadWriteMany"] } }));
        assert!(!matches(&c, "manual", &volume(json!({}))));
        let v = volume(json!({ "spec": { "accessModes": ["ReadWriteOnce", "ReadWriteMany"] } }));
        assert!(matches(&c, "manual", &v));
        let c = claim(json!({ "spec": { "resources": { "requests": { "storage": "3Gi" } } } }));
        assert!(!matches(&c, "manual", &v));
    }

    #[test]
    fn a_claim_ref_is_completed_on_both_sides() {
        // As the fabric's provisioner writes it: claimRef with uid, the claim not yet told.
        let c = claim(json!({ "spec": { "storageClassName": "manual" } }));
        let v = volume(
            json!({ "spec": { "claimRef": { "namespace": "app", "name": "data", "uid": "u1" } },
                               "status": { "phase": "Pending" } }),
        );
        let a = run(&[c], &[v], &[]);
        assert!(a.contains(&Action::PatchClaim {
            namespace: "app".into(),
            name: "data".into(),
            patch: json!({ "metadata": { "annotations": { BIND_COMPLETED: "yes", BOUND_BY_CONTROLLER: "yes" } },
                           "spec": { "volumeName": "pv1" } }),
        }));
        assert!(a.contains(&Action::ClaimStatus {
            namespace: "app".into(),
            name: "data".into(),
            status: json!({ "phase": "Bound", "capacity": { "storage": "2Gi" },
                            "accessModes": ["ReadWriteOnce"] }),
        }));
        assert!(a.contains(&Action::VolumePhase {
            name: "pv1".into(),
            phase: "Bound".into()
        }));
        // A claimRef without uid gets it.
        let c = claim(json!({ "spec": { "storageClassName": "manual" } }));
        let v = volume(json!({ "spec": { "claimRef": { "namespace": "app", "name": "data" } } }));
        let a = run(&[c], &[v], &[]);
        assert!(a.contains(&Action::PatchVolume {
            name: "pv1".into(),
            patch: json!({ "spec": { "claimRef": { "uid": "u1" } } }),
        }));
    }

    #[test]
    fn a_volume_name_is_completed_on_the_volume() {
        let c = claim(json!({ "spec": { "storageClassName": "manual", "volumeName": "pv1" } }));
        let a = run(&[c], &[volume(json!({}))], &[]);
        let Some(Action::PatchVolume { patch, .. }) =
            a.iter().find(|a| matches!(a, Action::PatchVolume { .. }))
        else {
            panic!("{a:?}")
        };
        assert_eq!(patch["spec"]["claimRef"]["uid"], "u1");
        assert_eq!(patch["metadata"]["annotations"][BOUND_BY_CONTROLLER], "yes");
        // The claim: bind-completed, but volumeName was the user's (no bound-by-controller).
        assert!(a.contains(&Action::PatchClaim {
            namespace: "app".into(),
            name: "data".into(),
            patch: json!({ "metadata": { "annotations": { BIND_COMPLETED: "yes" } } }),
        }));
    }

    #[test]
    fn a_bound_pair_needs_no_write() {
        let c = claim(json!({
            "metadata": { "annotations": { BIND_COMPLETED: "yes" } },
            "spec": { "storageClassName": "manual", "volumeName": "pv1" },
            "status": { "phase": "Bound", "capacity": { "storage": "2Gi" }, "accessModes": ["ReadWriteOnce"] },
        }));
        let v = volume(
            json!({ "spec": { "claimRef": { "namespace": "app", "name": "data", "uid": "u1" } },
                               "status": { "phase": "Bound" } }),
        );
        assert_eq!(run(&[c], &[v], &[]), vec![]);
    }

    #[test]
    fn a_gone_claim_releases_and_reclaims_only_its_own_deletable_volumes() {
        let bound = json!({ "spec": { "claimRef": { "namespace": "app", "name": "data", "uid": "u1" } },
                            "status": { "phase": "Bound" } });
        let mut ours = volume(bound.clone());
        ours.metadata.annotations = Some([(PROVISIONED_BY.into(), PROVISIONER.into())].into());
        ours.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some("Delete".into());
        assert_eq!(
            run(&[], &[ours.clone()], &[]),
            vec![Action::DeleteVolume {
                name: "pv1".into(),
                uid: "v1".into(),
                dir: Some("/srv/pv1".into())
            }]
        );
        // A new claim of the same name (another uid) does not take it back.
        let again =
            claim(json!({ "metadata": { "uid": "u2" }, "spec": { "storageClassName": "x" } }));
        assert!(
            run(&[again], &[ours.clone()], &[])
                .iter()
                .any(|a| matches!(a, Action::DeleteVolume { .. }))
        );
        ours.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some("Retain".into());
        assert_eq!(
            run(&[], &[ours.clone()], &[]),
            vec![Action::VolumePhase {
                name: "pv1".into(),
                phase: "Released".into()
            }]
        );
        // Another provisioner's Delete volume is that provisioner's to delete.
        let mut theirs = volume(bound);
        theirs
            .spec
            .as_mut()
            .unwrap()
            .persistent_volume_reclaim_policy = Some("Delete".into());
        assert_eq!(
            run(&[], &[theirs], &[]),
            vec![Action::VolumePhase {
                name: "pv1".into(),
                phase: "Released".into()
            }]
        );
    }

    #[test]
    fn a_claim_whose_volume_vanished_is_lost() {
        let c = claim(json!({ "spec": { "volumeName": "gone" }, "status": { "phase": "Bound" } }));
        assert_eq!(
            run(&[c], &[], &[]),
            vec![Action::ClaimStatus {
                namespace: "app".into(),
                name: "data".into(),
                status: json!({ "phase": "Lost" })
            }]
        );
    }

    #[test]
    fn the_newest_default_class_wins() {
        let mut old = sc(class("old", "Immediate", "Delete", true));
        old.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2020-01-01T00:00:00Z".parse().unwrap(),
            ));
        let mut new = sc(class("new", "Immediate", "Delete", true));
        new.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2024-01-01T00:00:00Z".parse().unwrap(),
            ));
        let plain = sc(class("plain", "Immediate", "Delete", false));
        assert_eq!(
            default_class_name(&[&old, &new, &plain]),
            Some("new".into())
        );
        assert_eq!(default_class_name(&[&plain]), None);
    }
}
