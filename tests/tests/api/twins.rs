//! Twin namespaces on a provider, against a test API server with RBAC and admission policies
//! enforced: `fabric-controller sharing` (the NamespaceMap and ShadowPod controllers, the
//! tenant removal) and the ShadowPod webhook run as their ServiceAccounts with the rights
//! deploy/ gives them, the webhook registered as deploy/ registers it. Two consumers are
//! tenants; everything a consumer does is done with its own issued identity through kubectl
//! and raw JSON, as an attacker would.
//!
//! A twin made (its labels and annotations, the tenant's rights bound there), a ShadowPod of
//! the consumer run there and charged to its Tenant with those of its tenant namespace; the
//! attacks: a twin named kube-system, an admin's namespace, another consumer's twin, past the
//! limit of twins, a ShadowPod in another consumer's twin, a Namespace or RoleBinding made
//! directly, a map not named after its consumer, more maps than the webhook allows; a mapping
//! dropped (its twin gone, the admin's namespace left), the map deleted (every twin gone), and
//! a consumer unpeered with its map in place (its twin gone with its tenant).
use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use fabric_api::names::{self, annotation, label};
use fabric_auth::identity;
use fabric_tests::{
    ChildGuard,
    apiserver::{ApiServer, require_tools},
    offload_fixture::{self as fixture, PROVIDER},
    phase::phase,
    process::{Bin, kubectl_stdin},
    rights, sharing,
    wait::try_eventually_blocking,
};
use serde_json::{Value, json};

const ALPHA: &str = "cluster-a";
const GAMMA: &str = "cluster-c";
const T: Duration = Duration::from_secs(60);

struct Bed {
    provider: ApiServer,
    dir: PathBuf,
    /// Each consumer's own kubeconfig on the provider.
    alpha: PathBuf,
    gamma: PathBuf,
    _components: Vec<ChildGuard>,
}

impl Bed {
    fn logs(&self) -> String {
        format!(
            "--- sharing controller ---\n{}\n--- webhook ---\n{}",
            fixture::tail(&self.dir.join("sharing.log"), 30),
            fixture::tail(&self.dir.join("webhook.log"), 10),
        )
    }

    #[track_caller]
    fn eventually<T>(&self, what: &str, f: impl FnMut() -> Option<T>) -> T {
        match try_eventually_blocking(what, T, f) {
            Ok(v) => v,
            Err(e) => panic!("{e}\n{}", self.logs()),
        }
    }

    /// An object of the provider as its admin reads it (None: not there).
    fn get(&self, kind: &str, ns: Option<&str>, name: &str) -> Option<Value> {
        self.provider.get_json(kind, ns, name)
    }

    /// The status entry of `home` in `consumer`'s map.
    fn twin(&self, consumer: &str, home: &str) -> Option<Value> {
        let map = self.get(
            "namespacemap",
            Some(&names::namespace::tenant(consumer)),
            consumer,
        )?;
        map["status"]["namespaces"]
            .as_array()?
            .iter()
            .find(|s| s["home"] == home)
            .cloned()
    }

    fn twin_phase(&self, consumer: &str, home: &str, phase: &str, reason: Option<&str>) -> Value {
        self.eventually(&format!("{consumer}'s {home}: {phase} {reason:?}"), || {
            let s = self.twin(consumer, home)?;
            (s["phase"] == phase && s["reason"].as_str() == reason).then_some(s)
        })
    }
}

/// kubectl as `kubeconfig`, `args` and `stdin`: (succeeded, stdout + stderr).
fn as_consumer(kubeconfig: &Path, args: &[&str], stdin: &str) -> (bool, String) {
    let o = kubectl_stdin(kubeconfig, args, stdin);
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.success(), out)
}

fn map(consumer: &str, name: &str, mappings: &[(&str, &str)]) -> Value {
    json!({
        "apiVersion": "offloading.fabric.io/v1alpha1", "kind": "NamespaceMap",
        "metadata": { "name": name, "namespace": names::namespace::tenant(consumer) },
        "spec": {
            "clusterId": consumer,
            "namespaces": mappings.iter()
                .map(|(h, r)| json!({ "home": h, "remote": r }))
                .collect::<Vec<_>>(),
        },
    })
}

/// `consumer`'s map (named after it) with `mappings`, written by the consumer.
fn write_map(kubeconfig: &Path, consumer: &str, mappings: &[(&str, &str)]) {
    let (ok, out) = as_consumer(
        kubeconfig,
        &["apply", "-f", "-"],
        &map(consumer, consumer, mappings).to_string(),
    );
    assert!(ok, "{consumer} writing its NamespaceMap: {out}");
}

fn shadow_pod(consumer: &str, ns: &str, name: &str, cpu: &str) -> Value {
    json!({
        "apiVersion": "offloading.fabric.io/v1alpha1", "kind": "ShadowPod",
        "metadata": { "name": name, "namespace": ns },
        "spec": {
            "clusterId": consumer,
            "home": { "namespace": "shop", "name": name, "uid": format!("home-{name}") },
            "pod": { "spec": { "containers": [{ "name": "main", "image": "echo",
                "resources": { "requests": { "cpu": cpu } } }] } },
        },
    })
}

fn setup(tag: &str) -> Option<Bed> {
    if !require_tools(tag) {
        return None;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = fixture::scratch_dir(tag).unwrap();
    let caller = fabric_tests::webhook::Caller::new(&dir.join("webhook-caller")).unwrap();
    let provider = ApiServer::start_with_auth_args(tag, &caller.kubelite_args());
    provider.install_crds();
    fabric_tests::auth_service::prepare_cluster(&provider, PROVIDER);
    let p = rt.block_on(provider.client());
    let mut kubeconfigs = Vec::new();
    for consumer in [ALPHA, GAMMA] {
        rt.block_on(sharing::admit_tenant(&p, consumer)).unwrap();
        let creds = sharing::consumer_credentials(&provider, consumer).unwrap();
        let path = dir.join(format!("{consumer}.kubeconfig"));
        std::fs::write(
            &path,
            identity::to_yaml(&identity::kubeconfig(PROVIDER, &creds)),
        )
        .unwrap();
        kubeconfigs.push(path);
    }
    let kubeconfig =
        rights::component_kubeconfig(&provider, "fabric-sharing", dir.join("sharing.kubeconfig"))
            .unwrap();
    let sharing = Bin::new("fabric-controller")
        .unwrap()
        .arg("sharing")
        .kubeconfig(&kubeconfig)
        .pod_name("controller-0")
        .log(dir.join("sharing.log"))
        .spawn()
        .unwrap();
    let webhook =
        fabric_tests::webhook::start(&provider, &caller, &dir.join("webhook.log")).unwrap();
    fixture::grant(&provider, ALPHA).unwrap();
    // An admin's own namespace, with something in it.
    provider.kubectl_ok(&["create", "namespace", "prod"]);
    provider.kubectl_ok(&[
        "create",
        "configmap",
        "settings",
        "-n",
        "prod",
        "--from-literal=a=b",
    ]);
    let gamma = kubeconfigs.pop().unwrap();
    let alpha = kubeconfigs.pop().unwrap();
    Some(Bed {
        provider,
        dir,
        alpha,
        gamma,
        _components: vec![sharing, webhook],
    })
}

#[test]
fn twin_namespaces_are_made_confined_and_removed_and_never_adopted() {
    let Some(bed) = phase("the provider, its controllers and webhook", || {
        setup("twins")
    }) else {
        return;
    };
    let alpha_ns = names::namespace::tenant(ALPHA);

    phase("gamma's twin made", || {
        write_map(&bed.gamma, GAMMA, &[("web", "web-cluster-c")]);
        bed.twin_phase(GAMMA, "web", "Accepted", None);
    });
    let gamma_twin = bed.get("namespace", None, "web-cluster-c").unwrap();

    phase(
        "alpha's twin made; kube-system, prod and gamma's twin refused",
        || {
            write_map(
                &bed.alpha,
                ALPHA,
                &[
                    ("shop", "shop-cluster-a"),
                    ("sys", "kube-system"),
                    ("admin", "prod"),
                    ("steal", "web-cluster-c"),
                ],
            );
            bed.twin_phase(ALPHA, "shop", "Accepted", None);
            bed.twin_phase(ALPHA, "sys", "Refused", Some("Reserved"));
            bed.twin_phase(ALPHA, "admin", "Refused", Some("NamespaceExists"));
            let steal = bed.twin_phase(ALPHA, "steal", "Refused", Some("NamespaceExists"));
            assert!(
                steal["message"].as_str().unwrap().contains("never adopted"),
                "{steal}"
            );
        },
    );

    phase(
        "the twin: marked, the tenant's rights bound as in its tenant namespace",
        || {
            let ns = bed.get("namespace", None, "shop-cluster-a").unwrap();
            let labels = &ns["metadata"]["labels"];
            assert_eq!(labels[label::REMOTE_CLUSTER], ALPHA, "{ns}");
            assert_eq!(labels[label::TWIN_NAMESPACE], "true", "{ns}");
            assert_eq!(labels["pod-security.kubernetes.io/enforce"], "baseline");
            let ann = &ns["metadata"]["annotations"];
            assert_eq!(
                ann[annotation::TWIN_OF_MAP],
                format!("{alpha_ns}/{ALPHA}"),
                "{ns}"
            );
            assert_eq!(ann[annotation::TWIN_HOME], "shop");
            let tenant_binding = bed
                .get("rolebinding", Some(&alpha_ns), "fabric-consumer")
                .unwrap();
            let twin_binding = bed
                .get("rolebinding", Some("shop-cluster-a"), "fabric-consumer")
                .unwrap();
            assert_eq!(twin_binding["subjects"], tenant_binding["subjects"]);
            assert_eq!(twin_binding["roleRef"]["kind"], "ClusterRole");
            assert_eq!(twin_binding["roleRef"]["name"], "fabric-consumer-twin");
            // The custom kinds the provider's admin lets tenants write, to the same group.
            let reflection = bed
                .get(
                    "rolebinding",
                    Some("shop-cluster-a"),
                    "fabric-consumer-reflection",
                )
                .unwrap();
            assert_eq!(reflection["subjects"], tenant_binding["subjects"]);
            assert_eq!(reflection["roleRef"]["name"], "fabric-consumer-reflection");
            let pods = bed
                .get(
                    "rolebinding",
                    Some("shop-cluster-a"),
                    "fabric-sharing-tenant",
                )
                .unwrap();
            assert_eq!(pods["subjects"][0]["name"], "fabric-sharing");
            // Untouched: the admin's namespace and gamma's twin.
            let prod = bed.get("namespace", None, "prod").unwrap();
            assert!(
                prod["metadata"]["labels"][label::REMOTE_CLUSTER].is_null(),
                "{prod}"
            );
            assert!(prod["metadata"]["annotations"].is_null(), "{prod}");
            let gamma_now = bed.get("namespace", None, "web-cluster-c").unwrap();
            assert_eq!(gamma_now["metadata"], gamma_twin["metadata"]);
            assert!(
                bed.get("rolebinding", Some("prod"), "fabric-consumer")
                    .is_none()
            );
            // What an operator sees.
            bed.eventually("the TwinCreated and TwinRefused Events", || {
                let o = bed.provider.kubectl(&[
                    "get",
                    "events.events.k8s.io",
                    "-n",
                    &alpha_ns,
                    "-o",
                    "json",
                ]);
                let v: Value = serde_json::from_slice(&o.stdout).ok()?;
                let reasons: Vec<&str> = v["items"]
                    .as_array()?
                    .iter()
                    .filter_map(|e| e["reason"].as_str())
                    .collect();
                (reasons.contains(&"TwinCreated") && reasons.contains(&"TwinRefused")).then_some(())
            });
        },
    );

    phase(
        "a ShadowPod in the twin runs, charged with those of the tenant namespace",
        || {
            for (ns, name, cpu) in [
                ("shop-cluster-a", "in-twin", "200m"),
                (alpha_ns.as_str(), "in-tenant", "100m"),
            ] {
                let (ok, out) = as_consumer(
                    &bed.alpha,
                    &["create", "-f", "-"],
                    &shadow_pod(ALPHA, ns, name, cpu).to_string(),
                );
                assert!(ok, "alpha's ShadowPod {name}: {out}");
            }
            bed.eventually("the twin's pod, made by the ShadowPod controller", || {
                bed.get("pod", Some("shop-cluster-a"), "in-twin")
            });
            bed.eventually("alpha's Tenant charged for both", || {
                let t = bed.get("tenant", Some(&alpha_ns), ALPHA)?;
                let cpu = fabric_tests::quantity::milli(t["status"]["used"]["cpu"].as_str()?);
                (t["status"]["shadowPods"] == 2 && cpu.ok()? == 300).then_some(())
            });
        },
    );

    phase("attacks on the twins, with alpha's own identity", || {
        // A ShadowPod into gamma's twin.
        let (ok, out) = as_consumer(
            &bed.alpha,
            &["create", "-f", "-"],
            &shadow_pod(ALPHA, "web-cluster-c", "intruder", "10m").to_string(),
        );
        assert!(!ok, "alpha's ShadowPod in gamma's twin was admitted: {out}");
        assert!(
            bed.get("shadowpod", Some("web-cluster-c"), "intruder")
                .is_none()
        );
        // ... claiming to be gamma, in its own twin.
        let (ok, out) = as_consumer(
            &bed.alpha,
            &["create", "-f", "-"],
            &shadow_pod(GAMMA, "shop-cluster-a", "impostor", "10m").to_string(),
        );
        assert!(!ok, "alpha's ShadowPod naming gamma was admitted: {out}");
        // In its own twin, a pod the provider's pod policy refuses in its tenant namespace:
        // refused here too.
        for (name, pod) in [
            (
                "privileged",
                json!({ "containers": [{ "name": "main", "image": "echo",
                    "securityContext": { "privileged": true } }] }),
            ),
            (
                "host-network",
                json!({ "hostNetwork": true, "containers": [{ "name": "main", "image": "echo" }] }),
            ),
            (
                "host-path",
                json!({ "containers": [{ "name": "main", "image": "echo" }],
                    "volumes": [{ "name": "root", "hostPath": { "path": "/" } }] }),
            ),
        ] {
            let mut sp = shadow_pod(ALPHA, "shop-cluster-a", name, "10m");
            sp["spec"]["pod"]["spec"] = pod;
            let (ok, out) = as_consumer(&bed.alpha, &["create", "-f", "-"], &sp.to_string());
            assert!(
                !ok,
                "a {name} ShadowPod in alpha's own twin was admitted: {out}"
            );
            assert!(out.contains("denied the request"), "{name}: {out}");
            assert!(bed.get("shadowpod", Some("shop-cluster-a"), name).is_none());
        }
        // A Namespace, a RoleBinding of its own making.
        let ns = json!({ "apiVersion": "v1", "kind": "Namespace",
                         "metadata": { "name": "mine",
                                       "labels": { label::REMOTE_CLUSTER: ALPHA } } });
        let (ok, out) = as_consumer(&bed.alpha, &["create", "-f", "-"], &ns.to_string());
        assert!(!ok && out.contains("forbidden"), "{out}");
        let rb = json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": { "name": "more", "namespace": "shop-cluster-a" },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                         "name": "fabric-sharing-tenant" },
            "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                           "name": sharing::peering_group(ALPHA) }] });
        let (ok, out) = as_consumer(&bed.alpha, &["create", "-f", "-"], &rb.to_string());
        assert!(!ok && out.contains("forbidden"), "{out}");
        // A map in gamma's tenant namespace, and one not named after alpha in its own.
        let (ok, out) = as_consumer(
            &bed.alpha,
            &["create", "-f", "-"],
            &map(GAMMA, GAMMA, &[("x", "x-from-alpha")]).to_string(),
        );
        assert!(!ok && out.contains("forbidden"), "{out}");
        let mut other = map(ALPHA, "other", &[("x", "x-from-other")]);
        other["metadata"]["namespace"] = alpha_ns.clone().into();
        let (ok, out) = as_consumer(&bed.alpha, &["create", "-f", "-"], &other.to_string());
        assert!(ok, "{out}");
        bed.eventually("the unnamed map refused", || {
            let m = bed.get("namespacemap", Some(&alpha_ns), "other")?;
            (m["status"]["namespaces"][0]["reason"] == "NotServed").then_some(())
        });
        assert!(bed.get("namespace", None, "x-from-other").is_none());
        // As many maps as it likes: bounded by the webhook.
        let items: Vec<Value> = (0..40)
            .map(|i| map(ALPHA, &format!("flood-{i}"), &[]))
            .collect();
        let list = json!({ "apiVersion": "v1", "kind": "List", "items": items });
        let (ok, out) = as_consumer(&bed.alpha, &["create", "-f", "-"], &list.to_string());
        assert!(!ok, "40 more NamespaceMaps admitted: {out}");
        let o = bed
            .provider
            .kubectl_ok(&["get", "namespacemaps", "-n", &alpha_ns, "-o", "name"]);
        assert_eq!(
            o.lines().count(),
            fabric_offloading::shadowpod::webhook::DEFAULT_MAX_OBJECTS as usize,
            "{o}"
        );
    });

    let many: Vec<(String, String)> = (0..32)
        .map(|i| (format!("h{i}"), format!("tw-{i}-cluster-a")))
        .collect();
    phase(
        "33 twins asked for: the existing one keeps its place, the 33rd refused",
        || {
            let mut mappings = vec![("shop", "shop-cluster-a")];
            mappings.extend(many.iter().map(|(h, r)| (h.as_str(), r.as_str())));
            write_map(&bed.alpha, ALPHA, &mappings);
            bed.twin_phase(ALPHA, "h31", "Refused", Some("TooManyNamespaces"));
            bed.eventually("32 twins accepted", || {
                let map = bed.get("namespacemap", Some(&alpha_ns), ALPHA)?;
                let accepted = map["status"]["namespaces"]
                    .as_array()?
                    .iter()
                    .filter(|s| s["phase"] == "Accepted")
                    .count();
                (accepted == 32).then_some(())
            });
            assert!(bed.get("namespace", None, "tw-31-cluster-a").is_none());
            assert_eq!(
                bed.twin(ALPHA, "shop").unwrap()["phase"],
                "Accepted",
                "the existing twin lost its place"
            );
        },
    );

    phase(
        "mappings dropped: their twins go, nothing else does",
        || {
            write_map(
                &bed.alpha,
                ALPHA,
                &[("shop", "shop-cluster-a"), ("admin", "prod")],
            );
            bed.eventually("the dropped twins gone, their entries too", || {
                let gone = (0..31).all(|i| {
                    bed.get("namespace", None, &format!("tw-{i}-cluster-a"))
                        .is_none()
                });
                (gone && bed.twin(ALPHA, "h0").is_none()).then_some(())
            });
            for ns in ["prod", "kube-system", "web-cluster-c", "shop-cluster-a"] {
                assert!(bed.get("namespace", None, ns).is_some(), "{ns} was deleted");
            }
            assert!(bed.get("configmap", Some("prod"), "settings").is_some());
            // The admin's namespace is never removed for a mapping going either.
            write_map(&bed.alpha, ALPHA, &[("shop", "shop-cluster-a")]);
            bed.eventually("admin's entry gone", || {
                bed.twin(ALPHA, "admin").is_none().then_some(())
            });
            assert!(bed.get("configmap", Some("prod"), "settings").is_some());
        },
    );

    phase("the map deleted: every twin gone first", || {
        let (ok, out) = as_consumer(
            &bed.alpha,
            &[
                "delete",
                "namespacemap",
                ALPHA,
                "-n",
                &alpha_ns,
                "--wait=false",
            ],
            "",
        );
        assert!(ok, "{out}");
        bed.eventually("alpha's twin and map gone", || {
            (bed.get("namespace", None, "shop-cluster-a").is_none()
                && bed.get("namespacemap", Some(&alpha_ns), ALPHA).is_none())
            .then_some(())
        });
        assert!(bed.get("namespace", None, "prod").is_some());
        assert!(bed.get("namespace", None, "web-cluster-c").is_some());
    });

    phase(
        "gamma unpeered with its map in place: no twin left behind",
        || {
            let gamma_ns = names::namespace::tenant(GAMMA);
            let (ok, out) = as_consumer(
                &bed.gamma,
                &["delete", "tenant", GAMMA, "-n", &gamma_ns, "--wait=false"],
                "",
            );
            assert!(ok, "{out}");
            bed.eventually("gamma's twin and tenant namespace gone", || {
                (bed.get("namespace", None, "web-cluster-c").is_none()
                    && bed.get("namespace", None, &gamma_ns).is_none())
                .then_some(())
            });
        },
    );
}
