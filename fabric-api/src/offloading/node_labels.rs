//! Which of the labels a provider advertises its consumer's virtual node may carry. A
//! provider writes them (its ResourceSlices' `status.nodeLabels`), so it must not be able to
//! make the virtual node pass for one of the consumer's own nodes: labels under Kubernetes'
//! reserved prefixes (`kubernetes.io/`, `k8s.io/` and their subdomains, such as
//! `node-role.kubernetes.io/` and `node.kubernetes.io/`) steer the consumer's
//! infrastructure pods (node roles, instance types, OS), and those under the fabric's own
//! prefix (`fabric.io/`) are the fabric's word about the node. Only the topology labels of
//! [`ALLOWED`] pass from those domains; a provider's own labels (`example.com/gpu`, or no
//! prefix at all) pass as they are.
use std::collections::BTreeMap;

/// The reserved labels a provider may still set: where its nodes are.
pub const ALLOWED: [&str; 2] = [
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
];

/// The label domains (and their subdomains) reserved to the consumer's cluster and the
/// fabric.
pub const RESERVED_DOMAINS: [&str; 3] = ["kubernetes.io", "k8s.io", "fabric.io"];

/// Whether a provider may set label `key` on the consumer's virtual node.
pub fn allowed(key: &str) -> bool {
    if ALLOWED.contains(&key) {
        return true;
    }
    let Some((prefix, _)) = key.split_once('/') else {
        return true;
    };
    let prefix = prefix.to_ascii_lowercase();
    !RESERVED_DOMAINS
        .iter()
        .any(|d| prefix == *d || prefix.ends_with(&format!(".{d}")))
}

/// `labels` split into those the virtual node carries and the keys refused.
pub fn split(labels: &BTreeMap<String, String>) -> (BTreeMap<String, String>, Vec<String>) {
    let mut kept = BTreeMap::new();
    let mut refused = Vec::new();
    for (k, v) in labels {
        if allowed(k) {
            kept.insert(k.clone(), v.clone());
        } else {
            refused.push(k.clone());
        }
    }
    (kept, refused)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_prefixes_and_their_subdomains_are_refused_but_topology() {
        for key in [
            "kubernetes.io/hostname",
            "kubernetes.io/os",
            "node-role.kubernetes.io/control-plane",
            "node.kubernetes.io/instance-type",
            "kubelet.kubernetes.io/x",
            "k8s.io/x",
            "sub.k8s.io/x",
            "Node-Role.Kubernetes.IO/master",
            "topology.kubernetes.io/other",
            "fabric.io/type",
            "offloading.fabric.io/x",
        ] {
            assert!(!allowed(key), "{key}");
        }
        for key in [
            "topology.kubernetes.io/zone",
            "topology.kubernetes.io/region",
            "node-type",
            "example.com/gpu",
            "notkubernetes.io/x",
            "kubernetes.io.example.com/x",
        ] {
            assert!(allowed(key), "{key}");
        }
    }

    #[test]
    fn split_keeps_the_allowed_and_names_the_refused() {
        let labels = BTreeMap::from([
            ("node-type".to_owned(), "gpu".to_owned()),
            (
                "node-role.kubernetes.io/control-plane".to_owned(),
                String::new(),
            ),
            ("topology.kubernetes.io/zone".to_owned(), "z1".to_owned()),
        ]);
        let (kept, refused) = split(&labels);
        assert_eq!(
            kept.keys().collect::<Vec<_>>(),
            ["node-type", "topology.kubernetes.io/zone"]
        );
        assert_eq!(refused, ["node-role.kubernetes.io/control-plane"]);
    }
}
