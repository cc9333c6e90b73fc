//! The consumer's namespace offloading, the pure part: which providers a NamespaceOffloading
//! selects (over its virtual nodes' labels, aggregated per provider), the full list of
//! mappings this cluster asks each provider for, a NamespaceOffloading's status from its
//! providers' answers, and when an unoffload may let go of a provider. [`super::consumer`]
//! is the I/O around it.
use std::collections::{BTreeMap, BTreeSet};

use fabric_api::{
    names::{label, taint},
    offloading::{
        namespaces::{self, BadSelector, twin_name},
        node_labels,
        v1alpha1::{
            ClusterOffloading, MappingPhase, NamespaceMapStatus, NamespaceMapping,
            NamespaceOffloading, NamespaceOffloadingStatus, PodOffloadingStrategy,
            StorageRetention, TwinPhase, VirtualNode,
        },
    },
};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

/// The label every Node carries with its name (the virtual kubelet sets it on its Node too).
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// The labels a selector sees of virtual node `vn`: its Node's (`node`) when the virtual
/// kubelet made it, else those the virtual kubelet will give it (the labels the provider
/// advertised that a virtual node may carry, the fabric's type and provider id, its hostname).
pub fn virtual_node_labels(
    vn: &VirtualNode,
    node: Option<&BTreeMap<String, String>>,
) -> BTreeMap<String, String> {
    if let Some(labels) = node {
        return labels.clone();
    }
    let (mut labels, _refused) = node_labels::split(&vn.spec.labels);
    labels.extend([
        (
            label::NODE_TYPE.to_owned(),
            label::VIRTUAL_NODE_TYPE.to_owned(),
        ),
        (label::REMOTE_CLUSTER.to_owned(), vn.spec.cluster_id.clone()),
        (HOSTNAME_LABEL.to_owned(), vn.spec.node_name.clone()),
    ]);
    labels
}

/// The providers this cluster has a virtual node of, by cluster id: the labels of each of
/// their virtual nodes.
pub type Providers = BTreeMap<String, Vec<BTreeMap<String, String>>>;

/// The providers of `vns`, each virtual node's labels from `node` (its Node's labels, by
/// node name, when it exists).
pub fn providers<'a>(
    vns: impl IntoIterator<Item = &'a VirtualNode>,
    node: impl Fn(&str) -> Option<BTreeMap<String, String>>,
) -> Providers {
    let mut out = Providers::new();
    for vn in vns {
        let labels = virtual_node_labels(vn, node(&vn.spec.node_name).as_ref());
        out.entry(vn.spec.cluster_id.clone())
            .or_default()
            .push(labels);
    }
    out
}

/// Which providers `nso` selects: a provider is when any of its virtual nodes is. A selector
/// that cannot be evaluated selects as the status last said (nothing is added or dropped
/// because of it), with the reason.
pub fn selected(
    nso: &NamespaceOffloading,
    providers: &Providers,
) -> (BTreeSet<String>, Option<BadSelector>) {
    let selector = nso.spec.cluster_selector.as_ref();
    let mut out = BTreeSet::new();
    for (id, nodes) in providers {
        for labels in nodes {
            match namespaces::selects(selector, labels) {
                Ok(true) => {
                    out.insert(id.clone());
                    break;
                }
                Ok(false) => {}
                Err(e) => {
                    let before = nso
                        .status
                        .iter()
                        .flat_map(|s| &s.clusters)
                        .filter(|c| c.selected)
                        .map(|c| c.cluster_id.clone())
                        .collect();
                    return (before, Some(e));
                }
            }
        }
    }
    (out, None)
}

/// Whether a NamespaceOffloading asks for twins: it is named `offloading` and is not being
/// deleted.
pub fn live(nso: &NamespaceOffloading) -> bool {
    nso.name_any() == namespaces::NAME && nso.metadata.deletion_timestamp.is_none()
}

/// Everything this cluster (`me`) asks `provider` for: one mapping per live
/// NamespaceOffloading of `offloadings` that selects it, by home namespace; nothing once it has
/// no virtual node here.
pub fn mappings<'a>(
    offloadings: impl IntoIterator<Item = &'a NamespaceOffloading>,
    provider: &str,
    providers: &Providers,
    me: &str,
) -> Vec<NamespaceMapping> {
    let mut out = BTreeMap::new();
    if !providers.contains_key(provider) {
        return Vec::new();
    }
    for nso in offloadings.into_iter().filter(|n| live(n)) {
        let Some(home) = nso.namespace() else {
            continue;
        };
        if !selected(nso, providers).0.contains(provider) {
            continue;
        }
        if let Some(remote) = twin_name(&nso.spec, &home, me) {
            let mapping = NamespaceMapping {
                home: home.clone(),
                remote,
                storage_retention: Some(nso.spec.storage_retention),
            };
            out.insert(home, mapping);
        }
    }
    out.into_values().collect()
}

/// What this cluster learnt of a provider's answer.
#[derive(Debug, Clone, Copy)]
pub enum Answer<'a> {
    /// The status of its NamespaceMap (None: not answered yet).
    Map(Option<&'a NamespaceMapStatus>),
    /// It could not be reached (why).
    Unreachable(&'a str),
}

/// Whether the provider's map status still lists a twin of `home` (made, refused or being
/// removed).
pub fn listed(status: Option<&NamespaceMapStatus>, home: &str) -> bool {
    status.is_some_and(|s| s.namespaces.iter().any(|t| t.home == home))
}

/// One provider's entry in the status of the NamespaceOffloading of `home`: its twin as the
/// provider answered (Accepted: Ready; Refused with its reason; Terminating; not listed:
/// Creating when selected), or, out of reach, the last answer (`previous`) saying so. None:
/// neither selected nor with a twin.
pub fn cluster(
    id: &str,
    selected: bool,
    home: &str,
    answer: Answer<'_>,
    previous: Option<&ClusterOffloading>,
) -> Option<ClusterOffloading> {
    let mut c = ClusterOffloading {
        cluster_id: id.to_owned(),
        selected,
        ..Default::default()
    };
    match answer {
        Answer::Map(status) => {
            let twin = status.and_then(|s| s.namespaces.iter().find(|t| t.home == home));
            match twin {
                Some(t) => {
                    c.twin = Some(match t.phase {
                        MappingPhase::Accepted => TwinPhase::Ready,
                        MappingPhase::Refused => TwinPhase::Refused,
                        MappingPhase::Terminating => TwinPhase::Terminating,
                    });
                    if t.phase != MappingPhase::Accepted {
                        c.reason = t.reason.clone();
                        c.message = t.message.clone();
                    }
                }
                None if selected => {
                    c.twin = Some(TwinPhase::Creating);
                    c.message = Some("waiting for the provider to make the twin".to_owned());
                }
                None => return None,
            }
        }
        Answer::Unreachable(why) => {
            let last = previous.filter(|p| p.twin.is_some());
            c.twin = last
                .and_then(|p| p.twin)
                .or(selected.then_some(TwinPhase::Creating));
            c.twin?;
            c.reason = last.and_then(|p| p.reason.clone());
            c.message = Some(format!(
                "the provider is out of reach ({why}); its last answer is kept"
            ));
        }
    }
    Some(c)
}

/// The status of `nso` with `clusters` (every provider with a virtual node or a twin), what
/// `bad` says of its selector, and the twin's name for cluster `me`.
pub fn status(
    nso: &NamespaceOffloading,
    mut clusters: Vec<ClusterOffloading>,
    bad: Option<&BadSelector>,
    me: &str,
) -> NamespaceOffloadingStatus {
    clusters.sort_by(|a, b| a.cluster_id.cmp(&b.cluster_id));
    let deleting = nso.metadata.deletion_timestamp.is_some();
    let home = nso.namespace().unwrap_or_default();
    NamespaceOffloadingStatus {
        observed_generation: nso.metadata.generation,
        phase: Some(namespaces::phase(deleting, &clusters)),
        remote_namespace_name: twin_name(&nso.spec, &home, me),
        message: bad.map(|e| {
            format!(
                "the clusterSelector cannot be evaluated ({e}): the providers stay as they were \
                 selected before"
            )
        }),
        clusters,
        created_before: None,
    }
}

/// Providers that refused the twin in `now` and did not already (with the same reason) in
/// `before`: each gets a Warning Event once.
pub fn newly_refused<'a>(
    before: &[ClusterOffloading],
    now: &'a [ClusterOffloading],
) -> Vec<&'a ClusterOffloading> {
    now.iter()
        .filter(|c| c.twin == Some(TwinPhase::Refused))
        .filter(|c| {
            !before.iter().any(|b| {
                b.cluster_id == c.cluster_id
                    && b.twin == Some(TwinPhase::Refused)
                    && b.reason == c.reason
            })
        })
        .collect()
}

/// The providers whose twin a change of the selector removes: those `before` (the status)
/// says are selected with a twin, still with a virtual node here (`providers`), that are not
/// among `chosen` now. An unpeered provider's twin goes with its peering, said there.
pub fn deselected(
    before: &[ClusterOffloading],
    chosen: &BTreeSet<String>,
    providers: &Providers,
) -> Vec<String> {
    before
        .iter()
        .filter(|c| c.selected && c.twin.is_some_and(|t| t != TwinPhase::Refused))
        .filter(|c| providers.contains_key(&c.cluster_id) && !chosen.contains(&c.cluster_id))
        .map(|c| c.cluster_id.clone())
        .collect()
}

/// What goes on `provider` when the twin `twin` of `nso`'s namespace is removed there: the
/// twin with its content (its claims kept under `storageRetention: Retain`), and the
/// namespace's pods running on its virtual node (`pods` of them, when counted), which end
/// Failed. The words `fabricctl` prints before it unoffloads, and the Events say.
pub fn removal(
    nso: &NamespaceOffloading,
    twin: &str,
    provider: &str,
    pods: Option<usize>,
) -> String {
    let ns = nso.namespace().unwrap_or_default();
    let fate = match nso.spec.storage_retention {
        StorageRetention::Delete => "is removed with everything in it",
        // The provider keeps the twin only while it holds claims of ours.
        StorageRetention::Retain => {
            "is removed with everything in it but the claims of this namespace's volumes \
             (storageRetention Retain: kept there, `fabricctl forget volumes` deletes them)"
        }
    };
    let pods = match pods {
        Some(n) => format!("{n} pod(s)"),
        None => "the pods".to_owned(),
    };
    format!(
        "provider {provider}: namespace {twin} {fate}; {pods} of {ns} running there will end \
         Failed (their controllers re-create them elsewhere)"
    )
}

/// The pods of `pods` (one namespace's) that its offloading did not place: running or
/// waiting, not on a virtual node (`is_virtual`), without the toleration of the virtual nodes'
/// taint that the pod webhook gives every pod it places. They were created before the
/// namespace was offloaded (or while its strategy kept pods home) and stay where they are
/// until they are created again.
pub fn not_placed(pods: &[Pod], is_virtual: impl Fn(&str) -> bool) -> Vec<&Pod> {
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .filter(|p| {
            let spec = p.spec.as_ref();
            let node = spec.and_then(|s| s.node_name.as_deref());
            let placed = spec.and_then(|s| s.tolerations.as_ref()).is_some_and(|ts| {
                ts.iter()
                    .any(|t| t.key.as_deref() == Some(taint::VIRTUAL_NODE))
            });
            !placed && !node.is_some_and(&is_virtual)
        })
        .collect()
}

/// What the Event on a pod that [`not_placed`] names says (`ns` offloaded with `strategy`).
pub fn not_placed_note(ns: &str, strategy: PodOffloadingStrategy) -> String {
    format!(
        "created before namespace {ns} was offloaded (pod offloading strategy {strategy:?}): it \
         stays where it runs; create it again (for a Deployment: kubectl rollout restart) for \
         the strategy to place it"
    )
}

/// Whether pods of a namespace offloaded with `strategy` go through the pod webhook (its
/// namespace carries [`label::SCHEDULING_ENABLED`]).
pub fn scheduling_enabled(strategy: PodOffloadingStrategy) -> bool {
    matches!(
        strategy,
        PodOffloadingStrategy::Remote | PodOffloadingStrategy::LocalAndRemote
    )
}

/// Where an unoffload stands with one provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Withdrawal {
    /// The twin is gone there (or never was).
    Done,
    /// The provider still lists it (being removed).
    Pending,
    /// The provider has been out of reach for longer than the grace: let go, its twin may be
    /// left there.
    Abandoned,
    /// The peering with it is gone: nothing to remove there any more.
    Unpeered,
}

/// Where the unoffload of `home` stands with a provider: `answer` from it (None: no identity
/// for it, unpeered), `abandon` whether the NamespaceOffloading has been deleting for longer
/// than the grace a provider out of reach is given.
pub fn withdrawal(home: &str, answer: Option<Answer<'_>>, abandon: bool) -> Withdrawal {
    match answer {
        None => Withdrawal::Unpeered,
        Some(Answer::Map(status)) if listed(status, home) => Withdrawal::Pending,
        Some(Answer::Map(_)) => Withdrawal::Done,
        Some(Answer::Unreachable(_)) if abandon => Withdrawal::Abandoned,
        Some(Answer::Unreachable(_)) => Withdrawal::Pending,
    }
}

#[cfg(test)]
mod tests;
