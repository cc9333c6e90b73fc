//! The Node and its Lease as the virtual kubelet writes them: pure functions of the
//! VirtualNode, this process's settings and the decided conditions.
//!
//! Everything is written by server-side apply under [`field_manager::VIRTUAL_KUBELET`], so
//! the fields others own stay theirs: a cordon (`spec.unschedulable`, the VirtualNode
//! controller's), the node lifecycle controller's taints, labels an operator added by hand.
use std::collections::BTreeMap;

use fabric_api::{
    names::{label, taint},
    offloading::{node_labels, v1alpha1::VirtualNode},
};
use k8s_openapi::{
    api::{
        coordination::v1::{Lease, LeaseSpec},
        core::v1::{
            DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec,
            NodeStatus, NodeSystemInfo, Taint,
        },
    },
    apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference},
    jiff::Timestamp,
};
use kube::api::ObjectMeta;

/// Where node Leases live, as for every kubelet.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// What the node says about the process behind it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The virtual kubelet's own address (its pod IP): the node's InternalIP, where the API
    /// server reaches its kubelet API.
    pub address: String,
    /// The port of its kubelet API.
    pub kubelet_port: i32,
}

/// The Node's metadata and spec: name, labels, the virtual-node taint.
pub fn node(vn: &VirtualNode) -> Node {
    let name = &vn.spec.node_name;
    // The provider's labels first, those it may set only: the fabric's own cannot be
    // overridden by an advertised one, nor the consumer's reserved ones set (the VirtualNode
    // controller says which were refused).
    let (mut labels, _refused) = node_labels::split(&vn.spec.labels);
    labels.extend([
        (
            label::NODE_TYPE.to_owned(),
            label::VIRTUAL_NODE_TYPE.to_owned(),
        ),
        (label::REMOTE_CLUSTER.to_owned(), vn.spec.cluster_id.clone()),
        (HOSTNAME_LABEL.to_owned(), name.clone()),
    ]);
    Node {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: Some(vec![Taint {
                key: taint::VIRTUAL_NODE.to_owned(),
                value: Some("true".to_owned()),
                effect: "NoExecute".to_owned(),
                time_added: None,
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// The Node's status: capacity and allocatable from the grant, addresses and kubelet port of
/// this process, `conditions`.
pub fn status(vn: &VirtualNode, s: &Settings, conditions: Vec<NodeCondition>) -> NodeStatus {
    let resources: BTreeMap<_, _> = vn.spec.resources.clone();
    NodeStatus {
        capacity: Some(resources.clone()),
        allocatable: Some(resources),
        addresses: Some(vec![
            NodeAddress {
                type_: "InternalIP".to_owned(),
                address: s.address.clone(),
            },
            NodeAddress {
                type_: "Hostname".to_owned(),
                address: vn.spec.node_name.clone(),
            },
        ]),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint {
                port: s.kubelet_port,
            }),
        }),
        node_info: Some(NodeSystemInfo {
            architecture: std::env::consts::ARCH.to_owned(),
            operating_system: std::env::consts::OS.to_owned(),
            os_image: format!("fabric virtual node: provider {}", vn.spec.cluster_id),
            kubelet_version: format!("fabric-virtual-kubelet/v{}", env!("CARGO_PKG_VERSION")),
            kube_proxy_version: String::new(),
            container_runtime_version: format!("fabric://{}", vn.spec.cluster_id),
            kernel_version: String::new(),
            machine_id: String::new(),
            system_uuid: String::new(),
            boot_id: String::new(),
            ..Default::default()
        }),
        conditions: Some(conditions),
        ..Default::default()
    }
}

/// The node's Lease renewed at `now`, owned by the Node (it goes when the Node goes), as the
/// kubelet keeps it.
pub fn lease(node: &Node, duration_seconds: i32, now: Timestamp) -> Lease {
    let name = node.metadata.name.clone().unwrap_or_default();
    let owner = node.metadata.uid.clone().map(|uid| OwnerReference {
        api_version: "v1".to_owned(),
        kind: "Node".to_owned(),
        name: name.clone(),
        uid,
        ..Default::default()
    });
    Lease {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(LEASE_NAMESPACE.to_owned()),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name),
            lease_duration_seconds: Some(duration_seconds),
            renew_time: Some(MicroTime(now)),
            ..Default::default()
        }),
    }
}

/// The node's Ready and other conditions as they are stored, for transition times.
pub fn stored_conditions(node: Option<&Node>) -> Vec<NodeCondition> {
    node.and_then(|n| n.status.as_ref())
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use fabric_api::offloading::v1alpha1::VirtualNodeSpec;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;

    fn vn() -> VirtualNode {
        VirtualNode::new(
            "provider-b",
            VirtualNodeSpec {
                cluster_id: "cluster-b".into(),
                node_name: "fabric-cluster-b".into(),
                identity: "cluster-b".into(),
                resources: BTreeMap::from([
                    ("cpu".to_owned(), Quantity("4".into())),
                    ("memory".to_owned(), Quantity("8Gi".into())),
                    ("nvidia.com/gpu".to_owned(), Quantity("1".into())),
                ]),
                labels: BTreeMap::from([
                    ("node-type".to_owned(), "gpu".to_owned()),
                    // An advertised label cannot disguise the node, nor attract the
                    // consumer's infrastructure pods.
                    (label::NODE_TYPE.to_owned(), "real".to_owned()),
                    (
                        "node-role.kubernetes.io/control-plane".to_owned(),
                        String::new(),
                    ),
                    ("topology.kubernetes.io/zone".to_owned(), "z1".to_owned()),
                ]),
                at_most_once: None,
                storage: None,
            },
        )
    }

    #[test]
    fn the_node_carries_the_fabric_labels_the_advertised_ones_and_the_taint() {
        let n = node(&vn());
        let labels = n.metadata.labels.unwrap();
        assert_eq!(labels[label::NODE_TYPE], label::VIRTUAL_NODE_TYPE);
        assert_eq!(labels[label::REMOTE_CLUSTER], "cluster-b");
        assert_eq!(labels[HOSTNAME_LABEL], "fabric-cluster-b");
        assert_eq!(labels["node-type"], "gpu");
        assert_eq!(labels["topology.kubernetes.io/zone"], "z1");
        assert!(!labels.contains_key("node-role.kubernetes.io/control-plane"));
        let taints = n.spec.unwrap().taints.unwrap();
        assert_eq!(taints.len(), 1);
        assert_eq!(
            (taints[0].key.as_str(), taints[0].effect.as_str()),
            (taint::VIRTUAL_NODE, "NoExecute")
        );
        assert_eq!(n.metadata.name.as_deref(), Some("fabric-cluster-b"));
    }

    #[test]
    fn capacity_addresses_and_port_are_the_grant_and_this_process() {
        let s = Settings {
            address: "10.0.1.50".into(),
            kubelet_port: 10250,
        };
        let st = status(&vn(), &s, vec![]);
        assert_eq!(st.capacity, st.allocatable);
        let cap = st.capacity.unwrap();
        assert_eq!(cap["cpu"].0, "4");
        assert_eq!(cap["nvidia.com/gpu"].0, "1");
        let addrs = st.addresses.unwrap();
        assert_eq!(
            (addrs[0].type_.as_str(), addrs[0].address.as_str()),
            ("InternalIP", "10.0.1.50")
        );
        assert_eq!(
            st.daemon_endpoints.unwrap().kubelet_endpoint.unwrap().port,
            10250
        );
        assert!(
            st.node_info
                .unwrap()
                .kubelet_version
                .starts_with("fabric-virtual-kubelet/")
        );
    }

    #[test]
    fn the_lease_is_held_by_the_node_and_owned_by_it() {
        let mut n = node(&vn());
        n.metadata.uid = Some("uid-1".into());
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let l = lease(&n, 40, now);
        assert_eq!(l.metadata.namespace.as_deref(), Some(LEASE_NAMESPACE));
        let spec = l.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("fabric-cluster-b"));
        assert_eq!(spec.renew_time, Some(MicroTime(now)));
        assert_eq!(l.metadata.owner_references.unwrap()[0].uid, "uid-1");
    }
}
