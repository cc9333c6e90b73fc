//! The fixture's storage (`fabric-test-storage`: PV binder and hostpath provisioner) with the
//! test scheduler's volume binding, against a real API server and two nodes: a claim of the
//! default class stays Pending (no node selected, no PV) until its first consumer is
//! scheduled, then is bound to a PV pinned to that node, whose directory exists; the
//! replacement of that pod goes to the same node (the PV's affinity), not to the other node
//! the scheduler would otherwise pick; a missing claim and an unbound claim of an `Immediate`
//! class another provisioner serves get upstream's messages (that claim carries the
//! provisioner annotations an external provisioner keys on); deleting the claim removes the
//! PV and its directory. The pods' data (a file written, the pod replaced, the file read) is
//! the network-namespace tier's (`netns::pods`): only test nodes run processes.
use std::time::Duration;

use fabric_api::names;
use fabric_tests::{
    apiserver::{ApiServer, require_tools},
    offload_fixture::{apply, scratch_dir, tail},
    phase::phase,
    process::Bin,
    rights, sched, storage,
    wait::{eventually_blocking, until},
};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(30);

fn get(api: &ApiServer, kind: &str, name: &str, ns: Option<&str>) -> Option<Value> {
    api.get_json(kind, ns, name)
}

fn node(api: &ApiServer, name: &str) {
    apply(
        api,
        &json!({ "apiVersion": "v1", "kind": "Node",
                 "metadata": { "name": name, "labels": { storage::HOSTNAME_LABEL: name } } }),
    )
    .unwrap();
    let status = json!({ "status": { "allocatable": { "cpu": "4", "memory": "8Gi", "pods": "110" },
                                     "capacity": { "cpu": "4", "memory": "8Gi", "pods": "110" } } });
    api.kubectl_ok(&[
        "patch",
        "node",
        name,
        "--subresource=status",
        "--type=merge",
        "-p",
        &status.to_string(),
    ]);
}

fn claim(name: &str, class: Option<&str>) -> Value {
    let mut c = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": { "name": name, "namespace": "app" },
        "spec": { "accessModes": ["ReadWriteOnce"],
                  "resources": { "requests": { "storage": "64Mi" } } },
    });
    if let Some(class) = class {
        c["spec"]["storageClassName"] = json!(class);
    }
    c
}

fn pod(name: &str, claim: &str, extra: Value) -> Value {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "namespace": "app" },
        "spec": { "containers": [{ "name": "c", "image": "x",
                                   "volumeMounts": [{ "name": "data", "mountPath": "/srv" }] }],
                  "volumes": [{ "name": "data", "persistentVolumeClaim": { "claimName": claim } }] },
    });
    if let (Some(spec), Value::Object(extra)) = (p["spec"].as_object_mut(), extra) {
        spec.extend(extra);
    }
    p
}

fn node_of(api: &ApiServer, pod: &str) -> Option<String> {
    get(api, "pod", pod, Some("app"))?["spec"]["nodeName"]
        .as_str()
        .map(str::to_owned)
}

fn unschedulable(api: &ApiServer, pod: &str) -> String {
    eventually_blocking(&format!("{pod} marked unschedulable"), T, || {
        let p = get(api, "pod", pod, Some("app"))?;
        p["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "PodScheduled" && c["reason"] == "Unschedulable")
            .and_then(|c| c["message"].as_str().map(str::to_owned))
    })
}

#[test]
fn claims_bind_where_their_first_consumer_lands_and_pull_later_ones_there() {
    let test = "claims_bind_where_their_first_consumer_lands_and_pull_later_ones_there";
    if !require_tools(test) {
        return;
    }
    let api = ApiServer::start("storage");
    let dir = scratch_dir("storage").unwrap();
    let root = dir.join("volumes");
    let storage_log = dir.join("storage.log");
    let sched_log = dir.join("scheduler.log");
    let _storage = storage::start(&api, &root, &storage_log).unwrap();
    let _scheduler = sched::start(&api, &sched_log).unwrap();
    let logs = || {
        format!(
            "storage log:\n{}\nscheduler log:\n{}",
            tail(&storage_log, 30),
            tail(&sched_log, 30)
        )
    };
    phase("cluster", || {
        api.kubectl_ok(&["create", "namespace", "app"]);
        node(&api, "node-a");
        node(&api, "node-b");
    });

    let (pv_name, pv_dir) = phase("first consumer", || {
        apply(&api, &claim("data", None)).unwrap();
        // The default class is filled in; nothing is provisioned before a consumer.
        let c = eventually_blocking("the claim Pending of class standard", T, || {
            get(&api, "persistentvolumeclaims", "data", Some("app")).filter(|c| {
                c["status"]["phase"] == "Pending" && c["spec"]["storageClassName"] == "standard"
            })
        });
        assert_eq!(
            c["metadata"]["annotations"][storage::SELECTED_NODE],
            Value::Null
        );
        let pvs = api.kubectl_ok(&["get", "pv", "-o", "name"]);
        assert!(pvs.trim().is_empty(), "no PV before a consumer: {pvs}");
        // The first consumer asks for node-b (the scheduler alone would pick node-a).
        apply(
            &api,
            &pod(
                "writer",
                "data",
                json!({ "nodeSelector": { storage::HOSTNAME_LABEL: "node-b" } }),
            ),
        )
        .unwrap();
        let c = eventually_blocking("the claim Bound", T, || {
            get(&api, "persistentvolumeclaims", "data", Some("app"))
                .filter(|c| c["status"]["phase"] == "Bound")
        });
        let anns = &c["metadata"]["annotations"];
        assert_eq!(anns[storage::SELECTED_NODE], "node-b", "{c}");
        assert_eq!(anns[storage::STORAGE_PROVISIONER], storage::PROVISIONER);
        assert_eq!(
            anns[storage::BETA_STORAGE_PROVISIONER],
            storage::PROVISIONER
        );
        assert_eq!(anns[storage::BIND_COMPLETED], "yes");
        let uid = c["metadata"]["uid"].as_str().unwrap();
        let pv_name = format!("pvc-{uid}");
        assert_eq!(c["spec"]["volumeName"], pv_name.as_str());
        assert_eq!(c["status"]["capacity"]["storage"], "64Mi");
        let pv = get(&api, "persistentvolumes", &pv_name, None).unwrap();
        assert_eq!(pv["status"]["phase"], "Bound");
        assert_eq!(pv["spec"]["claimRef"]["uid"], uid);
        assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Delete");
        assert_eq!(
            pv["metadata"]["annotations"][storage::PROVISIONED_BY],
            storage::PROVISIONER
        );
        assert_eq!(
            pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"],
            json!(["node-b"])
        );
        let pv_dir = std::path::PathBuf::from(pv["spec"]["hostPath"]["path"].as_str().unwrap());
        assert!(pv_dir.starts_with(std::fs::canonicalize(&root).unwrap()));
        assert!(pv_dir.is_dir(), "{}", pv_dir.display());
        until("the writer bound to node-b", T, || {
            node_of(&api, "writer").as_deref() == Some("node-b")
        });
        (pv_name, pv_dir)
    });

    phase("replacement follows the data", || {
        api.kubectl_ok(&["delete", "pod", "writer", "-n", "app", "--wait=true"]);
        apply(&api, &pod("reader", "data", json!({}))).unwrap();
        let n = eventually_blocking("the reader bound", T, || node_of(&api, "reader"));
        assert_eq!(n, "node-b", "{}", logs());
    });

    phase("upstream's messages", || {
        apply(&api, &pod("orphan", "nope", json!({}))).unwrap();
        assert_eq!(
            unschedulable(&api, "orphan"),
            "0/2 nodes are available: persistentvolumeclaim \"nope\" not found."
        );
        // An Immediate class whose (external) provisioner never answers.
        let mut fast = storage::class("fast", "Immediate", "Delete", false);
        fast["provisioner"] = json!("example.com/nobody");
        apply(&api, &fast).unwrap();
        apply(&api, &claim("quick", Some("fast"))).unwrap();
        apply(&api, &pod("eager", "quick", json!({}))).unwrap();
        assert_eq!(
            unschedulable(&api, "eager"),
            "0/2 nodes are available: pod has unbound immediate PersistentVolumeClaims."
        );
        let c = eventually_blocking("the provisioner annotations", T, || {
            get(&api, "persistentvolumeclaims", "quick", Some("app"))
                .filter(|c| c["metadata"]["annotations"][storage::STORAGE_PROVISIONER].is_string())
        });
        assert_eq!(
            c["metadata"]["annotations"][storage::STORAGE_PROVISIONER],
            "example.com/nobody"
        );
        assert_eq!(
            c["metadata"]["annotations"][storage::BETA_STORAGE_PROVISIONER],
            "example.com/nobody"
        );
        assert_eq!(c["status"]["phase"], "Pending");
        // Still unscheduled: never bound while the claim is not.
        assert_eq!(node_of(&api, "eager"), None);
    });

    phase("claim deleted", || {
        api.kubectl_ok(&["delete", "pod", "reader", "-n", "app", "--wait=true"]);
        api.kubectl_ok(&["delete", "pvc", "data", "-n", "app", "--wait=true"]);
        until("the PV and its directory gone", T, || {
            get(&api, "persistentvolumes", &pv_name, None).is_none() && !pv_dir.exists()
        });
    });
}

/// The storage fabric's real-node path (`fabric-controller storage`, run with its own
/// ServiceAccount): a claim of the virtual class `fabric` whose first consumer the scheduler
/// places on a real node gets a real claim of the real class in `fabric-storage`, provisioned
/// on that node, and a volume over the real one bound to it (the real volume's directory, kept
/// off virtual nodes), so that the pod mounts the real volume; the replacement of the pod goes
/// to the same node, never to the virtual one. Deleted, the claim takes its virtual volume,
/// its real claim, and (the real class's `Delete`) the real volume and its directory along.
/// Then the provisioner's own token tries what a stolen one would: volumes that are not its
/// own, on virtual nodes, a placeholder of a virtual kubelet's, claims of another class.
#[test]
fn claims_of_the_virtual_class_on_a_real_node_get_a_real_volume() {
    let test = "claims_of_the_virtual_class_on_a_real_node_get_a_real_volume";
    if !require_tools(test) {
        return;
    }
    let api = ApiServer::start_with_auth("real-storage");
    let dir = scratch_dir("real-storage").unwrap();
    let root = dir.join("volumes");
    let (storage_log, sched_log, provisioner_log) = (
        dir.join("storage.log"),
        dir.join("scheduler.log"),
        dir.join("provisioner.log"),
    );
    let _storage = storage::start(&api, &root, &storage_log).unwrap();
    let _scheduler = sched::start(&api, &sched_log).unwrap();
    let kubeconfig =
        rights::component_kubeconfig(&api, "fabric-storage", dir.join("storage.kubeconfig"))
            .unwrap();
    let _provisioner = Bin::new("fabric-controller")
        .unwrap()
        .arg("storage")
        .kubeconfig(&kubeconfig)
        .pod_name("storage-0")
        .log(&provisioner_log)
        .spawn()
        .unwrap();
    let logs = || {
        format!(
            "provisioner log:\n{}\nstorage log:\n{}\nscheduler log:\n{}",
            tail(&provisioner_log, 30),
            tail(&storage_log, 20),
            tail(&sched_log, 20)
        )
    };
    phase("cluster", || {
        api.kubectl_ok(&["create", "namespace", "app"]);
        node(&api, "node-a");
        // A virtual node, as the virtual kubelet registers it (untainted here: only the
        // volume's affinity keeps the replacement off it).
        node(&api, "fabric-provider");
        api.kubectl_ok(&[
            "label",
            "node",
            "fabric-provider",
            &format!(
                "{}={}",
                names::label::NODE_TYPE,
                names::label::VIRTUAL_NODE_TYPE
            ),
        ]);
        let mut virtual_class = storage::class(
            names::storage::CLASS,
            storage::WAIT_FOR_FIRST_CONSUMER,
            "Delete",
            false,
        );
        virtual_class["provisioner"] = json!(names::storage::PROVISIONER);
        apply(&api, &virtual_class).unwrap();
    });

    let (uid, real_dir) = phase("first consumer on a real node", || {
        apply(&api, &claim("data", Some(names::storage::CLASS))).unwrap();
        apply(
            &api,
            &pod(
                "writer",
                "data",
                json!({ "nodeSelector": { storage::HOSTNAME_LABEL: "node-a" } }),
            ),
        )
        .unwrap();
        let c = eventually_blocking("the claim bound", T, || {
            get(&api, "persistentvolumeclaims", "data", Some("app"))
                .filter(|c| c["spec"]["volumeName"].is_string())
        });
        let uid = c["metadata"]["uid"].as_str().unwrap().to_owned();
        assert_eq!(c["spec"]["volumeName"], format!("pvc-{uid}"), "{}", logs());
        assert!(
            c["metadata"]["finalizers"]
                .as_array()
                .unwrap()
                .contains(&json!("storage.fabric.io/real-claim")),
            "{c}"
        );
        let real = get(
            &api,
            "persistentvolumeclaims",
            &format!("home-{uid}"),
            Some(names::namespace::STORAGE),
        )
        .expect("the real claim");
        assert_eq!(real["spec"]["storageClassName"], storage::DEFAULT_CLASS);
        assert_eq!(
            real["metadata"]["annotations"][storage::SELECTED_NODE],
            "node-a"
        );
        assert_eq!(real["spec"]["resources"]["requests"]["storage"], "64Mi");
        let real_pv = get(
            &api,
            "persistentvolumes",
            real["spec"]["volumeName"].as_str().unwrap(),
            None,
        )
        .expect("the real volume");
        let pv = get(&api, "persistentvolumes", &format!("pvc-{uid}"), None)
            .expect("the virtual volume");
        assert_eq!(pv["spec"]["storageClassName"], names::storage::CLASS);
        assert_eq!(pv["spec"]["claimRef"]["uid"], uid.as_str());
        assert_eq!(
            pv["spec"]["hostPath"], real_pv["spec"]["hostPath"],
            "the pod mounts the real volume"
        );
        let terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
            .as_array()
            .unwrap();
        assert_eq!(terms.len(), 1, "{pv}");
        assert_eq!(
            terms[0]["matchExpressions"],
            json!([
                {"key": storage::HOSTNAME_LABEL, "operator": "In", "values": ["node-a"]},
                {"key": names::label::NODE_TYPE, "operator": "NotIn",
                 "values": [names::label::VIRTUAL_NODE_TYPE]},
            ])
        );
        until("the writer bound to node-a", T, || {
            node_of(&api, "writer").as_deref() == Some("node-a")
        });
        let real_dir =
            std::path::PathBuf::from(real_pv["spec"]["hostPath"]["path"].as_str().unwrap());
        assert!(real_dir.is_dir(), "{}", real_dir.display());
        (uid, real_dir)
    });

    phase(
        "the replacement follows the data, not to the virtual node",
        || {
            api.kubectl_ok(&["delete", "pod", "writer", "-n", "app", "--wait=true"]);
            apply(&api, &pod("reader", "data", json!({}))).unwrap();
            let n = eventually_blocking("the reader bound", T, || node_of(&api, "reader"));
            assert_eq!(n, "node-a", "{}", logs());
        },
    );

    phase("a stolen provisioner token", || {
        provisioner_attacks(&api, &kubeconfig, &uid);
    });

    phase("the claim deleted: the real claim and volume go", || {
        api.kubectl_ok(&["delete", "pod", "reader", "-n", "app", "--wait=true"]);
        api.kubectl_ok(&["delete", "pvc", "data", "-n", "app", "--wait=false"]);
        until("the claim, both volumes and the directory gone", T, || {
            get(&api, "persistentvolumeclaims", "data", Some("app")).is_none()
                && get(&api, "persistentvolumes", &format!("pvc-{uid}"), None).is_none()
                && get(
                    &api,
                    "persistentvolumeclaims",
                    &format!("home-{uid}"),
                    Some(names::namespace::STORAGE),
                )
                .is_none()
                && !real_dir.exists()
        });
    });
}

/// With the provisioner's own ServiceAccount token: what fabric-storage-writes refuses.
fn provisioner_attacks(api: &ApiServer, kubeconfig: &std::path::Path, uid: &str) {
    let as_provisioner = |args: &[&str], input: Option<&str>| {
        let mut c = std::process::Command::new("kubectl");
        c.env("KUBECONFIG", kubeconfig).args(args);
        match input {
            Some(i) => fabric_tests::process::kubectl_stdin(kubeconfig, args, i),
            None => c.output().unwrap(),
        }
    };
    let volume = |name: &str, spec: Value| {
        json!({"apiVersion": "v1", "kind": "PersistentVolume",
               "metadata": {"name": name,
                            "annotations": {names::storage::PROVISIONED_BY: names::storage::PROVISIONER}},
               "spec": spec})
    };
    let off_virtual = json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": names::label::NODE_TYPE, "operator": "NotIn", "values": [names::label::VIRTUAL_NODE_TYPE]}]}]}});
    let base = |extra: Value| {
        let mut s = json!({"storageClassName": names::storage::CLASS,
            "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
            "hostPath": {"path": "/"}, "nodeAffinity": off_virtual.clone(),
            "claimRef": {"namespace": "app", "name": "x", "uid": "u9"}});
        if let (Some(s), Value::Object(e)) = (s.as_object_mut(), extra) {
            for (k, v) in e {
                if v.is_null() {
                    s.remove(&k);
                } else {
                    s.insert(k, v);
                }
            }
        }
        s
    };
    // The policies came with the bed seconds ago: the API server enforces a new policy once
    // its informers have it (a fresh-clone CI run saw this first attack allowed, with the
    // bed's steps in-process and so quicker). Asked as a server dry run until refused.
    let first = volume("pvc-u9x", base(json!({})));
    eventually_blocking("the provisioner's policies in force", T, || {
        let o = as_provisioner(
            &["create", "--dry-run=server", "-f", "-"],
            Some(&first.to_string()),
        );
        (!o.status.success()).then_some(())
    });
    for (name, pv, says) in [
        ("pvc-u9x", first.clone(), "writes only its own volumes"),
        (
            "pvc-u9",
            volume(
                "pvc-u9",
                base(json!({"storageClassName": storage::DEFAULT_CLASS})),
            ),
            "writes only its own volumes",
        ),
        (
            "pvc-u9",
            volume("pvc-u9", base(json!({"nodeAffinity": null}))),
            "keeps off virtual nodes",
        ),
        (
            "pvc-u9",
            volume(
                "pvc-u9",
                base(json!({"hostPath": null,
                    "csi": {"driver": names::storage::PROVISIONER, "volumeHandle": "u9"}})),
            ),
            "no virtual kubelet's placeholder",
        ),
    ] {
        let o = as_provisioner(&["create", "-f", "-"], Some(&pv.to_string()));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(says), "{name}: {err}");
    }
    // A claim of another class: not its to bind.
    apply(api, &claim("other", Some(storage::DEFAULT_CLASS))).unwrap();
    let o = as_provisioner(
        &[
            "patch",
            "pvc",
            "other",
            "-n",
            "app",
            "--type=merge",
            "-p",
            r#"{"spec":{"volumeName":"pvc-u9"}}"#,
        ],
        None,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("binds claims of class fabric only"),
        "{err}"
    );
    // Its own claim's volume deleted: refused for a volume of another provisioner.
    let o = as_provisioner(
        &["delete", "pv", &format!("pvc-{uid}"), "--dry-run=server"],
        None,
    );
    assert!(
        o.status.success(),
        "its own volume: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let real = api.kubectl_ok(&[
        "get",
        "pvc",
        &format!("home-{uid}"),
        "-n",
        names::namespace::STORAGE,
        "-o",
        "jsonpath={.spec.volumeName}",
    ]);
    let o = as_provisioner(&["delete", "pv", real.trim(), "--dry-run=server"], None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("writes only its own volumes"),
        "{err}"
    );
}
