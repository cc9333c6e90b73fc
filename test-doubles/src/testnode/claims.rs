//! The test node's `persistentVolumeClaim` volumes: claim → bound PV → its host directory
//! (`hostPath` or `local`), which the container gets bind-mounted read-write. Until every
//! claim is bound the pod waits in `ContainerCreating` with the kubelet's message for it.
//! [`resolve`] is pure; [`load`] reads the claims and volumes.
use std::{collections::BTreeMap, path::PathBuf};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::{Api, Client, ResourceExt};

/// The claims the pod's volumes name: volume name → claim name.
pub fn wanted(pod: &Pod) -> BTreeMap<String, String> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| {
            v.persistent_volume_claim
                .as_ref()
                .map(|c| (v.name.clone(), c.claim_name.clone()))
        })
        .collect()
}

/// Volume name → host directory for each claim volume of `pod`, given its namespace's claims
/// (by name) and the PVs (by name); `Err`: why the volumes cannot be mounted yet, as the
/// kubelet says it.
pub fn resolve(
    pod: &Pod,
    claims: &BTreeMap<String, PersistentVolumeClaim>,
    volumes: &BTreeMap<String, PersistentVolume>,
) -> Result<BTreeMap<String, PathBuf>, String> {
    let ns = pod.namespace().unwrap_or_default();
    let mut out = BTreeMap::new();
    for (vol, claim) in wanted(pod) {
        let Some(c) = claims.get(&claim) else {
            return Err(format!("persistentvolumeclaim \"{claim}\" not found"));
        };
        let phase = c
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .unwrap_or_default();
        let pv = c
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .unwrap_or_default();
        if phase != "Bound" || pv.is_empty() {
            return Err(format!(
                "PVC {ns}/{claim} has non-bound phase (\"{phase}\") or empty pvc.Spec.VolumeName (\"{pv}\")"
            ));
        }
        let Some(v) = volumes.get(pv) else {
            return Err(format!("persistentvolume \"{pv}\" not found"));
        };
        let Some(dir) = crate::storage::volume_dir(v) else {
            return Err(format!(
                "volume {pv}: the test node mounts only hostPath and local volumes"
            ));
        };
        out.insert(vol, dir);
    }
    Ok(out)
}

/// Reads the pod's claims and their volumes, then [`resolve`]s them.
pub async fn load(client: &Client, pod: &Pod) -> Result<BTreeMap<String, PathBuf>, String> {
    let ns = pod.namespace().unwrap_or_default();
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let mut claims = BTreeMap::new();
    let mut volumes = BTreeMap::new();
    for claim in wanted(pod).into_values() {
        let c = pvcs
            .get_opt(&claim)
            .await
            .map_err(|e| format!("reading claim {claim}: {e}"))?;
        let Some(c) = c else { continue };
        if let Some(pv) = c.spec.as_ref().and_then(|s| s.volume_name.clone())
            && !pv.is_empty()
            && let Some(v) = pvs
                .get_opt(&pv)
                .await
                .map_err(|e| format!("reading volume {pv}: {e}"))?
        {
            volumes.insert(pv, v);
        }
        claims.insert(claim, c);
    }
    resolve(pod, &claims, &volumes)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "app"},
            "spec": {"containers": [{"name": "c"}], "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "c1"}},
                {"name": "cfg", "configMap": {"name": "x"}}]},
        }))
        .unwrap()
    }

    fn claim(v: serde_json::Value) -> BTreeMap<String, PersistentVolumeClaim> {
        [("c1".to_owned(), serde_json::from_value(v).unwrap())].into()
    }

    #[test]
    fn a_bound_claim_gives_its_volumes_directory() {
        let c = claim(
            json!({"metadata": {"name": "c1"}, "spec": {"volumeName": "pv1"},
                             "status": {"phase": "Bound"}}),
        );
        let host: PersistentVolume = serde_json::from_value(
            json!({"metadata": {"name": "pv1"}, "spec": {"hostPath": {"path": "/v/pv1"}}}),
        )
        .unwrap();
        let local: PersistentVolume = serde_json::from_value(
            json!({"metadata": {"name": "pv1"}, "spec": {"local": {"path": "/v/local"}}}),
        )
        .unwrap();
        let got = resolve(&pod(), &c, &[("pv1".to_owned(), host)].into()).unwrap();
        assert_eq!(got, [("data".to_owned(), PathBuf::from("/v/pv1"))].into());
        let got = resolve(&pod(), &c, &[("pv1".to_owned(), local)].into()).unwrap();
        assert_eq!(got["data"], PathBuf::from("/v/local"));
        let nfs: PersistentVolume = serde_json::from_value(
            json!({"metadata": {"name": "pv1"}, "spec": {"nfs": {"server": "s", "path": "/"}}}),
        )
        .unwrap();
        assert!(
            resolve(&pod(), &c, &[("pv1".to_owned(), nfs)].into())
                .unwrap_err()
                .contains("only hostPath and local")
        );
    }

    #[test]
    fn an_unbound_or_missing_claim_says_why_as_the_kubelet() {
        let none = BTreeMap::new();
        assert_eq!(
            resolve(&pod(), &none, &none_pv()).unwrap_err(),
            "persistentvolumeclaim \"c1\" not found"
        );
        let c = claim(json!({"metadata": {"name": "c1"}, "status": {"phase": "Pending"}}));
        assert_eq!(
            resolve(&pod(), &c, &none_pv()).unwrap_err(),
            "PVC app/c1 has non-bound phase (\"Pending\") or empty pvc.Spec.VolumeName (\"\")"
        );
    }

    fn none_pv() -> BTreeMap<String, PersistentVolume> {
        BTreeMap::new()
    }
}
