//! End to end with two clusters (see `fabric_tests::clusters`): each with its own API server
//! and network (a gateway, two nodes, a pod per node), both with pod CIDR 10.244.0.0/16 and
//! the same pod addresses, the real binaries as separate processes. `fabricctl peer` connects
//! them; pods on every node talk across using the addresses each cluster's IPAM chose; every
//! component survives a restart mid-traffic; `fabricctl unpeer` removes every trace.
use std::time::Duration;

use fabric_tests::{
    apiserver::require_tools,
    clusters::{Cluster, PeeredClusters},
    skip_unless_root, traffic,
    wait::try_eventually_blocking,
};

/// TCP from `client` to `dst`: the client address the server in `server` saw. One try: also
/// right after a component restarts (restarts are hitless, see hitless.rs; this was tried
/// three times while a restarted operator took the tunnels down for a moment).
fn server_saw(server: &str, client: &str, dst: &str) -> String {
    match traffic::tcp_probe(client, server, dst, 7100) {
        Ok(p) => p.server_saw.ip().to_string(),
        Err(e) => panic!("TCP from {client} to {dst}: {e:#}"),
    }
}

/// How cluster `me` sees pod `k` of its peer: both IPAMs give the other's 10.244.0.0/16
/// the first block of the pool, 10.64.0.0/16, keeping host bits.
fn remote_pod(k: usize) -> String {
    Cluster::pod_ip(k).replacen("10.244.", "10.64.", 1)
}

#[test]
fn peer_two_clusters_with_fabricctl() {
    if skip_unless_root("peer_two_clusters_with_fabricctl")
        || !require_tools("peer_two_clusters_with_fabricctl")
    {
        return;
    }
    let mut cl = PeeredClusters::new(2).unwrap();
    let text = cl.peer_ok().unwrap();
    assert!(text.contains("connected"), "{text}");

    // Every pod in A reaches every pod in B and back; servers see the caller under their own
    // cluster's view of the other cluster (all pods share addresses with the other side).
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

    // Resources the gateway cannot run beside cluster-b, added in A: a peer claiming B's
    // public key, a peer whose pod and external CIDRs overlap, and (below) the same local IP
    // exposed twice. Each is left out with a condition and an Event; the rest keeps running
    // (before, any one of them stopped every later change from reaching the gateway, and the
    // exposed IP below never worked).
    let b_key = cl.a.api.kubectl_ok(&[
        "get",
        "publickeys",
        "-n",
        "fabric-system",
        "-o",
        "jsonpath={.items[0].spec.publicKey}",
    ]);
    let bad_peer = |id: &str, pod: &str, external: &str, key: &str| {
        format!(
            "apiVersion: networking.fabric.io/v1alpha1\nkind: Configuration\n\
             metadata: {{name: {id}, namespace: fabric-system}}\n\
             spec: {{clusterId: {id}, remote: {{pod: \"{pod}\", external: \"{external}\"}}}}\n\
             ---\napiVersion: networking.fabric.io/v1alpha1\nkind: PublicKey\n\
             metadata: {{name: {id}, namespace: fabric-system}}\n\
             spec: {{clusterId: {id}, publicKey: \"{key}\"}}\n"
        )
    };
    for yaml in [
        bad_peer("cluster-x", "10.244.0.0/16", "10.70.0.0/16", b_key.trim()),
        bad_peer(
            "cluster-y",
            "10.90.0.0/16",
            "10.90.0.0/16",
            "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=",
        ),
    ] {
        let o = cl.a.api.kubectl_stdin(&["apply", "-f", "-"], &yaml);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }

    // A non-pod IP of cluster A (a host behind A's gateway) exposed to peers with an `IP`:
    // IPAM gives it an address of A's external CIDR 10.70.0.0/16, which B sees (remapped, as
    // it clashes with B's own) as 10.65.0.0/16.
    let host = cl.tb.add_netns("host1").unwrap();
    cl.tb.veth(&cl.a.gw, "ext", &host, "eth0").unwrap();
    cl.tb
        .ip(&cl.a.gw, &["addr", "add", "192.168.1.1/24", "dev", "ext"])
        .unwrap();
    cl.tb
        .ip(&host, &["addr", "add", "192.168.1.5/24", "dev", "eth0"])
        .unwrap();
    cl.tb
        .ip(&host, &["route", "add", "default", "via", "192.168.1.1"])
        .unwrap();
    let o = cl.a.api.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: networking.fabric.io/v1alpha1\nkind: IP\nmetadata: {name: db, namespace: fabric-system}\nspec: {ip: 192.168.1.5}\n",
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let external = try_eventually_blocking("an address for IP db", Duration::from_secs(10), || {
        let v = cl.a.api.kubectl_ok(&[
            "get",
            "ip",
            "db",
            "-n",
            "fabric-system",
            "-o",
            "jsonpath={.status.ip}",
        ]);
        (!v.trim().is_empty()).then(|| v.trim().to_owned())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", cl.log_tails()));
    assert_eq!(external, "10.70.0.1");
    let o = cl.a.api.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: networking.fabric.io/v1alpha1\nkind: IP\nmetadata: {name: db-again, namespace: fabric-system}\nspec: {ip: 192.168.1.5}\n",
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    cl.wait_reachable(&cl.b.pods[0], "10.65.0.1", Duration::from_secs(15))
        .unwrap();
    assert_eq!(
        server_saw(&host, &cl.b.pods[1], "10.65.0.1"),
        remote_pod(1),
        "the host sees B's pod under A's view"
    );

    // Each bad resource says why it is left out, beside IPAM's own condition; the good ones
    // say they run.
    let accepted = |kind: &str, name: &str| {
        cl.a.api.kubectl_ok(&[
            "get",
            kind,
            name,
            "-n",
            "fabric-system",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"GatewayAccepted\")].status} \
             {.status.conditions[?(@.type==\"Ready\")].status} \
             {.status.conditions[?(@.type==\"GatewayAccepted\")].message}",
        ])
    };
    for (kind, name, want) in [
        ("configuration", "cluster-x", "False True left out"),
        ("configuration", "cluster-y", "False True left out"),
        (
            "configuration",
            "cluster-b",
            "True True the gateway runs it",
        ),
        ("ip", "db-again", "False True left out"),
        ("ip", "db", "True True the gateway runs it"),
    ] {
        let mut got = String::new();
        let waited =
            try_eventually_blocking(&format!("{kind} {name}"), Duration::from_secs(30), || {
                got = accepted(kind, name);
                got.starts_with(want).then_some(())
            });
        if let Err(e) = waited {
            panic!("{e}: {got:?}, want {want:?}\n{}", cl.log_tails());
        }
    }
    assert!(accepted("configuration", "cluster-x").contains("is used by another peer"));
    assert!(accepted("configuration", "cluster-y").contains("overlap"));
    assert!(accepted("ip", "db-again").contains("overlap"));
    let (mut missing, mut events) = (Vec::new(), String::new());
    let waited =
        try_eventually_blocking("a LeftOut Event on each", Duration::from_secs(30), || {
            events = cl.a.api.kubectl_ok(&[
            "get",
            "events.events.k8s.io",
            "-n",
            "fabric-system",
            "-o",
            "jsonpath={range .items[*]}{.regarding.kind}/{.regarding.name} {.reason}{\"\\n\"}{end}",
        ]);
            missing = [
                "Configuration/cluster-x",
                "Configuration/cluster-y",
                "IP/db-again",
            ]
            .into_iter()
            .filter(|o| !events.lines().any(|l| l == format!("{o} LeftOut")))
            .collect();
            missing.is_empty().then_some(())
        });
    if let Err(e) = waited {
        panic!("{e}: none on {missing:?}: {events}");
    }

    let st = cl.fabricctl(&["status"]).unwrap();
    let st = String::from_utf8_lossy(&st.stdout);
    assert!(
        st.contains("cluster-b") && st.contains("10.64.0.0/16") && st.contains("Connected"),
        "{st}"
    );
    let js = cl.fabricctl(&["status", "-o", "json"]).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&js.stdout).unwrap();
    assert_eq!(v[0]["peer"], "cluster-b");
    assert!(v[0]["rx_bytes"].as_i64().unwrap() > 0, "{v:#}");
    // The operator told the peer's Configuration that its tunnel came up.
    let events = cl.a.api.kubectl_ok(&[
        "get",
        "events.events.k8s.io",
        "-n",
        "fabric-system",
        "-o",
        "jsonpath={range .items[*]}{.regarding.kind}/{.regarding.name} {.reason} {.reportingController}{\"\\n\"}{end}",
    ]);
    assert!(
        events
            .lines()
            .any(|l| l == "Configuration/cluster-b Connected fabric-gateway-operator"),
        "{events}"
    );

    // Each component is killed (no clean shutdown) and started again; traffic comes back by
    // itself. The gateway takes its tunnels with it, so that one is the real test.
    for name in [
        "agent1-0",
        "ipam1",
        "operator1",
        "gateway1",
        "ipam2",
        "operator2",
        "gateway2",
        "agent2-1",
    ] {
        cl.restart(name).unwrap();
        let took = cl
            .wait_reachable(&cl.a.pods[0], &remote_pod(1), Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("after restarting {name}: {e}"));
        assert!(
            took < Duration::from_secs(15),
            "{name}: traffic back only after {took:?}"
        );
        assert_eq!(
            server_saw(&cl.b.pods[1], &cl.a.pods[0], &remote_pod(1)),
            remote_pod(0),
            "after {name}"
        );
    }

    // The resources left out go before unpeering (which checks that nothing is left).
    for (kind, name) in [
        ("ip", "db-again"),
        ("configuration", "cluster-x"),
        ("configuration", "cluster-y"),
        ("publickey", "cluster-x"),
        ("publickey", "cluster-y"),
    ] {
        cl.a.api
            .kubectl_ok(&["delete", kind, name, "-n", "fabric-system", "--wait=false"]);
    }

    // Unpeer: routes, tunnels and resources go on both sides.
    let out = cl
        .fabricctl(&[
            "unpeer",
            "--remote-kubeconfig",
            cl.b.api.kubeconfig.to_str().unwrap(),
        ])
        .unwrap();
    assert!(
        out.status.success(),
        "unpeer: {}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        cl.log_tails()
    );
    for c in [&cl.a, &cl.b] {
        let (mut routes, mut links) = (String::new(), String::new());
        let waited = try_eventually_blocking(
            "routes and tunnels removed",
            Duration::from_secs(15),
            || {
                routes = c
                    .nodes
                    .iter()
                    .map(|n| cl.tb.ip(n, &["route", "show", "proto", "250"]).unwrap())
                    .collect();
                links = cl.tb.ip(&c.gw, &["-o", "link", "show"]).unwrap();
                (routes.trim().is_empty() && !links.contains("fab-")).then_some(())
            },
        );
        if let Err(e) = waited {
            panic!("{e}: left behind: routes {routes:?} links {links}");
        }
        for kind in [
            "configurations",
            "networks",
            "connections",
            "publickeys",
            "gatewayclients",
            "gatewayservers",
        ] {
            let left = c
                .api
                .kubectl_ok(&["get", kind, "-n", "fabric-system", "-o", "name"]);
            assert!(left.trim().is_empty(), "{kind} left in {}: {left}", c.id);
        }
    }
    assert!(
        !cl.tb
            .exec_any(
                &cl.a.pods[0],
                &["ping", "-c", "1", "-W", "1", &remote_pod(0)]
            )
            .unwrap()
            .status
            .success()
    );
}
