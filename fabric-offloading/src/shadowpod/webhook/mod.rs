//! The provider's validating webhook on ShadowPods (`fabric-controller shadowpod-webhook`),
//! the HTTPS edge of [`super::admission`], [`super::policy`] and [`super::quota`]: AdmissionReviews in
//! ([`review`]), who and where decided from watch caches of ResourceSlices and consumers'
//! namespaces, what a consumer's pods use charged on its Tenant (read afresh and written
//! with its resourceVersion as precondition, again on a conflict), served with
//! `fabric_http::https`'s limits. Every replica serves (the Service spreads the API server's
//! calls) and runs the [`usage`] reconciler; none needs to lead: the Tenant's
//! resourceVersion orders their writes.
//!
//! On a second path ([`names::webhook::TENANT_OBJECTS_PATH`]) it bounds the other kinds a
//! consumer creates (ResourceSlices, PeeringNetworks: what the configuration sends there) to
//! [`Settings::max_objects`] of each in a namespace, counted on a fresh listing and the
//! creations admitted since, those charged on the consumer's Tenant as ShadowPods are (with
//! its resourceVersion as precondition), so that replicas racing for the last place admit one.
//!
//! Only the API server may call it: its client certificate, from the CA and with a
//! CommonName the provider's admin configures (`--client-ca`, `--client-name`; the API
//! server presents it as its AdmissionConfiguration says), is checked before a byte of the
//! body is read; anyone else gets a bare 401/403.
//!
//! Memory: a review's body is read whole, at most [`review::MAX_BODY`] (4 MiB), on at most
//! [`MAX_CONNECTIONS`] (8) connections at once (more wait in the listen backlog): bodies hold
//! 8 × 4 MiB = 32 MiB at most, a quarter of deploy/'s 128 MiB limit, leaving 96 MiB for what
//! they parse into (the ShadowPod and its old version, each at most the API server's 1.5 MiB
//! object limit as JSON), the caches (ResourceSlices, tenant namespaces) and the runtime.
//!
//! On a third ([`names::webhook::CLAIMS_PATH`]) it charges a consumer's claims
//! (PersistentVolumeClaims created or grown in its namespaces) against the storage it was
//! granted ([`super::claims`]): a fresh listing of its claims and the charges on its Tenant
//! (`status.claims`) not listed yet, the new charge written with the Tenant's
//! resourceVersion as precondition (again on a conflict), as ShadowPods are charged.
//!
//! On a consumer it also serves the pod webhook of offloaded namespaces
//! ([`names::webhook::PODS_PATH`], MutatingWebhookConfiguration [`names::webhook::PODS_CONFIG`]):
//! pods created in a namespace labelled [`label::SCHEDULING_ENABLED`] are placed as its
//! NamespaceOffloading says ([`crate::pod_placement`]), read from a watch cache (with a GET on a
//! miss: one created a moment ago). A cluster may be consumer, provider or both: the same
//! server answers both roles, and only the configurations installed send it reviews. The
//! module keeps its name (ShadowPods were its first and main concern).
//!
//! On a provider it also refuses new local workload pods while the cluster is tethered
//! ([`names::webhook::TETHERED_PODS_PATH`], in the ValidatingWebhookConfiguration; the mode
//! read from the Tenants' watch cache, the verdict [`crate::tethered`]'s).
//!
//! Its certificates ([`certs`]) live in Secret [`names::secret::SHADOWPOD_WEBHOOK_TLS`]: the
//! first replica creates a CA and a serving certificate for the Service's name, every replica
//! copies the CA into the `caBundle` of the ValidatingWebhookConfiguration and of the pods'
//! MutatingWebhookConfiguration (when installed) and re-reads the Secret every `refresh`
//! (renewing what [`certs::plan`] says), so a renewed certificate is served without a restart.
//!
//! Parts: this module serves (settings, the HTTPS edge, the caches); `view` decides each
//! review; `tls` keeps the Secret and the `caBundle`s.
pub mod certs;
pub mod charges;
pub mod review;
mod tls;
pub mod usage;
mod view;

use self::view::View;

pub use tls::{WebhookConfiguration, ensure_material, publish_ca, with_ca_bundle};

use std::{
    net::SocketAddr,
    sync::{Arc, RwLock},
    time::Duration,
};

use bytes::Bytes;
use fabric_api::names::{self, label};
use fabric_http::https::{self, BodyError, Exchange, Limits, TlsError, read_body};
use http_body_util::Full;
use hyper::{Request, Response, body::Incoming, header};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::{
    Api, Client, Resource,
    core::admission::AdmissionRequest,
    runtime::{reflector::Store, watcher},
};
use tracing::{debug, info, warn};

use self::{
    certs::{CertError, Material},
    review::Endpoint,
};
use super::policy::Rules;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Secret {0}: {1}")]
    Secret(String, #[source] kube::Error),
    #[error("webhook configuration {0}: {1}")]
    Config(String, #[source] kube::Error),
    #[error("Secret {0} keeps changing under us")]
    Contended(String),
    #[error(transparent)]
    Cert(#[from] CertError),
    #[error("the serving certificate: {0}")]
    Tls(#[from] TlsError),
    #[error("listening on {0}: {1}")]
    Listen(SocketAddr, #[source] std::io::Error),
    #[error("the {0} cache stopped before it was filled")]
    Cache(&'static str),
}

/// How the webhook runs.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Where its Secret and Service are (the fabric's namespace).
    pub namespace: String,
    pub listen: SocketAddr,
    /// The Secret with the CA and the serving certificate.
    pub tls_secret: String,
    /// The names the serving certificate carries (the Service's `NAME.NAMESPACE.svc`).
    pub hosts: Vec<String>,
    /// The ValidatingWebhookConfiguration whose `caBundle` it keeps.
    pub config: String,
    /// The MutatingWebhookConfiguration of pods in offloaded namespaces whose `caBundle` it
    /// keeps too, when installed.
    pub pods_config: String,
    /// How often the Secret and `caBundle` are looked at again.
    pub refresh: Duration,
    /// How long a charge counts before its ShadowPod is listed (see [`quota::recount`]):
    /// longer than the API server takes from admission to storage.
    pub pending_ttl: Duration,
    /// How long admission keeps trying to write a charge over concurrent ones (within the
    /// webhook's `timeoutSeconds`).
    pub charge_budget: Duration,
    pub limits: Limits,
    /// What the provider lets tenants' pods do and where they run ([`super::policy`]).
    pub rules: Rules,
    /// Who may call: the CA (PEM) of the API server's client certificate for webhooks and
    /// the CommonNames it may carry ([`review::check_caller`]). None: anyone (tests of the
    /// decisions only; the command requires it).
    pub callers: Option<Callers>,
    /// How many ShadowPods, running or finished, a tenant may have: what one consumer can
    /// put into the provider's store.
    pub max_shadow_pods: u32,
    /// How many of each other kind the configuration sends to
    /// [`names::webhook::TENANT_OBJECTS_PATH`] (ResourceSlices, PeeringNetworks) a tenant
    /// may have in a namespace.
    pub max_objects: u32,
    /// How large (bytes, as JSON, status aside) one ShadowPod of a tenant may be ...
    pub max_shadow_pod_bytes: u64,
    /// ... and all of a tenant's ShadowPods together.
    pub max_tenant_bytes: u64,
}

/// The API server as a caller of the webhook.
#[derive(Clone, Debug)]
pub struct Callers {
    /// PEM of the CA that signs the API server's client certificate.
    pub ca: String,
    /// CommonNames of that certificate.
    pub names: Vec<String>,
}

impl Settings {
    /// The defaults for the Service `service` in `namespace`.
    pub fn new(namespace: &str, service: &str, listen: SocketAddr) -> Self {
        Self {
            namespace: namespace.to_owned(),
            listen,
            tls_secret: names::secret::SHADOWPOD_WEBHOOK_TLS.to_owned(),
            hosts: vec![format!("{service}.{namespace}.svc")],
            config: names::webhook::SHADOWPODS_CONFIG.to_owned(),
            pods_config: names::webhook::PODS_CONFIG.to_owned(),
            refresh: Duration::from_secs(60),
            pending_ttl: Duration::from_secs(30),
            charge_budget: Duration::from_secs(3),
            limits: Limits {
                // The API server gives a webhook `timeoutSeconds` (5 s in deploy/) in all.
                request_timeout: Duration::from_secs(10),
                max_connections: MAX_CONNECTIONS,
                ..Limits::default()
            },
            rules: Rules::default(),
            callers: None,
            max_shadow_pods: DEFAULT_MAX_SHADOW_PODS,
            max_objects: DEFAULT_MAX_OBJECTS,
            max_shadow_pod_bytes: DEFAULT_MAX_SHADOW_POD_BYTES,
            max_tenant_bytes: DEFAULT_MAX_TENANT_BYTES,
        }
    }
}

/// How large a tenant's ShadowPod may be unless the admin says otherwise: a pod's spec is a
/// few KiB; this leaves room for large commands and environments, a third of the API
/// server's 1.5 MiB object limit.
pub const DEFAULT_MAX_SHADOW_POD_BYTES: u64 = 512 << 10;

/// How large a tenant's ShadowPods may be together unless the admin says otherwise: 5000
/// ShadowPods of 13 KiB, so that a few tenants cannot fill the provider's store (etcd's
/// default quota is 2 GiB).
pub const DEFAULT_MAX_TENANT_BYTES: u64 = 64 << 20;

/// How many ResourceSlices (and, apart, PeeringNetworks) a tenant may have unless the admin
/// says otherwise: a consumer makes one or two of each per peering.
pub const DEFAULT_MAX_OBJECTS: u32 = 32;

/// How many ShadowPods a tenant may have unless the admin says otherwise: ten times the
/// pods a node runs by default, a few tens of MB of the provider's store.
pub const DEFAULT_MAX_SHADOW_PODS: u32 = 5000;

/// The field manager of the charges on Tenants' status.
pub(crate) const USAGE_MANAGER: &str = "fabric-shadowpod-webhook";

/// Reviews read at once: see the module's memory bound.
pub const MAX_CONNECTIONS: usize = 8;

fn plain(status: u16, message: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(message + "\n")));
    *resp.status_mut() =
        hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::BAD_REQUEST);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

async fn handle(
    req: Request<Incoming>,
    cert: Option<Vec<u8>>,
    view: &View,
    limits: Limits,
    callers: Option<&[String]>,
) -> Response<Full<Bytes>> {
    if let Some(names) = callers
        && let Err(e) = review::check_caller(cert.as_deref(), names)
    {
        debug!(error = %e, "shadowpod webhook: caller refused");
        return plain(e.status, e.message);
    }
    let h = |name| {
        req.headers()
            .get(name)
            .and_then(|v: &header::HeaderValue| v.to_str().ok())
            .map(str::to_owned)
    };
    let (content_type, content_length) = (h(header::CONTENT_TYPE), h(header::CONTENT_LENGTH));
    let endpoint = match review::check_head(
        req.method(),
        req.uri().path(),
        content_type.as_deref(),
        content_length.as_deref(),
    ) {
        Ok(e) => e,
        Err(e) => return plain(e.status, e.message),
    };
    let body = match read_body(req.into_body(), review::MAX_BODY, limits.body_timeout).await {
        Ok(b) => b,
        Err(e @ BodyError::TooLarge(_)) => return plain(413, e.to_string()),
        Err(e @ BodyError::Timeout(_)) => return plain(408, e.to_string()),
        Err(e @ BodyError::Read(_)) => return plain(400, e.to_string()),
    };
    let answer = match endpoint {
        Endpoint::ShadowPods => match review::parse_shadow_pod(&body) {
            Ok(review::ShadowPodReview::Parsed(request)) => {
                let verdict = view.decide(&request).await;
                logged(&request, &verdict);
                Ok(review::answer(&request, &verdict))
            }
            Ok(review::ShadowPodReview::Mistyped { request, why }) => {
                debug!(user = %request.user_info.username.as_deref().unwrap_or_default(), %why, "shadowpod webhook: malformed ShadowPod refused");
                Ok(review::answer_mistyped(&request, &why))
            }
            Err(e) => Err(e),
        },
        Endpoint::TenantObjects => match review::parse_object(&body) {
            Ok(request) => {
                let verdict = view.decide_object(&request).await;
                logged(&request, &verdict);
                Ok(review::answer(&request, &verdict))
            }
            Err(e) => Err(e),
        },
        Endpoint::Claims => match review::parse_object(&body) {
            Ok(request) => {
                let verdict = view.decide_claim(&request).await;
                logged(&request, &verdict);
                Ok(review::answer(&request, &verdict))
            }
            Err(e) => Err(e),
        },
        Endpoint::TetheredPods => match review::parse_object(&body) {
            Ok(request) => {
                let verdict = view.tethered_pod(&request);
                logged(&request, &verdict);
                Ok(review::answer(&request, &verdict))
            }
            Err(e) => Err(e),
        },
        Endpoint::Pods => match review::parse_object(&body) {
            Ok(request) => {
                let verdict = view.place(&request).await;
                logged(&request, &verdict.as_ref().map(|_| ()));
                Ok(review::answer_patch(&request, &verdict))
            }
            Err(e) => Err(e),
        },
    };
    let answer = match answer {
        Ok(a) => a,
        Err(e) => {
            debug!(error = %e, "shadowpod webhook: bad request");
            return plain(e.status, e.message);
        }
    };
    let mut resp = Response::new(Full::new(Bytes::from(answer)));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}

fn logged<K, D>(request: &AdmissionRequest<K>, verdict: &Result<(), D>)
where
    K: Resource,
    D: std::fmt::Display,
{
    match verdict {
        Ok(()) => {
            debug!(kind = %request.kind.kind, name = %request.name, namespace = ?request.namespace, "admitted")
        }
        Err(d) => info!(
            kind = %request.kind.kind,
            name = %request.name,
            namespace = ?request.namespace,
            user = ?request.user_info.username,
            reason = %d,
            "refused"
        ),
    }
}

/// A watch cache of `api` (objects without their managedFields), kept by a spawned task.
async fn cache<K>(
    what: &'static str,
    api: Api<K>,
    config: watcher::Config,
) -> Result<Store<K>, Error>
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    // The task is left to run with the webhook: the decisions read the cache until it exits.
    let (reader, _task) = fabric_kube::cache::lean(api, config, what);
    reader
        .wait_until_ready()
        .await
        .map_err(|_| Error::Cache(what))?;
    Ok(reader)
}

fn server_config(
    m: &Material,
    callers: Option<&Callers>,
) -> Result<Arc<rustls::ServerConfig>, Error> {
    let client_ca = callers.map(|c| c.ca.as_str());
    Ok(Arc::new(https::server_config(&m.cert, &m.key, client_ca)?))
}

/// Runs the webhook until the task is dropped: fills its caches, makes sure of its
/// certificates and `caBundle`, then serves while refreshing them.
pub async fn run(client: Client, s: Settings) -> Result<(), Error> {
    let view = Arc::new(View {
        client: client.clone(),
        slices: cache(
            "ResourceSlice",
            Api::all(client.clone()),
            watcher::Config::default(),
        )
        .await?,
        // Only namespaces carrying a consumer's label can belong to one.
        namespaces: cache(
            "Namespace",
            Api::all(client.clone()),
            watcher::Config::default().labels(label::REMOTE_CLUSTER),
        )
        .await?,
        tenants: cache(
            "Tenant",
            Api::all(client.clone()),
            watcher::Config::default(),
        )
        .await?,
        offloadings: cache(
            "NamespaceOffloading",
            Api::all(client.clone()),
            watcher::Config::default(),
        )
        .await?,
        charger: charges::Charger::new(client.clone(), s.charge_budget),
        rules: s.rules.clone(),
        max_shadow_pods: s.max_shadow_pods,
        max_objects: s.max_objects,
        max_shadow_pod_bytes: s.max_shadow_pod_bytes,
        max_tenant_bytes: s.max_tenant_bytes,
        pending_ttl: s.pending_ttl,
        charge_budget: s.charge_budget,
        tethered_exempt: crate::tethered::Exemptions::new(&s.namespace),
    });
    // Recounting is idempotent and guarded by the Tenants' resourceVersion: every replica
    // does it, so usage is released with any one of them up.
    tokio::spawn(usage::run(
        client.clone(),
        s.pending_ttl,
        s.rules.default_requests.clone(),
    ));
    // Listening before the CA is published: a webhook that cannot serve (its port taken) must
    // not have the API server send it requests, nor tell whoever waits for the caBundle that
    // it is ready.
    let listener = tokio::net::TcpListener::bind(s.listen)
        .await
        .map_err(|e| Error::Listen(s.listen, e))?;
    let mut material = ensure_material(&client, &s).await?;
    if !publish_ca::<ValidatingWebhookConfiguration>(&client, &s.config, &material.ca_cert).await? {
        warn!(config = %s.config, "no ValidatingWebhookConfiguration yet; caBundle set when it appears");
    }
    if !publish_ca::<MutatingWebhookConfiguration>(&client, &s.pods_config, &material.ca_cert)
        .await?
    {
        info!(config = %s.pods_config, "no MutatingWebhookConfiguration of pods (not a consumer, or not yet); caBundle set when it appears");
    }
    let current = Arc::new(RwLock::new(server_config(&material, s.callers.as_ref())?));
    info!(listen = %s.listen, hosts = ?s.hosts, "ShadowPod webhook serving");
    let tls = {
        let current = current.clone();
        move || current.read().unwrap_or_else(|e| e.into_inner()).clone()
    };
    let limits = s.limits;
    let callers: Option<Arc<[String]>> = s.callers.as_ref().map(|c| c.names.clone().into());
    if callers.is_none() {
        warn!("no --client-ca: anyone who reaches the webhook may send it reviews");
    }
    let serve = https::serve(
        "shadowpod webhook",
        listener,
        tls,
        limits,
        Exchange::Once,
        move |req, cert| {
            let view = view.clone();
            let callers = callers.clone();
            async move { handle(req, cert, &view, limits, callers.as_deref()).await }
        },
    );
    let refresh = async {
        loop {
            tokio::time::sleep(s.refresh).await;
            let step = async {
                let m = ensure_material(&client, &s).await?;
                publish_ca::<ValidatingWebhookConfiguration>(&client, &s.config, &m.ca_cert)
                    .await?;
                publish_ca::<MutatingWebhookConfiguration>(&client, &s.pods_config, &m.ca_cert)
                    .await?;
                if m != material {
                    *current.write().unwrap_or_else(|e| e.into_inner()) =
                        server_config(&m, s.callers.as_ref())?;
                    info!("serving the renewed certificate");
                    material = m;
                }
                Ok::<_, Error>(())
            };
            if let Err(e) = step.await {
                warn!(error = %e, "refreshing the webhook's certificates; trying again later");
            }
        }
    };
    tokio::select! {
        () = serve => Ok(()),
        () = refresh => Ok(()),
    }
}
