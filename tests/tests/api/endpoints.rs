//! The fixture's EndpointSlice controller (`fabric-test-endpoints`) against a real API
//! server: a Service's slice follows its pods (address, readiness, named target port), a
//! slice someone else wrote for the same Service is never touched, a Service without a
//! selector gets none, and the controller's slice goes with its Service.
use std::time::Duration;

use fabric_tests::{
    apiserver::{ApiServer, require_tools},
    endpoints,
    offload_fixture::{apply, scratch_dir, tail},
    wait::eventually_blocking,
};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(20);

fn pod(name: &str, app: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "namespace": "app", "labels": { "app": app } },
        "spec": { "nodeName": "n1", "containers": [{ "name": "c", "image": "x",
                  "ports": [{ "name": "http", "containerPort": 8080 }] }] },
    })
}

/// What a kubelet reports: the pod's address, Ready or not.
fn set_status(api: &ApiServer, name: &str, ip: &str, ready: bool) {
    let status = json!({ "status": { "phase": "Running", "podIP": ip, "podIPs": [{ "ip": ip }],
        "conditions": [{ "type": "Ready", "status": if ready { "True" } else { "False" } }] } });
    api.kubectl_ok(&[
        "patch",
        "pod",
        name,
        "-n",
        "app",
        "--subresource=status",
        "--type=merge",
        "-p",
        &status.to_string(),
    ]);
}

fn slice(api: &ApiServer, name: &str) -> Option<Value> {
    api.get_json("endpointslice", Some("app"), name)
}

/// (address, ready, serving, terminating) of each endpoint, and the ports' numbers.
type Summary = (Vec<(String, bool, bool, bool)>, Vec<i64>);

fn summary(s: &Value) -> Summary {
    let eps = s["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let c = &e["conditions"];
            (
                e["addresses"][0].as_str().unwrap().to_owned(),
                c["ready"] == true,
                c["serving"] == true,
                c["terminating"] == true,
            )
        })
        .collect();
    let ports = s["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| p["port"].as_i64().unwrap())
        .collect();
    (eps, ports)
}

#[test]
fn slices_follow_pods_and_leave_others_alone() {
    if !require_tools("slices_follow_pods_and_leave_others_alone") {
        return;
    }
    let api = ApiServer::start("endpoints");
    let dir = scratch_dir("endpoints").unwrap();
    let log = dir.join("endpoints.log");
    let _controller = endpoints::start(&api, &log).unwrap();
    api.kubectl_ok(&["create", "namespace", "app"]);
    for (name, app) in [("a", "web"), ("b", "web"), ("c", "db")] {
        apply(&api, &pod(name, app)).unwrap();
    }
    set_status(&api, "a", "10.244.1.5", true);
    set_status(&api, "b", "10.244.1.6", false);
    set_status(&api, "c", "10.244.1.7", true);
    // Another writer's slice for the same Service (as the fabric's provider writes them).
    let theirs = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": { "name": "web-remote", "namespace": "app",
                      "labels": { endpoints::SERVICE_NAME_LABEL: "web",
                                  endpoints::MANAGED_BY_LABEL: "reflection.fabric.io" } },
        "addressType": "IPv4",
        "endpoints": [{ "addresses": ["10.64.1.9"], "conditions": { "ready": true } }],
        "ports": [{ "name": "", "port": 9090, "protocol": "TCP" }],
    });
    apply(&api, &theirs).unwrap();
    let theirs_version = slice(&api, "web-remote").unwrap()["metadata"]["resourceVersion"].clone();
    let service = |name: &str, selector: Value| {
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": { "name": name, "namespace": "app" },
            "spec": { "selector": selector, "ports": [{ "port": 80, "targetPort": "http" }] },
        })
    };
    apply(&api, &service("web", json!({ "app": "web" }))).unwrap();
    apply(&api, &service("bare", Value::Null)).unwrap();

    let wait_for = |want: Summary| {
        eventually_blocking("the controller's slice", T, || {
            slice(&api, "web-fabt").filter(|s| summary(s) == want)
        })
    };
    let s = wait_for((
        vec![
            ("10.244.1.5".into(), true, true, false),
            ("10.244.1.6".into(), false, false, false),
        ],
        vec![8080],
    ));
    assert_eq!(
        s["metadata"]["labels"][endpoints::MANAGED_BY_LABEL],
        endpoints::MANAGED_BY
    );
    assert_eq!(
        s["metadata"]["labels"][endpoints::SERVICE_NAME_LABEL],
        "web"
    );
    assert_eq!(s["endpoints"][0]["targetRef"]["name"], "a");
    assert_eq!(s["endpoints"][0]["nodeName"], "n1");
    assert_eq!(s["metadata"]["ownerReferences"][0]["name"], "web");

    // b becomes ready, a goes.
    set_status(&api, "b", "10.244.1.6", true);
    api.kubectl_ok(&["delete", "pod", "a", "-n", "app", "--wait=false"]);
    wait_for((vec![("10.244.1.6".into(), true, true, false)], vec![8080]));

    // The Service goes: its slice too; the other writer's stays as it was, and the Service
    // without a selector never got one from the controller.
    api.kubectl_ok(&["delete", "service", "web", "-n", "app"]);
    eventually_blocking("the slice to go with its Service", T, || {
        slice(&api, "web-fabt").is_none().then_some(())
    });
    let kept = slice(&api, "web-remote").expect("the other writer's slice");
    assert_eq!(kept["endpoints"], theirs["endpoints"]);
    assert_eq!(
        kept["metadata"]["resourceVersion"], theirs_version,
        "{kept}"
    );
    let mine = api.kubectl_ok(&[
        "get",
        "endpointslices",
        "-A",
        "-l",
        &format!("{}={}", endpoints::MANAGED_BY_LABEL, endpoints::MANAGED_BY),
        "-o",
        "name",
    ]);
    assert!(mine.trim().is_empty(), "{mine}\n{}", tail(&log, 20));
}
