//! `fabricctl unpeer` of a provider this cluster consumes from: deletes its ForeignCluster
//! (marked forced with `--force`) and follows the controllers removing everything of the
//! peering, printing what it waits for; then (with the provider's kubeconfig) waits for the
//! provider's side to go too. The controllers do the work (`fabric_negotiation::unpeer`), so
//! `kubectl delete foreigncluster` does the same. What is pending is pure ([`waiting`]).
use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use fabric_api::{
    authentication::v1alpha1::{Identity, ResourceSlice},
    core::v1alpha1::ForeignCluster,
    names,
    offloading::v1alpha1::VirtualNode,
};
use fabric_kube::meta;
use fabric_negotiation::{
    namespaces::retention::describe,
    unpeer::{ConsumerSide, left_on_provider, pending},
};
use fabric_peering::{Cluster, Side};
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};

/// What is left of the peering with a provider on this side.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Local {
    /// The ForeignCluster and its finalizers, when it still exists.
    pub foreign_cluster: Option<Vec<String>>,
    pub slices: Vec<String>,
    pub virtual_node: bool,
    pub identity: bool,
}

/// What the unpeer waits for, each as (what, why it is not gone yet), in the order things go.
pub fn waiting(l: &Local) -> Vec<(&'static str, String)> {
    let finalizers = l.foreign_cluster.clone().unwrap_or_default();
    let side = ConsumerSide {
        slices: l.slices.clone(),
        virtual_node: l.virtual_node,
        network: finalizers
            .iter()
            .any(|f| f == fabric_negotiation::network::FINALIZER),
    };
    let mut out: Vec<(&'static str, String)> = pending(&side)
        .into_iter()
        .map(|p| {
            let what = match p {
                fabric_negotiation::unpeer::Pending::Slices(_) => "resource slices",
                fabric_negotiation::unpeer::Pending::VirtualNode => "virtual node",
                fabric_negotiation::unpeer::Pending::Network => "network",
            };
            (what, p.to_string())
        })
        .collect();
    if l.identity {
        out.push((
            "identity",
            "the Identity and its Secret (they go last: the steps before reach the provider \
             with them, then this cluster's Tenant there is deleted)"
                .to_owned(),
        ));
    }
    if l.foreign_cluster.is_some() {
        let others: Vec<&String> = finalizers
            .iter()
            .filter(|f| {
                *f != fabric_negotiation::network::FINALIZER && *f != names::finalizer::PEERING
            })
            .collect();
        let why = if others.is_empty() {
            "the ForeignCluster (the sharing controllers' finalizers)".to_owned()
        } else {
            format!("the ForeignCluster (finalizers {others:?})")
        };
        out.push(("foreign cluster", why));
    }
    out
}

async fn read(local: &Client, ns: &str, provider: &str) -> Result<Local> {
    let fc = Api::<ForeignCluster>::all(local.clone())
        .get_opt(provider)
        .await
        .with_context(|| format!("reading ForeignCluster {provider}"))?;
    let slices = Api::<ResourceSlice>::namespaced(local.clone(), ns)
        .list(&ListParams::default())
        .await
        .context("listing ResourceSlices")?
        .items
        .into_iter()
        .filter(|s| s.spec.provider_cluster_id == provider)
        .map(|s| s.name_any())
        .collect();
    Ok(Local {
        foreign_cluster: fc.map(|f| f.finalizers().to_vec()),
        slices,
        virtual_node: Api::<VirtualNode>::namespaced(local.clone(), ns)
            .get_opt(provider)
            .await?
            .is_some(),
        identity: Api::<Identity>::namespaced(local.clone(), ns)
            .get_opt(provider)
            .await?
            .is_some(),
    })
}

/// How long the unpeer waits to learn what the provider keeps.
const CHECK_KEPT_FOR: Duration = Duration::from_secs(10);

/// How `fabricctl unpeer` goes about it (its flags).
#[derive(Debug, Clone, Copy)]
pub struct How {
    /// Without waiting for the provider.
    pub force: bool,
    /// Even though the provider keeps claims of this cluster.
    pub leave_volumes: bool,
    pub timeout: Duration,
}

pub async fn unpeer(
    local: Client,
    remote: Option<Client>,
    ns: &str,
    provider: Option<String>,
    how: How,
) -> Result<()> {
    let How {
        force,
        leave_volumes,
        timeout,
    } = how;
    let provider = match (provider, &remote) {
        (Some(p), _) => p,
        (None, Some(r)) => Cluster::read(Side::Remote, r.clone(), ns)
            .await?
            .id()
            .to_owned(),
        (None, None) => bail!("give the provider's cluster id or --remote-kubeconfig"),
    };
    let fcs = Api::<ForeignCluster>::all(local.clone());
    let fc = fcs.get_opt(&provider).await?;
    let state = read(&local, ns, &provider).await?;
    let sharing = fc.as_ref().is_some_and(|f| f.spec.role.provides()) || state.identity;
    if !sharing {
        return match remote {
            Some(remote) => {
                println!("No sharing peering with {provider}: removing the network peering");
                crate::peer::unpeer(local, remote, ns, timeout).await
            }
            None => bail!(
                "this cluster does not consume from {provider} (no ForeignCluster with the \
                 Provider role, no Identity): nothing to unpeer. A network-only peering is \
                 removed with --network-only --remote-kubeconfig"
            ),
        };
    }
    // Said (and refused unless asked) before anything goes: once the identity is gone, nobody
    // here can see or forget what the provider keeps.
    // Bounded: an unreachable provider (the case of --force) must not hold the unpeer up.
    let asked = tokio::time::timeout(
        timeout.min(CHECK_KEPT_FOR),
        crate::forget::kept_after_unpeer(&local, &provider),
    )
    .await
    .unwrap_or_else(|_| Err(anyhow::anyhow!("no answer within {CHECK_KEPT_FOR:?}")));
    match asked {
        Ok(kept) if !kept.is_empty() => {
            let list: Vec<String> = kept
                .iter()
                .map(|c| format!("  {} (of {})", describe(c), c.home))
                .collect();
            if !leave_volumes {
                bail!(
                    "{provider} keeps these claims of this cluster with their data \
                     (storageRetention Retain), and after the unpeer this cluster could no \
                     longer see or delete them:\n{}\nDelete them first (unoffload their \
                     namespaces, then `fabricctl forget volumes --peer {provider}`), or \
                     unpeer with --leave-volumes to leave them to {provider}'s admin",
                    list.join("\n")
                );
            }
            println!(
                "{provider} keeps these claims with their data, left to its admin \
                 (--leave-volumes):\n{}",
                list.join("\n")
            );
        }
        Ok(_) => {}
        Err(e) => println!(
            "could not read what {provider} keeps of this cluster's volumes ({e:#}): any \
             claim it retains stays there, left to its admin"
        ),
    }
    let me = Cluster::read(Side::Local, local.clone(), ns).await?;
    println!(
        "Unpeering {} (consumer) from {provider} (provider){}",
        me.id(),
        if force {
            ": forced, this side goes without waiting for the provider"
        } else {
            ""
        }
    );
    if force && fc.is_some() {
        let patch = serde_json::json!({"metadata": {"annotations": {
            names::annotation::FORCE_UNPEER: "true"
        }}});
        fcs.patch(&provider, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("marking ForeignCluster {provider} forced"))?;
    }
    let deleted = meta::delete(&fcs, &provider, &DeleteParams::default())
        .await
        .with_context(|| format!("deleting ForeignCluster {provider}"))?;
    if deleted == meta::Deleted::Asked {
        println!("✓ deleted ForeignCluster {provider}: the controllers unpeer");
    }
    follow(&local, ns, &provider, timeout, force).await?;
    println!("✓ nothing of the peering with {provider} is left on this cluster");
    if force {
        println!(
            "The provider was not waited for. What may be left on {provider} (if it could not \
             be told):"
        );
        for line in left_on_provider(me.id()) {
            println!("  - {line}");
        }
        return Ok(());
    }
    match remote {
        Some(remote) => provider_side(&remote, me.id(), &provider, timeout).await,
        None => {
            println!(
                "{provider}'s controllers remove the tenant area of {} there (namespace {})",
                me.id(),
                names::namespace::tenant(me.id())
            );
            Ok(())
        }
    }
}

/// Follows the local side going, printing what it waits for as that changes.
async fn follow(
    local: &Client,
    ns: &str,
    provider: &str,
    timeout: Duration,
    force: bool,
) -> Result<()> {
    let t0 = Instant::now();
    let mut shown: BTreeMap<&'static str, String> = BTreeMap::new();
    loop {
        let now: BTreeMap<&'static str, String> = waiting(&read(local, ns, provider).await?)
            .into_iter()
            .collect();
        for what in shown.keys() {
            if !now.contains_key(what) {
                println!("✓ {what} removed ({:.1}s)", t0.elapsed().as_secs_f64());
            }
        }
        for (what, why) in &now {
            if shown.get(what) != Some(why) {
                println!("… waiting for {why}");
            }
        }
        if now.is_empty() {
            return Ok(());
        }
        shown = now;
        if t0.elapsed() >= timeout {
            let left: Vec<&String> = shown.values().collect();
            bail!(
                "the unpeer did not finish within {}s; still there: {left:?}. Are the sharing \
                 controllers running here (`fabric-controller sharing`)? {}",
                timeout.as_secs(),
                if force {
                    "They go on when they run."
                } else {
                    "With the provider unreachable, `fabricctl unpeer --force` removes this \
                     side at once."
                }
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// With the provider's kubeconfig: waits for its controllers to remove the tenant area.
async fn provider_side(remote: &Client, me: &str, provider: &str, timeout: Duration) -> Result<()> {
    let ns = names::namespace::tenant(me);
    let namespaces = Api::<Namespace>::all(remote.clone());
    let fcs = Api::<ForeignCluster>::all(remote.clone());
    println!(
        "… waiting for {provider} to remove the tenant area (namespace {ns}, ForeignCluster {me})"
    );
    let t0 = Instant::now();
    loop {
        let ns_left = namespaces.get_opt(&ns).await?.is_some();
        let fc_left = fcs
            .get_opt(me)
            .await?
            .is_some_and(|f| f.spec.role.consumes());
        if !ns_left && !fc_left {
            println!(
                "✓ {provider} removed the tenant area ({:.1}s): nothing of the peering is left on either side",
                t0.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        if t0.elapsed() >= timeout {
            bail!(
                "{provider} still has {}{} after {}s: are its sharing controllers running \
                 (`fabric-controller sharing`)?",
                if ns_left {
                    format!("namespace {ns} ")
                } else {
                    String::new()
                },
                if fc_left {
                    format!("ForeignCluster {me} (role Consumer)")
                } else {
                    String::new()
                },
                timeout.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_an_unpeer_waits_for_is_said_in_order() {
        assert!(waiting(&Local::default()).is_empty());
        let l = Local {
            foreign_cluster: Some(vec![
                fabric_negotiation::network::FINALIZER.to_owned(),
                names::finalizer::PEERING.to_owned(),
            ]),
            slices: vec!["p".into()],
            virtual_node: true,
            identity: true,
        };
        let w: Vec<&str> = waiting(&l).iter().map(|(w, _)| *w).collect();
        assert_eq!(
            w,
            [
                "resource slices",
                "virtual node",
                "network",
                "identity",
                "foreign cluster"
            ]
        );
        let only_fc = Local {
            foreign_cluster: Some(vec!["example.io/other".into()]),
            ..Default::default()
        };
        let w = waiting(&only_fc);
        assert_eq!(w.len(), 1);
        assert!(w[0].1.contains("example.io/other"), "{w:?}");
    }
}
