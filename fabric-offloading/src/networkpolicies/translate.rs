//! The real NetworkPolicy of a consumer's ShadowNetworkPolicy, pure. Who the consumer is
//! comes from the namespace (as for EndpointSlices: [`crate::endpointslices::translate::consumer_of`]),
//! never from what the consumer writes.
//!
//! NetworkPolicies add up: a pod selected by several is allowed what any of them allows. So a
//! consumer's policy could widen what the provider's admin allows the consumer's pods (its
//! own policies in the twin), and only what the consumer can vouch for is kept:
//! - the policy's `podSelector`, `policyTypes` and ports as they are (they select and
//!   concern the twin's pods only: the consumer's);
//! - a peer selecting pods by `podSelector` alone (the twin's own pods);
//! - a peer whose `namespaceSelector` names one namespace of this consumer (a twin or its
//!   tenant namespace) by `kubernetes.io/metadata.name` and nothing else; any other selects
//!   namespaces of the provider or of other tenants, and is refused;
//! - an `ipBlock`, for the part of it that is the consumer's pod or external addresses,
//!   remapped to how this cluster sees them (host part kept); a block that reaches beyond
//!   them keeps only that part (`0.0.0.0/0` at home is the consumer's two CIDRs here: this
//!   cluster's own network and the internet through it are not the consumer's to open);
//!   `except`s are clipped and remapped the same way.
//!
//! A rule whose peers are all refused is dropped: an empty peer list would allow everyone.
//! Every refusal is named, for a Warning Event on the shadow.
//!
//! One rule is added: offloaded pods resolve names through this cluster's DNS, not the
//! consumer's. A policy that lets its pods reach DNS (an egress rule with peers and port 53)
//! lets them reach this cluster's DNS pods ([`ClusterDns`], the provider admin's) on those
//! ports too; without it, such a policy translated faithfully breaks name resolution in the
//! twin.
use std::collections::BTreeMap;

use fabric_api::{
    names::{
        annotation::REFLECTED_HASH,
        network_policy::{MANAGED_BY, NAMESPACE_NAME, REFLECTED},
    },
    networking::remap::{Remap, Remaps},
    offloading::v1alpha1::ShadowNetworkPolicy,
};
use ipnetwork::Ipv4Network;
use k8s_openapi::{
    api::networking::v1::{
        IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule,
        NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
    },
    apimachinery::pkg::{
        apis::meta::v1::{LabelSelector, OwnerReference},
        util::intstr::IntOrString,
    },
};
use kube::{Resource, ResourceExt, api::ObjectMeta};

/// Where this cluster's DNS pods are (the provider admin's setting, `fabric-controller
/// sharing --cluster-dns NAMESPACE/KEY=VALUE[,KEY=VALUE...]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterDns {
    pub namespace: String,
    pub pod_labels: BTreeMap<String, String>,
}

impl Default for ClusterDns {
    /// CoreDNS as kubeadm and most distributions run it.
    fn default() -> Self {
        Self {
            namespace: "kube-system".into(),
            pod_labels: BTreeMap::from([("k8s-app".into(), "kube-dns".into())]),
        }
    }
}

impl std::str::FromStr for ClusterDns {
    type Err = String;

    /// `NAMESPACE/KEY=VALUE[,KEY=VALUE...]`: the namespace and the labels of the DNS pods.
    fn from_str(s: &str) -> Result<Self, String> {
        let rule = "must be NAMESPACE/KEY=VALUE[,KEY=VALUE...] (e.g. kube-system/k8s-app=kube-dns)";
        let (namespace, labels) = s
            .split_once('/')
            .filter(|(ns, l)| !ns.is_empty() && !l.is_empty())
            .ok_or_else(|| format!("{s:?}: {rule}"))?;
        let mut pod_labels = BTreeMap::new();
        for kv in labels.split(',') {
            let (k, v) = kv
                .split_once('=')
                .filter(|(k, _)| !k.is_empty())
                .ok_or_else(|| format!("{s:?}: label {kv:?}: {rule}"))?;
            pod_labels.insert(k.to_owned(), v.to_owned());
        }
        Ok(Self {
            namespace: namespace.to_owned(),
            pod_labels,
        })
    }
}

/// Whether `p` lets DNS through: port 53, or a range over it, or a port named as the DNS
/// pods name theirs (`dns`, `dns-tcp`).
fn dns_port(p: &NetworkPolicyPort) -> bool {
    match &p.port {
        Some(IntOrString::Int(n)) => *n == 53 || (*n < 53 && p.end_port.is_some_and(|e| e >= 53)),
        Some(IntOrString::String(name)) => name == "dns" || name == "dns-tcp",
        None => false,
    }
}

/// The rule that lets the twin's pods reach `dns` as the consumer's policy lets them reach
/// DNS, if it does: egress rules with peers (one without peers reaches everyone already)
/// and ports covering 53. Its ports are those ports, narrowed to 53.
fn cluster_dns_rule(
    egress: &[NetworkPolicyEgressRule],
    dns: &ClusterDns,
) -> Option<NetworkPolicyEgressRule> {
    let mut ports: Vec<NetworkPolicyPort> = Vec::new();
    for r in egress
        .iter()
        .filter(|r| r.to.as_ref().is_some_and(|t| !t.is_empty()))
    {
        for p in r.ports.iter().flatten().filter(|p| dns_port(p)) {
            let narrowed = NetworkPolicyPort {
                port: match &p.port {
                    Some(IntOrString::Int(_)) => Some(IntOrString::Int(53)),
                    named => named.clone(),
                },
                end_port: None,
                protocol: Some(p.protocol.clone().unwrap_or_else(|| "TCP".into())),
            };
            if !ports.contains(&narrowed) {
                ports.push(narrowed);
            }
        }
    }
    (!ports.is_empty()).then(|| NetworkPolicyEgressRule {
        to: Some(vec![NetworkPolicyPeer {
            namespace_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    NAMESPACE_NAME.to_owned(),
                    dns.namespace.clone(),
                )])),
                ..Default::default()
            }),
            pod_selector: Some(LabelSelector {
                match_labels: Some(dns.pod_labels.clone()),
                ..Default::default()
            }),
            ip_block: None,
        }]),
        ports: Some(ports),
    })
}

/// The real policy, and what was refused on the way (one line each).
#[derive(Debug, Clone, PartialEq)]
pub struct Translated {
    pub policy: NetworkPolicy,
    pub refused: Vec<String>,
}

/// `n` as a network (host bits cleared: `10.244.1.5/16` is `10.244.0.0/16`).
fn network(n: Ipv4Network) -> Ipv4Network {
    Ipv4Network::new(n.network(), n.prefix()).expect("a prefix of a network is valid")
}

/// Whether `inner` lies within `outer`.
fn within(inner: Ipv4Network, outer: Ipv4Network) -> bool {
    inner.prefix() >= outer.prefix() && outer.contains(inner.network())
}

/// The part of `block` (the consumer's address) that is `r`'s real CIDR, remapped; `None`:
/// none of it.
fn clip(block: Ipv4Network, r: &Remap) -> Option<Ipv4Network> {
    if within(block, r.real) {
        let seen = r.map(block.network())?;
        Ipv4Network::new(seen, block.prefix()).ok()
    } else if within(r.real, block) {
        Some(r.seen)
    } else {
        None
    }
}

/// The blocks `b` (in the consumer's addresses) is here, and why any of it is refused.
pub fn block(b: &IPBlock, remaps: &Remaps) -> (Vec<IPBlock>, Option<String>) {
    let parse = |s: &str| s.parse::<Ipv4Network>().ok().map(network);
    let Some(cidr) = parse(&b.cidr) else {
        return (
            Vec::new(),
            Some(format!("ipBlock {}: not an IPv4 CIDR", b.cidr)),
        );
    };
    let mut excepts = Vec::new();
    for e in b.except.iter().flatten() {
        match parse(e) {
            Some(n) => excepts.push(n),
            // An exception not understood cannot be applied: the block would allow more.
            None => {
                return (
                    Vec::new(),
                    Some(format!(
                        "ipBlock {}: except {e} is not an IPv4 CIDR",
                        b.cidr
                    )),
                );
            }
        }
    }
    let mut out = Vec::new();
    for r in [&remaps.pod, &remaps.external] {
        let Some(here) = clip(cidr, r) else { continue };
        // Each exception, as far as it is in this part: a part wholly excepted goes.
        let mut except = Vec::new();
        let mut gone = false;
        for e in &excepts {
            if within(here_real(cidr, r), *e) {
                gone = true;
            } else if let Some(x) = clip(*e, r).filter(|x| within(*x, here)) {
                except.push(x.to_string());
            }
        }
        if !gone {
            out.push(IPBlock {
                cidr: here.to_string(),
                except: (!except.is_empty()).then_some(except),
            });
        }
    }
    let whole = within(cidr, remaps.pod.real) || within(cidr, remaps.external.real);
    let why = (!whole).then(|| {
        format!(
            "ipBlock {}: only the consumer's pod ({}) and external ({}) addresses in it are allowed here",
            b.cidr, remaps.pod.real, remaps.external.real
        )
    });
    (out, why)
}

/// The consumer's addresses a block covers in `r`'s real CIDR (before the remap).
fn here_real(block: Ipv4Network, r: &Remap) -> Ipv4Network {
    if within(block, r.real) { block } else { r.real }
}

/// The peers `peer` is here (none: refused, said in `refused`); `ours` says whether a
/// namespace is the consumer's.
fn peer(
    p: &NetworkPolicyPeer,
    remaps: &Remaps,
    ours: &dyn Fn(&str) -> bool,
    refused: &mut Vec<String>,
) -> Vec<NetworkPolicyPeer> {
    if let Some(b) = &p.ip_block {
        let (blocks, why) = block(b, remaps);
        refused.extend(why);
        return blocks
            .into_iter()
            .map(|b| NetworkPolicyPeer {
                ip_block: Some(b),
                ..Default::default()
            })
            .collect();
    }
    match &p.namespace_selector {
        None if p.pod_selector.is_some() => vec![p.clone()],
        None => Vec::new(),
        Some(sel) => {
            let named = match (&sel.match_labels, &sel.match_expressions) {
                (Some(l), None) if l.len() == 1 => l.get(NAMESPACE_NAME),
                (Some(l), Some(e)) if l.len() == 1 && e.is_empty() => l.get(NAMESPACE_NAME),
                _ => None,
            };
            match named {
                Some(ns) if ours(ns) => vec![p.clone()],
                _ => {
                    refused.push(format!(
                        "namespaceSelector {}: selects namespaces that are not the consumer's (only one of its twins, by {NAMESPACE_NAME}, is allowed)",
                        serde_json::to_string(sel).unwrap_or_default()
                    ));
                    Vec::new()
                }
            }
        }
    }
}

/// A rule's peers here: `Ok(None)` everyone (as in the shadow), `Err(())` none left of a
/// list that named some (the rule is dropped).
fn peers(
    list: Option<&Vec<NetworkPolicyPeer>>,
    remaps: &Remaps,
    ours: &dyn Fn(&str) -> bool,
    refused: &mut Vec<String>,
) -> Result<Option<Vec<NetworkPolicyPeer>>, ()> {
    let Some(list) = list.filter(|l| !l.is_empty()) else {
        return Ok(None);
    };
    let mut out: Vec<NetworkPolicyPeer> = Vec::new();
    for p in list.iter().flat_map(|p| peer(p, remaps, ours, refused)) {
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

/// The real NetworkPolicy of `shadow` (same name and namespace, its labels with our
/// [`MANAGED_BY`], owned by the shadow), each peer through `remaps` and `ours` (whether a
/// namespace is one of the consumer's).
pub fn real_policy(
    shadow: &ShadowNetworkPolicy,
    remaps: &Remaps,
    ours: &dyn Fn(&str) -> bool,
    dns: &ClusterDns,
) -> Translated {
    let spec = &shadow.spec.template;
    let mut refused = Vec::new();
    let policy_types = spec.policy_types.clone().unwrap_or_else(|| {
        let mut t = vec!["Ingress".to_owned()];
        if spec.egress.as_ref().is_some_and(|e| !e.is_empty()) {
            t.push("Egress".to_owned());
        }
        t
    });
    let dropped = |dir: &str, i: usize, refused: &mut Vec<String>| {
        refused.push(format!(
            "{dir} rule {i}: none of its peers is allowed here, the rule is left out"
        ));
    };
    let ingress = spec.ingress.as_ref().map(|rules| {
        let mut out = Vec::new();
        for (i, r) in rules.iter().enumerate() {
            match peers(r.from.as_ref(), remaps, ours, &mut refused) {
                Ok(from) => out.push(NetworkPolicyIngressRule {
                    from,
                    ports: r.ports.clone(),
                }),
                Err(()) => dropped("ingress", i, &mut refused),
            }
        }
        out
    });
    let egress = spec.egress.as_ref().map(|rules| {
        let mut out = Vec::new();
        for (i, r) in rules.iter().enumerate() {
            match peers(r.to.as_ref(), remaps, ours, &mut refused) {
                Ok(to) => out.push(NetworkPolicyEgressRule {
                    to,
                    ports: r.ports.clone(),
                }),
                Err(()) => dropped("egress", i, &mut refused),
            }
        }
        out.extend(cluster_dns_rule(rules, dns));
        out
    });
    let mut labels = shadow.labels().clone();
    labels.insert(MANAGED_BY.to_owned(), REFLECTED.to_owned());
    let annotations: BTreeMap<String, String> = shadow
        .annotations()
        .iter()
        .filter(|(k, _)| k.as_str() != REFLECTED_HASH)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let owner = OwnerReference {
        api_version: ShadowNetworkPolicy::api_version(&()).into_owned(),
        kind: ShadowNetworkPolicy::kind(&()).into_owned(),
        name: shadow.name_any(),
        uid: shadow.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    };
    let policy = NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(shadow.name_any()),
            namespace: shadow.namespace(),
            labels: Some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: spec.pod_selector.clone(),
            policy_types: Some(policy_types),
            ingress,
            egress,
        }),
    };
    Translated { policy, refused }
}

/// Whether `current` (the cluster's copy) already says all that `desired` says (what the
/// server defaults, a port's protocol, taken as defaulted).
pub fn written(current: &NetworkPolicy, desired: &NetworkPolicy) -> bool {
    let spec = |p: &NetworkPolicy| {
        let mut v = serde_json::to_value(p.spec.clone().unwrap_or_default()).unwrap_or_default();
        default_protocols(&mut v);
        v
    };
    let owners = |p: &NetworkPolicy| -> Vec<(String, String)> {
        p.owner_references()
            .iter()
            .map(|o| (o.name.clone(), o.uid.clone()))
            .collect()
    };
    current.labels() == desired.labels()
        && current.annotations() == desired.annotations()
        && owners(current) == owners(desired)
        && spec(current) == spec(desired)
}

/// Every port with its protocol, as the API server defaults it (TCP).
fn default_protocols(v: &mut serde_json::Value) {
    for dir in ["ingress", "egress"] {
        for rule in v[dir].as_array_mut().into_iter().flatten() {
            for port in rule["ports"].as_array_mut().into_iter().flatten() {
                if port.get("protocol").is_none() {
                    port["protocol"] = "TCP".into();
                }
            }
        }
    }
}

/// Whether `policy` is one this controller writes (ours to update or delete).
pub fn ours(policy: &NetworkPolicy) -> bool {
    policy.labels().get(MANAGED_BY).map(String::as_str) == Some(REFLECTED)
}

#[cfg(test)]
mod tests {
    use fabric_api::networking::v1alpha1::{
        ClusterCidrs, Configuration, ConfigurationSpec, ConfigurationStatus,
    };
    use serde_json::{Value, json};

    use super::*;

    /// The consumer: pods 10.244.0.0/16 seen here as 10.245.0.0/16, external 10.70.0.0/16 as
    /// 10.90.0.0/16.
    fn remaps() -> Remaps {
        let cidrs = |pod: &str, external: &str| ClusterCidrs {
            pod: pod.parse().unwrap(),
            external: external.parse().unwrap(),
        };
        let mut c = Configuration::new(
            "alpha",
            ConfigurationSpec {
                cluster_id: "alpha".into(),
                remote: cidrs("10.244.0.0/16", "10.70.0.0/16"),
            },
        );
        c.status = Some(ConfigurationStatus {
            remote: Some(cidrs("10.245.0.0/16", "10.90.0.0/16")),
            ..Default::default()
        });
        Remaps::of(&c).unwrap()
    }

    fn shadow(template: Value) -> ShadowNetworkPolicy {
        serde_json::from_value(json!({
            "apiVersion": "offloading.fabric.io/v1alpha1", "kind": "ShadowNetworkPolicy",
            "metadata": {"name": "p", "namespace": "shop-alpha", "uid": "u1",
                         "labels": {"app": "web", "fabric.io/reflected-from": "alpha"},
                         "annotations": {REFLECTED_HASH: "abc", "team": "shop"}},
            "spec": {"template": template},
        }))
        .unwrap()
    }

    /// The consumer's namespaces here: its twins.
    fn ours(ns: &str) -> bool {
        ns.ends_with("-alpha")
    }

    fn real(template: Value) -> (Value, Vec<String>) {
        let t = real_policy(&shadow(template), &remaps(), &ours, &ClusterDns::default());
        (serde_json::to_value(t.policy.spec).unwrap(), t.refused)
    }

    fn blocks(b: Value) -> (Vec<IPBlock>, Option<String>) {
        block(&serde_json::from_value(b).unwrap(), &remaps())
    }

    fn cidrs(v: &[IPBlock]) -> Vec<(String, Vec<String>)> {
        v.iter()
            .map(|b| (b.cidr.clone(), b.except.clone().unwrap_or_default()))
            .collect()
    }

    #[test]
    fn home_addresses_are_remapped_host_part_kept() {
        let (b, why) = blocks(json!({"cidr": "10.244.1.5/32"}));
        assert_eq!(cidrs(&b), [("10.245.1.5/32".into(), vec![])]);
        assert_eq!(why, None);
        let (b, _) = blocks(json!({"cidr": "10.70.3.0/24"}));
        assert_eq!(cidrs(&b), [("10.90.3.0/24".into(), vec![])]);
        // Host bits set: taken as its network.
        let (b, _) = blocks(json!({"cidr": "10.244.1.5/24"}));
        assert_eq!(cidrs(&b), [("10.245.1.0/24".into(), vec![])]);
    }

    #[test]
    fn what_is_not_the_consumers_is_refused_and_wide_blocks_narrowed() {
        // A pod of a third cluster, the provider's own service range: nothing.
        for cidr in ["10.73.0.4/32", "10.96.0.0/12", "10.245.1.5/32"] {
            let (b, why) = blocks(json!({"cidr": cidr}));
            assert!(b.is_empty(), "{cidr}: {b:?}");
            assert!(why.unwrap().contains(cidr));
        }
        // Everything at home is the consumer's two CIDRs here, nothing more.
        let (b, why) = blocks(json!({"cidr": "0.0.0.0/0"}));
        assert_eq!(
            cidrs(&b),
            [
                ("10.245.0.0/16".into(), vec![]),
                ("10.90.0.0/16".into(), vec![])
            ]
        );
        assert!(why.unwrap().contains("only the consumer's"));
        let (b, _) = blocks(json!({"cidr": "not-a-cidr"}));
        assert!(b.is_empty());
    }

    #[test]
    fn excepts_are_clipped_and_remapped_with_their_block() {
        let (b, why) =
            blocks(json!({"cidr": "10.244.0.0/16", "except": ["10.244.1.0/24", "10.244.2.7/32"]}));
        assert_eq!(
            cidrs(&b),
            [(
                "10.245.0.0/16".into(),
                vec!["10.245.1.0/24".into(), "10.245.2.7/32".into()]
            )]
        );
        assert_eq!(why, None);
        // 0.0.0.0/0 except the consumer's external CIDR (and a range of nobody's here): only
        // its pods, no exception left to say.
        let (b, _) =
            blocks(json!({"cidr": "0.0.0.0/0", "except": ["10.64.0.0/10", "192.168.0.0/16"]}));
        assert_eq!(cidrs(&b), [("10.245.0.0/16".into(), vec![])]);
        // An exception not understood: the block would allow more than asked, so none of it.
        let (b, why) = blocks(json!({"cidr": "10.244.0.0/16", "except": ["bad"]}));
        assert!(b.is_empty() && why.unwrap().contains("bad"));
    }

    #[test]
    fn selectors_of_the_twin_and_of_the_consumers_namespaces_only() {
        let (spec, refused) = real(json!({"podSelector": {"matchLabels": {"app": "db"}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [
                {"podSelector": {"matchLabels": {"app": "web"}}},
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "db-alpha"}},
                 "podSelector": {"matchLabels": {"app": "pg"}}},
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}},
                {"namespaceSelector": {}},
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "db-alpha", "x": "y"}}},
                {"ipBlock": {"cidr": "10.244.1.5/32"}},
            ], "ports": [{"port": 5432}]}]}));
        assert_eq!(spec["podSelector"], json!({"matchLabels": {"app": "db"}}));
        assert_eq!(
            spec["ingress"],
            json!([{"from": [
                {"podSelector": {"matchLabels": {"app": "web"}}},
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "db-alpha"}},
                 "podSelector": {"matchLabels": {"app": "pg"}}},
                {"ipBlock": {"cidr": "10.245.1.5/32"}},
            ], "ports": [{"port": 5432}]}]),
            "{spec}"
        );
        assert_eq!(refused.len(), 3, "{refused:?}");
        assert!(
            refused.iter().all(|r| r.contains("namespaceSelector")),
            "{refused:?}"
        );
    }

    #[test]
    fn a_rule_left_without_peers_is_dropped_never_opened() {
        let (spec, refused) = real(json!({"podSelector": {},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"ipBlock": {"cidr": "10.96.0.1/32"}}]}, {}],
            "egress": [{"to": [{"namespaceSelector": {}}], "ports": [{"port": 443}]}]}));
        assert_eq!(spec["ingress"], json!([{}]), "{spec}");
        assert_eq!(spec["egress"], json!([]), "{spec}");
        assert_eq!(spec["policyTypes"], json!(["Ingress", "Egress"]));
        assert!(
            refused.iter().any(|r| r.contains("ingress rule 0")),
            "{refused:?}"
        );
        assert!(
            refused.iter().any(|r| r.contains("egress rule 0")),
            "{refused:?}"
        );
        // Default deny: as it is; policy types written out when the shadow has none.
        let (spec, refused) = real(json!({"podSelector": {}, "egress": [{}]}));
        assert_eq!(spec["policyTypes"], json!(["Ingress", "Egress"]));
        assert!(refused.is_empty());
    }

    #[test]
    fn the_real_policy_is_ours_owned_by_its_shadow() {
        let dns = ClusterDns::default();
        let t = real_policy(&shadow(json!({"podSelector": {}})), &remaps(), &ours, &dns);
        let m = &t.policy.metadata;
        assert_eq!(
            (m.name.as_deref(), m.namespace.as_deref()),
            (Some("p"), Some("shop-alpha"))
        );
        assert!(ours_policy(&t.policy));
        assert_eq!(m.labels.as_ref().unwrap()["app"], "web");
        assert_eq!(
            m.annotations,
            Some(BTreeMap::from([("team".to_owned(), "shop".to_owned())]))
        );
        let owner = &m.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("ShadowNetworkPolicy", "u1")
        );
        // As the API server keeps it (protocols defaulted): already written.
        let mut stored = t.policy.clone();
        assert!(written(&stored, &t.policy));
        let with_port = real_policy(
            &shadow(json!({"podSelector": {}, "ingress": [{"ports": [{"port": 80}]}]})),
            &remaps(),
            &ours,
            &dns,
        )
        .policy;
        stored = with_port.clone();
        stored.spec.as_mut().unwrap().ingress.as_mut().unwrap()[0]
            .ports
            .as_mut()
            .unwrap()[0]
            .protocol = Some("TCP".into());
        assert!(written(&stored, &with_port));
        assert!(!written(&t.policy, &with_port));
        let mut admin = t.policy.clone();
        admin.metadata.labels = None;
        assert!(!ours_policy(&admin));
    }

    fn ours_policy(p: &NetworkPolicy) -> bool {
        super::ours(p)
    }

    #[test]
    fn a_policy_that_lets_dns_through_lets_it_reach_this_cluster_s_dns() {
        // Egress isolated, DNS allowed to the home kube-dns pods (an address there) and TCP
        // to one home block: the twin's pods may also ask this cluster's DNS, on those ports.
        let (spec, _) = real(
            json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [
                {"to": [{"ipBlock": {"cidr": "10.244.0.10/32"}}],
                 "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53}, {"port": 80}]},
                {"to": [{"ipBlock": {"cidr": "10.244.2.0/24"}}], "ports": [{"port": 5432}]},
            ]}),
        );
        let added = &spec["egress"][2];
        assert_eq!(
            added["to"],
            json!([{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME: "kube-system"}},
                    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}]),
            "{spec}"
        );
        assert_eq!(
            added["ports"],
            json!([{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}])
        );
        assert_eq!(spec["egress"].as_array().unwrap().len(), 3);
        // A range over 53 and the DNS pods' port names count; other ports do not.
        let (spec, _) = real(json!({"podSelector": {}, "egress": [
            {"to": [{"podSelector": {}}], "ports": [{"port": 1, "endPort": 100, "protocol": "UDP"},
                                                    {"port": "dns-tcp"}]}]}));
        assert_eq!(
            spec["egress"][1]["ports"],
            json!([{"port": 53, "protocol": "UDP"}, {"port": "dns-tcp", "protocol": "TCP"}])
        );
        for no_dns in [
            json!({"podSelector": {}, "egress": [{"to": [{"podSelector": {}}], "ports": [{"port": 80}]}]}),
            // No peers: it reaches everyone already, this cluster's DNS included.
            json!({"podSelector": {}, "egress": [{"ports": [{"port": 53}]}]}),
            // Every port to some peers is not DNS to anyone.
            json!({"podSelector": {}, "egress": [{"to": [{"podSelector": {}}]}]}),
            json!({"podSelector": {}, "policyTypes": ["Egress"]}),
        ] {
            let (spec, _) = real(no_dns.clone());
            let rules = spec["egress"].as_array().map_or(0, Vec::len);
            let asked = no_dns["egress"].as_array().map_or(0, Vec::len);
            assert_eq!(rules, asked, "{no_dns} became {spec}");
        }
    }

    #[test]
    fn the_cluster_dns_setting_parses_or_says_the_rule() {
        let d: ClusterDns = "dns/app=coredns,tier=infra".parse().unwrap();
        assert_eq!(d.namespace, "dns");
        assert_eq!(d.pod_labels.len(), 2);
        assert_eq!(d.pod_labels["tier"], "infra");
        for bad in [
            "kube-system",
            "/k=v",
            "kube-system/",
            "kube-system/k8s-app",
            "ns/=v",
        ] {
            let e = bad.parse::<ClusterDns>().unwrap_err();
            assert!(e.contains("NAMESPACE/KEY=VALUE"), "{bad}: {e}");
        }
    }
}
