//! `core.fabric.io/v1alpha1`: `ForeignCluster`, one per known peer cluster (on both sides of a
//! peering), with a condition per module of the peering so that `kubectl get foreignclusters`
//! says at a glance what is up, what is not, and why.
use k8s_openapi::{
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    apimachinery::pkg::apis::meta::v1::Condition,
};
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::cel::{DNS_LABEL, HTTPS_URL, IMMUTABLE};

pub const VERSION: &str = "v1alpha1";

/// The condition types of a ForeignCluster, one per module of the peering.
pub mod condition {
    /// This cluster holds an identity on the peer (consumer side), or the peer holds one
    /// here (provider side).
    pub const AUTHENTICATED: &str = "Authenticated";
    /// The tunnel to the peer is up.
    pub const NETWORK: &str = "NetworkReady";
    /// Resources were asked for and granted (consumer) or offered (provider).
    pub const RESOURCES: &str = "ResourcesGranted";
    /// The virtual node standing for the peer is Ready (consumer side).
    pub const VIRTUAL_NODE: &str = "VirtualNodeReady";
    /// The provider keeps claims of this cluster's after their twins were given up
    /// (`storageRetention: Retain`), listed in the message (consumer side).
    pub const RETAINED_VOLUMES: &str = "RetainedVolumes";
    /// The working mode between the two (docs/modes.md): True (reason `Tethered`) when the
    /// provider is tethered to the consumer, on both sides' ForeignClusters; False (reason
    /// `Autonomous`) otherwise. Written by the provider's slice controller for its consumer,
    /// by the consumer's from the provider's slice answer.
    pub const TETHERED: &str = "Tethered";
}

/// How this cluster learnt about the peer.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
pub enum DiscoveryMethod {
    /// Created by a person or `fabricctl peer`.
    #[default]
    Manual,
    /// Found through DNS-SD records under a configured search domain.
    Dns,
    /// Found through mDNS on the local network.
    Lan,
}

/// What the peer is to this cluster.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
pub enum PeerRole {
    /// Known (e.g. discovered) but not peered.
    #[default]
    Unknown,
    /// The peer lends resources to this cluster: it shows here as a virtual node.
    Provider,
    /// The peer borrows resources from this cluster: it is a tenant here.
    Consumer,
    /// Peered both ways.
    ConsumerAndProvider,
}

impl PeerRole {
    /// The role once `other` is added (a provider that also becomes a consumer is both).
    pub fn with(self, other: PeerRole) -> PeerRole {
        use PeerRole::*;
        match (self, other) {
            (Unknown, r) | (r, Unknown) => r,
            (a, b) if a == b => a,
            _ => ConsumerAndProvider,
        }
    }

    /// The role once `other` is removed (a peer that was both and stops consuming is a
    /// provider; one that only consumed and stops is unknown again).
    pub fn without(self, other: PeerRole) -> PeerRole {
        use PeerRole::*;
        match (self, other) {
            (r, Unknown) => r,
            (ConsumerAndProvider, Consumer) => Provider,
            (ConsumerAndProvider, Provider) => Consumer,
            (a, b) if a == b || b == ConsumerAndProvider => Unknown,
            (a, _) => a,
        }
    }

    /// Whether the peer lends resources to this cluster.
    pub fn provides(self) -> bool {
        matches!(self, PeerRole::Provider | PeerRole::ConsumerAndProvider)
    }

    /// Whether the peer borrows resources from this cluster.
    pub fn consumes(self) -> bool {
        matches!(self, PeerRole::Consumer | PeerRole::ConsumerAndProvider)
    }
}

/// A cluster this one knows: found by discovery or peered by hand.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "core.fabric.io",
    version = "v1alpha1",
    kind = "ForeignCluster",
    doc = "A cluster this one knows: how it was found, what it is to this cluster, and the state of each module of the peering.",
    status = "ForeignClusterStatus",
    shortname = "fc",
    category = "fabric",
    printcolumn = r#"{"name":"Role","type":"string","jsonPath":".spec.role"}"#,
    printcolumn = r#"{"name":"Found","type":"string","jsonPath":".spec.discoveredBy"}"#,
    printcolumn = r#"{"name":"Auth","type":"string","jsonPath":".status.conditions[?(@.type==\"Authenticated\")].reason"}"#,
    printcolumn = r#"{"name":"Network","type":"string","jsonPath":".status.conditions[?(@.type==\"NetworkReady\")].reason"}"#,
    printcolumn = r#"{"name":"Resources","type":"string","jsonPath":".status.conditions[?(@.type==\"ResourcesGranted\")].reason"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".status.conditions[?(@.type==\"VirtualNodeReady\")].reason"}"#,
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".status.conditions[?(@.type==\"Tethered\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ForeignClusterSpec {
    /// The peer's cluster id (a DNS label); never changes.
    #[x_kube(
        validation = Rule::new(DNS_LABEL).message("must be a DNS label (lowercase letters, digits, '-')"),
        validation = Rule::new(IMMUTABLE).message("is immutable: delete and re-create the ForeignCluster")
    )]
    #[schemars(length(max = 63))]
    pub cluster_id: String,
    #[serde(default)]
    pub discovered_by: DiscoveryMethod,
    #[serde(default)]
    pub role: PeerRole,
    /// The peer's authentication service (https), as announced or given by its peer command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(HTTPS_URL).message("must be an https:// URL"))]
    #[schemars(length(max = 512))]
    pub auth_url: Option<String>,
}

impl ForeignClusterSpec {
    /// The spec of `cluster_id`'s ForeignCluster once the peer also plays `role` here, what
    /// `existing` says kept: how it was found (manually when there is none), its other roles,
    /// its authentication service.
    pub fn playing(
        existing: Option<&ForeignClusterSpec>,
        cluster_id: &str,
        role: PeerRole,
    ) -> Self {
        Self {
            cluster_id: cluster_id.to_owned(),
            discovered_by: existing.map_or(DiscoveryMethod::Manual, |s| s.discovered_by),
            role: existing.map_or(PeerRole::Unknown, |s| s.role).with(role),
            auth_url: existing.and_then(|s| s.auth_url.clone()),
        }
    }
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ForeignClusterStatus {
    /// On a provider: the namespace holding everything of this consumer. On a consumer: its
    /// tenant namespace on the provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_namespace: Option<String>,
    /// The peer's API server, as its authentication service returned it (consumer side).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_server_url: Option<String>,
    /// See [`condition`]. A map keyed by type, so that each module (authentication, network,
    /// resources, virtual node) server-side applies its own condition without taking over or
    /// dropping the others'.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// Every CRD of this group version.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![ForeignCluster::crd()]
}

#[cfg(test)]
mod tests {
    use super::{DiscoveryMethod, ForeignClusterSpec, PeerRole::*};

    #[test]
    fn a_new_role_keeps_what_the_foreign_cluster_said() {
        let fresh = ForeignClusterSpec::playing(None, "b", Consumer);
        assert_eq!(fresh.cluster_id, "b");
        assert_eq!(fresh.discovered_by, DiscoveryMethod::Manual);
        assert_eq!(fresh.role, Consumer);
        assert_eq!(fresh.auth_url, None);
        let found = ForeignClusterSpec {
            discovered_by: DiscoveryMethod::Lan,
            role: Provider,
            auth_url: Some("https://b.example:8443".into()),
            ..fresh
        };
        let both = ForeignClusterSpec::playing(Some(&found), "b", Consumer);
        assert_eq!(both.discovered_by, DiscoveryMethod::Lan);
        assert_eq!(both.role, ConsumerAndProvider);
        assert_eq!(both.auth_url, found.auth_url);
    }

    #[test]
    fn roles_combine() {
        assert_eq!(ConsumerAndProvider.without(Consumer), Provider);
        assert_eq!(ConsumerAndProvider.without(Provider), Consumer);
        assert_eq!(Consumer.without(Consumer), Unknown);
        assert_eq!(Provider.without(Consumer), Provider);
        assert_eq!(Provider.without(ConsumerAndProvider), Unknown);
        assert_eq!(Provider.without(Unknown), Provider);
        assert_eq!(Unknown.with(Provider), Provider);
        assert_eq!(Provider.with(Provider), Provider);
        assert_eq!(Provider.with(Consumer), ConsumerAndProvider);
        assert_eq!(ConsumerAndProvider.with(Unknown), ConsumerAndProvider);
        assert!(ConsumerAndProvider.provides() && ConsumerAndProvider.consumes());
        assert!(!Unknown.provides() && !Unknown.consumes());
    }
}
