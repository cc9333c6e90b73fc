//! What the negotiation controllers share: their context, errors, and the ForeignCluster
//! conditions they maintain.
use std::{future::Future, sync::Arc, time::Duration};

use fabric_api::{core::v1alpha1::ForeignCluster, names::field_manager};
use fabric_kube::{
    FieldManager,
    controller::Backoff,
    events::Events,
    status::{self, Reason, Verdict},
};
use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, Client, Resource,
    api::{Patch, PatchParams},
};

/// Everything the sharing controllers write.
pub const FIELD_MANAGER: FieldManager = FieldManager(field_manager::SHARING);

/// How long a call to a provider's API may take before the provider counts as unreachable.
pub const REMOTE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Peering(#[from] fabric_peering::Error),
    #[error("the identity for provider {provider}: {source}")]
    Identity {
        provider: String,
        #[source]
        source: fabric_auth::identity::Error,
    },
    #[error("no Identity for provider {provider}: this cluster cannot reach it")]
    NoIdentity { provider: String },
    #[error("provider {provider}: {source}")]
    Remote {
        provider: String,
        #[source]
        source: kube::Error,
    },
    #[error("provider {provider} did not answer within {REMOTE_TIMEOUT:?}")]
    RemoteTimeout { provider: String },
    #[error(transparent)]
    Finalizer(#[from] fabric_kube::controller::FinalizerError),
}

/// The context of every negotiation controller.
pub struct Ctx {
    /// This cluster's API.
    pub client: Client,
    /// Where the fabric runs here (its identity, gateway, network objects, Identities,
    /// the consumer's ResourceSlices and VirtualNodes).
    pub namespace: String,
    pub events: Events,
    /// How often a consumer looks at its provider's answers (status of the PeeringNetwork and
    /// ResourceSlice replicas): the provider's API is not watched.
    pub remote_poll: Duration,
    /// The providers' clients, shared by every controller: one connection to each provider
    /// rather than one per call.
    pub remote_clients: fabric_auth::identity::RemoteClients,
}

pub type Shared = Arc<Ctx>;

impl Ctx {
    /// How the negotiation controllers retry: soon, then at the polling period a provider is
    /// looked at anyway (a provider out of reach is polled, not backed off from).
    pub fn backoff(&self) -> Backoff {
        Backoff::new(Duration::from_secs(1), self.remote_poll)
    }
}

/// A call to provider `provider`'s API, bounded by [`REMOTE_TIMEOUT`].
pub async fn remote<T>(
    provider: &str,
    call: impl Future<Output = kube::Result<T>>,
) -> Result<T, Error> {
    match tokio::time::timeout(REMOTE_TIMEOUT, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(Error::Remote {
            provider: provider.to_owned(),
            source,
        }),
        Err(_) => Err(Error::RemoteTimeout {
            provider: provider.to_owned(),
        }),
    }
}

/// A client for provider `provider` from this cluster's Identity Secret.
pub async fn remote_client(ctx: &Ctx, provider: &str) -> Result<Client, Error> {
    ctx.remote_clients
        .get(&ctx.client, provider)
        .await
        .map_err(|source| Error::Identity {
            provider: provider.to_owned(),
            source,
        })
}

/// Sets condition `type_` on ForeignCluster `name`, when it exists and the condition changed.
/// Only that condition is applied (the conditions are a map by type): the other modules'
/// stay theirs.
pub async fn set_fc_condition<R: Reason>(
    client: &Client,
    name: &str,
    type_: &str,
    verdict: &Verdict<R>,
) -> Result<(), Error> {
    FcConditions::read(client, name)
        .await?
        .set(type_, verdict)
        .await
}

/// ForeignCluster `name` read once to set several of its conditions: each is applied alone,
/// under a field manager of its own, so a condition set here leaves the others of the copy
/// as they are, and the copy stays good for the next one.
pub struct FcConditions {
    api: Api<ForeignCluster>,
    fc: Option<ForeignCluster>,
}

impl FcConditions {
    pub async fn read(client: &Client, name: &str) -> Result<Self, Error> {
        let api: Api<ForeignCluster> = Api::all(client.clone());
        let fc = api.get_opt(name).await?;
        Ok(Self { api, fc })
    }

    /// Sets condition `type_` when the ForeignCluster exists and the condition changed.
    pub async fn set<R: Reason>(&self, type_: &str, verdict: &Verdict<R>) -> Result<(), Error> {
        let Some(fc) = &self.fc else {
            return Ok(());
        };
        let current = fc
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        let old = current.iter().find(|c| c.type_ == type_);
        if old.is_some_and(|c| verdict.says(c)) {
            return Ok(());
        }
        let merged = status::with_condition(
            &current,
            verdict.condition(type_, fc.metadata.generation, Timestamp::now()),
        );
        let mine = merged
            .into_iter()
            .find(|c| c.type_ == type_)
            .expect("with_condition keeps it");
        // One field manager per condition: an apply owns exactly the fields it sends, so two
        // conditions applied under the same manager would each drop the other.
        let manager = format!("{}/{type_}", FIELD_MANAGER.0);
        let patch = serde_json::json!({
            "apiVersion": ForeignCluster::api_version(&()),
            "kind": ForeignCluster::kind(&()),
            "status": { "conditions": [mine] },
        });
        self.api
            .patch_status(
                &kube::ResourceExt::name_any(fc),
                &PatchParams::apply(&manager).force(),
                &Patch::Apply(&patch),
            )
            .await?;
        Ok(())
    }
}

/// How long a consumer looks again soon (every [`ANSWER_POLL`]) for a provider's first answer
/// to an object it wrote there, counted from the object's creation.
pub const ANSWER_WAIT: Duration = Duration::from_secs(30);
/// See [`ANSWER_WAIT`].
pub const ANSWER_POLL: Duration = Duration::from_millis(250);

/// When a consumer looks again at an object on its provider that has no answer yet, created
/// there `waited` ago: someone waits on a fresh peering (`fabricctl peer` follows it), so soon
/// at first; an answer that is long in coming is looked for at the steady `remote_poll`.
pub fn answer_poll(remote_poll: Duration, waited: Duration) -> Duration {
    if waited < ANSWER_WAIT {
        remote_poll.min(ANSWER_POLL)
    } else {
        remote_poll
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_wait_for_an_answer_polls_soon_and_a_long_one_does_not() {
        let steady = Duration::from_secs(2);
        assert_eq!(answer_poll(steady, Duration::ZERO), ANSWER_POLL);
        assert_eq!(answer_poll(steady, Duration::from_secs(29)), ANSWER_POLL);
        assert_eq!(answer_poll(steady, ANSWER_WAIT), steady);
        // Never slower than asked for.
        let fast = Duration::from_millis(100);
        assert_eq!(answer_poll(fast, Duration::ZERO), fast);
    }
}
