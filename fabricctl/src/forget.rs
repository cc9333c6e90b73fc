//! `fabricctl forget volumes --peer X [--claim NS/NAME]`: the claims provider X keeps for this
//! cluster after their twins were given up (`storageRetention: Retain`) are deleted there. This
//! cluster can no longer reach them itself (the provider removed its rights in those twins):
//! it names them, by UID, in its NamespaceMap's `spec.forget` with its identity, and the
//! provider deletes each and then the twin left without claims. What goes is said before.
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use fabric_api::{
    names,
    offloading::v1alpha1::{ClaimRef, NamespaceMap, RetainedClaim},
};
use fabric_negotiation::namespaces::retention::{self, describe};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams},
};

/// The field manager of `spec.forget` (the consumer's controller applies the rest).
const FIELD_MANAGER: &str = "fabricctl";

/// The retained claims `--claim` names (`NS/NAME`, NS the twin or the home namespace), or all
/// of them; a name that matches none is an error naming what is retained.
pub fn select(
    retained: &[RetainedClaim],
    claim: Option<&str>,
) -> Result<Vec<RetainedClaim>, String> {
    let Some(claim) = claim else {
        return Ok(retained.to_vec());
    };
    let Some((ns, name)) = claim
        .split_once('/')
        .filter(|(n, m)| !n.is_empty() && !m.is_empty())
    else {
        return Err(format!(
            "--claim {claim:?}: must be NAMESPACE/NAME (the twin's namespace on the provider, or this cluster's)"
        ));
    };
    let chosen: Vec<RetainedClaim> = retained
        .iter()
        .filter(|c| c.name == name && (c.namespace == ns || c.home == ns))
        .cloned()
        .collect();
    if chosen.is_empty() {
        let kept = if retained.is_empty() {
            "none".to_owned()
        } else {
            retained.iter().map(describe).collect::<Vec<_>>().join(", ")
        };
        return Err(format!(
            "--claim {claim}: no such retained claim (retained: {kept})"
        ));
    }
    Ok(chosen)
}

/// `spec.forget` with `chosen` added to `before`, each once. Entries of `before` for claims no
/// longer retained (deleted since, or being deleted) go: they ask for nothing any more, and the
/// list would otherwise only grow.
pub fn forget_list(
    before: &[ClaimRef],
    retained: &[RetainedClaim],
    chosen: &[RetainedClaim],
) -> Vec<ClaimRef> {
    let mut out: Vec<ClaimRef> = before
        .iter()
        .filter(|r| {
            retained
                .iter()
                .any(|c| c.uid == r.uid && c.name == r.name && c.namespace == r.namespace)
        })
        .cloned()
        .collect();
    for c in chosen {
        let r = ClaimRef {
            namespace: c.namespace.clone(),
            name: c.name.clone(),
            uid: c.uid.clone(),
        };
        if !out.contains(&r) {
            out.push(r);
        }
    }
    out
}

/// This cluster's NamespaceMap on provider `peer`, read with this cluster's identity there.
struct Provider {
    client: kube::Client,
    maps: Api<NamespaceMap>,
    /// This cluster's id, as the provider knows it (the map's name).
    me: String,
    map: Option<NamespaceMap>,
}

impl Provider {
    async fn read(local: &kube::Client, peer: &str) -> Result<Self> {
        let client = fabric_auth::identity::remote_client(local, peer)
            .await
            .with_context(|| format!("reaching provider {peer} with this cluster's identity"))?;
        let tenant = client.default_namespace().to_owned();
        // The map is named after this cluster, whose tenant namespace it is in.
        let Some(me) = tenant.strip_prefix(&names::namespace::tenant("")) else {
            bail!("the identity for {peer} names namespace {tenant}, which is no tenant namespace");
        };
        let maps: Api<NamespaceMap> = Api::namespaced(client.clone(), &tenant);
        let map = maps
            .get_opt(me)
            .await
            .with_context(|| format!("reading NamespaceMap {tenant}/{me} on {peer}"))?;
        Ok(Self {
            me: me.to_owned(),
            client,
            maps,
            map,
        })
    }
}

/// The claims provider `peer` would keep of this cluster, with their data, once their peering
/// ends (see [`retention::kept_after_unpeer`]): read with this cluster's identity, the claims
/// of each mapped twin listed there.
pub async fn kept_after_unpeer(local: &kube::Client, peer: &str) -> Result<Vec<RetainedClaim>> {
    let Provider {
        client, me, map, ..
    } = Provider::read(local, peer).await?;
    let Some(map) = map else {
        return Ok(Vec::new());
    };
    let mut claims = Vec::new();
    for m in &map.spec.namespaces {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &m.remote);
        match api.list(&ListParams::default()).await {
            Ok(l) => claims.push((m.remote.clone(), l.items)),
            // A twin the provider has not made (or has refused) holds nothing of ours.
            Err(kube::Error::Api(e)) if e.code == 403 || e.code == 404 => {}
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("listing the claims in twin {} on {peer}", m.remote));
            }
        }
    }
    let retained = map.status.map(|s| s.retained).unwrap_or_default();
    Ok(retention::kept_after_unpeer(
        &me,
        &retained,
        &map.spec.namespaces,
        &claims,
    ))
}

pub async fn forget_volumes(
    local: &kube::Client,
    peer: &str,
    claim: Option<&str>,
    timeout: Duration,
) -> Result<()> {
    let Provider { maps, me, map, .. } = Provider::read(local, peer).await?;
    let me = me.as_str();
    let Some(map) = map else {
        println!("{peer} keeps no claims of this cluster (it has no NamespaceMap of it)");
        return Ok(());
    };
    let retained = map.status.clone().unwrap_or_default().retained;
    let chosen = select(&retained, claim).map_err(anyhow::Error::msg)?;
    if chosen.is_empty() {
        println!("{peer} keeps no claims of this cluster");
        return Ok(());
    }
    println!("deleting on {peer}, with their data (their twins go once they hold no claim):");
    for c in &chosen {
        println!("  {} (of {})", describe(c), c.home);
    }
    let forget = forget_list(&map.spec.forget, &retained, &chosen);
    let patch = serde_json::json!({ "spec": { "forget": forget } });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..Default::default()
    };
    maps.patch(me, &params, &Patch::Merge(&patch))
        .await
        .with_context(|| format!("asking {peer} to delete them (its NamespaceMap {me})"))?;
    let started = Instant::now();
    loop {
        let left: Vec<RetainedClaim> = maps
            .get_opt(me)
            .await?
            .and_then(|m| m.status)
            .map(|s| s.retained)
            .unwrap_or_default()
            .into_iter()
            .filter(|c| chosen.iter().any(|o| o.uid == c.uid))
            .collect();
        if left.is_empty() {
            println!("deleted");
            return Ok(());
        }
        if started.elapsed() > timeout {
            let names: Vec<String> = left.iter().map(describe).collect();
            bail!(
                "{peer} still keeps {} after {timeout:?} (asked; it deletes them when it next looks)",
                names.join(", ")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(ns: &str, home: &str, name: &str) -> RetainedClaim {
        RetainedClaim {
            namespace: ns.into(),
            home: home.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            size: Some("1Gi".into()),
            class: Some("standard".into()),
        }
    }

    #[test]
    fn a_claim_is_named_by_its_twin_or_its_home_namespace() {
        let all = [kept("shop-c", "shop", "data"), kept("web-c", "web", "data")];
        assert_eq!(select(&all, None).unwrap(), all);
        assert_eq!(select(&all, Some("shop-c/data")).unwrap(), [all[0].clone()]);
        assert_eq!(select(&all, Some("web/data")).unwrap(), [all[1].clone()]);
        let e = select(&all, Some("shop/logs")).unwrap_err();
        assert!(e.contains("no such retained claim"), "{e}");
        assert!(e.contains("shop-c/data (1Gi, standard)"), "{e}");
        for bad in ["data", "/data", "shop/"] {
            let e = select(&all, Some(bad)).unwrap_err();
            assert!(e.contains("must be NAMESPACE/NAME"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_forget_list_keeps_what_it_had_once() {
        let a = kept("t", "h", "a");
        let b = kept("t", "h", "b");
        let both = [a.clone(), b.clone()];
        let before = forget_list(&[], &both, std::slice::from_ref(&a));
        assert_eq!(before.len(), 1);
        assert_eq!(before[0].uid, "uid-a");
        let after = forget_list(&before, &both, &[a, b.clone()]);
        assert_eq!(after.len(), 2);
        // `a` deleted since: its entry goes, `b`'s stays.
        let later = forget_list(&after, std::slice::from_ref(&b), &[]);
        assert_eq!(later.len(), 1);
        assert_eq!(later[0].uid, "uid-b");
    }
}
