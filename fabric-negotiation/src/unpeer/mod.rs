//! Unpeering: what goes, in which order, on each side.
//!
//! On the consumer, deleting a provider's `ForeignCluster` starts it ([`consumer`], finalizer
//! [`names::finalizer::PEERING`]): the ResourceSlices go (their replicas on the provider
//! first), then the VirtualNode (its controller cordons the Node, drains the pods bound to it
//! and removes it), the network
//! (the PeeringNetwork on the provider, then the local objects: the network controller's
//! finalizer), and last the consumer tells the provider it leaves, by deleting its own
//! `Tenant` there with its identity, and drops the Identity and its Secret.
//!
//! On the provider, a deleted `Tenant` ([`provider`], finalizer [`names::finalizer::TENANT`])
//! takes the tenant area with it: the RoleBinding and Role first (access ends), the replicas
//! (PeeringNetwork, ResourceSlices, ShadowPods, each through its own controller's finalizer),
//! the consumer's ForeignCluster and CSRs, the namespace. Deleting the consumer's
//! ForeignCluster on the provider deletes its Tenant ([`revoke`]).
//!
//! Nothing waits for an unreachable peer forever: a step that needs the provider goes on
//! without it once forced ([`names::annotation::FORCE_UNPEER`]) or after
//! [`crate::network::REMOTE_GRACE`]; a replica whose controller does not finish goes with its
//! namespace after [`CONTENT_GRACE`].
//!
//! This module is the pure part, shared with `fabricctl unpeer` (which prints what is pending).
use std::{fmt, time::Duration};

use fabric_api::names;
use fabric_kube::meta::deleting_for;
use k8s_openapi::jiff::Timestamp;
use kube::api::ObjectMeta;

use crate::network;

pub mod consumer;
pub mod provider;
pub mod revoke;

/// How long a provider waits for a removed tenant's replicas to finish their own cleanup
/// before it deletes the namespace anyway.
pub const CONTENT_GRACE: Duration = Duration::from_secs(30);

/// Whether a cleanup that cannot reach the provider goes on without it: forced, or deleting
/// for [`network::REMOTE_GRACE`] already.
pub fn abandon_remote(meta: &ObjectMeta, now: Timestamp) -> bool {
    names::annotation::unpeer_forced(meta)
        || network::give_up_remote(deleting_for(meta, now), network::REMOTE_GRACE)
}

/// What a consumer's unpeer of one provider still has on this side.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsumerSide {
    /// The local ResourceSlices asking that provider.
    pub slices: Vec<String>,
    /// Its VirtualNode exists.
    pub virtual_node: bool,
    /// The network controller's finalizer is still on the ForeignCluster.
    pub network: bool,
}

/// One thing an unpeer waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pending {
    Slices(Vec<String>),
    VirtualNode,
    Network,
}

impl fmt::Display for Pending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pending::Slices(s) => write!(
                f,
                "ResourceSlice(s) {} (their replicas on the provider are deleted first)",
                s.join(", ")
            ),
            Pending::VirtualNode => write!(
                f,
                "the VirtualNode (the virtual-node controller cordons the node, deletes the \
                 pods bound to it through the provider, removes the node and its virtual kubelet)"
            ),
            Pending::Network => write!(
                f,
                "the network (the PeeringNetwork on the provider, then this cluster's \
                 Configuration, PublicKey and gateway objects)"
            ),
        }
    }
}

/// What must go before the consumer tells the provider it leaves and drops its identity
/// (which the steps before need to reach the provider), in the order it goes.
pub fn pending(side: &ConsumerSide) -> Vec<Pending> {
    let mut p = Vec::new();
    if !side.slices.is_empty() {
        p.push(Pending::Slices(side.slices.clone()));
    }
    if side.virtual_node {
        p.push(Pending::VirtualNode);
    }
    if side.network {
        p.push(Pending::Network);
    }
    p
}

/// What the provider keeps of consumer `consumer` when it could not be told (an unpeer
/// forced or given up on), and how its admin removes it.
pub fn left_on_provider(consumer: &str) -> Vec<String> {
    let ns = names::namespace::tenant(consumer);
    vec![
        format!(
            "tenant namespace {ns}: Tenant {consumer}, Role and RoleBinding {}, the replicas \
             of the PeeringNetwork and ResourceSlices, ShadowPods",
            fabric_auth::tenant::ROLE
        ),
        format!("ForeignCluster {consumer}, its CertificateSigningRequests"),
        format!("the network objects for {consumer} (Configuration, PublicKey, gateway server)"),
        format!(
            "to remove them there: `kubectl delete tenant {consumer} -n {ns}` (the provider's \
             controllers remove the rest)"
        ),
    ]
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    #[test]
    fn the_identity_goes_last() {
        assert!(pending(&ConsumerSide::default()).is_empty());
        let all = ConsumerSide {
            slices: vec!["p".into()],
            virtual_node: true,
            network: true,
        };
        assert_eq!(
            pending(&all),
            [
                Pending::Slices(vec!["p".into()]),
                Pending::VirtualNode,
                Pending::Network
            ]
        );
        assert!(pending(&all)[0].to_string().contains("ResourceSlice(s) p"));
    }

    #[test]
    fn the_remote_is_abandoned_when_forced_or_after_the_grace() {
        let now = Timestamp::now();
        let deleting = |secs: i64, force: bool| ObjectMeta {
            deletion_timestamp: Some(Time(now - Duration::from_secs(secs as u64))),
            annotations: force.then(|| {
                BTreeMap::from([(
                    names::annotation::FORCE_UNPEER.to_owned(),
                    "true".to_owned(),
                )])
            }),
            ..Default::default()
        };
        assert!(!abandon_remote(&deleting(1, false), now));
        assert!(abandon_remote(&deleting(1, true), now));
        assert!(abandon_remote(&deleting(31, false), now));
        assert!(!names::annotation::unpeer_forced(&ObjectMeta::default()));
        let left = left_on_provider("c").join("\n");
        assert!(left.contains("fabric-tenant-c"), "{left}");
        assert!(
            left.contains("kubectl delete tenant c -n fabric-tenant-c"),
            "{left}"
        );
    }
}
