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

// The copy's pure parts, unit-tested; the orchestration that uses them (claim at the
// destination, the two pods, logs followed, the claim re-pointed) is the next step.
pub mod copy {
    // Allowed unused outside tests until the orchestration uses them.
    #![cfg_attr(not(test), allow(dead_code))]
    use super::*;

    /// The port the receiver listens on.
    pub const PORT: u16 = 7070;
    /// Label of the transfer pods: the claim they move.
    pub const MOVE_LABEL: &str = "storage.fabric.io/move";

    /// One side of the transfer: `receive` beside the fresh claim, `send` mounting the source.
    /// Placed on `place` (a provider: its virtual node, so it goes through the ShadowPod path
    /// with this cluster's identity like any tenant pod; `local`: off virtual nodes). The image
    /// is the fabric's own (`--image`), which holds `fabric-volume-transfer`.
    pub fn transfer_pod(
        claim: &str,
        volume_claim: &str,
        place: &Place,
        image: &str,
        args: &[String],
    ) -> Pod {
        let side = args.first().map_or("transfer", String::as_str);
        let mut spec = serde_json::json!({
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "transfer", "image": image,
                "command": std::iter::once("fabric-volume-transfer".to_owned()).chain(args.iter().cloned()).collect::<Vec<_>>(),
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": volume_claim}}],
        });
        match place {
            Place::Provider(id) => {
                spec["nodeSelector"] =
                    serde_json::json!({"kubernetes.io/hostname": names::node::virtual_node(id)});
                spec["tolerations"] =
                    serde_json::json!([{"key": names::taint::VIRTUAL_NODE, "operator": "Exists"}]);
            }
            Place::Local => {
                spec["affinity"] = serde_json::json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": names::label::NODE_TYPE,
                        "operator": "NotIn", "values": [names::label::VIRTUAL_NODE_TYPE]}]}]}}});
            }
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": names::namespace::bounded(&format!("move-{claim}-{side}")),
                         "labels": {MOVE_LABEL: claim}},
            "spec": spec,
        }))
        .expect("a pod")
    }

    /// What one side's log says: the bytes so far and, once done, the digest.
    #[derive(Debug, Default, Clone, PartialEq, Eq)]
    pub struct Progress {
        pub bytes: u64,
        pub sha256: Option<String>,
    }

    /// Reads `sent N bytes [sha256 HEX]` / `received N bytes sha256 HEX` lines (the last wins).
    pub fn progress(log: &str, verb: &str) -> Progress {
        let mut out = Progress::default();
        for line in log.lines() {
            let mut w = line.split_whitespace();
            if w.next() != Some(verb) {
                continue;
            }
            let (Some(n), Some("bytes")) = (w.next().and_then(|n| n.parse().ok()), w.next()) else {
                continue;
            };
            out.bytes = n;
            if w.next() == Some("sha256") {
                out.sha256 = w.next().map(str::to_owned);
            }
        }
        out
    }

    /// The copy is good only when both sides finished with the same digest over the same number
    /// of bytes; otherwise why not (the source is then kept).
    pub fn verdict(sent: &Progress, received: &Progress) -> Result<String, String> {
        match (&sent.sha256, &received.sha256) {
            (Some(s), Some(r)) if s == r && sent.bytes == received.bytes => Ok(s.clone()),
            (Some(s), Some(r)) => Err(format!(
                "checksums differ: sent {} bytes sha256 {s}, received {} bytes sha256 {r}",
                sent.bytes, received.bytes
            )),
            (None, _) => Err(format!(
                "the sender did not finish (after {} bytes)",
                sent.bytes
            )),
            (_, None) => Err(format!(
                "the receiver did not finish (after the sender's {} bytes)",
                sent.bytes
            )),
        }
    }
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
    use super::{copy::*, *};
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
    fn both_digests_must_match() {
        let log = "connecting to 1.2.3.4:7070: refused; again\nsent 65536 bytes\nsent 131072 bytes\nsent 140000 bytes sha256 ab12\n";
        let sent = progress(log, "sent");
        assert_eq!(
            sent,
            Progress {
                bytes: 140_000,
                sha256: Some("ab12".into())
            }
        );
        assert_eq!(
            progress("sent 10 bytes\n", "sent"),
            Progress {
                bytes: 10,
                sha256: None
            }
        );
        let got = progress(
            "listening on 7070\nreceived 140000 bytes sha256 ab12\n",
            "received",
        );
        assert_eq!(verdict(&sent, &got), Ok("ab12".into()));
        let other = Progress {
            bytes: 140_000,
            sha256: Some("cd34".into()),
        };
        assert!(
            verdict(&sent, &other)
                .unwrap_err()
                .contains("checksums differ")
        );
        assert!(
            verdict(&sent, &Progress::default())
                .unwrap_err()
                .contains("receiver did not finish")
        );
        assert!(
            verdict(
                &Progress {
                    bytes: 5,
                    sha256: None
                },
                &got
            )
            .unwrap_err()
            .contains("sender did not finish (after 5 bytes)")
        );
    }

    #[test]
    fn transfer_pods_go_where_their_claim_is() {
        let args = [
            "receive".to_owned(),
            "--port".into(),
            PORT.to_string(),
            "--dir".into(),
            "/data".into(),
        ];
        let p = transfer_pod(
            "data",
            "data-moved",
            &Place::Provider("b".into()),
            "fabric-controller",
            &args,
        );
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(v["metadata"]["name"], "move-data-receive");
        assert_eq!(
            v["spec"]["nodeSelector"]["kubernetes.io/hostname"],
            "fabric-b"
        );
        assert_eq!(
            v["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
            "data-moved"
        );
        assert_eq!(
            v["spec"]["containers"][0]["command"][0],
            "fabric-volume-transfer"
        );
        assert_eq!(v["spec"]["containers"][0]["command"][1], "receive");
        let l = serde_json::to_value(transfer_pod("data", "data", &Place::Local, "img", &args))
            .unwrap();
        assert!(l["spec"]["nodeSelector"].is_null());
        assert_eq!(
            l["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                ["nodeSelectorTerms"][0]["matchExpressions"][0]["operator"],
            "NotIn"
        );
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
