//! `fabricctl mode tethered --peer X [--drain-local]` and `fabricctl mode autonomous`, on a
//! provider (docs/modes.md): hand control of this cluster's resources to its one consumer X,
//! or take it back. The mode is X's Tenant's `spec.mode`, the provider admin's (this
//! command's user's); the offer policy, the pod webhook and the ForeignClusters follow it.
use std::collections::BTreeSet;

use anyhow::{Context as _, Result, bail};
use fabric_api::{
    authentication::{
        mode::{TenantRef, Tether, eligible},
        v1alpha1::{Tenant, WorkingMode},
    },
    core::v1alpha1::ForeignCluster,
    names::label,
};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, EvictParams, ListParams, Patch, PatchParams},
};

/// The field manager of `spec.mode`.
const FIELD_MANAGER: &str = "fabricctl";

async fn tenants(c: &Client) -> Result<Vec<Tenant>> {
    Ok(Api::<Tenant>::all(c.clone())
        .list(&ListParams::default())
        .await
        .context("listing Tenants (is this cluster a provider with the fabric installed?)")?
        .items)
}

async fn set_mode(c: &Client, t: &Tenant, mode: WorkingMode) -> Result<()> {
    let ns = t.namespace().unwrap_or_default();
    // A merge patch of the one field: the authentication service applies the rest of the
    // spec (server-side, without `mode`), so neither takes the other's field.
    let value = match mode {
        WorkingMode::Autonomous => serde_json::Value::Null,
        m => serde_json::to_value(m)?,
    };
    Api::<Tenant>::namespaced(c.clone(), &ns)
        .patch(
            &t.name_any(),
            &PatchParams {
                field_manager: Some(FIELD_MANAGER.to_owned()),
                ..Default::default()
            },
            &Patch::Merge(serde_json::json!({ "spec": { "mode": value } })),
        )
        .await
        .with_context(|| format!("setting Tenant {ns}/{} to {mode}", t.name_any()))?;
    Ok(())
}

/// `mode tethered --peer X`.
pub async fn tethered(c: &Client, fabric_ns: &str, peer: &str, drain_local: bool) -> Result<()> {
    let known = Api::<ForeignCluster>::all(c.clone())
        .get_opt(peer)
        .await
        .context("reading ForeignClusters")?
        .is_some();
    let all = tenants(c).await?;
    let refs: Vec<TenantRef> = all.iter().map(TenantRef::of).collect();
    if let Err(e) = eligible(peer, known, &refs) {
        bail!("mode tethered refused: {e}");
    }
    let tenant = all
        .iter()
        .find(|t| t.spec.cluster_id == peer && t.metadata.deletion_timestamp.is_none())
        .expect("eligible: the peer's Tenant is there");
    if Tether::of(&refs).peer() == Some(peer) {
        println!("already tethered to {peer}");
    } else {
        set_mode(c, tenant, WorkingMode::Tethered).await?;
        println!(
            "tethered to {peer}: it is offered all of this cluster's free capacity, and no \
             other consumer anything; new local workload pods are refused (namespaces \
             labelled {}=true, kube-system and {fabric_ns} excepted)",
            label::TETHERED_EXEMPT
        );
    }
    if drain_local {
        drain(c, fabric_ns).await
    } else {
        println!("existing local pods keep running (--drain-local evicts them)");
        Ok(())
    }
}

/// `mode autonomous`: every Tenant set back.
pub async fn autonomous(c: &Client) -> Result<()> {
    let tethered: Vec<Tenant> = tenants(c)
        .await?
        .into_iter()
        .filter(|t| t.spec.mode == WorkingMode::Tethered)
        .collect();
    if tethered.is_empty() {
        println!("already autonomous");
        return Ok(());
    }
    for t in &tethered {
        set_mode(c, t, WorkingMode::Autonomous).await?;
        println!(
            "autonomous: {} is offered the usual share of what is free again (its grant \
             shrinks to it); local pods are accepted again",
            t.spec.cluster_id
        );
    }
    Ok(())
}

/// The local workload pods `--drain-local` evicts: running or pending, not of DaemonSets (they
/// would come back at once), not in the exempt namespaces (`exempt`), nor in namespaces of a
/// consumer (tenant and twin namespaces, labelled [`label::REMOTE_CLUSTER`]: the pods there
/// run for the peer).
pub fn local_workloads(pods: &[Pod], exempt: &BTreeSet<String>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = pods
        .iter()
        .filter(|p| {
            let ns = p.namespace().unwrap_or_default();
            let finished = p
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .is_some_and(|ph| ph == "Succeeded" || ph == "Failed");
            let daemon = p
                .owner_references()
                .iter()
                .any(|o| o.kind == "DaemonSet" && o.controller == Some(true));
            !exempt.contains(&ns) && !finished && !daemon && p.metadata.deletion_timestamp.is_none()
        })
        .map(|p| (p.namespace().unwrap_or_default(), p.name_any()))
        .collect();
    out.sort();
    out
}

/// Evicts the local workload pods (the Eviction API: each pod's grace period and the
/// PodDisruptionBudgets are honoured).
async fn drain(c: &Client, fabric_ns: &str) -> Result<()> {
    let namespaces = Api::<Namespace>::all(c.clone())
        .list(&ListParams::default())
        .await
        .context("listing namespaces")?;
    let mut exempt: BTreeSet<String> = [fabric_ns.to_owned(), "kube-system".to_owned()].into();
    for n in namespaces.items {
        let labels = n.labels();
        if labels
            .get(label::TETHERED_EXEMPT)
            .is_some_and(|v| v == "true")
            || labels.contains_key(label::REMOTE_CLUSTER)
        {
            exempt.insert(n.name_any());
        }
    }
    let pods = Api::<Pod>::all(c.clone())
        .list(&ListParams::default())
        .await
        .context("listing pods")?;
    let victims = local_workloads(&pods.items, &exempt);
    if victims.is_empty() {
        println!("no local workload pods to evict");
    }
    let mut failed = Vec::new();
    for (ns, name) in victims {
        let pods = Api::<Pod>::namespaced(c.clone(), &ns);
        match pods.evict(&name, &EvictParams::default()).await {
            Ok(_) => println!("evicting {ns}/{name} (its grace period honoured)"),
            // A 404 is the pod gone, or an API server that serves no eviction: then deleted,
            // still with its grace period (no PodDisruptionBudget is consulted).
            Err(e) if fabric_kube::meta::is_not_found(&e) => {
                match pods.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => println!(
                        "evicting {ns}/{name} (deleted: this API server serves no eviction; its \
                         grace period honoured)"
                    ),
                    Err(e) if fabric_kube::meta::is_not_found(&e) => {}
                    Err(e) => failed.push(format!("{ns}/{name}: {e}")),
                }
            }
            Err(e) => failed.push(format!("{ns}/{name}: {e}")),
        }
    }
    if !failed.is_empty() {
        bail!(
            "tethered, but some local pods were not evicted (a PodDisruptionBudget may hold \
             them; run again later): {}",
            failed.join("; ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::PodStatus, apimachinery::pkg::apis::meta::v1::OwnerReference,
    };
    use kube::api::ObjectMeta;

    use super::*;

    fn pod(ns: &str, name: &str, phase: &str, owner: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                owner_references: owner.map(|k| {
                    vec![OwnerReference {
                        kind: k.into(),
                        controller: Some(true),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            },
            spec: None,
            status: Some(PodStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn drain_local_takes_the_local_workloads_only() {
        let exempt: BTreeSet<String> = ["fabric-system", "kube-system", "fabric-tenant-x"]
            .map(String::from)
            .into();
        let pods = [
            pod("shop", "web", "Running", Some("ReplicaSet")),
            pod("shop", "batch", "Pending", None),
            pod("shop", "done", "Succeeded", None),
            pod("shop", "agent", "Running", Some("DaemonSet")),
            pod("kube-system", "dns", "Running", Some("ReplicaSet")),
            pod("fabric-tenant-x", "x-web", "Running", None),
        ];
        assert_eq!(
            local_workloads(&pods, &exempt),
            vec![
                ("shop".to_owned(), "batch".to_owned()),
                ("shop".to_owned(), "web".to_owned())
            ]
        );
    }
}
