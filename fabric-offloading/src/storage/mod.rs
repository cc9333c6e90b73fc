//! The storage fabric's real-node path (issue 21), pure; [`controller`] carries it out.
//!
//! A claim of the virtual class ([`storage::CLASS`]) whose first consumer the scheduler placed
//! on a **real** node ([`SELECTED_NODE`] names a Node that is not a virtual node) is provisioned
//! here, as Liqo's storage fabric does it:
//! 1. a **real claim** in the fabric's storage namespace, named after the home claim's UID
//!    ([`real_name`]): the configured real class (none: the cluster's default class), the home
//!    claim's access modes, size and volume mode, and the same selected node, so that a
//!    `WaitForFirstConsumer` class provisions it where the consumer runs (nothing ever mounts
//!    the real claim itself);
//! 2. once it is bound, the **virtual volume** `pvc-<home uid>`, bound to the home claim: the
//!    virtual class, provisioned by [`storage::PROVISIONER`], the real volume's source (the
//!    pod mounts the real volume directly) and its node affinity, each term with
//!    `fabric.io/type NotIn [virtual-node]` added so that no later consumer lands on a virtual
//!    node, where that volume cannot be;
//! 3. the home claim's `spec.volumeName`.
//!
//! A finalizer ([`FINALIZER`]) on the home claim: deleted, its virtual volume goes, then its
//! real claim (UID-preconditioned), whose volume the real class's reclaim policy then
//! deletes or keeps, then the finalizer.
//!
//! **Handed over** (`fabricctl move volume --to local`): a real claim labelled for a home
//! claim's namespace and name with an empty [`HOME_UID`] was filled by a move and is the data
//! of the next claim of that name: that claim, once its first consumer is placed on a real
//! node, adopts it ([`Step::Adopt`]: its UID written into the label) instead of getting a new
//! one. Only the fabric writes in the storage namespace, so nothing else can hand a claim
//! another's data.
//!
//! Not done: changes after provisioning (an expansion) are not followed, as the virtual-node
//! path's.
use std::collections::BTreeMap;

use fabric_api::names::{
    label,
    storage::{self, PROVISIONED_BY, SELECTED_NODE},
};
use k8s_openapi::api::core::v1::{
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectReference, PersistentVolume,
    PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeNodeAffinity,
    VolumeResourceRequirements,
};
use kube::api::ObjectMeta;

pub mod controller;

/// The finalizer on a home claim provisioned on a real node: its virtual volume and real
/// claim go before it.
pub const FINALIZER: &str = "storage.fabric.io/real-claim";
/// Labels of a real claim: the home claim it stands for (namespace, name; for people and
/// for the watch that maps it back) and its UID (a home claim of the same name made again is
/// another claim), shared with `fabricctl move volume`.
pub use fabric_api::names::storage::{HOME_NAME, HOME_NAMESPACE, HOME_UID};

/// The real claim of the home claim `uid`.
pub fn real_name(uid: &str) -> String {
    format!("home-{uid}")
}

/// What the provisioner knows of the selected node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Node {
    /// Not (yet) seen: nothing is done before it is.
    Unknown,
    /// A virtual node: its virtual kubelet provisions on the provider.
    Virtual,
    Real,
}

/// Whether a Node is a virtual node (the fabric's label).
pub fn node_kind(node: Option<&k8s_openapi::api::core::v1::Node>) -> Node {
    match node {
        None => Node::Unknown,
        Some(n) => {
            let virtual_node = n
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(label::NODE_TYPE))
                .is_some_and(|t| t == label::VIRTUAL_NODE_TYPE);
            if virtual_node {
                Node::Virtual
            } else {
                Node::Real
            }
        }
    }
}

/// What to do about one home claim.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Not ours to provision, or nothing to change now (waiting for a watch event).
    Nothing,
    /// The finalizer, then the real claim.
    CreateReal(Box<PersistentVolumeClaim>),
    /// The finalizer, then the real claim of this name, handed over to this claim by a move,
    /// labelled as this claim's.
    Adopt(String),
    /// The real claim is there and not bound yet: its volume's binding is a watch event.
    WaitForReal,
    /// The real claim is bound to `real`: the virtual volume, then the home claim's
    /// `volumeName`.
    Bind(Box<PersistentVolume>),
    /// The home claim is going: its virtual volume and real claim (`Some((name, uid))`: if
    /// seen), then the finalizer.
    Release { real: Option<(String, String)> },
}

fn annotation<'a>(pvc: &'a PersistentVolumeClaim, key: &str) -> Option<&'a str> {
    pvc.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

fn label_of<'a>(pvc: &'a PersistentVolumeClaim, key: &str) -> Option<&'a str> {
    pvc.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

fn finalized(pvc: &PersistentVolumeClaim) -> bool {
    pvc.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER)
}

/// Whether `real` is the real claim made for `home` (not for an earlier claim of that name).
pub fn made_for(real: &PersistentVolumeClaim, home: &PersistentVolumeClaim) -> bool {
    label_of(real, HOME_UID).is_some_and(|u| !u.is_empty())
        && label_of(real, HOME_UID) == home.metadata.uid.as_deref()
}

/// Whether `real` is handed over to the next claim of `home`'s namespace and name (see the
/// module).
pub fn handed_over_to(real: &PersistentVolumeClaim, home: &PersistentVolumeClaim) -> bool {
    label_of(real, HOME_UID) == Some("")
        && label_of(real, HOME_NAMESPACE) == home.metadata.namespace.as_deref()
        && label_of(real, HOME_NAME) == home.metadata.name.as_deref()
}

/// The real claim of `home` among `reals`: the one made for it, else one handed over to it.
pub fn real_of<'a>(
    home: &PersistentVolumeClaim,
    reals: impl IntoIterator<Item = &'a PersistentVolumeClaim> + Clone,
) -> Option<&'a PersistentVolumeClaim> {
    reals
        .clone()
        .into_iter()
        .find(|r| made_for(r, home))
        .or_else(|| reals.into_iter().find(|r| handed_over_to(r, home)))
}

/// The real claim of `home`: in `namespace`, of `class` (`None`: the default class), the same
/// selected node.
pub fn real_claim(
    home: &PersistentVolumeClaim,
    node: &str,
    class: Option<&str>,
    namespace: &str,
) -> PersistentVolumeClaim {
    let s = home.spec.clone().unwrap_or_default();
    let uid = home.metadata.uid.clone().unwrap_or_default();
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(real_name(&uid)),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([
                (
                    HOME_NAMESPACE.to_owned(),
                    home.metadata.namespace.clone().unwrap_or_default(),
                ),
                (
                    HOME_NAME.to_owned(),
                    home.metadata.name.clone().unwrap_or_default(),
                ),
                (HOME_UID.to_owned(), uid),
            ])),
            annotations: Some(BTreeMap::from([(
                SELECTED_NODE.to_owned(),
                node.to_owned(),
            )])),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: s.access_modes.clone(),
            resources: s.resources.as_ref().map(|r| VolumeResourceRequirements {
                requests: r.requests.clone(),
                limits: r.limits.clone(),
            }),
            volume_mode: s.volume_mode.clone(),
            storage_class_name: class.map(str::to_owned),
            ..Default::default()
        }),
        status: None,
    }
}

/// The requirement every term of a virtual volume gets: not on a virtual node.
fn off_virtual_nodes() -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: label::NODE_TYPE.to_owned(),
        operator: "NotIn".to_owned(),
        values: Some(vec![label::VIRTUAL_NODE_TYPE.to_owned()]),
    }
}

/// The virtual volume of `home` over the real volume `real` (see the module): its source,
/// capacity, mount options and node affinity (terms ORed, so the requirement goes into each),
/// bound to `home`, of the virtual `class`.
pub fn virtual_volume(
    home: &PersistentVolumeClaim,
    real: &PersistentVolume,
    class: &str,
) -> PersistentVolume {
    let s = home.spec.clone().unwrap_or_default();
    let uid = home.metadata.uid.clone().unwrap_or_default();
    let mut spec = real.spec.clone().unwrap_or_default();
    let mut terms = spec
        .node_affinity
        .take()
        .and_then(|a| a.required)
        .map(|r| r.node_selector_terms)
        .unwrap_or_default();
    if terms.is_empty() {
        terms.push(NodeSelectorTerm::default());
    }
    for t in &mut terms {
        t.match_expressions
            .get_or_insert_with(Vec::new)
            .push(off_virtual_nodes());
    }
    spec.node_affinity = Some(VolumeNodeAffinity {
        required: Some(NodeSelector {
            node_selector_terms: terms,
        }),
    });
    spec.access_modes = s.access_modes.clone().or(spec.access_modes);
    spec.volume_mode = s.volume_mode.clone().or(spec.volume_mode);
    spec.storage_class_name = Some(class.to_owned());
    spec.persistent_volume_reclaim_policy = Some("Delete".to_owned());
    spec.claim_ref = Some(ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("PersistentVolumeClaim".to_owned()),
        namespace: home.metadata.namespace.clone(),
        name: home.metadata.name.clone(),
        uid: Some(uid.clone()),
        ..Default::default()
    });
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(storage::volume_name(&uid)),
            annotations: Some(BTreeMap::from([(
                PROVISIONED_BY.to_owned(),
                storage::PROVISIONER.to_owned(),
            )])),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// The provisioner's settings.
#[derive(Debug, Clone)]
pub struct Provisioner {
    /// The virtual StorageClass.
    pub class: String,
    /// The class of the real claims (`None`: the cluster's default).
    pub real_class: Option<String>,
    /// Where the real claims are.
    pub namespace: String,
}

impl Provisioner {
    /// What to do about `home`, given its selected node's kind, its real claim (by name, if
    /// seen) and that claim's volume (if bound and seen).
    pub fn decide(
        &self,
        home: &PersistentVolumeClaim,
        node: Node,
        real: Option<&PersistentVolumeClaim>,
        real_volume: Option<&PersistentVolume>,
    ) -> Step {
        let s = home.spec.clone().unwrap_or_default();
        if s.storage_class_name.as_deref() != Some(self.class.as_str()) {
            return Step::Nothing;
        }
        let handed = real.filter(|r| handed_over_to(r, home));
        let real = real.filter(|r| made_for(r, home));
        if home.metadata.deletion_timestamp.is_some() {
            if !finalized(home) {
                return Step::Nothing;
            }
            return Step::Release {
                real: real.and_then(|r| Some((r.metadata.name.clone()?, r.metadata.uid.clone()?))),
            };
        }
        if s.volume_name.as_deref().is_some_and(|v| !v.is_empty()) {
            // Provisioned (by us, by a virtual kubelet, or bound by someone else).
            return Step::Nothing;
        }
        let Some(selected) = annotation(home, SELECTED_NODE) else {
            return Step::Nothing;
        };
        if node != Node::Real {
            return Step::Nothing;
        }
        let Some(real) = real else {
            if let Some(h) = handed.and_then(|h| h.metadata.name.clone()) {
                return Step::Adopt(h);
            }
            return Step::CreateReal(Box::new(real_claim(
                home,
                selected,
                self.real_class.as_deref(),
                &self.namespace,
            )));
        };
        let bound_to = real
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .filter(|v| !v.is_empty());
        match (bound_to, real_volume) {
            (Some(v), Some(pv)) if pv.metadata.name.as_deref() == Some(v) => {
                Step::Bind(Box::new(virtual_volume(home, pv, &self.class)))
            }
            _ => Step::WaitForReal,
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Node as KNode;
    use serde_json::json;

    use super::*;

    fn provisioner() -> Provisioner {
        Provisioner {
            class: storage::CLASS.into(),
            real_class: Some("standard".into()),
            namespace: "fabric-storage".into(),
        }
    }

    fn home(extra: serde_json::Value) -> PersistentVolumeClaim {
        let mut v = json!({
            "metadata": {"name": "data", "namespace": "shop", "uid": "u1",
                         "annotations": {SELECTED_NODE: "node-a"}},
            "spec": {"storageClassName": "fabric", "accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "1Gi"}}},
        });
        if let (Some(a), serde_json::Value::Object(b)) = (v.as_object_mut(), extra) {
            for (k, e) in b {
                match (a.get_mut(&k), e) {
                    (Some(serde_json::Value::Object(x)), serde_json::Value::Object(y)) => {
                        x.extend(y)
                    }
                    (_, e) => {
                        a.insert(k, e);
                    }
                }
            }
        }
        serde_json::from_value(v).unwrap()
    }

    fn real_pv(affinity: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": "pvc-r1"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "hostPath": {"path": "/var/lib/x/pvc-r1"}, "storageClassName": "standard",
                     "persistentVolumeReclaimPolicy": "Delete", "nodeAffinity": affinity,
                     "claimRef": {"namespace": "fabric-storage", "name": "home-u1", "uid": "r1"}},
        }))
        .unwrap()
    }

    fn bound(mut real: PersistentVolumeClaim, pv: &str) -> PersistentVolumeClaim {
        real.metadata.uid = Some("r1".into());
        real.spec.as_mut().unwrap().volume_name = Some(pv.into());
        real
    }

    #[test]
    fn a_claim_on_a_real_node_gets_a_real_claim_of_the_real_class_on_that_node() {
        let h = home(json!({}));
        let Step::CreateReal(r) = provisioner().decide(&h, Node::Real, None, None) else {
            panic!("no real claim");
        };
        assert_eq!(r.metadata.name.as_deref(), Some("home-u1"));
        assert_eq!(r.metadata.namespace.as_deref(), Some("fabric-storage"));
        assert_eq!(annotation(&r, SELECTED_NODE), Some("node-a"));
        assert_eq!(label_of(&r, HOME_UID), Some("u1"));
        let s = r.spec.unwrap();
        assert_eq!(s.storage_class_name.as_deref(), Some("standard"));
        assert_eq!(s.access_modes, Some(vec!["ReadWriteOnce".to_owned()]));
        assert_eq!(
            s.resources.unwrap().requests.unwrap()["storage"].0,
            "1Gi".to_owned()
        );
        // No real class configured: the cluster's default (no class named).
        let p = Provisioner {
            real_class: None,
            ..provisioner()
        };
        let Step::CreateReal(r) = p.decide(&h, Node::Real, None, None) else {
            panic!("no real claim");
        };
        assert_eq!(r.spec.unwrap().storage_class_name, None);
    }

    #[test]
    fn virtual_nodes_unknown_nodes_other_classes_and_bound_claims_are_left_alone() {
        let p = provisioner();
        let h = home(json!({}));
        assert_eq!(p.decide(&h, Node::Virtual, None, None), Step::Nothing);
        assert_eq!(p.decide(&h, Node::Unknown, None, None), Step::Nothing);
        let other = home(json!({"spec": {"storageClassName": "standard"}}));
        assert_eq!(p.decide(&other, Node::Real, None, None), Step::Nothing);
        let unscheduled = home(json!({"metadata": {"annotations": {}}}));
        assert_eq!(
            p.decide(&unscheduled, Node::Real, None, None),
            Step::Nothing
        );
        let done = home(json!({"spec": {"volumeName": "pvc-u1"}}));
        assert_eq!(p.decide(&done, Node::Real, None, None), Step::Nothing);
    }

    #[test]
    fn the_virtual_volume_carries_the_real_source_and_stays_off_virtual_nodes() {
        let p = provisioner();
        let h = home(json!({}));
        let real = real_claim(&h, "node-a", Some("standard"), "fabric-storage");
        assert_eq!(
            p.decide(&h, Node::Real, Some(&real), None),
            Step::WaitForReal
        );
        let real = bound(real, "pvc-r1");
        let affinity = json!({"required": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-a"]}]},
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]},
        ]}});
        let pv = real_pv(affinity);
        // The real claim's volume not seen yet (or another one): wait.
        let mut other = pv.clone();
        other.metadata.name = Some("pvc-other".into());
        assert_eq!(
            p.decide(&h, Node::Real, Some(&real), Some(&other)),
            Step::WaitForReal
        );
        let Step::Bind(v) = p.decide(&h, Node::Real, Some(&real), Some(&pv)) else {
            panic!("not bound");
        };
        assert_eq!(v.metadata.name.as_deref(), Some("pvc-u1"));
        assert_eq!(
            v.metadata.annotations.as_ref().unwrap()[PROVISIONED_BY],
            storage::PROVISIONER
        );
        let s = v.spec.unwrap();
        assert_eq!(s.storage_class_name.as_deref(), Some("fabric"));
        assert_eq!(
            s.host_path.unwrap().path,
            "/var/lib/x/pvc-r1",
            "the real volume's source"
        );
        let claim = s.claim_ref.unwrap();
        assert_eq!(
            (
                claim.namespace.as_deref(),
                claim.name.as_deref(),
                claim.uid.as_deref()
            ),
            (Some("shop"), Some("data"), Some("u1"))
        );
        let terms = s
            .node_affinity
            .unwrap()
            .required
            .unwrap()
            .node_selector_terms;
        assert_eq!(terms.len(), 2, "the real volume's terms, still ORed");
        for t in &terms {
            let e = t.match_expressions.as_ref().unwrap();
            assert_eq!(e.len(), 2);
            assert_eq!(e[1], off_virtual_nodes());
        }
        // A real volume without affinity: one term, off virtual nodes.
        let Step::Bind(v) = p.decide(&h, Node::Real, Some(&real), Some(&real_pv(json!(null))))
        else {
            panic!("not bound");
        };
        let terms = v
            .spec
            .unwrap()
            .node_affinity
            .unwrap()
            .required
            .unwrap()
            .node_selector_terms;
        assert_eq!(terms.len(), 1);
        assert_eq!(terms[0].match_expressions, Some(vec![off_virtual_nodes()]));
    }

    #[test]
    fn a_real_claim_made_for_an_earlier_claim_of_that_name_is_not_this_ones() {
        let p = provisioner();
        let h = home(json!({}));
        let mut earlier = real_claim(&h, "node-a", None, "fabric-storage");
        earlier
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(HOME_UID.into(), "u0".into());
        assert!(!made_for(&earlier, &h));
        assert!(matches!(
            p.decide(&h, Node::Real, Some(&earlier), None),
            Step::CreateReal(_)
        ));
    }

    #[test]
    fn a_real_claim_handed_over_is_adopted_by_the_next_claim_of_that_name_only() {
        let p = provisioner();
        let moved = home(json!({"metadata": {"uid": "u0"}}));
        let mut handed = bound(
            real_claim(&moved, "node-a", None, "fabric-storage"),
            "pvc-r1",
        );
        handed
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(HOME_UID.into(), String::new());
        // The claim made again (another UID) adopts it rather than get a new one ...
        let h = home(json!({}));
        assert!(handed_over_to(&handed, &h) && !made_for(&handed, &h));
        assert_eq!(
            p.decide(&h, Node::Real, Some(&handed), None),
            Step::Adopt("home-u0".into())
        );
        // ... not before its first consumer is placed, nor on a virtual node.
        let unscheduled = home(json!({"metadata": {"annotations": {}}}));
        assert_eq!(
            p.decide(&unscheduled, Node::Real, Some(&handed), None),
            Step::Nothing
        );
        assert_eq!(
            p.decide(&h, Node::Virtual, Some(&handed), None),
            Step::Nothing
        );
        // A claim of another name or namespace does not.
        let other = home(json!({"metadata": {"name": "logs"}}));
        assert!(!handed_over_to(&handed, &other));
        let elsewhere = home(json!({"metadata": {"namespace": "web"}}));
        assert!(!handed_over_to(&handed, &elsewhere));
        // Its own comes first; once adopted, it is its own.
        let own = real_claim(&h, "node-a", None, "fabric-storage");
        assert_eq!(real_of(&h, [&handed, &own]), Some(&own));
        assert_eq!(real_of(&h, [&handed]), Some(&handed));
        assert_eq!(real_of(&other, [&handed]), None);
        handed
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(HOME_UID.into(), "u1".into());
        assert!(made_for(&handed, &h) && !handed_over_to(&handed, &h));
    }

    #[test]
    fn a_deleted_claim_releases_its_real_claim_once_finalized() {
        let p = provisioner();
        let going = home(
            json!({"metadata": {"deletionTimestamp": "2026-11-28T00:00:00Z",
                                             "finalizers": [FINALIZER]}}),
        );
        let real = bound(
            real_claim(&going, "node-a", None, "fabric-storage"),
            "pvc-r1",
        );
        assert_eq!(
            p.decide(&going, Node::Real, Some(&real), None),
            Step::Release {
                real: Some(("home-u1".into(), "r1".into()))
            }
        );
        assert_eq!(
            p.decide(&going, Node::Unknown, None, None),
            Step::Release { real: None }
        );
        let not_ours = home(json!({"metadata": {"deletionTimestamp": "2026-11-28T00:00:00Z"}}));
        assert_eq!(p.decide(&not_ours, Node::Real, None, None), Step::Nothing);
    }

    #[test]
    fn nodes_are_told_apart_by_the_fabric_label() {
        let n = |labels: serde_json::Value| -> KNode {
            serde_json::from_value(json!({"metadata": {"name": "n", "labels": labels}})).unwrap()
        };
        assert_eq!(node_kind(None), Node::Unknown);
        assert_eq!(node_kind(Some(&n(json!({})))), Node::Real);
        assert_eq!(
            node_kind(Some(&n(
                json!({label::NODE_TYPE: label::VIRTUAL_NODE_TYPE})
            ))),
            Node::Virtual
        );
    }
}
