//! What the provider's validating webhook on ShadowPods decides, as a pure function of the
//! request and the tenant's state (its HTTPS edge is [`super::webhook`]):
//! - a consumer creates ShadowPods only for itself, only in namespaces labelled as its own
//!   (its tenant namespace, later its twin namespaces);
//! - the requests of its live ShadowPods stay within what its ResourceSlices were granted;
//!   finished ones (Succeeded/Failed) release their share. What a request asks for (its pod's
//!   requests as the provider's scheduler will count them, [`fabric_api::requests`]) is
//!   decided here ([`admit_change`]); it is charged against the Tenant's `status.used`
//!   by [`super::quota`];
//! - every ShadowPod's pod, whoever writes it, keeps to the provider's [`policy`] when it is
//!   created or its pod changes ([`conforms`]).
use fabric_api::{
    authentication::v1alpha1::{ResourceSlice, Resources},
    names,
    offloading::v1alpha1::{ShadowPod, ShadowPodSpec, shadow_pod_condition},
    quantity::{Amounts, BadQuantity, milli, quantity},
    requests::{Defaults, pod_requests, with_defaults},
};
use kube::ResourceExt;

use super::{
    policy::{self, Refusal, Rules},
    resize,
};

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
    #[error(
        "consumer {cluster:?} has {max} ShadowPods here, as many as a tenant may have: delete finished ones"
    )]
    TooMany { cluster: String, max: u32 },
    /// A creation past [`within_count`]'s bound.
    #[error(
        "consumer {cluster:?} has {max} {kind}s in namespace {namespace:?}, as many as a tenant may have: delete one first"
    )]
    TooManyObjects {
        cluster: String,
        kind: String,
        namespace: String,
        max: u32,
    },
    #[error(
        "the ShadowPods of consumer {cluster:?} take {stored} bytes here; {bytes} more would pass the {max} a tenant may store"
    )]
    OverBytes {
        cluster: String,
        bytes: u64,
        stored: u64,
        max: u64,
    },
    #[error("the ShadowPod is {bytes} bytes, more than the {max} a tenant's ShadowPod may be")]
    TooLarge { bytes: u64, max: u64 },
    /// The provider's admin drained the tenant: nothing new runs for it.
    #[error(
        "consumer {cluster:?} is drained by the provider's admin: no new or larger ShadowPods, and its ShadowPods are deleted after the drain grace"
    )]
    Drained { cluster: String },
    /// A claim past what the tenant was granted of its StorageClass (boxed: the largest).
    #[error(transparent)]
    OverStorage(Box<OverStorage>),
    /// A claim of a class the tenant was granted none of.
    #[error(
        "claim {claim}: this provider does not lend StorageClass {class} to consumer {cluster:?} (granted: {granted})"
    )]
    NotGranted {
        cluster: String,
        claim: String,
        class: String,
        granted: String,
    },
    /// A claim the charge cannot read: the field and the rule.
    #[error("{0}")]
    Claim(String),
    #[error("consumer {cluster:?} has no Tenant here")]
    NoTenant { cluster: String },
    /// The charge could not be written (the API server busy or unreachable): the consumer
    /// tries again, as after any refusal.
    #[error("the usage of consumer {cluster:?} could not be charged now ({error}); try again")]
    Unaccounted { cluster: String, error: String },
    /// An update of a pod that exists the provider cannot carry to it.
    #[error(
        "spec.pod.spec.{0}: the pod runs and only the resources of its containers and sidecars change in place; delete the ShadowPod and create it again"
    )]
    NotCarried(String),
    #[error(transparent)]
    BadQuantity(#[from] BadQuantity),
    /// The pod breaks the provider's policy: the field (under the ShadowPod's `spec.pod`)
    /// and the rule.
    #[error("spec.pod.{0}")]
    Policy(#[from] Refusal),
}

/// A claim past what its tenant was granted of its StorageClass.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "claim {claim}: {asked} of StorageClass {class} asked; consumer {cluster:?} was granted {granted} of it, {claimed} is claimed, {left} is left"
)]
pub struct OverStorage {
    pub cluster: String,
    pub claim: String,
    pub class: String,
    pub asked: String,
    pub claimed: String,
    pub granted: String,
    pub left: String,
}

/// Whether the pod of a ShadowPod created (`old` is `None`) or updated from `old` keeps to
/// the provider's `rules`. An update that leaves the pod's spec (or annotations)
/// as they were does not judge them again, so that a ShadowPod stored before the policy tightened can still be relabelled,
/// have its finalizer removed and go away; its pod is refused by the controller instead.
pub fn conforms(
    spec: &ShadowPodSpec,
    old: Option<&ShadowPodSpec>,
    rules: &Rules,
) -> Result<(), Denial> {
    if old.is_none_or(|o| o.pod.spec != spec.pod.spec) {
        policy::check(&spec.pod.spec, rules)?;
    }
    if old.is_none_or(|o| o.pod.annotations != spec.pod.annotations) {
        policy::check_annotations(&spec.pod.annotations, rules.level)?;
    }
    Ok(())
}

/// Whether `user` may create one more `kind` in `namespace`, where `existing` are (those
/// listed and those admitted since): a consumer has at most `max` of each kind its Role lets
/// it create, so that it cannot fill the provider's store (or the caches of the controllers
/// that watch them). Users that are not consumers are not limited.
pub fn within_count(
    user: &str,
    kind: &str,
    namespace: &str,
    existing: usize,
    max: u32,
) -> Result<(), Denial> {
    match consumer_of(user) {
        Some(consumer) if existing >= max as usize => Err(Denial::TooManyObjects {
            cluster: consumer.to_owned(),
            kind: kind.to_owned(),
            namespace: namespace.to_owned(),
            max,
        }),
        _ => Ok(()),
    }
}

/// The consumer cluster id a user name stands for, if it is a consumer's.
pub fn consumer_of(user: &str) -> Option<&str> {
    let prefix = names::user::consumer("");
    user.strip_prefix(prefix.as_str())
}

/// What admission concludes before the grant is looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Not a consumer's request (the provider's own users): not limited.
    Unlimited,
    /// Nothing to charge: an update that asks for no more than the ShadowPod had.
    Within,
    /// To be charged against `consumer`'s grant ([`super::quota::charge`]): the
    /// ShadowPod's requests once admitted, and how much more that is than before (all of it
    /// for a creation), in thousandths.
    Charge {
        consumer: String,
        requests: Amounts,
        more: Amounts,
    },
}

/// Whether `user` may create (`old` is `None`) or update from `old` a ShadowPod with `spec`
/// in `namespace` (whose `fabric.io/remote-cluster-id` label is `namespace_owner`), and what
/// is left to charge against the consumer's grant. Users that are not consumers (the
/// provider's admins) are not limited. An update asking for no more than the ShadowPod is
/// charged ([`super::quota::charged`]: its real pod's hold included) is not measured again,
/// so a label change (or a shrink) still goes through after the grant shrank. An update of
/// a ShadowPod whose pod exists must be one the controller can carry to that pod
/// ([`resize::not_carried`]), or the pod would keep what the ShadowPod no longer says.
/// Containers asking for nothing of a resource are charged the provider's `defaults`, as
/// their real pod gets them ([`requested`]).
pub fn admit_change(
    user: &str,
    namespace: &str,
    namespace_owner: Option<&str>,
    spec: &ShadowPodSpec,
    old: Option<&ShadowPod>,
    defaults: &Defaults,
) -> Result<Verdict, Denial> {
    let Some(consumer) = consumer_of(user) else {
        return Ok(Verdict::Unlimited);
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
    if let Some(old) = old
        && !never_made(old)
        && let Some(field) = resize::not_carried(&spec.pod.spec, &old.spec.pod.spec)
    {
        return Err(Denial::NotCarried(field));
    }
    let requests = requested(spec, defaults)?;
    let before = match old {
        Some(old) if old.spec.cluster_id == spec.cluster_id => super::quota::charged(old, defaults),
        _ => Amounts::new(),
    };
    let more: Amounts = requests
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect();
    if old.is_some() && more.is_empty() {
        return Ok(Verdict::Within);
    }
    Ok(Verdict::Charge {
        consumer: cluster,
        requests,
        more,
    })
}

/// What the pod of a ShadowPod with `spec` requests of the provider's nodes once the
/// provider's `defaults` fill in what its containers leave out: what its real pod gets
/// ([`super::decide::wanted`]) and what it is charged.
pub fn requested(spec: &ShadowPodSpec, defaults: &Defaults) -> Result<Amounts, BadQuantity> {
    pod_requests(&with_defaults(&spec.pod.spec, defaults))
}

/// Whether `shadow`'s status says its pod was never made: refused by the provider's policy,
/// none made since. Anything else (no status yet, or a pod made) may have a pod running, as
/// the status is written after the pod is made.
fn never_made(shadow: &ShadowPod) -> bool {
    shadow.status.as_ref().is_some_and(|s| {
        s.pod_uid.is_none()
            && s.conditions.iter().any(|c| {
                c.type_ == shadow_pod_condition::POD_CREATED
                    && c.status == "False"
                    && c.reason
                        == fabric_kube::status::Reason::as_str(
                            &super::decide::PodCreated::Disallowed,
                        )
            })
    })
}

/// What `consumer` was granted in total: the sum of the grants in the status of its
/// ResourceSlices in its tenant namespace (slices elsewhere were not answered by this
/// provider's negotiation).
pub fn granted<'a>(
    consumer: &str,
    slices: impl IntoIterator<Item = &'a ResourceSlice>,
) -> Result<Resources, BadQuantity> {
    let home = names::namespace::tenant(consumer);
    let mut total = Amounts::new();
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

pub(crate) fn shown(milli: i128) -> String {
    if milli % 1000 == 0 {
        (milli / 1000).to_string()
    } else {
        format!("{milli}m")
    }
}

#[cfg(test)]
mod tests {
    use fabric_api::offloading::v1alpha1::{HomePod, PodTemplate};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use serde_json::json;

    use k8s_openapi::api::core::v1::PodSpec;

    use super::*;

    const NS: &str = "fabric-tenant-alpha";
    const USER: &str = "fabric.io:consumer:alpha";

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

    fn milli(pairs: &[(&str, i128)]) -> Amounts {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    }

    #[test]
    fn a_creation_is_charged_with_all_its_requests() {
        assert_eq!(
            admit_change(
                USER,
                NS,
                Some("alpha"),
                &spec("500m"),
                None,
                &Defaults::new()
            ),
            Ok(Verdict::Charge {
                consumer: "alpha".into(),
                requests: milli(&[("cpu", 500), ("pods", 1000)]),
                more: milli(&[("cpu", 500), ("pods", 1000)]),
            })
        );
    }

    #[test]
    fn a_consumer_creates_up_to_the_bound_of_each_kind() {
        assert_eq!(within_count(USER, "ResourceSlice", NS, 31, 32), Ok(()));
        let e = within_count(USER, "ResourceSlice", NS, 32, 32).unwrap_err();
        assert_eq!(
            e.to_string(),
            "consumer \"alpha\" has 32 ResourceSlices in namespace \"fabric-tenant-alpha\", as \
             many as a tenant may have: delete one first"
        );
        assert_eq!(
            within_count("kubelite-admin", "ResourceSlice", NS, 500, 32),
            Ok(())
        );
    }

    #[test]
    fn a_container_asking_for_nothing_is_charged_the_providers_defaults() {
        let defaults: Defaults = [
            ("cpu".to_owned(), Quantity("100m".into())),
            ("memory".to_owned(), Quantity("128Mi".into())),
        ]
        .into();
        let mut bare = spec("0");
        bare.pod.spec.containers[0].resources = None;
        let mem = (128 << 20) * 1000;
        let all = milli(&[("cpu", 100), ("memory", mem), ("pods", 1000)]);
        assert_eq!(
            admit_change(USER, NS, Some("alpha"), &bare, None, &defaults),
            Ok(Verdict::Charge {
                consumer: "alpha".into(),
                requests: all.clone(),
                more: all,
            })
        );
        // Its default charged already: relabelling it adds nothing; asking for more CPU adds
        // that over the default.
        let old = ShadowPod::new("web", bare.clone());
        let mut relabelled = bare.clone();
        relabelled.pod.labels = [("tier".to_owned(), "web".to_owned())].into();
        assert_eq!(
            admit_change(USER, NS, Some("alpha"), &relabelled, Some(&old), &defaults),
            Ok(Verdict::Within)
        );
        let Ok(Verdict::Charge { more, .. }) = admit_change(
            USER,
            NS,
            Some("alpha"),
            &spec("300m"),
            Some(&old),
            &defaults,
        ) else {
            panic!("a grown pod is charged");
        };
        assert_eq!(more, milli(&[("cpu", 200)]));
    }

    #[test]
    fn an_update_is_charged_with_what_it_adds_only() {
        let old = ShadowPod::new("web", spec("500m"));
        let mut relabelled = spec("500m");
        relabelled.pod.labels = [("tier".to_owned(), "web".to_owned())].into();
        let change = |new: &ShadowPodSpec| {
            admit_change(USER, NS, Some("alpha"), new, Some(&old), &Defaults::new())
        };
        assert_eq!(change(&relabelled), Ok(Verdict::Within));
        assert_eq!(change(&spec("200m")), Ok(Verdict::Within), "a shrink");
        assert_eq!(
            change(&spec("800m")),
            Ok(Verdict::Charge {
                consumer: "alpha".into(),
                requests: milli(&[("cpu", 800), ("pods", 1000)]),
                more: milli(&[("cpu", 300)]),
            })
        );
        let mut other = spec("500m");
        other.cluster_id = "beta".into();
        assert!(matches!(change(&other), Err(Denial::OtherConsumer { .. })));
    }

    /// A ShadowPod of 500m whose real pod exists and holds `held` CPU.
    fn running(held: &str) -> ShadowPod {
        let mut s = ShadowPod::new("web", spec("500m"));
        s.status = Some(fabric_api::offloading::v1alpha1::ShadowPodStatus {
            pod_uid: Some("pod-1".into()),
            reserved: [(
                "cpu".to_owned(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity(held.into()),
            )]
            .into(),
            ..Default::default()
        });
        s
    }

    #[test]
    fn what_the_running_pod_still_holds_is_not_charged_twice() {
        // Shrunk to 200m, the pod still holding 1 CPU: growing back to 800m adds nothing.
        let mut shrunk = running("1");
        shrunk.spec = spec("200m");
        let change = |new: &ShadowPodSpec| {
            admit_change(
                USER,
                NS,
                Some("alpha"),
                new,
                Some(&shrunk),
                &Defaults::new(),
            )
        };
        assert_eq!(change(&spec("800m")), Ok(Verdict::Within));
        assert_eq!(
            change(&spec("1500m")),
            Ok(Verdict::Charge {
                consumer: "alpha".into(),
                requests: milli(&[("cpu", 1500), ("pods", 1000)]),
                more: milli(&[("cpu", 500)]),
            })
        );
    }

    #[test]
    fn a_change_the_running_pod_cannot_take_is_refused_by_field() {
        let pod = running("500m");
        let change = |f: &dyn Fn(&mut ShadowPodSpec)| {
            let mut new = pod.spec.clone();
            f(&mut new);
            admit_change(USER, NS, Some("alpha"), &new, Some(&pod), &Defaults::new())
        };
        // Resources of a container: carried (a resize).
        assert_eq!(
            change(&|s| s.pod.spec = spec("100m").pod.spec),
            Ok(Verdict::Within)
        );
        let renamed = change(&|s| {
            s.pod.spec.containers[0].name = "b".into();
            s.pod.spec.containers[0].resources = None;
        });
        assert_eq!(
            renamed,
            Err(Denial::NotCarried("containers[0].name".into()))
        );
        assert_eq!(
            renamed.unwrap_err().to_string(),
            "spec.pod.spec.containers[0].name: the pod runs and only the resources of its \
             containers and sidecars change in place; delete the ShadowPod and create it again"
        );
        let init = change(&|s| {
            s.pod.spec.init_containers = Some(vec![
                serde_json::from_value(json!({"name": "setup", "image": "x"})).unwrap(),
            ])
        });
        assert_eq!(init, Err(Denial::NotCarried("initContainers".into())));
        // Before its status says anything, a pod may run already (the status is written
        // after the pod is made): refused too.
        let mut unknown = pod.clone();
        unknown.status = None;
        let mut renamed = pod.spec.clone();
        renamed.pod.spec.containers[0].name = "b".into();
        assert!(matches!(
            admit_change(
                USER,
                NS,
                Some("alpha"),
                &renamed,
                Some(&unknown),
                &Defaults::new()
            ),
            Err(Denial::NotCarried(_))
        ));
        // A pod the policy refused was never made: any change is the controller's to judge.
        let mut unmade = pod.clone();
        unmade.status = Some(fabric_api::offloading::v1alpha1::ShadowPodStatus {
            conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: shadow_pod_condition::POD_CREATED.into(),
                status: "False".into(),
                reason: "Disallowed".into(),
                message: "spec.pod.spec.hostPID: …".into(),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ),
                observed_generation: None,
            }],
            ..Default::default()
        });
        let mut new = pod.spec.clone();
        new.pod.spec.containers[0].name = "b".into();
        assert_eq!(
            admit_change(
                USER,
                NS,
                Some("alpha"),
                &new,
                Some(&unmade),
                &Defaults::new()
            ),
            Ok(Verdict::Within)
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
        let r = pod_requests(&p).unwrap();
        assert_eq!((r["cpu"], r["pods"]), (300, 1000));
        // A sidecar adds to the containers, and to the init containers after it.
        let p: PodSpec = serde_json::from_value(json!({
            "containers": [{"name": "a", "resources": {"requests": {"cpu": "100m"}}}],
            "initContainers": [
                {"name": "i", "resources": {"requests": {"cpu": "250m"}}},
                {"name": "s", "restartPolicy": "Always", "resources": {"requests": {"cpu": "200m"}}},
                {"name": "j", "resources": {"requests": {"cpu": "250m"}}},
            ],
        }))
        .unwrap();
        assert_eq!(pod_requests(&p).unwrap()["cpu"], 450);
        let p: PodSpec = serde_json::from_value(json!({
            "containers": [{"name": "a", "resources": {"requests": {"cpu": "100m"}}}],
            "initContainers": [
                {"name": "s", "restartPolicy": "Always", "resources": {"requests": {"cpu": "200m"}}},
            ],
        }))
        .unwrap();
        assert_eq!(pod_requests(&p).unwrap()["cpu"], 300);
        let p: PodSpec = serde_json::from_value(json!({"containers": [
            {"name": "a", "resources": {"limits": {"memory": "1Gi"}, "requests": {"memory": "1Mi"}}},
            {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
        ]}))
        .unwrap();
        let r = pod_requests(&p).unwrap();
        assert_eq!(r["memory"], 1000 << 20, "requests win over limits");
        assert_eq!(
            r["nvidia.com/gpu"], 1000,
            "limits stand for missing requests"
        );
    }

    #[test]
    fn the_charge_is_what_the_providers_scheduler_will_count() {
        // The RuntimeClass overhead and pod-level requests take room on the provider's node:
        // they are charged too (before they were not, and a consumer could run past its
        // grant through them).
        let mut s = spec("500m");
        s.pod.spec.overhead = Some([("cpu".to_owned(), Quantity("250m".into()))].into());
        s.pod.spec.resources =
            Some(serde_json::from_value(json!({"requests": {"memory": "1Gi"}})).unwrap());
        let Ok(Verdict::Charge { requests, .. }) =
            admit_change(USER, NS, Some("alpha"), &s, None, &Defaults::new())
        else {
            panic!("a consumer's creation is charged");
        };
        assert_eq!(
            requests,
            milli(&[("cpu", 750), ("memory", 1000 << 30), ("pods", 1000)])
        );
    }

    #[test]
    fn a_consumer_stays_in_its_own_namespaces_and_name() {
        let e =
            admit_change(USER, "default", None, &spec("1"), None, &Defaults::new()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "namespace \"default\" does not belong to consumer \"alpha\""
        );
        let e = admit_change(
            "fabric.io:consumer:beta",
            NS,
            Some("alpha"),
            &spec("1"),
            None,
            &Defaults::new(),
        )
        .unwrap_err();
        assert!(matches!(e, Denial::OtherConsumer { .. }), "{e}");
        assert_eq!(
            admit_change(
                "kubelite-admin",
                "default",
                None,
                &spec("9"),
                None,
                &Defaults::new()
            ),
            Ok(Verdict::Unlimited),
            "the provider's own users are not limited"
        );
        let e = admit_change(
            USER,
            NS,
            Some("alpha"),
            &spec("lots"),
            None,
            &Defaults::new(),
        )
        .unwrap_err();
        assert!(matches!(e, Denial::BadQuantity(_)), "{e}");
    }

    #[test]
    fn a_pod_is_judged_when_created_and_whenever_it_changes() {
        let plain = spec("100m");
        let mut privileged = spec("100m");
        privileged.pod.spec.containers[0].security_context =
            Some(serde_json::from_value(json!({"privileged": true})).unwrap());
        let level = &Rules::default();
        assert_eq!(conforms(&plain, None, level), Ok(()));
        let e = conforms(&privileged, None, level).unwrap_err();
        assert_eq!(
            e.to_string(),
            "spec.pod.spec.containers[0].securityContext.privileged: privileged containers are \
             not allowed (provider policy baseline)"
        );
        assert!(
            matches!(
                conforms(&privileged, Some(&plain), level),
                Err(Denial::Policy(_))
            ),
            "an update that makes the pod privileged"
        );
        let mut relabelled = privileged.clone();
        relabelled.pod.labels = [("tier".to_owned(), "web".to_owned())].into();
        assert_eq!(
            conforms(&relabelled, Some(&privileged), level),
            Ok(()),
            "an update leaving a stored pod as it was"
        );
        assert_eq!(conforms(&plain, Some(&privileged), level), Ok(()), "a fix");
        let mut unconfined = plain.clone();
        unconfined.pod.annotations = [(
            format!("{}main", policy::APPARMOR_ANNOTATION),
            "unconfined".to_owned(),
        )]
        .into();
        let e = conforms(&unconfined, Some(&plain), level).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("spec.pod.annotations[container.apparmor.security.beta"),
            "{e}"
        );
    }

    fn slice(ns: &str, consumer: &str, cpu: &str) -> ResourceSlice {
        let mut s = ResourceSlice::new(
            "s",
            fabric_api::authentication::v1alpha1::ResourceSliceSpec {
                consumer_cluster_id: consumer.into(),
                provider_cluster_id: "p".into(),
                resources: Default::default(),
                at_most_once: None,
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
}
