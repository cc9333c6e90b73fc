//! What the provider's validating webhook on ShadowPods decides, as a pure function of the
//! request and the tenant's state (the HTTPS edge that feeds it is still to come):
//! - a consumer creates ShadowPods only for itself, only in namespaces labelled as its own
//!   (its tenant namespace, later its twin namespaces);
//! - the requests of its live ShadowPods stay within what its ResourceSlices were granted;
//!   finished ones (Succeeded/Failed) release their share.
use std::collections::BTreeMap;

use fabric_api::{
    authentication::v1alpha1::Resources,
    names,
    offloading::v1alpha1::{ShadowPod, ShadowPodSpec},
};
use k8s_openapi::api::core::v1::{Container, PodSpec};
use kube::ResourceExt;

use super::decide::terminal;
use crate::quantity::{BadQuantity, milli};

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
pub fn admit(
    user: &str,
    namespace: &str,
    namespace_owner: Option<&str>,
    name: &str,
    spec: &ShadowPodSpec,
    granted: &Resources,
    others: &[ShadowPod],
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
    let mut used: BTreeMap<String, i128> = BTreeMap::new();
    let live = others.iter().filter(|s| {
        s.spec.cluster_id == cluster
            && !(s.namespace().as_deref() == Some(namespace) && s.name_any() == name)
            && !terminal(s.status.as_ref().and_then(|st| st.phase.as_deref()))
    });
    for s in live {
        for (k, v) in requests(&s.spec.pod.spec)? {
            *used.entry(k).or_default() += v;
        }
    }
    for (resource, requested) in requests(&spec.pod.spec)? {
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
}
