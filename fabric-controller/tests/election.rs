//! Two gateway operators of one cluster against a real API server: exactly one holds the
//! Lease and labels its pod active (the gateway Service selects it), the other labels its pod
//! standby; when the active one dies, the standby takes over and relabels.
use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use fabric_tests::{
    ChildGuard,
    apiserver::{ApiServer, require_tools},
};

const BIN: &str = env!("CARGO_BIN_EXE_fabric-controller");

fn operator(api: &ApiServer, pod: &str, dir: &std::path::Path) -> ChildGuard {
    std::fs::create_dir_all(dir).unwrap();
    ChildGuard(
        fabric_tests::die_with_parent(&mut Command::new(BIN))
            .env("KUBECONFIG", &api.kubeconfig)
            .env("POD_NAME", pod)
            .args([
                "gateway",
                "--advertise",
                "192.0.2.10:31820",
                "--interval",
                "200ms",
            ])
            .arg("--config")
            .arg(dir.join("gateway.toml"))
            .arg("--key-file")
            .arg(dir.join("private.key"))
            .arg("--control-dir")
            .arg(dir)
            // No gateway runs here: reloads fail harmlessly, the election is what is tested.
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

fn labels(api: &ApiServer) -> String {
    api.kubectl_ok(&[
        "get",
        "pods",
        "-n",
        "fabric-system",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name}={.metadata.labels.networking\\.fabric\\.io/gateway-active} {end}",
    ])
}

fn wait_labels(api: &ApiServer, want: &[&str], what: &str) {
    let t0 = Instant::now();
    loop {
        let got = labels(api);
        if want.iter().all(|w| got.contains(w)) {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "{what}: labels {got:?}, want {want:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn one_active_replica_labelled_and_failover_relabels() {
    if !require_tools("one_active_replica_labelled_and_failover_relabels") {
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
    let first = operator(&api, "gw-0", &dir.join("0"));
    wait_labels(&api, &["gw-0=true"], "the only replica becomes active");
    let second = operator(&api, "gw-1", &dir.join("1"));
    wait_labels(
        &api,
        &["gw-0=true", "gw-1=false"],
        "the second one stands by",
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
    wait_labels(&api, &["gw-1=true"], "takeover");
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
