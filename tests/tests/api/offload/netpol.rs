//! NetworkPolicies of an offloaded namespace in its twin (issue 20), on a bed of their own: the
//! virtual kubelet writes a ShadowNetworkPolicy (peers selecting home pods as blocks of their
//! home addresses, pods in twins by selector), the provider's controller (in `fabric-controller
//! sharing`, with deploy/'s rights) the real NetworkPolicy, each block remapped through its
//! Configuration of the consumer. A home policy allowing ingress from a home-only pod appears
//! in the twin with that pod's remapped address; the pod's address changing, another pod
//! coming and one going follow; a peer naming another offloaded namespace selects that one's
//! twin by name; a change of the policy follows, its deletion removes both. Then the attacks,
//! with the consumer's own identity: no real NetworkPolicy anywhere, no shadow outside its
//! twins, and a shadow of its own asking for the provider's addresses or namespaces gets a
//! policy without them. No CNI enforces policies in the fixture: what is checked is what is
//! written.
use super::*;

/// Another offloaded namespace, and a namespace that stays home.
const PAY: &str = "pay";
const TOOLS: &str = "tools";

fn pay_twin() -> String {
    format!("{PAY}-{CONSUMER}")
}

/// A home pod of `ns` labelled `app`, on a real node, with `ip` as its address (its kubelet
/// played).
fn home_pod(bed: &Bed, ns: &str, name: &str, app: &str, ip: &str) {
    apply(
        &bed.consumer,
        &json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
                "spec": {"nodeName": "home-1", "containers": [{"name": "main", "image": "echo"}]}}),
    );
    set_ip(bed, ns, name, ip);
}

fn set_ip(bed: &Bed, ns: &str, name: &str, ip: &str) {
    let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}});
    bed.consumer.kubectl_ok(&[
        "patch",
        "pod",
        name,
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        &status.to_string(),
    ]);
}

/// The real NetworkPolicy `name` of the twin, as the provider's admin reads it.
fn real(bed: &Bed, name: &str) -> Option<Value> {
    in_store_twin(bed, "networkpolicy", name)
}

/// What the twin holds of policies and what was said there, for a failure's message.
fn dump(bed: &Bed) -> String {
    let get = |what: &str| {
        let o = bed
            .provider
            .kubectl(&["get", what, "-n", &store_twin(), "-o", "json"]);
        let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        serde_json::to_string(&v["items"]).unwrap_or_default()
    };
    format!(
        "--- shadows ---\n{}\n--- policies ---\n{}\n--- events ---\n{}",
        get("shadownetworkpolicies"),
        get("networkpolicies"),
        get("events.events.k8s.io")
    )
}

/// [`Bed::eventually`], failing with what the twin holds.
async fn until<T, F, Fut>(bed: &Bed, what: &str, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    match try_eventually(what, T, f).await {
        Ok(v) => v,
        Err(e) => panic!("{e}\n{}\n{}", dump(bed), bed.logs()),
    }
}

/// The first ingress rule's peers of `policy`.
fn from(policy: &Value) -> Value {
    policy["spec"]["ingress"][0]["from"].clone()
}

fn block(cidr: &str) -> Value {
    json!({"ipBlock": {"cidr": cidr}})
}

/// The consumer's own identity on the provider, in namespace `ns`.
async fn as_consumer_in<K>(bed: &Bed, ns: &str) -> Api<K>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
{
    let kubeconfig = identity::to_yaml(&identity::kubeconfig(PROVIDER, &bed.identity));
    let client = identity::client_from_kubeconfig(&kubeconfig).await.unwrap();
    Api::namespaced(client, ns)
}

#[tokio::test]
async fn an_offloaded_namespace_s_network_policies_are_in_its_twin() {
    let Some(bed) = phase_async("the bed", setup("twin-netpol", &[])).await else {
        return;
    };
    phase_async("the virtual node Ready", virtual_node_ready(&bed)).await;
    let twin = store_twin();
    phase_async("two namespaces offloaded, their twins made", async {
        for ns in [STORE, PAY, TOOLS] {
            bed.consumer.kubectl_ok(&["create", "namespace", ns]);
        }
        for ns in [STORE, PAY] {
            apply(
                &bed.consumer,
                &json!({"apiVersion": "offloading.fabric.io/v1alpha1", "kind": "NamespaceOffloading",
                        "metadata": {"name": "offloading", "namespace": ns}, "spec": {}}),
            );
        }
        set_map(&bed, &[(STORE, &twin), (PAY, &pay_twin())]).await;
        for t in [twin.clone(), pay_twin()] {
            until(&bed, "the twin made by the provider", || async {
                let o = bed.provider.kubectl(&["get", "namespace", &t]);
                o.status.success().then_some(())
            })
            .await;
        }
        fixture::provider_network(&bed.provider, "Connected").unwrap();
    })
    .await;
    phase_async(
        "a policy allowing a home-only pod in: its remapped address in the twin",
        async {
            home_pod(&bed, STORE, "client", "client", "10.244.1.7");
            home_pod(&bed, STORE, "other", "other", "10.244.1.9");
            apply(
                &bed.consumer,
                &json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                        "metadata": {"name": "db-in", "namespace": STORE, "labels": {"app": "db"}},
                        "spec": {"podSelector": {"matchLabels": {"app": "db"}},
                                 "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}],
                                              "ports": [{"port": 5432, "protocol": "TCP"}]}]}}),
            );
            let shadow = until(&bed, "the shadow in the twin", || async {
                    in_store_twin(&bed, "shadownetworkpolicy", "db-in")
                })
                .await;
            assert_eq!(
                shadow["metadata"]["labels"][REFLECTED_FROM],
                CONSUMER,
                "{shadow}"
            );
            let p = until(&bed, "the real policy, the client's address remapped", || async {
                    let p = real(&bed, "db-in")?;
                    (from(&p)
                        == json!([{"podSelector": {"matchLabels": {"app": "client"}}},
                                  block("10.245.1.7/32")]))
                    .then_some(p)
                })
                .await;
            assert_eq!(p["spec"]["podSelector"], json!({"matchLabels": {"app": "db"}}), "{p}");
            assert_eq!(p["spec"]["policyTypes"], json!(["Ingress"]), "{p}");
            assert_eq!(p["spec"]["ingress"][0]["ports"][0]["port"], 5432, "{p}");
            let labels = &p["metadata"]["labels"];
            assert_eq!(
                labels[names::network_policy::MANAGED_BY],
                names::network_policy::REFLECTED,
                "{p}"
            );
            assert_eq!(labels["app"], "db", "{p}");
            assert_eq!(
                p["metadata"]["ownerReferences"][0]["kind"],
                "ShadowNetworkPolicy",
                "{p}"
            );
        },
    )
    .await;
    phase_async("pods moving, coming and going are followed", async {
        set_ip(&bed, STORE, "client", "10.244.2.8");
        until(&bed, "the moved client's new address", || async {
            let p = real(&bed, "db-in")?;
            (from(&p)
                == json!([{"podSelector": {"matchLabels": {"app": "client"}}},
                          block("10.245.2.8/32")]))
            .then_some(())
        })
        .await;
        home_pod(&bed, STORE, "client-2", "client", "10.244.3.3");
        until(&bed, "a second client's address", || async {
            let p = real(&bed, "db-in")?;
            (from(&p)
                == json!([{"podSelector": {"matchLabels": {"app": "client"}}},
                          block("10.245.2.8/32"), block("10.245.3.3/32")]))
            .then_some(())
        })
        .await;
        bed.consumer.kubectl_ok(&[
            "delete",
            "pod",
            "client",
            "-n",
            STORE,
            "--grace-period=0",
            "--force",
        ]);
        until(&bed, "the gone client's address removed", || async {
            let p = real(&bed, "db-in")?;
            (from(&p)
                == json!([{"podSelector": {"matchLabels": {"app": "client"}}},
                          block("10.245.3.3/32")]))
            .then_some(())
        })
        .await;
    })
    .await;
    phase_async(
        "namespace selectors: another twin by name, a home-only namespace by address",
        async {
            home_pod(&bed, TOOLS, "probe", "probe", "10.244.4.4");
            apply(
                &bed.consumer,
                &json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                        "metadata": {"name": "from-others", "namespace": STORE},
                        "spec": {"podSelector": {},
                                 "ingress": [{"from": [
                                     {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": PAY}}},
                                     {"namespaceSelector": {"matchExpressions": [
                                         {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [TOOLS]}]},
                                      "podSelector": {"matchLabels": {"app": "probe"}}}]}]}}),
            );
            let p = until(&bed, "the policy with translated namespace peers", || async {
                    let p = real(&bed, "from-others")?;
                    (from(&p).as_array().map(Vec::len) == Some(2)).then_some(p)
                })
                .await;
            assert_eq!(
                from(&p),
                json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": pay_twin()}},
                        "podSelector": {}},
                       block("10.245.4.4/32")]),
                "{p}"
            );
        },
    )
    .await;
    phase_async(
        "a change of the policy follows, its deletion removes it",
        async {
            bed.consumer.kubectl_ok(&[
                "patch",
                "networkpolicy",
                "db-in",
                "-n",
                STORE,
                "--type=json",
                "-p",
                r#"[{"op":"replace","path":"/spec/ingress/0/ports/0/port","value":5433}]"#,
            ]);
            until(&bed, "the new port in the twin", || async {
                let p = real(&bed, "db-in")?;
                (p["spec"]["ingress"][0]["ports"][0]["port"] == 5433).then_some(())
            })
            .await;
            bed.consumer
                .kubectl_ok(&["delete", "networkpolicy", "db-in", "-n", STORE]);
            for kind in ["shadownetworkpolicy", "networkpolicy"] {
                until(&bed, &format!("the {kind} gone from the twin"), || async {
                    in_store_twin(&bed, kind, "db-in").is_none().then_some(())
                })
                .await;
            }
        },
    )
    .await;
    phase_async(
        "the consumer's own identity: no real policy, no shadow outside its twins",
        async {
            use fabric_api::offloading::v1alpha1::ShadowNetworkPolicy;
            use k8s_openapi::api::networking::v1::NetworkPolicy;
            let open: NetworkPolicy = serde_json::from_value(json!({
                "metadata": {"name": "open"},
                "spec": {"podSelector": {}, "ingress": [{}], "egress": [{}],
                         "policyTypes": ["Ingress", "Egress"]},
            }))
            .unwrap();
            let err = as_consumer_in::<NetworkPolicy>(&bed, &twin)
                .await
                .create(&Default::default(), &open)
                .await
                .expect_err("the consumer writing a NetworkPolicy in its twin");
            assert!(err.to_string().contains("forbidden"), "{err}");
            // Another tenant's twin (as the provider makes one, its consumer's rights bound),
            // and namespaces that are no twin.
            let gamma = "shop-gamma";
            apply(
                &bed.provider,
                &json!({"apiVersion": "v1", "kind": "Namespace",
                        "metadata": {"name": gamma, "labels": {
                            names::label::TWIN_NAMESPACE: "true",
                            names::label::REMOTE_CLUSTER: "gamma"}}}),
            );
            let shadow: ShadowNetworkPolicy = serde_json::from_value(json!({
                "apiVersion": "offloading.fabric.io/v1alpha1", "kind": "ShadowNetworkPolicy",
                "metadata": {"name": "open"},
                "spec": {"template": {"podSelector": {}, "ingress": [{}]}},
            }))
            .unwrap();
            // A shadow the provider's controller could not read (its watch would stop for
            // every consumer): refused by the API server, by the CRD's schema.
            let unreadable: kube::api::DynamicObject = serde_json::from_value(json!({
                "apiVersion": "offloading.fabric.io/v1alpha1", "kind": "ShadowNetworkPolicy",
                "metadata": {"name": "unreadable"},
                "spec": {"template": {"podSelector": "all", "ingress": {"from": 1}}},
            }))
            .unwrap();
            let kubeconfig = identity::to_yaml(&identity::kubeconfig(PROVIDER, &bed.identity));
            let client = identity::client_from_kubeconfig(&kubeconfig).await.unwrap();
            let resource = kube::api::ApiResource::erase::<ShadowNetworkPolicy>(&());
            let err = Api::<kube::api::DynamicObject>::namespaced_with(client, &twin, &resource)
                .create(&Default::default(), &unreadable)
                .await
                .expect_err("a shadow its controller cannot read");
            assert!(err.to_string().contains("podSelector"), "{err}");
            for ns in [gamma, "default", NS, &names::namespace::tenant(CONSUMER)] {
                let err = as_consumer_in::<ShadowNetworkPolicy>(&bed, ns)
                    .await
                    .create(&Default::default(), &shadow)
                    .await
                    .expect_err(&format!(
                        "the consumer writing a ShadowNetworkPolicy in {ns}"
                    ));
                assert!(err.to_string().contains("forbidden"), "{ns}: {err}");
                let err = as_consumer_in::<NetworkPolicy>(&bed, ns)
                    .await
                    .create(&Default::default(), &open)
                    .await
                    .expect_err(&format!("the consumer writing a NetworkPolicy in {ns}"));
                assert!(err.to_string().contains("forbidden"), "{ns}: {err}");
            }
        },
    )
    .await;
    phase_async(
        "a shadow of the consumer's asking for the provider's addresses gets a policy without them",
        async {
            use fabric_api::offloading::v1alpha1::ShadowNetworkPolicy;
            let evil: ShadowNetworkPolicy = serde_json::from_value(json!({
                "apiVersion": "offloading.fabric.io/v1alpha1", "kind": "ShadowNetworkPolicy",
                "metadata": {"name": "evil"},
                "spec": {"template": {"podSelector": {}, "policyTypes": ["Egress"],
                    "egress": [
                        {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}},
                                {"namespaceSelector": {}},
                                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}]},
                        {"to": [{"ipBlock": {"cidr": "10.96.0.1/32"}}], "ports": [{"port": 443}]}]}},
            }))
            .unwrap();
            as_consumer_in::<ShadowNetworkPolicy>(&bed, &twin)
                .await
                .create(&Default::default(), &evil)
                .await
                .unwrap();
            let p = until(&bed, "the evil shadow's real policy", || async { real(&bed, "evil") })
                .await;
            assert_eq!(
                p["spec"]["egress"],
                json!([{"to": [block(CONSUMER_SEEN_POD), block(CONSUMER_SEEN_EXTERNAL)]}]),
                "only the consumer's own addresses, the rule to the provider's API server gone: {p}"
            );
            bed.event(&bed.provider, &twin, "the refusal said on the shadow", |e| {
                e["regarding"]["name"] == "evil"
                    && e["reason"] == fabric_offloading::networkpolicies::controller::REFUSED
                    && e["note"].as_str().is_some_and(|n| {
                        n.contains("namespaceSelector") && n.contains("0.0.0.0/0")
                    })
            })
            .await;
        },
    )
    .await;
    phase_async(
        "a policy that lets DNS through lets the twin's pods ask the provider's DNS",
        async {
            use fabric_api::offloading::v1alpha1::ShadowNetworkPolicy;
            // As a home policy isolating egress but for DNS to the home kube-dns pod becomes.
            let dns: ShadowNetworkPolicy = serde_json::from_value(json!({
                "apiVersion": "offloading.fabric.io/v1alpha1", "kind": "ShadowNetworkPolicy",
                "metadata": {"name": "dns-only"},
                "spec": {"template": {"podSelector": {}, "policyTypes": ["Egress"],
                    "egress": [{"to": [{"ipBlock": {"cidr": "10.244.0.10/32"}}],
                                "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}]}},
            }))
            .unwrap();
            as_consumer_in::<ShadowNetworkPolicy>(&bed, &twin)
                .await
                .create(&Default::default(), &dns)
                .await
                .unwrap();
            let p = until(&bed, "the DNS policy's real policy", || async {
                real(&bed, "dns-only")
            })
            .await;
            let rules = p["spec"]["egress"].as_array().unwrap();
            assert_eq!(rules.len(), 2, "{p}");
            assert_eq!(
                rules[1],
                json!({"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                               "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                       "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}),
                "the provider's DNS pods (its --cluster-dns), on the ports the policy allows: {p}"
            );
        },
    )
    .await;
}

const CONSUMER_SEEN_POD: &str = fixture::CONSUMER_SEEN.0;
const CONSUMER_SEEN_EXTERNAL: &str = fixture::CONSUMER_SEEN.1;
