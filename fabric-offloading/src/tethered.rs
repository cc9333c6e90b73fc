//! The provider's local pods while it is tethered (docs/modes.md): a cluster that handed
//! control of its resources to its one consumer refuses new local workload pods, so that
//! what it offers (all of what is free) stays free for the consumer's pods. Pure: the
//! verdict on a pod creation, from the cluster's mode ([`Tether`], from the Tenants), the
//! namespace and who creates the pod.
//!
//! Accepted whatever the mode: the pods the fabric makes from ShadowPods (created by the
//! ShadowPod controller's ServiceAccount, [`Exemptions::creators`]) and pods of the
//! fabric's own namespace and `kube-system` ([`Exemptions::namespaces`]). The configuration
//! also leaves out namespaces the admin labels [`label::TETHERED_EXEMPT`] (a namespaceSelector
//! the webhook does not see) and, by a matchCondition, the same creators, so that their pods
//! never wait on the webhook.
use std::fmt;

use fabric_api::{authentication::mode::Tether, names::label};

/// What is accepted while tethered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exemptions {
    /// Namespaces whose pods are accepted.
    pub namespaces: Vec<String>,
    /// Users whose pod creations are accepted (`system:serviceaccount:NS:NAME`).
    pub creators: Vec<String>,
}

impl Exemptions {
    /// The defaults for a fabric running in `namespace`: its namespace and `kube-system`; the
    /// sharing controller's ServiceAccount (it makes the pods of ShadowPods).
    pub fn new(namespace: &str) -> Self {
        Self {
            namespaces: vec![namespace.to_owned(), "kube-system".to_owned()],
            creators: vec![format!("system:serviceaccount:{namespace}:fabric-sharing")],
        }
    }
}

/// Why a pod is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub peer: String,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "this cluster is in tethered mode, its resources handed to peer {:?}: new local \
             workload pods are refused until its admin runs `fabricctl mode autonomous` (or \
             labels the namespace {}=true)",
            self.peer,
            label::TETHERED_EXEMPT
        )
    }
}

/// The verdict on a pod created in `namespace` by `user`.
pub fn verdict(
    tether: &Tether,
    namespace: &str,
    user: &str,
    exempt: &Exemptions,
) -> Result<(), Refused> {
    let Some(peer) = tether.peer() else {
        return Ok(());
    };
    if exempt.namespaces.iter().any(|n| n == namespace) || exempt.creators.iter().any(|c| c == user)
    {
        return Ok(());
    }
    Err(Refused {
        peer: peer.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_pods_are_refused_only_while_tethered() {
        let e = Exemptions::new("fabric-system");
        let alice = "alice";
        assert_eq!(verdict(&Tether::Autonomous, "shop", alice, &e), Ok(()));
        // Two Tenants tethered: honoured for neither, so pods are accepted.
        let conflict = Tether::Conflict(vec!["a".into(), "b".into()]);
        assert_eq!(verdict(&conflict, "shop", alice, &e), Ok(()));
        let tethered = Tether::To("x".into());
        let refused = verdict(&tethered, "shop", alice, &e).unwrap_err();
        let msg = refused.to_string();
        assert!(
            msg.contains("tethered mode")
                && msg.contains("\"x\"")
                && msg.contains("fabricctl mode autonomous"),
            "{msg}"
        );
        // The fabric's own and the system's namespaces, and the pods made from ShadowPods.
        assert_eq!(verdict(&tethered, "fabric-system", alice, &e), Ok(()));
        assert_eq!(verdict(&tethered, "kube-system", alice, &e), Ok(()));
        let sharing = "system:serviceaccount:fabric-system:fabric-sharing";
        assert_eq!(verdict(&tethered, "fabric-tenant-x", sharing, &e), Ok(()));
        // Another ServiceAccount of the fabric's namespace is no exemption elsewhere.
        let other = "system:serviceaccount:fabric-system:fabric-virtual-nodes";
        assert!(verdict(&tethered, "shop", other, &e).is_err());
    }
}
