//! Opt-in reflection of custom resources (issue 20), the provider's side: which custom kinds a
//! consumer may write in its twins is the provider admin's choice, the rules of ClusterRole
//! `fabric-consumer-reflection` (which the admin creates: deploy/ does not ship it), which the NamespaceMap controller
//! (in `fabric-controller sharing`, with deploy/'s rights) binds in every twin to the
//! consumer's peering group. Driven with the consumer's own identity on the provider: before
//! the admin allows a kind, writing it in the twin is refused; once allowed, objects of that
//! kind are written there, but never their status (the provider's operator writes it; the
//! test plays the operator), never a kind not allowed, never outside the consumer's twins. The
//! admin cannot offer a status subresource, `*` or a core kind by mistake (the policy
//! fabric-consumer-reflection-rules says which field and why).
use kube::{
    api::{ApiResource, DynamicObject, PostParams},
    core::GroupVersionKind,
};

use super::*;

/// The kind the provider lets tenants write, and one it does not.
const GROUP: &str = "example.com";

fn crd(plural: &str, kind: &str) -> Value {
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": format!("{plural}.{GROUP}")},
           "spec": {"group": GROUP, "scope": "Namespaced",
                    "names": {"plural": plural, "singular": kind.to_lowercase(), "kind": kind},
                    "versions": [{"name": "v1", "served": true, "storage": true,
                                  "subresources": {"status": {}},
                                  "schema": {"openAPIV3Schema": {"type": "object",
                                      "x-kubernetes-preserve-unknown-fields": true}}}]}})
}

fn resource(plural: &str, kind: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, "v1", kind), plural)
}

/// `plural` objects of namespace `ns` on the provider, as the consumer's own identity.
async fn as_consumer(bed: &Bed, ns: &str, plural: &str, kind: &str) -> Api<DynamicObject> {
    let kubeconfig = identity::to_yaml(&identity::kubeconfig(PROVIDER, &bed.identity));
    let client = identity::client_from_kubeconfig(&kubeconfig).await.unwrap();
    Api::namespaced_with(client, ns, &resource(plural, kind))
}

fn object(kind: &str, name: &str, size: i64) -> DynamicObject {
    let mut o = DynamicObject::new(name, &resource(&format!("{}s", kind.to_lowercase()), kind));
    o.data = json!({"spec": {"size": size}});
    o
}

/// Whether `r` is the API server's refusal for want of rights.
fn forbidden<T: std::fmt::Debug>(r: &kube::Result<T>) -> bool {
    matches!(r, Err(kube::Error::Api(s)) if s.code == 403)
}

/// The admin sets the rules of the reflection ClusterRole (deploy/ does not ship it: the
/// admin creates it); the API server's answer.
fn allow(bed: &Bed, rules: Value) -> std::process::Output {
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                      "metadata": {"name": "fabric-consumer-reflection"}, "rules": rules});
    bed.provider
        .kubectl_stdin(&["apply", "-f", "-"], &role.to_string())
}

fn widget_rules(resources: &[&str]) -> Value {
    json!([{"apiGroups": [GROUP], "resources": resources,
            "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}])
}

#[tokio::test]
async fn the_provider_chooses_the_custom_kinds_a_consumer_writes_in_its_twins() {
    let Some(bed) = phase_async("the bed", setup("twin-reflect", &[])).await else {
        return;
    };
    let twin = store_twin();
    // Another consumer's twin, as far as this consumer's rights go: a namespace the
    // provider's admin made, bound to nothing of this consumer's.
    let elsewhere = "store-cluster-z";
    phase_async(
        "a namespace offloaded, its twin made; the CRDs on the provider",
        async {
            for c in [crd("widgets", "Widget"), crd("gadgets", "Gadget")] {
                apply(&bed.provider, &c);
            }
            bed.provider.kubectl_ok(&["create", "namespace", elsewhere]);
            offload_store(&bed, &twin).await;
            twin_bound(&bed, &twin).await;
            bed.eventually("the CRDs served", || async {
                let o = bed.provider.kubectl(&["get", "widgets,gadgets", "-A"]);
                o.status.success().then_some(())
            })
            .await;
        },
    )
    .await;
    phase_async(
        "no kind allowed yet: the consumer's widget refused",
        async {
            let api = as_consumer(&bed, &twin, "widgets", "Widget").await;
            let r = api
                .create(&PostParams::default(), &object("Widget", "w1", 1))
                .await;
            assert!(
                forbidden(&r),
                "a widget before the provider allows it: {r:?}"
            );
        },
    )
    .await;
    phase_async(
        "the admin cannot offer a status subresource, `*` or a core kind",
        async {
            for (rules, field) in [
                (
                    widget_rules(&["widgets", "widgets/status"]),
                    "no subresource",
                ),
                (widget_rules(&["*"]), "not '*'"),
                (
                    json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}]),
                    "the core group",
                ),
            ] {
                let o = allow(&bed, rules.clone());
                let err = String::from_utf8_lossy(&o.stderr).into_owned();
                assert!(
                    !o.status.success()
                        && err.contains("fabric-consumer-reflection")
                        && err.contains(field),
                    "{rules} accepted or refused without saying why: {err}"
                );
            }
        },
    )
    .await;
    phase_async(
        "widgets allowed: the consumer writes one in its twin",
        async {
            let o = allow(&bed, widget_rules(&["widgets"]));
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            let api = as_consumer(&bed, &twin, "widgets", "Widget").await;
            bed.eventually("the consumer's widget accepted in its twin", || async {
                api.create(&PostParams::default(), &object("Widget", "w1", 1))
                    .await
                    .ok()
            })
            .await;
            let mut w = api.get("w1").await.unwrap();
            w.data["spec"]["size"] = json!(2);
            api.replace("w1", &PostParams::default(), &w).await.unwrap();
        },
    )
    .await;
    phase_async(
        "the operator writes status; the consumer never: nor another kind, nor elsewhere",
        async {
            // The provider's operator (the admin here) answers in status.
            operator_status(&bed, &twin, r#"{"status":{"ready":true}}"#);
            let api = as_consumer(&bed, &twin, "widgets", "Widget").await;
            let w = api.get("w1").await.unwrap();
            assert_eq!(w.data["status"]["ready"], json!(true), "{w:?}");
            let r = api
                .patch_status(
                    "w1",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"ready": false}})),
                )
                .await;
            assert!(
                forbidden(&r),
                "the consumer wrote the widget's status: {r:?}"
            );
            let gadgets = as_consumer(&bed, &twin, "gadgets", "Gadget").await;
            let r = gadgets
                .create(&PostParams::default(), &object("Gadget", "g1", 1))
                .await;
            assert!(forbidden(&r), "a gadget the provider does not allow: {r:?}");
            let there = as_consumer(&bed, elsewhere, "widgets", "Widget").await;
            let r = there
                .create(&PostParams::default(), &object("Widget", "w1", 1))
                .await;
            assert!(
                forbidden(&r),
                "a widget outside the consumer's twins: {r:?}"
            );
            let r = api.delete("w1", &DeleteParams::default()).await;
            assert!(r.is_ok(), "the consumer deletes its own widget: {r:?}");
        },
    )
    .await;
}

/// The provider's operator (its admin here) writes `status` (a merge patch) on widget w1 in
/// twin `twin`.
fn operator_status(bed: &Bed, twin: &str, status: &str) {
    bed.provider.kubectl_ok(&[
        "patch",
        "widget",
        "w1",
        "-n",
        twin,
        "--subresource=status",
        "--type=merge",
        "-p",
        status,
    ]);
}

/// Waits for the provider to have made twin `twin` and bound the consumer there to
/// `fabric-consumer-reflection`, the admin's choice of kinds.
async fn twin_bound(bed: &Bed, twin: &str) {
    bed.eventually(
        "the twin's reflection binding made by the provider",
        || async {
            bed.provider
                .get_json("rolebinding", Some(twin), "fabric-consumer-reflection")
                .map(drop)
        },
    )
    .await;
}

/// A widget (or gadget) at home, as its owner writes it.
fn home_object(kind: &str, name: &str, size: i64) -> Value {
    json!({"apiVersion": format!("{GROUP}/v1"), "kind": kind,
           "metadata": {"name": name, "namespace": STORE},
           "spec": {"size": size}})
}

/// Object `name` of `plural` in `ns` of `api`, as its admin reads it (`None`: not there).
fn read(api: &ApiServer, plural: &str, ns: &str, name: &str) -> Option<Value> {
    api.get_json(plural, Some(ns), name)
}

/// ClusterRole fabric-virtual-kubelet-reflection with `rules`, as the consumer's admin creates
/// it (deploy/ does not ship it).
fn vk_role(rules: Value) -> String {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
           "metadata": {"name": "fabric-virtual-kubelet-reflection"}, "rules": rules})
    .to_string()
}

/// The consumer's side of custom-resource reflection (issue 20), with the real virtual
/// kubelet and only the rights deploy/ gives it (its home rights on widgets and gadgets are
/// what the consumer's admin puts in ClusterRole fabric-virtual-kubelet-reflection): the
/// VirtualNode controller runs it with `--reflect-custom-resource` for widgets and gadgets;
/// the provider's admin accepts widgets only. A widget of an offloaded namespace appears in
/// the twin with its spec and our marks; the status the provider's operator writes there
/// comes home onto the home widget's status; a spec change follows; a widget of the same
/// name someone else made in the twin is left alone (a Warning Event at home); the gadget
/// the provider refuses gets a `ReflectionRefused` Event at home naming the kind and no
/// object there, until the provider's admin grants gadgets: then it follows within seconds;
/// the home widget deleted, its copy goes.
#[tokio::test]
async fn a_consumer_reflects_chosen_custom_kinds_spec_out_and_status_back() {
    let kinds = [crd("widgets", "Widget"), crd("gadgets", "Gadget")];
    let Some(bed) = phase_async(
        "the bed, the CRDs at home, the virtual kubelet reflecting widgets and gadgets",
        setup_with(
            "crd-reflect",
            &[],
            &[
                "--reflect-custom-resource",
                "widgets.example.com/v1",
                "--reflect-custom-resource",
                "gadgets.example.com/v1",
                // Not served at home until its CRD is installed, late.
                "--reflect-custom-resource",
                "doohickeys.example.com/v1",
            ],
            &kinds,
        ),
    )
    .await
    else {
        return;
    };
    let twin = store_twin();
    phase_async(
        "the admins: the consumer's grants its virtual kubelets both kinds, the provider accepts widgets",
        async {
            // The API server takes a moment to put a new policy in force: a bad rule set
            // tried without persisting it until it is refused.
            bed.eventually("policy fabric-virtual-kubelet-reflection-rules in force", || async {
                let o = bed.consumer.kubectl_stdin(
                    &["apply", "--dry-run=server", "-f", "-"],
                    &vk_role(json!([{"apiGroups": [GROUP], "resources": ["widgets"],
                                     "verbs": ["update"]}])),
                );
                (!o.status.success()).then_some(())
            })
            .await;
            // Reading kinds and patching their status, no more: the policy
            // fabric-virtual-kubelet-reflection-rules says which field.
            for (rules, field) in [
                (
                    json!([{"apiGroups": [GROUP], "resources": ["widgets"],
                            "verbs": ["get", "update"]}]),
                    "rules[].verbs",
                ),
                (
                    json!([{"apiGroups": [GROUP], "resources": ["widgets/scale"],
                            "verbs": ["get"]}]),
                    "rules[].resources",
                ),
                (
                    json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]),
                    "rules[].apiGroups",
                ),
            ] {
                let o = bed
                    .consumer
                    .kubectl_stdin(&["apply", "-f", "-"], &vk_role(rules.clone()));
                let err = String::from_utf8_lossy(&o.stderr).into_owned();
                assert!(
                    !o.status.success()
                        && err.contains("fabric-virtual-kubelet-reflection")
                        && err.contains(field),
                    "{rules} accepted or refused without saying why: {err}"
                );
            }
            let o = bed.consumer.kubectl_stdin(
                &["apply", "-f", "-"],
                &vk_role(json!([
                    {"apiGroups": [GROUP], "resources": ["widgets", "gadgets"],
                     "verbs": ["get", "list", "watch"]},
                    {"apiGroups": [GROUP], "resources": ["widgets/status", "gadgets/status"],
                     "verbs": ["patch"]}])),
            );
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            for c in &kinds {
                apply(&bed.provider, c);
            }
            let o = allow(&bed, widget_rules(&["widgets"]));
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        },
    )
    .await;
    phase_async(
        "the virtual node Ready though doohickeys are not served at home, and says so",
        async {
            virtual_node_ready(&bed).await;
            bed.eventually(
                "the virtual node's CustomResourcesNotServed naming doohickeys",
                || async {
                    let c = node_condition(&bed, "CustomResourcesNotServed")?;
                    let m = c["message"].as_str().unwrap_or_default();
                    (c["status"] == "True"
                        && c["reason"] == "NotServedHere"
                        && m.contains("doohickeys.example.com/v1")
                        && m.contains("does not serve it")
                        && !m.contains("widgets"))
                    .then_some(())
                },
            )
            .await;
        },
    )
    .await;
    phase_async("a namespace offloaded, its twin made", async {
        offload_store(&bed, &twin).await;
        twin_bound(&bed, &twin).await;
    })
    .await;
    phase_async(
        "a widget at home appears in the twin with its spec",
        async {
            apply(&bed.consumer, &home_object("Widget", "w1", 1));
            bed.eventually("w1 in the twin", || async {
                let w = read(&bed.provider, "widgets", &twin, "w1")?;
                let labels = &w["metadata"]["labels"];
                (w["spec"]["size"] == json!(1)
                    && labels[names::label::REFLECTED_TO].is_string()
                    && labels[names::label::REFLECTED_FROM].is_string())
                .then_some(())
            })
            .await;
        },
    )
    .await;
    phase_async(
        "the provider's operator writes status there: it comes home",
        async {
            operator_status(&bed, &twin, r#"{"status":{"ready":true,"replicas":3}}"#);
            bed.eventually("w1's status at home", || async {
                let w = read(&bed.consumer, "widgets", STORE, "w1")?;
                (w["status"] == json!({"ready": true, "replicas": 3})).then_some(())
            })
            .await;
            // Home's spec stays home's: the status write touched nothing else.
            let w = read(&bed.consumer, "widgets", STORE, "w1").unwrap();
            assert_eq!(w["spec"]["size"], json!(1), "{w}");
            // A field the operator drops there goes at home too.
            operator_status(&bed, &twin, r#"{"status":{"replicas":null}}"#);
            bed.eventually("w1's status at home without replicas", || async {
                let w = read(&bed.consumer, "widgets", STORE, "w1")?;
                (w["status"] == json!({"ready": true})).then_some(())
            })
            .await;
        },
    )
    .await;
    phase_async("a spec change at home follows", async {
        apply(&bed.consumer, &home_object("Widget", "w1", 2));
        bed.eventually("w1's new size in the twin", || async {
            let w = read(&bed.provider, "widgets", &twin, "w1")?;
            (w["spec"]["size"] == json!(2)).then_some(())
        })
        .await;
        let w = read(&bed.provider, "widgets", &twin, "w1").unwrap();
        assert_eq!(
            w["status"]["ready"],
            json!(true),
            "the operator's status kept: {w}"
        );
    })
    .await;
    phase_async(
        "a widget someone else made in the twin is left alone, said at home",
        async {
            let mut theirs = home_object("Widget", "w2", 7);
            theirs["metadata"]["namespace"] = json!(twin);
            apply(&bed.provider, &theirs);
            apply(&bed.consumer, &home_object("Widget", "w2", 1));
            bed.event(&bed.consumer, STORE, "the not-ours Event on w2", |e| {
                e["reason"] == "FailedReflection"
                    && e["regarding"]["name"] == "w2"
                    && e["regarding"]["kind"] == "Widget"
            })
            .await;
            let w = read(&bed.provider, "widgets", &twin, "w2").unwrap();
            assert_eq!(
                w["spec"]["size"],
                json!(7),
                "someone else's widget written: {w}"
            );
            assert!(
                w["metadata"]["labels"][names::label::REFLECTED_TO].is_null(),
                "marked as ours: {w}"
            );
        },
    )
    .await;
    phase_async(
        "a gadget, which the provider does not accept: said at home, nothing there",
        async {
            apply(&bed.consumer, &home_object("Gadget", "g1", 1));
            bed.event(
                &bed.consumer,
                STORE,
                "the ReflectionRefused Event on g1",
                |e| {
                    e["reason"] == "ReflectionRefused"
                        && e["regarding"]["name"] == "g1"
                        && e["note"].as_str().is_some_and(|n| {
                            n.contains("gadgets.example.com/v1") && n.contains("does not accept")
                        })
                },
            )
            .await;
            assert!(
                read(&bed.provider, "gadgets", &twin, "g1").is_none(),
                "a gadget in the twin"
            );
            // The virtual node says so too, naming the kind; widgets are not named.
            bed.eventually(
                "the virtual node's CustomResourcesRefused naming gadgets",
                || async {
                    let c = node_condition(&bed, "CustomResourcesRefused")?;
                    let m = c["message"].as_str().unwrap_or_default();
                    (c["status"] == "True"
                        && m.contains("gadgets.example.com/v1")
                        && !m.contains("widgets"))
                    .then_some(())
                },
            )
            .await;
        },
    )
    .await;
    phase_async(
        "gadgets granted by the provider's admin: g1 follows within seconds, the condition goes",
        async {
            // Asked about, not waited out: before, a refused kind was tried again after 5 min.
            let o = allow(&bed, widget_rules(&["widgets", "gadgets"]));
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            bed.eventually("g1 in the twin", || async {
                let g = read(&bed.provider, "gadgets", &twin, "g1")?;
                (g["spec"]["size"] == json!(1)).then_some(())
            })
            .await;
            bed.eventually("CustomResourcesRefused False", || async {
                (node_condition(&bed, "CustomResourcesRefused")?["status"] == "False").then_some(())
            })
            .await;
        },
    )
    .await;
    phase_async("the home widget deleted: its copy goes", async {
        bed.consumer
            .kubectl_ok(&["delete", "widget", "w1", "-n", STORE, "--wait=false"]);
        bed.eventually("w1 gone from the twin", || async {
            read(&bed.provider, "widgets", &twin, "w1")
                .is_none()
                .then_some(())
        })
        .await;
        assert!(
            read(&bed.provider, "widgets", &twin, "w2").is_some(),
            "someone else's widget kept"
        );
    })
    .await;
    phase_async(
        "doohickeys served at home at last: the virtual kubelet takes them up",
        async {
            let doohickeys = crd("doohickeys", "Doohickey");
            apply(&bed.consumer, &doohickeys);
            apply(&bed.provider, &doohickeys);
            let o = bed.consumer.kubectl_stdin(
                &["apply", "-f", "-"],
                &vk_role(json!([
                    {"apiGroups": [GROUP], "resources": ["widgets", "gadgets", "doohickeys"],
                     "verbs": ["get", "list", "watch"]},
                    {"apiGroups": [GROUP],
                     "resources": ["widgets/status", "gadgets/status", "doohickeys/status"],
                     "verbs": ["patch"]}])),
            );
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            let o = allow(&bed, widget_rules(&["widgets", "gadgets", "doohickeys"]));
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            bed.eventually("d1 made at home, the CRD established", || async {
                fixture::apply(&bed.consumer, &home_object("Doohickey", "d1", 5)).ok()
            })
            .await;
            bed.eventually("d1 in the twin", || async {
                let d = read(&bed.provider, "doohickeys", &twin, "d1")?;
                (d["spec"]["size"] == json!(5)).then_some(())
            })
            .await;
            bed.eventually("CustomResourcesNotServed gone", || async {
                node_condition(&bed, "CustomResourcesNotServed")
                    .is_none()
                    .then_some(())
            })
            .await;
        },
    )
    .await;
}

/// The condition of type `type_` of the virtual node (None: none, or no node).
fn node_condition(bed: &Bed, type_: &str) -> Option<Value> {
    let node = bed
        .consumer
        .get_json("node", None, fabric_tests::offload_fixture::NODE)?;
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .cloned()
}
