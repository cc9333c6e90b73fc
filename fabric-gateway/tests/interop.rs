//! Interoperability with another WireGuard implementation: our gateway on
//! side A, `boringtun-cli` configured through `wg set` on side B.

mod common;

use std::{
    path::Path,
    time::{Duration, Instant},
};

use common::*;

const A_UL: &str = "10.250.0.1";
const B_UL: &str = "10.250.0.2";

fn boringtun_cli() -> Option<String> {
    let out = sh(&[
        "sh",
        "-c",
        "command -v boringtun-cli || ls $HOME/.cargo/bin/boringtun-cli",
    ]);
    let p = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()?
        .trim()
        .to_string();
    (out.status.success() && !p.is_empty()).then_some(p)
}

fn interop(test: &str, tag: &str, ours_dials: bool) {
    if !require_root(test) {
        return;
    }
    let Some(bt) = boringtun_cli() else {
        eprintln!(
            "SKIPPED {test}: boringtun-cli not found (install with `WG_SUDO=true cargo install boringtun-cli --locked`)"
        );
        return;
    };
    let mut lab = Lab::new(tag);
    let ga = lab.add_ns("ga");
    let gb = lab.add_ns("gb");
    let pa = lab.add_ns("pa");
    let pb = lab.add_ns("pb");
    lab.link(
        &ga,
        "ula",
        &format!("{A_UL}/24"),
        &gb,
        "ulb",
        &format!("{B_UL}/24"),
    );
    lab.link(&ga, "poda", "10.10.0.1/24", &pa, "eth0", "10.10.0.2/24");
    lab.link(&gb, "podb", "10.20.0.1/24", &pb, "eth0", "10.20.0.2/24");
    lab.exec(&pa, &["ip", "route", "add", "default", "via", "10.10.0.1"]);
    lab.exec(&pb, &["ip", "route", "add", "default", "via", "10.20.0.1"]);

    let (a_key, a_pub) = lab.write_key("a");
    let (b_key, b_pub) = lab.write_key("b");

    // Side B: boringtun-cli, configured only through the UAPI with `wg`.
    let bt_if = format!("{}bt", lab.tag);
    let sock = format!("/var/run/wireguard/{bt_if}.sock");
    lab.remember_file(sock.clone().into());
    let bt_log = lab.dir.join("boringtun.out");
    lab.spawn(
        "boringtun",
        &gb,
        &[
            &bt,
            "--foreground",
            "--disable-drop-privileges",
            "-v",
            "info",
            "-l",
            bt_log.to_str().unwrap(),
            &bt_if,
        ],
        &[("WG_SUDO", "true")],
    );
    let t0 = Instant::now();
    while !Path::new(&sock).exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "boringtun-cli did not start:\n{}",
            lab.log("boringtun")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut set = vec![
        "wg",
        "set",
        &bt_if,
        "private-key",
        b_key.to_str().unwrap(),
        "listen-port",
        "51820",
        "peer",
        &a_pub,
        "allowed-ips",
        "10.10.0.0/24,169.254.100.0/30",
    ];
    let a_ep = format!("{A_UL}:51820");
    if !ours_dials {
        set.extend(["endpoint", &a_ep, "persistent-keepalive", "1"]);
    }
    lab.exec(&gb, &set);
    lab.exec(
        &gb,
        &["ip", "addr", "add", "169.254.100.2/30", "dev", &bt_if],
    );
    lab.exec(&gb, &["ip", "link", "set", &bt_if, "mtu", "1420", "up"]);
    lab.exec(&gb, &["ip", "route", "add", "10.10.0.0/24", "dev", &bt_if]);

    // Side A: our gateway.
    let a_name = format!("{}a", lab.tag);
    lab.remember_file(format!("/var/run/wireguard/{a_name}.sock").into());
    let mut peer = PeerConfig::builder("bt", b_pub.parse().unwrap())
        .allowed_ips(net(&["10.20.0.0/24", "169.254.100.0/30"]))
        .device("fab-bt")
        .address(net(&["169.254.100.1/30"])[0])
        .routes(net(&["10.20.0.0/24"]))
        .probe_address("169.254.100.2".parse::<std::net::IpAddr>().unwrap());
    if ours_dials {
        peer = peer.endpoint(format!("{B_UL}:51820").parse().unwrap());
    }
    let cfg = Config::builder(&a_key)
        .name(&a_name)
        .listen_port(51820)
        .peer(peer.build())
        .build()
        .unwrap();
    let cfg = lab.write_config("a.toml", &cfg);
    let dir = lab.dir.to_str().unwrap().to_string();
    lab.spawn(
        "gwa",
        &ga,
        &[
            BIN,
            "run",
            "--config",
            cfg.to_str().unwrap(),
            "--control-dir",
            &dir,
        ],
        &[("RUST_LOG", "info")],
    );
    let st = lab.wait_status(&a_name, Duration::from_secs(20), |v| {
        v["peers"][0]["up"] == true
    });
    assert!(
        st.is_some(),
        "our gateway never saw boringtun's side answer probes\nours:\n{}\nboringtun:\n{}",
        lab.log("gwa"),
        std::fs::read_to_string(&bt_log).unwrap_or_default()
    );

    assert!(lab.ping(&pa, "10.20.0.2", 3), "ping ours->boringtun failed");
    assert!(lab.ping(&pb, "10.10.0.2", 3), "ping boringtun->ours failed");
    lab.tcp_transfer(&pb, "10.20.0.2:5001", &pa, 1 << 20);
    lab.tcp_transfer(&pa, "10.10.0.2:5002", &pb, 1 << 20);

    let dump = lab.exec(&gb, &["wg", "show", &bt_if, "dump"]);
    let line = dump
        .lines()
        .find(|l| l.starts_with(&a_pub))
        .expect("our peer in boringtun's dump");
    let f: Vec<&str> = line.split('\t').collect();
    assert_eq!(f[2], a_ep, "{line}");
    assert!(f[4].parse::<u64>().unwrap() > 0, "no handshake: {line}");
    assert!(
        f[5].parse::<u64>().unwrap() > 1 << 20 && f[6].parse::<u64>().unwrap() > 1 << 20,
        "{line}"
    );
    let ours = run(&["wg", "show", &a_name, "dump"]);
    assert!(
        ours.contains(&format!("{B_UL}:51820")),
        "our side learnt/knows B's endpoint: {ours}"
    );
}

#[test]
fn interop_boringtun_cli_ours_dials() {
    interop("interop_boringtun_cli_ours_dials", "i", true);
}

#[test]
fn interop_boringtun_cli_dials_us() {
    interop("interop_boringtun_cli_dials_us", "j", false);
}
