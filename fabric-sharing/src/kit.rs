//! What the negotiation controllers share: their context, errors, and the ForeignCluster
//! conditions they maintain.
use std::{future::Future, sync::Arc, time::Duration};

use fabric_api::{core::v1alpha1::ForeignCluster, names::field_manager};
use fabric_kube::{FieldManager, events::Events, status};
use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, Client, Resource,
    api::{Patch, PatchParams},
    runtime::finalizer,
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
        source: crate::identity::Error,
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
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<finalizer::Error<Error>>),
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
}

pub type Shared = Arc<Ctx>;

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
    crate::identity::remote_client(&ctx.client, &ctx.namespace, provider)
        .await
        .map_err(|source| Error::Identity {
            provider: provider.to_owned(),
            source,
        })
}

/// Sets condition `type_` on ForeignCluster `name`, when it exists and the condition changed.
/// Only that condition is applied (the conditions are a map by type): the other modules'
/// stay theirs.
pub async fn set_fc_condition(
    client: &Client,
    name: &str,
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
) -> Result<(), Error> {
    let api: Api<ForeignCluster> = Api::all(client.clone());
    let Some(fc) = api.get_opt(name).await? else {
        return Ok(());
    };
    let current = fc.status.map(|s| s.conditions).unwrap_or_default();
    let old = current.iter().find(|c| c.type_ == type_);
    let status_str = if ok { "True" } else { "False" };
    if old.is_some_and(|c| c.status == status_str && c.reason == reason && c.message == message) {
        return Ok(());
    }
    let merged = status::with_condition(
        &current,
        status::condition(
            type_,
            ok,
            reason,
            message,
            fc.metadata.generation,
            Timestamp::now(),
        ),
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
    api.patch_status(
        name,
        &PatchParams::apply(&manager).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

/// How long an object has been deleting (zero when it is not, or its clock is ahead).
pub fn deleting_for(meta: &kube::api::ObjectMeta, now: Timestamp) -> Duration {
    meta.deletion_timestamp
        .as_ref()
        .and_then(|t| now.duration_since(t.0).try_into().ok())
        .unwrap_or_default()
}

/// Adds finalizer `name` to `obj` (a JSON patch that fails when the finalizers changed
/// meanwhile: the next reconcile tries again with the fresh list).
pub async fn add_finalizer<K>(api: &Api<K>, obj: &K, name: &str) -> Result<(), Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    use json_patch::{AddOperation, PatchOperation, TestOperation};
    let current = obj.meta().finalizers.clone().unwrap_or_default();
    if current.iter().any(|f| f == name) {
        return Ok(());
    }
    let ops = if current.is_empty() {
        vec![
            PatchOperation::Test(TestOperation {
                path: "/metadata/finalizers".try_into().expect("a JSON pointer"),
                value: serde_json::Value::Null,
            }),
            PatchOperation::Add(AddOperation {
                path: "/metadata/finalizers".try_into().expect("a JSON pointer"),
                value: serde_json::json!([name]),
            }),
        ]
    } else {
        vec![
            PatchOperation::Test(TestOperation {
                path: "/metadata/finalizers".try_into().expect("a JSON pointer"),
                value: serde_json::json!(current),
            }),
            PatchOperation::Add(AddOperation {
                path: "/metadata/finalizers/-".try_into().expect("a JSON pointer"),
                value: serde_json::json!(name),
            }),
        ]
    };
    api.patch(
        &obj.meta().name.clone().unwrap_or_default(),
        &PatchParams::default(),
        &Patch::Json::<()>(json_patch::Patch(ops)),
    )
    .await?;
    Ok(())
}

/// Removes finalizer `name` from `obj`; an object already gone is fine.
pub async fn remove_finalizer<K>(api: &Api<K>, obj: &K, name: &str) -> Result<(), Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    use json_patch::{PatchOperation, RemoveOperation, TestOperation};
    let current = obj.meta().finalizers.clone().unwrap_or_default();
    let Some(i) = current.iter().position(|f| f == name) else {
        return Ok(());
    };
    let path = format!("/metadata/finalizers/{i}");
    let ops = vec![
        PatchOperation::Test(TestOperation {
            path: path.as_str().try_into().expect("a JSON pointer"),
            value: serde_json::json!(name),
        }),
        PatchOperation::Remove(RemoveOperation {
            path: path.as_str().try_into().expect("a JSON pointer"),
        }),
    ];
    match api
        .patch(
            &obj.meta().name.clone().unwrap_or_default(),
            &PatchParams::default(),
            &Patch::Json::<()>(json_patch::Patch(ops)),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Deletes `name`; already gone is fine.
pub async fn delete_gone_ok<K>(api: &Api<K>, name: &str) -> Result<(), Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &Default::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
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

/// How long ago `meta` was created (zero when unknown or its clock is ahead).
pub fn age(meta: &kube::api::ObjectMeta, now: Timestamp) -> Duration {
    meta.creation_timestamp
        .as_ref()
        .and_then(|t| now.duration_since(t.0).try_into().ok())
        .unwrap_or_default()
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

    #[test]
    fn age_counts_from_creation() {
        let now: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let meta = kube::api::ObjectMeta {
            creation_timestamp: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-01-01T00:00:00Z".parse().unwrap(),
            )),
            ..Default::default()
        };
        assert_eq!(age(&meta, now), Duration::from_secs(60));
        assert_eq!(age(&Default::default(), now), Duration::ZERO);
    }
}
