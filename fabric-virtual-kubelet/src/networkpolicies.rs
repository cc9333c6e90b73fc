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

#[cfg(test)]
mod tests {
    use fabric_api::names::label::REFLECTED_FROM;
    use serde_json::{Value, json};

    use super::*;

    const NODE: &str = "fabric-beta";

    fn labels(v: Value) -> BTreeMap<String, String> {
        serde_json::from_value(v).unwrap()
    }

    fn pod(ns: &str, app: &str, ip: &str, node: &str) -> HomePod {
        HomePod {
            namespace: ns.into(),
            labels: labels(json!({"app": app})),
            ip: ip.parse().unwrap(),
            node: Some(node.into()),
        }
    }

    /// shop (offloaded, twin `shop-alpha` here) and db (offloaded, twin `db-alpha`), tools
    /// (home only): pods at home, on this node (in twins) and on another provider's node.
    fn inventory() -> Inventory {
        Inventory {
            namespaces: BTreeMap::from([
                (
                    "shop".into(),
                    labels(json!({"kubernetes.io/metadata.name": "shop", "team": "a"})),
                ),
                (
                    "db".into(),
                    labels(
                        json!({"kubernetes.io/metadata.name": "db", "team": "a", "tier": "data"}),
                    ),
                ),
                (
                    "tools".into(),
                    labels(json!({"kubernetes.io/metadata.name": "tools", "team": "b"})),
                ),
            ]),
            pods: vec![
                pod("shop", "web", "10.244.1.5", "home-1"),
                pod("shop", "web", "10.71.0.9", NODE),
                pod("shop", "cache", "10.244.1.6", "home-1"),
                pod("shop", "web", "10.73.0.4", "fabric-gamma"),
                pod("db", "pg", "10.244.2.7", "home-2"),
                pod("db", "pg", "10.71.0.10", NODE),
                pod("tools", "probe", "10.244.3.8", "home-1"),
            ],
            twins: BTreeMap::from([
                ("shop".into(), "shop-alpha".into()),
                ("db".into(), "db-alpha".into()),
            ]),
        }
    }

    fn policy(spec: Value) -> NetworkPolicy {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "shop", "labels": {"app": "web"},
                         "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}},
            "spec": spec,
        }))
        .unwrap()
    }

    fn twin(spec: Value) -> Value {
        serde_json::to_value(translate(&policy(spec), &inventory(), NODE)).unwrap()
    }

    fn block(ip: &str) -> Value {
        json!({"ipBlock": {"cidr": format!("{ip}/32")}})
    }

    #[test]
    fn same_namespace_pods_are_kept_by_selector_and_home_ones_by_address() {
        let t = twin(json!({"podSelector": {"matchLabels": {"app": "db"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}],
                         "ports": [{"port": 5432, "protocol": "TCP"}]}]}));
        assert_eq!(
            t["podSelector"],
            json!({"matchLabels": {"app": "db"}}),
            "kept: {t}"
        );
        assert_eq!(t["policyTypes"], json!(["Ingress"]), "written out: {t}");
        // The web pod in the twin by selector; those at home and on another provider by
        // address (the provider refuses the latter), in address order; never the one on this
        // node by address.
        assert_eq!(
            t["ingress"][0]["from"],
            json!([{"podSelector": {"matchLabels": {"app": "web"}}},
                   block("10.73.0.4"), block("10.244.1.5")]),
            "{t}"
        );
        assert_eq!(
            t["ingress"][0]["ports"],
            json!([{"port": 5432, "protocol": "TCP"}])
        );
    }

    #[test]
    fn an_empty_selector_is_every_pod_of_the_namespace() {
        let t = twin(json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]}));
        assert_eq!(
            t["ingress"][0]["from"],
            json!([{"podSelector": {}}, block("10.73.0.4"), block("10.244.1.5"), block("10.244.1.6")]),
            "{t}"
        );
    }

    #[test]
    fn namespace_selectors_become_twins_by_name_and_addresses() {
        let t = twin(json!({"podSelector": {},
            "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"tier": "data"}},
                                "podSelector": {"matchLabels": {"app": "pg"}}}]}]}));
        assert_eq!(t["policyTypes"], json!(["Ingress", "Egress"]), "{t}");
        assert_eq!(
            t["egress"][0]["to"],
            json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "db-alpha"}},
                    "podSelector": {"matchLabels": {"app": "pg"}}},
                   block("10.244.2.7")]),
            "{t}"
        );
        // Every namespace of team a (its own among them), any pod: the own twin by selector.
        let t = twin(json!({"podSelector": {},
            "ingress": [{"from": [{"namespaceSelector": {"matchExpressions": [
                {"key": "team", "operator": "In", "values": ["a"]}]}}]}]}));
        let from = t["ingress"][0]["from"].as_array().unwrap().clone();
        assert_eq!(
            from[0],
            json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "db-alpha"}}, "podSelector": {}})
        );
        assert_eq!(from[1], json!({"podSelector": {}}));
        let blocks: Vec<&str> = from[2..]
            .iter()
            .map(|p| p["ipBlock"]["cidr"].as_str().unwrap())
            .collect();
        assert_eq!(
            blocks,
            ["10.73.0.4", "10.244.1.5", "10.244.1.6", "10.244.2.7"].map(|b| format!("{b}/32"))
        );
        // NotIn, DoesNotExist: only tools, which has no twin: addresses only.
        let t = twin(json!({"podSelector": {},
            "ingress": [{"from": [{"namespaceSelector": {"matchExpressions": [
                {"key": "team", "operator": "NotIn", "values": ["a"]},
                {"key": "tier", "operator": "DoesNotExist"}]}}]}]}));
        assert_eq!(t["ingress"][0]["from"], json!([block("10.244.3.8")]), "{t}");
    }

    #[test]
    fn a_rule_whose_peers_select_nothing_is_dropped_not_opened() {
        // No namespace labelled so: the rule allows nothing, and must not become `from: []`.
        let t = twin(json!({"podSelector": {},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "nobody"}}}]},
                        {"from": [{"ipBlock": {"cidr": "192.0.2.0/24"}}]}],
            "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"team": "b"}},
                                "podSelector": {"matchLabels": {"app": "none"}}}]}]}));
        assert_eq!(
            t["ingress"],
            json!([{"from": [{"ipBlock": {"cidr": "192.0.2.0/24"}}]}]),
            "{t}"
        );
        assert_eq!(t["egress"], json!([]), "{t}");
        assert_eq!(
            t["policyTypes"],
            json!(["Ingress", "Egress"]),
            "egress still isolated: {t}"
        );
        // An operator not known selects nothing.
        let t = twin(json!({"podSelector": {},
            "ingress": [{"from": [{"namespaceSelector": {"matchExpressions": [
                {"key": "team", "operator": "Gt", "values": ["1"]}]}}]}]}));
        assert_eq!(t["ingress"], json!([]), "{t}");
    }

    #[test]
    fn default_deny_everyone_blocks_and_their_excepts_stay_as_they_are() {
        let deny = json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]});
        let t = twin(deny.clone());
        assert_eq!(t, deny, "default-deny both ways");
        let t = twin(
            json!({"podSelector": {}, "ingress": [{}], "egress": [{"ports": [{"port": 53, "protocol": "UDP"}]}]}),
        );
        assert_eq!(t["ingress"], json!([{}]), "everyone stays everyone: {t}");
        assert_eq!(
            t["egress"],
            json!([{"ports": [{"port": 53, "protocol": "UDP"}]}]),
            "{t}"
        );
        let b = json!({"ipBlock": {"cidr": "10.244.0.0/16", "except": ["10.244.1.0/24"]}});
        let t = twin(json!({"podSelector": {}, "ingress": [{"from": [b]}]}));
        assert_eq!(
            t["ingress"][0]["from"],
            json!([b]),
            "the provider remaps blocks: {t}"
        );
    }

    #[test]
    fn the_forge_copies_metadata_and_keeps_home_what_is_not_reflected() {
        let (tx, rx) = watch::channel(None);
        let forge = NetworkPolicies {
            node_name: NODE.into(),
            inventory: rx,
        };
        let home = policy(json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]}));
        assert!(
            forge.forge(&home).is_none(),
            "no inventory yet: nothing forged"
        );
        tx.send(Some(Arc::new(inventory()))).unwrap();
        let shadow = forge.forge(&home).unwrap();
        assert_eq!(shadow.metadata.labels, home.metadata.labels);
        assert_eq!(
            shadow.metadata.annotations, None,
            "kubectl's record left home"
        );
        assert_eq!(shadow.spec.template, translate(&home, &inventory(), NODE));
        let mut never = home.clone();
        never.metadata.annotations = Some(BTreeMap::from([(
            crate::configs::REFLECT.into(),
            "never".into(),
        )]));
        assert!(forge.forge(&never).is_none());
        let mut from_peer = home.clone();
        from_peer.metadata.labels = Some(BTreeMap::from([
            (MANAGED_BY.into(), REFLECTED.into()),
            (REFLECTED_FROM.into(), "gamma".into()),
        ]));
        assert!(forge.forge(&from_peer).is_none(), "never reflected back");
    }

    #[test]
    fn home_pods_by_their_own_address_only() {
        let p = |v: Value| home_pod(&serde_json::from_value::<Pod>(v).unwrap());
        let base = json!({"metadata": {"name": "a", "namespace": "shop", "labels": {"app": "web"}},
            "spec": {"nodeName": "n1", "containers": []},
            "status": {"phase": "Running", "podIP": "10.244.1.5", "podIPs": [{"ip": "fd00::5"}, {"ip": "10.244.1.5"}]}});
        let got = p(base.clone()).unwrap();
        assert_eq!(
            (got.ip, got.node.as_deref()),
            ("10.244.1.5".parse().unwrap(), Some("n1"))
        );
        let mut host = base.clone();
        host["spec"]["hostNetwork"] = json!(true);
        assert!(p(host).is_none(), "the node's address is not the pod's");
        let mut done = base.clone();
        done["status"]["phase"] = json!("Succeeded");
        assert!(p(done).is_none(), "its address may be another pod's now");
        let mut unaddressed = base;
        unaddressed["status"] = json!({"phase": "Pending"});
        assert!(p(unaddressed).is_none());
    }
}
