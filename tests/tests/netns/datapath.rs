//! End-to-end tests of the data plane in network namespaces: two clusters with the same pod
//! CIDR (and the same pod IP) reach each other through the stateless double NAT.
//!
//! Needs root; skips (with a message) otherwise. Drives `target/<profile>/fabric-agent`, which
//! must be built first (`cargo build --workspace --bins`; `cargo xtask test` does it). Each test
//! builds its own topology with unique names, so they run in parallel.
use std::{
    collections::BTreeMap,
    os::unix::fs::MetadataExt as _,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use anyhow::{Context as _, Result};
use fabric_tests::{
    Addressing, TwoClusters, addr, peer_counter, skip_unless_root,
    topo::{A_PL_IF, B_PL_IF, B_UL_IF, POD_IF},
    traffic,
};

fn overlapping() -> Result<TwoClusters> {
    TwoClusters::new(Addressing::Overlapping)
}

#[test]
fn without_the_data_plane_the_remapped_cidr_is_unreachable() -> Result<()> {
    if skip_unless_root("without_the_data_plane_the_remapped_cidr_is_unreachable") {
        return Ok(());
    }
    let t = overlapping()?;
    let p = traffic::ping(&t.bed, &t.a_pod, addr::B_POD_FROM_A, 2, "0.2", &[])?;
    assert_eq!(
        p.received,
        0,
        "reached {} without the data plane:\n{}",
        addr::B_POD_FROM_A,
        p.output
    );
    assert!(traffic::tcp_probe(&t.a_pod, &t.b_pod, addr::B_POD_FROM_A, 7000).is_err());
    // And the same after a reset: the programs do the work, not some leftover route.
    t.apply()?;
    assert!(traffic::ping(&t.bed, &t.a_pod, addr::B_POD_FROM_A, 2, "0.2", &[])?.received > 0);
    t.agent.reset(&t.a_gw, &t.a_pin)?;
    assert!(!t.a_pin.exists(), "reset left {} behind", t.a_pin.display());
    let p = traffic::ping(&t.bed, &t.a_pod, addr::B_POD_FROM_A, 2, "0.2", &[])?;
    assert_eq!(
        p.received,
        0,
        "reached {} after reset:\n{}",
        addr::B_POD_FROM_A,
        p.output
    );
    Ok(())
}

#[test]
fn ping_tcp_udp_both_ways_with_remapped_addresses() -> Result<()> {
    if skip_unless_root("ping_tcp_udp_both_ways_with_remapped_addresses") {
        return Ok(());
    }
    let t = overlapping()?;
    t.apply()?;

    let p = traffic::ping(&t.bed, &t.a_pod, addr::B_POD_FROM_A, 3, "0.1", &[])?;
    assert!(
        p.all_replied(),
        "a-pod -> {}:\n{}",
        addr::B_POD_FROM_A,
        p.output
    );
    let p = traffic::ping(&t.bed, &t.b_pod, addr::A_POD_FROM_B, 3, "0.1", &[])?;
    assert!(
        p.all_replied(),
        "b-pod -> {}:\n{}",
        addr::A_POD_FROM_B,
        p.output
    );

    // A -> B: B's server sees A's pod as B's view of it; the client sees its real address.
    let pr = traffic::tcp_probe(&t.a_pod, &t.b_pod, addr::B_POD_FROM_A, 7001)?;
    assert_eq!(pr.server_saw.ip().to_string(), addr::A_POD_FROM_B, "{pr:?}");
    assert_eq!(pr.client_local.ip().to_string(), addr::A_POD, "{pr:?}");
    assert_eq!(
        pr.server_local.map(|a| a.ip().to_string()).as_deref(),
        Some(addr::B_POD),
        "{pr:?}"
    );
    // Ports are untouched.
    assert_eq!(pr.server_saw.port(), pr.client_local.port(), "{pr:?}");
    let pr = traffic::tcp_probe(&t.b_pod, &t.a_pod, addr::A_POD_FROM_B, 7002)?;
    assert_eq!(pr.server_saw.ip().to_string(), addr::B_POD_FROM_A, "{pr:?}");
    assert_eq!(pr.client_local.ip().to_string(), addr::B_POD, "{pr:?}");

    let pr = traffic::udp_probe(&t.a_pod, &t.b_pod, addr::B_POD_FROM_A, 7003)?;
    assert_eq!(pr.server_saw.ip().to_string(), addr::A_POD_FROM_B, "{pr:?}");
    assert_eq!(pr.server_saw.port(), pr.client_local.port(), "{pr:?}");
    let pr = traffic::udp_probe(&t.b_pod, &t.a_pod, addr::A_POD_FROM_B, 7004)?;
    assert_eq!(pr.server_saw.ip().to_string(), addr::B_POD_FROM_A, "{pr:?}");

    // A bulk transfer (GSO-sized packets through the rewrite, checksums intact).
    let payload = traffic::tcp_bulk(&t.a_pod, &t.b_pod, addr::B_POD_FROM_A, 7005, 8 << 20)?;
    assert_eq!(payload, 8 << 20);

    // Counters move on both gateways, in both directions.
    for (gw, pin, peer) in [
        (&t.a_gw, &t.a_pin, "cluster-b"),
        (&t.b_gw, &t.b_pin, "cluster-a"),
    ] {
        let v = t.agent.show_json(gw, pin)?;
        for dir in ["egress", "ingress"] {
            for c in ["packets", "remapped"] {
                assert!(
                    peer_counter(&v, peer, dir, c) > 0,
                    "{gw}: {peer} {dir}.{c} is 0 in\n{}",
                    serde_json::to_string_pretty(&v).unwrap_or_default()
                );
            }
        }
        // The table form works too.
        let table = t.agent.show(gw, pin)?;
        assert!(table.contains(peer), "{table}");
    }
    Ok(())
}

/// A hostile peer sends into the tunnel to everything on A's side that is not a pod: A's
/// gateway itself (through B's view of its pod-side address), the gateway's node address, a
/// metadata service on it, and an address outside A's pod CIDR that A's gateway routes on.
/// All of them exist and listen; none of them hears anything, A counts each packet as refused
/// for that peer, and pod traffic flows as before.
#[test]
fn a_peer_reaches_nothing_but_pods() -> Result<()> {
    if skip_unless_root("a_peer_reaches_nothing_but_pods") {
        return Ok(());
    }
    let t = overlapping()?;
    t.apply()?;
    const METADATA: &str = "169.254.169.254";
    const OUTSIDE: &str = "10.96.0.1";
    // The metadata service answers on the gateway host; the outside address is a host behind
    // a-gw (on a-pod's link), routed like any destination a-gw can reach.
    t.bed.ip(
        &t.a_gw,
        &["addr", "add", &format!("{METADATA}/32"), "dev", "lo"],
    )?;
    t.bed.ip(
        &t.a_pod,
        &["addr", "add", &format!("{OUTSIDE}/32"), "dev", POD_IF],
    )?;
    t.bed.ip(
        &t.a_gw,
        &["route", "add", OUTSIDE, "via", addr::A_POD, "dev", A_PL_IF],
    )?;
    // B's gateway, playing the hostile peer, sends all of them into its tunnel to A.
    for dst in [METADATA, OUTSIDE] {
        t.bed.ip(
            &t.b_gw,
            &["route", "add", dst, "via", addr::A_UL, "dev", B_UL_IF],
        )?;
    }
    let targets = [
        // (namespace, address it listens on, where B sends, port)
        (&t.a_gw, addr::A_GW, addr::A_GW_FROM_B, 9101),
        (&t.a_gw, addr::A_UL, addr::A_UL, 9102),
        (&t.a_gw, METADATA, METADATA, 9103),
        (&t.a_pod, OUTSIDE, OUTSIDE, 9104),
    ];
    let refused = |t: &TwoClusters| -> Result<u64> {
        let v = t.agent.show_json(&t.a_gw, &t.a_pin)?;
        Ok(peer_counter(&v, "cluster-b", "ingress", "refused"))
    };
    let before = refused(&t)?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut sinks = Vec::new();
    for (ns, bind, _, port) in targets {
        sinks.push(traffic::udp_sink(ns, bind, port, stop.clone())?);
    }
    const N: usize = 5;
    for (_, _, dst, port) in targets {
        traffic::udp_send(&t.b_gw, dst, port, N, Duration::from_millis(10))?;
    }
    // Pod traffic still flows both ways meanwhile.
    let pr = traffic::udp_probe(&t.b_pod, &t.a_pod, addr::A_POD_FROM_B, 9105)?;
    assert_eq!(pr.server_saw.ip().to_string(), addr::B_POD_FROM_A, "{pr:?}");
    let p = traffic::ping(&t.bed, &t.a_pod, addr::B_POD_FROM_A, 3, "0.1", &[])?;
    assert!(p.all_replied(), "{}", p.output);
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    for ((_, bind, dst, port), sink) in targets.iter().zip(sinks) {
        let got = fabric_tests::netns::join(sink)?;
        assert!(
            got.is_empty(),
            "{bind}:{port} (sent to {dst}) heard the peer: {got:?}"
        );
    }
    let after = refused(&t)?;
    assert!(
        after >= before + (N * targets.len()) as u64,
        "refused went from {before} to {after}, {} packets were sent",
        N * targets.len()
    );
    let v = t.agent.show_json(&t.a_gw, &t.a_pin)?;
    assert!(
        v["drops"]["dst-refused"].as_u64().unwrap_or(0) >= (N * targets.len()) as u64,
        "{v:#}"
    );
    assert!(t.agent.show(&t.a_gw, &t.a_pin)?.contains("REFUSED"));
    Ok(())
}

#[test]
fn path_mtu_is_learned_through_the_rewritten_icmp_error() -> Result<()> {
    if skip_unless_root("path_mtu_is_learned_through_the_rewritten_icmp_error") {
        return Ok(());
    }
    let t = overlapping()?;
    t.apply()?;
    t.bed
        .ip(&t.b_gw, &["link", "set", B_PL_IF, "mtu", "1400"])?;
    t.bed
        .ip(&t.b_pod, &["link", "set", POD_IF, "mtu", "1400"])?;
    let p = traffic::ping(
        &t.bed,
        &t.a_pod,
        addr::B_POD_FROM_A,
        3,
        "0.2",
        &["-M", "do", "-s", "1472"],
    )?;
    let from = format!("From {}", addr::B_GW_FROM_A);
    assert!(
        p.output
            .lines()
            .any(|l| l.contains(&from) && l.contains("Frag needed")),
        "expected a Frag needed from {} (b-gw's {} remapped):\n{}",
        addr::B_GW_FROM_A,
        addr::B_GW,
        p.output
    );
    let route = t.bed.ip(&t.a_pod, &["route", "get", addr::B_POD_FROM_A])?;
    assert!(
        route.contains("mtu 1400"),
        "a-pod did not learn the path MTU: {route}"
    );
    // And traffic that fits still flows; a TCP bulk transfer adapts to the smaller MTU.
    let p = traffic::ping(
        &t.bed,
        &t.a_pod,
        addr::B_POD_FROM_A,
        2,
        "0.1",
        &["-s", "1372", "-M", "do"],
    )?;
    assert!(p.all_replied(), "{}", p.output);
    assert_eq!(
        traffic::tcp_bulk(&t.a_pod, &t.b_pod, addr::B_POD_FROM_A, 7010, 1 << 20)?,
        1 << 20
    );
    // The ICMP error was counted on a-gw's ingress.
    let v = t.agent.show_json(&t.a_gw, &t.a_pin)?;
    assert!(
        peer_counter(&v, "cluster-b", "ingress", "icmp_errors") > 0,
        "a-gw ingress icmp_errors is 0:\n{}",
        serde_json::to_string_pretty(&v).unwrap_or_default()
    );
    Ok(())
}

/// Every file under a pin directory with its inode: a re-pinned map gets a new one.
fn pins(dir: &Path) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(m) = e.metadata() {
                out.insert(
                    p.strip_prefix(dir).unwrap_or(&p).display().to_string(),
                    m.ino(),
                );
            }
        }
    }
    out
}

#[test]
fn reapply_is_hitless_and_reuses_pins() -> Result<()> {
    if skip_unless_root("reapply_is_hitless_and_reuses_pins") {
        return Ok(());
    }
    let mut t = overlapping()?;
    t.apply()?;
    let (a_before, b_before) = (pins(&t.a_pin), pins(&t.b_pin));
    assert!(
        !a_before.is_empty(),
        "nothing pinned in {}",
        t.a_pin.display()
    );
    let a_pod = t.a_pod.clone();
    let ping = t.bed.spawn(
        &a_pod,
        &[
            "ping",
            "-n",
            "-q",
            "-i",
            "0.01",
            "-c",
            "300",
            "-W",
            "1",
            addr::B_POD_FROM_A,
        ],
    )?;
    std::thread::sleep(Duration::from_millis(700));
    t.apply()?;
    t.apply()?;
    let out = ping.wait(Duration::from_secs(20))?;
    let p = traffic::Ping::parse(&String::from_utf8_lossy(&out.stdout));
    assert!(p.transmitted >= 290, "{}", p.output);
    assert!(
        p.all_replied(),
        "packets lost across the re-apply:\n{}",
        p.output
    );
    assert_eq!(
        pins(&t.a_pin),
        a_before,
        "a-gw pins were replaced, not reused"
    );
    assert_eq!(
        pins(&t.b_pin),
        b_before,
        "b-gw pins were replaced, not reused"
    );
    Ok(())
}

#[test]
fn failed_first_apply_leaves_nothing_behind() -> Result<()> {
    if skip_unless_root("failed_first_apply_leaves_nothing_behind") {
        return Ok(());
    }
    let t = overlapping()?;
    let cfg = std::fs::read_to_string(&t.a_cfg)?;
    let dev = t.a_cfg.with_file_name("missing-device.toml");
    let tunnel = cfg
        .lines()
        .find_map(|l| l.strip_prefix("interface = "))
        .context("no interface in the generated configuration")?
        .trim_matches('"')
        .to_owned();
    std::fs::write(&dev, cfg.replace(&tunnel, "fabnosuchdev"))?;
    let err = t
        .agent
        .apply(&t.a_gw, &t.a_pin, &dev)
        .expect_err("applying to a missing device must fail");
    assert!(
        format!("{err:#}").contains("fabnosuchdev"),
        "the error names the device: {err:#}"
    );
    assert!(
        !t.a_pin.exists(),
        "a failed first apply left {} behind: {:?}",
        t.a_pin.display(),
        pins(&t.a_pin)
    );
    // With a data plane in place, a failed apply keeps it.
    t.apply()?;
    let before = pins(&t.a_pin);
    t.agent
        .apply(&t.a_gw, &t.a_pin, &dev)
        .expect_err("applying to a missing device must fail");
    assert_eq!(pins(&t.a_pin), before, "a failed re-apply touched the pins");
    Ok(())
}
