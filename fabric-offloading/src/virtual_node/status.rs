//! A VirtualNode's conditions (Registered, Ready, LabelsAccepted) and its ForeignCluster's
//! VirtualNodeReady, from the Node its virtual kubelet registered and the labels the provider
//! advertises (pure, injected clock).
use fabric_api::{
    core::v1alpha1::condition::VIRTUAL_NODE as FC_VIRTUAL_NODE,
    names::label,
    offloading::{
        node_labels,
        v1alpha1::{VirtualNode, condition},
    },
};
use fabric_kube::status::{Reason, Verdict, with_condition};
use k8s_openapi::{
    api::core::v1::Node, apimachinery::pkg::apis::meta::v1::Condition, jiff::Timestamp,
};

fabric_kube::reasons! {
    /// Why a VirtualNode is (not) Registered.
    pub enum Registered {
        Registered = "NodeRegistered",
        /// No Node yet: the virtual kubelet has not started or not registered.
        Waiting = "WaitingForVirtualKubelet",
        /// A Node of that name exists and is not this provider's virtual node: it is left
        /// alone.
        NameTaken = "NodeNameTaken",
    }
}

fabric_kube::reasons! {
    /// Why a VirtualNode (and its ForeignCluster's VirtualNodeReady) is (not) Ready.
    pub enum Ready {
        /// No Node yet: the virtual kubelet has not started or not registered.
        Waiting = "WaitingForVirtualKubelet",
        /// The Node has no Ready condition yet.
        NoReadyCondition = "NodeStatusUnknown",
    } else {
        /// The Node's own Ready reason (the virtual kubelet's), carried as it wrote it.
        Node(String),
    }
}

fabric_kube::reasons! {
    /// Whether the labels the provider advertises are all on the Node.
    pub enum Labels {
        Accepted = "LabelsAccepted",
        /// Some are under prefixes a provider may not set: left off the Node.
        Refused = "LabelsRefused",
    }
}

/// The reason of the Event that says labels were refused ([`Labels::Refused`]'s).
pub const LABELS_REFUSED: &str = "LabelsRefused";

/// How many refused keys a message names; the rest are counted.
const NAMED: usize = 8;

/// The LabelsAccepted verdict: which advertised labels the Node goes without.
fn labels(vn: &VirtualNode) -> Verdict<Labels> {
    let (_, refused) = node_labels::split(&vn.spec.labels);
    if refused.is_empty() {
        return Verdict::ok(
            Labels::Accepted,
            "every label the provider advertises is on the Node",
        );
    }
    let mut named = refused[..refused.len().min(NAMED)].join(", ");
    if refused.len() > NAMED {
        named.push_str(&format!(" and {} more", refused.len() - NAMED));
    }
    Verdict::not(
        Labels::Refused,
        format!(
            "labels the provider may not set are left off the Node: {named} (reserved: {}; allowed of them: {})",
            node_labels::RESERVED_DOMAINS.join(", "),
            node_labels::ALLOWED.join(", ")
        ),
    )
}

/// Whether labels were refused now and not before (an Event is due): the message.
pub fn labels_refused(before: &[Condition], after: &[Condition]) -> Option<String> {
    let find = |c: &[Condition]| Verdict::<Labels>::find(c, condition::LABELS_ACCEPTED);
    let a = find(after).filter(|a| !a.ok)?;
    match find(before) {
        Some(b) if !b.ok && b.message == a.message => None,
        _ => Some(a.message),
    }
}

/// Whether `node` is the virtual node of `vn` (and not someone else's Node of that name).
pub fn is_ours(vn: &VirtualNode, node: &Node) -> bool {
    let labels = node.metadata.labels.as_ref();
    let get = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    get(label::NODE_TYPE) == Some(label::VIRTUAL_NODE_TYPE)
        && get(label::REMOTE_CLUSTER) == Some(vn.spec.cluster_id.as_str())
}

/// The Ready verdict.
fn ready(vn: &VirtualNode, node: Option<&Node>) -> Verdict<Ready> {
    let name = &vn.spec.node_name;
    let Some(node) = node.filter(|n| is_ours(vn, n)) else {
        return Verdict::not(Ready::Waiting, format!("Node {name} is not registered"));
    };
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
    match ready {
        None => Verdict::not(
            Ready::NoReadyCondition,
            format!("Node {name} reports no Ready condition yet"),
        ),
        Some(r) => Verdict {
            ok: r.status == "True",
            reason: r
                .reason
                .as_deref()
                .filter(|r| !r.is_empty())
                .and_then(Ready::parse)
                .unwrap_or(Ready::NoReadyCondition),
            message: format!(
                "Node {name}: {}",
                r.message.as_deref().unwrap_or("no message")
            ),
        },
    }
}

/// The VirtualNode's conditions given the ones it has (`current`) and its Node.
pub fn conditions(
    vn: &VirtualNode,
    current: &[Condition],
    node: Option<&Node>,
    now: Timestamp,
) -> Vec<Condition> {
    let generation = vn.metadata.generation;
    let name = &vn.spec.node_name;
    let registered = match node {
        Some(n) if is_ours(vn, n) => Verdict::ok(
            Registered::Registered,
            format!("Node {name} is registered by its virtual kubelet"),
        ),
        Some(_) => Verdict::not(
            Registered::NameTaken,
            format!(
                "a Node {name} exists that is not the virtual node of {}; it is left alone",
                vn.spec.cluster_id
            ),
        ),
        None => Verdict::not(
            Registered::Waiting,
            format!("Node {name} is not registered yet"),
        ),
    };
    let out = with_condition(
        current,
        registered.condition(condition::REGISTERED, generation, now),
    );
    let out = with_condition(
        &out,
        ready(vn, node).condition(condition::READY, generation, now),
    );
    with_condition(
        &out,
        labels(vn).condition(condition::LABELS_ACCEPTED, generation, now),
    )
}

/// The ForeignCluster's VirtualNodeReady condition, from the VirtualNode's Ready one.
pub fn foreign_cluster_condition(
    vn: &VirtualNode,
    current: &[Condition],
    vn_conditions: &[Condition],
    now: Timestamp,
) -> Vec<Condition> {
    let ready = Verdict::<Ready>::find(vn_conditions, condition::READY).unwrap_or_else(|| {
        Verdict::not(
            Ready::Waiting,
            format!("Node {} is not registered", vn.spec.node_name),
        )
    });
    let previous: Vec<Condition> = current
        .iter()
        .filter(|c| c.type_ == FC_VIRTUAL_NODE)
        .cloned()
        .collect();
    with_condition(&previous, ready.condition(FC_VIRTUAL_NODE, None, now))
}

/// Whether Ready changed between two sets of conditions (an Event is due): Some(new status).
pub fn ready_transition(before: &[Condition], after: &[Condition]) -> Option<(bool, String)> {
    let find = |c: &[Condition]| Verdict::<Ready>::find(c, condition::READY);
    let (b, a) = (find(before), find(after)?);
    if b.as_ref().map(|b| (b.ok, &b.reason)) == Some((a.ok, &a.reason)) {
        return None;
    }
    Some((a.ok, a.message))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use fabric_api::offloading::v1alpha1::VirtualNodeSpec;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
    use kube::api::ObjectMeta;

    use super::*;

    fn vn() -> VirtualNode {
        VirtualNode::new(
            "b",
            VirtualNodeSpec {
                cluster_id: "cluster-b".into(),
                node_name: "fabric-cluster-b".into(),
                identity: "cluster-b".into(),
                resources: Default::default(),
                labels: Default::default(),
                at_most_once: None,
                storage: None,
            },
        )
    }

    fn node(provider: &str, ready: Option<(&str, &str)>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("fabric-cluster-b".into()),
                labels: Some(BTreeMap::from([
                    (
                        label::NODE_TYPE.to_owned(),
                        label::VIRTUAL_NODE_TYPE.to_owned(),
                    ),
                    (label::REMOTE_CLUSTER.to_owned(), provider.to_owned()),
                ])),
                ..Default::default()
            },
            status: ready.map(|(s, r)| NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: s.into(),
                    reason: Some(r.into()),
                    message: Some("the tunnel is Connecting".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn get<'a>(c: &'a [Condition], t: &str) -> (&'a str, &'a str) {
        let c = c.iter().find(|c| c.type_ == t).unwrap();
        (c.status.as_str(), c.reason.as_str())
    }

    #[test]
    fn refused_labels_are_said_once() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let mut v = vn();
        let c = conditions(&v, &[], None, now);
        assert_eq!(
            get(&c, condition::LABELS_ACCEPTED),
            ("True", "LabelsAccepted")
        );
        assert_eq!(labels_refused(&[], &c), None);
        v.spec
            .labels
            .extend((0..10).map(|i| (format!("node-role.kubernetes.io/r{i}"), String::new())));
        let refused = conditions(&v, &c, None, now);
        assert_eq!(
            get(&refused, condition::LABELS_ACCEPTED),
            ("False", "LabelsRefused")
        );
        let said = labels_refused(&c, &refused).unwrap();
        assert!(said.contains("node-role.kubernetes.io/r0"), "{said}");
        assert!(said.contains("and 2 more"), "{said}");
        assert_eq!(labels_refused(&refused, &refused), None, "said once");
        let again = conditions(&v, &refused, None, now);
        assert_eq!(labels_refused(&refused, &again), None);
    }

    #[test]
    fn registered_and_ready_follow_the_node() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let v = vn();
        let c = conditions(&v, &[], None, now);
        assert_eq!(
            get(&c, condition::REGISTERED),
            ("False", "WaitingForVirtualKubelet")
        );
        assert_eq!(
            get(&c, condition::READY),
            ("False", "WaitingForVirtualKubelet")
        );
        let n = node("cluster-b", Some(("False", "TunnelDown")));
        let c = conditions(&v, &c, Some(&n), now);
        assert_eq!(get(&c, condition::REGISTERED), ("True", "NodeRegistered"));
        assert_eq!(get(&c, condition::READY), ("False", "TunnelDown"));
        let n = node("cluster-b", Some(("True", "VirtualKubeletReady")));
        let ready = conditions(&v, &c, Some(&n), now);
        assert_eq!(
            get(&ready, condition::READY),
            ("True", "VirtualKubeletReady")
        );
        assert_eq!(
            ready_transition(&c, &ready),
            Some((
                true,
                "Node fabric-cluster-b: the tunnel is Connecting".into()
            ))
        );
        assert_eq!(ready_transition(&ready, &ready), None);
        let fc = foreign_cluster_condition(&v, &[], &ready, now);
        assert_eq!(fc.len(), 1);
        assert_eq!(get(&fc, FC_VIRTUAL_NODE), ("True", "VirtualKubeletReady"));
    }

    #[test]
    fn someone_elses_node_of_that_name_is_not_ours() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let v = vn();
        let other = node("cluster-c", Some(("True", "KubeletReady")));
        assert!(!is_ours(&v, &other));
        let c = conditions(&v, &[], Some(&other), now);
        assert_eq!(get(&c, condition::REGISTERED), ("False", "NodeNameTaken"));
        assert_eq!(get(&c, condition::READY).0, "False");
    }
}
