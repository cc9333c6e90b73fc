//! Working modes (docs/modes.md): which consumer, if any, this provider is tethered to, and
//! whether it may be. Pure: the provider's offer policy, its pod webhook and `fabricctl mode`
//! decide from the same Tenants the same way.
//!
//! The mode lives in each Tenant's `spec.mode` (the provider admin's: the consumer may read
//! its Tenant and delete it, never write it). A cluster is tethered when exactly one Tenant
//! that is not being removed says `Tethered`; two that say so (written by hand, or by two
//! admins at once) tether it to neither, and say why.
use std::fmt;

use super::v1alpha1::{Tenant, WorkingMode};

/// A Tenant as the mode needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantRef {
    pub cluster_id: String,
    pub mode: WorkingMode,
    /// Its deletion has begun (the consumer unpeers): it offers nothing any more.
    pub leaving: bool,
}

impl TenantRef {
    pub fn of(t: &Tenant) -> Self {
        Self {
            cluster_id: t.spec.cluster_id.clone(),
            mode: t.spec.mode,
            leaving: t.metadata.deletion_timestamp.is_some(),
        }
    }
}

/// This cluster's mode, from its Tenants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tether {
    Autonomous,
    /// Tethered to this consumer.
    To(String),
    /// More than one Tenant says `Tethered`: none is honoured (the cluster acts autonomous
    /// until the admin sets all but one back).
    Conflict(Vec<String>),
}

impl Tether {
    pub fn of<'a>(tenants: impl IntoIterator<Item = &'a TenantRef>) -> Self {
        let mut tethered: Vec<String> = tenants
            .into_iter()
            .filter(|t| t.mode == WorkingMode::Tethered && !t.leaving)
            .map(|t| t.cluster_id.clone())
            .collect();
        tethered.sort();
        tethered.dedup();
        match tethered.len() {
            0 => Tether::Autonomous,
            1 => Tether::To(tethered.remove(0)),
            _ => Tether::Conflict(tethered),
        }
    }

    /// The consumer this cluster is tethered to, if it is.
    pub fn peer(&self) -> Option<&str> {
        match self {
            Tether::To(p) => Some(p),
            _ => None,
        }
    }
}

/// Why `fabricctl mode tethered --peer X` is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ineligible {
    /// No ForeignCluster of that name: this cluster does not know it.
    Unknown(String),
    /// Known, but it consumes nothing here (no Tenant, or its Tenant is being removed).
    NotAConsumer(String),
    /// Other consumers are peered: tethered mode needs at most one peering in which this
    /// cluster offers resources.
    OtherConsumers { peer: String, others: Vec<String> },
}

impl fmt::Display for Ineligible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ineligible::Unknown(p) => write!(
                f,
                "cluster {p:?} is unknown here (no ForeignCluster {p}): peer with it first"
            ),
            Ineligible::NotAConsumer(p) => write!(
                f,
                "cluster {p:?} consumes no resources of this cluster (no Tenant for it): only a \
                 consumer can be handed this cluster's resources"
            ),
            Ineligible::OtherConsumers { peer, others } => write!(
                f,
                "this cluster offers resources to other consumers besides {peer:?} ({}): \
                 tethered mode needs at most one peering in which this cluster offers \
                 resources; unpeer them first",
                others.join(", ")
            ),
        }
    }
}

/// Whether this cluster may be tethered to `peer`: it knows `peer` (`known`), `peer` has a
/// Tenant here, and every other Tenant is being removed.
pub fn eligible(peer: &str, known: bool, tenants: &[TenantRef]) -> Result<(), Ineligible> {
    if !known {
        return Err(Ineligible::Unknown(peer.to_owned()));
    }
    if !tenants.iter().any(|t| t.cluster_id == peer && !t.leaving) {
        return Err(Ineligible::NotAConsumer(peer.to_owned()));
    }
    let mut others: Vec<String> = tenants
        .iter()
        .filter(|t| t.cluster_id != peer && !t.leaving)
        .map(|t| t.cluster_id.clone())
        .collect();
    others.sort();
    others.dedup();
    if others.is_empty() {
        Ok(())
    } else {
        Err(Ineligible::OtherConsumers {
            peer: peer.to_owned(),
            others,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(id: &str, mode: WorkingMode, leaving: bool) -> TenantRef {
        TenantRef {
            cluster_id: id.into(),
            mode,
            leaving,
        }
    }
    use WorkingMode::{Autonomous as A, Tethered as T};

    #[test]
    fn tethered_to_the_one_tenant_that_says_so() {
        assert_eq!(Tether::of(&[]), Tether::Autonomous);
        assert_eq!(Tether::of(&[t("a", A, false)]), Tether::Autonomous);
        assert_eq!(
            Tether::of(&[t("a", T, false), t("b", A, false)]),
            Tether::To("a".into())
        );
        // A Tenant being removed tethers nothing.
        assert_eq!(Tether::of(&[t("a", T, true)]), Tether::Autonomous);
        // Two say so: neither is honoured.
        let both = Tether::of(&[t("b", T, false), t("a", T, false)]);
        assert_eq!(both, Tether::Conflict(vec!["a".into(), "b".into()]));
        assert_eq!(both.peer(), None);
    }

    #[test]
    fn eligible_only_as_the_one_consumer() {
        let alone = [t("x", A, false)];
        assert_eq!(eligible("x", true, &alone), Ok(()));
        assert_eq!(
            eligible("x", false, &alone),
            Err(Ineligible::Unknown("x".into()))
        );
        assert_eq!(
            eligible("y", true, &alone),
            Err(Ineligible::NotAConsumer("y".into()))
        );
        assert_eq!(
            eligible("x", true, &[t("x", A, true)]),
            Err(Ineligible::NotAConsumer("x".into()))
        );
        // Others leaving do not count; others staying are named.
        let leaving = [t("x", A, false), t("z", A, true)];
        assert_eq!(eligible("x", true, &leaving), Ok(()));
        let crowded = [t("x", A, false), t("z", A, false), t("w", T, false)];
        let e = eligible("x", true, &crowded).unwrap_err();
        assert_eq!(
            e,
            Ineligible::OtherConsumers {
                peer: "x".into(),
                others: vec!["w".into(), "z".into()]
            }
        );
        let msg = e.to_string();
        assert!(
            msg.contains("w, z") && msg.contains("at most one peering"),
            "{msg}"
        );
    }
}
