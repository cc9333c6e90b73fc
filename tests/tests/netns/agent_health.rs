//! The node agent's `/healthz` (its DaemonSet's liveness probe) reports the agent's real health:
//! it fails once the routes to the gateway or the watch of the API have kept failing for
//! `--unhealthy-after`, naming what fails, and recovers when they work again. (It used to
//! answer `ok` whatever happened.)
use std::{net::TcpListener, process::Command, time::Duration};

use fabric_tests::{
    Testbed,
    apiserver::{ApiServer, require_tools},
    process::Bin,
    skip_unless_root,
    wait::try_eventually_blocking,
};

/// (HTTP status, body) of `GET /healthz`; status 0 when nothing answers.
fn healthz(port: u16) -> (u16, String) {
    let o = Command::new("curl")
        .args(["-s", "-m", "5", "-w", "\n%{http_code}"])
        .arg(format!("http://127.0.0.1:{port}/healthz"))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

fn wait_health(port: u16, what: &str, log: &std::path::Path, ok: impl Fn(u16, &str) -> bool) {
    let mut last = (0, String::new());
    let waited = try_eventually_blocking(what, Duration::from_secs(45), || {
        last = healthz(port);
        ok(last.0, &last.1).then_some(())
    });
    if let Err(e) = waited {
        panic!(
            "{e}: /healthz still says {} {:?}\nagent log:\n{}",
            last.0,
            last.1,
            std::fs::read_to_string(log).unwrap_or_default()
        );
    }
}

#[test]
fn agent_healthz_reports_routes_and_api_watch() {
    if skip_unless_root("agent_healthz_reports_routes_and_api_watch")
        || !require_tools("agent_healthz_reports_routes_and_api_watch")
    {
        return;
    }
    let mut tb = Testbed::new().unwrap();
    let node = tb.add_netns("node").unwrap();
    let api = ApiServer::start("agent-health");
    api.install_crds();
    let ns = fabric_api::names::DEFAULT_NAMESPACE;
    api.kubectl_ok(&["create", "namespace", ns]);
    // A peer with a granted CIDR: the agent must route it to the gateway.
    let cfg = tb
        .write_file(
            "peer.yaml",
            &format!(
                "apiVersion: networking.fabric.io/v1alpha1\nkind: Configuration\n\
                 metadata: {{name: cluster-b, namespace: {ns}}}\n\
                 spec: {{clusterId: cluster-b, remote: {{pod: \"10.244.0.0/16\", external: \"10.70.0.0/16\"}}}}\n"
            ),
        )
        .unwrap();
    api.kubectl_ok(&["apply", "-f", &cfg.display().to_string()]);
    api.kubectl_ok(&[
        "patch",
        "configuration",
        "cluster-b",
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"remote":{"pod":"10.64.0.0/16","external":"10.65.0.0/16"}}}"#,
    ]);

    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = tb.write_file("agent.log", "").unwrap();
    // The agent talks to the API from the host namespace and keeps its routes in `node`,
    // where the gateway (10.0.9.1) is not reachable yet: every route write fails.
    let _agent = Bin::new("fabric-agent")
        .unwrap()
        .kubeconfig(&api.kubeconfig)
        .args(["run", "--gateway", "10.0.9.1", "--route-netns", &node])
        .args(["--interval", "300ms", "--unhealthy-after", "2s"])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .log(&log)
        .spawn()
        .unwrap();
    wait_health(port, "routes failing", &log, |code, body| {
        code == 503 && body.contains("routes to the gateway")
    });

    // The gateway becomes reachable: the routes go in, and the agent is healthy again.
    tb.ip(
        &node,
        &[
            "link", "add", "lan", "type", "veth", "peer", "name", "lan-peer",
        ],
    )
    .unwrap();
    tb.ip(&node, &["link", "set", "lan-peer", "up"]).unwrap();
    tb.ip(&node, &["addr", "add", "10.0.9.2/24", "dev", "lan"])
        .unwrap();
    tb.ip(&node, &["link", "set", "lan", "up"]).unwrap();
    wait_health(port, "routes in place", &log, |code, body| {
        code == 200 && body.trim() == "ok"
    });
    let routes = tb.ip(&node, &["route", "show", "proto", "250"]).unwrap();
    assert!(routes.contains("10.64.0.0/16 via 10.0.9.1"), "{routes}");

    // The API server goes away: once the watch has failed for the grace period, the agent
    // says so (a restart reconnects with fresh credentials and caches).
    drop(api);
    wait_health(port, "API gone", &log, |code, body| {
        code == 503 && body.contains("watch of Configurations")
    });
}
