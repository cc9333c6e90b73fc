//! Two gateway operators of one cluster against a real API server: exactly one holds the
//! Lease and points the gateway Service's EndpointSlice at itself, the other stands by; when
//! the active one dies, the standby takes over and the EndpointSlice follows.
use std::time::{Duration, Instant};

use fabric_tests::{
    ChildGuard,
    apiserver::{ApiServer, require_tools},
    process::Bin,
    wait::try_eventually_blocking,
};

const BIN: &str = env!("CARGO_BIN_EXE_fabric-controller");

fn operator(api: &ApiServer, pod: &str, ip: &str, dir: &std::path::Path) -> ChildGuard {
    std::fs::create_dir_all(dir).unwrap();
    Bin::at(BIN)
        .kubeconfig(&api.kubeconfig)
        .pod_name(pod)
        .args([
            "gateway",
            "--advertise",
            "192.0.2.10:31820",
            "--interval",
            "200ms",
            "--gateway-ip",
            ip,
            // No gateway runs here (see below).
            "--ignore-gateway-health",
        ])
        .arg("--config")
        .arg(dir.join("gateway.toml"))
        .arg("--key-file")
        .arg(dir.join("private.key"))
        .arg("--control-dir")
        .arg(dir)
        // No gateway runs here: reloads fail harmlessly, the election is what is tested.
        .spawn()
        .unwrap()
}

/// `pod=address` of the gateway Service's endpoints, empty while there is no EndpointSlice.
fn endpoints(api: &ApiServer) -> String {
    let o = api.kubectl(&[
        "get",
        "endpointslice",
        "fabric-gateway",
        "-n",
        "fabric-system",
        "-o",
        "jsonpath={range .endpoints[*]}{.targetRef.name}={.addresses[0]} {end}",
    ]);
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

fn wait_endpoints(api: &ApiServer, want: &str, what: &str) {
    let mut got = String::new();
    let waited = try_eventually_blocking(what, Duration::from_secs(15), || {
        got = endpoints(api);
        (got == want).then_some(())
    });
    if let Err(e) = waited {
        panic!("{e}: endpoints {got:?}, want {want:?}");
    }
}

#[test]
fn one_active_replica_owns_the_service_and_failover_moves_it() {
    if !require_tools("one_active_replica_owns_the_service_and_failover_moves_it") {
        return;
    }
    let api = ApiServer::start("election");
    api.install_crds();
    api.kubectl_ok(&["create", "namespace", "fabric-system"]);
    api.kubectl_ok(&[
        "create",
        "configmap",
        "fabric-cluster",
        "-n",
        "fabric-system",
        "--from-literal=FABRIC_CLUSTER_ID=cluster-a",
    ]);
    api.kubectl_ok(&[
        "create",
        "secret",
        "generic",
        "fabric-gateway-key",
        "-n",
        "fabric-system",
        "--from-literal=privateKey=YNqHwpcAmVj0lVzPASz9vuxsb/hLJ+J+zd69PaUgB2Y=",
    ]);
    for pod in ["gw-0", "gw-1"] {
        let o = api.kubectl_stdin(
            &["apply", "-f", "-"],
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {pod}, namespace: fabric-system}}\nspec: {{containers: [{{name: gateway, image: fabric-gateway}}]}}\n"
            ),
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let dir = std::env::temp_dir().join(format!("fabric-election-{}", std::process::id()));
    let first = operator(&api, "gw-0", "10.0.0.10", &dir.join("0"));
    wait_endpoints(&api, "gw-0=10.0.0.10", "the only replica becomes active");
    let second = operator(&api, "gw-1", "10.0.0.11", &dir.join("1"));
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        endpoints(&api),
        "gw-0=10.0.0.10",
        "the second one stands by"
    );
    let holder = api.kubectl_ok(&[
        "get",
        "lease",
        "fabric-gateway",
        "-n",
        "fabric-system",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    assert_eq!(holder, "gw-0");

    // SIGKILL: no release, the standby waits out the lease (4 s) and takes over.
    drop(first);
    let t0 = Instant::now();
    wait_endpoints(&api, "gw-1=10.0.0.11", "takeover");
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "takeover took {:?}",
        t0.elapsed()
    );
    let holder = api.kubectl_ok(&[
        "get",
        "lease",
        "fabric-gateway",
        "-n",
        "fabric-system",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    assert_eq!(holder, "gw-1");
    drop(second);
    let _ = std::fs::remove_dir_all(&dir);
}
