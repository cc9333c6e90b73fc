//! The edges of who may call the kubelet API ([`super::authn`] and [`super::authz`] decide):
//! where the client CA comes from, and the TokenReviews and SubjectAccessReviews asked of this
//! cluster's API server.
use std::{sync::Mutex, time::Instant};

/// The client CA: a file, or the one the API server publishes (the VirtualNode controller
/// grants reading it).
pub use fabric_kube::client_ca::{CaError, ClientCa, read as client_ca};
use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec},
    authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
};
use kube::{Api, api::PostParams};

use super::{
    authn::{Reviewed, Tokens},
    authz::{Answer, Attributes, Cache, Ttl, User, Verdict, verdict},
};

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
