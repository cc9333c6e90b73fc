//! Which PersistentVolumes are the storage fabric's own.
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};

use crate::names::storage::{PROVISIONED_BY, PROVISIONER};

/// Whether `pv` is the fabric's volume of `claim`: provisioned by [`PROVISIONER`] and bound to
/// that very claim (its UID). Only such a volume is the fabric's to keep or delete, whichever
/// path (a virtual kubelet's placeholder, the real-node provisioner's volume) made it.
pub fn fabric_volume_of(pv: &PersistentVolume, claim: &PersistentVolumeClaim) -> bool {
    let ours = pv
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PROVISIONED_BY))
        .is_some_and(|p| p == PROVISIONER);
    let bound = pv
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .is_some_and(|r| r.uid.is_some() && r.uid == claim.metadata.uid);
    ours && bound
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn only_our_provisioner_s_volume_of_that_very_claim() {
        let claim: PersistentVolumeClaim =
            serde_json::from_value(json!({"metadata": {"name": "c", "uid": "u1"}})).unwrap();
        let pv = |by: &str, uid: Option<&str>| -> PersistentVolume {
            serde_json::from_value(json!({"metadata": {"name": "v",
                    "annotations": {PROVISIONED_BY: by}},
                "spec": {"claimRef": {"name": "c", "uid": uid}}}))
            .unwrap()
        };
        assert!(fabric_volume_of(&pv(PROVISIONER, Some("u1")), &claim));
        assert!(!fabric_volume_of(&pv(PROVISIONER, Some("u0")), &claim));
        assert!(!fabric_volume_of(&pv(PROVISIONER, None), &claim));
        assert!(!fabric_volume_of(&pv("other", Some("u1")), &claim));
    }
}
