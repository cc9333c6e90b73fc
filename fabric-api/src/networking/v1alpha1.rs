//! `networking.fabric.io/v1alpha1`: how this cluster reaches its peers' networks.
//!
//! Modelled on Liqo's networking API: per peer, a `Configuration` (the peer's real CIDRs in
//! spec, the remapped CIDRs this cluster chose in status), the gateway pair
//! (`GatewayServer` / `GatewayClient`), the peer's WireGuard `PublicKey`, and the
//! `Connection` the gateway reports. `IP` exposes a local non-pod address through the local
//! external CIDR; `Network` is an IPAM record (a CIDR asked for, and the one granted).
//!
//! Validation happens in the API server where it can (CEL rules and OpenAPI bounds in the
//! generated CRDs), so a bad object is refused with a message instead of reaching a controller.
use ipnetwork::Ipv4Network;
use k8s_openapi::{
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    apimachinery::pkg::apis::meta::v1::Condition,
};
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use serde::{Deserialize, Serialize};

pub const VERSION: &str = "v1alpha1";

use crate::cel::{
    AT_MOST_SLASH_8, DNS_LABEL, IP_ADDRS, IPV4_ADDR, IPV4_CIDR, NO_HOST_BITS, UNICAST, WG_KEY,
};

/// A cluster's pod and external CIDRs.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterCidrs {
    /// Pod CIDR, e.g. 10.244.0.0/16.
    #[x_kube(
        validation = Rule::new(IPV4_CIDR).message("must be an IPv4 CIDR such as 10.244.0.0/16"),
        validation = Rule::new(NO_HOST_BITS).message("has host bits set: give the network address (10.244.0.0/16, not 10.244.1.10/16)"),
        validation = Rule::new(AT_MOST_SLASH_8).message("must be a /8 or longer prefix: a shorter one would route most addresses to the peer"),
        validation = Rule::new(UNICAST).message("must be a unicast range (not loopback, link-local, multicast or 0.0.0.0/8)")
    )]
    #[schemars(with = "String", length(max = 18))]
    pub pod: Ipv4Network,
    /// External CIDR: the addresses under which the cluster exposes non-pod IPs to peers.
    #[x_kube(
        validation = Rule::new(IPV4_CIDR).message("must be an IPv4 CIDR such as 10.70.0.0/16"),
        validation = Rule::new(NO_HOST_BITS).message("has host bits set: give the network address (10.244.0.0/16, not 10.244.1.10/16)"),
        validation = Rule::new(AT_MOST_SLASH_8).message("must be a /8 or longer prefix: a shorter one would route most addresses to the peer"),
        validation = Rule::new(UNICAST).message("must be a unicast range (not loopback, link-local, multicast or 0.0.0.0/8)")
    )]
    #[schemars(with = "String", length(max = 18))]
    pub external: Ipv4Network,
}

/// How this cluster reaches one peer's networks.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "networking.fabric.io",
    version = "v1alpha1",
    kind = "Configuration",
    doc = "How this cluster reaches one peer's networks: the peer's real CIDRs, and (in status) how they are seen here.",
    namespaced,
    status = "ConfigurationStatus",
    shortname = "fconfig",
    category = "fabric",
    printcolumn = r#"{"name":"Peer","type":"string","jsonPath":".spec.clusterId"}"#,
    printcolumn = r#"{"name":"Pod CIDR","type":"string","jsonPath":".spec.remote.pod"}"#,
    printcolumn = r#"{"name":"Seen As","type":"string","jsonPath":".status.remote.pod"}"#,
    printcolumn = r#"{"name":"External CIDR","type":"string","jsonPath":".spec.remote.external"}"#,
    printcolumn = r#"{"name":"Ext Seen As","type":"string","jsonPath":".status.remote.external"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ConfigurationSpec {
    /// Id of the peer cluster (a DNS label).
    #[x_kube(validation = Rule::new(DNS_LABEL).message("must be a DNS label (lowercase letters, digits, '-')"))]
    pub cluster_id: String,
    /// The peer's real CIDRs.
    pub remote: ClusterCidrs,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConfigurationStatus {
    /// The CIDRs under which this cluster sees the peer's networks (equal to the real ones
    /// when they clash with nothing here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<ClusterCidrs>,
    /// Data-plane id of the peer on this cluster's gateway (keys its maps and counters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4095))]
    pub peer_id: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Keyed by type: IPAM sets `Ready`, the gateway operator `GatewayAccepted`, each under
    /// its own field manager without dropping the other's.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// How the gateway service is exposed.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
pub enum ServiceType {
    ClusterIP,
    #[default]
    NodePort,
    LoadBalancer,
}

/// The listening side of a tunnel (the peer dials it; it may sit behind NAT).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "networking.fabric.io",
    version = "v1alpha1",
    kind = "GatewayServer",
    doc = "The listening side of the tunnel to a peer.",
    namespaced,
    status = "GatewayServerStatus",
    shortname = "gwserver",
    category = "fabric",
    printcolumn = r#"{"name":"Peer","type":"string","jsonPath":".spec.clusterId"}"#,
    printcolumn = r#"{"name":"Type","type":"string","jsonPath":".spec.serviceType"}"#,
    printcolumn = r#"{"name":"Port","type":"integer","jsonPath":".spec.port"}"#,
    printcolumn = r#"{"name":"Address","type":"string","jsonPath":".status.endpoint.addresses[0]"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GatewayServerSpec {
    #[x_kube(validation = Rule::new(DNS_LABEL).message("must be a DNS label"))]
    pub cluster_id: String,
    #[serde(default)]
    pub service_type: ServiceType,
    /// UDP port the gateway listens on.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// Tunnel MTU (the default leaves room for WireGuard on a 1500-byte underlay).
    #[serde(default = "default_mtu")]
    #[schemars(range(min = 576, max = 9000))]
    pub mtu: i32,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GatewayServerStatus {
    /// Where peers reach this server (after any NodePort/LoadBalancer mapping).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<Endpoint>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// Addresses and UDP port of a gateway.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// IP addresses (the gateway dials the first). Hostnames are refused rather than resolved:
    /// the gateway takes addresses only, and a name in its configuration would stop it.
    #[x_kube(validation = Rule::new(IP_ADDRS).message("must be IP addresses: a hostname is not resolved; give the address it resolves to"))]
    #[schemars(length(min = 1, max = 8), inner(length(max = 45)))]
    pub addresses: Vec<String>,
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
}

/// The dialing side of a tunnel.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "networking.fabric.io",
    version = "v1alpha1",
    kind = "GatewayClient",
    doc = "The dialing side of the tunnel to a peer.",
    namespaced,
    status = "GatewayClientStatus",
    shortname = "gwclient",
    category = "fabric",
    printcolumn = r#"{"name":"Peer","type":"string","jsonPath":".spec.clusterId"}"#,
    printcolumn = r#"{"name":"Server","type":"string","jsonPath":".spec.endpoint.addresses[0]"}"#,
    printcolumn = r#"{"name":"Port","type":"integer","jsonPath":".spec.endpoint.port"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GatewayClientSpec {
    #[x_kube(validation = Rule::new(DNS_LABEL).message("must be a DNS label"))]
    pub cluster_id: String,
    /// The peer's GatewayServer endpoint.
    pub endpoint: Endpoint,
    #[serde(default = "default_mtu")]
    #[schemars(range(min = 576, max = 9000))]
    pub mtu: i32,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GatewayClientStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

fn default_mtu() -> i32 {
    1420
}

/// A peer gateway's WireGuard public key.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "networking.fabric.io",
    version = "v1alpha1",
    kind = "PublicKey",
    doc = "A peer gateway's WireGuard public key.",
    namespaced,
    shortname = "fpubkey",
    category = "fabric",
    printcolumn = r#"{"name":"Peer","type":"string","jsonPath":".spec.clusterId"}"#,
    printcolumn = r#"{"name":"Key","type":"string","jsonPath":".spec.publicKey"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct PublicKeySpec {
    #[x_kube(validation = Rule::new(DNS_LABEL).message("must be a DNS label"))]
    pub cluster_id: String,
    #[x_kube(validation = Rule::new(WG_KEY).message("must be a base64-encoded 32-byte WireGuard key"))]
    pub public_key: String,
}

/// State of a tunnel, as the gateway sees it.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
pub enum ConnectionState {
    #[default]
    Connecting,
    Connected,
    Error,
}

/// The tunnel to one peer, reported by the gateway.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "networking.fabric.io",
    version = "v1alpha1",
    kind = "Connection",
    doc = "The tunnel to a peer, as the gateway sees it.",
    namespaced,
    status = "ConnectionStatus",
    shortname = "fconn",
    category = "fabric",
    printcolumn = r#"{"name":"Peer","type":"string","jsonPath":".spec.clusterId"}"#,
    printcolumn = r#"{"name":"Status","type":"string","jsonPath":".status.value"}"#,
    printcolumn = r#"{"name":"Latency","type":"string","jsonPath":".status.latency"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionSpec {
    #[x_kube(validation = Rule::new(DNS_LABEL).message("must be a DNS label"))]
    pub cluster_id: String,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionStatus {
    #[serde(default)]
    pub value: ConnectionState,
    /// Round-trip time of the in-tunnel probe, e.g. "1.2ms".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<String>,
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub rx_bytes: i64,
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub tx_bytes: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// Exposes a local IP that is not a pod address to peers, through the local external CIDR.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "networking.fabric.io",
    version = "v1alpha1",
    kind = "IP",
    doc = "A local non-pod IP exposed to peers through the local external CIDR.",
    plural = "ips",
    namespaced,
    status = "IPStatus",
    shortname = "fip",
    category = "fabric",
    printcolumn = r#"{"name":"IP","type":"string","jsonPath":".spec.ip"}"#,
    printcolumn = r#"{"name":"External","type":"string","jsonPath":".status.ip"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct IPSpec {
    #[x_kube(validation = Rule::new(IPV4_ADDR).message("must be an IPv4 address"))]
    pub ip: String,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IPStatus {
    /// The address in the local external CIDR that stands for `spec.ip`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// Keyed by type: IPAM sets `Ready`, the gateway operator `GatewayAccepted`, each under
    /// its own field manager without dropping the other's.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// An IPAM record: a CIDR asked for, and the one granted (the same when it is free).
/// Persisting grants in the API is what keeps a restarted IPAM from handing them out again.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "networking.fabric.io",
    version = "v1alpha1",
    kind = "Network",
    doc = "An IPAM record: a CIDR asked for and the one granted.",
    namespaced,
    status = "NetworkStatus",
    shortname = "fnet",
    category = "fabric",
    printcolumn = r#"{"name":"Wanted","type":"string","jsonPath":".spec.cidr"}"#,
    printcolumn = r#"{"name":"Granted","type":"string","jsonPath":".status.cidr"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NetworkSpec {
    #[x_kube(validation = Rule::new(IPV4_CIDR).message("must be an IPv4 CIDR"))]
    #[schemars(with = "String")]
    pub cidr: Ipv4Network,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub cidr: Option<Ipv4Network>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// One side of a peering's network, as the other side needs it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PeerNetworkParams {
    #[x_kube(validation = Rule::new(DNS_LABEL).message("must be a DNS label"))]
    #[schemars(length(max = 63))]
    pub cluster_id: String,
    /// Its real pod and external CIDRs.
    pub cidrs: ClusterCidrs,
    /// Its gateway's WireGuard public key.
    #[x_kube(validation = Rule::new(WG_KEY).message("must be a base64-encoded 32-byte WireGuard key"))]
    #[schemars(length(max = 44))]
    pub public_key: String,
    /// Where its gateway listens, when the other side is to dial it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<Endpoint>,
}

/// The network half of a peering, negotiated over the consumer's identity: the consumer
/// creates it in its tenant namespace on the provider with its own parameters; the provider
/// answers with its own in status. Each side then creates its local network resources.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "networking.fabric.io",
    version = "v1alpha1",
    kind = "PeeringNetwork",
    doc = "The network half of a peering: the consumer's parameters in spec, the provider's in status.",
    namespaced,
    status = "PeeringNetworkStatus",
    shortname = "fpeernet",
    category = "fabric",
    printcolumn = r#"{"name":"Consumer","type":"string","jsonPath":".spec.consumer.clusterId"}"#,
    printcolumn = r#"{"name":"Provider","type":"string","jsonPath":".status.provider.clusterId"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct PeeringNetworkSpec {
    pub consumer: PeerNetworkParams,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PeeringNetworkStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<PeerNetworkParams>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// Every CRD of this group version.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        Configuration::crd(),
        GatewayServer::crd(),
        GatewayClient::crd(),
        PublicKey::crd(),
        Connection::crd(),
        IP::crd(),
        Network::crd(),
        PeeringNetwork::crd(),
    ]
}
