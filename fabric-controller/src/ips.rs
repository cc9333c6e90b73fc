//! The `IP` controller: gives each local non-pod IP that should be reachable from peers an
//! address in the local external CIDR (in status). Peers reach it there, under their own
//! view of this cluster's external CIDR; the gateway's data plane maps it to the real IP.
//!
//! Grants live in the objects' status and are restored from there on start, so a restart
//! keeps every address; a finalizer releases the address when the object goes.
use std::{sync::Arc, time::Duration};

use fabric_api::{
    names::finalizer::EXTERNAL_IP as FINALIZER,
    networking::v1alpha1::{IP, IPStatus},
};
use fabric_ipam::Ipam;
use futures::StreamExt;
use ipnetwork::Ipv4Network;
use kube::{
    Api, Client, ResourceExt,
    api::ListParams,
    runtime::{
        Controller,
        controller::Action,
        finalizer::{Event, finalizer},
        watcher,
    },
};
use tokio::sync::Mutex;
use tracing::{info, warn};

use crate::ipam::{Error, FIELD_MANAGER, ready};

pub struct Ctx {
    client: Client,
    pool: Mutex<Ipam>,
}

fn key(ip: &IP) -> String {
    format!("{}/{}", ip.namespace().unwrap_or_default(), ip.name_any())
}

/// The external CIDR's network address is never handed out.
fn pool(external: Ipv4Network) -> Result<Ipam, Error> {
    let first = Ipv4Network::new(external.network(), 32).expect("/32");
    Ipam::new(vec![external], vec![first]).map_err(|e| Error::Invalid(e.to_string()))
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
    let granted = ctx.pool.lock().await.allocate_free(&key(&ip), 32);
    let status = match granted {
        Ok(g) => IPStatus {
            ip: Some(g.ip().to_string()),
            conditions: ready(
                conditions,
                true,
                "Allocated",
                format!(
                    "{} is reachable from peers as {} (in their view of this cluster)",
                    ip.spec.ip,
                    g.ip()
                ),
                generation,
            ),
        },
        Err(e) => IPStatus {
            ip: None,
            conditions: ready(
                conditions,
                false,
                "ExternalCIDRFull",
                e.to_string(),
                generation,
            ),
        },
    };
    patch_status(&api, &ip.name_any(), status).await?;
    Ok(Action::requeue(Duration::from_secs(600)))
}

async fn reconcile(ip: Arc<IP>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let api: Api<IP> = Api::namespaced(ctx.client.clone(), &ip.namespace().unwrap_or_default());
    finalizer(&api, FINALIZER, ip, |event| async {
        match event {
            Event::Apply(ip) => apply(ip, &ctx).await,
            Event::Cleanup(ip) => {
                ctx.pool.lock().await.release(&key(&ip));
                info!(ip = %key(&ip), "released external address");
                Ok(Action::await_change())
            }
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

fn error_policy(ip: Arc<IP>, err: &Error, _: Arc<Ctx>) -> Action {
    warn!(ip = %key(&ip), error = %err, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

/// Serves the `IP`s of `namespace` (the fabric's) only.
pub async fn run(client: Client, namespace: &str, external: Ipv4Network) -> Result<(), Error> {
    let mut pool = pool(external)?;
    let all: Api<IP> = Api::namespaced(client.clone(), namespace);
    for ip in all.list(&ListParams::default()).await? {
        let Some(addr) = ip.status.as_ref().and_then(|s| s.ip.as_ref()) else {
            continue;
        };
        let restored = addr
            .parse::<std::net::Ipv4Addr>()
            .map_err(|e| e.to_string())
            .and_then(|a| Ipv4Network::new(a, 32).map_err(|e| e.to_string()))
            .and_then(|n| pool.restore(&key(&ip), n).map_err(|e| e.to_string()));
        if let Err(e) = restored {
            warn!(ip = %key(&ip), error = %e, "grant no longer valid; it will be re-allocated");
        }
    }
    let ctx = Arc::new(Ctx {
        client,
        pool: Mutex::new(pool),
    });
    Controller::new(all, watcher::Config::default())
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                warn!(error = %e, "IP controller");
            }
        })
        .await;
    Ok(())
}
