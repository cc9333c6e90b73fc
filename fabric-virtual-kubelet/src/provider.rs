//! The provider's API as this cluster's identity reaches it: a client built from the identity
//! Secret (rebuilt whenever the Secret changes, e.g. on certificate renewal), the probe that
//! tells whether the provider answers, and the [`Endpoint`]s the reflectors reach it through
//! ([`endpoints`]).
//!
//! The probe is a namespaced, authorized read in the tenant namespace (one `Tenant`, metadata
//! only): unlike `/version` or `/healthz`, which answer anyone, it fails when the identity was
//! revoked or expired, which is as fatal to offloading as an unreachable server.
use std::time::Duration;

use fabric_api::authentication::v1alpha1::Tenant;
use fabric_auth::identity;
use fabric_reflector::{Endpoint, Marks};
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, api::ListParams};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use crate::conditions::Probe;

/// One probe of the provider's API with `client`, bounded by `timeout`.
pub async fn probe(client: &kube::Client, timeout: Duration) -> Probe {
    let api: Api<Tenant> = Api::default_namespaced(client.clone());
    match tokio::time::timeout(timeout, api.list_metadata(&ListParams::default().limit(1))).await {
        Err(_) => Probe::Unreachable(format!(
            "no answer within {}",
            humantime::format_duration(timeout)
        )),
        Ok(Ok(_)) => Probe::Answered,
        Ok(Err(kube::Error::Api(s))) if s.code == 401 || s.code == 403 => {
            Probe::Refused(format!("{} {}", s.code, s.message))
        }
        Ok(Err(kube::Error::Api(s))) if s.code >= 500 => {
            Probe::Unreachable(format!("{} {}", s.code, s.message))
        }
        // Any other answer (a 404 while the CRDs are being installed, say) came through
        // authentication and authorization: the provider is there for this identity.
        Ok(Err(kube::Error::Api(_))) => Probe::Answered,
        Ok(Err(e)) => Probe::Unreachable(e.to_string()),
    }
}

/// Probes the provider every `interval` through the identity kept in the Secret `secret`
/// watches, sending each outcome; a change of the Secret rebuilds the client and probes at
/// once. Ends when the receiver goes.
pub async fn prober(
    mut secret: watch::Receiver<Option<Secret>>,
    interval: Duration,
    timeout: Duration,
    out: mpsc::Sender<Probe>,
) {
    let mut client: Option<Result<kube::Client, String>> = None;
    loop {
        if client.is_none() {
            let current = secret.borrow_and_update().clone();
            client = Some(match current {
                None => Err("the identity Secret does not exist".to_owned()),
                Some(s) => match identity::kubeconfig_of(&s) {
                    None => Err(format!(
                        "the identity Secret has no field {}",
                        fabric_api::names::secret::KUBECONFIG_FIELD
                    )),
                    Some(text) => identity::client_from_kubeconfig(&text)
                        .await
                        .map_err(|e| e.to_string()),
                },
            });
            match client.as_ref() {
                Some(Ok(_)) => info!("client for the provider (re)built from the identity Secret"),
                Some(Err(e)) => warn!(error = %e, "no usable identity"),
                None => {}
            }
        }
        let outcome = match client.as_ref().expect("set above") {
            Ok(c) => probe(c, timeout).await,
            Err(e) => Probe::NoIdentity(e.clone()),
        };
        debug!(?outcome, "provider probed");
        if out.send(outcome).await.is_err() {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            changed = secret.changed() => {
                if changed.is_err() {
                    return;
                }
                client = None;
            }
        }
    }
}

/// This cluster's id as the provider knows it: its Tenant in the tenant namespace (what the
/// provider's admission compares the ShadowPods' `clusterId` with).
async fn consumer_id(client: &kube::Client) -> Result<String, String> {
    let tenants: Api<Tenant> = Api::default_namespaced(client.clone());
    let list = tenants
        .list(&ListParams::default().limit(2))
        .await
        .map_err(|e| format!("reading the Tenant on the provider: {e}"))?;
    match &list.items[..] {
        [t] => Ok(t.spec.cluster_id.clone()),
        other => Err(format!(
            "{} Tenants in the tenant namespace on the provider, not one",
            other.len()
        )),
    }
}

/// The provider as the reflectors reach it, for each version of the identity Secret: a client,
/// and the marks this cluster puts on what it makes there (its id as the provider knows it,
/// the provider's id). `None` while there is no usable identity, and until this cluster's
/// Tenant has been read (retried with back-off): nothing is made there meanwhile.
pub fn endpoints(
    secret: watch::Receiver<Option<Secret>>,
    provider_id: String,
) -> watch::Receiver<Option<Endpoint>> {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(follow_endpoints(secret, provider_id, tx));
    rx
}

async fn follow_endpoints(
    mut secret: watch::Receiver<Option<Secret>>,
    provider_id: String,
    out: watch::Sender<Option<Endpoint>>,
) {
    const FIRST: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(30);
    'identity: loop {
        let current = secret.borrow_and_update().clone();
        // The old client goes at once: nothing more is done with a replaced identity.
        out.send_replace(None);
        let client = match current.as_ref().and_then(identity::kubeconfig_of) {
            Some(text) => identity::client_from_kubeconfig(&text).await.ok(),
            None => None,
        };
        if let Some(client) = client {
            let mut delay = FIRST;
            loop {
                match consumer_id(&client).await {
                    Ok(id) => {
                        let marks = Marks::new(id, provider_id.clone());
                        out.send_replace(Some(Endpoint { client, marks }));
                        break;
                    }
                    // Said once per identity: the probe says more about an unreachable provider.
                    Err(e) if delay == FIRST => {
                        warn!(error = %e, "no client for the reflectors yet")
                    }
                    Err(e) => {
                        debug!(error = %e, retry_in = ?delay, "no client for the reflectors yet")
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(delay) => delay = (delay * 2).min(MAX),
                    r = secret.changed() => match r {
                        Ok(()) => continue 'identity,
                        Err(_) => return,
                    },
                }
            }
        }
        if out.is_closed() || secret.changed().await.is_err() {
            return;
        }
    }
}
