//! Names the fabric's components agree on: labels, annotations, finalizers, the Secrets,
//! ConfigMaps and Leases one writes and another reads, and the field managers of server-side
//! apply. Defined here once so that a writer and its readers cannot drift apart.

/// Where the fabric runs unless told otherwise (`deploy/` installs it there).
pub const DEFAULT_NAMESPACE: &str = "fabric-system";

pub mod label {
    /// On every per-peer object: the id of the peer cluster it belongs to.
    pub const PEER: &str = "networking.fabric.io/peer";
    /// On IPAM's `Network` records: the name of the Configuration they were granted for.
    pub const CONFIGURATION: &str = "networking.fabric.io/configuration";
    /// On IPAM's `Network` records: which of the Configuration's CIDRs (`pod`, `external`).
    pub const ROLE: &str = "networking.fabric.io/role";
    /// On gateway pods: "true" on the replica holding the Lease (the Service selects it).
    pub const GATEWAY_ACTIVE: &str = "networking.fabric.io/gateway-active";
}

pub mod annotation {
    /// On the gateway Lease: the active replica's address, the nodes' next hop.
    pub const GATEWAY_IP: &str = "networking.fabric.io/gateway-ip";
}

pub mod finalizer {
    /// On Configurations: IPAM releases the peer's grants before they go.
    pub const IPAM: &str = "networking.fabric.io/ipam";
    /// On `IP`s: IPAM releases the external address before they go.
    pub const EXTERNAL_IP: &str = "networking.fabric.io/external-ip";
}

pub mod secret {
    /// The gateway's WireGuard private key, under [`GATEWAY_KEY_FIELD`] (base64, as `wg genkey`
    /// prints it). Shared by the gateway replicas, so a failover keeps the key peers know.
    pub const GATEWAY_KEY: &str = "fabric-gateway-key";
    pub const GATEWAY_KEY_FIELD: &str = "privateKey";
}

pub mod config_map {
    /// The cluster's identity (`deploy/fabric-cluster.env`), see
    /// [`ClusterIdentity`](crate::identity::ClusterIdentity).
    pub const CLUSTER: &str = "fabric-cluster";
    /// Published by the active gateway operator for peering, see
    /// [`GatewayIdentity`](crate::identity::GatewayIdentity).
    pub const GATEWAY_IDENTITY: &str = "fabric-gateway-identity";
}

pub mod lease {
    /// The gateway replicas compete for it; its holder runs the tunnels.
    pub const GATEWAY: &str = "fabric-gateway";
    /// The IPAM replicas compete for it; its holder allocates.
    pub const IPAM: &str = "fabric-ipam";
}

pub mod field_manager {
    /// `fabricctl` and the peering library: the per-peer objects on both sides.
    pub const PEERING: &str = "fabricctl";
    /// IPAM: Configuration status, `Network` records, `IP` status.
    pub const IPAM: &str = "fabric-controller";
    /// The gateway operator: Connections and the gateway identity.
    pub const GATEWAY_OPERATOR: &str = "fabric-gateway-operator";
}
