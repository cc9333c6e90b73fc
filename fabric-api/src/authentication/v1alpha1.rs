//! `authentication.fabric.io/v1alpha1`.
//!
//! - `Tenant` (provider, in the consumer's tenant namespace): the consumer as the provider sees
//!   it, written by the authentication service; its state and caps are the provider admin's.
//! - `Identity` (consumer): the credentials a provider issued to this cluster, kept in a
//!   kubeconfig Secret, and when they need renewing.
//! - `ResourceSlice` (consumer, replicated into the tenant namespace on the provider): spec
//!   from the consumer (what it asks for), status from the provider (what it granted, why
//!   less, which node labels come with it).
use std::collections::BTreeMap;

use k8s_openapi::{
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{Condition, Time},
    },
};
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::{
    cel::{DNS_LABEL, HTTPS_URL, IMMUTABLE},
    offloading::v1alpha1::AtMostOnce,
};

pub const VERSION: &str = "v1alpha1";

/// Resource names (`cpu`, `memory`, `pods`, `ephemeral-storage`, `nvidia.com/gpu`, ...) to
/// quantities, as in a Pod's requests or a Node's capacity.
pub type Resources = BTreeMap<String, Quantity>;

/// What a provider admin lets a tenant do.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
pub enum TenantState {
    /// Gets offers as its slices ask.
    #[default]
    Active,
    /// Keeps what it was granted, gets nothing new.
    Cordoned,
    /// Granted nothing: its slices are answered with zero and its pods are to go.
    Drained,
}

/// Whether this provider hands control of its resources to the tenant (docs/modes.md). The
/// provider admin's (`fabricctl mode`); the consumer has no write on Tenants.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
pub enum WorkingMode {
    /// The provider keeps control: the tenant is offered a share of what is free (90%), the
    /// provider's own workloads run as ever.
    #[default]
    Autonomous,
    /// The provider is tethered to this tenant, its only consumer: the tenant is offered all
    /// of what is free, other consumers nothing, and new local workload pods are refused.
    Tethered,
}

impl WorkingMode {
    pub fn is_autonomous(&self) -> bool {
        *self == WorkingMode::Autonomous
    }

    /// Its name, as `fabricctl mode` and `fabricctl status` say it.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkingMode::Autonomous => "autonomous",
            WorkingMode::Tethered => "tethered",
        }
    }
}

impl std::fmt::Display for WorkingMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How much a provider lets a tenant's pods do: a Pod Security Standards level, with the
/// provider's own volume and scheduling rules (`fabric_offloading::shadowpod::policy`).
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
#[serde(rename_all = "camelCase")]
pub enum PodSecurity {
    /// Pod Security Standards baseline. The default.
    #[default]
    Baseline,
    /// Pod Security Standards restricted on top: no privilege escalation, non-root, a seccomp
    /// profile, every capability dropped but NET_BIND_SERVICE.
    Restricted,
}

impl PodSecurity {
    /// Its name, as in a flag, the Tenant's spec and a `pod-security.kubernetes.io` label.
    pub fn as_str(self) -> &'static str {
        match self {
            PodSecurity::Baseline => "baseline",
            PodSecurity::Restricted => "restricted",
        }
    }
}

impl std::fmt::Display for PodSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for PodSecurity {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "baseline" => Ok(PodSecurity::Baseline),
            "restricted" => Ok(PodSecurity::Restricted),
            other => Err(format!(
                "{other:?} is not a pod security level (baseline, restricted)"
            )),
        }
    }
}

/// A consumer, as this (provider) cluster knows it.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "authentication.fabric.io",
    version = "v1alpha1",
    kind = "Tenant",
    doc = "A consumer cluster as this provider knows it: its identity, state and caps.",
    namespaced,
    status = "TenantStatus",
    shortname = "ftenant",
    category = "fabric",
    printcolumn = r#"{"name":"Consumer","type":"string","jsonPath":".spec.clusterId"}"#,
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".spec.state"}"#,
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.mode"}"#,
    printcolumn = r#"{"name":"User","type":"string","jsonPath":".status.user"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct TenantSpec {
    #[x_kube(
        validation = Rule::new(DNS_LABEL).message("must be a DNS label"),
        validation = Rule::new(IMMUTABLE).message("is immutable")
    )]
    #[schemars(length(max = 63))]
    pub cluster_id: String,
    #[serde(default)]
    pub state: TenantState,
    /// Upper bounds of what this tenant may be granted in total, per resource; a resource
    /// capped at 0 is refused. Absent resources are bounded only by the cluster's policy.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub caps: Resources,
    /// What this tenant's pods may do, when the provider admin sets it for this tenant alone:
    /// otherwise the level the provider's controllers were started with (`--pod-security`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_security: Option<PodSecurity>,
    /// `Tethered`: this provider hands control of its resources to this tenant (absent:
    /// `Autonomous`). At most one Tenant may say so, and only while no other consumer is
    /// peered: `fabricctl mode tethered` checks it, and the provider's offer policy honours
    /// a single tethered Tenant only (docs/modes.md).
    #[serde(default, skip_serializing_if = "WorkingMode::is_autonomous")]
    pub mode: WorkingMode,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TenantStatus {
    /// The Kubernetes user the consumer's certificate names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// When the last certificate issued to it expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_expiry: Option<Time>,
    /// See [`tenant_condition`].
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// What the tenant's live ShadowPods request of its grant, per resource. The provider's
    /// ShadowPod webhook charges a creation (or a resize) here before admitting it, with the
    /// resourceVersion as precondition, so that its replicas cannot together admit more than
    /// the grant; its reconciler recomputes it from the ShadowPods, so that finished and
    /// deleted ones release their share.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    pub used: Resources,
    /// Charges admitted lately whose ShadowPods the reconciler has not seen yet: counted in
    /// `used` until it sees them, or for a while only, should their creation have failed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<Charge>,
    /// How many ShadowPods the tenant had (running or finished) at the last recount: with
    /// the pending charges, what the webhook bounds a creation by.
    #[serde(default)]
    pub shadow_pods: u32,
    /// The size of those ShadowPods (each as JSON, its status aside) at the last recount: with
    /// the pending charges' bytes, what the webhook bounds a creation or growth by.
    #[serde(default)]
    pub shadow_pod_bytes: u64,
    /// Claims (PersistentVolumeClaims in the tenant's namespaces) the webhook admitted lately
    /// against the storage granted (`storage.fabric.io/CLASS`), not seen in its listing of
    /// them yet: counted until they are, or for a while only, should their creation have
    /// failed. Written, as `used`, with the resourceVersion as precondition, so that its
    /// replicas cannot together admit more than the grant.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<Charge>,
    /// Creations of the other kinds a consumer makes here (ResourceSlices, PeeringNetworks)
    /// admitted lately whose objects the webhook's listing did not show yet: counted with
    /// those listed against the per-namespace bound until a listing shows them, or for a while
    /// only, should their creation have failed. Kept here, written with the resourceVersion
    /// as precondition, so that the webhook's replicas racing for the last place are ordered
    /// by the API server: the second sees the first's charge.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_objects: Vec<ObjectCharge>,
}

/// A creation of an object that is not a ShadowPod admitted against the per-namespace bound
/// of its kind.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ObjectCharge {
    /// `group/Kind` of the object.
    #[schemars(length(max = 317))]
    pub kind: String,
    #[schemars(length(max = 63))]
    pub namespace: String,
    /// Its name; the admission request's uid when the name was not known at admission.
    #[schemars(length(max = 253))]
    pub name: String,
    /// When it was admitted.
    pub at: Time,
}

/// The condition types of a Tenant.
pub mod tenant_condition {
    /// Whether the tenant is drained (its `spec.state`), since its lastTransitionTime: reason
    /// `NotDrained`, `Draining` (its ShadowPods are deleted by the provider once the drain
    /// grace has passed) or `Stopped` (they were). Written by the provider's sharing
    /// controller.
    pub const DRAINED: &str = "Drained";
    /// Whether the provider is tethered to this tenant (its `spec.mode`): reason `Tethered`
    /// (True), `Leaving` (False since its lastTransitionTime, when the provider left tethered
    /// mode: once the drain grace has passed, the tenant's ShadowPods beyond its grant are
    /// deleted, newest first) or `Autonomous`. Written by the provider's sharing controller.
    pub const TETHERED: &str = "Tethered";
}

/// A ShadowPod creation or resize (or a claim) admitted against a tenant's grant.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Charge {
    #[schemars(length(max = 63))]
    pub namespace: String,
    #[schemars(length(max = 253))]
    pub name: String,
    /// When it was admitted.
    pub at: Time,
    /// The ShadowPod's requests once created or resized (a claim's: its size, as
    /// `storage.fabric.io/CLASS`).
    #[schemars(extend("maxProperties" = 64))]
    pub requests: Resources,
    /// The bytes it adds to the tenant's ShadowPods: all of it for a creation, the growth
    /// for an update.
    #[serde(default)]
    pub bytes: u64,
}

/// Credentials a provider issued to this (consumer) cluster.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "authentication.fabric.io",
    version = "v1alpha1",
    kind = "Identity",
    doc = "Credentials a provider issued to this cluster: where they are kept, and when they expire.",
    namespaced,
    status = "IdentityStatus",
    shortname = "fidentity",
    category = "fabric",
    printcolumn = r#"{"name":"Provider","type":"string","jsonPath":".spec.clusterId"}"#,
    printcolumn = r#"{"name":"Tenant Namespace","type":"string","jsonPath":".spec.tenantNamespace"}"#,
    printcolumn = r#"{"name":"Expires","type":"date","jsonPath":".status.certificateExpiry"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct IdentitySpec {
    /// The provider's cluster id.
    #[x_kube(validation = Rule::new(DNS_LABEL).message("must be a DNS label"))]
    #[schemars(length(max = 63))]
    pub cluster_id: String,
    /// The provider's API server.
    #[x_kube(validation = Rule::new(HTTPS_URL).message("must be an https:// URL"))]
    #[schemars(length(max = 512))]
    pub api_server_url: String,
    /// The provider's authentication service (renewals go there).
    #[x_kube(validation = Rule::new(HTTPS_URL).message("must be an https:// URL"))]
    #[schemars(length(max = 512))]
    pub auth_url: String,
    /// This cluster's namespace on the provider.
    #[x_kube(validation = Rule::new(DNS_LABEL).message("must be a DNS label"))]
    #[schemars(length(max = 63))]
    pub tenant_namespace: String,
    /// The Secret holding the kubeconfig under `kubeconfig`, in namespace `fabric-identities`
    /// (where only the identities providers issued live), not the Identity's.
    #[x_kube(validation = Rule::new(DNS_LABEL).message("must be a DNS label"))]
    #[schemars(length(max = 63))]
    pub secret_name: String,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IdentityStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_expiry: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewed_at: Option<Time>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// The condition types of a ResourceSlice.
pub mod slice_condition {
    /// The provider has answered: reason `Granted`, `PartiallyGranted` (the message says
    /// which resources fell short and why) or `Refused`.
    pub const ACCEPTED: &str = "Accepted";
}

/// Resources a consumer asks a provider for, and what the provider grants.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "authentication.fabric.io",
    version = "v1alpha1",
    kind = "ResourceSlice",
    doc = "Resources a consumer asks a provider for (spec, from the consumer) and what the provider grants (status, from the provider).",
    namespaced,
    status = "ResourceSliceStatus",
    shortname = "fslice",
    category = "fabric",
    printcolumn = r#"{"name":"Consumer","type":"string","jsonPath":".spec.consumerClusterId"}"#,
    printcolumn = r#"{"name":"Provider","type":"string","jsonPath":".spec.providerClusterId"}"#,
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].reason"}"#,
    printcolumn = r#"{"name":"CPU","type":"string","jsonPath":".status.granted.cpu"}"#,
    printcolumn = r#"{"name":"Memory","type":"string","jsonPath":".status.granted.memory"}"#,
    printcolumn = r#"{"name":"Pods","type":"string","jsonPath":".status.granted.pods"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSliceSpec {
    #[x_kube(
        validation = Rule::new(DNS_LABEL).message("must be a DNS label"),
        validation = Rule::new(IMMUTABLE).message("is immutable")
    )]
    #[schemars(length(max = 63))]
    pub consumer_cluster_id: String,
    #[x_kube(
        validation = Rule::new(DNS_LABEL).message("must be a DNS label"),
        validation = Rule::new(IMMUTABLE).message("is immutable")
    )]
    #[schemars(length(max = 63))]
    pub provider_cluster_id: String,
    /// What the consumer asks for (`cpu`, `memory`, `pods`, `ephemeral-storage`, extended
    /// resources such as `nvidia.com/gpu`).
    #[schemars(extend("maxProperties" = 32))]
    pub resources: Resources,
    /// At-most-once semantics for the pods offloaded to this provider, if the consumer asks
    /// for them (off by default); the provider says in the status what it agrees to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_most_once: Option<AtMostOnce>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSliceStatus {
    /// What the provider grants (never more than asked).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub granted: Resources,
    /// Labels the consumer's virtual node carries, describing what the provider offers
    /// (e.g. `node-type: gpu`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    pub node_labels: BTreeMap<String, String>,
    /// The at-most-once semantics the provider agrees to (absent: off): what was asked,
    /// within the provider's bounds. The provider enforces these, and the consumer's virtual
    /// node follows them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_most_once: Option<AtMostOnce>,
    /// When storage is granted (resources `storage.fabric.io/CLASS`): the class a claim gets
    /// when it names none, one of those granted (the provider's default when it is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub default_storage_class: Option<String>,
    /// `Tethered` when the provider is tethered to this consumer (it offers all of its free
    /// capacity, to this consumer alone); absent: `Autonomous`.
    #[serde(default, skip_serializing_if = "WorkingMode::is_autonomous")]
    pub mode: WorkingMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// See [`slice_condition`].
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// Every CRD of this group version.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![Tenant::crd(), Identity::crd(), ResourceSlice::crd()]
}
