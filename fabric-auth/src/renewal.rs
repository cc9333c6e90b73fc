//! Renewing a consumer's identities before they expire (`fabric-controller identities`): a
//! controller on the `Identity` objects of this (consumer) cluster that calls
//! [`crate::consumer::renew`] when [`due`] says so. The old certificate keeps working until
//! it expires, and every user of the identity reads the Secret when it builds a client, so a
//! renewal interrupts nothing.
use std::{sync::Arc, time::Duration};

use fabric_api::authentication::v1alpha1::Identity;
use fabric_kube::controller::{Backoff, Runner};
use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, Client, ResourceExt,
    runtime::{Controller, controller::Action, watcher},
};
use tracing::info;

use crate::consumer::{self, ClientError};

/// When to renew.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// Renew once less than this is left of the certificate's validity...
    pub renew_before: Duration,
    /// ...but never sooner than this after the last renewal (a validity shorter than
    /// `renew_before` must not turn into a loop).
    pub min_interval: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            renew_before: Duration::from_secs(8 * 3600),
            min_interval: Duration::from_secs(3600),
        }
    }
}

/// When the identity with certificate `expiry`, last renewed at `renewed_at`, is to be
/// renewed. Unknown expiry: now (a renewal learns it).
pub fn due(policy: &Policy, expiry: Option<Timestamp>, renewed_at: Option<Timestamp>) -> Timestamp {
    let Some(expiry) = expiry else {
        return renewed_at.map_or(Timestamp::UNIX_EPOCH, |r| r + policy.min_interval);
    };
    let by_expiry = expiry - policy.renew_before;
    match renewed_at {
        Some(r) => by_expiry.max(r + policy.min_interval),
        None => by_expiry,
    }
}

struct Ctx {
    client: Client,
    namespace: String,
    policy: Policy,
}

#[derive(Debug, thiserror::Error)]
#[error("renewing the identity issued by {provider}: {source}")]
struct RenewError {
    provider: String,
    #[source]
    source: ClientError,
}

fn until(t: Timestamp, now: Timestamp) -> Duration {
    Duration::try_from(t.duration_since(now)).unwrap_or(Duration::ZERO)
}

async fn reconcile(id: Arc<Identity>, ctx: Arc<Ctx>) -> Result<Action, RenewError> {
    let status = id.status.clone().unwrap_or_default();
    let now = Timestamp::now();
    // The identity is stored before its status: one seen in between was issued just now,
    // not long ago (renewing it at once would race the first use of the new certificate).
    let renewed_at = status
        .renewed_at
        .or_else(|| id.metadata.creation_timestamp.clone())
        .map(|t| t.0);
    let when = due(
        &ctx.policy,
        status.certificate_expiry.map(|t| t.0),
        renewed_at,
    );
    if when > now {
        return Ok(Action::requeue(until(when, now)));
    }
    let provider = id.name_any();
    let renewed = consumer::renew(&ctx.client, &ctx.namespace, &provider)
        .await
        .map_err(|source| RenewError {
            provider: provider.clone(),
            source,
        })?;
    info!(provider = %provider, namespace = %renewed.namespace, "renewed the identity");
    // The status change comes back through the watch; this is a fallback.
    Ok(Action::requeue(ctx.policy.min_interval))
}

/// A failed renewal is tried again after 30 s, then less and less often: the certificate has
/// hours left (`renew_before`), and a provider that keeps refusing is not hammered.
const BACKOFF: Backoff = Backoff::new(Duration::from_secs(30), Duration::from_secs(300));

/// Keeps the identities in `namespace` renewed until the task is dropped or SIGTERM/SIGINT.
pub async fn run(client: Client, namespace: &str, policy: Policy) {
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        namespace: namespace.to_owned(),
        policy,
    });
    let controller = Controller::new(
        Api::<Identity>::namespaced(client, namespace),
        watcher::Config::default(),
    );
    Runner::new("identity renewal", BACKOFF)
        .run(controller, reconcile, ctx)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn renewal_comes_before_expiry_and_never_loops() {
        let p = Policy {
            renew_before: Duration::from_secs(3600),
            min_interval: Duration::from_secs(600),
        };
        let exp = t("2026-01-02T00:00:00Z");
        assert_eq!(due(&p, Some(exp), None), t("2026-01-01T23:00:00Z"));
        assert_eq!(
            due(&p, Some(exp), Some(t("2026-01-01T00:00:00Z"))),
            t("2026-01-01T23:00:00Z")
        );
        // A certificate shorter than renew_before: renewed, then left alone a while.
        assert_eq!(
            due(
                &p,
                Some(t("2026-01-01T00:30:00Z")),
                Some(t("2026-01-01T00:00:00Z"))
            ),
            t("2026-01-01T00:10:00Z")
        );
        assert_eq!(due(&p, None, None), Timestamp::UNIX_EPOCH);
        assert_eq!(
            due(&p, None, Some(t("2026-01-01T00:00:00Z"))),
            t("2026-01-01T00:10:00Z")
        );
    }
}
