//! `offloading.fabric.io/v1alpha1`: `VirtualNode` (consumer), the spec of one virtual kubelet
//! and the Node it registers for a provider.
use std::collections::BTreeMap;

use k8s_openapi::{
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    apimachinery::pkg::apis::meta::v1::Condition,
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
    /// Labels of the Node besides the fabric's own (the provider's advertised labels).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    pub labels: BTreeMap<String, String>,
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

/// Every CRD of this group version.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![VirtualNode::crd()]
}
