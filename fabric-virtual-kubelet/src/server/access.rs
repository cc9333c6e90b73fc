//! The edges of who may call the kubelet API ([`super::authn`] and [`super::authz`] decide):
//! where the client CA comes from, and the TokenReviews and SubjectAccessReviews asked of this
//! cluster's API server.
use std::{path::PathBuf, sync::Mutex, time::Instant};

/// Where the API server publishes its client CA for delegated authentication, as upstream's
/// kube-apiserver does (aggregated API servers and metrics-server read it there); the
/// VirtualNode controller grants reading it.
pub use fabric_offloading::virtual_node::objects::{
    CLIENT_CA_CONFIGMAP as AUTHENTICATION_CONFIGMAP,
    CLIENT_CA_CONFIGMAP_NAMESPACE as AUTHENTICATION_CONFIGMAP_NAMESPACE,
};
use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec},
    authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
    core::v1::ConfigMap,
};
use kube::{Api, api::PostParams};

use super::{
    authn::{Reviewed, Tokens},
    authz::{Answer, Attributes, Cache, Ttl, User, Verdict, verdict},
};
pub const CLIENT_CA_KEY: &str = "client-ca-file";

/// The CA bundle the API server's kubelet client certificate chains to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientCa {
    /// A PEM file (`--client-ca-file`, e.g. mounted from a ConfigMap or Secret).
    File(PathBuf),
    /// `client-ca-file` of ConfigMap kube-system/extension-apiserver-authentication: the
    /// CA of the API server's `--client-ca-file`, which in kubeadm and most distributions
    /// also signs its `--kubelet-client-certificate`.
    Cluster,
}

impl std::fmt::Display for ClientCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientCa::File(p) => write!(f, "{}", p.display()),
            ClientCa::Cluster => write!(
                f,
                "{CLIENT_CA_KEY} of ConfigMap \
                 {AUTHENTICATION_CONFIGMAP_NAMESPACE}/{AUTHENTICATION_CONFIGMAP}"
            ),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("reading {0}: {1}")]
    File(PathBuf, std::io::Error),
    #[error("reading the client CA ConfigMap: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0} is not there")]
    Missing(ClientCa),
}

/// The client CA bundle (PEM) as it is now.
pub async fn client_ca(local: &kube::Client, source: &ClientCa) -> Result<String, CaError> {
    match source {
        ClientCa::File(p) => std::fs::read_to_string(p).map_err(|e| CaError::File(p.clone(), e)),
        ClientCa::Cluster => {
            let cm =
                Api::<ConfigMap>::namespaced(local.clone(), AUTHENTICATION_CONFIGMAP_NAMESPACE)
                    .get_opt(AUTHENTICATION_CONFIGMAP)
                    .await?;
            cm.and_then(|cm| cm.data?.remove(CLIENT_CA_KEY))
                .filter(|pem| !pem.trim().is_empty())
                .ok_or(CaError::Missing(ClientCa::Cluster))
        }
    }
}

/// Asks this cluster's API server whether a user may do what a request stands for
/// (SubjectAccessReview), keeping answers for their [`Ttl`].
pub struct Authorizer {
    local: kube::Client,
    cache: Mutex<Cache>,
}

impl Authorizer {
    pub fn new(local: kube::Client, ttl: Ttl) -> Self {
        Authorizer {
            local,
            cache: Mutex::new(Cache::new(ttl)),
        }
    }

    /// The verdict on a request needing any of `attrs` ([`super::authz::attributes`]).
    pub async fn decide(&self, attrs: &[Attributes]) -> Result<Verdict, kube::Error> {
        let mut answers = Vec::with_capacity(attrs.len());
        for a in attrs {
            let cached = self
                .cache
                .lock()
                .expect("not poisoned")
                .get(a, Instant::now());
            let answer = match cached {
                Some(answer) => answer,
                None => {
                    let answer = self.review(a).await?;
                    self.cache.lock().expect("not poisoned").put(
                        a.clone(),
                        answer.clone(),
                        Instant::now(),
                    );
                    answer
                }
            };
            let allowed = answer.allowed;
            answers.push(answer);
            if allowed {
                break;
            }
        }
        Ok(verdict(attrs, &answers))
    }

    async fn review(&self, a: &Attributes) -> Result<Answer, kube::Error> {
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(a.user.name.clone()),
                groups: Some(a.user.groups.clone()),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(String::new()),
                    version: Some("v1".to_owned()),
                    resource: Some("nodes".to_owned()),
                    subresource: Some(a.subresource.to_owned()),
                    name: Some(a.node.clone()),
                    verb: Some(a.verb.to_owned()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let r = Api::<SubjectAccessReview>::all(self.local.clone())
            .create(&PostParams::default(), &sar)
            .await?;
        let status = r.status.unwrap_or_default();
        Ok(Answer {
            allowed: status.allowed && status.denied != Some(true),
            reason: status.reason.unwrap_or_default(),
        })
    }
}

/// Asks this cluster's API server whose a bearer token is (TokenReview, for the API server's
/// own audiences, as a kubelet does), keeping reviews for a while ([`Tokens`]).
pub struct Authenticator {
    local: kube::Client,
    cache: Mutex<Tokens>,
}

impl Authenticator {
    pub fn new(local: kube::Client, ttl: std::time::Duration) -> Self {
        Authenticator {
            local,
            cache: Mutex::new(Tokens::new(ttl)),
        }
    }

    pub async fn authenticate(&self, token: &str) -> Result<Reviewed, kube::Error> {
        let cached = self
            .cache
            .lock()
            .expect("not poisoned")
            .get(token, Instant::now());
        if let Some(r) = cached {
            return Ok(r);
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                audiences: None,
            },
            ..Default::default()
        };
        let r = Api::<TokenReview>::all(self.local.clone())
            .create(&PostParams::default(), &review)
            .await?;
        let status = r.status.unwrap_or_default();
        let reviewed = match status.user.and_then(|u| u.username.map(|n| (n, u.groups))) {
            Some((name, groups)) if status.authenticated == Some(true) && !name.is_empty() => {
                Reviewed::User(User {
                    name,
                    groups: groups.unwrap_or_default(),
                })
            }
            _ => Reviewed::Rejected(status.error.unwrap_or_default()),
        };
        self.cache
            .lock()
            .expect("not poisoned")
            .put(token, reviewed.clone(), Instant::now());
        Ok(reviewed)
    }
}
