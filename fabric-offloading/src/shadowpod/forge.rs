//! The ShadowPod a consumer's pod becomes: a pure function of the pod, the provider's offer and
//! its policy, called once by the virtual kubelet when the pod is bound to its node.
//!
//! - `nodeName` cleared: the provider's scheduler places the real pod.
//! - Scheduling constraints (node selector, affinity, topology spread, scheduler and priority
//!   class names, all meaningful only at home) replaced by the offer's node selector and
//!   tolerations; the virtual node's own toleration is never carried over, so a provider that
//!   is itself a consumer cannot bounce the pod onward (no offloading loops).
//! - Host namespaces, privileged containers and hostPath volumes refused unless the provider's
//!   policy allows them: they would reach the provider's nodes themselves.
//! - No service account: `automountServiceAccountToken` false, the name cleared and the token
//!   volumes the consumer's admission injected removed (they would be filled with a token
//!   of the provider's `default` account). A pod of an offloaded namespace comes here with
//!   its token sources already replaced by Secrets of home tokens (the virtual kubelet's
//!   `tokens`); only those of an opted-out pod, or a pod offloaded pod by pod, are left.
//! - The downward API's namespace reads the home namespace ([`home_namespace`]).
//! - [`home_api`], applied by the virtual kubelet to pods of twin namespaces: their
//!   in-cluster clients reach the home API server, not the provider's.
use std::collections::BTreeMap;

use fabric_api::{
    names::{annotation, home_api, label, taint},
    offloading::v1alpha1::{HomePod, PodTemplate, ShadowPodSpec},
};
use k8s_openapi::api::core::v1::{
    Container, DownwardAPIVolumeFile, EnvVar, HostAlias, ObjectFieldSelector, Pod, PodSpec,
    Toleration,
};

/// What the provider offers the consumer's pods: where they may run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Offer {
    /// Node selector of every real pod (the provider's nodes lent to this consumer).
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations of every real pod.
    pub tolerations: Vec<Toleration>,
}

/// What the provider lets offloaded pods do on its nodes; everything off by default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    pub host_network: bool,
    pub host_pid: bool,
    pub host_ipc: bool,
    pub privileged: bool,
    pub host_path: bool,
}

/// Why a pod cannot be offloaded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refusal {
    #[error("the pod has no {0}")]
    Incomplete(&'static str),
    #[error("hostNetwork is not allowed on this provider")]
    HostNetwork,
    #[error("hostPID is not allowed on this provider")]
    HostPid,
    #[error("hostIPC is not allowed on this provider")]
    HostIpc,
    #[error("container {0:?} is privileged, which this provider does not allow")]
    Privileged(String),
    #[error("volume {0:?} is a hostPath, which this provider does not allow")]
    HostPath(String),
}

/// The name of the ShadowPod (and of its real pod) standing for home pod `namespace`/`name`
/// in the consumer's tenant namespace: `<namespace>.<name>`, unambiguous since namespaces
/// have no dots, and the same on every attempt, so that a restarted virtual kubelet finds
/// what it created instead of creating it twice. Past the 253 characters of an object
/// name, a prefix and a hash of the whole.
pub fn name(namespace: &str, name: &str) -> String {
    const MAX: usize = 253;
    let full = format!("{namespace}.{name}");
    if full.len() <= MAX {
        return full;
    }
    // FNV-1a: stable across releases, unlike std's hasher.
    let hash = full.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    });
    let prefix = full[..MAX - 17].trim_end_matches(['-', '.']);
    format!("{prefix}-{hash:016x}")
}

/// The ShadowPod spec of `pod` (of consumer `consumer`), or why it cannot run on this provider.
pub fn forge(
    pod: &Pod,
    consumer: &str,
    offer: &Offer,
    policy: &Policy,
) -> Result<ShadowPodSpec, Refusal> {
    let meta = &pod.metadata;
    let home = HomePod {
        namespace: meta
            .namespace
            .clone()
            .ok_or(Refusal::Incomplete("namespace"))?,
        name: meta.name.clone().ok_or(Refusal::Incomplete("name"))?,
        uid: meta.uid.clone().ok_or(Refusal::Incomplete("uid"))?,
    };
    let mut spec = pod.spec.clone().ok_or(Refusal::Incomplete("spec"))?;
    check(&spec, policy)?;

    spec.node_name = None;
    spec.node_selector = (!offer.node_selector.is_empty()).then(|| offer.node_selector.clone());
    spec.affinity = None;
    spec.topology_spread_constraints = None;
    spec.scheduler_name = None;
    spec.priority_class_name = None;
    spec.priority = None;
    spec.preemption_policy = None;
    let tolerations: Vec<Toleration> = offer
        .tolerations
        .iter()
        .filter(|t| t.key.as_deref() != Some(taint::VIRTUAL_NODE))
        .cloned()
        .collect();
    spec.tolerations = (!tolerations.is_empty()).then_some(tolerations);

    #[allow(deprecated)]
    {
        spec.service_account = None;
    }
    spec.service_account_name = None;
    spec.automount_service_account_token = Some(false);
    drop_token_volumes(&mut spec);
    // Debugging containers are added through their own subresource, never at creation.
    spec.ephemeral_containers = None;

    let mut labels = meta.labels.clone().unwrap_or_default();
    labels.insert(label::REMOTE_CLUSTER.to_owned(), consumer.to_owned());
    let mut annotations = template_annotations(pod);
    home_namespace(&mut spec, &mut annotations, &home.namespace);
    Ok(ShadowPodSpec {
        cluster_id: consumer.to_owned(),
        home,
        pod: PodTemplate {
            labels,
            annotations,
            spec,
        },
    })
}

/// The downward API's `metadata.namespace`, read the way it reads at home: on the provider
/// the pod lives in a twin (`<namespace>-<consumer>`) or the tenant namespace, and an
/// application that builds names, DNS suffixes or API paths from its namespace would read
/// the provider's. Environment variables get the home namespace as a literal (a pod's
/// namespace never changes); volume items read the pod's annotation
/// [`annotation::POD_HOME_NAMESPACE`], which every offloaded pod carries (a file needs a
/// source; the annotation is the pod's own, so no object more; [`template_annotations`]).
pub fn home_namespace(
    spec: &mut PodSpec,
    annotations: &mut BTreeMap<String, String>,
    namespace: &str,
) {
    let reads_namespace = |f: &Option<ObjectFieldSelector>| {
        f.as_ref().is_some_and(|f| f.field_path == NAMESPACE_FIELD)
    };
    let literal = |c: &mut Container| {
        for e in c.env.iter_mut().flatten() {
            if e.value_from
                .as_ref()
                .is_some_and(|v| reads_namespace(&v.field_ref))
            {
                e.value = Some(namespace.to_owned());
                e.value_from = None;
            }
        }
    };
    spec.containers.iter_mut().for_each(literal);
    spec.init_containers.iter_mut().flatten().for_each(literal);
    let annotated = |items: Option<&mut Vec<DownwardAPIVolumeFile>>| {
        for i in items.into_iter().flatten() {
            if reads_namespace(&i.field_ref) {
                i.field_ref = Some(ObjectFieldSelector {
                    api_version: i.field_ref.as_ref().and_then(|f| f.api_version.clone()),
                    field_path: format!(
                        "metadata.annotations['{}']",
                        annotation::POD_HOME_NAMESPACE
                    ),
                });
            }
        }
    };
    for v in spec.volumes.iter_mut().flatten() {
        annotated(v.downward_api.as_mut().and_then(|d| d.items.as_mut()));
        for s in v
            .projected
            .as_mut()
            .and_then(|p| p.sources.as_mut())
            .into_iter()
            .flatten()
        {
            annotated(s.downward_api.as_mut().and_then(|d| d.items.as_mut()));
        }
    }
    annotations.insert(
        annotation::POD_HOME_NAMESPACE.to_owned(),
        namespace.to_owned(),
    );
}

/// The annotations of the real pod of home pod `pod`: its own, and its home namespace
/// ([`annotation::POD_HOME_NAMESPACE`], which [`home_namespace`]'s volume items read).
pub fn template_annotations(pod: &Pod) -> BTreeMap<String, String> {
    let mut annotations = pod.metadata.annotations.clone().unwrap_or_default();
    annotations.insert(
        annotation::POD_HOME_NAMESPACE.to_owned(),
        pod.metadata.namespace.clone().unwrap_or_default(),
    );
    annotations
}

/// The downward API's field of a pod's namespace.
const NAMESPACE_FIELD: &str = "metadata.namespace";

/// Where an offloaded pod of a twin namespace reaches its home API server on the provider:
/// the cluster IP of the twin's [`home_api::SERVICE`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HomeApi {
    pub cluster_ip: String,
}

/// Points `spec`'s in-cluster clients at the home API server [`HomeApi`]: every container's
/// `KUBERNETES_SERVICE_HOST` is [`home_api::HOST`], resolved by host aliases of all
/// [`home_api::NAMES`] to the twin Service (ahead of any alias of the pod's own), and the
/// port variables say [`home_api::PORT`]; explicit environment overrides what the
/// provider's kubelet injects for its own API server. A variable the pod sets itself is its
/// own and kept.
pub fn home_api(spec: &mut PodSpec, at: &HomeApi) {
    let port = home_api::PORT.to_string();
    let url = format!("tcp://{}:{port}", at.cluster_ip);
    let prefix = format!("KUBERNETES_PORT_{port}_TCP");
    let vars = [
        (
            "KUBERNETES_SERVICE_HOST".to_owned(),
            home_api::HOST.to_owned(),
        ),
        ("KUBERNETES_SERVICE_PORT".to_owned(), port.clone()),
        ("KUBERNETES_SERVICE_PORT_HTTPS".to_owned(), port.clone()),
        ("KUBERNETES_PORT".to_owned(), url.clone()),
        (prefix.clone(), url),
        (format!("{prefix}_PROTO"), "tcp".to_owned()),
        (format!("{prefix}_PORT"), port),
        (format!("{prefix}_ADDR"), at.cluster_ip.clone()),
    ];
    let set = |c: &mut Container| {
        let env = c.env.get_or_insert_with(Vec::new);
        for (name, value) in &vars {
            if !env.iter().any(|e| &e.name == name) {
                env.push(EnvVar {
                    name: name.clone(),
                    value: Some(value.clone()),
                    value_from: None,
                });
            }
        }
    };
    spec.containers.iter_mut().for_each(set);
    spec.init_containers.iter_mut().flatten().for_each(set);
    let aliases = spec.host_aliases.get_or_insert_with(Vec::new);
    aliases.insert(
        0,
        HostAlias {
            ip: at.cluster_ip.clone(),
            hostnames: Some(home_api::NAMES.iter().map(|n| (*n).to_owned()).collect()),
        },
    );
}

fn check(spec: &PodSpec, policy: &Policy) -> Result<(), Refusal> {
    if spec.host_network == Some(true) && !policy.host_network {
        return Err(Refusal::HostNetwork);
    }
    if spec.host_pid == Some(true) && !policy.host_pid {
        return Err(Refusal::HostPid);
    }
    if spec.host_ipc == Some(true) && !policy.host_ipc {
        return Err(Refusal::HostIpc);
    }
    if !policy.privileged {
        let privileged = |c: &Container| {
            c.security_context
                .as_ref()
                .and_then(|s| s.privileged)
                .unwrap_or(false)
        };
        let containers = spec.containers.iter();
        let init = spec.init_containers.iter().flatten();
        if let Some(c) = containers.chain(init).find(|c| privileged(c)) {
            return Err(Refusal::Privileged(c.name.clone()));
        }
    }
    if !policy.host_path
        && let Some(v) = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.host_path.is_some())
    {
        return Err(Refusal::HostPath(v.name.clone()));
    }
    Ok(())
}

/// Removes the projected service-account token volumes (`kube-api-access-*` as admission
/// injects them) and their mounts.
fn drop_token_volumes(spec: &mut PodSpec) {
    let Some(volumes) = spec.volumes.as_mut() else {
        return;
    };
    let mut dropped = Vec::new();
    volumes.retain(|v| {
        let token = v.projected.as_ref().is_some_and(|p| {
            p.sources
                .iter()
                .flatten()
                .any(|s| s.service_account_token.is_some())
        });
        if token {
            dropped.push(v.name.clone());
        }
        !token
    });
    if volumes.is_empty() {
        spec.volumes = None;
    }
    if dropped.is_empty() {
        return;
    }
    let unmount = |c: &mut Container| {
        if let Some(mounts) = c.volume_mounts.as_mut() {
            mounts.retain(|m| !dropped.contains(&m.name));
            if mounts.is_empty() {
                c.volume_mounts = None;
            }
        }
    };
    spec.containers.iter_mut().for_each(unmount);
    spec.init_containers.iter_mut().flatten().for_each(unmount);
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        Affinity, HostPathVolumeSource, NodeAffinity, ProjectedVolumeSource, SecurityContext,
        Volume, VolumeMount, VolumeProjection,
    };
    use kube::api::ObjectMeta;
    use serde_json::json;

    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": "web", "namespace": "shop", "uid": "u-1",
                "labels": {"app": "web"}, "annotations": {"note": "kept"},
            },
            "spec": {
                "nodeName": "fabric-provider",
                "nodeSelector": {"kubernetes.io/hostname": "fabric-provider"},
                "schedulerName": "home-scheduler",
                "priorityClassName": "home-high",
                "serviceAccountName": "web",
                "containers": [{
                    "name": "main", "image": "echo",
                    "resources": {"requests": {"cpu": "100m"}},
                    "volumeMounts": [
                        {"name": "data", "mountPath": "/data"},
                        {"name": "kube-api-access-x", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
                    ],
                }],
                "volumes": [
                    {"name": "data", "emptyDir": {}},
                    {"name": "kube-api-access-x", "projected": {"sources": [
                        {"serviceAccountToken": {"path": "token"}},
                    ]}},
                ],
                "tolerations": [
                    {"key": taint::VIRTUAL_NODE, "operator": "Exists", "effect": "NoExecute"},
                    {"key": "home-only", "operator": "Exists"},
                ],
            },
        }))
        .unwrap()
    }

    fn offer() -> Offer {
        Offer {
            node_selector: BTreeMap::from([("pool".into(), "lent".into())]),
            tolerations: vec![Toleration {
                key: Some("lent".into()),
                operator: Some("Exists".into()),
                ..Default::default()
            }],
        }
    }

    fn forged(pod: &Pod) -> Result<ShadowPodSpec, Refusal> {
        forge(pod, "alpha", &offer(), &Policy::default())
    }

    #[test]
    fn the_home_pod_and_consumer_are_recorded() {
        let s = forged(&pod()).unwrap();
        assert_eq!(s.cluster_id, "alpha");
        assert_eq!(
            s.home,
            HomePod {
                namespace: "shop".into(),
                name: "web".into(),
                uid: "u-1".into()
            }
        );
        assert_eq!(s.pod.labels["app"], "web");
        assert_eq!(s.pod.labels[label::REMOTE_CLUSTER], "alpha");
        assert_eq!(s.pod.annotations["note"], "kept");
        let resources = s.pod.spec.containers[0].resources.as_ref().unwrap();
        assert_eq!(resources.requests.as_ref().unwrap()["cpu"].0, "100m");
    }

    #[test]
    fn scheduling_is_the_offers() {
        let mut p = pod();
        p.spec.as_mut().unwrap().affinity = Some(Affinity {
            node_affinity: Some(NodeAffinity::default()),
            ..Default::default()
        });
        let s = forged(&p).unwrap().pod.spec;
        assert_eq!(s.node_name, None);
        assert_eq!(s.node_selector, Some(offer().node_selector));
        assert_eq!(s.affinity, None);
        assert_eq!(s.scheduler_name, None);
        assert_eq!(s.priority_class_name, None);
        let keys: Vec<_> = s.tolerations.unwrap().into_iter().map(|t| t.key).collect();
        assert_eq!(
            keys,
            vec![Some("lent".to_owned())],
            "home tolerations dropped"
        );
    }

    #[test]
    fn the_virtual_node_toleration_never_crosses() {
        let mut o = offer();
        o.tolerations.push(Toleration {
            key: Some(taint::VIRTUAL_NODE.into()),
            operator: Some("Exists".into()),
            ..Default::default()
        });
        let s = forge(&pod(), "alpha", &o, &Policy::default()).unwrap();
        let tolerations = s.pod.spec.tolerations.unwrap();
        assert!(
            tolerations
                .iter()
                .all(|t| t.key.as_deref() != Some(taint::VIRTUAL_NODE))
        );
        let bare = Offer::default();
        let s = forge(&pod(), "alpha", &bare, &Policy::default()).unwrap();
        assert_eq!(s.pod.spec.tolerations, None);
        assert_eq!(s.pod.spec.node_selector, None);
    }

    #[test]
    fn no_service_account_token_reaches_the_provider() {
        let s = forged(&pod()).unwrap().pod.spec;
        assert_eq!(s.automount_service_account_token, Some(false));
        assert_eq!(s.service_account_name, None);
        let volumes: Vec<_> = s.volumes.unwrap().into_iter().map(|v| v.name).collect();
        assert_eq!(volumes, vec!["data"]);
        let mounts: Vec<_> = s.containers[0]
            .volume_mounts
            .clone()
            .unwrap()
            .into_iter()
            .map(|m| m.name)
            .collect();
        assert_eq!(mounts, vec!["data"]);
    }

    #[test]
    fn host_namespaces_are_refused_unless_allowed() {
        type Set = fn(&mut PodSpec);
        let cases: [(Set, Refusal, Policy); 3] = [
            (
                |s| s.host_network = Some(true),
                Refusal::HostNetwork,
                Policy {
                    host_network: true,
                    ..Default::default()
                },
            ),
            (
                |s| s.host_pid = Some(true),
                Refusal::HostPid,
                Policy {
                    host_pid: true,
                    ..Default::default()
                },
            ),
            (
                |s| s.host_ipc = Some(true),
                Refusal::HostIpc,
                Policy {
                    host_ipc: true,
                    ..Default::default()
                },
            ),
        ];
        for (set, refusal, allowing) in cases {
            let mut p = pod();
            set(p.spec.as_mut().unwrap());
            assert_eq!(forged(&p), Err(refusal));
            assert!(forge(&p, "alpha", &offer(), &allowing).is_ok());
        }
    }

    #[test]
    fn privileged_containers_are_refused_unless_allowed() {
        let mut p = pod();
        let spec = p.spec.as_mut().unwrap();
        let mut init = spec.containers[0].clone();
        init.name = "setup".into();
        init.volume_mounts = None;
        init.security_context = Some(SecurityContext {
            privileged: Some(true),
            ..Default::default()
        });
        spec.init_containers = Some(vec![init]);
        assert_eq!(forged(&p), Err(Refusal::Privileged("setup".into())));
        let allowing = Policy {
            privileged: true,
            ..Default::default()
        };
        assert!(forge(&p, "alpha", &offer(), &allowing).is_ok());
    }

    #[test]
    fn host_paths_are_refused_unless_allowed() {
        let mut p = pod();
        p.spec
            .as_mut()
            .unwrap()
            .volumes
            .as_mut()
            .unwrap()
            .push(Volume {
                name: "root".into(),
                host_path: Some(HostPathVolumeSource {
                    path: "/".into(),
                    ..Default::default()
                }),
                ..Default::default()
            });
        assert_eq!(forged(&p), Err(Refusal::HostPath("root".into())));
        let allowing = Policy {
            host_path: true,
            ..Default::default()
        };
        let s = forge(&p, "alpha", &offer(), &allowing).unwrap();
        assert_eq!(s.pod.spec.volumes.unwrap().len(), 2, "data and root");
    }

    #[test]
    fn a_pod_without_identity_or_spec_is_refused() {
        let mut p = pod();
        p.metadata.uid = None;
        assert_eq!(forged(&p), Err(Refusal::Incomplete("uid")));
        let p = Pod {
            metadata: ObjectMeta {
                name: Some("x".into()),
                namespace: Some("y".into()),
                uid: Some("z".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(forged(&p), Err(Refusal::Incomplete("spec")));
    }

    #[test]
    fn names_are_deterministic_distinct_and_bounded() {
        assert_eq!(name("shop", "web"), "shop.web");
        assert_ne!(name("a-b", "c"), name("a", "b-c"));
        let long = "x".repeat(253);
        let n = name("shop", &long);
        assert!(n.len() <= 253, "{}", n.len());
        assert_eq!(n, name("shop", &long));
        assert_ne!(n, name("shoq", &long));
    }

    #[test]
    fn in_cluster_clients_are_pointed_at_the_home_api_server() {
        let mut p = pod();
        let spec = p.spec.as_mut().unwrap();
        let mut init = spec.containers[0].clone();
        init.name = "setup".into();
        // Its own choice of port stays.
        init.env = Some(vec![EnvVar {
            name: "KUBERNETES_SERVICE_PORT".into(),
            value: Some("8443".into()),
            value_from: None,
        }]);
        spec.init_containers = Some(vec![init]);
        spec.host_aliases = Some(vec![HostAlias {
            ip: "10.0.0.9".into(),
            hostnames: Some(vec!["kubernetes.default.svc".into(), "db".into()]),
        }]);
        let mut s = forged(&p).unwrap().pod.spec;
        home_api(
            &mut s,
            &HomeApi {
                cluster_ip: "10.96.3.4".into(),
            },
        );
        let env = |c: &Container| -> BTreeMap<String, String> {
            c.env
                .iter()
                .flatten()
                .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
                .collect()
        };
        let main = env(&s.containers[0]);
        assert_eq!(main["KUBERNETES_SERVICE_HOST"], "kubernetes.default.svc");
        assert_eq!(main["KUBERNETES_SERVICE_PORT"], "443");
        assert_eq!(main["KUBERNETES_SERVICE_PORT_HTTPS"], "443");
        assert_eq!(main["KUBERNETES_PORT"], "tcp://10.96.3.4:443");
        assert_eq!(main["KUBERNETES_PORT_443_TCP_ADDR"], "10.96.3.4");
        assert_eq!(main["KUBERNETES_PORT_443_TCP_PORT"], "443");
        assert_eq!(main["KUBERNETES_PORT_443_TCP_PROTO"], "tcp");
        let setup = env(&s.init_containers.as_ref().unwrap()[0]);
        assert_eq!(setup["KUBERNETES_SERVICE_HOST"], "kubernetes.default.svc");
        assert_eq!(
            setup["KUBERNETES_SERVICE_PORT"], "8443",
            "the pod's own kept"
        );
        let setup_env = s.init_containers.as_ref().unwrap()[0].env.as_ref().unwrap();
        assert_eq!(
            setup_env
                .iter()
                .filter(|e| e.name == "KUBERNETES_SERVICE_PORT")
                .count(),
            1
        );
        let aliases = s.host_aliases.unwrap();
        assert_eq!(aliases.len(), 2);
        assert_eq!(aliases[0].ip, "10.96.3.4", "ahead of the pod's own");
        assert_eq!(
            aliases[0].hostnames.as_deref().unwrap(),
            [
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local"
            ]
        );
        assert_eq!(aliases[1].ip, "10.0.0.9");
    }

    #[test]
    fn only_token_projections_are_dropped() {
        let mut p = pod();
        let spec = p.spec.as_mut().unwrap();
        spec.volumes.as_mut().unwrap().push(Volume {
            name: "config".into(),
            projected: Some(ProjectedVolumeSource {
                sources: Some(vec![VolumeProjection::default()]),
                ..Default::default()
            }),
            ..Default::default()
        });
        spec.containers[0]
            .volume_mounts
            .as_mut()
            .unwrap()
            .push(VolumeMount {
                name: "config".into(),
                mount_path: "/config".into(),
                ..Default::default()
            });
        let s = forged(&p).unwrap().pod.spec;
        let volumes: Vec<_> = s.volumes.unwrap().into_iter().map(|v| v.name).collect();
        assert_eq!(volumes, vec!["data", "config"]);
    }

    #[test]
    fn the_downward_api_reads_the_home_namespace() {
        let mut p = pod();
        let spec = p.spec.as_mut().unwrap();
        let ns_ref = json!({"fieldRef": {"fieldPath": "metadata.namespace"}});
        spec.containers[0].env = Some(
            serde_json::from_value(json!([
                {"name": "NS", "valueFrom": ns_ref},
                {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "PLAIN", "value": "x"},
            ]))
            .unwrap(),
        );
        spec.init_containers = Some(vec![
            serde_json::from_value(
                json!({"name": "setup", "env": [{"name": "NS", "valueFrom": ns_ref}]}),
            )
            .unwrap(),
        ]);
        let items = json!([
            {"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}},
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
        ]);
        spec.volumes.as_mut().unwrap().extend([
            serde_json::from_value::<Volume>(
                json!({"name": "info", "downwardAPI": {"items": items}}),
            )
            .unwrap(),
            serde_json::from_value(json!({"name": "mixed", "projected": {"sources": [
                {"configMap": {"name": "settings"}},
                {"downwardAPI": {"items": items}},
            ]}}))
            .unwrap(),
        ]);
        let forged = forged(&p).unwrap().pod;
        assert_eq!(forged.annotations[annotation::POD_HOME_NAMESPACE], "shop");
        assert_eq!(forged.annotations["note"], "kept", "the pod's own stay");
        let s = forged.spec;
        let env = serde_json::to_value(&s.containers[0].env).unwrap();
        assert_eq!(
            env,
            json!([
                {"name": "NS", "value": "shop"},
                {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "PLAIN", "value": "x"},
            ]),
            "only the namespace becomes a literal"
        );
        let init = serde_json::to_value(&s.init_containers.unwrap()[0].env).unwrap();
        assert_eq!(init, json!([{"name": "NS", "value": "shop"}]));
        let read = json!([
            {"path": "namespace", "fieldRef": {"apiVersion": "v1",
             "fieldPath": "metadata.annotations['offloading.fabric.io/home-namespace']"}},
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
        ]);
        let volumes = serde_json::to_value(s.volumes.unwrap()).unwrap();
        assert_eq!(volumes[1]["downwardAPI"]["items"], read, "{volumes}");
        assert_eq!(
            volumes[2]["projected"]["sources"][1]["downwardAPI"]["items"], read,
            "{volumes}"
        );
    }

    #[test]
    fn every_real_pod_says_its_home_namespace() {
        assert_eq!(
            template_annotations(&pod()),
            BTreeMap::from([
                ("note".to_owned(), "kept".to_owned()),
                (annotation::POD_HOME_NAMESPACE.to_owned(), "shop".to_owned()),
            ])
        );
    }
}
