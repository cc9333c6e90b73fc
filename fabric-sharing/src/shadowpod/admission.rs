//! What the provider's validating webhook on ShadowPods decides, as a pure function of the
//! request and the tenant's state (its HTTPS edge is [`super::webhook`]):
//! - a consumer creates ShadowPods only for itself, only in namespaces labelled as its own
//!   (its tenant namespace, later its twin namespaces);
//! - the requests of its live ShadowPods stay within what its ResourceSlices were granted;
//!   finished ones (Succeeded/Failed) release their share.
use std::collections::BTreeMap;

use fabric_api::{
    authentication::v1alpha1::{ResourceSlice, Resources},
    names,
    offloading::v1alpha1::{ShadowPod, ShadowPodSpec},
};
use k8s_openapi::api::core::v1::{Container, PodSpec};
use kube::ResourceExt;

use super::decide::terminal;
use crate::quantity::{BadQuantity, milli, quantity};

/// Why a ShadowPod is refused; the message is what the consumer sees.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Denial {
    #[error("user {user:?} may not create ShadowPods for consumer {cluster:?}")]
    OtherConsumer { user: String, cluster: String },
    #[error("namespace {namespace:?} does not belong to consumer {cluster:?}")]
    ForeignNamespace { namespace: String, cluster: String },
    #[error(
        "{resource}: {requested} requested, {used} in use by live ShadowPods, {granted} granted to consumer {cluster:?}"
    )]
    OverQuota {
        cluster: String,
        resource: String,
        requested: String,
        used: String,
        granted: String,
    },
    #[error(transparent)]
    BadQuantity(#[from] BadQuantity),
}

/// The consumer cluster id a user name stands for, if it is a consumer's.
pub fn consumer_of(user: &str) -> Option<&str> {
    let prefix = names::user::consumer("");
    user.strip_prefix(prefix.as_str())
}

/// A pod's requests as the scheduler counts them, in thousandths: per resource the larger of
/// the containers' sum and any one init container; limits stand for missing requests; one
/// `pods`.
pub fn requests(spec: &PodSpec) -> Result<BTreeMap<String, i128>, BadQuantity> {
    fn of(c: &Container) -> Result<BTreeMap<String, i128>, BadQuantity> {
        let mut out = BTreeMap::new();
        let r = c.resources.as_ref();
        let limits = r.and_then(|r| r.limits.clone()).unwrap_or_default();
        let requests = r.and_then(|r| r.requests.clone()).unwrap_or_default();
        for (k, q) in limits.iter().chain(requests.iter()) {
            // Requests come second and win.
            out.insert(k.clone(), milli(&q.0)?);
        }
        Ok(out)
    }
    let mut total: BTreeMap<String, i128> = BTreeMap::new();
    for c in &spec.containers {
        for (k, v) in of(c)? {
            *total.entry(k).or_default() += v;
        }
    }
    for c in spec.init_containers.iter().flatten() {
        for (k, v) in of(c)? {
            let t = total.entry(k).or_default();
            *t = (*t).max(v);
        }
    }
    *total.entry("pods".to_owned()).or_default() += 1000;
    Ok(total)
}

/// Whether `user` may create or update ShadowPod `name` with `spec` in `namespace`
/// (whose `fabric.io/remote-cluster-id` label is `namespace_owner`), given what the consumer
/// was granted and its other ShadowPods. Users that are not consumers (the provider's admins)
/// are not limited.
pub fn admit<'a>(
    user: &str,
    namespace: &str,
    namespace_owner: Option<&str>,
    name: &str,
    spec: &ShadowPodSpec,
    granted: &Resources,
    others: impl IntoIterator<Item = &'a ShadowPod>,
) -> Result<(), Denial> {
    admit_change(
        user,
        namespace,
        namespace_owner,
        name,
        spec,
        None,
        granted,
        others,
    )
}

/// [`admit`] for a create (`old` is `None`) or an update from `old`: an update that leaves
/// the consumer and the requests as they were is not measured against the grant again, so a
/// label change still goes through after the grant shrank.
#[allow(clippy::too_many_arguments)]
pub fn admit_change<'a>(
    user: &str,
    namespace: &str,
    namespace_owner: Option<&str>,
    name: &str,
    spec: &ShadowPodSpec,
    old: Option<&ShadowPodSpec>,
    granted: &Resources,
    others: impl IntoIterator<Item = &'a ShadowPod>,
) -> Result<(), Denial> {
    let Some(consumer) = consumer_of(user) else {
        return Ok(());
    };
    let cluster = spec.cluster_id.clone();
    if consumer != cluster {
        return Err(Denial::OtherConsumer {
            user: user.to_owned(),
            cluster,
        });
    }
    if namespace_owner != Some(consumer) {
        return Err(Denial::ForeignNamespace {
            namespace: namespace.to_owned(),
            cluster,
        });
    }
    let wanted = requests(&spec.pod.spec)?;
    if let Some(old) = old
        && old.cluster_id == spec.cluster_id
        && requests(&old.pod.spec).ok().as_ref() == Some(&wanted)
    {
        return Ok(());
    }
    let mut used: BTreeMap<String, i128> = BTreeMap::new();
    let live = others.into_iter().filter(|s| {
        s.spec.cluster_id == cluster
            && !(s.namespace().as_deref() == Some(namespace) && s.name_any() == name)
            && !terminal(s.status.as_ref().and_then(|st| st.phase.as_deref()))
    });
    for s in live {
        for (k, v) in requests(&s.spec.pod.spec)? {
            *used.entry(k).or_default() += v;
        }
    }
    for (resource, requested) in wanted {
        if requested == 0 {
            continue;
        }
        let granted_milli = match granted.get(&resource) {
            Some(q) => milli(&q.0)?,
            None => 0,
        };
        let in_use = used.get(&resource).copied().unwrap_or(0);
        if in_use + requested > granted_milli {
            return Err(Denial::OverQuota {
                cluster,
                resource: resource.clone(),
                requested: shown(requested),
                used: shown(in_use),
                granted: shown(granted_milli),
            });
        }
    }
    Ok(())
}

/// What `consumer` was granted in total: the sum of the grants in the status of its
/// ResourceSlices in its tenant namespace (slices elsewhere were not answered by this
/// provider's negotiation).
pub fn granted<'a>(
    consumer: &str,
    slices: impl IntoIterator<Item = &'a ResourceSlice>,
) -> Result<Resources, BadQuantity> {
    let home = names::namespace::tenant(consumer);
    let mut total: BTreeMap<String, i128> = BTreeMap::new();
    for s in slices {
        if s.spec.consumer_cluster_id != consumer || s.namespace().as_deref() != Some(&home) {
            continue;
        }
        for (k, q) in s.status.iter().flat_map(|st| st.granted.iter()) {
            *total.entry(k.clone()).or_default() += milli(&q.0)?;
        }
    }
    Ok(total
        .into_iter()
        .map(|(k, v)| {
            let q = quantity(&k, v);
            (k, q)
        })
        .collect())
}

/// ShadowPods this webhook admitted that its cache does not show yet: they count against
/// the grant meanwhile, so two creations in quick succession cannot both take the last share.
/// One is dropped when the cache shows its ShadowPod or after `ttl` (its creation may have
/// been refused further down the API server's chain).
#[derive(Debug)]
pub struct Ledger<I> {
    ttl: std::time::Duration,
    admitted: BTreeMap<(String, String), (I, ShadowPod)>,
}

impl<I: Copy + Ord + std::ops::Sub<Output = std::time::Duration>> Ledger<I> {
    pub fn new(ttl: std::time::Duration) -> Self {
        Self {
            ttl,
            admitted: BTreeMap::new(),
        }
    }

    /// Remembers an admitted creation (with its namespace set).
    pub fn admitted(&mut self, now: I, shadow: ShadowPod) {
        let key = (shadow.namespace().unwrap_or_default(), shadow.name_any());
        self.admitted.insert(key, (now, shadow));
    }

    /// Forgets what `cached` (the cache's ShadowPods, by namespace and name) already shows
    /// and what is older than the ttl; the rest is still to be counted.
    pub fn pending(
        &mut self,
        now: I,
        cached: impl Fn(&str, &str) -> bool,
    ) -> impl Iterator<Item = &ShadowPod> {
        let ttl = self.ttl;
        self.admitted
            .retain(|(ns, name), (at, _)| now - *at < ttl && !cached(ns, name));
        self.admitted.values().map(|(_, s)| s)
    }
}

fn shown(milli: i128) -> String {
    if milli % 1000 == 0 {
        (milli / 1000).to_string()
    } else {
        format!("{milli}m")
    }
}

#[cfg(test)]
mod tests {
    use fabric_api::offloading::v1alpha1::{HomePod, PodTemplate, ShadowPodStatus};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use serde_json::json;

    use super::*;

    const NS: &str = "fabric-tenant-alpha";

    fn spec(cpu: &str) -> ShadowPodSpec {
        ShadowPodSpec {
            cluster_id: "alpha".into(),
            home: HomePod::default(),
            pod: PodTemplate {
                spec: serde_json::from_value(json!({"containers": [
                    {"name": "a", "resources": {"requests": {"cpu": cpu}}},
                ]}))
                .unwrap(),
                ..Default::default()
            },
        }
    }

    fn shadow(name: &str, cpu: &str, phase: Option<&str>) -> ShadowPod {
        let mut s = ShadowPod::new(name, spec(cpu));
        s.metadata.namespace = Some(NS.into());
        s.status = Some(ShadowPodStatus {
            phase: phase.map(Into::into),
            ..Default::default()
        });
        s
    }

    fn granted() -> Resources {
        [
            ("cpu".to_owned(), Quantity("1".into())),
            ("pods".to_owned(), Quantity("10".into())),
        ]
        .into()
    }

    const USER: &str = "fabric.io:consumer:alpha";

    #[test]
    fn within_the_grant_is_admitted() {
        let others = [shadow("a", "500m", Some("Running"))];
        assert_eq!(
            admit(
                USER,
                NS,
                Some("alpha"),
                "b",
                &spec("500m"),
                &granted(),
                &others
            ),
            Ok(())
        );
    }

    #[test]
    fn beyond_the_grant_is_refused_with_the_numbers() {
        let others = [shadow("a", "800m", Some("Running"))];
        let e = admit(
            USER,
            NS,
            Some("alpha"),
            "b",
            &spec("500m"),
            &granted(),
            &others,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "cpu: 500m requested, 800m in use by live ShadowPods, 1 granted to consumer \"alpha\""
        );
    }

    #[test]
    fn finished_shadowpods_release_their_share() {
        let others = [
            shadow("a", "800m", Some("Succeeded")),
            shadow("c", "800m", Some("Failed")),
        ];
        assert_eq!(
            admit(
                USER,
                NS,
                Some("alpha"),
                "b",
                &spec("1"),
                &granted(),
                &others
            ),
            Ok(())
        );
    }

    #[test]
    fn an_update_does_not_count_itself() {
        let others = [shadow("b", "1", Some("Running"))];
        assert_eq!(
            admit(
                USER,
                NS,
                Some("alpha"),
                "b",
                &spec("1"),
                &granted(),
                &others
            ),
            Ok(())
        );
    }

    #[test]
    fn resources_not_granted_are_refused() {
        let mut s = spec("100m");
        s.pod.spec = serde_json::from_value(json!({"containers": [
            {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
        ]}))
        .unwrap();
        let e = admit(USER, NS, Some("alpha"), "b", &s, &granted(), &[]).unwrap_err();
        assert!(
            matches!(e, Denial::OverQuota { ref resource, .. } if resource == "nvidia.com/gpu"),
            "{e}"
        );
    }

    #[test]
    fn pods_count_and_init_containers_take_the_max() {
        let p: PodSpec = serde_json::from_value(json!({
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "100m"}}},
                {"name": "b", "resources": {"requests": {"cpu": "100m"}}},
            ],
            "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "300m"}}}],
        }))
        .unwrap();
        let r = requests(&p).unwrap();
        assert_eq!((r["cpu"], r["pods"]), (300, 1000));
    }

    #[test]
    fn a_consumer_stays_in_its_own_namespaces_and_name() {
        let e = admit(USER, "default", None, "b", &spec("1"), &granted(), &[]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "namespace \"default\" does not belong to consumer \"alpha\""
        );
        let e = admit(
            "fabric.io:consumer:beta",
            NS,
            Some("alpha"),
            "b",
            &spec("1"),
            &granted(),
            &[],
        )
        .unwrap_err();
        assert!(matches!(e, Denial::OtherConsumer { .. }), "{e}");
        assert_eq!(
            admit(
                "kubelite-admin",
                "default",
                None,
                "b",
                &spec("9"),
                &granted(),
                &[]
            ),
            Ok(()),
            "the provider's own users are not limited"
        );
    }

    #[test]
    fn an_update_keeping_the_requests_passes_after_the_grant_shrank() {
        let others = [shadow("a", "900m", Some("Running"))];
        let old = spec("500m");
        let mut relabelled = spec("500m");
        relabelled.pod.labels = [("tier".to_owned(), "web".to_owned())].into();
        let change = |new: &ShadowPodSpec| {
            admit_change(
                USER,
                NS,
                Some("alpha"),
                "b",
                new,
                Some(&old),
                &granted(),
                &others,
            )
        };
        assert_eq!(change(&relabelled), Ok(()));
        assert!(matches!(
            change(&spec("600m")),
            Err(Denial::OverQuota { .. })
        ));
        let mut other = spec("500m");
        other.cluster_id = "beta".into();
        assert!(matches!(change(&other), Err(Denial::OtherConsumer { .. })));
    }

    fn slice(ns: &str, consumer: &str, cpu: &str) -> ResourceSlice {
        let mut s = ResourceSlice::new(
            "s",
            fabric_api::authentication::v1alpha1::ResourceSliceSpec {
                consumer_cluster_id: consumer.into(),
                provider_cluster_id: "p".into(),
                resources: Default::default(),
            },
        );
        s.metadata.namespace = Some(ns.into());
        s.status = Some(fabric_api::authentication::v1alpha1::ResourceSliceStatus {
            granted: [
                ("cpu".to_owned(), Quantity(cpu.into())),
                ("memory".to_owned(), Quantity("1Gi".into())),
            ]
            .into(),
            ..Default::default()
        });
        s
    }

    #[test]
    fn the_grant_is_the_sum_of_the_consumers_slices_in_its_namespace() {
        let slices = [
            slice(NS, "alpha", "500m"),
            slice(NS, "alpha", "1500m"),
            slice("fabric-tenant-beta", "alpha", "7"),
            slice(NS, "beta", "7"),
        ];
        let g = super::granted("alpha", &slices).unwrap();
        assert_eq!(g["cpu"], Quantity("2".into()));
        assert_eq!(g["memory"], Quantity("2Gi".into()));
        assert_eq!(super::granted("gamma", &slices).unwrap(), Resources::new());
    }

    #[test]
    fn the_ledger_counts_admitted_creations_until_the_cache_shows_them() {
        use std::time::{Duration, Instant};
        let t0 = Instant::now();
        let mut ledger = Ledger::new(Duration::from_secs(30));
        ledger.admitted(t0, shadow("a", "800m", None));
        let cache_has = |shown: bool| move |_: &str, name: &str| shown && name == "a";
        let pending: Vec<_> = ledger.pending(t0, cache_has(false)).cloned().collect();
        assert_eq!(pending.len(), 1);
        let e = admit(
            USER,
            NS,
            Some("alpha"),
            "b",
            &spec("500m"),
            &granted(),
            &pending,
        )
        .unwrap_err();
        assert!(matches!(e, Denial::OverQuota { .. }), "{e}");
        assert_eq!(
            ledger
                .pending(t0 + Duration::from_secs(1), cache_has(true))
                .count(),
            0,
            "the cache shows it: counted there"
        );
        ledger.admitted(t0, shadow("c", "1", None));
        assert_eq!(
            ledger
                .pending(t0 + Duration::from_secs(29), cache_has(false))
                .count(),
            1
        );
        assert_eq!(
            ledger
                .pending(t0 + Duration::from_secs(30), cache_has(false))
                .count(),
            0,
            "a creation refused further down is forgotten"
        );
    }
}
