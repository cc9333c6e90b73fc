//! `fabricctl move volume CLAIM [--claim-namespace NS] --to CLUSTER` (issue 21): a claim's data
//! moves to a peered provider (CLUSTER its cluster id) or back home (`local`), offline.
//!
//! What is decided here is pure ([`users`], [`destination`], [`location`]); the reads are in
//! [`move_volume`]. The checks come first and write nothing: a claim any non-terminated pod
//! still uses is refused naming those pods (its workload is scaled to 0 first: a copy of a
//! volume being written is not the volume), and a destination that is neither `local` nor a
//! provider of this cluster is refused naming those there are.
//!
//! The copy (`fabric-volume-transfer receive` beside a fresh claim at the destination, `send`
//! mounting the source, both digests compared, then the claim re-pointed) is not wired yet:
//! after the checks the command says so and changes nothing, so the source stays where it is.
use anyhow::{Context as _, Result, bail};
use fabric_api::{
    core::v1alpha1::{ForeignCluster, PeerRole},
    names,
};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::{Api, ResourceExt as _, api::ListParams};

/// Where a claim's data is, or is to go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// A real node of this cluster.
    Local,
    /// Provider `cluster_id` (its virtual node).
    Provider(String),
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Local => f.write_str("local"),
            Place::Provider(id) => write!(f, "provider {id}"),
        }
    }
}

/// The pods that keep `claim` from moving: those mounting it that have not terminated
/// (`Succeeded`/`Failed`), sorted. A pod being deleted still counts: it may still write.
pub fn users(claim: &str, pods: &[Pod]) -> Vec<String> {
    let mut out: Vec<String> = pods
        .iter()
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .filter(|p| {
            p.spec
                .iter()
                .flat_map(|s| s.volumes.iter().flatten())
                .any(|v| {
                    v.persistent_volume_claim
                        .as_ref()
                        .is_some_and(|c| c.claim_name == claim)
                })
        })
        .map(|p| p.name_any())
        .collect();
    out.sort();
    out
}

/// The destination `to` names: `local`, or the cluster id of a peer that provides to this
/// cluster; anything else is an error naming the choices.
pub fn destination(to: &str, peers: &[ForeignCluster]) -> Result<Place, String> {
    if to == "local" {
        return Ok(Place::Local);
    }
    let providers: Vec<&str> = peers
        .iter()
        .filter(|fc| {
            matches!(
                fc.spec.role,
                PeerRole::Provider | PeerRole::ConsumerAndProvider
            )
        })
        .map(|fc| fc.spec.cluster_id.as_str())
        .collect();
    if providers.contains(&to) {
        return Ok(Place::Provider(to.to_owned()));
    }
    let known = if providers.is_empty() {
        "none".to_owned()
    } else {
        providers.join(", ")
    };
    Err(format!(
        "--to {to}: not `local` nor a provider of this cluster (providers: {known})"
    ))
}

/// Where a bound claim's volume is: a placeholder pinned to a provider's virtual node is on
/// that provider, anything else is here.
pub fn location(pv: &PersistentVolume, peers: &[ForeignCluster]) -> Place {
    let pinned: Vec<&str> = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .iter()
        .flat_map(|r| r.node_selector_terms.iter())
        .flat_map(|t| t.match_expressions.iter().flatten())
        .filter(|e| e.key == "kubernetes.io/hostname" && e.operator == "In")
        .flat_map(|e| e.values.iter().flatten())
        .map(String::as_str)
        .collect();
    peers
        .iter()
        .map(|fc| fc.spec.cluster_id.as_str())
        .find(|id| pinned.contains(&names::node::virtual_node(id).as_str()))
        .map_or(Place::Local, |id| Place::Provider(id.to_owned()))
}

pub async fn move_volume(local: &kube::Client, ns: &str, claim: &str, to: &str) -> Result<()> {
    let pvc = Api::<PersistentVolumeClaim>::namespaced(local.clone(), ns)
        .get_opt(claim)
        .await
        .with_context(|| format!("reading claim {ns}/{claim}"))?
        .with_context(|| format!("claim {ns}/{claim}: no such claim"))?;
    let class = pvc
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref());
    if class != Some(names::storage::CLASS) {
        bail!(
            "claim {ns}/{claim}: its class is {}, only claims of the fabric's class {} move",
            class.unwrap_or("(none)"),
            names::storage::CLASS
        );
    }
    let peers = Api::<ForeignCluster>::all(local.clone())
        .list(&ListParams::default())
        .await
        .context("listing ForeignClusters (is the fabric installed?)")?
        .items;
    let dest = destination(to, &peers).map_err(anyhow::Error::msg)?;
    let pods = Api::<Pod>::namespaced(local.clone(), ns)
        .list(&ListParams::default())
        .await
        .with_context(|| format!("listing the pods of {ns}"))?
        .items;
    let using = users(claim, &pods);
    if !using.is_empty() {
        bail!(
            "claim {ns}/{claim} is in use by pod(s) {}: scale their workload to 0 first (a volume moves offline)",
            using.join(", ")
        );
    }
    let Some(volume) = pvc.spec.as_ref().and_then(|s| s.volume_name.as_deref()) else {
        bail!("claim {ns}/{claim} is not bound yet: it has no data to move");
    };
    let pv = Api::<PersistentVolume>::all(local.clone())
        .get(volume)
        .await
        .with_context(|| format!("reading volume {volume} of claim {ns}/{claim}"))?;
    let from = location(&pv, &peers);
    if from == dest {
        bail!("claim {ns}/{claim}: its data is already on {dest}");
    }
    bail!(
        "claim {ns}/{claim} ({from} to {dest}): the checks pass, but the copy itself is not \
         available in this build yet; nothing was changed, the data stays on {from}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, claim: &str, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "c"}],
                     "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    fn peer(id: &str, role: &str) -> ForeignCluster {
        serde_json::from_value(json!({
            "apiVersion": "core.fabric.io/v1alpha1", "kind": "ForeignCluster",
            "metadata": {"name": id},
            "spec": {"clusterId": id, "role": role},
        }))
        .unwrap()
    }

    #[test]
    fn only_running_pods_of_that_claim_hold_it() {
        let pods = [
            pod("db-1", "data", "Running"),
            pod("db-0", "data", "Pending"),
            pod("done", "data", "Succeeded"),
            pod("crashed", "data", "Failed"),
            pod("other", "logs", "Running"),
        ];
        assert_eq!(users("data", &pods), ["db-0", "db-1"]);
        assert!(users("nothing", &pods).is_empty());
    }

    #[test]
    fn the_destination_is_local_or_a_provider() {
        let peers = [peer("b", "Provider"), peer("c", "Consumer")];
        assert_eq!(destination("local", &peers), Ok(Place::Local));
        assert_eq!(destination("b", &peers), Ok(Place::Provider("b".into())));
        let e = destination("c", &peers).unwrap_err();
        assert!(e.contains("--to c") && e.contains("providers: b"), "{e}");
        let e = destination("zz", &[]).unwrap_err();
        assert!(e.contains("providers: none"), "{e}");
    }

    #[test]
    fn a_placeholder_pinned_to_a_virtual_node_is_on_its_provider() {
        let pv = |node: &str| -> PersistentVolume {
            serde_json::from_value(json!({"spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}}}))
            .unwrap()
        };
        let peers = [peer("b", "Provider")];
        assert_eq!(
            location(&pv("fabric-b"), &peers),
            Place::Provider("b".into())
        );
        assert_eq!(location(&pv("worker-1"), &peers), Place::Local);
    }
}
