//! Two gateway operators of one cluster against a real API server: exactly one holds the
//! Lease and points the gateway Service's EndpointSlice at itself, the other stands by; when
//! the active one dies, the standby takes over and the EndpointSlice follows. The elected
//! sharing layer exits on SIGTERM whatever state it is in, and releases its Lease.
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

/// The fabric's CRDs, namespace and cluster ConfigMap (made from `from`, e.g.
/// `--from-env-file=...`), as deploy/ installs them.
fn cluster_a(api: &ApiServer, from: &str) {
    api.install_crds();
    api.kubectl_ok(&["create", "namespace", "fabric-system"]);
    api.kubectl_ok(&[
        "create",
        "configmap",
        "fabric-cluster",
        "-n",
        "fabric-system",
        from,
    ]);
}

#[test]
fn one_active_replica_owns_the_service_and_failover_moves_it() {
    if !require_tools("one_active_replica_owns_the_service_and_failover_moves_it") {
        return;
    }
    let api = ApiServer::start("election");
    cluster_a(&api, "--from-literal=FABRIC_CLUSTER_ID=cluster-a");
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

/// `fabric-controller sharing` as deployed: `replica` of the elected sharing layer, logging
/// to a file the assertions quote.
struct Sharing {
    child: ChildGuard,
    log: std::path::PathBuf,
}

impl Sharing {
    fn start(api: &ApiServer, replica: &str) -> Self {
        let log = std::env::temp_dir().join(format!(
            "fabric-sigterm-{}-{replica}.log",
            std::process::id()
        ));
        let child = Bin::at(BIN)
            .kubeconfig(&api.kubeconfig)
            .pod_name(replica)
            .args(["sharing", "--namespace", "fabric-system"])
            .log(&log)
            .spawn()
            .unwrap();
        Self { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Sharing {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The sharing layer's Lease holder (empty: released), or what kubectl said while there is no
/// Lease yet (the first replica creates it once it has started).
fn sharing_holder(api: &ApiServer) -> String {
    let o = api.kubectl(&[
        "get",
        "lease",
        fabric_api::names::lease::SHARING,
        "-n",
        "fabric-system",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    if o.status.success() {
        String::from_utf8_lossy(&o.stdout).trim().to_owned()
    } else {
        format!("(no Lease: {})", String::from_utf8_lossy(&o.stderr).trim())
    }
}

/// Sends SIGTERM to `replica` and waits for it to exit, at most `bound`; it must exit with
/// success.
fn terminate(replica: &mut Sharing, bound: Duration) -> Duration {
    let t0 = Instant::now();
    let child = &mut replica.child.0;
    // SAFETY: signalling a process this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{status}; its log:\n{}", replica.log());
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < bound,
            "still running {bound:?} after SIGTERM; its log:\n{}",
            replica.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGSTOPs `api`'s daemons while it lives: an API server that stopped answering.
struct Frozen(Vec<i32>);

impl Frozen {
    fn new(api: &ApiServer) -> Self {
        let pids = api.daemon_pids();
        for &pid in &pids {
            // SAFETY: signalling a daemon this test's API server started.
            unsafe { libc::kill(pid, libc::SIGSTOP) };
        }
        Self(pids)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        for &pid in &self.0 {
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGCONT) };
        }
    }
}

#[test]
fn the_elected_sharing_layer_exits_on_sigterm_whether_leading_or_waiting() {
    if !require_tools("the_elected_sharing_layer_exits_on_sigterm_whether_leading_or_waiting") {
        return;
    }
    let api = ApiServer::start("sigterm");
    // The sharing layer reads the whole cluster description: deploy/'s example (cluster-a).
    cluster_a(
        &api,
        &format!(
            "--from-env-file={}/../deploy/fabric-cluster.env",
            env!("CARGO_MANIFEST_DIR")
        ),
    );
    let wait_holder = |want: &str, what: &str, logs: &[&Sharing]| {
        let t0 = Instant::now();
        loop {
            let got = sharing_holder(&api);
            if got == want {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(15),
                "{what}: holder {got:?}, want {want:?}; logs:\n{}",
                logs.iter().map(|r| r.log()).collect::<Vec<_>>().join("\n")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let mut a = Sharing::start(&api, "a");
    wait_holder("a", "the only replica leads", &[&a]);
    let mut b = Sharing::start(&api, "b");
    std::thread::sleep(Duration::from_secs(2));

    // Waiting to lead: it exits at once, and the Lease stays the leader's.
    let took = terminate(&mut b, Duration::from_secs(5));
    eprintln!("the standby exited {took:?} after SIGTERM");
    assert_eq!(sharing_holder(&api), "a");

    // Leading: its controllers stop, the Lease is released for the next replica at once.
    let took = terminate(&mut a, Duration::from_secs(10));
    wait_holder("", "released on the way out", &[&a]);
    eprintln!("the leader exited {took:?} after SIGTERM");

    // Leading while the API server stops answering: it still exits (the Lease then expires
    // on its own).
    let mut c = Sharing::start(&api, "c");
    wait_holder("c", "the next replica leads", &[&c]);
    let frozen = Frozen::new(&api);
    let took = terminate(&mut c, Duration::from_secs(15));
    drop(frozen);
    eprintln!("the leader without an API server exited {took:?} after SIGTERM");
}
