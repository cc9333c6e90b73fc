//! `offloading.fabric.io/v1alpha1`: `VirtualNode` (consumer), the spec of one virtual kubelet
//! and the Node it registers for a provider; `ShadowPod` (provider), a consumer's pod to run
//! here, written with the consumer's identity, status from the provider; `ShadowEndpointSlice`
//! (provider), a consumer's EndpointSlice the provider writes, remapped, as a real one.
use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{ContainerStatus, NodeSelector, PodCondition, PodSpec},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
};
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::{
    authentication::v1alpha1::Resources,
    cel::{DNS_LABEL, IMMUTABLE},
};

pub const VERSION: &str = "v1alpha1";

/// The condition types of a VirtualNode.
pub mod condition {
    /// The virtual kubelet runs and its Node is registered.
    pub const REGISTERED: &str = "Registered";
    /// Its Node is Ready: the provider's API and the tunnel answer.
    pub const READY: &str = "Ready";
    /// Every label the provider advertises is on its Node (false: some are refused, see
    /// [`crate::offloading::node_labels`]).
    pub const LABELS_ACCEPTED: &str = "LabelsAccepted";
}

/// A provider as a node of this cluster.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "offloading.fabric.io",
    version = "v1alpha1",
    kind = "VirtualNode",
    doc = "A provider as a node of this cluster: drives one virtual kubelet, whose Node has the granted capacity.",
    namespaced,
    status = "VirtualNodeStatus",
    shortname = "vn",
    category = "fabric",
    printcolumn = r#"{"name":"Provider","type":"string","jsonPath":".spec.clusterId"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".spec.nodeName"}"#,
    printcolumn = r#"{"name":"CPU","type":"string","jsonPath":".spec.resources.cpu"}"#,
    printcolumn = r#"{"name":"Memory","type":"string","jsonPath":".spec.resources.memory"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualNodeSpec {
    /// The provider's cluster id.
    #[x_kube(
        validation = Rule::new(DNS_LABEL).message("must be a DNS label"),
        validation = Rule::new(IMMUTABLE).message("is immutable")
    )]
    #[schemars(length(max = 63))]
    pub cluster_id: String,
    /// Name of the Node the virtual kubelet registers.
    #[x_kube(
        validation = Rule::new(DNS_LABEL).message("must be a DNS label"),
        validation = Rule::new(IMMUTABLE).message("is immutable")
    )]
    #[schemars(length(max = 63))]
    pub node_name: String,
    /// The `Identity` (same namespace) whose credentials reach the provider.
    #[x_kube(validation = Rule::new(DNS_LABEL).message("must be a DNS label"))]
    #[schemars(length(max = 63))]
    pub identity: String,
    /// Capacity and allocatable of the Node: what the provider granted.
    pub resources: Resources,
    /// Labels of the Node besides the fabric's own (the provider's advertised labels); those
    /// a provider may not set ([`crate::offloading::node_labels`]) never reach the Node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    pub labels: BTreeMap<String, String>,
    /// At-most-once semantics as the provider agreed them (absent: off, the default). The
    /// virtual kubelet then renews its heartbeat Lease on the provider and, once the provider
    /// has been out of reach longer than it takes the provider to stop the pods, marks the
    /// pods offloaded there Failed (reason `ProviderPartitioned`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_most_once: Option<AtMostOnce>,
    /// The storage the provider lends (absent: none). The virtual kubelet then provisions the
    /// claims of class [`crate::names::storage::CLASS`] whose first consumer lands on its
    /// node in the provider's twin namespace; without it, such a claim is sent back to the
    /// scheduler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<Storage>,
}

/// The StorageClasses a provider lends its tenants' claims.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Storage {
    /// The classes lent, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub classes: Vec<String>,
    /// The class a claim gets when it names none (absent: the provider's default class).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
}

/// At-most-once semantics for a consumer's offloaded pods (off by default): when the provider
/// has not seen the consumer's heartbeat (the Lease [`crate::names::lease::CONSUMER`] in its
/// tenant namespace) change for `partitionSeconds` of its own clock, it stops the consumer's
/// pods (deleted with at most `graceSeconds`, their ShadowPods Failed with reason
/// `Partitioned`, never run again), so that the consumer, which waits that long plus the
/// grace period and a margin after its own last renewal, may start replacements without two
/// copies running. Without it, pods keep running through any partition.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AtMostOnce {
    /// How long the provider waits without a heartbeat before it stops the pods.
    #[schemars(range(min = AtMostOnce::MIN_PARTITION_SECONDS, max = AtMostOnce::MAX_PARTITION_SECONDS))]
    pub partition_seconds: u32,
    /// The grace period of the stopped pods' deletion.
    #[serde(default)]
    #[schemars(range(max = AtMostOnce::MAX_GRACE_SECONDS))]
    pub grace_seconds: u32,
}

impl AtMostOnce {
    /// The partition times a ResourceSlice accepts: 1 s to 1 day.
    pub const MIN_PARTITION_SECONDS: u32 = 1;
    pub const MAX_PARTITION_SECONDS: u32 = 86_400;
    /// The longest grace period a ResourceSlice accepts: 1 hour.
    pub const MAX_GRACE_SECONDS: u32 = 3600;
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VirtualNodeStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// See [`condition`].
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// The condition types of a ShadowPod (beside the real pod's own, copied in
/// `status.podConditions`).
pub mod shadow_pod_condition {
    /// The real pod exists: reason `Created`, `Recreated` (it had vanished and was made
    /// again), `Finished` (it ended and is never revived), [`PARTITIONED`] (stopped by the
    /// at-most-once semantics, never run again), or a refusal (`Invalid`, `Forbidden`,
    /// `QuotaExceeded`) whose message is the API server's.
    pub const POD_CREATED: &str = "PodCreated";
    /// The reason (of [`POD_CREATED`] and of the ShadowPod's `Failed` phase) of a pod the
    /// provider stopped because its consumer's heartbeat stopped (see
    /// [`super::AtMostOnce`]).
    pub const PARTITIONED: &str = "Partitioned";
    /// Whether the running pod keeps to the provider's policy as it is now: `False`
    /// (`BreaksCurrentPolicy`, naming field and rule) for a pod made before the provider's
    /// admin tightened it. Such a pod runs on (as Pod Security admission evicts none) but is
    /// never made again.
    pub const POLICY_COMPLIANT: &str = "PolicyCompliant";
}

/// The home of an offloaded pod: the consumer's pod it stands for.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HomePod {
    #[schemars(length(max = 63))]
    pub namespace: String,
    #[schemars(length(max = 253))]
    pub name: String,
    #[schemars(length(max = 64))]
    pub uid: String,
}

/// What the real pod is made of: the forged pod's metadata and spec.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodTemplate {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    pub annotations: BTreeMap<String, String>,
    /// The PodSpec. Not described field by field in the CRD: its schema would be most of the
    /// CRD's size and would freeze the pod fields at this release's Kubernetes version, while
    /// the provider's API server validates the spec anyway when the real pod is created (a
    /// refusal there shows in the `PodCreated` condition).
    #[schemars(schema_with = "crate::cel::preserve_unknown_object")]
    pub spec: PodSpec,
}

/// A consumer's pod to run on this (provider) cluster.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "offloading.fabric.io",
    version = "v1alpha1",
    kind = "ShadowPod",
    doc = "A consumer's pod to run on this cluster: the provider's ShadowPod controller creates and owns the real pod of the same name and namespace.",
    namespaced,
    status = "ShadowPodStatus",
    shortname = "shpod",
    category = "fabric",
    printcolumn = r#"{"name":"Consumer","type":"string","jsonPath":".spec.clusterId"}"#,
    printcolumn = r#"{"name":"Home","type":"string","jsonPath":".spec.home.name"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"IP","type":"string","jsonPath":".status.podIP"}"#,
    printcolumn = r#"{"name":"Recreations","type":"integer","jsonPath":".status.recreations"}"#,
    printcolumn = r#"{"name":"Pod","type":"string","jsonPath":".status.conditions[?(@.type==\"PodCreated\")].reason"}"#,
    printcolumn = r#"{"name":"Policy","type":"string","jsonPath":".status.conditions[?(@.type==\"PolicyCompliant\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ShadowPodSpec {
    /// The consumer's cluster id.
    #[x_kube(
        validation = Rule::new(DNS_LABEL).message("must be a DNS label"),
        validation = Rule::new(IMMUTABLE).message("is immutable")
    )]
    #[schemars(length(max = 63))]
    pub cluster_id: String,
    /// The consumer's pod this one stands for.
    #[x_kube(validation = Rule::new(IMMUTABLE).message("is immutable"))]
    pub home: HomePod,
    /// The pod to run, forged once by the consumer's virtual kubelet.
    pub pod: PodTemplate,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ShadowPodStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The real pod's phase (`Pending`, `Running`, `Succeeded`, `Failed`, `Unknown`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The real pod's uid: a new one means it was re-created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// The real pod's IP in this cluster (the consumer translates it through its remap).
    #[serde(default, rename = "podIP", skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<String>,
    #[serde(default, rename = "podIPs", skip_serializing_if = "Vec::is_empty")]
    pub pod_ips: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// The real pod's conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_conditions: Vec<PodCondition>,
    /// The real pod's container statuses (as the provider's Kubernetes version writes them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::cel::preserve_unknown_array")]
    pub container_statuses: Vec<ContainerStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::cel::preserve_unknown_array")]
    pub init_container_statuses: Vec<ContainerStatus>,
    /// How many times the real pod was created again after it vanished while not finished.
    #[serde(default)]
    pub recreations: u32,
    /// What the real pod holds of its node as last seen ([`crate::requests::held`]): the
    /// larger of its spec's requests and what its containers report while a resize is in
    /// flight. The tenant is charged the larger of this and the ShadowPod's own requests, so
    /// that shrinking a ShadowPod frees its share only once the pod has shrunk.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub reserved: Resources,
    /// When the provider's controller first saw the real pod finished (`Succeeded` or
    /// `Failed`): the provider collects the ShadowPod a retention period after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// See [`shadow_pod_condition`].
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// The conditions of an endpoint (discovery.k8s.io/v1's).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct EndpointConditions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminating: Option<bool>,
}

/// What an endpoint stands for at home (its pod, as a `RemotePod`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct EndpointTarget {
    #[schemars(length(max = 63))]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub namespace: Option<String>,
    #[schemars(length(max = 253))]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub uid: Option<String>,
}

/// One endpoint of a consumer's slice, its addresses as the consumer has them (the provider
/// remaps them).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ShadowEndpoint {
    #[schemars(length(min = 1, max = 100))]
    pub addresses: Vec<String>,
    #[serde(default)]
    pub conditions: EndpointConditions,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub zone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_ref: Option<EndpointTarget>,
}

/// A port of a consumer's slice (discovery.k8s.io/v1's).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ShadowEndpointPort {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub protocol: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub app_protocol: Option<String>,
}

/// The slice a consumer asks for (its endpoints not running on this provider).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSliceTemplate {
    /// `IPv4` (the only family the fabric remaps for now).
    #[x_kube(validation = Rule::new("self == 'IPv4'").message("only IPv4 slices are reflected for now (addressType must be IPv4)"))]
    pub address_type: String,
    #[serde(default)]
    #[schemars(length(max = 1000))]
    pub endpoints: Vec<ShadowEndpoint>,
    #[serde(default)]
    #[schemars(length(max = 100))]
    pub ports: Vec<ShadowEndpointPort>,
}

/// A consumer's EndpointSlice for this cluster, written in a twin (or tenant) namespace by
/// its virtual kubelet: the provider's ShadowEndpointSlice controller writes the real
/// EndpointSlice of the same name there, each address remapped through its view of the
/// consumer (refused when it is not one of the consumer's).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "offloading.fabric.io",
    version = "v1alpha1",
    kind = "ShadowEndpointSlice",
    doc = "A consumer's EndpointSlice for this cluster: the provider writes the real EndpointSlice of the same name, its addresses remapped.",
    namespaced,
    shortname = "sheps",
    category = "fabric",
    printcolumn = r#"{"name":"Service","type":"string","jsonPath":".metadata.labels.kubernetes\\.io/service-name"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ShadowEndpointSliceSpec {
    pub template: EndpointSliceTemplate,
}

/// A consumer's NetworkPolicy for this cluster, written in a twin namespace by its virtual
/// kubelet: its peers that select home pods already turned into `ipBlock`s of the home pods'
/// own addresses (the consumer's view), its peers that select pods running in this cluster's
/// twins kept as selectors. The provider's ShadowNetworkPolicy controller writes the real
/// NetworkPolicy of the same name there, each `ipBlock` remapped through its view of the
/// consumer and whatever is not the consumer's own refused (addresses of this cluster,
/// namespaces other than the consumer's twins).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "offloading.fabric.io",
    version = "v1alpha1",
    kind = "ShadowNetworkPolicy",
    doc = "A consumer's NetworkPolicy for this cluster: the provider writes the real NetworkPolicy of the same name, its address blocks remapped.",
    namespaced,
    shortname = "shnetpol",
    category = "fabric",
    printcolumn = r#"{"name":"Policy-Types","type":"string","jsonPath":".spec.template.policyTypes"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ShadowNetworkPolicySpec {
    /// The NetworkPolicySpec (networking.k8s.io/v1), in the consumer's addresses, described
    /// field by field: a shadow the provider's controller could not read as that type would
    /// stop its watch for every consumer, so the API server refuses it first. The controller
    /// keeps only what it can vouch for, and the provider's API server validates the real one.
    pub template: k8s_openapi::api::networking::v1::NetworkPolicySpec,
}

/// How the twin of an offloaded namespace is named on each provider
/// ([`crate::offloading::namespaces::twin_name`]).
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
pub enum MappingStrategy {
    /// `<namespace>-<this cluster's id>`, shortened with a hash past 63 characters: never
    /// clashes with the provider's own namespaces nor with another consumer's twins.
    #[default]
    DefaultName,
    /// The namespace's own name: Services keep their DNS names across clusters, but the
    /// provider refuses it when a namespace of that name exists there already.
    EnforceSameName,
    /// `remoteNamespaceName`.
    SelectedName,
}

/// Where the pods of an offloaded namespace may run (the consumer's pod webhook sets their
/// toleration and node affinity accordingly when they are created).
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
pub enum PodOffloadingStrategy {
    /// On this cluster's nodes and on the selected providers' virtual nodes.
    #[default]
    LocalAndRemote,
    /// On the selected providers' virtual nodes only.
    Remote,
    /// On this cluster's nodes only: the twins exist (Services and configuration are
    /// reflected) but no pod is offloaded.
    Local,
}

/// What becomes of the claims the fabric made in a twin (the remote claims of the namespace's
/// volumes) when the twin would go: the namespace unoffloaded, a provider no longer selected,
/// the peering ended.
#[derive(
    schemars::JsonSchema,
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Default,
)]
pub enum StorageRetention {
    /// The provider keeps the twin while it holds such claims (the consumer's rights there
    /// removed, its pods stopped) and reports them; `fabricctl forget volumes` deletes them,
    /// then the twin goes.
    #[default]
    Retain,
    /// The twin goes with its claims and their data.
    Delete,
}

/// A namespace of this (consumer) cluster offloaded to its providers: each provider the
/// `clusterSelector` selects makes a twin namespace, where this namespace's pods run and its
/// objects are reflected.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "offloading.fabric.io",
    version = "v1alpha1",
    kind = "NamespaceOffloading",
    doc = "A namespace offloaded to the providers its clusterSelector selects: one per namespace, named offloading.",
    namespaced,
    status = "NamespaceOffloadingStatus",
    shortname = "nsoff",
    category = "fabric",
    validation = Rule::new("self.metadata.name == 'offloading'").message("must be named offloading: a namespace is offloaded by one NamespaceOffloading"),
    printcolumn = r#"{"name":"Mapping","type":"string","jsonPath":".spec.namespaceMappingStrategy"}"#,
    printcolumn = r#"{"name":"Pods","type":"string","jsonPath":".spec.podOffloadingStrategy"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Remote","type":"string","priority":10,"jsonPath":".status.remoteNamespaceName"}"#,
    printcolumn = r#"{"name":"Created-Before","type":"integer","priority":10,"jsonPath":".status.createdBefore.count"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.namespaceMappingStrategy != 'SelectedName' || has(self.remoteNamespaceName)").message("remoteNamespaceName is required with namespaceMappingStrategy SelectedName"),
    validation = Rule::new("!has(self.remoteNamespaceName) || self.namespaceMappingStrategy == 'SelectedName'").message("remoteNamespaceName is only for namespaceMappingStrategy SelectedName"),
    validation = Rule::new("self.namespaceMappingStrategy == oldSelf.namespaceMappingStrategy && has(self.remoteNamespaceName) == has(oldSelf.remoteNamespaceName) && (!has(self.remoteNamespaceName) || self.remoteNamespaceName == oldSelf.remoteNamespaceName)").message("namespaceMappingStrategy and remoteNamespaceName cannot change after creation: unoffload the namespace and offload it again"),
    validation = Rule::new("self.storageRetention == oldSelf.storageRetention").message("storageRetention cannot change after creation: the provider marks each twin with it when it makes it, and decides the data's fate from that mark")
)]
pub struct NamespaceOffloadingSpec {
    #[serde(default)]
    #[schemars(default = "MappingStrategy::default")]
    pub namespace_mapping_strategy: MappingStrategy,
    /// The twin's name on every provider, with `SelectedName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(DNS_LABEL).message("must be a DNS label"))]
    #[schemars(length(max = 63))]
    pub remote_namespace_name: Option<String>,
    #[serde(default)]
    #[schemars(default = "PodOffloadingStrategy::default")]
    pub pod_offloading_strategy: PodOffloadingStrategy,
    /// Which providers get a twin, over their virtual nodes' labels: terms ORed, the
    /// expressions of a term ANDed; absent or without terms: every provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_selector: Option<NodeSelector>,
    /// What becomes of the twins' claims (and their data) when a twin would go.
    #[serde(default)]
    #[schemars(default = "StorageRetention::default")]
    pub storage_retention: StorageRetention,
}

/// Where a NamespaceOffloading stands ([`crate::offloading::namespaces::phase`]).
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OffloadingPhase {
    /// Every selected provider's twin is ready.
    Ready,
    /// The selector selects no provider.
    NoClusterSelected,
    /// Some twins are being made.
    InProgress,
    /// Some selected providers refused their twin (see `clusters`).
    SomeFailed,
    /// Every selected provider refused its twin.
    AllFailed,
    /// Being unoffloaded: the twins are being removed.
    Terminating,
}

/// What one provider makes of an offloaded namespace.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TwinPhase {
    /// Asked for, not answered yet.
    Creating,
    /// The twin exists and this cluster's pods and objects may go there.
    Ready,
    /// The provider refused it (`reason`, `message` say why): nothing is offloaded there.
    Refused,
    /// Being removed with its content.
    Terminating,
}

/// One provider of an offloaded namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterOffloading {
    /// The provider's cluster id.
    #[schemars(length(max = 63))]
    pub cluster_id: String,
    /// Whether the `clusterSelector` selects it.
    pub selected: bool,
    /// Its twin, when it was asked for one (or still has one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub twin: Option<TwinPhase>,
    /// Why it is not ready, in a word (`Refused`: the provider's reason).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceOffloadingStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<OffloadingPhase>,
    /// The twin's name on the providers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_namespace_name: Option<String>,
    /// Why the providers are selected as they are, when the selector cannot be evaluated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Every provider this cluster has a virtual node of, selected or not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["clusterId"]))]
    pub clusters: Vec<ClusterOffloading>,
    /// Pods of the namespace created before it was offloaded (or while its strategy kept pods
    /// home), which the offloading does not place: they stay where they run until created
    /// again. Absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_before: Option<PodsCreatedBefore>,
}

/// The pods a namespace's offloading does not place, as [`NamespaceOffloadingStatus`] says.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PodsCreatedBefore {
    /// How many.
    pub count: u32,
    /// The first of their names, in order (at most [`PodsCreatedBefore::SHOWN`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10))]
    pub pods: Vec<String>,
}

impl PodsCreatedBefore {
    /// How many names the status shows.
    pub const SHOWN: usize = 10;

    /// The status of these pods' names (any order); `None` when there are none.
    pub fn of<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<Self> {
        let mut pods: Vec<String> = names.into_iter().map(str::to_owned).collect();
        if pods.is_empty() {
            return None;
        }
        pods.sort();
        let count = u32::try_from(pods.len()).unwrap_or(u32::MAX);
        pods.truncate(Self::SHOWN);
        Some(Self { count, pods })
    }
}

/// One offloaded namespace of a consumer, as it asks its provider for a twin.
#[derive(
    KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord,
)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceMapping {
    /// The namespace in the consumer's cluster.
    #[x_kube(validation = Rule::new(DNS_LABEL).message("must be a DNS label"))]
    #[schemars(length(max = 63))]
    pub home: String,
    /// The twin's name on the provider.
    #[x_kube(validation = Rule::new(DNS_LABEL).message("must be a DNS label"))]
    #[schemars(length(max = 63))]
    pub remote: String,
    /// What becomes of the twin's claims when it would go (absent: `Retain`); the provider
    /// marks the twin with it when it makes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_retention: Option<StorageRetention>,
}

/// A claim in a twin, by namespace, name and UID.
#[derive(
    KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord,
)]
#[serde(rename_all = "camelCase")]
pub struct ClaimRef {
    #[schemars(length(max = 63))]
    pub namespace: String,
    #[schemars(length(max = 253))]
    pub name: String,
    #[schemars(length(max = 64))]
    pub uid: String,
}

/// A claim the fabric made in a twin that is kept after its twin was given up
/// ([`StorageRetention::Retain`]): the consumer can no longer reach it.
#[derive(
    KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord,
)]
#[serde(rename_all = "camelCase")]
pub struct RetainedClaim {
    /// The twin it is in.
    #[schemars(length(max = 63))]
    pub namespace: String,
    /// The consumer's namespace that twin was the twin of.
    #[schemars(length(max = 63))]
    pub home: String,
    #[schemars(length(max = 253))]
    pub name: String,
    #[schemars(length(max = 64))]
    pub uid: String,
    /// Its size (`spec.resources.requests.storage`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub size: Option<String>,
    /// Its StorageClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub class: Option<String>,
}

/// The condition of one twin on the provider.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum MappingPhase {
    /// The twin exists, the tenant's rights are bound there.
    Accepted,
    /// Not made (`reason`, `message` say why): a namespace of that name exists and is not
    /// this tenant's twin, the name is reserved, the tenant has too many twins.
    Refused,
    /// Being removed with everything in it.
    Terminating,
}

/// The provider's answer for one [`NamespaceMapping`].
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TwinStatus {
    #[schemars(length(max = 63))]
    pub home: String,
    #[schemars(length(max = 63))]
    pub remote: String,
    pub phase: MappingPhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The reasons of a refused twin ([`MappingPhase::Refused`]).
pub mod twin_reason {
    /// A namespace of that name exists on the provider and is not this tenant's twin of that
    /// home namespace: never adopted.
    pub const NOT_OURS: &str = "NamespaceExists";
    /// The provider keeps that name (its system and the fabric's namespaces).
    pub const RESERVED: &str = "Reserved";
    /// The tenant has as many twins as the provider allows.
    pub const TOO_MANY: &str = "TooManyNamespaces";
    /// Two home namespaces of the map ask for the same twin.
    pub const DUPLICATE: &str = "Duplicate";
    /// The map itself is not served: not named after its consumer, not in that consumer's
    /// tenant namespace, or the consumer is no tenant (any more).
    pub const NOT_SERVED: &str = "NotServed";
}

/// The namespaces a consumer offloads to this (provider) cluster: one per consumer, named
/// after it, in its tenant namespace. The consumer writes the spec (with its identity); the
/// provider makes a twin namespace for each mapping and answers in the status.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "offloading.fabric.io",
    version = "v1alpha1",
    kind = "NamespaceMap",
    doc = "The namespaces a consumer offloads to this cluster: the provider makes and removes their twin namespaces.",
    namespaced,
    status = "NamespaceMapStatus",
    shortname = "nsmap",
    category = "fabric",
    printcolumn = r#"{"name":"Consumer","type":"string","jsonPath":".spec.clusterId"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceMapSpec {
    /// The consumer's cluster id.
    #[x_kube(
        validation = Rule::new(DNS_LABEL).message("must be a DNS label"),
        validation = Rule::new(IMMUTABLE).message("is immutable")
    )]
    #[schemars(length(max = 63))]
    pub cluster_id: String,
    #[serde(default)]
    #[schemars(length(max = 256))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["home"]))]
    pub namespaces: Vec<NamespaceMapping>,
    /// Retained claims (`status.retained`) the consumer gives up: the provider deletes each
    /// (its UID as precondition), and a retained twin left without claims goes. An entry
    /// naming anything else is ignored. Written by `fabricctl forget volumes`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub forget: Vec<ClaimRef>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceMapStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// One entry per mapping of the spec, and per twin still being removed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["home"]))]
    pub namespaces: Vec<TwinStatus>,
    /// The claims kept in twins this map no longer asks for (`storageRetention: Retain`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["namespace", "name"]))]
    pub retained: Vec<RetainedClaim>,
}

/// Every CRD of this group version.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        VirtualNode::crd(),
        ShadowPod::crd(),
        ShadowEndpointSlice::crd(),
        ShadowNetworkPolicy::crd(),
        NamespaceOffloading::crd(),
        NamespaceMap::crd(),
    ]
}
