//! At-most-once semantics on the provider (opt-in, [`AtMostOnce`]), as pure functions: (what
//! the provider agrees to is `fabric_api::offloading::at_most_once`'s) how long each consumer's heartbeat has been still by this
//! cluster's own monotonic clock, which tenants' pods are to stop, and the status of a
//! ShadowPod stopped for that. The I/O edge is [`super::fence`]; the ShadowPod controller
//! does the stopping.
//!
//! The consumer's virtual kubelet renews the Lease [`names::lease::CONSUMER`] in its tenant
//! namespace. The provider never compares the consumer's clock with its own: it notes when
//! (on its monotonic clock) it saw the Lease change, and once it has not changed for the
//! agreed `partitionSeconds`, the tenant's pods are stopped. The consumer declares its pods
//! failed only after its own last successful renewal plus `partitionSeconds`,
//! `graceSeconds` and a margin, so the provider's stop comes first.
use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use fabric_api::{
    authentication::v1alpha1::ResourceSlice,
    names,
    offloading::{
        at_most_once::strictest,
        v1alpha1::{
            AtMostOnce, ShadowPodStatus,
            shadow_pod_condition::{PARTITIONED, POD_CREATED},
        },
    },
};
use fabric_kube::status::{self, with_condition};

use super::decide::PodCreated;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

/// The terms the provider enforces per tenant namespace: the strictest it agreed to in the
/// status of that namespace's slice replicas.
pub fn terms_by_namespace<'a>(
    slices: impl IntoIterator<Item = &'a ResourceSlice>,
) -> BTreeMap<String, AtMostOnce> {
    let mut all: BTreeMap<String, Vec<AtMostOnce>> = BTreeMap::new();
    for s in slices {
        if let (Some(ns), Some(t)) = (
            s.namespace(),
            s.status.as_ref().and_then(|st| st.at_most_once),
        ) {
            all.entry(ns).or_default().push(t);
        }
    }
    all.into_iter()
        .filter_map(|(ns, ts)| strictest(&ts).map(|t| (ns, t)))
        .collect()
}

/// Terms as enforced: since when (this cluster's monotonic clock) they have been in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InForce {
    pub terms: AtMostOnce,
    pub since: Instant,
}

/// The terms in force per tenant namespace once `agreed` is what the slices say at `now`:
/// terms that did not change keep their start; new or changed ones start now. A consumer
/// renews at the cadence of the terms it knows, and learns new ones only after they are
/// agreed: a Lease renewed before then at a slower cadence (or never under terms) is no
/// silence, so the count starts no earlier than the terms.
pub fn in_force(
    prev: &BTreeMap<String, InForce>,
    agreed: BTreeMap<String, AtMostOnce>,
    now: Instant,
) -> BTreeMap<String, InForce> {
    agreed
        .into_iter()
        .map(|(ns, terms)| {
            let since = prev
                .get(&ns)
                .filter(|p| p.terms == terms)
                .map_or(now, |p| p.since);
            (ns, InForce { terms, since })
        })
        .collect()
}

/// The tenant namespace a ShadowPod's consumer owns (where its heartbeat is).
pub fn tenant_namespace(consumer: &str) -> String {
    names::namespace::tenant(consumer)
}

/// One consumer's heartbeat as this cluster has seen it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    /// The Lease's resourceVersion when last seen.
    version: String,
    /// When (by this cluster's monotonic clock) that version was first seen, or the earliest
    /// it can have been written.
    since: Instant,
}

/// The heartbeats of every tenant namespace, by their Leases' changes.
#[derive(Debug, Default)]
pub struct Heartbeats {
    seen: BTreeMap<String, Heartbeat>,
}

impl Heartbeats {
    /// Notes the heartbeat Lease of `namespace` at `version`, seen at `now`. `age`: how long
    /// before `now` a new version may have been written, zero for a watch event as it happens;
    /// for what a (re)list shows (after a restart or a broken watch) the time since this
    /// cluster's API server last wrote it (its managedFields time against this process's wall
    /// clock, both this cluster's), so that neither pushes a stop back.
    pub fn observe(&mut self, namespace: &str, version: &str, age: Duration, now: Instant) {
        if self
            .seen
            .get(namespace)
            .is_some_and(|h| h.version == version)
        {
            return;
        }
        let since = now.checked_sub(age).unwrap_or(now);
        self.seen.insert(
            namespace.to_owned(),
            Heartbeat {
                version: version.to_owned(),
                since,
            },
        );
    }

    /// The Lease was deleted: the consumer has no heartbeat to declare anything from either.
    pub fn forget(&mut self, namespace: &str) {
        self.seen.remove(namespace);
    }

    /// After a (re)list: the Leases not in it are gone.
    pub fn keep_only(&mut self, namespaces: &std::collections::BTreeSet<String>) {
        self.seen.retain(|ns, _| namespaces.contains(ns));
    }

    /// How long the heartbeat of `namespace` has not changed (None: never seen).
    pub fn still_for(&self, namespace: &str, now: Instant) -> Option<Duration> {
        self.seen
            .get(namespace)
            .map(|h| now.saturating_duration_since(h.since))
    }
}

/// Whether a tenant's pods are to stop, and if not, when that would be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// At-most-once is off for it, or it never had a heartbeat (so it has nothing to
    /// declare its pods failed from): its pods keep running.
    Keep,
    /// Heard from within the partition time: stop at `at` unless the Lease changes.
    Live { at: Instant },
    /// Silent for longer than the partition time.
    Stop { silent: Duration, terms: AtMostOnce },
}

pub fn verdict(
    terms: Option<InForce>,
    heartbeats: &Heartbeats,
    namespace: &str,
    now: Instant,
) -> Verdict {
    let (Some(InForce { terms, since }), Some(still)) =
        (terms, heartbeats.still_for(namespace, now))
    else {
        return Verdict::Keep;
    };
    let still = still.min(now.saturating_duration_since(since));
    let limit = Duration::from_secs(terms.partition_seconds.into());
    if still >= limit {
        Verdict::Stop {
            silent: still,
            terms,
        }
    } else {
        Verdict::Live {
            at: now + (limit - still),
        }
    }
}

/// The verdict of every namespace with terms, and the earliest future stop (when to look
/// again).
pub fn verdicts(
    terms: &BTreeMap<String, InForce>,
    heartbeats: &Heartbeats,
    now: Instant,
) -> (BTreeMap<String, Verdict>, Option<Instant>) {
    let mut next: Option<Instant> = None;
    let all = terms
        .iter()
        .map(|(ns, t)| {
            let v = verdict(Some(*t), heartbeats, ns, now);
            if let Verdict::Live { at } = v {
                next = Some(next.map_or(at, |n| n.min(at)));
            }
            (ns.clone(), v)
        })
        .collect();
    (all, next)
}

/// Whether a ShadowPod was stopped for a partition (for good: its pod is never made again).
pub fn partitioned(status: &ShadowPodStatus) -> bool {
    status::Verdict::<PodCreated>::find(&status.conditions, POD_CREATED)
        .is_some_and(|v| v.reason == PodCreated::Partitioned)
}

/// The status of a ShadowPod whose pod is stopped because its consumer has been silent for
/// `silent`: Failed, reason [`PARTITIONED`], not Ready; the rest as last known.
pub fn stopped(
    prev: &ShadowPodStatus,
    silent: Duration,
    terms: AtMostOnce,
    generation: Option<i64>,
    now: Timestamp,
) -> ShadowPodStatus {
    let message = format!(
        "the consumer's heartbeat has not changed for {}s (at-most-once after {}s): the pod is \
         stopped and not run again",
        silent.as_secs(),
        terms.partition_seconds
    );
    let mut pod_conditions = prev.pod_conditions.clone();
    for c in pod_conditions
        .iter_mut()
        .filter(|c| matches!(c.type_.as_str(), "Ready" | "ContainersReady"))
    {
        if c.status != "False" {
            c.status = "False".into();
            c.reason = Some(PARTITIONED.into());
            c.last_transition_time =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
        }
    }
    ShadowPodStatus {
        observed_generation: generation,
        phase: Some("Failed".into()),
        finished_at: super::lifetime::finished_at(prev, Some("Failed"), now),
        reason: Some(PARTITIONED.into()),
        message: Some(message.clone()),
        pod_conditions,
        conditions: with_condition(
            &prev.conditions,
            status::Verdict::not(PodCreated::Partitioned, message).condition(
                POD_CREATED,
                generation,
                now,
            ),
        ),
        ..prev.clone()
    }
}

/// The grace period of a stopped pod's deletion: the agreed one, or the pod's own when
/// shorter.
pub fn stop_grace(terms: AtMostOnce, pod_grace: Option<i64>) -> u32 {
    let own = pod_grace
        .and_then(|g| u32::try_from(g.max(0)).ok())
        .unwrap_or(u32::MAX);
    terms.grace_seconds.min(own)
}

#[cfg(test)]
mod tests {
    use fabric_api::{
        authentication::v1alpha1::{ResourceSliceSpec, ResourceSliceStatus},
        offloading::v1alpha1::ShadowPodStatus,
    };
    use k8s_openapi::api::core::v1::PodCondition;

    use super::*;

    const fn t(partition_seconds: u32, grace_seconds: u32) -> AtMostOnce {
        AtMostOnce {
            partition_seconds,
            grace_seconds,
        }
    }

    fn slice(ns: &str, name: &str, agreed: Option<AtMostOnce>) -> ResourceSlice {
        let mut s = ResourceSlice::new(
            name,
            ResourceSliceSpec {
                consumer_cluster_id: "a".into(),
                provider_cluster_id: "b".into(),
                resources: Default::default(),
                at_most_once: Some(t(1, 1)),
            },
        );
        s.metadata.namespace = Some(ns.into());
        s.status = Some(ResourceSliceStatus {
            at_most_once: agreed,
            ..Default::default()
        });
        s
    }

    #[test]
    fn terms_are_what_the_provider_agreed_per_tenant_namespace() {
        let slices = [
            slice("fabric-tenant-a", "one", Some(t(20, 3))),
            slice("fabric-tenant-a", "two", Some(t(10, 9))),
            // Asked, not (yet) agreed: not enforced.
            slice("fabric-tenant-c", "one", None),
        ];
        let terms = terms_by_namespace(&slices);
        assert_eq!(terms.len(), 1);
        assert_eq!(terms["fabric-tenant-a"], t(10, 3));
    }

    #[test]
    fn staleness_is_measured_on_our_clock_from_the_last_change_seen() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let ns = "fabric-tenant-a";
        let mut hb = Heartbeats::default();
        let terms = Some(InForce {
            terms: t(10, 0),
            since: t0,
        });
        // Never seen: nothing to stop (the consumer has never renewed, so never declares).
        assert_eq!(verdict(terms, &hb, ns, t0 + s(100)), Verdict::Keep);
        hb.observe(ns, "1", Duration::ZERO, t0);
        assert_eq!(
            verdict(terms, &hb, ns, t0 + s(4)),
            Verdict::Live { at: t0 + s(10) }
        );
        // The same version seen again moves nothing; a new one restarts the count.
        hb.observe(ns, "1", Duration::ZERO, t0 + s(8));
        hb.observe(ns, "2", Duration::ZERO, t0 + s(9));
        assert_eq!(
            verdict(terms, &hb, ns, t0 + s(12)),
            Verdict::Live { at: t0 + s(19) }
        );
        assert_eq!(
            verdict(terms, &hb, ns, t0 + s(19)),
            Verdict::Stop {
                silent: s(10),
                terms: t(10, 0)
            }
        );
        // Off: never stopped, however long.
        assert_eq!(verdict(None, &hb, ns, t0 + s(1000)), Verdict::Keep);
        hb.keep_only(&[ns.to_owned()].into());
        assert_ne!(verdict(terms, &hb, ns, t0 + s(1000)), Verdict::Keep);
        hb.forget(ns);
        assert_eq!(verdict(terms, &hb, ns, t0 + s(1000)), Verdict::Keep);
    }

    #[test]
    fn a_restart_counts_from_when_the_api_server_last_wrote_the_lease() {
        let t0 = Instant::now() + Duration::from_secs(3600);
        let mut hb = Heartbeats::default();
        hb.observe("ns", "7", Duration::from_secs(8), t0);
        assert_eq!(
            verdict(
                Some(InForce {
                    terms: t(10, 0),
                    since: t0 - Duration::from_secs(100),
                }),
                &hb,
                "ns",
                t0 + Duration::from_secs(2)
            ),
            Verdict::Stop {
                silent: Duration::from_secs(10),
                terms: t(10, 0)
            }
        );
    }

    #[test]
    fn silence_counts_from_when_the_terms_came_into_force() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut hb = Heartbeats::default();
        // Renewed at the cadence without terms; then at-most-once is agreed, 20 s later.
        hb.observe("a", "1", Duration::ZERO, t0);
        let agreed = BTreeMap::from([("a".to_owned(), t(10, 0))]);
        let terms = in_force(&BTreeMap::new(), agreed.clone(), t0 + s(20));
        let v = |at| verdict(terms.get("a").copied(), &hb, "a", at);
        // Not stopped at once for a silence from before the terms.
        assert_eq!(v(t0 + s(21)), Verdict::Live { at: t0 + s(30) });
        assert_eq!(
            v(t0 + s(30)),
            Verdict::Stop {
                silent: s(10),
                terms: t(10, 0)
            }
        );
        // The same terms seen again keep their start; changed ones start anew.
        let again = in_force(&terms, agreed, t0 + s(25));
        assert_eq!(again["a"].since, t0 + s(20));
        let changed = in_force(
            &terms,
            BTreeMap::from([("a".to_owned(), t(5, 0))]),
            t0 + s(25),
        );
        assert_eq!(changed["a"].since, t0 + s(25));
        assert!(in_force(&terms, BTreeMap::new(), t0 + s(25)).is_empty());
    }

    #[test]
    fn the_next_look_is_at_the_earliest_stop() {
        let t0 = Instant::now();
        let mut hb = Heartbeats::default();
        hb.observe("a", "1", Duration::ZERO, t0);
        hb.observe("b", "1", Duration::ZERO, t0);
        let terms = in_force(
            &BTreeMap::new(),
            BTreeMap::from([
                ("a".to_owned(), t(30, 0)),
                ("b".to_owned(), t(10, 0)),
                ("c".to_owned(), t(5, 0)),
            ]),
            t0,
        );
        let (v, next) = verdicts(&terms, &hb, t0 + Duration::from_secs(1));
        assert_eq!(next, Some(t0 + Duration::from_secs(10)));
        assert_eq!(v["c"], Verdict::Keep);
    }

    #[test]
    fn a_stopped_shadowpod_is_failed_partitioned_and_stays_so() {
        let prev = ShadowPodStatus {
            phase: Some("Running".into()),
            pod_uid: Some("p-1".into()),
            pod_conditions: vec![PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }],
            recreations: 2,
            ..Default::default()
        };
        assert!(!partitioned(&prev));
        let now = Timestamp::from_second(1000).unwrap();
        let st = stopped(&prev, Duration::from_secs(12), t(10, 0), Some(1), now);
        assert_eq!(st.phase.as_deref(), Some("Failed"));
        assert_eq!(st.reason.as_deref(), Some(PARTITIONED));
        assert_eq!(st.pod_conditions[0].status, "False");
        assert_eq!(st.recreations, 2);
        assert_eq!(st.pod_uid.as_deref(), Some("p-1"));
        assert!(partitioned(&st));
        assert!(st.conditions[0].message.contains("12s"));
    }

    #[test]
    fn the_stop_grace_is_bounded_by_the_pods_own() {
        assert_eq!(stop_grace(t(10, 30), Some(5)), 5);
        assert_eq!(stop_grace(t(10, 3), Some(30)), 3);
        assert_eq!(stop_grace(t(10, 3), None), 3);
        assert_eq!(stop_grace(t(10, 3), Some(-1)), 0);
    }

    #[test]
    fn the_partitioned_reason_is_the_apis() {
        use fabric_kube::status::Reason;
        assert_eq!(PodCreated::Partitioned.as_str(), PARTITIONED);
    }
}
