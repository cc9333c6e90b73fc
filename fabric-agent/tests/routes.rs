//! The node agent against a real API server: it routes every granted peer CIDR to the
//! gateway, restores a route deleted by hand, and removes routes of departed peers (also
//! those it finds after a restart).
use std::{
    path::Path,
    time::{Duration, Instant},
};

use fabric_tests::{
    ChildGuard, Testbed,
    apiserver::{ApiServer, require_tools},
    process::Bin,
    skip_unless_root,
    wait::{try_eventually_blocking, until},
};

const BIN: &str = env!("CARGO_BIN_EXE_fabric-agent");

fn start_agent(api: &ApiServer, node: &str, log: &Path) -> ChildGuard {
    Bin::at(BIN)
        .kubeconfig(&api.kubeconfig)
        .args([
            "run",
            "--namespace",
            "default",
            "--gateway",
            "10.9.0.1",
            "--interval",
            "500ms",
            "--route-netns",
            node,
        ])
        .log(log)
        .spawn()
        .unwrap()
}

/// A Configuration with grants already in its status (as the IPAM controller writes them).
fn configure(api: &ApiServer, name: &str, pod: &str, ext: &str) {
    configure_in(api, "default", name, pod, ext);
}

fn configure_in(api: &ApiServer, ns: &str, name: &str, pod: &str, ext: &str) {
    let obj = format!(
        "apiVersion: networking.fabric.io/v1alpha1\nkind: Configuration\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {{clusterId: {name}, remote: {{pod: \"10.244.0.0/16\", external: \"10.70.0.0/16\"}}}}\n"
    );
    let o = api.kubectl_stdin(&["apply", "-f", "-"], &obj);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let status =
        format!(r#"{{"status":{{"remote":{{"pod":"{pod}","external":"{ext}"}},"peerId":1}}}}"#);
    api.kubectl_ok(&[
        "patch",
        "configuration",
        name,
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        &status,
    ]);
}

fn fabric_routes(tb: &Testbed, node: &str) -> Vec<String> {
    let mut v: Vec<String> = tb
        .ip(node, &["route", "show", "proto", "250"])
        .unwrap()
        .lines()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .collect();
    v.sort();
    v
}

fn wait_routes(tb: &Testbed, node: &str, want: &[&str], what: &str) -> Duration {
    let t0 = Instant::now();
    let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    let mut got = Vec::new();
    let waited = try_eventually_blocking(what, Duration::from_secs(10), || {
        got = fabric_routes(tb, node);
        (got == want).then_some(())
    });
    if let Err(e) = waited {
        panic!("{e}: routes {got:?}, want {want:?}");
    }
    t0.elapsed()
}

#[test]
fn agent_routes_follow_the_api_and_repair_drift() {
    if skip_unless_root("agent_routes_follow_the_api_and_repair_drift")
        || !require_tools("agent_routes_follow_the_api_and_repair_drift")
    {
        return;
    }
    let mut tb = Testbed::new().unwrap();
    let node = tb.add_netns("node").unwrap();
    let gw = tb.add_netns("gw").unwrap();
    tb.veth(&node, "eth0", &gw, "eth0").unwrap();
    tb.ip(&node, &["addr", "add", "10.9.0.2/24", "dev", "eth0"])
        .unwrap();
    tb.ip(&gw, &["addr", "add", "10.9.0.1/24", "dev", "eth0"])
        .unwrap();

    let api = ApiServer::start("agent");
    api.install_crds();
    let logs = std::env::temp_dir().join(format!("{}-agent", tb.id()));
    std::fs::create_dir_all(&logs).unwrap();

    let agent = start_agent(&api, &node, &logs.join("a1.log"));
    // Only the fabric's namespace counts: whoever may write Configurations elsewhere (a
    // tenant's namespace) must not make every node route a range.
    api.kubectl_ok(&["create", "namespace", "elsewhere"]);
    configure_in(&api, "elsewhere", "x", "10.77.0.0/16", "10.87.0.0/16");
    configure(&api, "b", "10.71.0.0/16", "10.81.0.0/16");
    configure(&api, "c", "10.73.0.0/16", "10.83.0.0/16");
    wait_routes(
        &tb,
        &node,
        &[
            "10.71.0.0/16 via 10.9.0.1",
            "10.73.0.0/16 via 10.9.0.1",
            "10.81.0.0/16 via 10.9.0.1",
            "10.83.0.0/16 via 10.9.0.1",
        ],
        "peers b and c",
    );

    // A grant that covers this node's own network is never routed (it would cut the node off);
    // the other peers keep theirs.
    configure(&api, "d", "10.9.0.0/16", "10.85.0.0/16");
    wait_routes(
        &tb,
        &node,
        &[
            "10.71.0.0/16 via 10.9.0.1",
            "10.73.0.0/16 via 10.9.0.1",
            "10.81.0.0/16 via 10.9.0.1",
            "10.83.0.0/16 via 10.9.0.1",
            "10.85.0.0/16 via 10.9.0.1",
        ],
        "peer d with a grant covering the node",
    );
    until("the refusal logged", Duration::from_secs(5), || {
        std::fs::read_to_string(logs.join("a1.log"))
            .unwrap_or_default()
            .contains("covers this node's address 10.9.0.2")
    });
    api.kubectl_ok(&["delete", "configuration", "d", "-n", "default"]);

    // Someone deletes a route by hand: it is back within seconds.
    tb.ip(&node, &["route", "del", "10.71.0.0/16"]).unwrap();
    let took = wait_routes(
        &tb,
        &node,
        &[
            "10.71.0.0/16 via 10.9.0.1",
            "10.73.0.0/16 via 10.9.0.1",
            "10.81.0.0/16 via 10.9.0.1",
            "10.83.0.0/16 via 10.9.0.1",
        ],
        "repair",
    );
    assert!(took < Duration::from_secs(3), "repair took {took:?}");
    // Routes that are not ours are never touched.
    tb.ip(&node, &["route", "add", "10.200.0.0/16", "via", "10.9.0.1"])
        .unwrap();

    // Peer c leaves while the agent is down: the next agent removes its routes.
    drop(agent);
    api.kubectl_ok(&["delete", "configuration", "c", "-n", "default"]);
    let _agent = start_agent(&api, &node, &logs.join("a2.log"));
    wait_routes(
        &tb,
        &node,
        &["10.71.0.0/16 via 10.9.0.1", "10.81.0.0/16 via 10.9.0.1"],
        "after restart",
    );
    assert!(
        tb.ip(&node, &["route", "show", "10.200.0.0/16"])
            .unwrap()
            .contains("10.200.0.0/16")
    );

    // Unpeer b: nothing of ours is left.
    api.kubectl_ok(&["delete", "configuration", "b", "-n", "default"]);
    wait_routes(&tb, &node, &[], "after unpeering");
    let _ = std::fs::remove_dir_all(&logs);
}
