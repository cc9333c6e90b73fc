//! Gateway high availability end to end (see `fabric_tests::clusters`): cluster A runs two
//! gateway replicas, active/passive through the `fabric-gateway` Lease, and dials cluster B.
//! The active replica dies as a pod would (gateway and operator SIGKILLed); the standby takes
//! the Lease once it expires, its gateway dials B (which follows by WireGuard roaming), and
//! A's nodes move their routes to it. Traffic must be back within 10 s. A replica whose
//! gateway hangs while its operator runs on must give the Lease up the same way.
use std::time::{Duration, Instant};

use fabric_tests::{
    apiserver::require_tools,
    clusters::{Cluster, Options, PeeredClusters, Replica},
    skip_unless_root,
    wait::try_eventually_blocking,
};

/// How a cluster sees pod `k` of its peer (both IPAMs pick 10.64.0.0/16, keeping host bits).
fn remote_pod(k: usize) -> String {
    Cluster::pod_ip(k).replacen("10.244.", "10.64.", 1)
}

fn has_tunnel(cl: &PeeredClusters, rep: &Replica) -> bool {
    cl.tb
        .ip(&rep.ns, &["-o", "link", "show"])
        .unwrap()
        .contains("fab-")
}

/// Waits for `pod` to reach `dst` again after a replica died at `t0`; the target is 10 s.
fn traffic_back(cl: &PeeredClusters, t0: Instant, pod: &str, dst: &str, what: &str) {
    cl.wait_reachable(pod, dst, Duration::from_secs(30))
        .unwrap();
    let took = t0.elapsed();
    eprintln!("{what}: traffic back {took:?} after the active gateway replica died");
    assert!(
        took < Duration::from_secs(10),
        "{what}: traffic back only after {took:?} (target 10 s)\n{}",
        cl.log_tails()
    );
}

/// Waits until `what` holds, or fails the test with `msg` and the components' logs.
fn eventually(cl: &PeeredClusters, timeout: Duration, msg: &str, mut what: impl FnMut() -> bool) {
    if let Err(e) = try_eventually_blocking(msg, timeout, || what().then_some(())) {
        panic!("{e}\n{}", cl.log_tails());
    }
}

#[test]
fn standby_gateway_takes_over_within_ten_seconds() {
    if skip_unless_root("standby_gateway_takes_over_within_ten_seconds")
        || !require_tools("standby_gateway_takes_over_within_ten_seconds")
    {
        return;
    }
    let mut cl = PeeredClusters::with_replicas(1, 2).unwrap();
    cl.peer_ok().unwrap();
    // Both clusters see each other's pods as 10.64.x.y.
    let (a_pod, b_pod, dst_in_b, dst_in_a) = (
        cl.a.pods[0].clone(),
        cl.b.pods[0].clone(),
        remote_pod(0),
        remote_pod(0),
    );
    cl.wait_reachable(&a_pod, &dst_in_b, Duration::from_secs(20))
        .unwrap();

    // One replica holds the Lease and publishes its address; only its gateway has a tunnel;
    // the node routes through it.
    let (active, standby) =
        cl.a.active_and_standby()
            .expect("a replica holds the gateway Lease");
    let (_, published) = cl.a.gateway_lease().unwrap();
    assert_eq!(published, active.ip);
    assert!(has_tunnel(&cl, &active), "the active gateway has no tunnel");
    assert!(
        !has_tunnel(&cl, &standby),
        "the standby gateway runs a tunnel too"
    );
    let node = cl.a.nodes[0].clone();
    let routes = cl.tb.ip(&node, &["route", "show", "proto", "250"]).unwrap();
    assert!(
        routes.contains(&format!("via {}", active.ip)),
        "node routes not via the active replica {}: {routes}",
        active.ip
    );

    // The active replica dies as its pod would: gateway and operator, no clean shutdown, so
    // the Lease is not released and has to expire.
    let t0 = Instant::now();
    cl.kill(&active.identity).unwrap();
    cl.kill(&active.operator).unwrap();
    assert!(
        !cl.tb
            .exec_any(&a_pod, &["ping", "-c", "1", "-W", "1", &dst_in_b])
            .unwrap()
            .status
            .success(),
        "traffic still flows with the active replica dead"
    );
    traffic_back(&cl, t0, &a_pod, &dst_in_b, "failover");

    // The standby holds the Lease now, the nodes route to it, B follows it (a connection
    // opened from B's side reaches A through the roamed endpoint), and it reports the tunnel.
    let (holder, published) = cl.a.gateway_lease().unwrap();
    assert_eq!(holder, standby.identity, "Lease holder after failover");
    assert_eq!(published, standby.ip);
    assert!(has_tunnel(&cl, &standby));
    let routes = cl.tb.ip(&node, &["route", "show", "proto", "250"]).unwrap();
    assert!(
        routes.contains(&format!("via {}", standby.ip)) && !routes.contains(&active.ip),
        "node routes after failover: {routes}"
    );
    cl.wait_reachable(&b_pod, &dst_in_a, Duration::from_secs(5))
        .unwrap();
    eventually(
        &cl,
        Duration::from_secs(10),
        "the new active replica reports the Connection as Connected",
        || {
            cl.a.api
                .kubectl(&[
                    "get",
                    "connection",
                    "cluster-b",
                    "-n",
                    "fabric-system",
                    "-o",
                    "jsonpath={.status.value}",
                ])
                .stdout
                == b"Connected"
        },
    );

    // The dead replica comes back (the Deployment replaces the pod) and stays standby: no
    // tunnel of its own, the Lease where it is, traffic undisturbed.
    cl.replace_replica(&active).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let (holder, _) = cl.a.gateway_lease().unwrap();
    assert_eq!(
        holder, standby.identity,
        "the returning replica took the Lease back"
    );
    assert!(
        !has_tunnel(&cl, &active),
        "the returning replica runs a tunnel while standby\n{}",
        cl.log_tails()
    );
    let took = cl
        .wait_reachable(&a_pod, &dst_in_b, Duration::from_secs(5))
        .unwrap();
    assert!(took < Duration::from_secs(2), "traffic disturbed: {took:?}");

    // The active replica's gateway hangs (SIGSTOP: alive, its sockets open, answering
    // nothing) while its operator runs on and could renew the Lease forever: the operator
    // gives the Lease up, and the standby takes over and carries the traffic.
    let (hung, next) = (standby, active);
    let t0 = Instant::now();
    cl.signal(&hung.identity, libc::SIGSTOP).unwrap();
    eventually(
        &cl,
        Duration::from_secs(10),
        "the standby takes the Lease from a replica whose gateway hangs",
        || cl.a.gateway_lease() == Some((next.identity.clone(), next.ip.clone())),
    );
    traffic_back(&cl, t0, &a_pod, &dst_in_b, "hung gateway");
    let routes = cl.tb.ip(&node, &["route", "show", "proto", "250"]).unwrap();
    assert!(
        routes.contains(&format!("via {}", next.ip)) && !routes.contains(&hung.ip),
        "node routes after the takeover from a hung gateway: {routes}"
    );
    // Going on again, the hung replica stays a standby and gives its tunnels up.
    cl.signal(&hung.identity, libc::SIGCONT).unwrap();
    eventually(
        &cl,
        Duration::from_secs(20),
        "the replica whose gateway hung gives its tunnels up",
        || !has_tunnel(&cl, &hung),
    );
    let (holder, _) = cl.a.gateway_lease().unwrap();
    assert_eq!(
        holder, next.identity,
        "the replica that hung took the Lease back"
    );
    cl.wait_reachable(&a_pod, &dst_in_b, Duration::from_secs(5))
        .unwrap();
}

/// The listening side: B runs two replicas behind its gateway Service (a load balancer that
/// follows the pod label the operators set). A dials the Service's address. When B's active
/// replica dies, the standby takes the Lease and labels its pod active, the Service moves to
/// it, and A's gateway, seeing its probes fail, handshakes again through the same address.
#[test]
fn listening_side_fails_over_behind_its_service() {
    if skip_unless_root("listening_side_fails_over_behind_its_service")
        || !require_tools("listening_side_fails_over_behind_its_service")
    {
        return;
    }
    let mut cl = PeeredClusters::with_listening_replicas(1, 2).unwrap();
    cl.peer_ok().unwrap();
    let (a_pod, b_pod, dst) = (cl.a.pods[0].clone(), cl.b.pods[0].clone(), remote_pod(0));
    cl.wait_reachable(&a_pod, &dst, Duration::from_secs(20))
        .unwrap();
    let (active, standby) = cl.b.active_and_standby().expect("B has an active replica");
    let lb = cl.lb.as_ref().unwrap();
    eventually(
        &cl,
        Duration::from_secs(5),
        "the Service selects the active replica",
        || lb.backend.lock().unwrap().as_deref() == Some(active.identity.as_str()),
    );
    // A knows B only by the Service's address.
    let a_dir = cl.a.replicas[0].dir.display().to_string();
    let a_cfg = std::fs::read_to_string(format!("{a_dir}/gateway.toml")).unwrap();
    assert!(
        a_cfg.contains(&format!(
            "endpoint = \"{}:51820\"",
            fabric_tests::clusters::LB_VIP
        )),
        "{a_cfg}"
    );

    let t0 = Instant::now();
    cl.kill(&active.identity).unwrap();
    cl.kill(&active.operator).unwrap();
    // The kubelet sees the pod's containers die and it leaves the Service's endpoints; here
    // the pod object goes (its label would otherwise keep selecting it).
    cl.b.api.kubectl_ok(&[
        "delete",
        "pod",
        &active.identity,
        "-n",
        "fabric-system",
        "--wait=false",
    ]);
    traffic_back(&cl, t0, &a_pod, &dst, "listening-side failover");
    let lb = cl.lb.as_ref().unwrap();
    assert_eq!(
        lb.backend.lock().unwrap().as_deref(),
        Some(standby.identity.as_str()),
        "the Service follows the new active replica"
    );
    let endpoints = cl.b.api.kubectl_ok(&[
        "get",
        "endpointslice",
        "fabric-gateway",
        "-n",
        "fabric-system",
        "-o",
        "jsonpath={.endpoints[*].addresses[*]}",
    ]);
    assert_eq!(
        endpoints, standby.ip,
        "the Service's endpoint is the new holder"
    );
    // Both directions through the new replica.
    cl.wait_reachable(&b_pod, &remote_pod(0), Duration::from_secs(5))
        .unwrap();
}

/// With the overlay, a takeover moves the nodes' overlay entries and routes to the new
/// active replica (its end of the overlay is already up, standby replicas keep theirs).
#[test]
fn standby_takes_over_through_the_overlay() {
    if skip_unless_root("standby_takes_over_through_the_overlay")
        || !require_tools("standby_takes_over_through_the_overlay")
    {
        return;
    }
    let mut cl = PeeredClusters::with_options(Options {
        nodes: 1,
        replicas_a: 2,
        replicas_b: 1,
        overlay: true,
        listener_lb: false,
    })
    .unwrap();
    cl.peer_ok().unwrap();
    let (a_pod, dst) = (cl.a.pods[0].clone(), remote_pod(0));
    cl.wait_reachable(&a_pod, &dst, Duration::from_secs(20))
        .unwrap();
    let (active, standby) = cl.a.active_and_standby().unwrap();
    let node = cl.a.nodes[0].clone();
    let fdb = |cl: &PeeredClusters| {
        String::from_utf8_lossy(
            &cl.tb
                .exec_any(&node, &["bridge", "fdb", "show", "dev", "fabric.vx"])
                .unwrap()
                .stdout,
        )
        .into_owned()
    };
    assert!(
        fdb(&cl).contains(&format!("dst {}", active.ip)),
        "{}",
        fdb(&cl)
    );
    // The standby's end of the overlay is up before it is needed.
    assert!(
        cl.tb
            .ip(&standby.ns, &["-o", "link", "show"])
            .unwrap()
            .contains("fabric.vx")
    );
    let t0 = Instant::now();
    cl.kill(&active.identity).unwrap();
    cl.kill(&active.operator).unwrap();
    traffic_back(&cl, t0, &a_pod, &dst, "overlay failover");
    let f = fdb(&cl);
    assert!(
        f.contains(&format!("dst {}", standby.ip)) && !f.contains(&format!("dst {}", active.ip)),
        "{f}"
    );
    let routes = cl.tb.ip(&node, &["route", "show", "proto", "250"]).unwrap();
    assert!(
        routes.contains(&format!("via {} dev fabric.vx", standby.ip)),
        "{routes}"
    );
}
