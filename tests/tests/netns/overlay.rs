//! The VXLAN overlay end to end: two clusters whose nodes cannot reach the gateway's address
//! directly (the gateways sit on a subnet of their own behind a router that knows no pod
//! addresses; see `PeeredClusters::with_overlay`). Agents and gateway operators run with
//! `--overlay`: every pod pair still talks across, with the overlay devices, entries and
//! routes put back when someone removes them, components restarted without losing it, and
//! nothing of the peer left after unpeering.
use std::time::Duration;

use fabric_tests::{
    apiserver::require_tools,
    clusters::{Cluster, PeeredClusters},
    skip_unless_root, traffic,
    wait::until,
};

fn remote_pod(k: usize) -> String {
    Cluster::pod_ip(k).replacen("10.244.", "10.64.", 1)
}

/// TCP from `client` to `dst`: the client address the server in `server` saw. One try, also
/// right after a component restarts (restarts are hitless, see hitless.rs).
fn server_saw(server: &str, client: &str, dst: &str) -> String {
    match traffic::tcp_probe(client, server, dst, 7200) {
        Ok(p) => p.server_saw.ip().to_string(),
        Err(e) => panic!("TCP from {client} to {dst}: {e:#}"),
    }
}

#[test]
fn peering_over_the_overlay_on_a_routed_cluster_network() {
    if skip_unless_root("peering_over_the_overlay_on_a_routed_cluster_network")
        || !require_tools("peering_over_the_overlay_on_a_routed_cluster_network")
    {
        return;
    }
    let mut cl = PeeredClusters::with_overlay(2).unwrap();
    let node = cl.a.nodes[0].clone();
    // What makes the overlay necessary: the gateway is no next hop for the nodes.
    let direct = cl
        .tb
        .exec_any(
            &node,
            &[
                "ip",
                "route",
                "add",
                "10.99.0.0/16",
                "via",
                &cl.a.gateway_ip(),
            ],
        )
        .unwrap();
    assert!(
        !direct.status.success(),
        "the gateway should not be on-link here"
    );

    cl.peer_ok().unwrap();
    cl.wait_reachable(&cl.a.pods[0], &remote_pod(0), Duration::from_secs(20))
        .unwrap();
    for ka in 0..2 {
        for kb in 0..2 {
            let seen = server_saw(&cl.b.pods[kb], &cl.a.pods[ka], &remote_pod(kb));
            assert_eq!(seen, remote_pod(ka), "A pod {ka} -> B pod {kb}");
            let seen = server_saw(&cl.a.pods[ka], &cl.b.pods[kb], &remote_pod(ka));
            assert_eq!(seen, remote_pod(kb), "B pod {kb} -> A pod {ka}");
        }
    }
    // All of it with the users, groups and capabilities deploy/ gives each container (the
    // fixture starts them so): the manifests work as written.
    cl.check_credentials().unwrap();

    let routes = cl.tb.ip(&node, &["route", "show", "proto", "250"]).unwrap();
    assert!(
        routes.contains("10.64.0.0/16 via 10.1.1.1 dev fabric.vx") && routes.contains("onlink"),
        "{routes}"
    );
    let gw_routes = cl
        .tb
        .ip(&cl.a.gw, &["route", "show", "proto", "250"])
        .unwrap();
    assert!(
        gw_routes.contains("10.244.1.0/24 via 10.0.1.10 dev fabric.vx")
            // The second node has no pod CIDR: its pod has a route of its own.
            && gw_routes.contains("10.244.2.10 via 10.0.1.11 dev fabric.vx"),
        "{gw_routes}"
    );

    // `fabricctl network dump` on a node shows the overlay and its endpoint.
    let out = std::process::Command::new(fabric_tests::locate_bin("fabricctl").unwrap())
        .args(["network", "dump", "--netns", &node, "-o", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["overlay"]["vni"], 4011, "{v:#}");
    assert_eq!(
        v["overlay"]["endpoints"],
        serde_json::json!(["10.1.1.1"]),
        "{v:#}"
    );
    assert!(
        v["routes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == "10.64.0.0/16 via 10.1.1.1 dev fabric.vx onlink"),
        "{v:#}"
    );

    // Drift on a node (its forwarding entry to the gateway) and on the gateway (its route to
    // a node's pods): both come back, and so does traffic.
    cl.tb
        .exec_any(
            &node,
            &[
                "bridge",
                "fdb",
                "del",
                "02:fa:0a:01:01:01",
                "dev",
                "fabric.vx",
                "dst",
                "10.1.1.1",
            ],
        )
        .unwrap();
    cl.tb
        .ip(&cl.a.gw, &["route", "del", "10.244.2.10/32"])
        .unwrap();
    until("overlay repair", Duration::from_secs(5), || {
        let fdb = cl
            .tb
            .exec_any(&node, &["bridge", "fdb", "show", "dev", "fabric.vx"])
            .unwrap();
        let r = cl
            .tb
            .ip(&cl.a.gw, &["route", "show", "proto", "250"])
            .unwrap();
        String::from_utf8_lossy(&fdb.stdout).contains("dst 10.1.1.1")
            && r.contains("10.244.2.10 via")
    });
    assert_eq!(
        server_saw(&cl.b.pods[1], &cl.a.pods[0], &remote_pod(1)),
        remote_pod(0)
    );
    assert_eq!(
        server_saw(&cl.a.pods[1], &cl.b.pods[0], &remote_pod(1)),
        remote_pod(0)
    );

    // The overlay guard: a well-formed VXLAN datagram reaches node 0's fabric.vx from the
    // gateway's address, and never from another host on the cluster network.
    let rx_in = |cl: &PeeredClusters, ns: &str| -> u64 {
        let j = cl
            .tb
            .ip(ns, &["-s", "-j", "link", "show", "fabric.vx"])
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        v[0]["stats64"]["rx"]["packets"].as_u64().unwrap()
    };
    let rx = |cl: &PeeredClusters| rx_in(cl, &node);
    // VXLAN (I flag, VNI 4011), then an Ethernet frame to the overlay MAC of `to`.
    let inject_to = |ns: &str, from: &'static str, to: [u8; 4]| {
        let mut d = vec![0x08, 0, 0, 0, 0x00, 0x0f, 0xab, 0];
        d.extend_from_slice(&[0x02, 0xfa, to[0], to[1], to[2], to[3]]);
        d.extend_from_slice(&[0x02, 0, 0, 0, 0, 1, 0x08, 0x00]);
        d.extend_from_slice(&[0u8; 28]);
        fabric_tests::netns::spawn_in_netns(ns, move || {
            let s = std::net::UdpSocket::bind(format!("{from}:0"))?;
            s.send_to(&d, (std::net::Ipv4Addr::from(to), 4790))?;
            Ok(())
        })
        .join()
        .unwrap()
        .unwrap();
        std::thread::sleep(Duration::from_millis(300));
    };
    let inject = |ns: &str, from: &'static str| inject_to(ns, from, [10, 0, 1, 10]);
    let before = rx(&cl);
    inject(&cl.a.api_ns, "10.0.1.100");
    assert_eq!(
        rx(&cl),
        before,
        "a datagram from a non-gateway host got through"
    );
    inject(&cl.a.gw, "10.1.1.1");
    assert!(rx(&cl) > before, "the gateway's own datagram was refused");
    // The gateway's guard, likewise, and its operator says so.
    fabric_tests::netns::spawn_in_netns(&cl.a.api_ns, || {
        let s = std::net::UdpSocket::bind("10.0.1.100:0")?;
        s.send_to(&[0x08, 0, 0, 0, 0, 0x0f, 0xab, 0], "10.1.1.1:4790")?;
        Ok(())
    })
    .join()
    .unwrap()
    .unwrap();
    until("the gateway guard's report", Duration::from_secs(5), || {
        std::fs::read_to_string(cl.logs.join("operator1.log"))
            .unwrap_or_default()
            .contains("overlay guard refused")
    });

    // A pod of node 0 that sends with the gateway's address as its source (a hostile pod
    // with NET_ADMIN or a raw socket) enters node 0 on its own interface, not the one the
    // gateway's datagrams use: refused.
    let pod0 = cl.a.pods[0].clone();
    cl.tb
        .ip(&pod0, &["addr", "add", "10.1.1.1/32", "dev", "eth0"])
        .unwrap();
    let before = rx(&cl);
    inject(&pod0, "10.1.1.1");
    assert_eq!(
        rx(&cl),
        before,
        "a pod spoofing the gateway's address injected into the overlay"
    );
    cl.tb
        .ip(&pod0, &["addr", "del", "10.1.1.1/32", "dev", "eth0"])
        .unwrap();

    // The guards outlive their holders (pinned): while node 0's agent and the gateway's
    // operator are down (killed, not yet back), strangers are still refused on both sides
    // and the endpoints still get through.
    cl.kill("agent1-0").unwrap();
    cl.kill("operator1").unwrap();
    let before = rx(&cl);
    inject(&cl.a.api_ns, "10.0.1.100");
    assert_eq!(
        rx(&cl),
        before,
        "with the agent down, a datagram from a non-gateway host got through"
    );
    inject(&cl.a.gw, "10.1.1.1");
    assert!(
        rx(&cl) > before,
        "with the agent down, the gateway's own datagram was refused"
    );
    let gw = cl.a.gw.clone();
    let before = rx_in(&cl, &gw);
    inject_to(&cl.a.api_ns, "10.0.1.100", [10, 1, 1, 1]);
    assert_eq!(
        rx_in(&cl, &gw),
        before,
        "with the operator down, a datagram from a non-node host got through"
    );
    inject_to(&node, "10.0.1.10", [10, 1, 1, 1]);
    assert!(
        rx_in(&cl, &gw) > before,
        "with the operator down, a node's datagram was refused"
    );
    cl.restart("agent1-0").unwrap();
    cl.restart("operator1").unwrap();

    // Restarts (SIGKILL, then started again) find their overlay in place and keep it.
    for name in ["agent1-0", "operator1", "gateway1", "operator2"] {
        cl.restart(name).unwrap();
        let took = cl
            .wait_reachable(&cl.a.pods[0], &remote_pod(1), Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("after restarting {name}: {e}"));
        assert!(
            took < Duration::from_secs(15),
            "{name}: back only after {took:?}"
        );
        assert_eq!(
            server_saw(&cl.a.pods[1], &cl.b.pods[0], &remote_pod(1)),
            remote_pod(0),
            "after {name}"
        );
    }

    let out = cl
        .fabricctl(&[
            "unpeer",
            "--remote-kubeconfig",
            cl.b.api.kubeconfig.to_str().unwrap(),
        ])
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Nothing peered: the guards go with the devices (their pins removed, so they detach).
    let pins = format!(
        "fabric-test-{}-guard",
        cl.tb
            .id()
            .trim_start_matches(fabric_tests::netns::NETNS_PREFIX)
    );
    until("overlay guards unpinned", Duration::from_secs(15), || {
        std::fs::read_dir("/sys/fs/bpf")
            .unwrap()
            .flatten()
            .all(|e| !e.file_name().to_string_lossy().starts_with(&pins))
    });
    for c in [&cl.a, &cl.b] {
        until(
            "peer routes and overlay devices removed",
            Duration::from_secs(15),
            || {
                c.nodes.iter().chain([&c.gw]).all(|n| {
                    cl.tb
                        .ip(n, &["route", "show", "proto", "250"])
                        .unwrap()
                        .trim()
                        .is_empty()
                        && !cl
                            .tb
                            .ip(n, &["-o", "link", "show"])
                            .unwrap()
                            .contains("fabric.vx")
                })
            },
        );
    }
}
