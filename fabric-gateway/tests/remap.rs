//! Overlapping pod CIDRs over WireGuard: three clusters, all with pod CIDR 10.244.0.0/16 and
//! the same pod address 10.244.1.10, joined by our gateways with the eBPF remap data plane on
//! their per-peer tunnel devices.
//!
//!   A sees B as 10.71/16 and C as 10.73/16;  B sees A as 10.72/16 and C as 10.74/16;
//!   C sees A as 10.75/16 and B as 10.76/16.
mod common;

use std::{
    io::{Read, Write},
    net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket},
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use common::*;

const PORT: u16 = 51820;

struct Cluster {
    name: &'static str,
    gw: String,
    pod: String,
    underlay: &'static str,
    tun_addr: &'static str,
}

/// One side's view of one peer.
struct View {
    peer: usize,
    id: u32,
    local: &'static str,
}

fn gateway_config(
    me: &Cluster,
    key: &Path,
    name: &str,
    peers: &[(&Cluster, &str, &View)],
) -> String {
    let peers = peers.iter().map(|(c, public, v)| {
        let ptun: std::net::Ipv4Addr = c.tun_addr.parse().unwrap();
        let mytun: std::net::Ipv4Addr = me.tun_addr.parse().unwrap();
        let local = v.local.parse().unwrap();
        PeerConfig::builder(c.name, public.parse().unwrap())
            .id(v.id)
            .endpoint(format!("{}:{PORT}", c.underlay).parse().unwrap())
            .allowed_ips(net(&["10.244.0.0/16"]))
            .allowed_ip(ipnetwork::Ipv4Network::from(ptun))
            .device(format!("fab-{}", c.name))
            .address(ipnetwork::Ipv4Network::from(mytun))
            .route(local)
            .route(ipnetwork::Ipv4Network::from(ptun))
            .probe_address(ptun)
            .persistent_keepalive(5)
            .remap(local, "10.244.0.0/16".parse().unwrap())
            .build()
    });
    Config::builder(key)
        .name(name)
        .listen_port(PORT)
        .mtu(1420)
        .local_cidr("10.244.0.0/16".parse().unwrap())
        .peers(peers)
        .build()
        .unwrap()
        .to_toml()
        .unwrap()
}

/// Starts a gateway in `ns` with its sockets in the lab directory.
fn spawn_gateway(lab: &mut Lab, tag: &str, ns: &str, cfg: &Path) {
    let dir = lab.dir.to_str().unwrap().to_string();
    lab.spawn(
        tag,
        ns,
        &[
            BIN,
            "run",
            "--config",
            cfg.to_str().unwrap(),
            "--control-dir",
            &dir,
            "--uapi-dir",
            &dir,
        ],
        &[("RUST_LOG", "info")],
    );
}

/// A TCP server in `ns` that accepts one connection and returns the peer address it saw.
fn tcp_peer_seen(lab: &Lab, server_ns: &str, client_ns: &str, dst: &str) -> String {
    let bind: SocketAddr = "0.0.0.0:7000".parse().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let server = fabric_netns::spawn_in(server_ns, move || {
        let l = TcpListener::bind(bind).unwrap();
        tx.send(()).unwrap();
        let (mut s, peer) = l.accept().unwrap();
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).unwrap();
        s.write_all(&buf).unwrap();
        Ok::<_, fabric_netns::Error>(peer.ip().to_string())
    });
    rx.recv_timeout(Duration::from_secs(5)).unwrap();
    let dst: SocketAddr = format!("{dst}:7000").parse().unwrap();
    lab.in_ns(client_ns, move || {
        let mut s = TcpStream::connect_timeout(&dst, Duration::from_secs(5)).expect("connect");
        s.write_all(b"hello").unwrap();
        let mut b = [0u8; 5];
        s.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"hello");
    });
    server.join().unwrap().unwrap()
}

fn udp_peer_seen(lab: &Lab, server_ns: &str, client_ns: &str, dst: &str) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    let server = fabric_netns::spawn_in(server_ns, move || {
        let s = UdpSocket::bind("0.0.0.0:7001").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        tx.send(()).unwrap();
        let mut b = [0u8; 16];
        let (n, peer) = s.recv_from(&mut b).unwrap();
        s.send_to(&b[..n], peer).unwrap();
        Ok::<_, fabric_netns::Error>(peer.ip().to_string())
    });
    rx.recv_timeout(Duration::from_secs(5)).unwrap();
    let dst = format!("{dst}:7001");
    lab.in_ns(client_ns, move || {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.send_to(b"datagram", &dst).unwrap();
        let mut b = [0u8; 16];
        let (n, _) = s.recv_from(&mut b).unwrap();
        assert_eq!(&b[..n], b"datagram");
    });
    server.join().unwrap().unwrap()
}

#[test]
fn three_clusters_same_pod_cidr_over_wireguard() {
    if !require_root("three_clusters_same_pod_cidr_over_wireguard") {
        return;
    }
    let mut lab = Lab::new("r");
    let names = ["a", "b", "c"];
    let underlays = ["10.250.0.1", "10.250.0.2", "10.250.0.3"];
    let tuns = ["169.254.200.1", "169.254.200.2", "169.254.200.3"];
    // One underlay segment: a bridge in its own namespace, a veth per gateway.
    let ul = lab.add_ns("ul");
    lab.exec(&ul, &["ip", "link", "add", "br0", "type", "bridge"]);
    lab.exec(&ul, &["ip", "link", "set", "br0", "up"]);
    let mut clusters = Vec::new();
    for i in 0..3 {
        let gw = lab.add_ns(&format!("g{}", names[i]));
        let pod = lab.add_ns(&format!("p{}", names[i]));
        let port = format!("ul-{}", names[i]);
        run(&[
            "ip", "link", "add", "ul0", "netns", &gw, "type", "veth", "peer", "name", &port,
            "netns", &ul,
        ]);
        lab.exec(&ul, &["ip", "link", "set", &port, "master", "br0", "up"]);
        lab.exec(
            &gw,
            &[
                "ip",
                "addr",
                "add",
                &format!("{}/24", underlays[i]),
                "dev",
                "ul0",
            ],
        );
        lab.exec(&gw, &["ip", "link", "set", "ul0", "up"]);
        lab.link(&gw, "pods", "10.244.1.1/24", &pod, "eth0", "10.244.1.10/24");
        lab.exec(
            &pod,
            &["ip", "route", "add", "default", "via", "10.244.1.1"],
        );
        clusters.push(Cluster {
            name: names[i],
            gw,
            pod,
            underlay: underlays[i],
            tun_addr: tuns[i],
        });
    }
    // views[i] = how cluster i sees each other cluster
    let views = [
        [
            View {
                peer: 1,
                id: 1,
                local: "10.71.0.0/16",
            },
            View {
                peer: 2,
                id: 2,
                local: "10.73.0.0/16",
            },
        ],
        [
            View {
                peer: 0,
                id: 1,
                local: "10.72.0.0/16",
            },
            View {
                peer: 2,
                id: 2,
                local: "10.74.0.0/16",
            },
        ],
        [
            View {
                peer: 0,
                id: 1,
                local: "10.75.0.0/16",
            },
            View {
                peer: 1,
                id: 2,
                local: "10.76.0.0/16",
            },
        ],
    ];
    let keys: Vec<_> = names.iter().map(|n| lab.write_key(n)).collect();
    let gw_names: Vec<String> = names.iter().map(|n| format!("{}{n}", lab.tag)).collect();
    for i in 0..3 {
        let peers: Vec<_> = views[i]
            .iter()
            .map(|v| (&clusters[v.peer], keys[v.peer].1.as_str(), v))
            .collect();
        let cfg = lab.write(
            &format!("{}.toml", names[i]),
            &gateway_config(&clusters[i], &keys[i].0, &gw_names[i], &peers),
        );
        spawn_gateway(
            &mut lab,
            &format!("gw{}", names[i]),
            &clusters[i].gw.clone(),
            &cfg,
        );
    }
    for (i, n) in gw_names.iter().enumerate() {
        lab.wait_status(n, Duration::from_secs(20), |v| {
            v["peers"]
                .as_array()
                .is_some_and(|p| p.len() == 2 && p.iter().all(|p| p["up"] == true))
        })
        .unwrap_or_else(|| {
            panic!(
                "gateway {n} peers not up\n{}",
                lab.log(&format!("gw{}", names[i]))
            )
        });
    }

    // Every pod reaches every other through its own view, and sees the caller under its own
    // view of the caller's cluster: the pods share one address, so anything else would mean
    // a packet went to the wrong cluster or came back un-translated.
    for (i, vs) in views.iter().enumerate() {
        for v in vs {
            let target = v.local.replace(".0.0/16", ".1.10");
            assert!(
                lab.ping(&clusters[i].pod, &target, 2),
                "{} -> {target} (cluster {})",
                names[i],
                names[v.peer]
            );
            let back = views[v.peer].iter().find(|w| w.peer == i).unwrap();
            let expect = back.local.replace(".0.0/16", ".1.10");
            let seen = tcp_peer_seen(&lab, &clusters[v.peer].pod, &clusters[i].pod, &target);
            assert_eq!(seen, expect, "TCP {} -> {}", names[i], names[v.peer]);
            let seen = udp_peer_seen(&lab, &clusters[v.peer].pod, &clusters[i].pod, &target);
            assert_eq!(seen, expect, "UDP {} -> {}", names[i], names[v.peer]);
        }
    }

    for name in &gw_names {
        let st = lab
            .wait_status(name, Duration::from_secs(5), |_| true)
            .unwrap();
        for p in st["peers"].as_array().unwrap() {
            assert!(p["rx_bytes"].as_u64().unwrap_or(0) > 0, "{p:#}");
            // The remap programs on the peer's device did the rewriting, both ways.
            for dir in ["egress", "ingress"] {
                assert!(
                    p["dataplane"][dir]["remapped"].as_u64().unwrap_or(0) > 0,
                    "{dir}: {p:#}"
                );
            }
        }
    }
}

/// The BPF map `name` behind the egress program on `dev` in `ns`, by id (the gateway's pins
/// live in its own mount namespace, ids are global).
fn map_id_behind(lab: &Lab, ns: &str, dev: &str, name: &str) -> u64 {
    let show = lab.exec(ns, &["tc", "filter", "show", "dev", dev, "egress"]);
    let prog: u64 = show
        .split_whitespace()
        .skip_while(|w| *w != "id")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no program id in {show}"));
    let p: serde_json::Value = serde_json::from_str(&run(&[
        "bpftool",
        "prog",
        "show",
        "id",
        &prog.to_string(),
        "--json",
    ]))
    .unwrap();
    for id in p["map_ids"].as_array().unwrap() {
        let id = id.as_u64().unwrap();
        let m: serde_json::Value = serde_json::from_str(&run(&[
            "bpftool",
            "map",
            "show",
            "id",
            &id.to_string(),
            "--json",
        ]))
        .unwrap();
        if m["name"] == name {
            return id;
        }
    }
    panic!("program {prog} has no map {name}: {p}");
}

fn remapped_ping(lab: &Lab, ns: &str, target: &str, timeout: Duration) -> bool {
    lab.wait_ping(ns, target, timeout).is_some()
}

/// Two clusters with the same pod CIDR and pod address, A seeing B as 10.71/16 and B seeing A
/// as 10.72/16, their gateways running and their tunnel up.
struct TwoGateways {
    a: Cluster,
    b: Cluster,
    key_a: std::path::PathBuf,
    /// A's gateway's name (status, control socket).
    na: String,
}

fn two_gateways(lab: &mut Lab) -> TwoGateways {
    let ga = lab.add_ns("ga");
    let gb = lab.add_ns("gb");
    let pa = lab.add_ns("pa");
    let pb = lab.add_ns("pb");
    lab.link(&ga, "ul0", "10.250.0.1/24", &gb, "ul0", "10.250.0.2/24");
    for (gw, pod) in [(&ga, &pa), (&gb, &pb)] {
        lab.link(gw, "pods", "10.244.1.1/24", pod, "eth0", "10.244.1.10/24");
        lab.exec(pod, &["ip", "route", "add", "default", "via", "10.244.1.1"]);
    }
    let a = Cluster {
        name: "a",
        gw: ga.clone(),
        pod: pa.clone(),
        underlay: "10.250.0.1",
        tun_addr: "169.254.200.1",
    };
    let b = Cluster {
        name: "b",
        gw: gb.clone(),
        pod: pb.clone(),
        underlay: "10.250.0.2",
        tun_addr: "169.254.200.2",
    };
    let (ka, kb) = (lab.write_key("a"), lab.write_key("b"));
    let (na, nb) = (format!("{}a", lab.tag), format!("{}b", lab.tag));
    let va = View {
        peer: 1,
        id: 1,
        local: "10.71.0.0/16",
    };
    let vb = View {
        peer: 0,
        id: 1,
        local: "10.72.0.0/16",
    };
    for (me, other, key, other_pub, name, view, tag) in [
        (&a, &b, &ka.0, &kb.1, &na, &va, "gwa"),
        (&b, &a, &kb.0, &ka.1, &nb, &vb, "gwb"),
    ] {
        let cfg = lab.write(
            &format!("{tag}.toml"),
            &gateway_config(me, key, name, &[(other, other_pub, view)]),
        );
        spawn_gateway(lab, tag, &me.gw.clone(), &cfg);
    }
    for n in [&na, &nb] {
        lab.wait_status(n, Duration::from_secs(20), |v| v["peers"][0]["up"] == true)
            .unwrap_or_else(|| panic!("{n} not up\n{}", lab.log("gwa")));
    }
    TwoGateways {
        a,
        b,
        key_a: ka.0,
        na,
    }
}

/// Someone detaches a remap filter, deletes map entries, deletes a tunnel route or sets the
/// tunnel device down by hand: the gateway notices within seconds and puts it back, and
/// traffic flows again.
#[test]
fn gateway_repairs_dataplane_drift() {
    if !require_root("gateway_repairs_dataplane_drift") {
        return;
    }
    let mut lab = Lab::new("d");
    let TwoGateways {
        a, key_a: ka, na, ..
    } = two_gateways(&mut lab);
    let (ga, pa) = (a.gw.clone(), a.pod.clone());
    assert!(remapped_ping(
        &lab,
        &pa,
        "10.71.1.10",
        Duration::from_secs(5)
    ));
    let repairs = |lab: &Lab| {
        lab.wait_status(&na, Duration::from_secs(2), |_| true)
            .unwrap()["repairs"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(repairs(&lab), 0);

    // A detached filter: un-translated packets no longer reach B's pod.
    lab.exec(&ga, &["tc", "filter", "del", "dev", "fab-b", "egress"]);
    let st = lab.wait_status(&na, Duration::from_secs(6), |v| {
        v["repairs"].as_u64().unwrap_or(0) >= 1
    });
    assert!(st.is_some(), "filter not re-attached\n{}", lab.log("gwa"));
    let show = lab.exec(&ga, &["tc", "filter", "show", "dev", "fab-b", "egress"]);
    assert!(show.contains("handle 0xfab"), "{show}");
    assert!(remapped_ping(
        &lab,
        &pa,
        "10.71.1.10",
        Duration::from_secs(5)
    ));

    // Deleted map entries: the device's remap configuration goes, and comes back.
    let before = repairs(&lab);
    let id = map_id_behind(&lab, &ga, "fab-b", "FABRIC_IFACES").to_string();
    let entries = delete_all_entries(&id);
    assert!(entries > 0, "no interface entries to delete");
    let st = lab.wait_status(&na, Duration::from_secs(6), |v| {
        v["repairs"].as_u64().unwrap_or(0) > before
    });
    assert!(
        st.is_some(),
        "map entries not rewritten\n{}",
        lab.log("gwa")
    );
    let dump: serde_json::Value =
        serde_json::from_str(&run(&["bpftool", "map", "dump", "id", &id, "--json"])).unwrap();
    assert_eq!(dump.as_array().unwrap().len(), entries);
    assert!(remapped_ping(
        &lab,
        &pa,
        "10.71.1.10",
        Duration::from_secs(5)
    ));
    assert!(lab.log("gwa").contains("had drifted"), "{}", lab.log("gwa"));

    // The tunnel device itself: its route to the peer's pods deleted, then the device set down.
    for cmd in [
        &["ip", "route", "del", "10.71.0.0/16", "dev", "fab-b"][..],
        &["ip", "link", "set", "fab-b", "down"][..],
    ] {
        let before = repairs(&lab);
        lab.exec(&ga, cmd);
        let st = lab.wait_status(&na, Duration::from_secs(6), |v| {
            v["repairs"].as_u64().unwrap_or(0) > before
        });
        assert!(st.is_some(), "{cmd:?} not undone\n{}", lab.log("gwa"));
        assert!(
            remapped_ping(&lab, &pa, "10.71.1.10", Duration::from_secs(5)),
            "after {cmd:?}"
        );
    }
    let routes = lab.exec(&ga, &["ip", "route", "show", "dev", "fab-b"]);
    assert!(routes.contains("10.71.0.0/16"), "{routes}");

    // The device deleted outright: the peer comes back on a new one, remap programs and all.
    let old = lab.exec(&ga, &["ip", "-o", "link", "show", "fab-b"]);
    let before = repairs(&lab);
    lab.exec(&ga, &["ip", "link", "del", "fab-b"]);
    let st = lab.wait_status(&na, Duration::from_secs(6), |v| {
        v["repairs"].as_u64().unwrap_or(0) > before
    });
    assert!(
        st.is_some(),
        "deleted device not recreated\n{}",
        lab.log("gwa")
    );
    assert!(
        remapped_ping(&lab, &pa, "10.71.1.10", Duration::from_secs(10)),
        "after deleting the device\n{}",
        lab.log("gwa")
    );
    let new = lab.exec(&ga, &["ip", "-o", "link", "show", "fab-b"]);
    assert_ne!(
        old.split(':').next(),
        new.split(':').next(),
        "a new device: {new}"
    );
    let show = lab.exec(&ga, &["tc", "filter", "show", "dev", "fab-b", "egress"]);
    assert!(show.contains("handle 0xfab"), "{show}");

    // The last peer removed by a reload: its map entries go with it, and the repair does not
    // chase its deleted device afterwards.
    let ifaces_map = map_id_behind(&lab, &ga, "fab-b", "FABRIC_IFACES").to_string();
    let entries = |id: &str| {
        let dump: serde_json::Value =
            serde_json::from_str(&run(&["bpftool", "map", "dump", "id", id, "--json"])).unwrap();
        dump.as_array().unwrap().len()
    };
    assert_eq!(entries(&ifaces_map), 1);
    let cfg = lab.write("gwa.toml", &gateway_config(&a, &ka, &na, &[]));
    let log_before = lab.log("gwa").len();
    run(&[
        BIN,
        "reload",
        "--name",
        &na,
        "--control-dir",
        lab.dir.to_str().unwrap(),
    ]);
    assert!(cfg.exists());
    assert!(
        !lab.try_exec(&ga, &["ip", "link", "show", "fab-b"])
            .status
            .success(),
        "fab-b still there after its peer was removed"
    );
    assert_eq!(entries(&ifaces_map), 0, "the last peer stayed in the maps");
    // Two repair passes (every 2 s) later, nothing was repaired or complained about.
    std::thread::sleep(Duration::from_secs(5));
    let log = lab.log("gwa");
    let since = &log[log_before..];
    assert!(
        !since.contains("WARN") && !since.contains("ERROR"),
        "after removing the last peer:\n{since}"
    );
}

/// Deletes every entry of the map with bpftool id `id`; returns how many there were.
fn delete_all_entries(id: &str) -> usize {
    let dump: serde_json::Value =
        serde_json::from_str(&run(&["bpftool", "map", "dump", "id", id, "--json"])).unwrap();
    let entries = dump.as_array().unwrap();
    for e in entries {
        let mut cmd = vec!["bpftool", "map", "delete", "id", id, "key", "hex"];
        let key: Vec<String> = e["key"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_str().unwrap().trim_start_matches("0x").to_string())
            .collect();
        cmd.extend(key.iter().map(String::as_str));
        run(&cmd);
    }
    entries.len()
}

/// With overlapping pod CIDRs, a packet from B let in untranslated carries a source in A's
/// own pod CIDR: it would pass for one of A's pods. Whatever someone removes behind A's
/// gateway's back (its ingress filter, the device's map entry, the clsact hook itself so that
/// nothing can be attached), no such packet ever reaches A's pod: the kernel refuses it
/// (strict rp_filter on the device, the program's `unconfigured` drop) until the gateway
/// notices, and the gateway delivers nothing to a device whose data plane is not in place,
/// counting what it drops, until it has put it back. Then traffic flows again.
#[test]
fn a_peer_is_not_let_in_without_its_data_plane() {
    if !require_root("a_peer_is_not_let_in_without_its_data_plane") {
        return;
    }
    let mut lab = Lab::new("f");
    let TwoGateways { a, b, na, .. } = two_gateways(&mut lab);
    // B's pod sends from a second address, one that is free in A's pod subnet: untranslated,
    // A's pod would take it (its own address it would refuse as martian).
    const B_SRC: &str = "10.244.1.20";
    const SEEN: &str = "10.71.1.20";
    lab.exec(
        &b.pod,
        &["ip", "addr", "add", &format!("{B_SRC}/24"), "dev", "eth0"],
    );
    let stop = Arc::new(AtomicBool::new(false));
    let heard: Arc<Mutex<Vec<(Instant, IpAddr)>>> = Arc::default();
    let (tx, rx) = std::sync::mpsc::channel();
    let sink = {
        let (stop, heard) = (stop.clone(), heard.clone());
        fabric_netns::spawn_in(&a.pod, move || {
            let s = UdpSocket::bind("0.0.0.0:7200").unwrap();
            s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            tx.send(()).unwrap();
            let mut buf = [0u8; 16];
            while !stop.load(Ordering::Relaxed) {
                if let Ok((_, from)) = s.recv_from(&mut buf) {
                    heard.lock().unwrap().push((Instant::now(), from.ip()));
                }
            }
            Ok::<_, fabric_netns::Error>(())
        })
    };
    rx.recv_timeout(Duration::from_secs(5)).unwrap();
    let source = {
        let stop = stop.clone();
        fabric_netns::spawn_in(&b.pod, move || {
            let s = UdpSocket::bind(format!("{B_SRC}:0")).unwrap();
            while !stop.load(Ordering::Relaxed) {
                let _ = s.send_to(b"who am i", "10.72.1.10:7200");
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok::<_, fabric_netns::Error>(())
        })
    };
    let flows_since = |t: Instant, timeout: Duration| {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if heard.lock().unwrap().iter().any(|(at, _)| *at > t) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    };
    let status = |lab: &Lab| {
        lab.wait_status(&na, Duration::from_secs(2), |_| true)
            .unwrap()
    };
    let repairs = |lab: &Lab| status(lab)["repairs"].as_u64().unwrap();
    let all_translated = |step: &str| {
        let heard = heard.lock().unwrap();
        let bad: Vec<IpAddr> = heard
            .iter()
            .map(|(_, ip)| *ip)
            .filter(|ip| ip.to_string() != SEEN)
            .collect();
        assert!(
            bad.is_empty(),
            "{step}: {} of {} datagrams arrived from elsewhere than {SEEN}: {:?}",
            bad.len(),
            heard.len(),
            &bad[..bad.len().min(5)]
        );
    };
    assert!(
        flows_since(Instant::now(), Duration::from_secs(5)),
        "no traffic to begin with"
    );

    // The ingress filter detached, then the device's map entry deleted.
    let ifaces = map_id_behind(&lab, &a.gw, "fab-b", "FABRIC_IFACES").to_string();
    for what in ["filter", "entry"] {
        let before = repairs(&lab);
        if what == "filter" {
            lab.exec(&a.gw, &["tc", "filter", "del", "dev", "fab-b", "ingress"]);
        } else {
            assert_eq!(delete_all_entries(&ifaces), 1);
        }
        let st = lab.wait_status(&na, Duration::from_secs(6), |v| {
            v["repairs"].as_u64().unwrap_or(0) > before
        });
        assert!(st.is_some(), "{what} not repaired\n{}", lab.log("gwa"));
        assert!(
            flows_since(Instant::now(), Duration::from_secs(5)),
            "no traffic after the {what} was repaired\n{}",
            lab.log("gwa")
        );
        all_translated(what);
    }

    // The clsact hook replaced by a bare ingress qdisc: nothing can be attached, so the
    // gateway stops delivering and counts why, until the hook is free again.
    let dropped = |lab: &Lab| {
        status(lab)["peers"][0]["drops"]["dataplane_not_ready"]
            .as_u64()
            .unwrap_or(0)
    };
    let before = dropped(&lab);
    lab.exec(&a.gw, &["tc", "qdisc", "del", "dev", "fab-b", "clsact"]);
    lab.exec(&a.gw, &["tc", "qdisc", "add", "dev", "fab-b", "ingress"]);
    let st = lab.wait_status(&na, Duration::from_secs(6), |v| {
        v["peers"][0]["drops"]["dataplane_not_ready"]
            .as_u64()
            .unwrap_or(0)
            > before + 50
    });
    assert!(
        st.is_some(),
        "the gateway kept delivering without its data plane: {:#}\n{}",
        status(&lab),
        lab.log("gwa")
    );
    let cut = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !heard.lock().unwrap().iter().any(|(at, _)| *at > cut),
        "delivered while the data plane could not be put back"
    );
    lab.exec(&a.gw, &["tc", "qdisc", "del", "dev", "fab-b", "ingress"]);
    assert!(
        flows_since(Instant::now(), Duration::from_secs(6)),
        "no traffic once the data plane could be put back\n{}",
        lab.log("gwa")
    );

    stop.store(true, Ordering::Relaxed);
    source.join().unwrap().unwrap();
    sink.join().unwrap().unwrap();
    all_translated("clsact replaced");
}
