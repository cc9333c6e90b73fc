//! Namespace offloading, the consumer's side (issue 20): `fabricctl offload namespace` and
//! `unoffload namespace` as a user runs them, against two API servers with RBAC enforced,
//! both clusters' sharing controllers running as their ServiceAccount (deploy/'s rights and
//! admission policies), and a real out-of-band peering (the consumer holds an identity on the
//! provider and a VirtualNode; no virtual kubelet runs, so selectors see the labels the
//! virtual kubelet would give its Node).
//!
//! The provider's twin controller runs too (in its sharing controllers) and answers for
//! itself: twins made, a namespace of its own refused, twins removed. The consumer's side is
//! checked end to end: the map it writes on the provider with its identity, the status and
//! phase it derives from the answers, the namespace label, the finalizer held until the
//! provider no longer lists the twin.
use std::{
    collections::BTreeMap,
    process::Output,
    time::{Duration, Instant},
};

use fabric_api::{
    core::v1alpha1::{ForeignCluster, condition},
    names,
    offloading::v1alpha1::{NamespaceMap, NamespaceOffloading, VirtualNode},
};
use fabric_negotiation::{Settings, run};
use fabric_tests::{
    apiserver::{ApiServer, require_tools},
    auth_service::AuthService,
    rights,
    sharing::install_identity,
    wait::eventually,
};
use k8s_openapi::api::{
    core::v1::{Namespace, PersistentVolumeClaim, Pod},
    events::v1::Event,
    rbac::v1::RoleBinding,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

const NS: &str = names::DEFAULT_NAMESPACE;
const CONSUMER: &str = "cons";
const PROVIDER: &str = "prov";

fn fabricctl(api: &ApiServer, args: &[&str]) -> Output {
    fabric_tests::process::fabricctl(&api.kubeconfig, args)
}

fn text(o: &Output) -> String {
    fabric_tests::process::output_text(o)
}

fn controllers(client: Client) -> tokio::task::JoinHandle<()> {
    let settings = Settings {
        namespace: NS.into(),
        remote_poll: Duration::from_millis(500),
        percent: 90,
        labels: BTreeMap::from([("region".to_owned(), "eu".to_owned())]),
        instance: Some("test".into()),
        at_most_once: Default::default(),
        reserved_namespaces: Vec::new(),
        max_namespaces_per_tenant: fabric_negotiation::namespaces::twins::DEFAULT_MAX_PER_TENANT,
    };
    tokio::spawn(async move {
        if let Err(e) = run(client, settings).await {
            panic!("sharing controllers: {e}");
        }
    })
}

/// `fabricctl` with `args` on a thread of its own (it waits for what the test then does).
fn fabricctl_bg(api: &ApiServer, args: &[&str]) -> std::thread::JoinHandle<Output> {
    let kubeconfig = api.kubeconfig.clone();
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    std::thread::spawn(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fabric_tests::process::fabricctl(&kubeconfig, &args)
    })
}

async fn join(h: std::thread::JoinHandle<Output>) -> Output {
    tokio::task::spawn_blocking(move || h.join().unwrap())
        .await
        .unwrap()
}

/// The consumer's NamespaceMap on the provider, read by the provider's admin.
async fn map(p: &Client) -> Option<NamespaceMap> {
    Api::<NamespaceMap>::namespaced(p.clone(), &names::namespace::tenant(CONSUMER))
        .get_opt(CONSUMER)
        .await
        .unwrap()
}

/// The mappings of the consumer's map, `home -> remote`.
async fn mappings(p: &Client) -> BTreeMap<String, String> {
    map(p)
        .await
        .map(|m| {
            m.spec
                .namespaces
                .into_iter()
                .map(|m| (m.home, m.remote))
                .collect()
        })
        .unwrap_or_default()
}

async fn offloading(c: &Client, ns: &str) -> Option<NamespaceOffloading> {
    Api::<NamespaceOffloading>::namespaced(c.clone(), ns)
        .get_opt("offloading")
        .await
        .unwrap()
}

async fn labelled(c: &Client, ns: &str) -> bool {
    Api::<Namespace>::all(c.clone())
        .get(ns)
        .await
        .unwrap()
        .labels()
        .get(names::label::SCHEDULING_ENABLED)
        .is_some_and(|v| v == "true")
}

/// The notes of the Events with `reason` in namespace `ns`.
async fn events(c: &Client, ns: &str, reason: &str) -> Vec<String> {
    Api::<Event>::namespaced(c.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.note)
        .collect()
}

async fn add_node(client: &Client) {
    let alloc = json!({ "cpu": "8", "memory": "16Gi", "pods": "110" });
    fabric_tests::sharing::add_node(client, "n1", alloc)
        .await
        .unwrap();
}

async fn create_namespace(c: &Client, ns: &str) {
    Api::<Namespace>::all(c.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": ns } })).unwrap(),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offload_and_unoffload_namespaces() {
    if !require_tools("offload_and_unoffload_namespaces") {
        return;
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter("fabric_negotiation=info,fabric_kube=warn,kube_runtime=warn")
        .with_test_writer()
        .try_init();
    let consumer_api = ApiServer::start_with_auth("nsoff-c");
    let provider_api = ApiServer::start_with_auth("nsoff-p");
    consumer_api.install_crds();
    provider_api.install_crds();
    let (c, p) = (consumer_api.client().await, provider_api.client().await);
    install_identity(
        &c,
        NS,
        CONSUMER,
        "10.244.0.0/16",
        Some((KEY_C, "192.0.2.1:51820")),
    )
    .await
    .unwrap();
    install_identity(
        &p,
        NS,
        PROVIDER,
        "10.245.0.0/16",
        Some((KEY_P, "198.51.100.2:51821")),
    )
    .await
    .unwrap();
    add_node(&p).await;
    let svc = AuthService::start(&provider_api, PROVIDER).await.unwrap();
    let mut ctl = Vec::new();
    let mut own = Vec::new();
    for api in [&consumer_api, &provider_api] {
        let out = api.kubeconfig.with_file_name("fabric-sharing.kubeconfig");
        let client = rights::component_client(api, "fabric-sharing", out)
            .await
            .unwrap();
        own.push(client.clone());
        ctl.push(controllers(client));
    }

    // A real peering, out of band: the consumer gets an identity and a VirtualNode.
    let o = fabricctl(
        &provider_api,
        &["generate", "peer-command", "--auth-url", &svc.url],
    );
    assert!(o.status.success(), "{}", text(&o));
    let line = String::from_utf8(o.stdout).unwrap();
    let mut args: Vec<&str> = line.split_whitespace().skip(1).collect();
    args.extend(["--cpu", "1", "--memory", "1Gi", "--timeout-secs", "0"]);
    let o = fabricctl(&consumer_api, &args);
    assert!(o.status.success(), "{}\n{}", text(&o), svc.logs());
    let vns: Api<VirtualNode> = Api::namespaced(c.clone(), NS);
    eventually(
        "the provider's VirtualNode",
        Duration::from_secs(60),
        || async { vns.get_opt(PROVIDER).await.unwrap().map(|_| ()) },
    )
    .await;

    // 1. Offload `shop` (DefaultName): the map on the provider carries the mapping, the
    // namespace is labelled, and once the provider answers, Ready.
    let o = fabricctl(&consumer_api, &["offload", "namespace", "ghost"]);
    assert!(
        !o.status.success() && text(&o).contains("namespace ghost does not exist"),
        "{}",
        text(&o)
    );
    create_namespace(&c, "shop").await;
    // A pod from before: offloading does not move it, and says so.
    let early = json!({ "metadata": { "name": "early" }, "spec": {
        "containers": [{ "name": "c", "image": "x" }] } });
    Api::<Pod>::namespaced(c.clone(), "shop")
        .create(
            &PostParams::default(),
            &serde_json::from_value(early).unwrap(),
        )
        .await
        .unwrap();
    let o = fabricctl(
        &consumer_api,
        &["offload", "namespace", "shop", "-o", "yaml"],
    );
    assert!(
        o.status.success() && text(&o).contains("kind: NamespaceOffloading"),
        "{}",
        text(&o)
    );
    assert!(
        offloading(&c, "shop").await.is_none(),
        "-o yaml applies nothing"
    );
    let run = fabricctl_bg(
        &consumer_api,
        &[
            "offload",
            "namespace",
            "shop",
            "--selector",
            "region=eu",
            "--timeout",
            "60s",
        ],
    );
    let want = BTreeMap::from([("shop".to_owned(), "shop-cons".to_owned())]);
    eventually(
        "the mapping on the provider",
        Duration::from_secs(30),
        || async { (mappings(&p).await == want).then_some(()) },
    )
    .await;
    assert!(labelled(&c, "shop").await);
    // The sharing controllers may patch a namespace for that label only (deploy/'s policy):
    // not to loosen its pod security, nor to take it over by annotation.
    let as_sharing: Api<Namespace> = Api::all(own[0].clone());
    for change in [
        json!({ "metadata": { "labels": { "pod-security.kubernetes.io/enforce": "privileged" } } }),
        json!({ "metadata": { "labels": { names::label::SCHEDULING_ENABLED: "yes" } } }),
        json!({ "metadata": { "annotations": { "owner": "fabric" } } }),
    ] {
        let e = as_sharing
            .patch("shop", &PatchParams::default(), &Patch::Merge(&change))
            .await
            .expect_err("refused by the policy");
        assert!(e.to_string().contains("scheduling label"), "{change}: {e}");
    }
    let m = map(&p).await.unwrap();
    assert_eq!(m.spec.cluster_id, CONSUMER);
    let manager = m
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .any(|f| f.manager.as_deref() == Some(names::field_manager::NAMESPACE_OFFLOADING));
    assert!(manager, "{:?}", m.metadata.managed_fields);
    // The provider's twin controller answers for itself (it may already have: no waiting
    // state is required to be seen).
    let o = join(run).await;
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("✓ shop offloaded to prov as shop-cons"),
        "{out}"
    );
    assert!(
        out.contains("shop: ✓ provider prov twin Ready"),
        "progress per provider: {out}"
    );
    assert!(
        out.contains(
            "! shop: 1 pod(s) created before it was offloaded stay where they run (early)"
        ),
        "{out}"
    );
    eventually(
        "the pod from before told",
        Duration::from_secs(30),
        || async {
            let said = events(&c, "shop", "CreatedBeforeOffloading").await;
            said.iter()
                .any(|n| n.starts_with("created before namespace shop was offloaded"))
                .then_some(())
        },
    )
    .await;
    let nso = offloading(&c, "shop").await.unwrap();
    let st = nso.status.as_ref().unwrap();
    assert_eq!(st.remote_namespace_name.as_deref(), Some("shop-cons"));
    let named = st
        .created_before
        .as_ref()
        .expect("the pod from before in the status");
    assert_eq!(
        (named.count, named.pods.as_slice()),
        (1, &["early".to_owned()][..])
    );
    // Created again (here: gone), it is no longer named.
    Api::<Pod>::namespaced(c.clone(), "shop")
        .delete("early", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the status without the pod from before",
        Duration::from_secs(30),
        || async {
            let nso = offloading(&c, "shop").await?;
            nso.status?.created_before.is_none().then_some(())
        },
    )
    .await;
    assert!(
        nso.finalizers()
            .iter()
            .any(|f| f == names::finalizer::NAMESPACE_OFFLOADING)
    );

    // 2. The mapping cannot change after creation: the API server refuses it, with its reason.
    let o = fabricctl(
        &consumer_api,
        &[
            "offload",
            "namespace",
            "shop",
            "--namespace-mapping-strategy",
            "EnforceSameName",
        ],
    );
    let out = text(&o);
    assert!(
        !o.status.success() && out.contains("cannot change after creation"),
        "{out}"
    );
    assert!(
        labelled(&c, "shop").await,
        "the offloaded namespace keeps its label"
    );

    // 3. A bad selector from the command line: a clear error naming it, nothing applied.
    let o = fabricctl(
        &consumer_api,
        &["offload", "namespace", "shop", "-l", "zone in (a"],
    );
    let out = text(&o);
    assert!(
        !o.status.success() && out.contains("\"zone in (a\""),
        "{out}"
    );
    // ... and one the controller cannot evaluate (written by hand): said in the status and an
    // Event; the provider keeps its mapping.
    let bad = json!({ "spec": { "clusterSelector": { "nodeSelectorTerms": [
        { "matchExpressions": [{ "key": "region", "operator": "Near", "values": ["eu"] }] }
    ] } } });
    Api::<NamespaceOffloading>::namespaced(c.clone(), "shop")
        .patch("offloading", &PatchParams::default(), &Patch::Merge(&bad))
        .await
        .unwrap();
    eventually("the bad selector said", Duration::from_secs(30), || async {
        let nso = offloading(&c, "shop").await?;
        let st = nso.status?;
        (st.observed_generation == nso.metadata.generation
            && st.message.as_deref().is_some_and(|m| m.contains("Near")))
        .then_some(())
    })
    .await;
    assert_eq!(
        mappings(&p).await,
        want,
        "nothing withdrawn for a bad selector"
    );
    let warned = events(&c, "shop", "InvalidSelector").await;
    assert!(warned.iter().any(|n| n.contains("Near")), "{warned:?}");

    // 4. A selector that matches no provider: the mapping is withdrawn, NoClusterSelected, and
    // `fabricctl offload` succeeds with a warning.
    let o = fabricctl(
        &consumer_api,
        &[
            "offload",
            "namespace",
            "shop",
            "-l",
            "region=mars",
            "--timeout",
            "30s",
        ],
    );
    let out = text(&o);
    assert!(
        o.status.success() && out.contains("selects no provider"),
        "{out}"
    );
    // What goes is said before: by the command, and by an Event on the NamespaceOffloading.
    assert!(
        out.contains(
            "shop: the new selector drops prov: provider prov: namespace shop-cons is removed \
             with everything in it"
        ),
        "{out}"
    );
    let warned = events(&c, "shop", "Deselected").await;
    assert!(
        warned.iter().any(|n| n.starts_with(
            "the clusterSelector no longer selects prov: provider prov: namespace shop-cons"
        )),
        "{warned:?}"
    );
    assert!(mappings(&p).await.is_empty(), "withdrawn");
    let st = offloading(&c, "shop").await.unwrap().status.unwrap();
    assert_eq!(
        serde_json::to_value(st.phase).unwrap(),
        json!("NoClusterSelected")
    );

    // 5. A provider refusing (its namespace `db` is not ours): AllFailed with its reason, and
    // `fabricctl offload` fails saying so. The provider's own `db` (its twin controller runs
    // too, and refuses it).
    create_namespace(&c, "db").await;
    create_namespace(&p, "db").await;
    let run = fabricctl_bg(
        &consumer_api,
        &[
            "offload",
            "namespace",
            "db",
            "--namespace-mapping-strategy",
            "EnforceSameName",
            "--pod-offloading-strategy",
            "Local",
            "--timeout",
            "60s",
        ],
    );
    eventually("the db mapping", Duration::from_secs(30), || async {
        (mappings(&p).await.get("db").map(String::as_str) == Some("db")).then_some(())
    })
    .await;
    let o = join(run).await;
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(
        out.contains("every selected provider refused") && out.contains("NamespaceExists"),
        "{out}"
    );
    assert!(!labelled(&c, "db").await, "Local: no scheduling label");
    let refused = events(&c, "db", "TwinRefused").await;
    assert!(
        refused
            .iter()
            .any(|n| n.contains("prov") && n.contains("NamespaceExists")),
        "{refused:?}"
    );

    mapped_by_name_and_as_chosen(&consumer_api, &c, &p).await;

    // 6. Unoffload `shop` (selected again, with a pod on the provider's virtual node): what
    // goes is said first; the mapping is withdrawn; the finalizer holds until the provider's
    // status drops the twin; the label goes.
    let run = fabricctl_bg(
        &consumer_api,
        &["offload", "namespace", "shop", "--timeout", "60s"],
    );
    eventually("shop mapped again", Duration::from_secs(30), || async {
        mappings(&p).await.contains_key("shop").then_some(())
    })
    .await;
    let o = join(run).await;
    assert!(o.status.success(), "{}", text(&o));
    let pod = json!({ "metadata": { "name": "web" }, "spec": {
        "nodeName": names::node::virtual_node(PROVIDER),
        "containers": [{ "name": "c", "image": "x" }] } });
    Api::<Pod>::namespaced(c.clone(), "shop")
        .create(
            &PostParams::default(),
            &serde_json::from_value(pod).unwrap(),
        )
        .await
        .unwrap();
    // A claim of shop's volume in the twin, as the virtual kubelet reflects it (the fabric's
    // ownership marks; tests/api/offload/storage.rs makes it the real way): under the
    // default storageRetention (Retain) it outlives shop's unoffloading.
    let claim = json!({ "metadata": { "name": "data", "labels": {
            names::label::REFLECTED_FROM: CONSUMER, names::label::REFLECTED_TO: PROVIDER } },
        "spec": { "storageClassName": "standard", "accessModes": ["ReadWriteOnce"],
                  "resources": { "requests": { "storage": "1Gi" } } } });
    Api::<PersistentVolumeClaim>::namespaced(p.clone(), "shop-cons")
        .create(
            &PostParams::default(),
            &serde_json::from_value(claim).unwrap(),
        )
        .await
        .unwrap();
    let run = fabricctl_bg(
        &consumer_api,
        &["unoffload", "namespace", "shop", "--timeout", "60s"],
    );
    eventually("shop withdrawn", Duration::from_secs(30), || async {
        (!mappings(&p).await.contains_key("shop")).then_some(())
    })
    .await;
    // Held by its finalizer while the provider removes the twin, and saying so (unless the
    // provider's twin controller, which is quick, is done already).
    eventually(
        "shop Terminating, or gone",
        Duration::from_secs(30),
        || async {
            match offloading(&c, "shop").await {
                None => Some(()),
                Some(held) => (held.status.and_then(|s| serde_json::to_value(s.phase).ok())
                    == Some(json!("Terminating")))
                .then_some(()),
            }
        },
    )
    .await;
    assert!(!labelled(&c, "shop").await, "the label goes first");
    let o = join(run).await;
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains(
            "provider prov: namespace shop-cons is removed with everything in it but the claims \
             of this namespace's volumes (storageRetention Retain"
        ) && out.contains("; 1 pod(s) of shop"),
        "{out}"
    );
    assert!(out.contains("✓ shop unoffloaded"), "{out}");
    assert!(offloading(&c, "shop").await.is_none());
    let before = events(&c, "shop", "Unoffloading").await;
    assert!(
        before
            .iter()
            .any(|n| n.starts_with("provider prov: namespace shop-cons is removed")),
        "{before:?}"
    );
    let said = events(&c, "shop", "Unoffloaded").await;
    assert!(
        said.iter()
            .any(|n| n.contains("shop-cons") && n.contains("prov")),
        "{said:?}"
    );
    assert_eq!(
        mappings(&p).await,
        BTreeMap::from([("db".to_owned(), "db".to_owned())]),
        "db's mapping stays"
    );
    retained_volumes_reported_and_forgotten(&consumer_api, &c, &p).await;
    let t0 = Instant::now();
    let o = fabricctl(&consumer_api, &["unoffload", "namespace", "shop"]);
    assert!(
        !o.status.success() && text(&o).contains("is not offloaded"),
        "{}",
        text(&o)
    );
    assert!(t0.elapsed() < Duration::from_secs(30));
    for h in ctl {
        h.abort();
    }
}

/// 5b. The other two mappings, end to end: `EnforceSameName` (the twin under the home name)
/// and `SelectedName` (under the name asked for); both unoffloaded after.
async fn mapped_by_name_and_as_chosen(consumer_api: &ApiServer, c: &Client, p: &Client) {
    create_namespace(c, "cart").await;
    create_namespace(c, "books").await;
    for (ns, args, twin) in [
        (
            "cart",
            &["--namespace-mapping-strategy", "EnforceSameName"][..],
            "cart",
        ),
        (
            "books",
            &[
                "--namespace-mapping-strategy",
                "SelectedName",
                "--remote-namespace-name",
                "books-there",
            ],
            "books-there",
        ),
    ] {
        let mut all = vec!["offload", "namespace", ns, "--timeout", "60s"];
        all.extend(args);
        let o = fabricctl(consumer_api, &all);
        let out = text(&o);
        assert!(
            o.status.success() && out.contains(&format!("✓ {ns} offloaded to prov as {twin}")),
            "{out}"
        );
        assert_eq!(mappings(p).await.get(ns).map(String::as_str), Some(twin));
        let made = Api::<Namespace>::all(p.clone())
            .get_opt(twin)
            .await
            .unwrap();
        assert!(made.is_some(), "the twin {twin} on the provider");
    }
    let o = fabricctl(
        consumer_api,
        &[
            "unoffload",
            "namespace",
            "cart",
            "books",
            "--timeout",
            "60s",
        ],
    );
    let out = text(&o);
    assert!(
        o.status.success()
            && out.contains("✓ cart unoffloaded")
            && out.contains("✓ books unoffloaded"),
        "{out}"
    );
    let left = mappings(p).await;
    assert!(
        !left.contains_key("cart") && !left.contains_key("books"),
        "{left:?}"
    );
}

/// The consumer's ForeignCluster of the provider: its `RetainedVolumes` condition (status,
/// message).
async fn retained_condition(c: &Client) -> Option<(String, String)> {
    let fc = Api::<ForeignCluster>::all(c.clone())
        .get_opt(PROVIDER)
        .await
        .unwrap()?;
    fc.status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == condition::RETAINED_VOLUMES)
        .map(|c| (c.status, c.message))
}

async fn twin_present(p: &Client, name: &str) -> bool {
    Api::<Namespace>::all(p.clone())
        .get_opt(name)
        .await
        .unwrap()
        .is_some_and(|n| n.metadata.deletion_timestamp.is_none())
}

/// shop's claim kept in its twin after its unoffloading: the consumer's rights there gone,
/// the ForeignCluster's `RetainedVolumes` and `fabricctl info peer` say so, `fabricctl forget
/// volumes` deletes it and the twin goes.
async fn retained_volumes_reported_and_forgotten(consumer_api: &ApiServer, c: &Client, p: &Client) {
    let kept = "shop-cons/data (1Gi, standard)";
    assert!(twin_present(p, "shop-cons").await, "kept for its claim");
    assert!(
        Api::<RoleBinding>::namespaced(p.clone(), "shop-cons")
            .get_opt(fabric_auth::tenant::ROLE)
            .await
            .unwrap()
            .is_none(),
        "the consumer's rights there removed"
    );
    eventually(
        "RetainedVolumes on the consumer's ForeignCluster",
        Duration::from_secs(30),
        || async {
            retained_condition(c)
                .await
                .filter(|(status, message)| status == "True" && message.contains(kept))
        },
    )
    .await;
    let o = fabricctl(consumer_api, &["info", "peer", PROVIDER]);
    let out = text(&o);
    assert!(
        o.status.success() && out.contains("retained volumes") && out.contains(kept),
        "{out}"
    );
    let o = fabricctl(consumer_api, &["forget", "volumes", "--peer", PROVIDER]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains(&format!("{kept} (of shop)")),
        "said first: {out}"
    );
    eventually(
        "the twin gone once empty",
        Duration::from_secs(30),
        || async { (!twin_present(p, "shop-cons").await).then_some(()) },
    )
    .await;
    eventually(
        "RetainedVolumes False once forgotten",
        Duration::from_secs(30),
        || async {
            retained_condition(c)
                .await
                .filter(|(status, _)| status == "False")
        },
    )
    .await;
}

const KEY_C: &str = "CCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCA=";
const KEY_P: &str = "PPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPA=";
