//! The storage fabric's virtual-node path (issue 21), pure; [`act`] carries it out.
//!
//! A claim of an offloaded namespace, of the virtual class ([`Claims::class`], default
//! [`storage::CLASS`]), whose first consumer the scheduler placed on this virtual node
//! ([`storage::SELECTED_NODE`]) is provisioned on the provider: a claim of the same name in
//! the twin namespace (our marks; access modes, size and volume mode copied; the class by
//! [`remote_class`]); at home a placeholder PersistentVolume `pvc-<uid>` bound to the claim,
//! its required node affinity pinning every later consumer to this virtual node (data
//! gravity), its source a CSI volume of a driver no node here runs ([`storage::PROVISIONER`]):
//! nothing at home can mount it. The remote claim binds when the offloaded pod is scheduled
//! there (`WaitForFirstConsumer` on the provider): nothing waits for it here.
//!
//! A finalizer ([`storage::FINALIZER`]) on the claim: deleted at home, its remote claim
//! (UID-preconditioned) and placeholder go first. A provider that lends no storage
//! (its VirtualNode has no `storage`): the claim's selected node is dropped, so the scheduler
//! places its consumer again, with a Warning Event `ReschedulingRequired`. A remote claim of
//! that name the fabric did not make is never written (the edge says so at home).
//!
//! Not done: changes after provisioning (an expansion) are not followed, as Liqo's.
use std::collections::BTreeMap;

use fabric_api::{
    names::storage::{self, FINALIZER, PROVISIONED_BY, REMOTE_CLASS, SELECTED_NODE},
    offloading::v1alpha1::Storage,
};
use fabric_reflector::{Marks, Remote};
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeSpec, VolumeNodeAffinity, VolumeResourceRequirements,
};
use kube::api::ObjectMeta;

use crate::node::HOSTNAME_LABEL;

pub mod act;

/// Annotation of a remote claim: the UID of the home claim it was made for (a home claim of
/// the same name made again later is another claim, and does not get its data).
pub const HOME_UID: &str = storage::HOME_UID;

/// The claims of the offloaded namespaces whose first consumer lands on this virtual node.
pub struct Claims {
    /// The virtual node.
    pub node_name: String,
    /// The name of the virtual StorageClass.
    pub class: String,
    /// What the provider lends (its VirtualNode's `spec.storage`; `None`: nothing).
    pub storage: tokio::sync::watch::Receiver<Option<Storage>>,
}

/// What to do about one claim.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Not this node's or not of the virtual class, or nothing to change now.
    Nothing,
    /// The provider lends no storage: drop the selected node, say why.
    Reschedule,
    /// Provision: the finalizer, the remote claim (`None`: it exists), the placeholder, then
    /// the claim's `volumeName`.
    Provision {
        remote: Option<Box<PersistentVolumeClaim>>,
        volume: Box<PersistentVolume>,
    },
    /// The claim is going: its remote claim (if ours and seen) and placeholder go, then the
    /// finalizer.
    Release { delete_remote: bool },
}

fn annotation<'a>(pvc: &'a PersistentVolumeClaim, key: &str) -> Option<&'a str> {
    pvc.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

fn finalized(pvc: &PersistentVolumeClaim) -> bool {
    pvc.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER)
}

fn spec(pvc: &PersistentVolumeClaim) -> PersistentVolumeClaimSpec {
    pvc.spec.clone().unwrap_or_default()
}

/// The name of the placeholder of `pvc`.
pub fn volume_name(pvc: &PersistentVolumeClaim) -> String {
    storage::volume_name(pvc.metadata.uid.as_deref().unwrap_or_default())
}

/// Whether remote claim `remote` was made for home claim `home` (not an earlier claim of
/// that name).
pub fn made_for(remote: &PersistentVolumeClaim, home: &PersistentVolumeClaim) -> bool {
    annotation(remote, HOME_UID).is_some()
        && annotation(remote, HOME_UID) == home.metadata.uid.as_deref()
}

/// Whether remote claim `remote` (one of ours) stands for no home claim any more.
pub fn orphaned(remote: &PersistentVolumeClaim, home: Option<&PersistentVolumeClaim>) -> bool {
    remote.metadata.deletion_timestamp.is_none() && !home.is_some_and(|h| made_for(remote, h))
}

/// The provider's class of the remote claim of `home`: its annotation
/// [`REMOTE_CLASS`], else the class of the remote claim there already, else the
/// class the provider lends by default; `None`: the provider's default class.
pub fn remote_class(
    home: &PersistentVolumeClaim,
    existing: Option<&PersistentVolumeClaim>,
    lent: &Storage,
) -> Option<String> {
    annotation(home, REMOTE_CLASS)
        .filter(|c| !c.is_empty())
        .map(str::to_owned)
        .or_else(|| existing.and_then(|e| e.spec.as_ref()?.storage_class_name.clone()))
        .or_else(|| lent.default.clone())
}

/// The remote claim of `home`, marked: the same name, its labels, access modes, size and
/// volume mode; no selector, volume name or data source (nothing of the provider's is a
/// consumer's to pick).
pub fn remote_claim(
    home: &PersistentVolumeClaim,
    existing: Option<&PersistentVolumeClaim>,
    lent: &Storage,
    marks: &Marks,
) -> PersistentVolumeClaim {
    let s = spec(home);
    let mut labels = home.metadata.labels.clone().unwrap_or_default();
    marks.stamp(&mut labels);
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: home.metadata.name.clone(),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                HOME_UID.to_owned(),
                home.metadata.uid.clone().unwrap_or_default(),
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
            storage_class_name: remote_class(home, existing, lent),
            ..Default::default()
        }),
        status: None,
    }
}

/// The placeholder volume of `home`, pinned to virtual node `node` (see the module).
pub fn placeholder(home: &PersistentVolumeClaim, node: &str, class: &str) -> PersistentVolume {
    let s = spec(home);
    let capacity = s
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map(|q| BTreeMap::from([("storage".to_owned(), q.clone())]));
    let uid = home.metadata.uid.clone().unwrap_or_default();
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(storage::volume_name(&uid)),
            annotations: Some(BTreeMap::from([(
                PROVISIONED_BY.to_owned(),
                storage::PROVISIONER.to_owned(),
            )])),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: s.access_modes.clone(),
            capacity,
            volume_mode: s.volume_mode.clone(),
            storage_class_name: Some(class.to_owned()),
            persistent_volume_reclaim_policy: Some("Delete".to_owned()),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("PersistentVolumeClaim".to_owned()),
                namespace: home.metadata.namespace.clone(),
                name: home.metadata.name.clone(),
                uid: Some(uid.clone()),
                ..Default::default()
            }),
            node_affinity: Some(VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: HOSTNAME_LABEL.to_owned(),
                            operator: "In".to_owned(),
                            values: Some(vec![node.to_owned()]),
                        }]),
                        match_fields: None,
                    }],
                }),
            }),
            csi: Some(CSIPersistentVolumeSource {
                driver: storage::PROVISIONER.to_owned(),
                volume_handle: uid,
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

/// What the VirtualNode `vn` says the provider lends, whenever that changes.
pub fn follow(
    mut vn: tokio::sync::watch::Receiver<Option<fabric_api::offloading::v1alpha1::VirtualNode>>,
) -> tokio::sync::watch::Receiver<Option<Storage>> {
    let lent = |vn: &Option<fabric_api::offloading::v1alpha1::VirtualNode>| {
        vn.as_ref().and_then(|v| v.spec.storage.clone())
    };
    let (tx, rx) = tokio::sync::watch::channel(lent(&vn.borrow_and_update()));
    tokio::spawn(async move {
        while vn.changed().await.is_ok() {
            let now = lent(&vn.borrow_and_update());
            tx.send_if_modified(|s| {
                let changed = *s != now;
                *s = now;
                changed
            });
        }
    });
    rx
}

impl Claims {
    /// What to do about `home`, given its remote claim, whether the provider answers and our
    /// marks there (`None`: no remote client).
    pub fn decide(
        &self,
        home: &PersistentVolumeClaim,
        remote: Remote<'_, PersistentVolumeClaim>,
        reachable: bool,
        marks: Option<&Marks>,
    ) -> Step {
        let s = spec(home);
        if s.storage_class_name.as_deref() != Some(self.class.as_str()) {
            return Step::Nothing;
        }
        if home.metadata.deletion_timestamp.is_some() {
            if !finalized(home) {
                return Step::Nothing;
            }
            return match remote {
                // Not listed yet: it will be, shortly.
                Remote::Unknown if reachable && marks.is_some() => Step::Nothing,
                Remote::Ours(r) if reachable && made_for(r, home) => Step::Release {
                    delete_remote: r.metadata.deletion_timestamp.is_none(),
                },
                // Out of reach: released all the same (a namespace is not held by a provider
                // gone); the edge's orphan sweep deletes the remote claim once it answers.
                _ => Step::Release {
                    delete_remote: false,
                },
            };
        }
        if s.volume_name.as_deref().is_some_and(|v| !v.is_empty()) {
            // Provisioned (ours, or bound by someone else): nothing follows.
            return Step::Nothing;
        }
        if annotation(home, SELECTED_NODE) != Some(self.node_name.as_str()) {
            return Step::Nothing;
        }
        let Some(lent) = self.storage.borrow().clone() else {
            return Step::Reschedule;
        };
        let (Some(marks), true) = (marks, reachable) else {
            return Step::Nothing;
        };
        let remote = match remote {
            Remote::Unknown | Remote::Foreign(_) => return Step::Nothing,
            // An earlier claim's, still going: made again once it is gone.
            Remote::Ours(r) if !made_for(r, home) || r.metadata.deletion_timestamp.is_some() => {
                return Step::Nothing;
            }
            Remote::Ours(_) => None,
            Remote::Absent => Some(Box::new(remote_claim(home, None, &lent, marks))),
        };
        Step::Provision {
            remote,
            volume: Box::new(placeholder(home, &self.node_name, &self.class)),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use tokio::sync::watch;

    use super::*;

    const NODE: &str = "fabric-b";

    fn claims(lent: Option<Storage>) -> Claims {
        Claims {
            node_name: NODE.into(),
            class: storage::CLASS.into(),
            storage: watch::channel(lent).1,
        }
    }

    fn lent() -> Storage {
        Storage {
            classes: vec!["standard".into(), "fast".into()],
            default: Some("standard".into()),
        }
    }

    fn marks() -> Marks {
        Marks::new("a", "b")
    }

    /// `extra` merged into `v` (a JSON merge patch: null removes).
    fn merge(v: &mut serde_json::Value, extra: serde_json::Value) {
        match (v, extra) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, e) in b {
                    if e.is_null() {
                        a.remove(&k);
                    } else {
                        merge(a.entry(k).or_insert(json!({})), e);
                    }
                }
            }
            (v, e) => *v = e,
        }
    }

    fn pvc(extra: serde_json::Value) -> PersistentVolumeClaim {
        let mut v = json!({
            "metadata": {"name": "data", "namespace": "store", "uid": "u1",
                         "labels": {"app": "db"},
                         "annotations": {SELECTED_NODE: NODE, "team": "store"}},
            "spec": {"storageClassName": "fabric", "accessModes": ["ReadWriteOnce"],
                     "volumeMode": "Filesystem",
                     "selector": {"matchLabels": {"disk": "ssd"}},
                     "dataSource": {"kind": "PersistentVolumeClaim", "name": "other"},
                     "resources": {"requests": {"storage": "1Gi"}}},
        });
        merge(&mut v, extra);
        serde_json::from_value(v).unwrap()
    }

    fn provision(step: Step) -> (Option<PersistentVolumeClaim>, PersistentVolume) {
        match step {
            Step::Provision { remote, volume } => (remote.map(|r| *r), *volume),
            other => panic!("not provisioned: {other:?}"),
        }
    }

    #[test]
    fn a_claim_whose_consumer_lands_here_is_provisioned_on_the_provider() {
        let home = pvc(json!({}));
        let (remote, pv) =
            provision(claims(Some(lent())).decide(&home, Remote::Absent, true, Some(&marks())));
        let remote = remote.expect("the remote claim");
        let v = serde_json::to_value(&remote).unwrap();
        assert_eq!(v["metadata"]["name"], "data");
        assert_eq!(v["metadata"]["labels"]["app"], "db");
        assert!(marks().on(&remote.metadata), "{v}");
        assert_eq!(
            v["metadata"]["annotations"],
            json!({HOME_UID: "u1"}),
            "nothing else of home's"
        );
        assert_eq!(
            v["spec"],
            json!({"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem",
                   "resources": {"requests": {"storage": "1Gi"}},
                   "storageClassName": "standard"}),
            "no selector, data source or volume name"
        );
        let p = serde_json::to_value(&pv).unwrap();
        assert_eq!(p["metadata"]["name"], "pvc-u1");
        assert_eq!(
            p["metadata"]["annotations"][PROVISIONED_BY],
            "fabric.io/storage"
        );
        assert_eq!(p["spec"]["storageClassName"], "fabric");
        assert_eq!(p["spec"]["capacity"]["storage"], "1Gi");
        assert_eq!(p["spec"]["accessModes"], json!(["ReadWriteOnce"]));
        assert_eq!(p["spec"]["claimRef"]["uid"], "u1");
        assert_eq!(p["spec"]["claimRef"]["namespace"], "store");
        assert_eq!(
            p["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"],
            json!([{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE]}]}])
        );
        assert_eq!(p["spec"]["csi"]["driver"], "fabric.io/storage");
        assert!(p["spec"]["hostPath"].is_null());
    }

    #[test]
    fn the_remote_class_is_the_annotation_then_the_existing_then_the_lent_default() {
        let home = pvc(json!({"metadata": {"annotations": {REMOTE_CLASS: "fast"}}}));
        let existing = pvc(json!({"spec": {"storageClassName": "slow"}}));
        assert_eq!(
            remote_class(&home, Some(&existing), &lent()).as_deref(),
            Some("fast")
        );
        let plain = pvc(json!({}));
        assert_eq!(
            remote_class(&plain, Some(&existing), &lent()).as_deref(),
            Some("slow")
        );
        assert_eq!(
            remote_class(&plain, None, &lent()).as_deref(),
            Some("standard")
        );
        assert_eq!(
            remote_class(&plain, None, &Storage::default()),
            None,
            "the provider's default"
        );
    }

    #[test]
    fn other_claims_are_left_alone() {
        let c = claims(Some(lent()));
        let m = marks();
        let other_class = pvc(json!({"spec": {"storageClassName": "standard"}}));
        assert_eq!(
            c.decide(&other_class, Remote::Absent, true, Some(&m)),
            Step::Nothing
        );
        let elsewhere = pvc(json!({"metadata": {"annotations": {SELECTED_NODE: "worker-1"}}}));
        assert_eq!(
            c.decide(&elsewhere, Remote::Absent, true, Some(&m)),
            Step::Nothing
        );
        let unscheduled = pvc(json!({"metadata": {"annotations": {SELECTED_NODE: null}}}));
        assert_eq!(
            c.decide(&unscheduled, Remote::Absent, true, Some(&m)),
            Step::Nothing
        );
        let bound = pvc(json!({"spec": {"volumeName": "pvc-u1"}}));
        assert_eq!(
            c.decide(&bound, Remote::Absent, true, Some(&m)),
            Step::Nothing
        );
        // Someone else's claim of that name in the twin: never written.
        let theirs = pvc(json!({}));
        assert_eq!(
            c.decide(&theirs, Remote::Foreign(&theirs), true, Some(&m)),
            Step::Nothing
        );
        // Nothing is concluded while the provider's claims are not known.
        assert_eq!(
            c.decide(&theirs, Remote::Unknown, true, Some(&m)),
            Step::Nothing
        );
        assert_eq!(
            c.decide(&theirs, Remote::Absent, false, Some(&m)),
            Step::Nothing
        );
    }

    #[test]
    fn a_provider_lending_no_storage_sends_the_claim_back_to_the_scheduler() {
        let home = pvc(json!({}));
        assert_eq!(
            claims(None).decide(&home, Remote::Absent, true, Some(&marks())),
            Step::Reschedule
        );
    }

    #[test]
    fn an_existing_remote_claim_is_kept_an_earlier_claim_s_awaited() {
        let c = claims(Some(lent()));
        let m = marks();
        let home = pvc(json!({}));
        let mine = remote_claim(&home, None, &lent(), &m);
        let (remote, _) = provision(c.decide(&home, Remote::Ours(&mine), true, Some(&m)));
        assert!(remote.is_none(), "there already");
        let again = pvc(json!({"metadata": {"uid": "u2"}}));
        assert_eq!(
            c.decide(&again, Remote::Ours(&mine), true, Some(&m)),
            Step::Nothing
        );
        assert!(orphaned(&mine, Some(&again)));
        assert!(orphaned(&mine, None));
        assert!(!orphaned(&mine, Some(&home)));
    }

    #[test]
    fn a_claim_going_releases_both_sides_first() {
        let c = claims(Some(lent()));
        let m = marks();
        let going = pvc(
            json!({"metadata": {"deletionTimestamp": "2026-11-28T00:00:00Z",
                                           "finalizers": [FINALIZER]}}),
        );
        let mine = remote_claim(&going, None, &lent(), &m);
        assert_eq!(
            c.decide(&going, Remote::Ours(&mine), true, Some(&m)),
            Step::Release {
                delete_remote: true
            }
        );
        assert_eq!(
            c.decide(&going, Remote::Absent, true, Some(&m)),
            Step::Release {
                delete_remote: false
            }
        );
        assert_eq!(
            c.decide(&going, Remote::Unknown, true, Some(&m)),
            Step::Nothing,
            "not listed yet"
        );
        assert_eq!(
            c.decide(&going, Remote::Ours(&mine), false, Some(&m)),
            Step::Release {
                delete_remote: false
            },
            "a provider out of reach holds nothing at home"
        );
        let unfinalized = pvc(json!({"metadata": {"deletionTimestamp": "2026-11-28T00:00:00Z"}}));
        assert_eq!(
            c.decide(&unfinalized, Remote::Ours(&mine), true, Some(&m)),
            Step::Nothing
        );
    }
}
