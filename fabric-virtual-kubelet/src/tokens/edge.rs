//! The token edge: TokenRequests to the home API server, bound to the home pod, and their
//! Secrets in the twin, written before the ShadowPod exists (its pod must not start without
//! them), refreshed when [`super::state`] says so, deleted with the pod (UID-preconditioned,
//! ours only). The pod kind's [`crate::pods::act`] calls it and looks at the pod again when
//! the next token is due.
use std::time::Duration;

use fabric_kube::meta;
use fabric_reflector::Marks;
use k8s_openapi::{
    api::{
        authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec},
        core::v1::{Pod, Secret, ServiceAccount},
    },
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt,
    api::{ObjectMeta, PostParams},
};
use tracing::info;

use super::{State, Wanted};

/// Why a pod's tokens could not be made.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The home API server refused the token (its service account missing, the request
    /// forbidden): the pod waits, saying so at home.
    #[error("the home API server refused a token for service account {account}: {message}")]
    Refused { account: String, message: String },
    /// A Secret of that name in the twin is not ours: left alone, the pod waits.
    #[error("Secret {0} in the twin is not the fabric's: its token cannot be delivered")]
    NotOurs(String),
    /// Anything else (the provider or home out of reach): tried again.
    #[error("{0}")]
    Api(#[from] kube::Error),
}

/// The twin's Secrets, as the pod kind's endpoint holds them.
pub struct Twin<'a> {
    pub secrets: Api<Secret>,
    pub marks: &'a Marks,
}

/// Makes sure each of `wanted` (the tokens of `pod`) is in the twin and not due, requesting
/// those that are not from `home`; returns how long until the first is due.
pub async fn ensure(
    home: &Client,
    twin: &Twin<'_>,
    pod: &Pod,
    wanted: &[Wanted],
    now: impl Fn() -> Timestamp,
) -> Result<Option<Duration>, Error> {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let mut next = Vec::new();
    for w in wanted {
        let have = twin.secrets.get_opt(&w.secret).await?;
        let ours = have.as_ref().is_some_and(|s| twin.marks.on(&s.metadata));
        match super::state(have.as_ref(), ours, &uid, w, now()) {
            State::Fresh(at) => next.push(at),
            State::NotOurs => return Err(Error::NotOurs(w.secret.clone())),
            state => {
                let (token, issued, expires) = request(home, pod, w, &now).await?;
                let mut labels = Default::default();
                twin.marks.stamp(&mut labels);
                let mut s = super::secret(w, &token, &uid, issued, expires, labels);
                match have {
                    Some(old) => {
                        s.metadata.resource_version = old.metadata.resource_version;
                        twin.secrets
                            .replace(&w.secret, &PostParams::default(), &s)
                            .await?;
                    }
                    None => {
                        twin.secrets.create(&PostParams::default(), &s).await?;
                    }
                }
                info!(pod = pod.name_any(), secret = w.secret, ?state, %expires, "service-account token delivered");
                next.push(super::refresh_at(issued, expires, w.expiration_seconds));
            }
        }
    }
    Ok(super::until_earliest(next, now()))
}

/// A token for `w`, bound to `pod`, from the home API server: the token, when it was issued
/// (by `now`) and when it expires.
async fn request(
    home: &Client,
    pod: &Pod,
    w: &Wanted,
    now: &impl Fn() -> Timestamp,
) -> Result<(String, Timestamp, Timestamp), Error> {
    let accounts: Api<ServiceAccount> =
        Api::namespaced(home.clone(), &pod.namespace().unwrap_or_default());
    let ask = TokenRequest {
        metadata: ObjectMeta::default(),
        spec: Some(TokenRequestSpec {
            audiences: Some(w.audiences.clone()),
            expiration_seconds: Some(w.expiration_seconds),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
            ..Default::default()
        }),
        status: None,
    };
    let issued = now();
    let answer = match accounts
        .create_token_request(&w.account, &PostParams::default(), &ask)
        .await
    {
        Ok(a) => a,
        Err(kube::Error::Api(e)) if matches!(e.code, 400 | 403 | 404 | 422) => {
            return Err(Error::Refused {
                account: w.account.clone(),
                message: e.message,
            });
        }
        Err(e) => return Err(e.into()),
    };
    let status = answer.status.unwrap_or_default();
    let (Some(token), Some(expires)) = (status.token, status.expiration_timestamp) else {
        return Err(Error::Refused {
            account: w.account.clone(),
            message: "the TokenRequest came back without a token or its expiry".into(),
        });
    };
    Ok((token, issued, expires.0))
}

/// Deletes the token Secrets `wanted` of the pod of UID `uid` from the twin: ours only, each
/// UID-preconditioned against the version read (a Secret made again meanwhile stays).
pub async fn remove(twin: &Twin<'_>, uid: &str, wanted: &[Wanted]) -> Result<(), Error> {
    let names: Vec<String> = wanted.iter().map(|w| w.secret.clone()).collect();
    remove_named(twin, uid, &names).await
}

/// Deletes the token Secrets `names` of the pod of UID `uid` from the twin, as [`remove`]:
/// ours, made for that pod, UID-preconditioned.
pub async fn remove_named(twin: &Twin<'_>, uid: &str, names: &[String]) -> Result<(), Error> {
    for name in names {
        let Some(s) = twin.secrets.get_opt(name).await? else {
            continue;
        };
        let for_pod = s
            .annotations()
            .get(fabric_api::names::service_account_token::POD_UID)
            .is_some_and(|u| u == uid);
        if !twin.marks.on(&s.metadata) || !for_pod {
            continue;
        }
        let dp = meta::only_uid(s.metadata.uid.clone(), None);
        if meta::delete(&twin.secrets, name, &dp).await? == meta::Deleted::Asked {
            info!(secret = name, "service-account token removed from the twin");
        }
    }
    Ok(())
}

/// The twin's Secrets of `namespace` through `client`.
pub fn twin<'a>(client: &Client, namespace: &str, marks: &'a Marks) -> Twin<'a> {
    Twin {
        secrets: Api::namespaced(client.clone(), namespace),
        marks,
    }
}

/// Whether `e` would go away by itself (tried again with back-off) rather than needing the
/// pod's owner (said at home).
pub fn transient(e: &Error) -> bool {
    matches!(e, Error::Api(_))
}
