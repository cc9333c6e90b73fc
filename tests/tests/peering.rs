//! End to end with two clusters, each with its own API server and its own network (a gateway,
//! a node and a pod namespace), both with pod CIDR 10.244.0.0/16 and the same pod address.
//! The real binaries run as separate processes: IPAM controller, gateway operator, gateway,
//! node agent. `fabricctl peer` connects the clusters, pods talk across using the addresses
//! each cluster's IPAM chose, `fabricctl status` shows it, and `fabricctl unpeer` removes every
//! trace (routes, tunnels, resources).
use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use fabric_tests::{
    Testbed,
    apiserver::{ApiServer, require_tools},
    locate_bin,
    netns::spawn_in_netns,
    skip_unless_root,
};

struct Procs(Vec<(String, Child)>);
impl Drop for Procs {
    fn drop(&mut self) {
        for (_, c) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Procs {
    fn spawn(&mut self, name: &str, log_dir: &Path, mut cmd: Command) {
        let log = std::fs::File::create(log_dir.join(format!("{name}.log"))).unwrap();
        let child = cmd
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        self.0.push((name.to_owned(), child));
    }
}

fn logs(dir: &Path) -> String {
    let mut s = String::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(15).collect();
        s += &format!(
            "--- {} ---\n{}\n",
            e.file_name().to_string_lossy(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    s
}

struct Side {
    api: ApiServer,
    gw: String,
    node: String,
    pod: String,
    dir: PathBuf,
}

fn setup_cluster(tb: &mut Testbed, i: u8, id: &str, dir: &Path) -> Side {
    let api = ApiServer::start(&format!("peer-{id}"));
    let crds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
    api.kubectl_ok(&["apply", "-k", crds.to_str().unwrap()]);
    api.kubectl_ok(&["create", "namespace", "fabric-system"]);
    api.kubectl_ok(&[
        "create",
        "configmap",
        "fabric-cluster",
        "-n",
        "fabric-system",
        &format!("--from-literal=FABRIC_CLUSTER_ID={id}"),
        "--from-literal=FABRIC_POD_CIDR=10.244.0.0/16",
        "--from-literal=FABRIC_SERVICE_CIDR=10.96.0.0/12",
        "--from-literal=FABRIC_EXTERNAL_CIDR=10.70.0.0/16",
    ]);
    api.kubectl_ok(&[
        "wait",
        "--for",
        "condition=established",
        "crd",
        "--all",
        "--timeout=30s",
    ]);
    let gw = tb.add_netns(&format!("gw{i}")).unwrap();
    let node = tb.add_netns(&format!("node{i}")).unwrap();
    let pod = tb.add_netns(&format!("pod{i}")).unwrap();
    tb.veth(&gw, "lan", &node, "lan").unwrap();
    tb.ip(
        &gw,
        &["addr", "add", &format!("10.0.{i}.1/24"), "dev", "lan"],
    )
    .unwrap();
    tb.ip(
        &node,
        &["addr", "add", &format!("10.0.{i}.2/24"), "dev", "lan"],
    )
    .unwrap();
    tb.veth(&node, "pod", &pod, "eth0").unwrap();
    tb.ip(&node, &["addr", "add", "10.244.1.1/24", "dev", "pod"])
        .unwrap();
    tb.ip(&pod, &["addr", "add", "10.244.1.10/24", "dev", "eth0"])
        .unwrap();
    tb.ip(&pod, &["route", "add", "default", "via", "10.244.1.1"])
        .unwrap();
    // What the CNI would do: the gateway reaches the cluster's pods through the node.
    tb.ip(
        &gw,
        &[
            "route",
            "add",
            "10.244.0.0/16",
            "via",
            &format!("10.0.{i}.2"),
        ],
    )
    .unwrap();
    for ns in [&gw, &node] {
        tb.sysctl(ns, "net.ipv4.ip_forward", "1").unwrap();
        tb.sysctl(ns, "net.ipv4.conf.all.rp_filter", "0").unwrap();
    }
    let dir = dir.join(id);
    std::fs::create_dir_all(&dir).unwrap();
    Side {
        api,
        gw,
        node,
        pod,
        dir,
    }
}

fn fabricctl(local: &ApiServer, args: &[&str]) -> Output {
    Command::new(locate_bin("fabricctl").unwrap())
        .env("KUBECONFIG", &local.kubeconfig)
        .args(args)
        .output()
        .unwrap()
}

/// TCP from `client` to `dst`; returns the client address the server in `server` saw.
fn tcp_seen(server: &str, client: &str, dst: &str) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    let srv = spawn_in_netns(server, move || {
        let l = TcpListener::bind("0.0.0.0:7100")?;
        tx.send(()).unwrap();
        let (mut s, peer) = l.accept()?;
        let mut b = [0u8; 4];
        s.read_exact(&mut b)?;
        s.write_all(&b)?;
        Ok(peer.ip().to_string())
    });
    rx.recv_timeout(Duration::from_secs(5)).unwrap();
    let dst: SocketAddr = format!("{dst}:7100").parse().unwrap();
    fabric_tests::netns::join(spawn_in_netns(client, move || {
        let mut s = TcpStream::connect_timeout(&dst, Duration::from_secs(5))?;
        s.write_all(b"ping")?;
        let mut b = [0u8; 4];
        s.read_exact(&mut b)?;
        Ok(())
    }))
    .unwrap();
    fabric_tests::netns::join(srv).unwrap()
}

fn fabric_routes(tb: &Testbed, ns: &str) -> String {
    tb.ip(ns, &["route", "show", "proto", "250"]).unwrap()
}

#[test]
fn peer_two_clusters_with_fabricctl() {
    if skip_unless_root("peer_two_clusters_with_fabricctl")
        || !require_tools("peer_two_clusters_with_fabricctl")
    {
        return;
    }
    let mut tb = Testbed::new().unwrap();
    let dir = std::env::temp_dir().join(format!("{}-peering", tb.id()));
    std::fs::create_dir_all(&dir).unwrap();
    let a = setup_cluster(&mut tb, 1, "cluster-a", &dir);
    let b = setup_cluster(&mut tb, 2, "cluster-b", &dir);
    tb.veth(&a.gw, "ul", &b.gw, "ul").unwrap();
    tb.ip(&a.gw, &["addr", "add", "192.168.77.1/24", "dev", "ul"])
        .unwrap();
    tb.ip(&b.gw, &["addr", "add", "192.168.77.2/24", "dev", "ul"])
        .unwrap();

    let controller = locate_bin("fabric-controller").unwrap();
    let gateway = locate_bin("fabric-gateway").unwrap();
    let agent = locate_bin("fabric-agent").unwrap();
    let mut procs = Procs(Vec::new());
    for (i, s) in [(1u8, &a), (2u8, &b)] {
        let mut c = Command::new(&controller);
        c.env("KUBECONFIG", &s.api.kubeconfig).args([
            "ipam",
            "--pod-cidr",
            "10.244.0.0/16",
            "--service-cidr",
            "10.96.0.0/12",
            "--external-cidr",
            "10.70.0.0/16",
            "--pools",
            "10.64.0.0/12",
        ]);
        procs.spawn(&format!("ipam{i}"), &dir, c);
        let mut c = Command::new(&controller);
        c.env("KUBECONFIG", &s.api.kubeconfig)
            .args([
                "gateway",
                "--name",
                &format!("gw{i}"),
                "--interval",
                "300ms",
                "--advertise",
                &format!("192.168.77.{i}:51820"),
            ])
            .arg("--config")
            .arg(s.dir.join("gateway.toml"))
            .arg("--key-file")
            .arg(s.dir.join("private.key"))
            .arg("--control-dir")
            .arg(&s.dir)
            .arg("--gateway-bin")
            .arg(&gateway);
        procs.spawn(&format!("operator{i}"), &dir, c);
        let mut c = Command::new(&agent);
        c.env("KUBECONFIG", &s.api.kubeconfig).args([
            "run",
            "--gateway",
            &format!("10.0.{i}.1"),
            "--interval",
            "500ms",
            "--route-netns",
            &s.node,
        ]);
        procs.spawn(&format!("agent{i}"), &dir, c);
    }

    // fabricctl creates the gateway keys, then waits for the gateways; start them once their
    // operators have written a configuration.
    let peer = {
        let (ka, kb) = (a.api.kubeconfig.clone(), b.api.kubeconfig.clone());
        let bin = locate_bin("fabricctl").unwrap();
        std::thread::spawn(move || {
            Command::new(bin)
                .env("KUBECONFIG", ka)
                .arg("peer")
                .arg("--remote-kubeconfig")
                .arg(kb)
                .args(["--timeout-secs", "60"])
                .output()
                .unwrap()
        })
    };
    for (i, s) in [(1u8, &a), (2u8, &b)] {
        let cfg = s.dir.join("gateway.toml");
        let t0 = Instant::now();
        while !cfg.exists() {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "operator {i} wrote no config\n{}",
                logs(&dir)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &s.gw])
            .arg(&gateway)
            .arg("run")
            .arg("--config")
            .arg(&cfg);
        c.arg("--control-dir")
            .arg(&s.dir)
            .arg("--uapi-dir")
            .arg(&s.dir);
        procs.spawn(&format!("gateway{i}"), &dir, c);
    }
    let out = peer.join().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "fabricctl peer failed:\n{text}{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        logs(&dir)
    );
    assert!(text.contains("connected"), "{text}");
    println!("{text}");

    // Both clusters use 10.244.0.0/16: each IPAM gives the other's pods the first free block.
    let b_pod_in_a = "10.64.1.10";
    let a_pod_in_b = "10.64.1.10";
    let t0 = Instant::now();
    while !tb
        .exec_any(&a.pod, &["ping", "-c", "1", "-W", "1", b_pod_in_a])
        .unwrap()
        .status
        .success()
    {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "A's pod cannot reach B's pod\nA routes: {}\n{}",
            fabric_routes(&tb, &a.node),
            logs(&dir)
        );
    }
    assert!(
        tb.exec_any(&b.pod, &["ping", "-c", "2", "-W", "2", a_pod_in_b])
            .unwrap()
            .status
            .success()
    );
    assert_eq!(
        tcp_seen(&b.pod, &a.pod, b_pod_in_a),
        a_pod_in_b,
        "B's pod sees A's pod under B's view of A"
    );
    assert_eq!(
        tcp_seen(&a.pod, &b.pod, a_pod_in_b),
        b_pod_in_a,
        "and the reverse"
    );

    let st = fabricctl(&a.api, &["status"]);
    let st = String::from_utf8_lossy(&st.stdout);
    assert!(
        st.contains("cluster-b") && st.contains("10.64.0.0/16") && st.contains("Connected"),
        "{st}"
    );
    let js = fabricctl(&a.api, &["status", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&js.stdout).unwrap();
    assert_eq!(v[0]["peer"], "cluster-b");
    assert!(v[0]["rx_bytes"].as_i64().unwrap() > 0, "{v:#}");

    // Unpeer: routes, tunnels and resources go on both sides.
    let out = fabricctl(
        &a.api,
        &[
            "unpeer",
            "--remote-kubeconfig",
            b.api.kubeconfig.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "unpeer: {}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        logs(&dir)
    );
    for s in [&a, &b] {
        let t0 = Instant::now();
        loop {
            let routes = fabric_routes(&tb, &s.node);
            let links = tb.ip(&s.gw, &["-o", "link", "show"]).unwrap();
            if routes.trim().is_empty() && !links.contains("fab-") {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(15),
                "left behind: routes {routes:?} links {links}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        for kind in [
            "configurations",
            "networks",
            "connections",
            "publickeys",
            "gatewayclients",
            "gatewayservers",
        ] {
            let left = s
                .api
                .kubectl_ok(&["get", kind, "-n", "fabric-system", "-o", "name"]);
            assert!(left.trim().is_empty(), "{kind} left: {left}");
        }
    }
    assert!(
        !tb.exec_any(&a.pod, &["ping", "-c", "1", "-W", "1", b_pod_in_a])
            .unwrap()
            .status
            .success()
    );
    drop(procs);
    let _ = std::fs::remove_dir_all(&dir);
}
