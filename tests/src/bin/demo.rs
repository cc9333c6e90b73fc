//! The fabric demo (`cargo xtask demo`): two Kubernetes clusters, each with its own API server
//! and its own network, both using pod CIDR 10.244.0.0/16 (the same pod addresses even), are
//! peered with one `fabricctl peer` and their pods talk across a WireGuard tunnel through the
//! eBPF double NAT. Everything is removed at the end, also on Ctrl-C or failure.
use std::{
    process::ExitCode,
    sync::OnceLock,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use fabric_tests::{
    apiserver::require_tools,
    check_interrupt,
    clusters::{Cluster, POD_CIDR, PeeredClusters},
    install_interrupt_handler, is_root, traffic,
};

/// When the demo started: each section's title says how far in it is, so a run's log (CI's
/// too) shows where the time goes.
static START: OnceLock<Instant> = OnceLock::new();

fn elapsed() -> String {
    format!(
        "{:.1} s",
        START.get_or_init(Instant::now).elapsed().as_secs_f64()
    )
}

fn title(s: &str) {
    println!("\n=== {s}   [{}]", elapsed());
}

fn indent(s: &str) {
    for l in s.lines() {
        println!("    {l}");
    }
}

fn demo() -> Result<()> {
    title("Two clusters, one pod CIDR");
    println!(
        "Cluster A and cluster B both use {POD_CIDR}; each has a pod {} on node 0",
        Cluster::pod_ip(0)
    );
    println!(
        "and a pod {} on node 1. Each cluster has its own API server (kubelite), a gateway,",
        Cluster::pod_ip(1)
    );
    println!("two nodes, and runs the fabric's real binaries: IPAM controller, gateway operator,");
    println!(
        "WireGuard gateway (boringtun) with the eBPF remap programs, and a node agent per node."
    );
    println!("The gateways sit on a subnet of their own behind a router that knows no pod");
    println!("addresses: nodes reach them through the fabric's VXLAN overlay (fabric.vx).");
    let mut cl = PeeredClusters::with_overlay(2)?;
    check_interrupt()?;

    title("fabricctl peer --remote-kubeconfig <cluster B>   (run against cluster A)");
    let out = cl.peer()?;
    indent(&String::from_utf8_lossy(&out.stdout));
    if !out.status.success() {
        bail!(
            "fabricctl peer failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            cl.log_tails()
        );
    }
    check_interrupt()?;

    title("What each cluster decided (kubectl get configurations,connections -n fabric-system)");
    for c in [&cl.a, &cl.b] {
        println!("  {}:", c.id);
        indent(
            &c.api
                .kubectl_ok(&["get", "configurations,connections", "-n", "fabric-system"]),
        );
    }
    let seen = |k: usize| Cluster::pod_ip(k).replacen("10.244.", "10.64.", 1);
    cl.wait_reachable(&cl.a.pods[0], &seen(0), Duration::from_secs(20))?;
    check_interrupt()?;

    title("How node 0 of cluster A reaches its gateway (ip route show proto 250; bridge fdb)");
    let node = cl.a.nodes[0].clone();
    indent(&cl.tb.ip(&node, &["route", "show", "proto", "250"])?);
    indent(&String::from_utf8_lossy(
        &cl.tb
            .exec_any(&node, &["bridge", "fdb", "show", "dev", "fabric.vx"])?
            .stdout,
    ));
    title("... and how gateway A reaches the pods of each node");
    indent(&cl.tb.ip(&cl.a.gw, &["route", "show", "proto", "250"])?);

    title("Pods talking across (TCP; the server reports the client address it sees)");
    for (from, to, fname, tname) in [(&cl.a, &cl.b, "A", "B"), (&cl.b, &cl.a, "B", "A")] {
        for k in 0..2 {
            let client = &from.pods[k];
            let server = &to.pods[1 - k];
            let dst = seen(1 - k);
            let saw = traffic::tcp_probe(client, server, &dst, 8080)?
                .server_saw
                .ip();
            println!(
                "  {fname} pod {} connects to {dst}  =>  {tname} pod {} sees the client as {saw}",
                Cluster::pod_ip(k),
                Cluster::pod_ip(1 - k)
            );
        }
    }
    println!("  (10.244.x.y in one cluster is 10.64.x.y in the other: the gateways rewrite the");
    println!("   prefix and keep the host bits, with no connection tracking.)");
    check_interrupt()?;

    title("fabricctl status");
    indent(&String::from_utf8_lossy(&cl.fabricctl(&["status"])?.stdout));

    title("The tunnel, as the standard `wg` tool sees gateway A (wg show)");
    // `wg` only looks in /var/run/wireguard; the demo's gateways keep their sockets in the
    // demo's directory, so link one in for the moment.
    let link = std::path::Path::new("/var/run/wireguard")
        .join(format!("fabdemo{}.sock", std::process::id() % 10000));
    let name = link.file_stem().unwrap().to_string_lossy().into_owned();
    let _ = std::fs::create_dir_all("/var/run/wireguard");
    let _ = std::fs::remove_file(&link);
    if std::os::unix::fs::symlink(cl.a.dir.join("gw1.sock"), &link).is_ok() {
        match std::process::Command::new("wg")
            .args(["show", &name])
            .output()
        {
            Ok(o) if o.status.success() => indent(&String::from_utf8_lossy(&o.stdout)),
            _ => println!("  (wg not available)"),
        }
        let _ = std::fs::remove_file(&link);
    }
    check_interrupt()?;

    title("fabricctl unpeer");
    let out = cl.fabricctl(&[
        "unpeer",
        "--remote-kubeconfig",
        &cl.b.api.kubeconfig.display().to_string(),
    ])?;
    indent(&String::from_utf8_lossy(&out.stdout));
    if !out.status.success() {
        bail!(
            "fabricctl unpeer failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    println!("\nCleaning up (namespaces, processes, API servers)...");
    Ok(())
}

fn main() -> ExitCode {
    if !is_root() {
        eprintln!("the demo creates network namespaces and loads eBPF programs: run it as root");
        return ExitCode::FAILURE;
    }
    if !require_tools("demo") {
        return ExitCode::FAILURE;
    }
    install_interrupt_handler();
    START.get_or_init(Instant::now);
    match demo() {
        Ok(()) => {
            println!("done in {} (cleanup included).", elapsed());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("demo failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}
