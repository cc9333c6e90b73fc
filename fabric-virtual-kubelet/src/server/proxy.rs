//! The requests behind each kubelet API call: who asks (the client certificate's user, allowed
//! by a SubjectAccessReview), the home pod and the VirtualNode from this cluster, the provider's client from the identity Secret, the pod's ShadowPod in the tenant
//! namespace, then the provider's `pods/log` (streamed) or the upgrade relay.
use bytes::Bytes;
use fabric_api::offloading::v1alpha1::{MappingPhase, NamespaceMap, ShadowPod, VirtualNode};
use fabric_auth::identity;
use fabric_offloading::shadowpod::forge;
use http_body_util::{BodyExt as _, Full, combinators::UnsyncBoxBody};
use hyper::{Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Resource as _, client::Body as KubeBody};
use tracing::{debug, info, warn};

use super::{
    Config,
    access::{Authenticator, Authorizer},
    authn::{self, Reviewed},
    authz::{self, CertError, User, Verdict},
    route::{self, Refused, Route},
};

pub type Error = Box<dyn std::error::Error + Send + Sync>;
pub type Body = UnsyncBoxBody<Bytes, Error>;

pub struct Proxy {
    local: kube::Client,
    metrics: std::sync::Arc<fabric_reflector::Metrics>,
    authenticator: Option<Authenticator>,
    authorizer: Authorizer,
    namespace: String,
    virtual_node: String,
}

fn text(code: StatusCode, msg: impl Into<String>) -> Response<Body> {
    let mut msg = msg.into();
    msg.push('\n');
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(
            Full::new(Bytes::from(msg))
                .map_err(|e| match e {})
                .boxed_unsync(),
        )
        .expect("a valid response")
}

/// 401 to a client that did not authenticate, and its connection closed: it gets one request
/// per handshake, so that it cannot hold a connection slot (nor make this process ask for a
/// TokenReview again and again) by sending requests on a kept-alive connection.
fn unauthorized() -> Response<Body> {
    let mut r = text(StatusCode::UNAUTHORIZED, "Unauthorized");
    r.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    r
}

fn metrics(m: &fabric_reflector::Metrics) -> Response<Body> {
    Response::builder()
        .status(StatusCode::OK)
        .header(
            header::CONTENT_TYPE,
            fabric_reflector::metrics::CONTENT_TYPE,
        )
        .body(
            Full::new(Bytes::from(m.render()))
                .map_err(|e| match e {})
                .boxed_unsync(),
        )
        .expect("a valid response")
}

fn refused(r: &Refused) -> Response<Body> {
    text(
        StatusCode::from_u16(r.status()).unwrap_or(StatusCode::BAD_REQUEST),
        r.to_string(),
    )
}

/// Why the provider could not be asked.
#[derive(Debug, thiserror::Error)]
enum Unavailable {
    #[error("reading VirtualNode {0}: {1}")]
    VirtualNode(String, kube::Error),
    #[error("reading pod {0}: {1}")]
    Pod(route::PodRef, kube::Error),
    #[error("the provider's identity: {0}")]
    Identity(#[from] identity::Error),
    #[error("reading the ShadowPod on provider {0}: {1}")]
    ShadowPods(String, kube::Error),
    #[error("building the provider request: {0}")]
    Request(String),
    #[error("provider {0} unreachable: {1}")]
    Provider(String, kube::Error),
}

enum Outcome {
    Refused(Refused),
    Unavailable(Unavailable),
}

impl From<Refused> for Outcome {
    fn from(r: Refused) -> Self {
        Outcome::Refused(r)
    }
}

impl From<identity::Error> for Outcome {
    fn from(e: identity::Error) -> Self {
        Outcome::Unavailable(e.into())
    }
}

impl From<Unavailable> for Outcome {
    fn from(u: Unavailable) -> Self {
        Outcome::Unavailable(u)
    }
}

impl Proxy {
    pub fn new(local: kube::Client, c: &Config) -> Self {
        Proxy {
            authenticator: c
                .token_review
                .map(|ttl| Authenticator::new(local.clone(), ttl)),
            authorizer: Authorizer::new(local.clone(), c.authz_ttl),
            local,
            metrics: c.metrics.clone(),
            namespace: c.namespace.clone(),
            virtual_node: c.virtual_node.clone(),
        }
    }

    /// The user of the request's bearer token, or why there is none (logged, never told: a
    /// client learns only that it is not authenticated, as from a kubelet).
    async fn token_user<B>(&self, req: &Request<B>) -> Result<User, String> {
        let Some(authenticator) = &self.authenticator else {
            return Err("no client certificate (bearer tokens are not taken)".to_owned());
        };
        let Some(header) = req.headers().get(header::AUTHORIZATION) else {
            return Err("no client certificate and no bearer token".to_owned());
        };
        let token = header
            .to_str()
            .ok()
            .and_then(authn::bearer_token)
            .ok_or("an Authorization header that is not a bearer token")?;
        match authenticator.authenticate(token).await {
            Ok(Reviewed::User(u)) => Ok(u),
            Ok(Reviewed::Rejected(reason)) => Err(format!("token rejected: {reason}")),
            Err(e) => {
                warn!(error = %e, "kubelet API: TokenReview");
                Err(format!("TokenReview failed: {e}"))
            }
        }
    }

    /// Answers `req` of `client` (the user of its verified certificate, None without one).
    pub async fn handle(
        &self,
        client: &Option<Result<User, CertError>>,
        req: Request<hyper::body::Incoming>,
    ) -> Response<Body> {
        let method = req.method().as_str().to_owned();
        let path = req.uri().path().to_owned();
        let query = req.uri().query().unwrap_or_default().to_owned();
        let by_token;
        let user = match client {
            Some(Ok(u)) => u,
            Some(Err(e)) => {
                info!(%method, %path, error = %e, "kubelet API: unauthorized");
                return unauthorized();
            }
            None => match self.token_user(&req).await {
                Ok(u) => {
                    by_token = u;
                    &by_token
                }
                Err(why) => {
                    debug!(%method, %path, why, "kubelet API: unauthorized");
                    return unauthorized();
                }
            },
        };
        let vn = match Api::<VirtualNode>::namespaced(self.local.clone(), &self.namespace)
            .get(&self.virtual_node)
            .await
        {
            Ok(vn) => vn,
            Err(e) => {
                let u = Unavailable::VirtualNode(self.virtual_node.clone(), e);
                warn!(%path, error = %u, "kubelet API");
                return text(StatusCode::SERVICE_UNAVAILABLE, u.to_string());
            }
        };
        let attrs = authz::attributes(user, &method, &path, &vn.spec.node_name);
        match self.authorizer.decide(&attrs).await {
            Ok(Verdict::Allowed) => {}
            Ok(Verdict::Forbidden(why)) => {
                info!(%method, %path, user = %user.name, "kubelet API: {why}");
                return text(StatusCode::FORBIDDEN, why);
            }
            Err(e) => {
                warn!(%method, %path, user = %user.name, error = %e, "kubelet API: SubjectAccessReview");
                return text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("Authorization error (user={}): {e}", user.name),
                );
            }
        }
        let route = match Route::parse(&method, &path, &query) {
            Ok(r) => r,
            Err(r) => {
                debug!(%method, %path, refused = %r, "kubelet API");
                return refused(&r);
            }
        };
        match self.forward(vn, route, req).await {
            Ok(resp) => resp,
            Err(Outcome::Refused(r)) => {
                info!(%path, refused = %r, "kubelet API");
                refused(&r)
            }
            Err(Outcome::Unavailable(u)) => {
                warn!(%path, error = %u, "kubelet API");
                let code = match u {
                    Unavailable::Provider(..) => StatusCode::BAD_GATEWAY,
                    _ => StatusCode::SERVICE_UNAVAILABLE,
                };
                text(code, u.to_string())
            }
        }
    }

    async fn forward(
        &self,
        vn: VirtualNode,
        route: Route,
        req: Request<hyper::body::Incoming>,
    ) -> Result<Response<Body>, Outcome> {
        if let Route::Metrics = route {
            return Ok(metrics(&self.metrics));
        }
        let Some(want) = route.pod().cloned() else {
            return Ok(text(StatusCode::OK, "ok"));
        };
        let (node, provider) = (vn.spec.node_name, vn.spec.cluster_id);
        let home = Api::<Pod>::namespaced(self.local.clone(), &want.namespace)
            .get_opt(&want.name)
            .await
            .map_err(|e| Unavailable::Pod(want.clone(), e))?;
        // Refused before the provider is asked anything.
        let uid = route::bound_here(&want, home.as_ref(), &node)?;
        let remote = identity::remote_client(&self.local, &provider).await?;
        let tenant_ns = remote.default_namespace().to_owned();
        let unavailable = |e| Unavailable::ShadowPods(provider.clone(), e);
        // In the twin of its namespace under its own name, or (offloaded pod by pod) in the
        // tenant namespace by its deterministic name; `target` checks it is this very pod's.
        let twin = Api::<NamespaceMap>::namespaced(remote.clone(), &tenant_ns)
            .list(&Default::default())
            .await
            .map_err(unavailable)?
            .items
            .into_iter()
            .filter_map(|m| m.status)
            .flat_map(|s| s.namespaces)
            .find(|t| t.home == want.namespace && t.phase == MappingPhase::Accepted)
            .map(|t| t.remote);
        let in_twin = match &twin {
            Some(ns) => Api::<ShadowPod>::namespaced(remote.clone(), ns)
                .get_opt(&want.name)
                .await
                .map_err(unavailable)?,
            None => None,
        };
        let in_twin = twin
            .as_deref()
            .zip(in_twin)
            .and_then(|(ns, s)| route::target(&want, &uid, &provider, ns, &[s]).ok());
        let target = match in_twin {
            Some(t) => t,
            None => {
                let shadow = Api::<ShadowPod>::namespaced(remote.clone(), &tenant_ns)
                    .get_opt(&forge::name(&want.namespace, &want.name))
                    .await
                    .map_err(unavailable)?;
                route::target(&want, &uid, &provider, &tenant_ns, shadow.as_slice())?
            }
        };
        let upstream = match &route {
            Route::Logs {
                container, params, ..
            } => {
                let params = kube::api::LogParams {
                    container: Some(container.clone()),
                    ..params.clone()
                };
                let r = kube::core::Request::new(Pod::url_path(&(), Some(&target.namespace)))
                    .logs(&target.name, &params)
                    .map_err(|e| Unavailable::Request(e.to_string()))?;
                info!(pod = %want, provider, real = %target.name, follow = params.follow, "logs");
                let r = r.map(KubeBody::from);
                return self.send(&remote, &provider, r).await.map(passthrough);
            }
            route => route::provider_path(route, &target).expect("a streaming route"),
        };
        info!(pod = %want, provider, real = %target.name, request = %upstream, "stream");
        self.relay(&remote, &provider, upstream, req).await
    }

    async fn send(
        &self,
        remote: &kube::Client,
        provider: &str,
        r: Request<KubeBody>,
    ) -> Result<Response<KubeBody>, Outcome> {
        remote
            .send(r)
            .await
            .map_err(|e| Unavailable::Provider(provider.to_owned(), e).into())
    }

    /// Makes the same upgrade on the provider; once both ends switched protocols, joins them.
    async fn relay(
        &self,
        remote: &kube::Client,
        provider: &str,
        upstream: String,
        mut req: Request<hyper::body::Incoming>,
    ) -> Result<Response<Body>, Outcome> {
        let mut out = Request::builder().method(req.method()).uri(&upstream);
        for (k, v) in req.headers() {
            if route::upgrade_request_headers(k.as_str()) {
                out = out.header(k, v);
            }
        }
        let out = out
            .body(KubeBody::empty())
            .map_err(|e| Unavailable::Request(e.to_string()))?;
        let mut resp = self.send(remote, provider, out).await?;
        if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
            // The provider's refusal (a container that is not running, a kubelet that does not
            // attach), with its message.
            return Ok(passthrough(resp));
        }
        let mut back = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
        for (k, v) in resp.headers() {
            if route::upgrade_response_headers(k.as_str()) {
                back = back.header(k, v);
            }
        }
        let theirs = hyper::upgrade::on(&mut resp);
        let ours = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            let (theirs, ours) = match tokio::try_join!(theirs, ours) {
                Ok(both) => both,
                Err(e) => return debug!(request = upstream, error = %e, "upgrade"),
            };
            let (mut a, mut b) = (TokioIo::new(ours), TokioIo::new(theirs));
            match tokio::io::copy_bidirectional(&mut a, &mut b).await {
                Ok((up, down)) => debug!(request = upstream, up, down, "stream closed"),
                Err(e) => debug!(request = upstream, error = %e, "stream ended"),
            }
        });
        Ok(back
            .body(
                Full::new(Bytes::new())
                    .map_err(|e| match e {})
                    .boxed_unsync(),
            )
            .expect("a valid response"))
    }
}

/// The provider's answer as it comes: status, content type and body, streamed.
fn passthrough(resp: Response<KubeBody>) -> Response<Body> {
    let (parts, body) = resp.into_parts();
    let mut b = Response::builder().status(parts.status);
    if let Some(ct) = parts.headers.get(header::CONTENT_TYPE) {
        b = b.header(header::CONTENT_TYPE, ct);
    }
    b.body(body.map_err(|e| Box::new(e) as Error).boxed_unsync())
        .expect("a valid response")
}
