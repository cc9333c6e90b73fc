//! The consumer's pod webhook of offloaded namespaces (`fabric-controller shadowpod-webhook`,
//! path `/mutate/pods`), run as its ServiceAccount with the rights deploy/ gives it and
//! registered as deploy/ registers it: pods created with plain kubectl, as an app team creates
//! them, are stored with the virtual nodes' toleration and the node affinity of their
//! namespace's pod strategy (read back from the API server), a pod of a namespace that is not
//! labelled is left alone, a labelled namespace without a NamespaceOffloading refuses pods
//! saying how to fix it, and a pod's own required affinity is crossed with the imposed one.
//! The NamespaceOffloadings are written by the test, as the consumer's controller would leave
//! them.
use fabric_api::names::{self, label, taint};
use fabric_tests::{
    apiserver::{ApiServer, require_tools},
    offload_fixture as fixture,
    phase::phase,
    webhook::Caller,
};
use serde_json::{Value, json};

const REQUIRED: &str = "requiredDuringSchedulingIgnoredDuringExecution";

fn create(api: &ApiServer, obj: &Value) -> std::process::Output {
    api.kubectl_stdin(&["create", "-f", "-"], &obj.to_string())
}

fn create_ok(api: &ApiServer, obj: &Value) {
    let o = create(api, obj);
    assert!(
        o.status.success(),
        "creating {obj}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn namespace(api: &ApiServer, name: &str, labelled: bool) {
    let labels = if labelled {
        json!({ label::SCHEDULING_ENABLED: "true" })
    } else {
        json!({})
    };
    create_ok(
        api,
        &json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": name, "labels": labels}}),
    );
}

fn offloading(api: &ApiServer, ns: &str, strategy: &str, selector: Option<Value>) {
    let mut spec = json!({"podOffloadingStrategy": strategy});
    if let Some(s) = selector {
        spec["clusterSelector"] = s;
    }
    create_ok(
        api,
        &json!({"apiVersion": "offloading.fabric.io/v1alpha1", "kind": "NamespaceOffloading",
                "metadata": {"name": "offloading", "namespace": ns}, "spec": spec}),
    );
}

/// A pod as an app team writes it, with `extra` merged into its spec.
fn pod(ns: &str, name: &str, extra: Value) -> Value {
    let mut spec = json!({"containers": [{"name": "app", "image": "registry.example/app:1"}]});
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        spec[k] = v;
    }
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

fn stored(api: &ApiServer, ns: &str, name: &str) -> Value {
    serde_json::from_str(&api.kubectl_ok(&["get", "pod", name, "-n", ns, "-o", "json"])).unwrap()
}

fn toleration() -> Value {
    json!({"key": taint::VIRTUAL_NODE, "operator": "Exists", "effect": "NoExecute"})
}

fn ours(p: &Value) -> usize {
    p["spec"]["tolerations"]
        .as_array()
        .map_or(0, |t| t.iter().filter(|t| **t == toleration()).count())
}

fn required(p: &Value) -> Value {
    p["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"].clone()
}

fn node_type(operator: &str) -> Value {
    json!({"key": label::NODE_TYPE, "operator": operator, "values": [label::VIRTUAL_NODE_TYPE]})
}

#[test]
fn pods_of_offloaded_namespaces_are_placed_as_their_strategy_says() {
    let tag = "podplace";
    if !require_tools(tag) {
        return;
    }
    let dir = fixture::scratch_dir(tag).unwrap();
    let caller = Caller::new(&dir.join("webhook-caller")).unwrap();
    let api = ApiServer::start_with_auth_args(tag, &caller.kubelite_args());
    api.install_crds();
    api.kubectl_ok(&["create", "namespace", names::DEFAULT_NAMESPACE]);
    phase(
        "a webhook that cannot listen exits without publishing its CA",
        || cannot_listen(&api, &caller, &dir),
    );
    // As its pod: its ServiceAccount's token, with the rights deploy/ gives it, registered as
    // deploy/ registers it.
    let _webhook = fabric_tests::webhook::start(&api, &caller, &dir.join("webhook.log")).unwrap();
    let eu = json!({"key": "region", "operator": "In", "values": ["eu"]});
    let gpu = json!({"key": "gpu", "operator": "Exists"});
    let selector = json!({"nodeSelectorTerms": [{"matchExpressions": [eu]},
                                                {"matchExpressions": [gpu]}]});

    phase("Remote: virtual nodes only, on every selector term", || {
        namespace(&api, "remote", true);
        // The pod right after its NamespaceOffloading: read afresh if the cache lags.
        offloading(&api, "remote", "Remote", Some(selector.clone()));
        create_ok(&api, &pod("remote", "web", json!({})));
        let p = stored(&api, "remote", "web");
        assert_eq!(ours(&p), 1, "{}", p["spec"]);
        assert_eq!(
            required(&p),
            json!([{"matchExpressions": [eu, node_type("In")]},
                   {"matchExpressions": [gpu, node_type("In")]}]),
            "{}",
            p["spec"]
        );
        // A pod that already tolerates the taint is not given it twice.
        create_ok(
            &api,
            &pod("remote", "tolerant", json!({"tolerations": [toleration()]})),
        );
        assert_eq!(ours(&stored(&api, "remote", "tolerant")), 1);
    });

    phase(
        "LocalAndRemote: the selected virtual nodes or the real ones",
        || {
            namespace(&api, "both", true);
            offloading(&api, "both", "LocalAndRemote", Some(selector.clone()));
            create_ok(&api, &pod("both", "web", json!({})));
            let p = stored(&api, "both", "web");
            assert_eq!(ours(&p), 1, "{}", p["spec"]);
            assert_eq!(
                required(&p),
                json!([{"matchExpressions": [eu]}, {"matchExpressions": [gpu]},
                   {"matchExpressions": [node_type("NotIn")]}]),
                "{}",
                p["spec"]
            );
            // Without a selector every node fits: the toleration only.
            namespace(&api, "anywhere", true);
            offloading(&api, "anywhere", "LocalAndRemote", None);
            create_ok(&api, &pod("anywhere", "web", json!({})));
            let p = stored(&api, "anywhere", "web");
            assert_eq!(ours(&p), 1, "{}", p["spec"]);
            assert!(p["spec"].get("affinity").is_none(), "{}", p["spec"]);
        },
    );

    phase("Local, and a namespace not offloaded: untouched", || {
        namespace(&api, "local", true);
        offloading(&api, "local", "Local", Some(selector.clone()));
        namespace(&api, "plain", false);
        for ns in ["local", "plain"] {
            create_ok(&api, &pod(ns, "web", json!({})));
            let p = stored(&api, ns, "web");
            assert_eq!(ours(&p), 0, "{ns}: {}", p["spec"]);
            assert!(p["spec"].get("affinity").is_none(), "{ns}: {}", p["spec"]);
        }
    });

    phase(
        "a labelled namespace without NamespaceOffloading refuses, saying how to fix it",
        || {
            namespace(&api, "pending", true);
            let o = create(&api, &pod("pending", "web", json!({})));
            assert!(!o.status.success(), "a pod was admitted unplaced");
            let err = String::from_utf8_lossy(&o.stderr);
            for needed in [
                "has no NamespaceOffloading",
                "fabricctl offload namespace pending",
                "kubectl label namespace pending offloading.fabric.io/scheduling-enabled-",
            ] {
                assert!(err.contains(needed), "{needed:?} missing from: {err}");
            }
            let o = api.kubectl(&["get", "pod", "web", "-n", "pending"]);
            assert!(!o.status.success(), "the refused pod was stored");
            // Once offloaded, the same pod is admitted and placed.
            offloading(&api, "pending", "Remote", None);
            create_ok(&api, &pod("pending", "web", json!({})));
            let p = stored(&api, "pending", "web");
            assert_eq!(
                required(&p),
                json!([{"matchExpressions": [node_type("In")]}])
            );
        },
    );

    phase(
        "a pod's own required affinity is crossed with the strategy's",
        || {
            namespace(&api, "own", true);
            offloading(&api, "own", "Remote", Some(selector.clone()));
            let zone = json!({"key": "zone", "operator": "In", "values": ["a"]});
            let host = json!({"key": "metadata.name", "operator": "In", "values": ["n1"]});
            let disk = json!({"key": "disk", "operator": "In", "values": ["ssd"]});
            let preferred = json!([{"weight": 10, "preference": {"matchExpressions": [disk]}}]);
            let affinity = json!({"nodeAffinity": {
                REQUIRED: {"nodeSelectorTerms": [
                    {"matchExpressions": [zone]},
                    {"matchFields": [host]},
                ]},
                "preferredDuringSchedulingIgnoredDuringExecution": preferred,
            }});
            create_ok(&api, &pod("own", "web", json!({"affinity": affinity})));
            let p = stored(&api, "own", "web");
            assert_eq!(
                required(&p),
                json!([
                    {"matchExpressions": [zone, eu, node_type("In")]},
                    {"matchExpressions": [zone, gpu, node_type("In")]},
                    {"matchExpressions": [eu, node_type("In")], "matchFields": [host]},
                    {"matchExpressions": [gpu, node_type("In")], "matchFields": [host]},
                ]),
                "{}",
                p["spec"]
            );
            assert_eq!(
                p["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"],
                preferred
            );
        },
    );
}

/// The webhook registered, its port taken by another process: it exits, and the API server
/// is never told its CA (it would call whatever holds the port, and whoever waits for the
/// caBundle would take the webhook for ready).
fn cannot_listen(api: &ApiServer, caller: &Caller, dir: &std::path::Path) {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    fabric_tests::webhook::register(api, "127.0.0.1", port).unwrap();
    let log = dir.join("webhook-taken.log");
    let kubeconfig = fabric_tests::rights::component_kubeconfig(
        api,
        "fabric-shadowpod-webhook",
        log.with_extension("kubeconfig"),
    )
    .unwrap();
    let mut child = fabric_tests::process::Bin::new("fabric-controller")
        .unwrap()
        .args(fabric_tests::webhook::args(
            &format!("127.0.0.1:{port}"),
            caller,
        ))
        .kubeconfig(&kubeconfig)
        .log(&log)
        .spawn()
        .unwrap();
    let st = fabric_tests::wait::eventually_blocking(
        "the webhook to exit",
        std::time::Duration::from_secs(30),
        || child.0.try_wait().ok().flatten(),
    );
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!st.success(), "it exited {st}\n{said}");
    assert!(said.contains("listening on"), "{said}");
    for (kind, name) in [
        (
            "validatingwebhookconfiguration",
            names::webhook::SHADOWPODS_CONFIG,
        ),
        ("mutatingwebhookconfiguration", names::webhook::PODS_CONFIG),
    ] {
        let bundle = api.kubectl_ok(&[
            "get",
            kind,
            name,
            "-o",
            "jsonpath={.webhooks[0].clientConfig.caBundle}",
        ]);
        assert!(bundle.is_empty(), "{kind} {name} got a caBundle: {bundle}");
    }
    drop(taken);
}
