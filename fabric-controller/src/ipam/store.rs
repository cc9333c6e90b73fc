//! The ledger in the API: read, changed, and written back only if nobody wrote it in between
//! (the write carries the resourceVersion it was read at; the API refuses a stale one with
//! 409, and the change is made again on what is there now).
use fabric_api::{names::config_map::IPAM_LEDGER, networking::v1alpha1::Configuration};
use fabric_kube::meta::{is_conflict, is_not_found};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, ObjectMeta, PostParams},
};
use tokio::sync::Mutex;
use tracing::info;

use super::{
    Error,
    ledger::{Ledger, owner},
};
use fabric_api::{names::label, networking::v1alpha1::Network};

/// Conflicts in a row before giving up (the reconcile is retried).
const ATTEMPTS: usize = 10;

pub struct Store {
    client: Client,
    api: Api<ConfigMap>,
    /// The ledger as this replica last read or wrote it, with its resourceVersion; the
    /// write fails if it is stale. The lock also makes this replica's changes one at a time.
    last: Mutex<Option<(Ledger, String)>>,
}

impl Store {
    /// The ledger in `namespace`.
    pub fn new(client: Client, namespace: &str) -> Self {
        Self {
            api: Api::namespaced(client.clone(), namespace),
            client,
            last: Mutex::new(None),
        }
    }

    /// Runs `change` on the ledger and writes the result back, conditionally on the version
    /// `change` ran on; on a conflict, reads the ledger again and runs `change` again. It is
    /// written even when unchanged: a conflict then says that what `change` decided from was
    /// stale. Nothing is written when `change` fails; its error is the inner one.
    pub async fn update<T, E>(
        &self,
        mut change: impl FnMut(&mut Ledger) -> Result<T, E>,
    ) -> Result<Result<T, E>, Error> {
        let mut last = self.last.lock().await;
        for _ in 0..ATTEMPTS {
            let (ledger, version) = match last.take() {
                Some(l) => l,
                None => self.read().await?,
            };
            let mut next = ledger.clone();
            let out = match change(&mut next) {
                Ok(out) => out,
                Err(e) => {
                    *last = Some((ledger, version));
                    return Ok(Err(e));
                }
            };
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(IPAM_LEDGER.to_owned()),
                    resource_version: Some(version),
                    ..Default::default()
                },
                data: Some(next.to_data()),
                ..Default::default()
            };
            match self
                .api
                .replace(IPAM_LEDGER, &PostParams::default(), &cm)
                .await
            {
                Ok(written) => {
                    *last = Some((next, written.resource_version().unwrap_or_default()));
                    return Ok(Ok(out));
                }
                Err(e) if is_conflict(&e) => {
                    info!("the IPAM ledger changed since this replica read it; reading it again");
                }
                // Deleted under us: made again from the records at the next read.
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::Contended)
    }

    /// The ledger as stored now, created from the grants' records (`Network` objects and
    /// peer ids in Configuration statuses, as earlier versions kept them) when missing.
    async fn read(&self) -> Result<(Ledger, String), Error> {
        loop {
            if let Some(cm) = self.api.get_opt(IPAM_LEDGER).await? {
                let ledger = Ledger::from_data(cm.data.as_ref())?;
                return Ok((ledger, cm.resource_version().unwrap_or_default()));
            }
            let ledger = records(&self.api, &self.client).await?;
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(IPAM_LEDGER.to_owned()),
                    ..Default::default()
                },
                data: Some(ledger.to_data()),
                ..Default::default()
            };
            match self.api.create(&PostParams::default(), &cm).await {
                Ok(cm) => {
                    info!(
                        grants = ledger.grants.len(),
                        peer_ids = ledger.ids.len(),
                        "IPAM ledger created from the grants' records"
                    );
                    return Ok((ledger, cm.resource_version().unwrap_or_default()));
                }
                // Another replica made it first: read theirs.
                Err(ref e) if is_conflict(e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// The grants as their records in the ledger's namespace (`ns`) show them.
async fn records(ns: &Api<ConfigMap>, client: &Client) -> Result<Ledger, Error> {
    let ns = ns.namespace().unwrap_or_default();
    let mut ledger = Ledger::default();
    let nets: Api<Network> = Api::namespaced(client.clone(), ns);
    for n in nets
        .list(&ListParams::default().labels(label::CONFIGURATION))
        .await?
    {
        let (Some(cfg), Some(role)) = (
            n.labels().get(label::CONFIGURATION),
            n.labels().get(label::ROLE),
        ) else {
            continue;
        };
        let Some(granted) = n.status.as_ref().and_then(|s| s.cidr.as_ref()) else {
            continue;
        };
        let k = format!("{}/{cfg}", n.namespace().unwrap_or_default());
        ledger.grants.insert(owner(&k, role), *granted);
    }
    let cfgs: Api<Configuration> = Api::namespaced(client.clone(), ns);
    for c in cfgs.list(&ListParams::default()).await? {
        if let Some(id) = c.status.as_ref().and_then(|s| s.peer_id) {
            ledger.ids.insert(super::key(&c), id.unsigned_abs());
        }
    }
    Ok(ledger)
}
