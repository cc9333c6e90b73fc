//! NetworkPolicies of offloaded namespaces, reflected into their twins (issue 20, the first of
//! two stages, as EndpointSlices are): the virtual kubelet writes each policy as a
//! `ShadowNetworkPolicy` in the twin, its peers translated for where the policy now applies;
//! the provider's controller writes the real NetworkPolicy, each address block remapped
//! through its view of this cluster (this cluster cannot know that view: the provider's IPAM
//! picks it), and refuses whatever is not this cluster's.
//!
//! What a policy becomes in the twin on this node's provider ([`translate`], pure):
//! - its `podSelector` stays: offloaded pods keep their labels in the twin, so it selects the
//!   namespace's pods that run there;
//! - `policyTypes` are written out (as the API server defaults them at home): a policy whose
//!   egress rules all translate to nothing must still isolate egress, not stop doing so;
//! - a peer selecting pods (`podSelector`, `namespaceSelector`, both) becomes, for the pods it
//!   selects at home now:
//!   - those that do **not** run on this node's provider (at home, or on another provider):
//!     an `ipBlock` `/32` of each one's home address (the provider remaps it, or refuses an
//!     address it cannot reach: a pod on a third cluster);
//!   - those of the policy's own namespace that run there: the peer's `podSelector` alone
//!     (they are in the twin, with their labels);
//!   - those of another offloaded namespace with a twin there: a peer selecting that twin by
//!     its name (`kubernetes.io/metadata.name`) with the peer's `podSelector`. The twins'
//!     names differ from the home ones, and their labels are the provider's, so a home
//!     `namespaceSelector` cannot be kept as it is;
//!   - the block list is recomputed as pods come, go or move (a new inventory resyncs every
//!     policy);
//! - an `ipBlock` goes as it is (home addresses; the provider keeps the part of it that is
//!   this cluster's pod or external addresses, remapped);
//! - a rule that named peers and now names none is dropped, never left with an empty peer
//!   list, which would allow everything;
//! - ports are unchanged.
//!
//! Left as they are at home: rules with no peers (everyone), and default-deny policies (no
//! rules). Enforcement is the provider's CNI's: the fabric only writes the policy.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
    sync::Arc,
};

use fabric_api::{
    names::network_policy::{MANAGED_BY, NAMESPACE_NAME, REFLECTED},
    offloading::v1alpha1::{ShadowNetworkPolicy, ShadowNetworkPolicySpec},
};
use fabric_reflector::mirror::Forge;
use futures::StreamExt;
use k8s_openapi::{
    api::{
        core::v1::{Namespace, Pod},
        networking::v1::{
            IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule,
            NetworkPolicyPeer, NetworkPolicySpec,
        },
    },
    apimachinery::pkg::apis::meta::v1::LabelSelector,
};
use kube::{
    Api, Client, ResourceExt,
    runtime::{WatchStreamExt, reflector, watcher},
};
use tokio::sync::watch;
use tracing::warn;

use crate::{
    configs::{meta_of, reflected},
    pods::twins::Twins,
};

/// A home pod as a policy's peers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HomePod {
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    /// Its IPv4 address at home.
    pub ip: Ipv4Addr,
    /// The node it is bound to.
    pub node: Option<String>,
}

/// What the peers of every policy are resolved against.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Inventory {
    /// The home namespaces and their labels.
    pub namespaces: BTreeMap<String, BTreeMap<String, String>>,
    /// The home pods that have an address of their own (not finished, not on the host's
    /// network), sorted.
    pub pods: Vec<HomePod>,
    /// The twins this node's provider has made: home namespace → twin.
    pub twins: BTreeMap<String, String>,
}

/// Whether `selector` selects an object labelled `labels` (an empty selector selects all).
/// An operator Kubernetes does not know selects nothing: a peer is an allowance, and an
/// allowance not understood is not given.
pub fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_labels = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    by_labels
        && selector.match_expressions.iter().flatten().all(|e| {
            let values = e.values.as_deref().unwrap_or_default();
            let value = labels.get(&e.key);
            match e.operator.as_str() {
                "In" => value.is_some_and(|v| values.contains(v)),
                "NotIn" => value.is_none_or(|v| !values.contains(v)),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                _ => false,
            }
        })
}

/// What one home peer becomes (see the module's documentation); `ns` is the policy's
/// namespace, `node` this virtual kubelet's.
fn peers(
    peer: &NetworkPolicyPeer,
    ns: &str,
    inv: &Inventory,
    node: &str,
) -> Vec<NetworkPolicyPeer> {
    if peer.ip_block.is_some() {
        return vec![peer.clone()];
    }
    let namespaces: Vec<&str> = match &peer.namespace_selector {
        // Neither selector nor block: not a peer the API server lets through; nothing.
        None if peer.pod_selector.is_none() => return Vec::new(),
        None => vec![ns],
        Some(sel) => inv
            .namespaces
            .iter()
            .filter(|(_, labels)| selects(sel, labels))
            .map(|(n, _)| n.as_str())
            .collect(),
    };
    let all = LabelSelector::default();
    let pod_sel = peer.pod_selector.as_ref().unwrap_or(&all);
    let mut out = Vec::new();
    // The pods that run in twins here, by selector: the policy's own namespace's in its twin,
    // another namespace's in that one's twin, by name.
    for n in &namespaces {
        if *n == ns {
            out.push(NetworkPolicyPeer {
                pod_selector: Some(pod_sel.clone()),
                ..Default::default()
            });
        } else if let Some(twin) = inv.twins.get(*n) {
            out.push(NetworkPolicyPeer {
                namespace_selector: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([(NAMESPACE_NAME.to_owned(), twin.clone())])),
                    ..Default::default()
                }),
                pod_selector: Some(pod_sel.clone()),
                ..Default::default()
            });
        }
    }
    // The pods elsewhere, by address.
    let ips: BTreeSet<Ipv4Addr> = inv
        .pods
        .iter()
        .filter(|p| {
            namespaces.contains(&p.namespace.as_str())
                && p.node.as_deref() != Some(node)
                && selects(pod_sel, &p.labels)
        })
        .map(|p| p.ip)
        .collect();
    out.extend(ips.into_iter().map(|ip| NetworkPolicyPeer {
        ip_block: Some(IPBlock {
            cidr: format!("{ip}/32"),
            except: None,
        }),
        ..Default::default()
    }));
    out
}

/// A rule's peers translated: `None` (everyone) stays `None`; a list that named peers and
/// translates to none is `Err(())`: the rule allows nothing now and is dropped.
fn rule_peers(
    from: Option<&Vec<NetworkPolicyPeer>>,
    ns: &str,
    inv: &Inventory,
    node: &str,
) -> Result<Option<Vec<NetworkPolicyPeer>>, ()> {
    let Some(from) = from.filter(|f| !f.is_empty()) else {
        return Ok(None);
    };
    let mut out: Vec<NetworkPolicyPeer> = Vec::new();
    for p in from.iter().flat_map(|p| peers(p, ns, inv, node)) {
        if !out.contains(&p) {
            out.push(p);
        }
    }
    if out.is_empty() {
        Err(())
    } else {
        Ok(Some(out))
    }
}

/// The twin's policy of home policy `policy` for the provider of node `node` (see the
/// module's documentation).
pub fn translate(policy: &NetworkPolicy, inv: &Inventory, node: &str) -> NetworkPolicySpec {
    let ns = policy.namespace().unwrap_or_default();
    let spec = policy.spec.clone().unwrap_or_default();
    let has_egress = spec.egress.as_ref().is_some_and(|e| !e.is_empty());
    let policy_types = spec.policy_types.clone().unwrap_or_else(|| {
        let mut t = vec!["Ingress".to_owned()];
        if has_egress {
            t.push("Egress".to_owned());
        }
        t
    });
    let ingress = spec.ingress.as_ref().map(|rules| {
        rules
            .iter()
            .filter_map(|r| {
                let from = rule_peers(r.from.as_ref(), &ns, inv, node).ok()?;
                Some(NetworkPolicyIngressRule {
                    from,
                    ports: r.ports.clone(),
                })
            })
            .collect()
    });
    let egress = spec.egress.as_ref().map(|rules| {
        rules
            .iter()
            .filter_map(|r| {
                let to = rule_peers(r.to.as_ref(), &ns, inv, node).ok()?;
                Some(NetworkPolicyEgressRule {
                    to,
                    ports: r.ports.clone(),
                })
            })
            .collect()
    });
    NetworkPolicySpec {
        pod_selector: spec.pod_selector.clone(),
        policy_types: Some(policy_types),
        ingress,
        egress,
    }
}

/// The NetworkPolicies of an offloaded namespace, for the provider of node `node_name`,
/// resolved against `inventory` (`None`: not listed yet; no twin pair starts before it is).
pub struct NetworkPolicies {
    pub node_name: String,
    pub inventory: watch::Receiver<Option<Arc<Inventory>>>,
}

impl Forge for NetworkPolicies {
    type Home = NetworkPolicy;
    type Remote = ShadowNetworkPolicy;
    const NAME: &'static str = "networkpolicies";

    fn forge(&self, home: &NetworkPolicy) -> Option<ShadowNetworkPolicy> {
        // One the fabric wrote here (reflected from a peer) never goes back.
        if home.labels().get(MANAGED_BY).map(String::as_str) == Some(REFLECTED)
            || !reflected(&home.metadata, true)
        {
            return None;
        }
        let inventory = self.inventory.borrow().clone()?;
        Some(ShadowNetworkPolicy {
            metadata: meta_of(&home.metadata),
            spec: ShadowNetworkPolicySpec {
                template: translate(home, &inventory, &self.node_name),
            },
        })
    }
}

/// A home pod with an address of its own, as peers see it (`None`: none to match by
/// address: not yet addressed, finished, or on its node's network).
fn home_pod(p: &Pod) -> Option<HomePod> {
    let spec = p.spec.as_ref()?;
    let status = p.status.as_ref()?;
    if spec.host_network == Some(true)
        || matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"))
    {
        return None;
    }
    let ip = status
        .pod_ips
        .iter()
        .flatten()
        .map(|i| i.ip.as_str())
        .chain(status.pod_ip.as_deref())
        .find_map(|i| i.parse::<Ipv4Addr>().ok())?;
    Some(HomePod {
        namespace: p.namespace()?,
        labels: p.labels().clone(),
        ip,
        node: spec.node_name.clone(),
    })
}

/// The inventory of this cluster's pods and namespaces and of the twins, kept as they change;
/// `None` until pods and namespaces are listed and the twins known. Sent only when it
/// changes (a pod's status beat is no change to it).
pub fn follow(
    local: Client,
    mut twins: watch::Receiver<Twins>,
) -> watch::Receiver<Option<Arc<Inventory>>> {
    let (tx, rx) = watch::channel(None);
    let (pods, pods_w) = reflector::store::<Pod>();
    let (namespaces, ns_w) = reflector::store::<Namespace>();
    let pod_events = reflector(
        pods_w,
        watcher(Api::<Pod>::all(local.clone()), watcher::Config::default()).default_backoff(),
    )
    .map(|_| ());
    let ns_events = reflector(
        ns_w,
        watcher(Api::<Namespace>::all(local), watcher::Config::default()).default_backoff(),
    )
    .map(|_| ());
    tokio::spawn(async move {
        let mut changes = std::pin::pin!(futures::stream::select(pod_events, ns_events));
        let (p, n) = (pods.clone(), namespaces.clone());
        let ready = async move {
            let _ = p.wait_until_ready().await;
            let _ = n.wait_until_ready().await;
        };
        let mut ready = std::pin::pin!(ready);
        let mut listed = false;
        loop {
            tokio::select! {
                () = &mut ready, if !listed => listed = true,
                c = changes.next() => if c.is_none() {
                    warn!("the pod or namespace watch for NetworkPolicy peers ended");
                    return;
                },
                c = twins.changed() => if c.is_err() { return },
            }
            let t = twins.borrow_and_update().clone();
            if !listed || t.mapped.is_none() {
                continue;
            }
            let mut all: Vec<HomePod> = pods.state().iter().filter_map(|p| home_pod(p)).collect();
            all.sort_by(|a, b| (&a.namespace, a.ip).cmp(&(&b.namespace, b.ip)));
            let inv = Inventory {
                namespaces: namespaces
                    .state()
                    .iter()
                    .map(|n| (n.name_any(), n.labels().clone()))
                    .collect(),
                pods: all,
                twins: t.accepted(),
            };
            tx.send_if_modified(|cur| {
                if cur.as_deref() == Some(&inv) {
                    return false;
                }
                *cur = Some(Arc::new(inv));
                true
            });
        }
    });
    rx
}
