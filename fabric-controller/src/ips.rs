//! The `IP` controller: gives each local non-pod IP that should be reachable from peers an
//! address in the local external CIDR (in status). Peers reach it there, under their own
//! view of this cluster's external CIDR; the gateway's data plane maps it to the real IP.
//!
//! Grants live in IPAM's ledger (see `ipam::ledger`), written conditionally on the version they
//! were decided from, so two replicas that both believe they lead can never give one address
//! to two `IP`s; addresses shown in status from before the ledger kept them are adopted on
//! start. A finalizer releases the address when the object goes.
use std::{sync::Arc, time::Duration};

use fabric_api::{
    names::finalizer::EXTERNAL_IP as FINALIZER,
    networking::v1alpha1::{IP, IPStatus},
};
use fabric_kube::{
    controller::{Runner, finalized},
    status::Verdict,
};
use ipnetwork::Ipv4Network;
use kube::{
    Api, Client, ResourceExt,
    api::ListParams,
    runtime::{Controller, controller::Action, watcher},
};
use tracing::{info, warn};

use crate::ipam::{BACKOFF, Error, FIELD_MANAGER, Ready, ready, store::Store};

pub struct Ctx {
    client: Client,
    external: Ipv4Network,
    ledger: Store,
}

fn key(ip: &IP) -> String {
    format!("{}/{}", ip.namespace().unwrap_or_default(), ip.name_any())
}

async fn patch_status(api: &Api<IP>, name: &str, status: IPStatus) -> Result<(), Error> {
    Ok(FIELD_MANAGER.apply_status(api, name, status).await?)
}

async fn apply(ip: Arc<IP>, ctx: &Ctx) -> Result<Action, Error> {
    let api: Api<IP> = Api::namespaced(ctx.client.clone(), &ip.namespace().unwrap_or_default());
    let generation = ip.metadata.generation;
    let conditions = ip
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let k = key(&ip);
    let granted = ctx.ledger.update(|l| l.grant_ip(ctx.external, &k)).await?;
    let status = match granted {
        Ok(g) => IPStatus {
            ip: Some(g.to_string()),
            conditions: ready(
                conditions,
                Verdict::ok(
                    Ready::Allocated,
                    format!(
                        "{} is reachable from peers as {} (in their view of this cluster)",
                        ip.spec.ip, g
                    ),
                ),
                generation,
            ),
        },
        Err(e) => IPStatus {
            ip: None,
            conditions: ready(
                conditions,
                Verdict::not(Ready::ExternalCidrFull, e.to_string()),
                generation,
            ),
        },
    };
    patch_status(&api, &ip.name_any(), status).await?;
    Ok(Action::requeue(Duration::from_secs(600)))
}

async fn release(ip: Arc<IP>, ctx: &Ctx) -> Result<Action, Error> {
    let k = key(&ip);
    ctx.ledger
        .update(|l| {
            l.release_ip(&k);
            Ok::<_, std::convert::Infallible>(())
        })
        .await?
        .unwrap_or_else(|never| match never {});
    info!(ip = %k, "released external address");
    Ok(Action::await_change())
}

async fn reconcile(ip: Arc<IP>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let api: Api<IP> = Api::namespaced(ctx.client.clone(), &ip.namespace().unwrap_or_default());
    finalized(
        &api,
        FINALIZER,
        ip,
        |ip| apply(ip, &ctx),
        |ip| release(ip, &ctx),
    )
    .await
}

/// Serves the `IP`s of `namespace` (the fabric's) only.
pub async fn run(client: Client, namespace: &str, external: Ipv4Network) -> Result<(), Error> {
    let all: Api<IP> = Api::namespaced(client.clone(), namespace);
    let ledger = Store::new(client.clone(), namespace);
    let mut shown = Vec::new();
    for ip in all.list(&ListParams::default()).await? {
        let Some(addr) = ip.status.as_ref().and_then(|s| s.ip.as_ref()) else {
            continue;
        };
        match addr.parse::<std::net::Ipv4Addr>() {
            Ok(a) => shown.push((key(&ip), a)),
            Err(_) => {
                warn!(ip = %key(&ip), %addr, "unreadable address in status; it is granted again")
            }
        }
    }
    // One write for all of them (the ledger is written even when nothing changes).
    let adopted = ledger
        .update(|l| {
            Ok::<_, std::convert::Infallible>(
                shown
                    .iter()
                    .filter(|(k, a)| l.adopt_ip(external, k, *a))
                    .count(),
            )
        })
        .await?
        .unwrap_or_else(|never| match never {});
    if adopted > 0 {
        info!(adopted, "addresses from before the ledger recorded in it");
    }
    let ctx = Arc::new(Ctx {
        client,
        external,
        ledger,
    });
    Runner::new("ip", BACKOFF)
        .run(
            Controller::new(all, watcher::Config::default()),
            reconcile,
            ctx,
        )
        .await;
    Ok(())
}
