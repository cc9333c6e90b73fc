//! What the discovery controller does to ForeignClusters, as a pure function of what the
//! browsers see and what the API holds.
//!
//! A discovered cluster gets a ForeignCluster named after its id, with `discoveredBy` (`Lan`
//! or `Dns`) and the announced authentication URL; it follows the announcement while it
//! changes and is deleted when no browser sees the cluster any more. Discovery owns only what
//! it created and nobody has peered yet: a ForeignCluster created by hand (`Manual`) or
//! already peered (a role, or any status written by the peering) is never touched, and
//! nothing is ever peered here.
use std::collections::BTreeMap;

use fabric_api::core::v1alpha1::{DiscoveryMethod, ForeignCluster, PeerRole};
use fabric_discovery::{Announcement, Change};
use kube::ResourceExt as _;

/// What the browsers currently see: per discovery method, cluster id → announcement.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    lan: BTreeMap<String, Announcement>,
    dns: BTreeMap<String, Announcement>,
}

impl Seen {
    /// Takes in a browser's change.
    pub fn apply(&mut self, method: DiscoveryMethod, change: &Change) {
        let map = match method {
            DiscoveryMethod::Lan => &mut self.lan,
            DiscoveryMethod::Dns => &mut self.dns,
            DiscoveryMethod::Manual => return,
        };
        match change {
            Change::Discovered(a) | Change::Updated(a) => {
                map.insert(a.cluster_id.to_string(), a.clone());
            }
            Change::Expired(id) => {
                map.remove(id.as_str());
            }
        }
    }

    /// Which announcement stands for `id`: the one of `prefer` when it still sees the cluster
    /// (a ForeignCluster keeps the method that found it), else the LAN's, else DNS's.
    fn pick(
        &self,
        id: &str,
        prefer: Option<DiscoveryMethod>,
    ) -> Option<(DiscoveryMethod, &Announcement)> {
        let of = |m| match m {
            DiscoveryMethod::Lan => self.lan.get(id).map(|a| (m, a)),
            DiscoveryMethod::Dns => self.dns.get(id).map(|a| (m, a)),
            DiscoveryMethod::Manual => None,
        };
        prefer
            .and_then(of)
            .or_else(|| of(DiscoveryMethod::Lan))
            .or_else(|| of(DiscoveryMethod::Dns))
    }

    fn ids(&self) -> impl Iterator<Item = &String> {
        self.lan.keys().chain(self.dns.keys())
    }
}

/// The fields discovery writes (server-side apply, its own field manager): never `role` or
/// the status, which belong to the peering.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    pub cluster_id: String,
    pub discovered_by: DiscoveryMethod,
    pub auth_url: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Create or update ForeignCluster `name`.
    Apply { name: String, desired: Desired },
    /// Delete ForeignCluster `name`, only if it is still at `resource_version` (it may have
    /// been peered meanwhile).
    Delete {
        name: String,
        resource_version: Option<String>,
    },
}

/// Whether discovery may change or delete `fc`: found by a browser, and not peered.
pub fn owned_by_discovery(fc: &ForeignCluster) -> bool {
    let found = matches!(
        fc.spec.discovered_by,
        DiscoveryMethod::Lan | DiscoveryMethod::Dns
    );
    let status_untouched = fc.status.as_ref().is_none_or(|s| {
        s.tenant_namespace.is_none() && s.api_server_url.is_none() && s.conditions.is_empty()
    });
    found && fc.spec.role == PeerRole::Unknown && status_untouched
}

/// The actions that bring `existing` ForeignClusters in line with what is `seen`; `own` (this
/// cluster) never gets one.
pub fn plan(seen: &Seen, existing: &[ForeignCluster], own: &str) -> Vec<Action> {
    let mut actions = Vec::new();
    let by_id: BTreeMap<&str, &ForeignCluster> = existing
        .iter()
        .map(|fc| (fc.spec.cluster_id.as_str(), fc))
        .collect();
    let mut ids: Vec<&String> = seen.ids().collect();
    ids.sort();
    ids.dedup();
    for id in ids {
        if id == own {
            continue;
        }
        let current = by_id.get(id.as_str()).copied();
        if current.is_some_and(|fc| !owned_by_discovery(fc)) {
            continue;
        }
        let prefer = current.map(|fc| fc.spec.discovered_by);
        let Some((method, a)) = seen.pick(id, prefer) else {
            continue;
        };
        let desired = Desired {
            cluster_id: id.clone(),
            discovered_by: method,
            auth_url: a.auth_url.to_string(),
        };
        let name = match current {
            Some(fc) => {
                let same = fc.spec.discovered_by == method
                    && fc.spec.auth_url.as_deref() == Some(desired.auth_url.as_str());
                if same {
                    continue;
                }
                fc.name_any()
            }
            None => {
                // A ForeignCluster of another cluster under this name: not ours to take.
                if existing.iter().any(|fc| fc.name_any() == *id) {
                    continue;
                }
                id.clone()
            }
        };
        actions.push(Action::Apply { name, desired });
    }
    for fc in existing {
        let id = fc.spec.cluster_id.as_str();
        if owned_by_discovery(fc) && seen.pick(id, None).is_none() {
            actions.push(Action::Delete {
                name: fc.name_any(),
                resource_version: fc.resource_version(),
            });
        }
    }
    actions
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use fabric_api::core::v1alpha1::{ForeignClusterSpec, ForeignClusterStatus};
    use fabric_discovery::{ClusterId, Role};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    use super::*;

    fn ann(id: &str, url: &str) -> Announcement {
        Announcement {
            cluster_id: id.parse().unwrap(),
            auth_url: url.parse().unwrap(),
            roles: BTreeSet::from([Role::Provider]),
        }
    }

    fn fc(name: &str, id: &str, by: DiscoveryMethod, url: &str) -> ForeignCluster {
        let mut fc = ForeignCluster::new(
            name,
            ForeignClusterSpec {
                cluster_id: id.into(),
                discovered_by: by,
                role: PeerRole::Unknown,
                auth_url: Some(url.into()),
            },
        );
        fc.metadata.resource_version = Some("7".into());
        fc
    }

    fn apply(name: &str, id: &str, by: DiscoveryMethod, url: &str) -> Action {
        Action::Apply {
            name: name.into(),
            desired: Desired {
                cluster_id: id.into(),
                discovered_by: by,
                auth_url: url.into(),
            },
        }
    }

    fn delete(name: &str) -> Action {
        Action::Delete {
            name: name.into(),
            resource_version: Some("7".into()),
        }
    }

    use DiscoveryMethod::*;

    #[test]
    fn discovered_clusters_get_a_foreign_cluster_that_follows_them() {
        let mut seen = Seen::default();
        seen.apply(Lan, &Change::Discovered(ann("a", "https://a.example")));
        seen.apply(Dns, &Change::Discovered(ann("b", "https://b.example")));
        assert_eq!(
            plan(&seen, &[], "me"),
            vec![
                apply("a", "a", Lan, "https://a.example"),
                apply("b", "b", Dns, "https://b.example")
            ]
        );
        let existing = [
            fc("a", "a", Lan, "https://a.example"),
            fc("b", "b", Dns, "https://b.example"),
        ];
        assert_eq!(plan(&seen, &existing, "me"), vec![], "in line");
        seen.apply(Lan, &Change::Updated(ann("a", "https://a.example:9443")));
        assert_eq!(
            plan(&seen, &existing, "me"),
            vec![apply("a", "a", Lan, "https://a.example:9443")]
        );
        seen.apply(Dns, &Change::Expired("b".parse().unwrap()));
        let existing = [
            fc("a", "a", Lan, "https://a.example:9443"),
            fc("b", "b", Dns, "https://b.example"),
        ];
        assert_eq!(
            plan(&seen, &existing, "me"),
            vec![delete("b")],
            "gone from DNS"
        );
    }

    #[test]
    fn never_touches_manual_or_peered_foreign_clusters() {
        let mut seen = Seen::default();
        seen.apply(Lan, &Change::Discovered(ann("a", "https://a.example")));
        seen.apply(Lan, &Change::Discovered(ann("b", "https://b.example")));
        seen.apply(Lan, &Change::Discovered(ann("c", "https://c.example")));
        seen.apply(Lan, &Change::Discovered(ann("d", "https://d.example")));
        let manual = fc("peer-a", "a", Manual, "https://elsewhere.example");
        let mut with_role = fc("b", "b", Lan, "https://old.example");
        with_role.spec.role = PeerRole::Provider;
        let mut with_status = fc("c", "c", Dns, "https://old.example");
        with_status.status = Some(ForeignClusterStatus {
            tenant_namespace: Some("fabric-tenant-me".into()),
            ..Default::default()
        });
        let mut d_conditions = fc("d", "d", Lan, "https://old.example");
        d_conditions.status = Some(ForeignClusterStatus {
            conditions: vec![Condition {
                type_: "Authenticated".into(),
                status: "False".into(),
                reason: "Pending".into(),
                message: String::new(),
                last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
                observed_generation: None,
            }],
            ..Default::default()
        });
        let existing = [manual, with_role, with_status, d_conditions];
        assert_eq!(plan(&seen, &existing, "me"), vec![], "none changed");
        assert_eq!(
            plan(&Seen::default(), &existing, "me"),
            vec![],
            "none deleted"
        );
        for fc in &existing {
            assert!(!owned_by_discovery(fc), "{}", fc.name_any());
        }
    }

    #[test]
    fn keeps_the_method_that_found_a_cluster_while_it_still_sees_it() {
        let mut seen = Seen::default();
        seen.apply(Dns, &Change::Discovered(ann("a", "https://a.example")));
        seen.apply(Lan, &Change::Discovered(ann("a", "https://a.lan.example")));
        assert_eq!(
            plan(&seen, &[], "me"),
            vec![apply("a", "a", Lan, "https://a.lan.example")],
            "the LAN first"
        );
        let by_dns = [fc("a", "a", Dns, "https://a.example")];
        assert_eq!(plan(&seen, &by_dns, "me"), vec![], "no flapping");
        seen.apply(Dns, &Change::Expired("a".parse().unwrap()));
        assert_eq!(
            plan(&seen, &by_dns, "me"),
            vec![apply("a", "a", Lan, "https://a.lan.example")],
            "DNS lost it, the LAN still has it"
        );
    }

    #[test]
    fn never_this_cluster_nor_a_name_taken_by_another() {
        let mut seen = Seen::default();
        seen.apply(Lan, &Change::Discovered(ann("me", "https://me.example")));
        seen.apply(Lan, &Change::Discovered(ann("a", "https://a.example")));
        // Someone named a ForeignCluster "a" for cluster x.
        let taken = [fc("a", "x", Manual, "https://x.example")];
        assert_eq!(plan(&seen, &taken, "me"), vec![]);
        let own_id: ClusterId = "me".parse().unwrap();
        seen.apply(Lan, &Change::Expired(own_id));
        assert_eq!(
            plan(&seen, &[], "me"),
            vec![apply("a", "a", Lan, "https://a.example")]
        );
    }
}
