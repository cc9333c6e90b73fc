//! End-to-end tests in network namespaces: two gateway namespaces joined by a
//! veth "underlay", each with a "pod" namespace behind it.
//!
//!   pa (10.10.0.2) -- ga [fab-b 169.254.100.1] == udp 10.250.0.1 <-> 10.250.0.2 == gb [fab-a 169.254.100.2] -- pb (10.20.0.2)

mod common;

use std::{
    net::UdpSocket,
    time::{Duration, Instant},
};

use common::*;

const A_UL: &str = "10.250.0.1";
const B_UL: &str = "10.250.0.2";
const PORT: u16 = 51820;

struct Topo {
    ga: String,
    gb: String,
    pa: String,
    pb: String,
}

fn topology(lab: &mut Lab) -> Topo {
    let t = Topo {
        ga: lab.add_ns("ga"),
        gb: lab.add_ns("gb"),
        pa: lab.add_ns("pa"),
        pb: lab.add_ns("pb"),
    };
    lab.link(
        &t.ga,
        "ula",
        &format!("{A_UL}/24"),
        &t.gb,
        "ulb",
        &format!("{B_UL}/24"),
    );
    lab.link(&t.ga, "poda", "10.10.0.1/24", &t.pa, "eth0", "10.10.0.2/24");
    lab.link(&t.gb, "podb", "10.20.0.1/24", &t.pb, "eth0", "10.20.0.2/24");
    lab.exec(
        &t.pa,
        &["ip", "route", "add", "default", "via", "10.10.0.1"],
    );
    lab.exec(
        &t.pb,
        &["ip", "route", "add", "default", "via", "10.20.0.1"],
    );
    t
}

pub struct PeerSpec<'a> {
    pub name: &'a str,
    pub public_key: &'a str,
    pub endpoint: Option<String>,
    pub allowed: &'a [&'a str],
    pub device: &'a str,
    pub address: &'a str,
    pub routes: &'a [&'a str],
    pub probe: Option<&'a str>,
    pub keepalive: Option<u16>,
}

fn config(name: &str, key: &std::path::Path, peers: &[PeerSpec<'_>]) -> Config {
    let peers = peers.iter().map(|p| {
        let mut b = PeerConfig::builder(p.name, p.public_key.parse().unwrap())
            .allowed_ips(net(p.allowed))
            .device(p.device)
            .address(net(&[p.address])[0])
            .routes(net(p.routes));
        if let Some(e) = &p.endpoint {
            b = b.endpoint(e.parse().unwrap());
        }
        if let Some(pr) = p.probe {
            b = b.probe_address(pr.parse::<std::net::IpAddr>().unwrap());
        }
        if let Some(k) = p.keepalive {
            b = b.persistent_keepalive(k);
        }
        b.build()
    });
    Config::builder(key)
        .name(name)
        .listen_port(PORT)
        .peers(peers)
        .build()
        .unwrap()
}

fn toml(cfg: &Config) -> String {
    cfg.to_toml().unwrap()
}

struct Gws {
    a_name: String,
    b_name: String,
    a_pub: String,
    b_pub: String,
    a_cfg: std::path::PathBuf,
    b_cfg: std::path::PathBuf,
}

fn a_peer<'a>(b_pub: &'a str) -> PeerSpec<'a> {
    PeerSpec {
        name: "cluster-b",
        public_key: b_pub,
        endpoint: Some(format!("{B_UL}:{PORT}")),
        allowed: &["10.20.0.0/24", "169.254.100.0/30"],
        device: "fab-b",
        address: "169.254.100.1/30",
        routes: &["10.20.0.0/24"],
        probe: Some("169.254.100.2"),
        keepalive: None,
    }
}

fn b_peer<'a>(a_pub: &'a str) -> PeerSpec<'a> {
    PeerSpec {
        name: "cluster-a",
        public_key: a_pub,
        endpoint: None, // server role: waits for A, learns its endpoint
        allowed: &["10.10.0.0/24", "169.254.100.0/30"],
        device: "fab-a",
        address: "169.254.100.2/30",
        routes: &["10.10.0.0/24"],
        probe: Some("169.254.100.1"),
        keepalive: None,
    }
}

fn start_gateway(
    lab: &mut Lab,
    which: &str,
    ns: &str,
    name: &str,
    cfg: &std::path::Path,
    extra: &[&str],
) {
    let dir = lab.dir.to_str().unwrap().to_string();
    let mut cmd = vec![
        BIN,
        "run",
        "--config",
        cfg.to_str().unwrap(),
        "--control-dir",
        &dir,
    ];
    cmd.extend_from_slice(extra);
    lab.spawn(which, ns, &cmd, &[("RUST_LOG", "info")]);
    lab.remember_file(format!("/var/run/wireguard/{name}.sock").into());
    lab.wait_status(name, Duration::from_secs(10), |_| true)
        .unwrap_or_else(|| panic!("gateway {which} did not start:\n{}", lab.log(which)));
}

fn setup(lab: &mut Lab, t: &Topo, a_extra: &[&str]) -> Gws {
    setup_with(lab, t, a_extra, |_| {})
}

/// Like `setup`, with a chance to change A's view of B before A starts.
fn setup_with(
    lab: &mut Lab,
    t: &Topo,
    a_extra: &[&str],
    tweak_a: impl FnOnce(&mut PeerSpec<'_>),
) -> Gws {
    setup_full(lab, t, a_extra, 0, tweak_a)
}

/// `busy_poll_us` of a gateway.
fn with_busy_poll(mut cfg: Config, busy_poll_us: u64) -> Config {
    cfg.interface.busy_poll_us = busy_poll_us;
    cfg
}

/// Like `setup_with`, with both gateways' `busy_poll_us` set.
fn setup_full(
    lab: &mut Lab,
    t: &Topo,
    a_extra: &[&str],
    busy_poll_us: u64,
    tweak_a: impl FnOnce(&mut PeerSpec<'_>),
) -> Gws {
    let (a_key, a_pub) = lab.write_key("a");
    let (b_key, b_pub) = lab.write_key("b");
    let a_name = format!("{}a", lab.tag);
    let b_name = format!("{}b", lab.tag);
    let mut ap = a_peer(&b_pub);
    tweak_a(&mut ap);
    let a_cfg = lab.write_config(
        "a.toml",
        &with_busy_poll(config(&a_name, &a_key, &[ap]), busy_poll_us),
    );
    let b_cfg = lab.write_config(
        "b.toml",
        &with_busy_poll(config(&b_name, &b_key, &[b_peer(&a_pub)]), busy_poll_us),
    );
    start_gateway(lab, "gwb", &t.gb, &b_name, &b_cfg, &[]);
    start_gateway(lab, "gwa", &t.ga, &a_name, &a_cfg, a_extra);
    Gws {
        a_name,
        b_name,
        a_pub,
        b_pub,
        a_cfg,
        b_cfg,
    }
}

/// Pings both ways, then `bytes` of TCP each way (full-MTU packets in both directions).
fn traffic_both_ways(lab: &Lab, t: &Topo, bytes: usize) {
    assert!(
        lab.ping(&t.pa, "10.20.0.2", 3),
        "ping A->B pod failed\n{}",
        lab.log("gwa")
    );
    assert!(
        lab.ping(&t.pb, "10.10.0.2", 3),
        "ping B->A pod failed\n{}",
        lab.log("gwb")
    );
    lab.tcp_transfer(&t.pb, "10.20.0.2:5001", &t.pa, bytes);
    lab.tcp_transfer(&t.pa, "10.10.0.2:5002", &t.pb, bytes);
}

fn peer0(v: &serde_json::Value) -> &serde_json::Value {
    &v["peers"][0]
}

fn both_up(lab: &Lab, g: &Gws, timeout: Duration) {
    for (n, w) in [(&g.a_name, "gwa"), (&g.b_name, "gwb")] {
        lab.wait_status(n, timeout, |v| peer0(v)["up"] == true)
            .unwrap_or_else(|| panic!("{n} never reported its peer up\n{}", lab.log(w)));
    }
}

#[test]
fn tunnel_ping_tcp_wg_show_metrics() {
    if !require_root("tunnel_ping_tcp_wg_show_metrics") {
        return;
    }
    let mut lab = Lab::new("t");
    let t = topology(&mut lab);
    let g = setup(&mut lab, &t, &["--metrics-addr", "127.0.0.1:9586"]);
    both_up(&lab, &g, Duration::from_secs(15));
    traffic_both_ways(&lab, &t, 2 << 20);

    // `wg` talks to our UAPI socket.
    let show = run(&["wg", "show", &g.a_name]);
    assert!(show.contains(&format!("peer: {}", g.b_pub)), "{show}");
    assert!(show.contains("latest handshake:"), "{show}");
    assert!(show.contains("transfer:"), "{show}");
    assert!(show.contains(&format!("endpoint: {B_UL}:{PORT}")), "{show}");
    let dump = run(&["wg", "show", &g.b_name, "dump"]);
    let line = dump
        .lines()
        .find(|l| l.starts_with(&g.a_pub))
        .expect("peer in dump");
    let f: Vec<&str> = line.split('\t').collect();
    assert_eq!(
        f[2],
        format!("{A_UL}:{PORT}"),
        "B learnt A's endpoint by roaming: {line}"
    );
    assert_eq!(f[3], "10.10.0.0/24,169.254.100.0/30");
    assert!(f[4].parse::<u64>().unwrap() > 0, "handshake time: {line}");
    assert!(f[5].parse::<u64>().unwrap() > 2 << 20, "rx bytes: {line}");
    assert!(f[6].parse::<u64>().unwrap() > 2 << 20, "tx bytes: {line}");

    // Cryptokey routing: once B no longer accepts A's pod CIDR, pings die and are counted.
    run(&[
        "wg",
        "set",
        &g.b_name,
        "peer",
        &g.a_pub,
        "allowed-ips",
        "169.254.100.0/30",
    ]);
    assert!(
        !lab.ping(&t.pa, "10.20.0.2", 2),
        "packets from a non-allowed source got through"
    );
    let st = lab.wait_status(&g.b_name, Duration::from_secs(2), |v| {
        peer0(v)["drops"]["not_allowed_source"]
            .as_u64()
            .unwrap_or(0)
            >= 2
    });
    assert!(st.is_some(), "not_allowed_source drops not counted");
    run(&[
        "wg",
        "set",
        &g.b_name,
        "peer",
        &g.a_pub,
        "allowed-ips",
        "10.10.0.0/24,169.254.100.0/30",
    ]);
    assert!(
        lab.ping(&t.pa, "10.20.0.2", 2),
        "ping after restoring allowed-ips"
    );
    run(&[
        "wg",
        "set",
        &g.a_name,
        "peer",
        &g.b_pub,
        "persistent-keepalive",
        "7",
    ]);
    let dump = run(&["wg", "show", &g.a_name, "dump"]);
    assert!(dump.lines().nth(1).unwrap().ends_with("\t7"), "{dump}");

    // Status exposes the device for the eBPF loader.
    let st = lab
        .wait_status(&g.a_name, Duration::from_secs(5), |_| true)
        .unwrap();
    let p = peer0(&st);
    assert_eq!(p["device"], "fab-b");
    let link = lab.exec(&t.ga, &["ip", "-o", "link", "show", "fab-b"]);
    assert!(
        link.starts_with(&format!("{}: fab-b", p["ifindex"])),
        "{link} vs {p}"
    );
    assert!(link.contains("mtu 1420"), "{link}");
    assert!(p["probe_rtt_seconds"].as_f64().unwrap() > 0.0);

    let get = |path: &'static str| {
        lab.in_ns(&t.ga, move || {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect("127.0.0.1:9586").unwrap();
            s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
                .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            out
        })
    };
    let metrics = get("/metrics");
    assert!(metrics.starts_with("HTTP/1.0 200"), "{metrics}");
    // Keys, endpoints and allowed IPs stay on the control socket: any pod can scrape metrics.
    for secret in [g.b_pub.as_str(), B_UL, "10.10.0.0/24"] {
        assert!(!metrics.contains(secret), "metrics show {secret}");
    }
    let status = get("/status");
    assert!(status.starts_with("HTTP/1.0 404"), "{status}");
    assert!(
        metrics.contains("fabric_gateway_peer_up{") && metrics.contains("peer=\"cluster-b\""),
        "{metrics}"
    );
    let up = metrics
        .lines()
        .find(|l| l.starts_with("fabric_gateway_peer_up{"))
        .unwrap();
    assert!(up.ends_with(" 1"), "{up}");
    let rx = metrics
        .lines()
        .find(|l| l.starts_with("fabric_gateway_peer_rx_bytes_total{"))
        .unwrap();
    assert!(
        rx.rsplit(' ').next().unwrap().parse::<f64>().unwrap() > 0.0,
        "{rx}"
    );

    // Graceful shutdown removes the TUN device and the UAPI socket.
    let st = lab.stop("gwa", libc::SIGTERM).unwrap();
    assert!(st.success(), "exit status {st:?}\n{}", lab.log("gwa"));
    assert!(
        !lab.try_exec(&t.ga, &["ip", "link", "show", "fab-b"])
            .status
            .success()
    );
    assert!(!std::path::Path::new(&format!("/var/run/wireguard/{}.sock", g.a_name)).exists());
}

#[test]
fn faults_restart_and_garbage() {
    if !require_root("faults_restart_and_garbage") {
        return;
    }
    let mut lab = Lab::new("f");
    let t = topology(&mut lab);
    let g = setup(&mut lab, &t, &[]);
    both_up(&lab, &g, Duration::from_secs(15));
    assert!(lab.ping(&t.pa, "10.20.0.2", 2));

    // 10,000 garbage datagrams, including ones shaped like each WireGuard message type.
    let sent = lab.in_ns(&t.gb, || {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut buf = [0u8; 1500];
        let sizes = [148usize, 92, 64, 32, 1, 0, 200, 1400];
        for i in 0..10_000u32 {
            for b in buf.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            let len = sizes[i as usize % sizes.len()];
            if len >= 4 {
                buf[..4].copy_from_slice(&[(i % 5) as u8, 0, 0, 0]);
            }
            s.send_to(&buf[..len], (A_UL, PORT)).unwrap();
            if i % 200 == 199 {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        10_000
    });
    assert_eq!(sent, 10_000);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        lab.is_running("gwa"),
        "gateway died on garbage:\n{}",
        lab.log("gwa")
    );
    assert!(
        lab.ping(&t.pa, "10.20.0.2", 2),
        "tunnel broken after garbage"
    );
    // Every datagram is accounted for: dropped by us (before or after peer
    // lookup) or, when the debug build falls behind, by the kernel's receive queue.
    let st = lab
        .wait_status(&g.a_name, Duration::from_secs(2), |_| true)
        .unwrap();
    let ours: u64 = st["drops"]
        .as_object()
        .unwrap()
        .values()
        .chain(peer0(&st)["drops"].as_object().unwrap().values())
        .map(|v| v.as_u64().unwrap())
        .sum();
    let snmp = lab.exec(&t.ga, &["cat", "/proc/net/snmp"]);
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp: "));
    let (hdr, val) = (udp.next().unwrap(), udp.next().unwrap());
    let kernel: u64 = hdr
        .split_whitespace()
        .zip(val.split_whitespace())
        .find(|(h, _)| *h == "RcvbufErrors")
        .map(|(_, v)| v.parse().unwrap())
        .unwrap();
    assert!(
        ours + kernel >= 10_000 && ours >= 5_000,
        "garbage not accounted: ours={ours} kernel={kernel} {st}"
    );

    // Kill B hard: A must report Down even though its own socket is fine.
    lab.stop("gwb", libc::SIGKILL);
    lab.wait_status(&g.a_name, Duration::from_secs(8), |v| {
        peer0(v)["up"] == false
    })
    .expect("A still reports B up after B died");
    assert!(!lab.ping(&t.pa, "10.20.0.2", 1));

    // B comes back (new process, new sessions): traffic resumes within 10 s.
    let t0 = Instant::now();
    let b_cfg = g.b_cfg.clone();
    start_gateway(&mut lab, "gwb", &t.gb, &g.b_name, &b_cfg, &[]);
    let took = lab.wait_ping(&t.pa, "10.20.0.2", Duration::from_secs(10));
    assert!(
        took.is_some(),
        "traffic did not resume within 10s\nA:\n{}\nB:\n{}",
        lab.log("gwa"),
        lab.log("gwb")
    );
    eprintln!("traffic resumed {:?} after restarting B", t0.elapsed());
    let _ = g.a_cfg;
}

#[test]
fn reload_adds_and_removes_peers_without_disturbing_others() {
    if !require_root("reload_adds_and_removes_peers_without_disturbing_others") {
        return;
    }
    let mut lab = Lab::new("r");
    let t = topology(&mut lab);
    let g = setup(&mut lab, &t, &[]);
    both_up(&lab, &g, Duration::from_secs(15));
    let (_, extra_pub) = lab.write_key("extra");
    let a_key = lab.dir.join("a.key");
    let extra = PeerSpec {
        name: "cluster-c",
        public_key: &extra_pub,
        endpoint: Some("10.250.0.3:51820".into()),
        allowed: &["10.30.0.0/24"],
        device: "fab-c",
        address: "169.254.101.1/30",
        routes: &["10.30.0.0/24"],
        probe: None,
        keepalive: None,
    };
    let a_pid_ping = {
        // Continuous ping while peers are added and removed.
        let mut v = vec!["ip", "netns", "exec", &t.pa];
        v.extend(["ping", "-c", "30", "-i", "0.1", "-W", "1", "10.20.0.2"]);
        let mut c = std::process::Command::new(v[0]);
        c.args(&v[1..]).stdout(std::process::Stdio::piped());
        c.spawn().unwrap()
    };
    std::fs::write(
        &g.a_cfg,
        toml(&config(&g.a_name, &a_key, &[a_peer(&g.b_pub), extra])),
    )
    .unwrap();
    run(&[
        BIN,
        "reload",
        "--name",
        &g.a_name,
        "--control-dir",
        lab.dir.to_str().unwrap(),
    ]);
    assert!(
        lab.try_exec(&t.ga, &["ip", "link", "show", "fab-c"])
            .status
            .success(),
        "fab-c not created"
    );
    let routes = lab.exec(&t.ga, &["ip", "route", "show", "dev", "fab-c"]);
    assert!(routes.contains("10.30.0.0/24"), "{routes}");
    // Remove it again, this time via SIGHUP.
    std::fs::write(
        &g.a_cfg,
        toml(&config(&g.a_name, &a_key, &[a_peer(&g.b_pub)])),
    )
    .unwrap();
    let pid = lab.pid("gwa").unwrap();
    // SAFETY: pid of the gateway we started in our own namespace.
    unsafe { libc::kill(pid, libc::SIGHUP) };
    let t0 = Instant::now();
    while lab
        .try_exec(&t.ga, &["ip", "link", "show", "fab-c"])
        .status
        .success()
    {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "fab-c not removed on SIGHUP"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = a_pid_ping.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(" 0% packet loss"),
        "peer B disturbed by reload: {text}"
    );
    // Endpoint change on reload: point A at a dead address, B's traffic must stop being answered.
    let mut moved = a_peer(&g.b_pub);
    moved.endpoint = Some("10.250.0.9:51820".into());
    std::fs::write(&g.a_cfg, toml(&config(&g.a_name, &a_key, &[moved]))).unwrap();
    run(&[
        BIN,
        "reload",
        "--name",
        &g.a_name,
        "--control-dir",
        lab.dir.to_str().unwrap(),
    ]);
    let dump = run(&["wg", "show", &g.a_name, "endpoints"]);
    assert!(dump.contains("10.250.0.9:51820"), "{dump}");
}

/// A new private key in the key file is taken up at the next reload, without a restart: the
/// tunnels are re-keyed and carry traffic again once the peer has the new public key (before,
/// the reload only warned that the key takes effect after a restart, so B, told A's new key,
/// never heard from A again).
#[test]
fn a_rotated_key_is_taken_up_without_a_restart() {
    if !require_root("a_rotated_key_is_taken_up_without_a_restart") {
        return;
    }
    let mut lab = Lab::new("k");
    let t = topology(&mut lab);
    let g = setup(&mut lab, &t, &[]);
    both_up(&lab, &g, Duration::from_secs(15));
    let pid = lab.pid("gwa").unwrap();
    let dir = lab.dir.to_str().unwrap().to_owned();
    let reload = |name: &str| run(&[BIN, "reload", "--name", name, "--control-dir", &dir]);
    // As the operator writes it: a whole new file renamed over the old one.
    let (new_key, new_pub) = lab.write_key("a-rotated");
    std::fs::rename(&new_key, lab.dir.join("a.key")).unwrap();
    reload(&g.a_name);
    lab.wait_status(&g.a_name, Duration::from_secs(5), |v| {
        v["public_key"] == new_pub.as_str()
    })
    .unwrap_or_else(|| panic!("A does not use its new key\n{}", lab.log("gwa")));
    // B learns it the usual way: its configuration of A (from A's PublicKey) changes.
    std::fs::write(
        &g.b_cfg,
        toml(&config(
            &g.b_name,
            &lab.dir.join("b.key"),
            &[b_peer(&new_pub)],
        )),
    )
    .unwrap();
    reload(&g.b_name);
    for (ns, dst, w) in [(&t.pa, "10.20.0.2", "gwa"), (&t.pb, "10.10.0.2", "gwb")] {
        lab.wait_ping(ns, dst, Duration::from_secs(30))
            .unwrap_or_else(|| {
                panic!(
                    "no traffic after the rotation\n{}\n{}",
                    lab.log(w),
                    lab.log("gwb")
                )
            });
    }
    let handshakes = run(&["wg", "show", &g.b_name, "latest-handshakes"]);
    let line = handshakes
        .lines()
        .find(|l| l.starts_with(&new_pub))
        .unwrap_or_else(|| panic!("B does not show A's new key:\n{handshakes}"));
    assert!(
        !line.ends_with("\t0"),
        "no handshake with the new key: {line}"
    );
    assert!(!handshakes.contains(&g.a_pub), "{handshakes}");
    assert!(lab.is_running("gwa"), "A exited\n{}", lab.log("gwa"));
    assert_eq!(lab.pid("gwa"), Some(pid), "A was restarted");
    assert!(
        !lab.log("gwa").contains("only after a restart"),
        "{}",
        lab.log("gwa")
    );
}

/// The task id of the gateway thread named `name`.
fn thread_id(pid: i32, name: &str) -> i32 {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|e| e.ok())
        .find(|e| std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == name))
        .and_then(|e| e.file_name().to_str()?.parse().ok())
        .unwrap_or_else(|| panic!("no thread {name} in {pid}"))
}

/// A packet thread that stops coming round its loop (here: held by a tracer, as a thread
/// blocked forever in a lock or a device would be; the rest of the process runs on) makes
/// the gateway report itself unable to serve, so the operator hands the Lease over and the
/// liveness probe (`fabric-gateway health`) fails; released, it heals. Before: only a
/// thread that had ended counted, and a stuck one left a half-alive gateway that passed.
#[test]
fn a_stuck_packet_thread_makes_the_gateway_unhealthy() {
    if !require_root("a_stuck_packet_thread_makes_the_gateway_unhealthy") {
        return;
    }
    let mut lab = Lab::new("s");
    let t = topology(&mut lab);
    let g = setup(&mut lab, &t, &[]);
    both_up(&lab, &g, Duration::from_secs(15));
    let dir = lab.dir.to_str().unwrap().to_owned();
    let health = |name: &str| sh(&[BIN, "health", "--name", name, "--control-dir", &dir]);
    let out = health(&g.a_name);
    assert!(out.status.success(), "{out:?}");
    let tid = thread_id(lab.pid("gwa").unwrap(), "fgw-udp");
    // SAFETY: ptrace on a thread of the gateway this test started; every ptrace call is made
    // from this thread, the tracer.
    unsafe {
        assert_eq!(
            libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0),
            0,
            "{}",
            std::io::Error::last_os_error()
        );
        assert_eq!(libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0), 0);
        let mut st = 0;
        assert_eq!(libc::waitpid(tid, &mut st, libc::__WALL), tid);
    }
    let stuck = lab.wait_status(&g.a_name, Duration::from_secs(20), |v| {
        v["problems"].as_array().is_some_and(|p| {
            p.iter()
                .any(|p| p["problem"] == "thread_stuck" && p["thread"] == "fgw-udp")
        })
    });
    let out = health(&g.a_name);
    // SAFETY: the tracee is in a ptrace-stop (waited for above).
    unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0, 0) };
    assert!(
        stuck.is_some(),
        "the stuck thread was not reported\n{}",
        lab.log("gwa")
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "health passed with a stuck thread: {out:?}"
    );
    assert!(err.contains("fgw-udp stuck"), "{err}");
    lab.wait_status(&g.a_name, Duration::from_secs(10), |v| {
        v.get("problems").is_none()
    })
    .unwrap_or_else(|| panic!("still unhealthy once released\n{}", lab.log("gwa")));
    assert!(health(&g.a_name).status.success());
    assert!(lab.ping(&t.pa, "10.20.0.2", 3), "{}", lab.log("gwa"));
}

#[derive(Clone, Copy, Debug)]
enum Cut {
    /// Silent black hole: every packet on A's underlay is dropped, the link stays up.
    Nftables,
    /// Carrier loss: A's underlay link goes down, sends fail with an error.
    LinkDown,
}

const CUT_FOR: Duration = Duration::from_secs(20);

fn cut_underlay(lab: &Lab, ns: &str, how: Cut, cut: bool) {
    match (how, cut) {
        (Cut::Nftables, true) => {
            lab.exec(ns, &["nft", "add table inet fgwcut"]);
            for (chain, hook, dir) in [("in", "input", "iifname"), ("out", "output", "oifname")] {
                lab.exec(
                    ns,
                    &[
                        "nft",
                        &format!(
                            "add chain inet fgwcut {chain} {{ type filter hook {hook} priority -300; policy accept; }}"
                        ),
                    ],
                );
                lab.exec(
                    ns,
                    &[
                        "nft",
                        &format!("add rule inet fgwcut {chain} {dir} ula drop"),
                    ],
                );
            }
        }
        (Cut::Nftables, false) => {
            lab.exec(ns, &["nft", "delete table inet fgwcut"]);
        }
        (Cut::LinkDown, cut) => {
            lab.exec(
                ns,
                &["ip", "link", "set", "ula", if cut { "down" } else { "up" }],
            );
        }
    }
}

/// The underlay disappears for 20 s: both sides report Down while it is cut and
/// the tunnel comes back by itself, without restarts or reconfiguration.
fn underlay_cut_recovers(test: &str, tag: &str, how: Cut) {
    if !require_root(test) {
        return;
    }
    let mut lab = Lab::new(tag);
    let t = topology(&mut lab);
    let g = setup(&mut lab, &t, &[]);
    both_up(&lab, &g, Duration::from_secs(15));
    assert!(lab.ping(&t.pa, "10.20.0.2", 2));

    let cut_at = Instant::now();
    cut_underlay(&lab, &t.ga, how, true);
    for (n, w) in [(&g.a_name, "gwa"), (&g.b_name, "gwb")] {
        lab.wait_status(n, Duration::from_secs(8), |v| peer0(v)["up"] == false)
            .unwrap_or_else(|| {
                panic!(
                    "{n} still reports Up with the underlay cut ({how:?})\n{}",
                    lab.log(w)
                )
            });
    }
    assert!(
        !lab.ping(&t.pa, "10.20.0.2", 2),
        "ping passed through a cut underlay"
    );
    if let Some(rest) = CUT_FOR.checked_sub(cut_at.elapsed()) {
        std::thread::sleep(rest);
    }
    // Still Down at the end of the cut, not just briefly after it began.
    for n in [&g.a_name, &g.b_name] {
        let st = lab
            .wait_status(n, Duration::from_secs(5), |_| true)
            .unwrap();
        assert_eq!(
            peer0(&st)["up"],
            false,
            "{n} Up after {CUT_FOR:?} cut: {st}"
        );
    }

    let restored = Instant::now();
    cut_underlay(&lab, &t.ga, how, false);
    let took = lab.wait_ping(&t.pa, "10.20.0.2", Duration::from_secs(15));
    assert!(
        took.is_some(),
        "no traffic 15 s after restoring the underlay ({how:?})\nA:\n{}\nB:\n{}",
        lab.log("gwa"),
        lab.log("gwb")
    );
    eprintln!(
        "{how:?}: traffic resumed {:?} after restoring the underlay",
        restored.elapsed()
    );
    both_up(&lab, &g, Duration::from_secs(10));
    assert!(
        lab.ping(&t.pb, "10.10.0.2", 2),
        "B->A broken after recovery"
    );
    lab.tcp_transfer(&t.pb, "10.20.0.2:5003", &t.pa, 1 << 20);
}

#[test]
fn underlay_blackholed_20s_recovers() {
    underlay_cut_recovers("underlay_blackholed_20s_recovers", "c", Cut::Nftables);
}

#[test]
fn underlay_link_down_20s_recovers() {
    underlay_cut_recovers("underlay_link_down_20s_recovers", "d", Cut::LinkDown);
}

fn endpoints(name: &str) -> String {
    run(&["wg", "show", name, "endpoints"])
}

/// The client's underlay address changes under a running tunnel: its keepalives
/// announce the new address and the server's traffic follows it, with no
/// reconfiguration of the server.
#[test]
fn roaming_client_address_change() {
    if !require_root("roaming_client_address_change") {
        return;
    }
    let mut lab = Lab::new("m");
    let t = topology(&mut lab);
    // No probes on A: only the persistent keepalive may announce the new address.
    let g = setup_with(&mut lab, &t, &[], |a| {
        a.keepalive = Some(1);
        a.probe = None;
    });
    both_up(&lab, &g, Duration::from_secs(15));
    let before = endpoints(&g.b_name);
    assert!(before.contains(&format!("{A_UL}:{PORT}")), "{before}");

    const NEW_UL: &str = "10.250.0.11";
    lab.exec(
        &t.ga,
        &["ip", "addr", "del", &format!("{A_UL}/24"), "dev", "ula"],
    );
    lab.exec(
        &t.ga,
        &["ip", "addr", "add", &format!("{NEW_UL}/24"), "dev", "ula"],
    );
    let moved = Instant::now();
    let want = format!("{g_pub}\t{NEW_UL}:{PORT}", g_pub = g.a_pub);
    let mut last = String::new();
    while moved.elapsed() < Duration::from_secs(10) {
        last = endpoints(&g.b_name);
        if last.lines().any(|l| l == want) {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        last.lines().any(|l| l == want),
        "server did not learn the new endpoint: {last:?}\nA:\n{}\nB:\n{}",
        lab.log("gwa"),
        lab.log("gwb")
    );
    eprintln!("endpoint moved after {:?}", moved.elapsed());

    // Server-originated traffic is what depends on the learnt endpoint.
    assert!(
        lab.ping(&t.pb, "10.10.0.2", 3),
        "B->A ping did not follow the roamed endpoint\nB:\n{}",
        lab.log("gwb")
    );
    assert!(lab.ping(&t.pa, "10.20.0.2", 3), "A->B ping after roaming");
    lab.tcp_transfer(&t.pa, "10.10.0.2:5004", &t.pb, 1 << 20);
    let st = lab
        .wait_status(&g.b_name, Duration::from_secs(5), |v| {
            peer0(v)["up"] == true
        })
        .expect("B reports A Down after roaming");
    assert_eq!(peer0(&st)["endpoint"], format!("{NEW_UL}:{PORT}"), "{st}");
    let b_cfg = std::fs::read_to_string(&g.b_cfg).unwrap();
    assert!(!b_cfg.contains("endpoint"), "server config was touched");
}

/// Busy-poll mode: one thread serves every tunnel (devices come and go with reloads)
/// and it stops spinning once traffic stops.
#[test]
fn busy_poll_one_thread_serves_all_tunnels() {
    if !require_root("busy_poll_one_thread_serves_all_tunnels") {
        return;
    }
    let mut lab = Lab::new("q");
    let t = topology(&mut lab);
    const BUSY: u64 = 2000;
    let g = setup_full(&mut lab, &t, &[], BUSY, |_| {});
    let a_key = lab.dir.join("a.key");
    both_up(&lab, &g, Duration::from_secs(15));
    traffic_both_ways(&lab, &t, 4 << 20);

    let a_pid = lab.pid("gwa").unwrap();
    let threads = || -> Vec<String> {
        std::fs::read_dir(format!("/proc/{a_pid}/task"))
            .unwrap()
            .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
            .map(|s| s.trim().to_string())
            .collect()
    };
    let names = threads();
    assert!(names.iter().any(|n| n == "fgw-poll"), "{names:?}");
    assert!(
        !names
            .iter()
            .any(|n| n.starts_with("fgw-tun") || n == "fgw-udp"),
        "{names:?}"
    );

    // A peer added and removed while B's traffic flows: the poll set follows.
    let (_, c_pub) = lab.write_key("c");
    let extra = PeerSpec {
        name: "cluster-c",
        public_key: &c_pub,
        // Server role, never contacted: what it reads from fab-c is counted as no_endpoint.
        endpoint: None,
        allowed: &["10.30.0.0/24"],
        device: "fab-c",
        address: "169.254.101.1/30",
        routes: &["10.30.0.0/24"],
        probe: None,
        keepalive: None,
    };
    let reload = |cfg: Config| {
        std::fs::write(&g.a_cfg, toml(&with_busy_poll(cfg, BUSY))).unwrap();
        run(&[
            BIN,
            "reload",
            "--name",
            &g.a_name,
            "--control-dir",
            lab.dir.to_str().unwrap(),
        ]);
    };
    let pinger = {
        let mut c = std::process::Command::new("ip");
        c.args([
            "netns",
            "exec",
            &t.pa,
            "ping",
            "-c",
            "30",
            "-i",
            "0.05",
            "-W",
            "1",
            "10.20.0.2",
        ])
        .stdout(std::process::Stdio::piped());
        c.spawn().unwrap()
    };
    reload(config(&g.a_name, &a_key, &[a_peer(&g.b_pub), extra]));
    assert!(
        lab.try_exec(&t.ga, &["ip", "link", "show", "fab-c"])
            .status
            .success()
    );
    // Traffic to the new peer's routes reaches the poll loop.
    lab.try_exec(&t.pa, &["ping", "-c", "1", "-W", "1", "10.30.0.9"]);
    let st = lab.wait_status(&g.a_name, Duration::from_secs(5), |v| {
        v["peers"].as_array().unwrap().iter().any(|p| {
            p["name"] == "cluster-c" && p["drops"]["no_endpoint"].as_u64().unwrap_or(0) > 0
        })
    });
    assert!(
        st.is_some(),
        "packets for the added peer were not read\n{}",
        lab.log("gwa")
    );
    reload(config(&g.a_name, &a_key, &[a_peer(&g.b_pub)]));
    let out = pinger.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(" 0% packet loss"),
        "B disturbed by reloads: {text}"
    );
    lab.tcp_transfer(&t.pb, "10.20.0.2:5003", &t.pa, 1 << 20);

    // The tunnel device deleted under the poll loop: the gateway recreates the peer and the
    // loop polls the new device.
    lab.exec(&t.ga, &["ip", "link", "del", "fab-b"]);
    assert!(
        lab.wait_ping(&t.pa, "10.20.0.2", Duration::from_secs(15))
            .is_some(),
        "no traffic after the device was deleted\n{}",
        lab.log("gwa")
    );

    // Idle: the spin window has passed, so the thread sleeps (the 1 s probes aside).
    std::thread::sleep(Duration::from_millis(500));
    let ticks = || -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{a_pid}/stat")).unwrap();
        let f: Vec<&str> = s[s.rfind(')').unwrap() + 2..].split_whitespace().collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    };
    let before = ticks();
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    let used = ticks() - before;
    assert!(
        used * 10 < 2 * hz,
        "idle gateway used {used} ticks in 2 s (hz {hz}): still spinning"
    );
}

/// One source flooding valid-looking handshake initiations at the gateway (one initiation
/// replayed: without a cookie, then with the cookie the gateway hands out under load) does
/// not keep another peer's handshake out: B, restarted (new sessions) during the flood, is
/// reached again, and the flood's handshakes are dropped as `handshake_flood`. Without the
/// per-source limits every replay cost A's single receive thread two Diffie-Hellman
/// computations and B's handshake drowned in them.
#[test]
fn a_handshake_flood_from_one_source_stays_local() {
    if !require_root("a_handshake_flood_from_one_source_stays_local") {
        return;
    }
    use std::sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    };
    let mut lab = Lab::new("h");
    let t = topology(&mut lab);
    let g = setup(&mut lab, &t, &[]);
    both_up(&lab, &g, Duration::from_secs(15));
    // The flooding host shares B's side of the underlay, under an address of its own.
    lab.exec(&t.gb, &["ip", "addr", "add", "10.250.0.3/24", "dev", "ulb"]);
    let a_pub: fabric_gateway::key::PublicKey = g.a_pub.parse().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let flood = {
        let (stop, ns) = (stop.clone(), t.gb.clone());
        std::thread::spawn(move || {
            fabric_netns::run_in(&ns, move || {
                let mut tunn = boringtun::noise::Tunn::new(
                    boringtun::x25519::StaticSecret::from([9u8; 32]),
                    a_pub.to_dalek(),
                    None,
                    None,
                    7 << 8,
                    None,
                );
                let mut buf = vec![0u8; 2048];
                let mut init = |tunn: &mut boringtun::noise::Tunn| match tunn
                    .format_handshake_initiation(&mut buf, true)
                {
                    boringtun::noise::TunnResult::WriteToNetwork(p) => p.to_vec(),
                    other => panic!("no initiation: {other:?}"),
                };
                let s = UdpSocket::bind("10.250.0.3:0").unwrap();
                s.set_nonblocking(true).unwrap();
                let mut msg = init(&mut tunn);
                let (mut sent, mut with_cookie) = (0u64, false);
                let mut rx = [0u8; 2048];
                let mut out = [0u8; 2048];
                while !stop.load(Ordering::Relaxed) {
                    let _ = s.send_to(&msg, (A_UL, PORT));
                    sent += 1;
                    // About 2,000 a second: far more handshakes than A can afford, far
                    // fewer datagrams than it can turn away.
                    if sent % 20 == 0 {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    if !with_cookie && let Ok((n, _)) = s.recv_from(&mut rx) {
                        // A cookie reply: the next initiations carry it.
                        if n == 64 && rx[0] == 3 {
                            let _ = tunn.decapsulate(None, &rx[..n], &mut out);
                            msg = init(&mut tunn);
                            with_cookie = true;
                        }
                    }
                }
                (sent, with_cookie)
            })
            .unwrap()
        })
    };
    std::thread::sleep(Duration::from_secs(2));
    // B restarts mid-flood: A has to handshake with it again, through the flood.
    lab.stop("gwb", libc::SIGKILL);
    let t0 = Instant::now();
    let b_cfg = g.b_cfg.clone();
    start_gateway(&mut lab, "gwb", &t.gb, &g.b_name, &b_cfg, &[]);
    let took = lab.wait_ping(&t.pa, "10.20.0.2", Duration::from_secs(40));
    let st = lab
        .wait_status(&g.a_name, Duration::from_secs(2), |_| true)
        .unwrap();
    stop.store(true, Ordering::Relaxed);
    let (sent, with_cookie) = flood.join().unwrap();
    eprintln!(
        "flood: {sent} initiations (cookie: {with_cookie}); B reached again after {took:?} \
         ({:?} since its restart); drops {}",
        t0.elapsed(),
        st["drops"]
    );
    assert!(
        took.is_some(),
        "B never reached again during the flood\nA:\n{}",
        lab.log("gwa")
    );
    assert!(
        with_cookie,
        "the gateway never asked the flood for a cookie"
    );
    assert!(
        st["drops"]["handshake_flood"].as_u64().unwrap() > 0,
        "no handshake dropped for its source: {st}"
    );
    assert!(lab.is_running("gwa"), "{}", lab.log("gwa"));
}
