//! Services by cluster IP in a fixture cluster, which has no kube-proxy nor controller
//! manager: the fixture's stand-ins make the EndpointSlice (`fabric-test-endpoints`) and DNAT
//! the cluster IP on each node (`fabric-test-node --service-proxy`). An echo pod on one node
//! answers a client pod on the other by the Service's cluster IP, seeing the client's own
//! address; once the pod is deleted its endpoint leaves the slice and connections are
//! refused; with two pods, connections reach both.
use std::time::{Duration, Instant};

use fabric_tests::{
    apiserver::require_tools,
    clusters::PeeredClusters,
    skip_unless_root,
    wait::try_eventually_blocking,
    workloads::{ECHO_PORT, echo_pod, on_node, service},
};
use serde_json::json;

const T: Duration = Duration::from_secs(20);

fn web_pod(name: &str, node: usize) -> serde_json::Value {
    let mut p = on_node(echo_pod(name), node);
    p["metadata"]["labels"] = json!({ "app": "web" });
    p
}

#[test]
fn cluster_ips_reach_ready_endpoints_only() {
    if skip_unless_root("cluster_ips_reach_ready_endpoints_only")
        || !require_tools("cluster_ips_reach_ready_endpoints_only")
    {
        return;
    }
    let t0 = Instant::now();
    let cl = PeeredClusters::new(2).unwrap();
    let a = &cl.a;
    a.create_pod(&on_node(echo_pod("client"), 0)).unwrap();
    a.create_pod(&web_pod("web-1", 1)).unwrap();
    a.create(&service("web", "default", &[("app", "web")], ECHO_PORT))
        .unwrap();
    let client = a.wait_pod_running("default", "client", T).unwrap();
    let web1 = a.wait_pod_running("default", "web-1", T).unwrap();
    assert_eq!(
        a.wait_service_endpoints("default", "web", 1, T).unwrap(),
        [web1.ip.as_str()]
    );
    let ip = a.service_ip("default", "web").unwrap();
    assert!(ip.starts_with("10.96."), "{ip}");
    eprintln!(
        "cluster up, service {ip} with one endpoint after {:?}",
        t0.elapsed()
    );

    // By cluster IP from the other node: the server sees the client's own address (DNAT only).
    let seen = try_eventually_blocking("an answer by cluster IP", T, || {
        a.connect_from(&client, &ip, ECHO_PORT).ok()
    })
    .map_err(|e| anyhow::anyhow!("{e}\n{}", cl.log_tails()))
    .unwrap();
    assert!(seen.starts_with(&format!("{}:", client.ip)), "{seen}");
    // The node's table says what it programs.
    let table = cl
        .tb
        .exec(&a.nodes[0], &["nft", "list", "table", "ip", "fabt-proxy"])
        .unwrap();
    assert!(
        table.contains(&format!("ip daddr {ip} tcp dport {ECHO_PORT} dnat"))
            && table.contains(&format!("{} . {ECHO_PORT}", web1.ip)),
        "{table}"
    );

    // The pod goes: its endpoint leaves (not ready while it terminates), and the cluster IP
    // refuses connections instead of reaching it.
    a.api
        .kubectl_ok(&["delete", "pod", "web-1", "--wait=false"]);
    assert!(
        a.wait_service_endpoints("default", "web", 0, T)
            .unwrap()
            .is_empty()
    );
    let refused = try_eventually_blocking("the cluster IP to refuse", T, || {
        a.connect_from(&client, &ip, ECHO_PORT).err()
    })
    .unwrap();
    assert!(refused.to_string().contains("refused"), "{refused:#}");

    // Two pods, one on each node: connections reach both.
    a.create_pod(&web_pod("web-2", 1)).unwrap();
    a.create_pod(&web_pod("web-3", 0)).unwrap();
    let web2 = a.wait_pod_running("default", "web-2", T).unwrap();
    let web3 = a.wait_pod_running("default", "web-3", T).unwrap();
    let mut want = vec![web2.ip.clone(), web3.ip.clone()];
    want.sort();
    assert_eq!(
        a.wait_service_endpoints("default", "web", 2, T).unwrap(),
        want
    );
    let served = |name: &str| {
        a.api
            .kubectl_ok(&["logs", name])
            .lines()
            .filter(|l| l.starts_with(&format!("connection from {}:", client.ip)))
            .count()
    };
    try_eventually_blocking("connections to reach both pods", T, || {
        // Until the proxy has the second endpoint, some connections may be refused.
        let _ = a.connect_from(&client, &ip, ECHO_PORT);
        (served("web-2") > 0 && served("web-3") > 0).then_some(())
    })
    .map_err(|e| anyhow::anyhow!("{e}\n{}", cl.log_tails()))
    .unwrap();
    eprintln!("done after {:?}", t0.elapsed());
}
