//! Pods that run for real in the two-cluster fixture: the test scheduler binds them, the test
//! node of their node runs them in network namespaces with addresses from the node's range.
//! One pair of peered clusters for every check (they take most of the time): echo pods answer
//! pods of their own cluster and of the peer through the fabric, `kubectl logs [-f]` works
//! through the API server, a file written on a claim's volume outlives its pod and is read by the
//! replacement the PV's node affinity pulls to the same node, an unsatisfiable node selector and an untolerated taint leave pods
//! Pending as Unschedulable, OnFailure restarts a failing command, a hollow pod runs without a
//! process, graceful deletion stops the process and removes the pod and its namespace, and the
//! test nodes remove their pods' namespaces when they stop.
use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use fabric_tests::{
    ChildGuard,
    apiserver::require_tools,
    clusters::{Cluster, PeeredClusters},
    skip_unless_root,
    workloads::{ECHO_PORT, RunningPod, command_pod, echo_pod, on_node},
};
use serde_json::json;

const T: Duration = Duration::from_secs(20);

/// How a cluster sees its peer's pod at `ip` (both IPAMs grant the peer 10.64.0.0/16).
fn remote(ip: &str) -> String {
    ip.replacen("10.244.", "10.64.", 1)
}

fn in_range(p: &RunningPod, k: usize) {
    let prefix = format!("10.244.{}.", k + 1);
    assert!(p.ip.starts_with(&prefix), "{p:?}");
    assert!(
        p.ip != Cluster::pod_ip(k) && !p.ip.ends_with(".1"),
        "clashes with the fixed pod or the gateway: {p:?}"
    );
    assert_eq!(p.node, Cluster::node_name(k));
}

fn unschedulable_message(cl: &Cluster, name: &str) -> String {
    let p = cl
        .wait_pod("default", name, T, "Unschedulable", |p| {
            p["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "PodScheduled" && c["reason"] == "Unschedulable")
            })
        })
        .unwrap();
    assert_eq!(p["status"]["phase"], "Pending");
    assert!(p["spec"]["nodeName"].is_null(), "{p}");
    p["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "PodScheduled")
        .unwrap()["message"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[test]
fn pods_run_talk_log_restart_and_stop() {
    if skip_unless_root("pods_run_talk_log_restart_and_stop")
        || !require_tools("pods_run_talk_log_restart_and_stop")
    {
        return;
    }
    let t0 = Instant::now();
    let mut cl = PeeredClusters::new(2).unwrap();
    cl.peer_ok().unwrap();
    eprintln!("clusters up and peered in {:?}", t0.elapsed());

    // An echo server on each node of A, and one in B.
    cl.a.create_pod(&on_node(echo_pod("echo0"), 0)).unwrap();
    cl.a.create_pod(&on_node(echo_pod("echo1"), 1)).unwrap();
    cl.b.create_pod(&on_node(echo_pod("echo-b"), 1)).unwrap();
    let e0 = cl.a.wait_pod_running("default", "echo0", T).unwrap();
    let e1 = cl.a.wait_pod_running("default", "echo1", T).unwrap();
    let eb = cl.b.wait_pod_running("default", "echo-b", T).unwrap();
    in_range(&e0, 0);
    in_range(&e1, 1);
    in_range(&eb, 1);
    eprintln!("pods running after {:?}", t0.elapsed());

    // Same node, other node, and the fixed pod: each server sees the caller's own address.
    assert_eq!(
        ip_of(&cl.a.connect_from(&e0, &e1.ip, ECHO_PORT).unwrap()),
        e0.ip
    );
    let fixed = cl
        .tb
        .exec(
            &cl.a.pods[0],
            &[
                &fabric_tests::locate_bin("fabric-test-pod")
                    .unwrap()
                    .display()
                    .to_string(),
                "connect",
                &format!("{}:{ECHO_PORT}", e0.ip),
            ],
        )
        .unwrap();
    assert_eq!(ip_of(&fixed), Cluster::pod_ip(0));

    // Across the fabric, at the address A gives B's pod; B's pod sees A's under B's view.
    cl.wait_reachable(&cl.a.pods[0], &remote(&eb.ip), T)
        .unwrap();
    let seen = cl.a.connect_from(&e1, &remote(&eb.ip), ECHO_PORT).unwrap();
    assert_eq!(ip_of(&seen), remote(&e1.ip));
    let seen = cl.b.connect_from(&eb, &remote(&e0.ip), ECHO_PORT).unwrap();
    assert_eq!(ip_of(&seen), remote(&eb.ip));

    // kubectl logs through the API server, which proxies to the node's kubelet API.
    let logs = cl.a.api.kubectl_ok(&["logs", "echo1"]);
    assert!(
        logs.contains(&format!("connection from {}:", e0.ip)),
        "{logs}"
    );
    let tail =
        cl.a.api
            .kubectl_ok(&["logs", "echo1", "--tail=1", "--timestamps"]);
    assert_eq!(tail.lines().count(), 1, "{tail}");
    assert!(tail.starts_with("20"), "{tail}");
    let mut follow = ChildGuard(
        fabric_tests::die_with_parent(&mut Command::new("kubectl"))
            .env("KUBECONFIG", &cl.a.api.kubeconfig)
            .args(["logs", "-f", "echo0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let out = follow.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let first = rx.recv_timeout(T).unwrap();
    assert!(first.starts_with("listening on"), "{first}");
    // A line written while following arrives.
    let seen = cl.a.connect_from(&e1, &e0.ip, ECHO_PORT).unwrap();
    let want = format!("connection from {seen}");
    let deadline = Instant::now() + T;
    loop {
        let l = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("kubectl logs -f never showed {want:?}"));
        if l == want {
            break;
        }
    }
    drop(follow);

    storage_outlives_its_pod(&cl.a);

    // Scheduling: nowhere to go, then an untolerated taint.
    let mut nowhere = command_pod("nowhere", &["sleep", "60"]);
    nowhere["spec"]["nodeSelector"] = json!({ "disktype": "ssd" });
    cl.a.create_pod(&nowhere).unwrap();
    let msg = unschedulable_message(&cl.a, "nowhere");
    assert!(
        msg.contains("didn't match Pod's node affinity/selector"),
        "{msg}"
    );
    cl.a.api.kubectl_ok(&[
        "taint",
        "node",
        &Cluster::node_name(1),
        "dedicated=x:NoSchedule",
    ]);
    cl.a.create_pod(&on_node(command_pod("intolerant", &["sleep", "60"]), 1))
        .unwrap();
    let msg = unschedulable_message(&cl.a, "intolerant");
    assert!(
        msg.contains("untolerated taint {dedicated=x:NoSchedule}"),
        "{msg}"
    );
    let mut tolerant = on_node(command_pod("tolerant", &["sleep", "60"]), 1);
    tolerant["spec"]["tolerations"] = json!([{ "key": "dedicated", "operator": "Exists" }]);
    cl.a.create_pod(&tolerant).unwrap();
    let p = cl.a.wait_pod_running("default", "tolerant", T).unwrap();
    assert_eq!(p.node, Cluster::node_name(1));
    // Retried when a node changes: the label makes room for "nowhere".
    cl.a.api
        .kubectl_ok(&["label", "node", &Cluster::node_name(0), "disktype=ssd"]);
    let p = cl.a.wait_pod_running("default", "nowhere", T).unwrap();
    assert_eq!(p.node, Cluster::node_name(0));

    // A failing command under OnFailure is restarted, and says so.
    let mut failing = command_pod("failing", &["sh", "-c", "echo failing; exit 3"]);
    failing["spec"]["restartPolicy"] = json!("OnFailure");
    cl.a.create_pod(&failing).unwrap();
    let p =
        cl.a.wait_pod("default", "failing", T, "restarted", |p| {
            p["status"]["containerStatuses"][0]["restartCount"]
                .as_i64()
                // Two: the second run has ended too, so there is a previous one to show.
                .is_some_and(|n| n >= 2)
        })
        .unwrap();
    let last = &p["status"]["containerStatuses"][0]["lastState"]["terminated"];
    assert_eq!(last["exitCode"], 3, "{p}");
    let prev = cl.a.api.kubectl_ok(&["logs", "failing", "--previous"]);
    assert_eq!(prev.trim(), "failing");

    // An image of a registry that never resolves (`.invalid`): ErrImagePull, as a kubelet
    // reports it, and nothing runs.
    let mut bad = command_pod("unpullable", &["sleep", "60"]);
    bad["spec"]["containers"][0]["image"] = json!("registry.invalid/shop/web:1");
    cl.a.create_pod(&bad).unwrap();
    let p =
        cl.a.wait_pod("default", "unpullable", T, "ErrImagePull", |p| {
            p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "ErrImagePull"
        })
        .unwrap();
    assert_eq!(p["status"]["phase"], "Pending", "{p}");
    let msg = p["status"]["containerStatuses"][0]["state"]["waiting"]["message"].to_string();
    assert!(msg.contains("registry.invalid"), "{msg}");

    // Hollow: Running with an address, but no namespace and no process.
    let mut hollow = on_node(command_pod("hollow", &["sleep", "60"]), 0);
    hollow["metadata"]["annotations"] =
        json!({ fabric_tests::testnode::HOLLOW_ANNOTATION: "true" });
    cl.a.create_pod(&hollow).unwrap();
    let h = cl.a.wait_pod_running("default", "hollow", T).unwrap();
    in_range(&h, 0);
    assert_eq!(Cluster::pod_netns(&h.uid), None);

    // Graceful deletion: SIGTERM (the echo server dies of it), the pod and its namespace go.
    assert!(Cluster::pod_netns(&e0.uid).is_some());
    let t1 = Instant::now();
    cl.a.api
        .kubectl_ok(&["delete", "pod", "echo0", "--wait=false"]);
    cl.a.wait_pod_gone("default", "echo0", T).unwrap();
    assert!(
        t1.elapsed() < Duration::from_secs(15),
        "SIGTERM should end it at once, not the grace period: {:?}",
        t1.elapsed()
    );
    assert_eq!(Cluster::pod_netns(&e0.uid), None);
    assert!(cl.a.connect_from(&e1, &e0.ip, ECHO_PORT).is_err());

    // A test node that is stopped takes its pods' namespaces along.
    assert!(Cluster::pod_netns(&e1.uid).is_some());
    drop(cl);
    assert_eq!(Cluster::pod_netns(&e1.uid), None);
    assert_eq!(Cluster::pod_netns(&eb.uid), None);
    eprintln!("done after {:?}", t0.elapsed());
}

/// `pod` mounting claim `claim` at /srv.
fn with_claim(mut pod: serde_json::Value, claim: &str) -> serde_json::Value {
    pod["spec"]["containers"][0]["volumeMounts"] = json!([{ "name": "data", "mountPath": "/srv" }]);
    pod["spec"]["volumes"] =
        json!([{ "name": "data", "persistentVolumeClaim": { "claimName": claim } }]);
    pod
}

/// A claim of the default class is bound on node1, where its first consumer writes a file;
/// the consumer goes, and its replacement (no node selector: the scheduler alone would pick
/// node0, the name's tie-break) lands on node1 and reads the file. A pod put on a node with a
/// claim that does not exist waits in ContainerCreating with the kubelet's message and a
/// FailedMount Event.
fn storage_outlives_its_pod(cl: &Cluster) {
    let claim = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": { "name": "data", "namespace": "default" },
        "spec": { "accessModes": ["ReadWriteOnce"],
                  "resources": { "requests": { "storage": "16Mi" } } },
    });
    cl.create(&claim).unwrap();
    let text = "written on node1";
    let writer = command_pod(
        "writer",
        &["fabric-test-pod", "write", "/srv/greeting", text],
    );
    cl.create_pod(&on_node(with_claim(writer, "data"), 1))
        .unwrap();
    let p = cl
        .wait_pod("default", "writer", T, "Succeeded", |p| {
            p["status"]["phase"] == "Succeeded"
        })
        .unwrap();
    assert_eq!(p["spec"]["nodeName"], Cluster::node_name(1));
    let pvc = cl.api.kubectl_ok(&[
        "get",
        "pvc",
        "data",
        "-o",
        "jsonpath={.status.phase} {.metadata.annotations.volume\\.kubernetes\\.io/selected-node}",
    ]);
    assert_eq!(pvc, format!("Bound {}", Cluster::node_name(1)));
    // The file is in the PV's directory, not in the host's /srv.
    let dir = cl.api.kubectl_ok(&[
        "get",
        "pv",
        &cl.api
            .kubectl_ok(&["get", "pvc", "data", "-o", "jsonpath={.spec.volumeName}"]),
        "-o",
        "jsonpath={.spec.hostPath.path}",
    ]);
    let on_disk = std::path::Path::new(&dir).join("greeting");
    assert_eq!(
        std::fs::read_to_string(&on_disk).unwrap(),
        text,
        "{}",
        on_disk.display()
    );
    assert!(!std::path::Path::new("/srv/greeting").exists());
    cl.api
        .kubectl_ok(&["delete", "pod", "writer", "--wait=true"]);
    let reader = command_pod("reader", &["fabric-test-pod", "read", "/srv/greeting"]);
    cl.create_pod(&with_claim(reader, "data")).unwrap();
    let p = cl
        .wait_pod("default", "reader", T, "Succeeded", |p| {
            p["status"]["phase"] == "Succeeded"
        })
        .unwrap();
    assert_eq!(p["spec"]["nodeName"], Cluster::node_name(1));
    assert_eq!(cl.api.kubectl_ok(&["logs", "reader"]).trim(), text);
    cl.api
        .kubectl_ok(&["delete", "pod", "reader", "--wait=true"]);

    let mut waiting = with_claim(command_pod("claimless", &["sleep", "60"]), "absent");
    waiting["spec"]["nodeName"] = json!(Cluster::node_name(0));
    cl.create_pod(&waiting).unwrap();
    let p = cl
        .wait_pod("default", "claimless", T, "ContainerCreating", |p| {
            p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "ContainerCreating"
                && p["status"]["containerStatuses"][0]["state"]["waiting"]["message"].is_string()
        })
        .unwrap();
    assert_eq!(p["status"]["phase"], "Pending", "{p}");
    assert_eq!(
        p["status"]["containerStatuses"][0]["state"]["waiting"]["message"],
        "persistentvolumeclaim \"absent\" not found"
    );
    let events: serde_json::Value =
        serde_json::from_str(
            &cl.api
                .kubectl_ok(&["get", "events.events.k8s.io", "-o", "json"]),
        )
        .unwrap();
    let failed_mount = events["items"].as_array().unwrap().iter().any(|e| {
        e["regarding"]["name"] == "claimless"
            && e["reason"] == "FailedMount"
            && e["type"] == "Warning"
            && e["note"]
                .as_str()
                .is_some_and(|n| n.contains("persistentvolumeclaim \"absent\" not found"))
    });
    assert!(failed_mount, "{events}");
    cl.api
        .kubectl_ok(&["delete", "pod", "claimless", "--wait=true"]);
}

fn ip_of(addr: &str) -> String {
    addr.trim()
        .rsplit_once(':')
        .map(|(ip, _)| ip.to_owned())
        .unwrap_or_default()
}
