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
    /// On tenant namespaces (provider) and on every object of a peering of the sharing layer:
    /// the id of the consumer (on a provider) or provider (on a consumer) it belongs to.
    pub const REMOTE_CLUSTER: &str = "fabric.io/remote-cluster-id";
    /// On tenant namespaces: marks them as the fabric's (value "true").
    pub const TENANT_NAMESPACE: &str = "fabric.io/tenant-namespace";
    /// On virtual nodes: [`VIRTUAL_NODE_TYPE`].
    pub const NODE_TYPE: &str = "fabric.io/type";
    pub const VIRTUAL_NODE_TYPE: &str = "virtual-node";
    /// On the Secrets holding peering tokens (value "true").
    pub const PEERING_TOKEN: &str = "fabric.io/peering-token";
    /// On every object a reflector made in another cluster: the id of the cluster it was
    /// reflected from. With [`REFLECTED_TO`], the ownership mark: a reflector never
    /// overwrites or deletes a remote object without both, and never reflects a home object
    /// that carries them (a reflection itself: two clusters peered both ways do not loop).
    pub const REFLECTED_FROM: &str = "reflection.fabric.io/origin";
    /// On every object a reflector made in another cluster: the id of that cluster.
    pub const REFLECTED_TO: &str = "reflection.fabric.io/destination";
    /// On a consumer's namespaces offloaded with pod strategy `Remote` or `LocalAndRemote`
    /// (value "true"): the pod webhook acts on pods created there. `fabricctl offload` sets
    /// it before the NamespaceOffloading, so that no pod created meanwhile escapes the
    /// webhook; the webhook refuses pods of a labelled namespace without one.
    pub const SCHEDULING_ENABLED: &str = "offloading.fabric.io/scheduling-enabled";
    /// On a provider's twin namespaces (value "true"), beside [`REMOTE_CLUSTER`] naming
    /// their consumer: made by the provider for a NamespaceMap, removed with it.
    pub const TWIN_NAMESPACE: &str = "offloading.fabric.io/twin-namespace";
    /// On a provider's namespaces (value "true", set by its admin): pods created there are
    /// accepted while the cluster is tethered (docs/modes.md). The fabric's namespace and
    /// `kube-system` are exempt without it.
    pub const TETHERED_EXEMPT: &str = "fabric.io/tethered-exempt";
}

/// The taint every virtual node carries (effect NoExecute), so that only pods that tolerate
/// it are placed there.
pub mod taint {
    pub const VIRTUAL_NODE: &str = "fabric.io/virtual-node";
}

/// The Kubernetes identity of a consumer on its provider: the certificate's CommonName and
/// Organization.
pub mod user {
    /// Group every consumer certificate carries.
    pub const CONSUMERS_GROUP: &str = "fabric.io:consumers";

    /// The user name of consumer `cluster_id`.
    pub fn consumer(cluster_id: &str) -> String {
        format!("fabric.io:consumer:{cluster_id}")
    }

    /// The group of one peering of consumer `cluster_id` (`nonce` picked by the consumer
    /// when it peers, kept across renewals): the tenant's RoleBinding binds this group and
    /// nothing else, so a certificate of an earlier peering of the same id (revoked: nothing
    /// revokes a certificate itself) is bound to nothing after a re-peer.
    pub fn peering(cluster_id: &str, nonce: &str) -> String {
        format!("{PEERING_PREFIX}{cluster_id}:{nonce}")
    }

    /// What every [`peering`] group starts with.
    pub const PEERING_PREFIX: &str = "fabric.io:peering:";
}

/// Nodes the fabric registers.
pub mod node {
    /// The consumer's virtual node for provider `cluster_id`: `fabric-<id>` (shortened with
    /// a hash past 63 characters). Never the bare id: a provider picks its own id, and a
    /// Node named after it could be one of the consumer's real Nodes, whose pods unpeering
    /// would drain. A consumer keeps the `fabric-` prefix out of its own Nodes' names.
    pub fn virtual_node(provider_cluster_id: &str) -> String {
        super::namespace::bounded(&format!("fabric-{provider_cluster_id}"))
    }
}

/// Namespaces the sharing layer creates.
pub mod namespace {
    /// The tenant namespace of consumer `cluster_id` on a provider (cluster ids are DNS labels
    /// of at most 63 characters; the result may be longer and is then shortened with a hash
    /// by [`tenant`]).
    pub fn tenant(cluster_id: &str) -> String {
        bounded(&format!("fabric-tenant-{cluster_id}"))
    }

    /// On a provider: where the peering tokens live (Secrets labelled
    /// [`super::label::PEERING_TOKEN`]), and nothing else, so that the authentication service
    /// lists them without reading any other Secret.
    pub const PEERING_TOKENS: &str = "fabric-peering-tokens";

    /// On a consumer: where the identities providers issued it live (Secrets
    /// [`super::secret::identity`]), and nothing else. RBAC cannot grant a name prefix, so the
    /// sharing controllers are given the Secrets of this namespace rather than those of the
    /// fabric's own, where other components keep their keys (the authentication service's
    /// TLS key among them).
    pub const IDENTITIES: &str = "fabric-identities";
    /// On a consumer: the real claims the storage fabric makes for claims of the virtual
    /// class whose first consumer runs on a real node (nothing else: the provisioner may
    /// create and delete claims here only).
    pub const STORAGE: &str = "fabric-storage";

    /// A DNS label: `name` itself when it fits in 63 characters, otherwise a prefix and a hash
    /// of the whole name, so that distinct names stay distinct.
    pub fn bounded(name: &str) -> String {
        if name.len() <= 63 {
            return name.to_owned();
        }
        let prefix = name[..50].trim_end_matches('-');
        format!("{prefix}-{:012x}", super::fnv(name) & 0xffff_ffff_ffff)
    }
}

pub mod annotation {
    /// On the gateway Lease: the active replica's address, the nodes' next hop.
    pub const GATEWAY_IP: &str = "networking.fabric.io/gateway-ip";
    /// On peering token Secrets: when the token stops being accepted (RFC 3339); absent:
    /// until rotated.
    pub const TOKEN_EXPIRES_AT: &str = "fabric.io/expires-at";
    /// On a one-time peering token Secret: the one consumer cluster id it may be used for,
    /// named when it was minted or written at its first use.
    pub const TOKEN_CLUSTER_ID: &str = "fabric.io/token-cluster-id";
    /// On a one-time peering token Secret once used: the digest of the CSR it was used with
    /// (that same request, retried after a lost answer, is answered again; no other is).
    pub const TOKEN_USED_BY: &str = "fabric.io/token-used-by";
    /// On a Tenant: the digest of the CSR of the peering that created it, so that only that
    /// request, retried, is answered again while the Tenant exists.
    pub const PEERING_REQUEST: &str = "fabric.io/peering-request";
    /// On a consumer's `Identity`: the pin (`sha256:<hex>`) of the provider's authentication
    /// service, as the peer command gave it; renewals verify the service with it.
    pub const AUTH_PIN: &str = "fabric.io/auth-pin";
    /// On a ForeignCluster being unpeered (value "true", `fabricctl unpeer --force`): the
    /// controllers remove the local side at once, without waiting for the peer to answer.
    pub const FORCE_UNPEER: &str = "fabric.io/force-unpeer";
    /// On every object a mirroring reflector applied in another cluster: a hash of what it
    /// applied, so that a change at home that only removes something is seen there too.
    pub const REFLECTED_HASH: &str = "reflection.fabric.io/hash";
    /// On a provider's twin namespace: `<tenant namespace>/<NamespaceMap name>`, the map it
    /// was made for. A namespace without it (or naming another map) is never adopted nor
    /// deleted by the fabric.
    pub const TWIN_OF_MAP: &str = "offloading.fabric.io/namespace-map";
    /// On a provider's twin namespace: the consumer's namespace it is the twin of.
    pub const TWIN_HOME: &str = "offloading.fabric.io/home-namespace";
    /// On a provider's twin namespace: the `storageRetention` of its mapping when it was
    /// made (`Retain` or `Delete`; absent: `Retain`), which decides whether the claims the
    /// fabric made there outlive the twin's mapping.
    pub const STORAGE_RETENTION: &str = "offloading.fabric.io/storage-retention";
    /// On an offloaded pod (its ShadowPod's template, so the real pod) whose downward-API
    /// volumes read its namespace: the home namespace, which those items read instead of the
    /// provider's (the same key as [`TWIN_HOME`], on another kind).
    pub const POD_HOME_NAMESPACE: &str = TWIN_HOME;
    /// On a ShadowPod whose pod finished, written by the consumer's virtual kubelet once the
    /// home pod's status says how it ended (the phase recorded): the provider then collects
    /// it after the retention; one without it is kept longer, so that a consumer that was
    /// away when its pod finished still learns how it ended.
    pub const HOME_RECORDED: &str = "offloading.fabric.io/home-recorded";
    /// On a consumer's heartbeat Lease ([`super::lease::CONSUMER`]): whether its virtual
    /// kubelet reaches its home API server ([`HOME_API_REACHABLE`] or
    /// [`HOME_API_UNREACHABLE`]); while it does not, what the consumer reflected (its
    /// endpoints) is not vouched for and the provider takes it as not ready.
    pub const HOME_API: &str = "offloading.fabric.io/home-api";
    pub const HOME_API_REACHABLE: &str = "Reachable";
    pub const HOME_API_UNREACHABLE: &str = "Unreachable";
    /// Whether the unpeer of `meta` (being deleted) was forced ([`FORCE_UNPEER`]).
    pub fn unpeer_forced(meta: &kube::api::ObjectMeta) -> bool {
        meta.annotations
            .as_ref()
            .and_then(|a| a.get(FORCE_UNPEER))
            .is_some_and(|v| v == "true")
    }
}

pub mod finalizer {
    /// On Configurations: IPAM releases the peer's grants before they go.
    pub const IPAM: &str = "networking.fabric.io/ipam";
    /// On `IP`s: IPAM releases the external address before they go.
    pub const EXTERNAL_IP: &str = "networking.fabric.io/external-ip";
    /// On VirtualNodes: the controller cordons and removes the Node and the virtual kubelet
    /// before they go.
    pub const VIRTUAL_NODE: &str = "offloading.fabric.io/virtual-node";
    /// On ShadowPods (provider): the real pod is deleted, gracefully, before they go.
    pub const SHADOW_POD: &str = "offloading.fabric.io/shadowpod";
    /// On a ShadowPod's real pod (provider): the pod goes only once the ShadowPod's status
    /// has recorded how it ended, so that a pod that finished is never run again, even when
    /// it was removed while the controller was down.
    pub const REAL_POD: &str = "offloading.fabric.io/status-recorded";
    /// On a consumer's ForeignClusters of providers: unpeering removes the slices, the
    /// virtual node, the network (their own finalizers), then tells the provider (deletes
    /// its Tenant there) and drops the Identity before it goes.
    pub const PEERING: &str = "sharing.fabric.io/peering";
    /// On a provider's Tenants: the tenant area (RBAC, replicas, namespace, the consumer's
    /// ForeignCluster and CSRs) is removed before it goes.
    pub const TENANT: &str = "sharing.fabric.io/tenant";
    /// On a provider's ForeignClusters of consumers with a Tenant: deleting one removes the
    /// Tenant (and so the consumer's access and tenant area) before it goes.
    pub const CONSUMER: &str = "sharing.fabric.io/consumer";
    /// On a consumer's NamespaceOffloadings: the namespace's mappings are withdrawn from
    /// every provider, and their twins gone (or the provider out of reach too long), before
    /// it goes.
    pub const NAMESPACE_OFFLOADING: &str = "offloading.fabric.io/namespace-offloading";
    /// On a provider's NamespaceMaps: every twin namespace made for it is removed before it
    /// goes.
    pub const NAMESPACE_MAP: &str = "offloading.fabric.io/namespace-map";
    /// On a provider's ShadowEndpointSlices: the real EndpointSlice is deleted before they go.
    pub const SHADOW_ENDPOINT_SLICE: &str = "offloading.fabric.io/shadowendpointslice";
    /// On a provider's ShadowNetworkPolicies: the real NetworkPolicy is deleted before they go.
    pub const SHADOW_NETWORK_POLICY: &str = "offloading.fabric.io/shadownetworkpolicy";
}

pub mod secret {
    /// The gateway's WireGuard private key, under [`GATEWAY_KEY_FIELD`] (base64, as `wg genkey`
    /// prints it). Shared by the gateway replicas, so a failover keeps the key peers know.
    pub const GATEWAY_KEY: &str = "fabric-gateway-key";
    pub const GATEWAY_KEY_FIELD: &str = "privateKey";
    /// On a consumer: the kubeconfig a provider issued, under [`KUBECONFIG_FIELD`], in
    /// namespace [`super::namespace::IDENTITIES`] (not the fabric's).
    pub fn identity(provider_cluster_id: &str) -> String {
        super::namespace::bounded(&format!("fabric-identity-{provider_cluster_id}"))
    }
    pub const KUBECONFIG_FIELD: &str = "kubeconfig";
    /// On a provider: the standing peering token (`fabricctl generate peer-command`, replaced
    /// by `fabricctl token rotate`), under field `token`. Further tokens (with an expiry) are
    /// Secrets named with this prefix; all carry label [`super::label::PEERING_TOKEN`].
    pub const PEERING_TOKEN: &str = "fabric-peering-token";
    /// On a provider: the authentication service's serving certificate (type
    /// `kubernetes.io/tls`); created self-signed by the service when absent. Consumers pin
    /// its SHA-256.
    pub const AUTH_TLS: &str = "fabric-auth-tls";
    /// On a provider: the ShadowPod webhook's CA (`ca.crt`, `ca.key`) and its serving
    /// certificate signed by it (`tls.crt`, `tls.key`); created and renewed by the webhook,
    /// which copies the CA into its ValidatingWebhookConfiguration's `caBundle`.
    pub const SHADOWPOD_WEBHOOK_TLS: &str = "fabric-shadowpod-webhook-tls";
}

/// The provider's validating webhook on ShadowPods (`fabric-controller shadowpod-webhook`).
pub mod webhook {
    /// The ValidatingWebhookConfiguration (cluster-scoped).
    pub const SHADOWPODS_CONFIG: &str = "fabric-shadowpods";
    /// The Service in front of the webhook's replicas, in the fabric's namespace.
    pub const SHADOWPODS_SERVICE: &str = "fabric-shadowpod-webhook";
    /// The path the API server posts AdmissionReviews to.
    pub const SHADOWPODS_PATH: &str = "/validate/shadowpods";
    /// The path the API server posts creations of the other objects a consumer may make
    /// (ResourceSlices, PeeringNetworks) to, which are bounded in number per tenant.
    pub const TENANT_OBJECTS_PATH: &str = "/validate/tenant-objects";
    /// The path the API server posts a consumer's claims (PersistentVolumeClaims created or
    /// updated) to, charged against the storage it was granted.
    pub const CLAIMS_PATH: &str = "/validate/claims";
    /// The consumer's MutatingWebhookConfiguration on pods of offloaded namespaces
    /// (cluster-scoped), served by the same webhook.
    pub const PODS_CONFIG: &str = "fabric-pods";
    /// The path the API server posts pod creations in offloaded namespaces to.
    pub const PODS_PATH: &str = "/mutate/pods";
    /// The path the API server posts pod creations on a provider to, refused while it is
    /// tethered (docs/modes.md); in [`SHADOWPODS_CONFIG`].
    pub const TETHERED_PODS_PATH: &str = "/validate/tethered-pods";
}

/// The gateway Service has no selector: the replica holding the gateway Lease writes this
/// EndpointSlice (for Service [`GATEWAY_SERVICE`]) with its own address.
/// FNV-1a: stable across releases, unlike std's hasher (names derived with it must not
/// change when the fabric is upgraded).
/// FNV-1a of `s`: stable across releases (unlike std's hasher), for names derived from others.
pub fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

/// Service-account tokens of offloaded pods (issue 20): requested from the home API server,
/// bound to the home pod, delivered as a Secret in the twin.
pub mod service_account_token {
    /// On a home pod of an offloaded namespace: [`NEVER`] keeps it from the home API server
    /// where it runs on a provider: its token volumes are dropped from the ShadowPod (as for
    /// a pod offloaded pod by pod), and no address of the home API server goes into its
    /// environment or host aliases. Anything else, or none, gives it both.
    pub const OPT_OUT: &str = "reflection.fabric.io/service-account-token";
    /// The value of [`OPT_OUT`] that opts a pod out.
    pub const NEVER: &str = "never";

    /// Whether the pod of `meta` opted out ([`OPT_OUT`] is [`NEVER`]).
    pub fn opted_out(meta: &kube::api::ObjectMeta) -> bool {
        meta.annotations
            .as_ref()
            .and_then(|a| a.get(OPT_OUT))
            .is_some_and(|v| v == NEVER)
    }
    /// How a token Secret's name begins in a twin: reserved, a home Secret so named is not
    /// reflected (it would take a token Secret's place).
    pub const SECRET_PREFIX: &str = "fabric-token.";
    /// On a token Secret: when its token was issued (RFC 3339, the virtual kubelet's clock).
    pub const ISSUED: &str = "reflection.fabric.io/token-issued-at";
    /// On a token Secret: when its token expires (RFC 3339, the home API server's word).
    pub const EXPIRES: &str = "reflection.fabric.io/token-expires-at";
    /// On a token Secret: the UID of the home pod its token is bound to.
    pub const POD_UID: &str = "reflection.fabric.io/token-pod-uid";
}

pub mod network_policy {
    /// The label marking the NetworkPolicies a provider writes from a consumer's
    /// ShadowNetworkPolicies (value [`REFLECTED`]): the only NetworkPolicies its sharing
    /// controllers may write (policy `fabric-sharing-networkpolicies`), and never reflected
    /// back by a virtual kubelet (two clusters peered both ways do not loop).
    pub const MANAGED_BY: &str = "networking.fabric.io/managed-by";
    pub const REFLECTED: &str = "networkpolicy.reflection.fabric.io";
    /// The label every namespace carries with its own name (Kubernetes sets it): what a
    /// translated peer selects a twin by.
    pub const NAMESPACE_NAME: &str = "kubernetes.io/metadata.name";
}

pub mod endpoint_slice {
    pub const GATEWAY: &str = "fabric-gateway";
    pub const GATEWAY_SERVICE: &str = "fabric-gateway";
    /// The label naming who manages an EndpointSlice (Kubernetes' own).
    pub const MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
    /// [`MANAGED_BY`] of the EndpointSlices a provider writes from a consumer's
    /// ShadowEndpointSlices: an endpoint controller leaves them alone, and a virtual kubelet
    /// never reflects one back to its peer (two clusters peered both ways do not loop).
    pub const REFLECTED: &str = "endpointslice.reflection.fabric.io";
    /// [`MANAGED_BY`] of Kubernetes' own endpoint controller.
    pub const CONTROLLER: &str = "endpointslice-controller.k8s.io";
    /// The label naming an EndpointSlice's Service.
    pub const SERVICE_NAME: &str = "kubernetes.io/service-name";
    /// What a provider's EndpointSlices from ShadowEndpointSlices end in.
    pub const REFLECTED_SUFFIX: &str = "-fabric";

    /// The name of the EndpointSlice a provider writes for ShadowEndpointSlice `shadow`: never
    /// the name its own endpoint controller may give a slice of the same Service (the
    /// consumer's slice names are that controller's too: a Service `db` has `db-x7k2p` in both
    /// clusters, or the same name from a deterministic writer), so neither takes the other's
    /// place. An upstream name's random suffix is 5 characters; this one is 6. Within 253
    /// characters, distinct shadows keep distinct names (a hash past that length).
    pub fn reflected(shadow: &str) -> String {
        if shadow.len() + REFLECTED_SUFFIX.len() <= 253 {
            return format!("{shadow}{REFLECTED_SUFFIX}");
        }
        let prefix = shadow[..200].trim_end_matches(['-', '.']);
        format!("{prefix}-{:016x}{REFLECTED_SUFFIX}", super::fnv(shadow))
    }
}

/// How offloaded pods reach their home API server: in each twin namespace, a Service of
/// the consumer's (no selector) whose ShadowEndpointSlice holds the address under which the
/// home API server is exposed to peers (an `IP`, in the consumer's external CIDR).
pub mod home_api {
    /// The name of that Service and of its ShadowEndpointSlice in every twin namespace, and
    /// of the `IP` exposing the home API server (in the fabric's namespace at home). No
    /// home Service of this name is reflected.
    pub const SERVICE: &str = "fabric-home-apiserver";
    /// The port of that Service (an in-cluster client's `KUBERNETES_SERVICE_PORT`).
    pub const PORT: i32 = 443;
    /// The name offloaded pods reach it by (`KUBERNETES_SERVICE_HOST`): one every API
    /// server's serving certificate carries, so TLS is verified as at home.
    pub const HOST: &str = "kubernetes.default.svc";
    /// The names resolving to it in offloaded pods (their host aliases): those of the
    /// `kubernetes` Service that an API server's serving certificate carries.
    pub const NAMES: [&str; 4] = [
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ];
}

/// The storage fabric (issue 21): a virtual StorageClass whose claims are provisioned where
/// their first consumer lands; on a virtual node, in the provider's twin namespace.
pub mod storage {
    /// The provisioner of the virtual StorageClass, and the CSI driver named by the
    /// placeholder PersistentVolumes it makes (no node of this cluster runs one: nothing here
    /// can mount them).
    pub const PROVISIONER: &str = "fabric.io/storage";
    /// The virtual StorageClass's default name (`deploy/base/storage.yaml`).
    pub const CLASS: &str = "fabric";
    /// Annotation of a claim: the provider's StorageClass its remote claim is to have (over
    /// the class the provider lends by default).
    pub const REMOTE_CLASS: &str = "storage.fabric.io/remote-class";
    /// Annotation the scheduler puts on a `WaitForFirstConsumer` claim: its first consumer's
    /// node.
    pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
    /// Annotation of a PersistentVolume: its provisioner.
    pub const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
    /// The finalizer a virtual kubelet puts on a claim it provisioned: the remote claim and
    /// the placeholder volume go before it.
    pub const FINALIZER: &str = "storage.fabric.io/remote-claim";
    /// The Event reason of a claim sent back to the scheduler (its node's provider lends no
    /// storage), as Liqo's.
    pub const RESCHEDULING_REQUIRED: &str = "ReschedulingRequired";
    /// Annotation of a remote claim: the UID of the home claim it was made for (a home claim
    /// of the same name made again later is another claim, and does not get its data unless
    /// this names it: `fabricctl move volume` hands a filled claim over that way).
    pub const HOME_UID: &str = "storage.fabric.io/home-uid";
    /// Labels of a real claim the real-node provisioner makes (in [`super::namespace::STORAGE`]):
    /// the home claim it stands for, with [`HOME_UID`] as a label too. An empty [`HOME_UID`]:
    /// handed over by `fabricctl move volume --to local` to the next claim of that namespace
    /// and name, which adopts it.
    pub const HOME_NAMESPACE: &str = "storage.fabric.io/home-namespace";
    pub const HOME_NAME: &str = "storage.fabric.io/home-name";
    /// Label of `fabricctl move volume`'s transfer pods: the claim they move (one they mount).
    /// The offloaded namespaces' pod webhook leaves such a pod where fabricctl placed it, so
    /// that a move works whatever the namespace's `podOffloadingStrategy`.
    pub const TRANSFER: &str = "storage.fabric.io/move";

    /// The claim a move of claim `claim` home fills beside it (`fabricctl move volume --to
    /// local`): its receiver mounts that one.
    pub fn landing(claim: &str) -> String {
        super::namespace::bounded(&format!("{claim}-landing"))
    }

    /// The placeholder PersistentVolume of claim `uid`, as every external provisioner names
    /// its volumes.
    pub fn volume_name(uid: &str) -> String {
        format!("pvc-{uid}")
    }
}

pub mod config_map {
    /// The cluster's identity (`deploy/fabric-cluster.env`), see
    /// [`ClusterIdentity`](crate::identity::ClusterIdentity).
    pub const CLUSTER: &str = "fabric-cluster";
    /// Published by the active gateway operator for peering, see
    /// [`GatewayIdentity`](crate::identity::GatewayIdentity).
    pub const GATEWAY_IDENTITY: &str = "fabric-gateway-identity";
    /// IPAM's ledger: every CIDR and peer id it has granted. Every allocation is written
    /// there conditionally on its resourceVersion, so two IPAM leaders (one stale) can never
    /// grant the same range.
    pub const IPAM_LEDGER: &str = "fabric-ipam-ledger";
}

pub mod lease {
    /// The gateway replicas compete for it; its holder runs the tunnels.
    pub const GATEWAY: &str = "fabric-gateway";
    /// The IPAM replicas compete for it; its holder allocates.
    pub const IPAM: &str = "fabric-ipam";
    /// The sharing controllers' replicas compete for it; its holder negotiates.
    pub const SHARING: &str = "fabric-sharing";
    /// The VirtualNode controller's replicas compete for it; its holder runs virtual kubelets.
    pub const VIRTUAL_NODES: &str = "fabric-virtual-nodes";
    /// The storage provisioner's replicas compete for it; its holder provisions.
    pub const STORAGE: &str = "fabric-storage";
    /// A consumer's heartbeat, in its tenant namespace on the provider: renewed by its virtual
    /// kubelet, watched by the provider: under at-most-once semantics (see
    /// [`crate::offloading::v1alpha1::AtMostOnce`]) its silence stops the consumer's pods; in
    /// any case its silence, or its [`super::annotation::HOME_API`] saying the consumer's API
    /// server is out of reach, makes the consumer's endpoints not ready on the provider.
    pub const CONSUMER: &str = "fabric-consumer";
}

pub mod field_manager {
    /// `fabricctl` and the peering library: the per-peer objects on both sides.
    pub const PEERING: &str = "fabricctl";
    /// IPAM: Configuration status, `Network` records, `IP` status.
    pub const IPAM: &str = "fabric-controller";
    /// The gateway operator: Connections and the gateway identity.
    pub const GATEWAY_OPERATOR: &str = "fabric-gateway-operator";
    /// The provider's authentication service: tenants, tenant namespaces, their RBAC.
    pub const AUTH: &str = "fabric-auth";
    /// The peering controllers of the sharing layer (ForeignClusters, network negotiation,
    /// slices, virtual nodes).
    pub const SHARING: &str = "fabric-sharing";
    /// The VirtualNode controller: the virtual kubelets' Deployments and RBAC, VirtualNode
    /// status, the cordon of a Node being removed, and the ForeignCluster's VirtualNodeReady
    /// condition (its own manager, so that it applies that condition without dropping the
    /// other modules').
    pub const VIRTUAL_NODES: &str = "fabric-virtual-nodes";
    /// The virtual kubelet: its Node, Lease and pods' status.
    pub const VIRTUAL_KUBELET: &str = "fabric-virtual-kubelet";
    /// Discovery: the ForeignClusters of clusters found on the LAN or through DNS, while they
    /// are not peered.
    pub const DISCOVERY: &str = "fabric-discovery";
    /// The provider's ShadowPod controller: ShadowPod status (the real pod's, copied).
    pub const SHADOW_POD: &str = "fabric-shadowpod";
    /// The provider's drain of tenants: the Tenant's Drained condition, and the deletion of
    /// a drained tenant's ShadowPods.
    pub const TENANT_DRAIN: &str = "fabric-tenant-drain";
    /// The reflectors: the objects they keep in the remote cluster (server-side applied).
    pub const REFLECTION: &str = "fabric-reflection";
    /// The consumer's namespace offloading: NamespaceOffloading status, the namespaces'
    /// scheduling label, the NamespaceMaps it writes on its providers.
    pub const NAMESPACE_OFFLOADING: &str = "fabric-namespace-offloading";
    /// The provider's NamespaceMap controller: twin namespaces, their RBAC, map status.
    pub const NAMESPACE_MAP: &str = "fabric-namespace-map";
    /// The provider's ShadowEndpointSlice controller: the real EndpointSlices.
    pub const SHADOW_ENDPOINT_SLICE: &str = "fabric-shadowendpointslice";
    /// The provider's ShadowNetworkPolicy controller: the real NetworkPolicies.
    pub const SHADOW_NETWORK_POLICY: &str = "fabric-shadownetworkpolicy";
}

#[cfg(test)]
mod tests {
    use super::namespace::{bounded, tenant};

    #[test]
    fn names_stay_dns_labels_and_distinct() {
        assert_eq!(tenant("b"), "fabric-tenant-b");
        let long_a = tenant(&"a".repeat(63));
        let long_b = tenant(&format!("{}b", "a".repeat(62)));
        assert!(long_a.len() <= 63 && long_b.len() <= 63);
        assert_ne!(long_a, long_b);
        assert!(fabric_dns(&long_a), "{long_a}");
        assert_eq!(bounded("x"), "x");
    }

    fn fabric_dns(s: &str) -> bool {
        crate::identity::is_dns_label(s)
    }
}
