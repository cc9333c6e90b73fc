//! The command line: every subcommand and its flags, and the parsers of their values.
use std::{
    net::{Ipv4Addr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

use anyhow::Result;
use clap::{Parser, Subcommand};
use fabric_api::names;
use fabric_controller::discovery;
use fabric_offloading::{shadowpod, virtual_node};
use ipnetwork::Ipv4Network;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

#[derive(Parser)]
#[command(
    name = "fabric-controller",
    version,
    about = "fabric cluster controllers"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

// Parsed once at start-up; boxing the larger variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub(crate) enum Cmd {
    /// Grant peers' remapped CIDRs and data-plane ids, and external-CIDR addresses for `IP`s.
    Ipam {
        /// This cluster's pod CIDR (never granted to a peer).
        #[arg(long, env = "FABRIC_POD_CIDR")]
        pod_cidr: Ipv4Network,
        /// This cluster's service CIDR.
        #[arg(long, env = "FABRIC_SERVICE_CIDR")]
        service_cidr: Ipv4Network,
        /// This cluster's external CIDR.
        #[arg(long, env = "FABRIC_EXTERNAL_CIDR")]
        external_cidr: Ipv4Network,
        /// Further ranges in use here (node subnets, ...), comma separated.
        #[arg(long, env = "FABRIC_RESERVED", value_delimiter = ',', value_parser = cidr_or_empty)]
        reserved: Vec<Option<Ipv4Network>>,
        /// The largest peer CIDR granted, as a prefix length: a peer claiming a shorter
        /// prefix (a /8 with the default) is refused instead of routed to it from every node.
        #[arg(long, env = "FABRIC_LARGEST_CLAIM", default_value_t = 12, value_parser = clap::value_parser!(u8).range(8..=32))]
        largest_claim: u8,
        /// This replica's identity when several run (default: $POD_NAME, else the host name):
        /// only the holder of the Lease allocates.
        #[arg(long, env = "POD_NAME")]
        identity: Option<String>,
        /// The fabric's namespace: the only one whose Configurations and IPs are served, and
        /// where the Networks and the Lease live.
        #[arg(long, env = "FABRIC_NAMESPACE", default_value = names::DEFAULT_NAMESPACE)]
        namespace: String,
        /// The Lease the IPAM replicas compete for (in --namespace).
        #[arg(long, default_value = names::lease::IPAM)]
        lease: String,
        /// Where remapped CIDRs are carved from, comma separated.
        #[arg(
            long,
            env = "FABRIC_POOLS",
            value_delimiter = ',',
            default_value = "10.64.0.0/10"
        )]
        pools: Vec<Ipv4Network>,
        /// This cluster's id (for discovery: announced, and never a peer of its own).
        #[arg(long, env = "FABRIC_CLUSTER_ID")]
        // Checked only when discovery needs it: IPAM alone never reads it.
        cluster_id: Option<String>,
        #[command(flatten)]
        discovery: discovery::Args,
    },
    /// Run the gateway operator beside a fabric-gateway.
    Gateway {
        #[arg(long, env = "FABRIC_NAMESPACE", default_value = names::DEFAULT_NAMESPACE)]
        namespace: String,
        /// The gateway's interface name (its control socket).
        #[arg(long, default_value = "fabric")]
        name: String,
        #[arg(long, default_value = "/etc/fabric/gateway.toml")]
        config: PathBuf,
        #[arg(long, default_value = "/etc/fabric/private.key")]
        key_file: PathBuf,
        #[arg(long, default_value = "/var/run/fabric-gateway")]
        control_dir: PathBuf,
        #[arg(long, default_value_t = 51820)]
        listen_port: u16,
        #[arg(long, default_value_t = 1420)]
        mtu: u16,
        /// Where peers reach this gateway, e.g. the node address and NodePort.
        #[arg(long, env = "FABRIC_GATEWAY_ENDPOINT")]
        advertise: SocketAddr,
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        interval: Duration,
        /// Where the gateway pins its data-plane maps (default: a directory of this
        /// replica's own under --pin-root, named after --name and the replica's identity).
        #[arg(long)]
        pin_dir: Option<PathBuf>,
        /// With --overlay: pin the overlay guard here (a directory on a BPF filesystem, one
        /// per replica) so that it keeps guarding the overlay port while the operator
        /// restarts; without it the guard lives as long as the operator.
        #[arg(long, env = "FABRIC_GUARD_PIN_DIR")]
        guard_pin_dir: Option<PathBuf>,
        /// The BPF filesystem the replicas of a node share (see --pin-dir).
        #[arg(long, default_value = "/sys/fs/bpf")]
        pin_root: PathBuf,
        /// Microseconds the gateway keeps polling after traffic instead of sleeping: lower
        /// tunnel latency for CPU (one core per gateway while traffic flows). 0: off.
        #[arg(long, env = "FABRIC_GATEWAY_BUSY_POLL_US", default_value_t = 0)]
        busy_poll_us: u64,
        /// Reach the nodes through the VXLAN overlay (device fabric.vx, an endpoint per Node,
        /// each node's pod CIDRs through it); the agents run with --overlay too. Needs
        /// --gateway-ip.
        #[arg(long, env = "FABRIC_OVERLAY", requires = "gateway_ip")]
        overlay: bool,
        #[command(flatten)]
        overlay_args: fabric_routing::overlay::OverlayArgs,
        /// This replica's identity in the active/passive election (default: $POD_NAME, else
        /// the host name).
        #[arg(long, env = "POD_NAME")]
        identity: Option<String>,
        /// This replica's gateway address on the cluster network: published on the Lease while
        /// it is active, so node agents route to it.
        #[arg(long, env = "FABRIC_GATEWAY_POD_IP")]
        gateway_ip: Option<Ipv4Addr>,
        /// The Lease the replicas compete for (in --namespace).
        #[arg(long, default_value = names::lease::GATEWAY)]
        lease: String,
        /// How long a holder that stops renewing keeps the Lease.
        #[arg(long, default_value = "4s", value_parser = humantime::parse_duration)]
        lease_duration: Duration,
        /// How often the holder renews and a standby replica checks the Lease. A holder that
        /// gets no renewal accepted for --lease-duration minus this stops leading.
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        lease_retry: Duration,
        /// How long the gateway may go without answering, over its control socket, that it
        /// serves before this replica gives the Lease up (and takes it only once it does).
        #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
        gateway_grace: Duration,
        /// Hold the Lease whatever the gateway answers (an operator run without a gateway).
        #[arg(long)]
        ignore_gateway_health: bool,
    },
    /// Renew the identities this (consumer) cluster holds on its providers before their
    /// certificates expire, and nothing else (`sharing` does it too, elected: deploy/ runs
    /// that).
    Identities {
        #[arg(long, env = "FABRIC_NAMESPACE", default_value = names::DEFAULT_NAMESPACE)]
        namespace: String,
        #[command(flatten)]
        renewal: RenewalArgs,
    },
    /// Approve the certificate requests the authentication service makes for consumers (a
    /// tenant's own subject only; deny any other it makes), and nothing else (`sharing` does it
    /// too, elected: deploy/ runs that).
    CsrApprover {
        #[arg(long, env = "FABRIC_NAMESPACE", default_value = names::DEFAULT_NAMESPACE)]
        namespace: String,
        #[command(flatten)]
        approver: ApproverArgs,
    },
    /// Serve the authentication service: consumers with a peering token get a tenant here and
    /// a client certificate for this cluster's API server.
    Auth {
        #[arg(long, env = "FABRIC_NAMESPACE", default_value = names::DEFAULT_NAMESPACE)]
        namespace: String,
        /// This cluster's id.
        #[arg(long, env = "FABRIC_CLUSTER_ID")]
        cluster_id: String,
        #[arg(long, env = "FABRIC_AUTH_LISTEN", default_value = "0.0.0.0:8443")]
        listen: SocketAddr,
        /// The API server URL handed to consumers: the address they reach, not the in-cluster
        /// one.
        #[arg(long, env = "FABRIC_API_SERVER_URL")]
        api_server_url: String,
        /// The CA (PEM file) of the API server's serving certificate, handed to consumers
        /// (in a pod: the service account's ca.crt).
        #[arg(
            long,
            env = "FABRIC_API_SERVER_CA",
            default_value = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
        )]
        api_server_ca: PathBuf,
        /// Validity of the certificates issued to consumers: short, since nothing revokes a
        /// certificate (consumers renew them well before, `--renew-before`).
        #[arg(long, env = "FABRIC_AUTH_CERTIFICATE_TTL", default_value = "24h", value_parser = humantime::parse_duration)]
        certificate_ttl: Duration,
        /// How long to wait for the cluster's CSR signer.
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        sign_timeout: Duration,
        /// Secret (kubernetes.io/tls) with the serving certificate; created self-signed for
        /// --tls-hosts when absent. Consumers pin it (`fabricctl generate peer-command`).
        #[arg(long, default_value = names::secret::AUTH_TLS)]
        tls_secret: String,
        /// The CA (PEM file) consumers' client certificates chain to: consumers renew their
        /// certificates with them. Default: the cluster's client CA, `client-ca-file` of
        /// ConfigMap kube-system/extension-apiserver-authentication (as the API server
        /// publishes it), read at start.
        #[arg(long, env = "FABRIC_CLIENT_CA")]
        client_ca: Option<PathBuf>,
        /// Names and addresses of the self-signed serving certificate, comma separated.
        #[arg(
            long,
            env = "FABRIC_AUTH_TLS_HOSTS",
            value_delimiter = ',',
            default_value = "fabric-auth"
        )]
        tls_hosts: Vec<String>,
    },
    /// Negotiate networks and resources with peers over consumers' identities (consumer and
    /// provider side).
    Sharing {
        #[arg(long, env = "FABRIC_NAMESPACE", default_value = names::DEFAULT_NAMESPACE)]
        namespace: String,
        /// This replica's identity when several run (default: $POD_NAME, else the host name):
        /// only the holder of the Lease negotiates.
        #[arg(long, env = "POD_NAME")]
        identity: Option<String>,
        #[arg(long, default_value = names::lease::SHARING)]
        lease: String,
        /// Share of free capacity offered to consumers, in percent.
        #[arg(long, default_value_t = 90, value_parser = clap::value_parser!(u8).range(0..=100))]
        offer_percent: u8,
        /// A label every offer advertises (KEY=VALUE; repeatable); `node-type=gpu` is added by
        /// itself when an offer includes a GPU.
        #[arg(long = "advertise-label", value_parser = key_value)]
        advertise_labels: Vec<(String, String)>,
        /// How often a consumer looks at its providers' answers.
        #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
        remote_poll: Duration,
        /// As a provider, the shortest at-most-once partition time agreed to: a consumer asking
        /// for less gets this (its heartbeat needs a few renewals' room, or a slow API server
        /// would stop healthy pods). Whole seconds, 1 s to 1 day.
        #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
        at_most_once_min_partition: Duration,
        /// As a provider, the longest grace period agreed to for pods stopped by at-most-once:
        /// a consumer asking for more gets this. Whole seconds, at most 1 hour.
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        at_most_once_max_grace: Duration,
        /// As a provider, what tenants' pods may do and where they run: a ShadowPod whose pod
        /// breaks it gets no pod. The same as the ShadowPod webhook's.
        #[command(flatten)]
        tenant_pods: TenantPodArgs,
        /// As a provider, how long after a tenant is drained (its Tenant's `spec.state`) its
        /// ShadowPods are deleted by the provider, whatever its consumer does; set back to
        /// Active or Cordoned within it, it loses nothing.
        #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
        drain_grace: Duration,
        /// As a provider, how long a ShadowPod whose pod finished (Succeeded or Failed) stays
        /// before the provider deletes it (and its share of the tenant's ShadowPod count).
        #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
        finished_retention: Duration,
        /// As a provider, how long such a ShadowPod stays while its consumer has not recorded
        /// how the pod ended (its virtual kubelet was away): it learns it when it comes back
        /// within this. Never shorter than `--finished-retention`.
        #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
        unrecorded_retention: Duration,
        /// As a provider, namespaces no consumer may have as a twin, beyond `default`,
        /// `kube-*`, the fabric's own and the tenant namespaces (comma-separated or repeated).
        #[arg(long, value_delimiter = ',')]
        reserved_namespaces: Vec<String>,
        /// As a provider, how many twin namespaces one consumer may have (mappings past it are
        /// refused with TooManyNamespaces; existing twins keep their place).
        #[arg(long, default_value_t = fabric_negotiation::namespaces::twins::DEFAULT_MAX_PER_TENANT)]
        max_namespaces_per_tenant: u32,
        /// As a provider, where this cluster's DNS pods are (NAMESPACE/KEY=VALUE[,...]): a
        /// consumer's NetworkPolicy that lets its pods reach DNS lets them reach these too in
        /// its twins, since offloaded pods resolve names here.
        #[arg(long, default_value = "kube-system/k8s-app=kube-dns")]
        cluster_dns: fabric_offloading::networkpolicies::translate::ClusterDns,
        #[command(flatten)]
        renewal: RenewalArgs,
        #[command(flatten)]
        approver: ApproverArgs,
    },
    /// Serve the validating webhook on ShadowPods: a consumer creates them only for itself, in
    /// its own namespaces, with pods the provider's policy allows, within what it was granted (charged on its Tenant's status, which
    /// every replica also recounts from the ShadowPods). On a consumer, also places the pods
    /// created in offloaded namespaces as their NamespaceOffloading says (toleration, node
    /// affinity). Keeps its CA and serving certificate in a Secret and the CA in the webhook
    /// configurations' caBundle.
    ShadowpodWebhook {
        #[arg(long, env = "FABRIC_NAMESPACE", default_value = names::DEFAULT_NAMESPACE)]
        namespace: String,
        #[arg(long, env = "FABRIC_WEBHOOK_LISTEN", default_value = "0.0.0.0:9443")]
        listen: SocketAddr,
        /// The Service the API server calls the webhook through (its `NAME.NAMESPACE.svc` is
        /// the serving certificate's name).
        #[arg(long, default_value = names::webhook::SHADOWPODS_SERVICE)]
        service: String,
        /// The Secret with the webhook's CA and serving certificate (created when absent).
        #[arg(long, default_value = names::secret::SHADOWPOD_WEBHOOK_TLS)]
        tls_secret: String,
        /// The ValidatingWebhookConfiguration whose caBundle the webhook keeps.
        #[arg(long, default_value = names::webhook::SHADOWPODS_CONFIG)]
        config: String,
        /// The MutatingWebhookConfiguration of pods in offloaded namespaces (a consumer's)
        /// whose caBundle the webhook keeps too, when it is installed.
        #[arg(long, default_value = names::webhook::PODS_CONFIG)]
        pods_config: String,
        /// How often the certificates and caBundle are looked at again.
        #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
        refresh: Duration,
        /// How long a consumer's admitted charge counts on its Tenant before the ShadowPod is
        /// seen (a creation refused after admission releases its share then).
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        pending_ttl: Duration,
        /// What tenants' pods may do and where they run: a ShadowPod whose pod breaks it is
        /// refused, on creation and on every change of its pod. The same as the sharing
        /// controller's.
        #[command(flatten)]
        tenant_pods: TenantPodArgs,
        /// The CA (PEM file) of the client certificate the API server presents to webhooks
        /// (its AdmissionConfiguration's kubeconfig): only callers with a certificate from it
        /// are served.
        #[arg(long)]
        client_ca: PathBuf,
        /// The CommonName of that certificate (repeat for several): another certificate from
        /// the same CA (a consumer's, when it is the cluster's CA) is refused.
        #[arg(long = "client-name", default_value = "kube-apiserver")]
        client_names: Vec<String>,
        /// How many ShadowPods, running or finished, a tenant may have: a creation past it is
        /// refused (finished ones go with their pods at home, when the consumer deletes them,
        /// or `sharing --finished-retention` after they finished).
        #[arg(long, default_value_t = shadowpod::webhook::DEFAULT_MAX_SHADOW_PODS)]
        max_shadowpods_per_tenant: u32,
        /// How many ResourceSlices, and how many PeeringNetworks, a consumer may have in a
        /// namespace: a creation past it is refused (the webhook configuration sends it those
        /// creations).
        #[arg(long, default_value_t = shadowpod::webhook::DEFAULT_MAX_OBJECTS)]
        max_objects_per_tenant: u32,
        /// How large one of a tenant's ShadowPods may be (bytes as JSON, its status aside;
        /// a quantity such as 512Ki): a creation or update past it is refused.
        #[arg(long, default_value = "512Ki", value_parser = bytes)]
        max_shadowpod_bytes: u64,
        /// How large a tenant's ShadowPods may be together (a quantity such as 64Mi): a
        /// creation or growth past it is refused.
        #[arg(long, default_value = "64Mi", value_parser = bytes)]
        max_shadowpod_bytes_per_tenant: u64,
    },
    /// Run a virtual kubelet (Deployment, ServiceAccount, RBAC) per VirtualNode, report its
    /// Node in the VirtualNode's and ForeignCluster's conditions, and remove it all with the
    /// VirtualNode.
    VirtualNodes {
        /// Where the gateway operator reports Connections (the virtual kubelets read them),
        /// and where the Lease is.
        #[arg(long, env = "FABRIC_NAMESPACE", default_value = names::DEFAULT_NAMESPACE)]
        namespace: String,
        /// This replica's identity when several run (default: $POD_NAME, else the host name):
        /// only the holder of the Lease reconciles.
        #[arg(long, env = "POD_NAME")]
        identity: Option<String>,
        #[arg(long, default_value = names::lease::VIRTUAL_NODES)]
        lease: String,
        /// The virtual kubelet's image.
        #[arg(long, env = "FABRIC_VIRTUAL_KUBELET_IMAGE")]
        virtual_kubelet_image: String,
        /// The port of the virtual kubelets' API (published in their Nodes). 0: each takes a
        /// free one, for virtual kubelets sharing a host network.
        #[arg(long, env = "FABRIC_VIRTUAL_KUBELET_PORT", default_value_t = virtual_node::objects::KUBELET_PORT)]
        virtual_kubelet_port: u16,
        /// Where this cluster's API server listens on the cluster network (IP:PORT, reachable
        /// from the gateway), given to every virtual kubelet: offloaded pods reach it there.
        /// Without it they are given nothing of it.
        #[arg(long, env = "FABRIC_HOME_API_ADDRESS")]
        home_api_address: Option<std::net::SocketAddrV4>,
        /// A custom kind every virtual kubelet reflects into its twins, spec out and status
        /// back, as RESOURCE.GROUP/VERSION (`widgets.example.com/v1`; repeatable). The
        /// virtual kubelets' rights on it are ClusterRole fabric-virtual-kubelet-reflection's
        /// (the admin's to fill); each provider's admin decides whether it accepts it.
        #[arg(
            long = "reflect-custom-resource",
            value_name = "RESOURCE.GROUP/VERSION"
        )]
        reflect_custom_resource: Vec<fabric_api::reflection::CustomResource>,
        /// How often each virtual kubelet asks its provider's API whether it answers
        /// (default: the virtual kubelet's, 5s).
        #[arg(long, value_parser = humantime::parse_duration)]
        virtual_kubelet_probe_interval: Option<Duration>,
        /// How long each of those probes may take (default: the virtual kubelet's, 5s):
        /// longer over a slow link.
        #[arg(long, value_parser = humantime::parse_duration)]
        virtual_kubelet_probe_timeout: Option<Duration>,
        /// How long a virtual node stays Ready through failed probes after its provider last
        /// answered (default: the virtual kubelet's, 10s): shorter notices a lost provider
        /// sooner, longer rides out a flaky link.
        #[arg(long, value_parser = humantime::parse_duration)]
        virtual_kubelet_grace: Option<Duration>,
        /// How long a removed VirtualNode's pods may take to be deleted through the provider
        /// before they are failed (`VirtualNodeRemoved`) and deleted at home. A forced unpeer
        /// does not wait.
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        drain_grace: Duration,
    },
    /// Provision claims of the virtual StorageClass whose first consumer runs on a real node:
    /// a real claim in the storage namespace, and a volume over its volume bound to the claim
    /// (those landing on a virtual node are its virtual kubelet's).
    Storage {
        /// Where the Lease is.
        #[arg(long, env = "FABRIC_NAMESPACE", default_value = names::DEFAULT_NAMESPACE)]
        namespace: String,
        /// This replica's identity when several run (default: $POD_NAME, else the host name):
        /// only the holder of the Lease provisions.
        #[arg(long, env = "POD_NAME")]
        identity: Option<String>,
        #[arg(long, default_value = names::lease::STORAGE)]
        lease: String,
        /// The virtual StorageClass (deploy/base/storage.yaml).
        #[arg(long, default_value = names::storage::CLASS)]
        storage_class: String,
        /// The StorageClass of the real claims. Without it: the cluster's default class.
        #[arg(long, env = "FABRIC_REAL_STORAGE_CLASS")]
        real_storage_class: Option<String>,
        /// Where the real claims are made.
        #[arg(long, default_value = names::namespace::STORAGE)]
        storage_namespace: String,
    },
}

/// When the identities this cluster holds on providers are renewed.
#[derive(clap::Args)]
pub(crate) struct RenewalArgs {
    /// Renew once less than this is left of a certificate's validity (providers issue
    /// 24-hour certificates by default: renewed after 16 hours, with 8 to retry).
    #[arg(long, default_value = "8h", value_parser = humantime::parse_duration)]
    pub(crate) renew_before: Duration,
    /// Never renew one identity more often than this.
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    pub(crate) min_interval: Duration,
}

impl RenewalArgs {
    pub(crate) fn policy(&self) -> fabric_auth::renewal::Policy {
        fabric_auth::renewal::Policy {
            renew_before: self.renew_before,
            min_interval: self.min_interval,
        }
    }
}

/// Which consumers' certificate requests the approver approves.
#[derive(clap::Args)]
pub(crate) struct ApproverArgs {
    /// The longest validity approved for a consumer's certificate: the authentication
    /// service's --certificate-ttl must not exceed it.
    #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
    pub(crate) consumer_certificate_max_ttl: Duration,
}

impl ApproverArgs {
    pub(crate) fn settings(&self, namespace: &str) -> fabric_auth::approver::Settings {
        fabric_auth::approver::Settings::new(namespace, self.consumer_certificate_max_ttl)
    }
}

/// What the provider lets tenants' pods do and where they run (the README's "What a
/// provider admin controls"); the sharing controller and the ShadowPod webhook take the same.
#[derive(clap::Args)]
pub(crate) struct TenantPodArgs {
    /// Pod Security Standards level of tenants' pods, with the provider's volume and
    /// scheduling rules: `baseline` or `restricted`.
    #[arg(long, default_value = "baseline")]
    pub(crate) pod_security: shadowpod::policy::Level,
    /// A node selector entry every tenant's pod gets (`KEY=VALUE`, repeatable): the nodes
    /// lent to tenants. A tenant's pod may select nothing else.
    #[arg(long = "tenant-node-selector", value_name = "KEY=VALUE", value_parser = key_value)]
    pub(crate) node_selector: Vec<(String, String)>,
    /// A taint every tenant's pod tolerates (`KEY=VALUE:EFFECT` or `KEY:EFFECT`, repeatable):
    /// the taints of the lent nodes. A tenant's pod may tolerate nothing else (but the API
    /// server's not-ready/unreachable defaults).
    #[arg(long = "tenant-toleration", value_name = "KEY[=VALUE]:EFFECT", value_parser = shadowpod::policy::parse_toleration)]
    pub(crate) tolerations: Vec<k8s_openapi::api::core::v1::Toleration>,
    /// The PriorityClass of every tenant's pod (none by default; a tenant's pod may name no
    /// other).
    #[arg(long = "tenant-priority-class", value_name = "NAME")]
    pub(crate) priority_class: Option<String>,
    /// A RuntimeClass tenants' pods may name (repeatable; none by default).
    #[arg(long = "tenant-runtime-class", value_name = "NAME")]
    pub(crate) runtime_classes: Vec<String>,
    /// The request a tenant's container gets for a resource it neither requests nor limits
    /// (`RESOURCE=QUANTITY`, repeatable; any given replaces the defaults), as a LimitRange's
    /// `defaultRequest`: its real pod carries it and its tenant is charged it, so no pod runs
    /// for free. `RESOURCE=0` gives none.
    #[arg(
        long = "tenant-default-request",
        value_name = "RESOURCE=QUANTITY",
        value_parser = default_request,
        default_values = ["cpu=100m", "memory=128Mi"]
    )]
    pub(crate) default_requests: Vec<(String, Quantity)>,
}

/// `RESOURCE=QUANTITY`, the quantity one the API server takes and not negative; `pods` is
/// not a container's.
pub(crate) fn default_request(s: &str) -> Result<(String, Quantity), String> {
    let (k, v) = key_value(s)?;
    match fabric_api::quantity::milli(&v) {
        _ if k == "pods" => Err("pods is not a container's resource".to_owned()),
        Ok(m) if m >= 0 => Ok((k, Quantity(v))),
        Ok(_) => Err(format!("{v:?} is negative")),
        Err(e) => Err(e.to_string()),
    }
}

impl TenantPodArgs {
    pub(crate) fn rules(&self) -> shadowpod::policy::Rules {
        shadowpod::policy::Rules {
            level: self.pod_security,
            placement: shadowpod::policy::Placement {
                node_selector: self.node_selector.iter().cloned().collect(),
                tolerations: self.tolerations.clone(),
                priority_class: self.priority_class.clone(),
                runtime_classes: self.runtime_classes.iter().cloned().collect(),
            },
            default_requests: self.default_requests.iter().cloned().collect(),
        }
    }
}

/// A number of bytes as a quantity (`512Ki`, `64Mi`, `1000`).
pub(crate) fn bytes(s: &str) -> Result<u64, String> {
    let milli = fabric_api::quantity::milli(s).map_err(|e| e.to_string())?;
    u64::try_from(milli / 1000).map_err(|_| format!("{s:?} is not a number of bytes"))
}

/// `KEY=VALUE`.
pub(crate) fn key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

/// An empty item (as in `FABRIC_RESERVED=` from a ConfigMap) means none.
pub(crate) fn cidr_or_empty(s: &str) -> Result<Option<Ipv4Network>, String> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(None);
    }
    s.parse().map(Some).map_err(|e| format!("{s:?}: {e}"))
}
