//! Generic helpers over any object's metadata and the API calls every controller makes the
//! same way: finalizers added and removed with a JSON-patch test (never over a concurrent
//! change), "not found is fine" for any call ([`GoneOk`]) and for deletes (UID-preconditioned
//! or not), and how long an object has been deleting or alive by an injected clock.
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, Resource,
    api::{DeleteParams, ObjectMeta, Patch, PatchParams, Preconditions},
};

/// How long an object has been deleting (zero when it is not, or its clock is ahead).
pub fn deleting_for(meta: &ObjectMeta, now: Timestamp) -> Duration {
    meta.deletion_timestamp
        .as_ref()
        .and_then(|t| now.duration_since(t.0).try_into().ok())
        .unwrap_or_default()
}

/// How long ago `meta` was created (zero when unknown or its clock is ahead).
pub fn age(meta: &ObjectMeta, now: Timestamp) -> Duration {
    meta.creation_timestamp
        .as_ref()
        .and_then(|t| now.duration_since(t.0).try_into().ok())
        .unwrap_or_default()
}

/// Adds finalizer `name` to `obj` (a JSON patch that fails when the finalizers changed
/// meanwhile: the next reconcile tries again with the fresh list).
pub async fn add_finalizer<K>(api: &Api<K>, obj: &K, name: &str) -> kube::Result<()>
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
pub async fn remove_finalizer<K>(api: &Api<K>, obj: &K, name: &str) -> kube::Result<()>
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
    api.patch(
        &obj.meta().name.clone().unwrap_or_default(),
        &PatchParams::default(),
        &Patch::Json::<()>(json_patch::Patch(ops)),
    )
    .await
    .gone_ok()?;
    Ok(())
}

/// Whether `e` is the API server saying the object (or its kind) is not there.
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Whether `e` is a 409 Conflict: a write over a changed version, a create over an existing
/// name, or a failed precondition.
pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// "Not found is fine" for the result of any API call.
pub trait GoneOk<T> {
    /// `Some(value)`, or None when the object is not there (404); other errors stay errors.
    fn gone_ok(self) -> kube::Result<Option<T>>;
}

impl<T> GoneOk<T> for kube::Result<T> {
    fn gone_ok(self) -> kube::Result<Option<T>> {
        match self {
            Ok(v) => Ok(Some(v)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// What a [`delete`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    /// The API accepted the deletion (the object may stay a while, finalizing).
    Asked,
    /// Nothing to delete: the object was gone, or (with a UID precondition) the name now
    /// belongs to another object.
    Gone,
}

/// Deletes `name` with `params`; an object already gone is [`Deleted::Gone`], and so is one
/// whose preconditions (UID) failed: the object they named is gone, even though another of the
/// same name may be there.
pub async fn delete<K>(api: &Api<K>, name: &str, params: &DeleteParams) -> kube::Result<Deleted>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, params).await {
        Ok(_) => Ok(Deleted::Asked),
        Err(e) if is_not_found(&e) => Ok(Deleted::Gone),
        Err(e) if params.preconditions.is_some() && is_conflict(&e) => Ok(Deleted::Gone),
        Err(e) => Err(e),
    }
}

/// Deletes `name`; already gone is fine.
pub async fn delete_gone_ok<K>(api: &Api<K>, name: &str) -> kube::Result<()>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    delete(api, name, &DeleteParams::default())
        .await
        .map(|_| ())
}

/// Delete parameters that only delete the object with `uid` (None: whatever has the name),
/// within `grace_seconds` (None: the object's own grace period).
pub fn only_uid(uid: Option<String>, grace_seconds: Option<u32>) -> DeleteParams {
    DeleteParams {
        grace_period_seconds: grace_seconds,
        preconditions: Some(Preconditions {
            uid,
            resource_version: None,
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn age_counts_from_creation() {
        let now: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let meta = ObjectMeta {
            creation_timestamp: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-01-01T00:00:00Z".parse().unwrap(),
            )),
            ..Default::default()
        };
        assert_eq!(age(&meta, now), Duration::from_secs(60));
        assert_eq!(age(&Default::default(), now), Duration::ZERO);
    }
}
