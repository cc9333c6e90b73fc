//! The two-API-server offload fixture: a consumer API server holding what the sharing and
//! network layers have made by the time a VirtualNode exists, a provider API server with the
//! consumer admitted as a tenant, and the consumer's VirtualNode controller with the
//! Deployment stand-in that runs the virtual kubelets it deploys. Both API servers enforce
//! RBAC; the consumer reaches the provider only through a real consumer identity bound to the
//! tenant Role. Used by the offload, virtual_node and offloaded_streams tests (the latter
//! with a fixture cluster as the provider).
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use fabric_api::{
    names,
    offloading::v1alpha1::{VirtualNode, VirtualNodeSpec},
};
use fabric_auth::identity::Credentials;
use fabric_offloading::virtual_node::objects;
use serde_json::{Value, json};

use crate::{
    ChildGuard,
    apiserver::ApiServer,
    deployments::{self, Deployments},
    process::Bin,
    sharing,
};

pub const NS: &str = names::DEFAULT_NAMESPACE;
pub const CONSUMER: &str = "cluster-a";
pub const PROVIDER: &str = "cluster-b";
/// The virtual node's name on the consumer.
pub const NODE: &str = "fabric-cluster-b";
/// The provider's pod CIDR, and what the network layer remapped it to on the consumer.
pub const PROVIDER_POD_CIDR: &str = "10.244.0.0/16";
pub const REMAPPED_POD_CIDR: &str = "10.71.0.0/16";

/// Server-side apply of one object, as `kubectl apply --server-side` (in-process, under
/// kubectl's field manager, so that a test's own `kubectl apply --server-side` of the same
/// object later owns the same fields).
pub fn apply(api: &ApiServer, obj: &Value) -> Result<()> {
    crate::kube_sync::apply(&api.kubeconfig, "kubectl", false, std::slice::from_ref(obj))
        .with_context(|| format!("apply {obj}"))
}

/// A fresh scratch directory for a test's logs: `fabt-<pid>-<tag>` under the temp dir.
pub fn scratch_dir(tag: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("fabt-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// On the provider, what its authentication service makes for the consumer (tenant namespace,
/// Tenant, Role and RoleBindings, ForeignCluster), and the consumer's credentials.
pub async fn admit_consumer(provider: &ApiServer) -> Result<Credentials> {
    sharing::admit_tenant(&provider.client().await, CONSUMER).await?;
    sharing::consumer_credentials(provider, CONSUMER)
}

/// On the provider, a grant for `consumer`'s ShadowPods: a Node with room, and the
/// ResourceSlice the consumer's replicator would have made (1 CPU, 1Gi, 10 pods), which the
/// sharing controller's policy answers.
pub fn grant(provider: &ApiServer, consumer: &str) -> Result<()> {
    apply(
        provider,
        &json!({ "apiVersion": "v1", "kind": "Node", "metadata": { "name": "n1" } }),
    )?;
    let alloc = json!({ "cpu": "8", "memory": "16Gi", "pods": "110" });
    provider.kubectl_ok(&[
        "patch",
        "node",
        "n1",
        "--subresource=status",
        "--type=merge",
        "-p",
        &json!({ "status": { "allocatable": alloc, "capacity": alloc } }).to_string(),
    ]);
    apply(
        provider,
        &json!({ "apiVersion": "authentication.fabric.io/v1alpha1", "kind": "ResourceSlice",
                 "metadata": { "name": consumer, "namespace": names::namespace::tenant(consumer) },
                 "spec": { "consumerClusterId": consumer, "providerClusterId": PROVIDER,
                           "resources": { "cpu": "1", "memory": "1Gi", "pods": "10" } } }),
    )
}

/// The consumer's API server (`--graceful-pod-deletion` if `graceful`, as with a kubelet),
/// with its ForeignCluster for the provider, the tunnel `Connected` (as the gateway operator
/// reports it) and the provider's pod CIDR remapped (as the network layer agreed).
pub fn start_consumer(tag: &str, graceful: bool) -> Result<ApiServer> {
    let consumer = if graceful {
        ApiServer::start_with_auth_args(tag, "--graceful-pod-deletion")
    } else {
        ApiServer::start_with_auth(tag)
    };
    consumer.install_crds();
    consumer.create_namespaces(&[NS, names::namespace::IDENTITIES]);
    apply(
        &consumer,
        &json!({ "apiVersion": "core.fabric.io/v1alpha1", "kind": "ForeignCluster",
                 "metadata": { "name": PROVIDER },
                 "spec": { "clusterId": PROVIDER, "role": "Provider" } }),
    )?;
    apply(
        &consumer,
        &json!({ "apiVersion": "networking.fabric.io/v1alpha1", "kind": "Connection",
                 "metadata": { "name": PROVIDER, "namespace": NS },
                 "spec": { "clusterId": PROVIDER } }),
    )?;
    set_tunnel(&consumer, "Connected");
    apply(
        &consumer,
        &json!({ "apiVersion": "networking.fabric.io/v1alpha1", "kind": "Configuration",
                 "metadata": { "name": PROVIDER, "namespace": NS },
                 "spec": { "clusterId": PROVIDER,
                           "remote": { "pod": PROVIDER_POD_CIDR, "external": "10.70.0.0/16" } } }),
    )?;
    merge_status(
        &consumer,
        "configuration",
        PROVIDER,
        json!({ "remote": { "pod": REMAPPED_POD_CIDR, "external": "10.72.0.0/16" } }),
    );
    Ok(consumer)
}

/// Merges `status` into the object of `kind` named `name` (the peer's cluster id) in the
/// fabric's namespace of `api`, as its controller would write it.
fn merge_status(api: &ApiServer, kind: &str, name: &str, status: Value) {
    api.kubectl_ok(&[
        "patch",
        kind,
        name,
        "-n",
        NS,
        "--subresource=status",
        "--type=merge",
        "-p",
        &json!({ "status": status }).to_string(),
    ]);
}

/// The tunnel's state as the gateway operator writes it on the consumer's `Connection`.
pub fn set_tunnel(consumer: &ApiServer, state: &str) {
    merge_status(
        consumer,
        "connection",
        PROVIDER,
        json!({ "value": state, "message": format!("test: {state}") }),
    );
}

/// The consumer's pod CIDR (the provider's too: both clusters on the same one) and external
/// CIDR, and how the provider sees them.
pub const CONSUMER_CIDRS: (&str, &str) = ("10.244.0.0/16", "10.70.0.0/16");
pub const CONSUMER_SEEN: (&str, &str) = ("10.245.0.0/16", "10.90.0.0/16");

/// What the provider's network layer would have made for the consumer: its Configuration
/// (remapped as [`CONSUMER_SEEN`]) and the Connection of its tunnel, in state `tunnel`.
pub fn provider_network(provider: &ApiServer, tunnel: &str) -> Result<()> {
    apply(
        provider,
        &json!({"apiVersion": "networking.fabric.io/v1alpha1", "kind": "Configuration",
                "metadata": {"name": CONSUMER, "namespace": NS},
                "spec": {"clusterId": CONSUMER,
                         "remote": {"pod": CONSUMER_CIDRS.0, "external": CONSUMER_CIDRS.1}}}),
    )?;
    merge_status(
        provider,
        "configuration",
        CONSUMER,
        json!({"remote": {"pod": CONSUMER_SEEN.0, "external": CONSUMER_SEEN.1}}),
    );
    set_provider_tunnel(provider, tunnel)
}

/// The consumer's tunnel's state as the provider's gateway operator writes it.
pub fn set_provider_tunnel(provider: &ApiServer, state: &str) -> Result<()> {
    apply(
        provider,
        &json!({"apiVersion": "networking.fabric.io/v1alpha1", "kind": "Connection",
                "metadata": {"name": CONSUMER, "namespace": NS},
                "spec": {"clusterId": CONSUMER}}),
    )?;
    merge_status(provider, "connection", CONSUMER, json!({"value": state}));
    Ok(())
}

/// The NamespaceMap the consumer's controller would write on the provider, written with the
/// consumer's own identity `creds`: `mappings` of (home, twin).
pub async fn namespace_map(creds: &Credentials, mappings: &[(&str, &str)]) -> Result<()> {
    use fabric_auth::identity;
    use kube::api::{Api, Patch, PatchParams};

    let kubeconfig = identity::to_yaml(&identity::kubeconfig(PROVIDER, creds));
    let client = identity::client_from_kubeconfig(&kubeconfig).await?;
    let maps: Api<fabric_api::offloading::v1alpha1::NamespaceMap> =
        Api::namespaced(client, &names::namespace::tenant(CONSUMER));
    let namespaces: Vec<Value> = mappings
        .iter()
        .map(|(home, remote)| json!({"home": home, "remote": remote}))
        .collect();
    let map = json!({
        "apiVersion": "offloading.fabric.io/v1alpha1", "kind": "NamespaceMap",
        "metadata": {"name": CONSUMER},
        "spec": {"clusterId": CONSUMER, "namespaces": namespaces},
    });
    maps.patch(
        CONSUMER,
        &PatchParams::apply(names::field_manager::NAMESPACE_OFFLOADING).force(),
        &Patch::Apply(&map),
    )
    .await?;
    Ok(())
}

/// The consumer's identity Secret for the provider (what the virtual kubelet reaches it with).
pub fn set_identity(consumer: &ApiServer, creds: &Credentials) -> Result<()> {
    let secret = fabric_auth::identity::secret(PROVIDER, creds);
    apply(consumer, &serde_json::to_value(&secret)?)
}

/// The consumer's VirtualNode for the provider, with `spec` merged over the defaults.
pub fn virtual_node(spec: Value) -> Value {
    let mut vn = json!({ "apiVersion": "offloading.fabric.io/v1alpha1", "kind": "VirtualNode",
        "metadata": { "name": PROVIDER, "namespace": NS },
        "spec": { "clusterId": PROVIDER, "nodeName": NODE, "identity": PROVIDER,
                  "resources": { "cpu": "4", "memory": "8Gi", "pods": "110" } } });
    if let (Some(base), Value::Object(over)) = (vn["spec"].as_object_mut(), spec) {
        base.extend(over);
    }
    vn
}

/// The name of the virtual kubelet's Deployment (and ServiceAccount, Roles).
pub fn virtual_kubelet_name() -> String {
    objects::name(&VirtualNode::new(
        PROVIDER,
        VirtualNodeSpec {
            cluster_id: PROVIDER.into(),
            node_name: NODE.into(),
            identity: PROVIDER.into(),
            resources: Default::default(),
            labels: Default::default(),
            at_most_once: None,
            storage: None,
        },
    ))
}

/// The consumer's VirtualNode controller and the Deployment stand-in running what it deploys.
pub struct VirtualNodes {
    pub controller: ChildGuard,
    pub deployments: Deployments,
    pub log: PathBuf,
}

/// `fabric-controller virtual-nodes` on the consumer (with `extra` arguments), its log in
/// `dir`, and the Deployment stand-in running its virtual kubelets as host processes.
pub fn start_virtual_nodes(
    consumer: &ApiServer,
    dir: &Path,
    extra: &[&str],
) -> Result<VirtualNodes> {
    let mut args = vec![
        "virtual-nodes",
        "--virtual-kubelet-image",
        "fabric-virtual-kubelet:test",
        // Other tests' virtual kubelets may be on the host's loopback too.
        "--virtual-kubelet-port",
        "0",
    ];
    args.extend(extra);
    let log = dir.join("consumer-controller.log");
    // As its pod: its ServiceAccount's token, with the rights deploy/ gives it.
    let kubeconfig = crate::rights::component_kubeconfig(
        consumer,
        "fabric-virtual-nodes",
        dir.join("virtual-nodes.kubeconfig"),
    )?;
    let controller = Bin::new("fabric-controller")?
        .args(args)
        .kubeconfig(&kubeconfig)
        .pod_name("controller-0")
        .log(&log)
        .spawn()?;
    let deployments = Deployments::start(deployments::Options {
        admin_kubeconfig: consumer.kubeconfig.clone(),
        component_kubeconfig: consumer.kubeconfig.clone(),
        selector: format!("{}={}", objects::APP_LABEL, objects::APP),
        netns: None,
        pod_ip: "127.0.0.1".into(),
        dir: dir.join("pods"),
    })?;
    Ok(VirtualNodes {
        controller,
        deployments,
        log,
    })
}

/// The last `n` lines of a log file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
