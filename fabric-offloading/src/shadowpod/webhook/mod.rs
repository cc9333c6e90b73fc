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
//! Its certificates ([`certs`]) live in Secret [`names::secret::SHADOWPOD_WEBHOOK_TLS`]: the
//! first replica creates a CA and a serving certificate for the Service's name, every replica
//! copies the CA into the `caBundle` of the ValidatingWebhookConfiguration and of the pods'
//! MutatingWebhookConfiguration (when installed) and re-reads the Secret every `refresh`
//! (renewing what [`certs::plan`] says), so a renewed certificate is served without a restart.
pub mod certs;
pub mod charges;
pub mod review;
pub mod usage;

use std::{
    net::SocketAddr,
    sync::{Arc, RwLock},
    time::Duration,
};

use bytes::Bytes;
use fabric_api::{
    authentication::v1alpha1::{ResourceSlice, Tenant, TenantState},
    names::{self, label},
    offloading::{
        namespaces,
        v1alpha1::{NamespaceOffloading, ShadowPod},
    },
};
use fabric_http::https::{self, BodyError, Exchange, Limits, TlsError, read_body};
use http_body_util::Full;
use hyper::{Request, Response, body::Incoming, header};
use k8s_openapi::{
    ByteString,
    api::{
        admissionregistration::v1::{
            MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
        },
        core::v1::{Namespace, PersistentVolumeClaim, Secret},
    },
    jiff::Timestamp,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ApiResource, DynamicObject, ListParams, ObjectMeta, PostParams},
    core::admission::{AdmissionRequest, Operation},
    runtime::{
        reflector::{ObjectRef, Store},
        watcher,
    },
};
use tracing::{debug, info, warn};

use self::{
    certs::{CertError, Material, Plan},
    charges::{Rewrite, Unwritten},
    review::Endpoint,
};
use super::{
    admission::{self, Denial, Verdict},
    claims::{self, Claim},
    policy::Rules,
    quota,
};
use crate::pod_placement::{self, Refusal};

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

/// Reviews read at once: see the module's memory bound.
pub const MAX_CONNECTIONS: usize = 8;

const FIELDS: [&str; 4] = ["ca.crt", "ca.key", "tls.crt", "tls.key"];

fn material_of(secret: &Secret) -> Option<Material> {
    let data = secret.data.as_ref()?;
    let field = |k: &str| {
        data.get(k)
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
    };
    Some(Material {
        ca_cert: field(FIELDS[0])?,
        ca_key: field(FIELDS[1])?,
        cert: field(FIELDS[2])?,
        key: field(FIELDS[3])?,
    })
}

fn secret_of(
    namespace: &str,
    name: &str,
    m: &Material,
    resource_version: Option<String>,
) -> Secret {
    let values = [&m.ca_cert, &m.ca_key, &m.cert, &m.key];
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            resource_version,
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".to_owned()),
        data: Some(
            FIELDS
                .iter()
                .zip(values)
                .map(|(k, v)| ((*k).to_owned(), ByteString(v.clone().into_bytes())))
                .collect(),
        ),
        ..Default::default()
    }
}

/// The material in the Secret, created or renewed as [`certs::plan`] says. Replicas racing
/// to write it settle on whichever write the API server took first.
pub async fn ensure_material(client: &Client, s: &Settings) -> Result<Material, Error> {
    let api = Api::<Secret>::namespaced(client.clone(), &s.namespace);
    let err = |e| Error::Secret(format!("{}/{}", s.namespace, s.tls_secret), e);
    for _ in 0..5 {
        let secret = api.get_opt(&s.tls_secret).await.map_err(err)?;
        let current = secret.as_ref().and_then(material_of);
        let now = time::OffsetDateTime::now_utc();
        let plan = certs::plan(now, current.as_ref(), &s.hosts);
        if plan == Plan::Keep {
            return Ok(current.expect("kept material exists"));
        }
        let new = certs::issue(plan, now, current.as_ref(), &s.hosts)?;
        let written = match &secret {
            None => {
                api.create(
                    &PostParams::default(),
                    &secret_of(&s.namespace, &s.tls_secret, &new, None),
                )
                .await
            }
            Some(old) => {
                api.replace(
                    &s.tls_secret,
                    &PostParams::default(),
                    &secret_of(&s.namespace, &s.tls_secret, &new, old.resource_version()),
                )
                .await
            }
        };
        match written {
            Ok(_) => {
                info!(secret = %s.tls_secret, ?plan, hosts = ?s.hosts, "wrote the webhook's certificates");
                return Ok(new);
            }
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(err(e)),
        }
    }
    Err(Error::Contended(s.tls_secret.clone()))
}

/// A webhook configuration (validating or mutating): its webhooks' client configurations.
pub trait WebhookConfiguration:
    Resource<DynamicType = ()>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + serde::Serialize
{
    fn client_configs(&mut self) -> Vec<&mut WebhookClientConfig>;
}

// The two kinds have the same shape but no common type.
macro_rules! webhook_configuration {
    ($($kind:ty),*) => {$(
        impl WebhookConfiguration for $kind {
            fn client_configs(&mut self) -> Vec<&mut WebhookClientConfig> {
                self.webhooks
                    .iter_mut()
                    .flatten()
                    .map(|w| &mut w.client_config)
                    .collect()
            }
        }
    )*};
}
webhook_configuration!(ValidatingWebhookConfiguration, MutatingWebhookConfiguration);

/// Sets every webhook's `caBundle` in `config` to `ca` (PEM); whether anything changed.
pub fn with_ca_bundle<C: WebhookConfiguration>(config: &mut C, ca: &str) -> bool {
    let mut changed = false;
    for c in config.client_configs() {
        let bundle = Some(ByteString(ca.as_bytes().to_vec()));
        if c.ca_bundle != bundle {
            c.ca_bundle = bundle;
            changed = true;
        }
    }
    changed
}

/// Puts the CA into the `caBundle` of configuration `name` of kind `C`; `false` when the
/// configuration is not there (not installed yet, or not on this cluster: nothing calls the
/// webhook then).
pub async fn publish_ca<C: WebhookConfiguration>(
    client: &Client,
    name: &str,
    ca: &str,
) -> Result<bool, Error> {
    let api = Api::<C>::all(client.clone());
    let err = |e| Error::Config(name.to_owned(), e);
    for _ in 0..5 {
        let Some(mut config) = api.get_opt(name).await.map_err(err)? else {
            return Ok(false);
        };
        if !with_ca_bundle(&mut config, ca) {
            return Ok(true);
        }
        match api.replace(name, &PostParams::default(), &config).await {
            Ok(_) => {
                info!(config = name, "put the webhook's CA into caBundle");
                return Ok(true);
            }
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(err(e)),
        }
    }
    Err(Error::Contended(name.to_owned()))
}

/// What the decisions read: watch caches of who may do what where, and the Tenants.
struct View {
    client: Client,
    slices: Store<ResourceSlice>,
    namespaces: Store<Namespace>,
    charger: charges::Charger,
    /// What the provider lets tenants' pods do and where they run (a Tenant may have a level
    /// of its own).
    rules: Rules,
    tenants: Store<Tenant>,
    /// The consumer's NamespaceOffloadings, for the pods of offloaded namespaces.
    offloadings: Store<NamespaceOffloading>,
    /// How many ShadowPods (running or finished) a tenant may have.
    max_shadow_pods: u32,
    /// How many of each other kind a tenant may have in a namespace.
    max_objects: u32,
    /// How large one ShadowPod of a tenant may be, and all of them together (bytes).
    max_shadow_pod_bytes: u64,
    max_tenant_bytes: u64,
    /// How long a charge of another kind's creation counts before a listing shows it.
    pending_ttl: Duration,
    /// How long a claim's charge keeps trying over concurrent ones.
    charge_budget: Duration,
}

/// How many ShadowPods a tenant may have unless the admin says otherwise: ten times the
/// pods a node runs by default, a few tens of MB of the provider's store.
pub const DEFAULT_MAX_SHADOW_PODS: u32 = 5000;

/// The field manager of the charges on Tenants' status.
const USAGE_MANAGER: &str = "fabric-shadowpod-webhook";

impl View {
    async fn decide(&self, req: &AdmissionRequest<ShadowPod>) -> Result<(), Denial> {
        let user = req.user_info.username.as_deref().unwrap_or_default();
        let (Some(shadow), Operation::Create | Operation::Update) = (&req.object, &req.operation)
        else {
            return Ok(());
        };
        if req.sub_resource.is_some() {
            return Ok(());
        }
        let namespace = req.namespace.clone().unwrap_or_default();
        let name = if req.name.is_empty() {
            shadow.name_any()
        } else {
            req.name.clone()
        };
        let owner = self
            .namespaces
            .get(&ObjectRef::new(&namespace))
            .and_then(|n| n.labels().get(label::REMOTE_CLUSTER).cloned());
        let old = match req.operation {
            Operation::Update => req.old_object.as_ref(),
            _ => None,
        };
        // The level of the tenant the ShadowPod names; one naming another tenant than its
        // writer's is refused below whatever its pod.
        let consumer = &shadow.spec.cluster_id;
        let tenant = self
            .tenants
            .get(&ObjectRef::new(consumer).within(&names::namespace::tenant(consumer)));
        let level = tenant.as_ref().and_then(|t| t.spec.pod_security);
        let rules = self.rules.for_tenant(level);
        admission::conforms(&shadow.spec, old.map(|o| &o.spec), &rules)?;
        let verdict = admission::admit_change(
            user,
            &namespace,
            owner.as_deref(),
            &shadow.spec,
            old,
            &rules.default_requests,
        )?;
        // What it adds to the provider's store: charged as its requests are, so that a
        // tenant's ShadowPods stay within a size whatever their number.
        let bytes = quota::size(shadow);
        let grown = bytes.saturating_sub(old.map_or(0, quota::size));
        let (consumer, requests, more) = match verdict {
            Verdict::Unlimited => return Ok(()),
            Verdict::Within if grown == 0 => return Ok(()),
            Verdict::Within => (
                shadow.spec.cluster_id.clone(),
                admission::requested(&shadow.spec, &rules.default_requests)?,
                Default::default(),
            ),
            Verdict::Charge {
                consumer,
                requests,
                more,
            } => (consumer, requests, more),
        };
        if bytes > self.max_shadow_pod_bytes {
            return Err(Denial::TooLarge {
                bytes,
                max: self.max_shadow_pod_bytes,
            });
        }
        // Said plainly, whatever the grant still says (it is answered with zero in a while)
        // and whatever the pod asks for: nothing new, nothing larger.
        let drained = tenant.is_some_and(|t| t.spec.state == TenantState::Drained);
        if drained && (old.is_none() || more.values().any(|v| *v > 0)) {
            return Err(Denial::Drained { cluster: consumer });
        }
        let granted = admission::granted(&consumer, self.slices.state().iter().map(|s| &**s))?;
        let ask = quota::Ask {
            namespace,
            name,
            requests,
            more,
            granted,
            // Every new ShadowPod is an object more in the provider's store, whatever it asks.
            limit: old.is_none().then_some(self.max_shadow_pods),
            bytes: quota::Bytes {
                grown,
                max: self.max_tenant_bytes,
            },
        };
        self.charge(&consumer, ask, req.dry_run).await
    }

    /// Whether the creation in `req` of an object that is not a ShadowPod keeps its
    /// consumer within [`Self::max_objects`] of its kind in its namespace: counted on a fresh
    /// listing and the creations admitted since, charged on the consumer's Tenant
    /// ([`charges::Charger::charge_object`]) so that every replica sees the others'.
    async fn decide_object(&self, req: &AdmissionRequest<DynamicObject>) -> Result<(), Denial> {
        let user = req.user_info.username.as_deref().unwrap_or_default();
        let Some(consumer) = admission::consumer_of(user) else {
            return Ok(());
        };
        if req.operation != Operation::Create || req.sub_resource.is_some() {
            return Ok(());
        }
        let namespace = req.namespace.clone().unwrap_or_default();
        let gvk = &req.kind;
        let resource = ApiResource {
            group: gvk.group.clone(),
            version: gvk.version.clone(),
            api_version: if gvk.group.is_empty() {
                gvk.version.clone()
            } else {
                format!("{}/{}", gvk.group, gvk.version)
            },
            kind: gvk.kind.clone(),
            plural: req.resource.resource.clone(),
        };
        let kind = format!("{}/{}", gvk.group, gvk.kind);
        // The name a listing will show; a generated one is set by the time a validating
        // webhook is called, the request's uid stands in should it not be.
        let name = [
            req.name.as_str(),
            req.object
                .as_ref()
                .and_then(|o| o.metadata.name.as_deref())
                .unwrap_or_default(),
            req.uid.as_str(),
        ]
        .into_iter()
        .find(|n| !n.is_empty())
        .unwrap_or_default()
        .to_owned();
        let ask = quota::ObjectAsk {
            user,
            kind: &kind,
            kind_name: &gvk.kind,
            namespace: &namespace,
            name: &name,
            max: self.max_objects,
        };
        let api = Api::<DynamicObject>::namespaced_with(self.client.clone(), &namespace, &resource);
        let list = || async {
            Ok(api
                .list_metadata(&ListParams::default())
                .await?
                .items
                .into_iter()
                .map(|o| o.name_any())
                .collect())
        };
        self.charger
            .charge_object(consumer, &ask, self.pending_ttl, req.dry_run, list)
            .await
    }

    /// Whether the claim created or updated in `req` keeps its consumer within the storage it
    /// was granted of its class ([`claims::charge`]). Not a consumer's request, a
    /// subresource, or an update that does not grow the claim: nothing to charge.
    async fn decide_claim(&self, req: &AdmissionRequest<DynamicObject>) -> Result<(), Denial> {
        let user = req.user_info.username.as_deref().unwrap_or_default();
        let Some(consumer) = admission::consumer_of(user) else {
            return Ok(());
        };
        if req.operation == Operation::Delete {
            // A deletion is never refused here: it only gives the claim's share back.
            if !req.dry_run && req.sub_resource.is_none() {
                let namespace = req.namespace.clone().unwrap_or_default();
                if let Err(e) = self.release_claim(consumer, &namespace, &req.name).await {
                    warn!(consumer, claim = %req.name, namespace, error = %e, "the deleted claim's charge stays until it lapses");
                }
            }
            return Ok(());
        }
        let (Some(object), Operation::Create | Operation::Update) = (&req.object, &req.operation)
        else {
            return Ok(());
        };
        if req.sub_resource.is_some() {
            return Ok(());
        }
        let namespace = req.namespace.clone().unwrap_or_default();
        let pvc = |o: &DynamicObject| {
            serde_json::to_value(o)
                .and_then(serde_json::from_value::<PersistentVolumeClaim>)
                .map_err(|e| Denial::Claim(format!("not a PersistentVolumeClaim: {e}")))
        };
        let ask = Claim::of(&pvc(object)?, &namespace)?;
        if req.operation == Operation::Update
            && let Some(old) = &req.old_object
            && Claim::of(&pvc(old)?, &namespace).is_ok_and(|o| o.size >= ask.size)
        {
            return Ok(());
        }
        // Its claims are counted in its namespaces: one elsewhere would escape the count.
        let owner = self
            .namespaces
            .get(&ObjectRef::new(&namespace))
            .and_then(|n| n.labels().get(label::REMOTE_CLUSTER).cloned());
        if owner.as_deref() != Some(consumer) {
            return Err(Denial::ForeignNamespace {
                namespace,
                cluster: consumer.to_owned(),
            });
        }
        let granted = admission::granted(consumer, self.slices.state().iter().map(|s| &**s))?;
        self.charge_claim(consumer, &ask, &granted, req.dry_run)
            .await
    }

    /// Claim `namespace/name` of `consumer` is being deleted: its pending charges dropped from
    /// the Tenant ([`claims::release`]), written over the version read, again on a conflict
    /// within the budget. A claim created and deleted between two listings of the usage
    /// reconciler would otherwise hold its share until the charge lapses.
    async fn release_claim(
        &self,
        consumer: &str,
        namespace: &str,
        name: &str,
    ) -> Result<(), kube::Error> {
        let released = charges::rewrite_status::<_, std::convert::Infallible, _>(
            &self.client,
            consumer,
            self.charge_budget,
            |status| async move {
                Ok(match claims::release(&status, namespace, name) {
                    Some(released) => Rewrite::Write(released, ()),
                    None => Rewrite::Answer(()),
                })
            },
        )
        .await;
        match released {
            Ok(()) | Err(Unwritten::NoTenant) => Ok(()),
            Err(Unwritten::Kube(e)) => Err(e),
            Err(Unwritten::Denied(never)) => match never {},
        }
    }

    /// The consumer's claims as listed now, in the namespaces carrying its label; claims that
    /// cannot be read count as nothing (this webhook admitted none such).
    async fn claims_of(&self, consumer: &str) -> Result<Vec<Claim>, kube::Error> {
        let mut out = Vec::new();
        for ns in self.namespaces.state() {
            if ns.labels().get(label::REMOTE_CLUSTER).map(String::as_str) != Some(consumer) {
                continue;
            }
            let name = ns.name_any();
            let api = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), &name);
            for pvc in api.list(&ListParams::default()).await? {
                out.extend(Claim::of(&pvc, &name).ok());
            }
        }
        Ok(out)
    }

    /// Charges `ask` on the consumer's Tenant: read it, list the claims, decide, write over
    /// the version read; again on a conflict within the budget. A dry run writes nothing.
    async fn charge_claim(
        &self,
        consumer: &str,
        ask: &Claim,
        granted: &fabric_api::authentication::v1alpha1::Resources,
        dry_run: bool,
    ) -> Result<(), Denial> {
        charges::rewrite_status(
            &self.client,
            consumer,
            self.charge_budget,
            |status| async move {
                // The Tenant first: a charge in it was admitted before this listing.
                let listed = self.claims_of(consumer).await.map_err(Unwritten::Kube)?;
                let status = claims::charge(
                    &status,
                    consumer,
                    ask,
                    &listed,
                    granted,
                    Timestamp::now(),
                    self.pending_ttl,
                )
                .map_err(Unwritten::Denied)?;
                Ok(if dry_run {
                    Rewrite::Answer(())
                } else {
                    Rewrite::Write(status, ())
                })
            },
        )
        .await
        .map_err(|e| e.denial(consumer))
    }

    /// Where the pod created in `req` may run ([`pod_placement::mutate`]), from the namespace's
    /// NamespaceOffloading: the watch cache's, or a fresh read when the cache has none yet
    /// (one created a moment ago, by `fabricctl offload` right after the namespace's label).
    async fn place(
        &self,
        req: &AdmissionRequest<DynamicObject>,
    ) -> Result<Option<json_patch::Patch>, Refusal> {
        let (Some(pod), Operation::Create) = (&req.object, &req.operation) else {
            return Ok(None);
        };
        if req.sub_resource.is_some() {
            return Ok(None);
        }
        let namespace = req.namespace.clone().unwrap_or_default();
        let key = ObjectRef::new(namespaces::NAME).within(&namespace);
        let offloading = match self.offloadings.get(&key) {
            Some(o) => Some((*o).clone()),
            None => Api::<NamespaceOffloading>::namespaced(self.client.clone(), &namespace)
                .get_opt(namespaces::NAME)
                .await
                .map_err(|e| Refusal::Unreadable {
                    namespace: namespace.clone(),
                    error: e.to_string(),
                })?,
        };
        let pod = serde_json::to_value(pod).map_err(|e| Refusal::Malformed(e.to_string()))?;
        pod_placement::mutate(&namespace, &pod, offloading.as_ref())
    }

    /// Charges `c` on the consumer's Tenant, batched with the other admissions of the moment
    /// for that consumer ([`charges::Charger`]); a dry run is decided on a fresh read of the
    /// Tenant and writes nothing.
    async fn charge(&self, consumer: &str, ask: quota::Ask, dry_run: bool) -> Result<(), Denial> {
        if !dry_run {
            return self.charger.charge(consumer, ask).await;
        }
        let tenants: Api<Tenant> =
            Api::namespaced(self.client.clone(), &names::namespace::tenant(consumer));
        let Some(tenant) = tenants
            .get_opt(consumer)
            .await
            .map_err(|e| Denial::Unaccounted {
                cluster: consumer.to_owned(),
                error: e.to_string(),
            })?
        else {
            return Err(Denial::NoTenant {
                cluster: consumer.to_owned(),
            });
        };
        quota::charge(
            &tenant.status.unwrap_or_default(),
            consumer,
            &ask,
            Timestamp::now(),
        )?;
        Ok(())
    }
}

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
        Endpoint::ShadowPods => match review::parse(&body) {
            Ok(request) => {
                let verdict = view.decide(&request).await;
                logged(&request, &verdict);
                Ok(review::answer(&request, &verdict))
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
    });
    // Recounting is idempotent and guarded by the Tenants' resourceVersion: every replica
    // does it, so usage is released with any one of them up.
    tokio::spawn(usage::run(
        client.clone(),
        s.pending_ttl,
        s.rules.default_requests.clone(),
    ));
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
    let listener = tokio::net::TcpListener::bind(s.listen)
        .await
        .map_err(|e| Error::Listen(s.listen, e))?;
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

#[cfg(test)]
mod tests {
    use k8s_openapi::api::admissionregistration::v1::{ValidatingWebhook, WebhookClientConfig};

    use super::*;

    #[test]
    fn ca_bundle_is_set_on_every_webhook_once() {
        let hook = |bundle: Option<&str>| ValidatingWebhook {
            name: "shadowpods.offloading.fabric.io".into(),
            client_config: WebhookClientConfig {
                ca_bundle: bundle.map(|b| ByteString(b.as_bytes().to_vec())),
                ..Default::default()
            },
            ..Default::default()
        };
        let mut config = ValidatingWebhookConfiguration {
            webhooks: Some(vec![hook(None), hook(Some("old"))]),
            ..Default::default()
        };
        assert!(with_ca_bundle(&mut config, "ca"));
        assert!(
            config
                .webhooks
                .iter()
                .flatten()
                .all(|w| w.client_config.ca_bundle == Some(ByteString(b"ca".to_vec())))
        );
        assert!(!with_ca_bundle(&mut config, "ca"), "nothing to write twice");

        // The pods' mutating configuration alike.
        let mut pods = MutatingWebhookConfiguration {
            webhooks: Some(vec![
                k8s_openapi::api::admissionregistration::v1::MutatingWebhook {
                    name: "pods.offloading.fabric.io".into(),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        };
        assert!(with_ca_bundle(&mut pods, "ca"));
        assert_eq!(
            pods.webhooks.unwrap()[0].client_config.ca_bundle,
            Some(ByteString(b"ca".to_vec()))
        );
    }

    #[test]
    fn the_secret_holds_the_material() {
        let m = Material {
            ca_cert: "a".into(),
            ca_key: "b".into(),
            cert: "c".into(),
            key: "d".into(),
        };
        let s = secret_of("fabric-system", "x", &m, None);
        assert_eq!(material_of(&s), Some(m));
        assert_eq!(s.data.unwrap()["tls.crt"], ByteString(b"c".to_vec()));
    }
}
