//! The data-plane demo (`target/debug/demo-datapath`): two "clusters" with the same pod CIDR, even the
//! same pod IP, talking through the fabric's stateless double NAT. Builds the topology in
//! network namespaces, applies the data plane on both gateways, shows ping/TCP/UDP with the
//! addresses each side sees, prints the gateways' maps and counters, and removes everything
//! again (also on Ctrl-C or failure).
use std::process::ExitCode;

use anyhow::{Context as _, Result, bail};
use fabric_tests::{
    addr, check_interrupt, install_interrupt_handler, is_root,
    topo::{A_UL_IF, Addressing, B_UL_IF, TwoClusters},
    traffic,
};

fn title(s: &str) {
    println!("\n=== {s}");
}

fn demo() -> Result<()> {
    title("Two clusters, one pod CIDR");
    println!(
        "cluster A and cluster B both use {} and each has a pod at {}.",
        addr::POD_CIDR,
        addr::A_POD
    );
    println!(
        "A sees B's pods as {}, B sees A's pods as {} (host bits kept).",
        addr::B_CIDR_IN_A,
        addr::A_CIDR_IN_B
    );
    println!(
        "Building namespaces a-pod, a-gw, b-gw, b-pod (the a-ul/b-ul veth stands in for the tunnel)..."
    );
    let t = TwoClusters::new(Addressing::Overlapping)?;
    println!(
        "  namespaces: {}, {}, {}, {}",
        t.a_pod, t.a_gw, t.b_gw, t.b_pod
    );
    check_interrupt()?;

    title("Without the data plane");
    let p = traffic::ping(&t.bed, &t.a_pod, addr::B_POD_FROM_A, 2, "0.2", &[])?;
    println!(
        "a-pod$ ping {}  ->  {}/{} replies (b-gw has no route for {}: A's view means nothing in B)",
        addr::B_POD_FROM_A,
        p.received,
        p.transmitted,
        addr::B_CIDR_IN_A
    );
    check_interrupt()?;

    title("Applying the data plane (fabric-agent datapath apply) on both gateways");
    for (gw, pin, cfg, dev) in [
        (&t.a_gw, &t.a_pin, &t.a_cfg, A_UL_IF),
        (&t.b_gw, &t.b_pin, &t.b_cfg, B_UL_IF),
    ] {
        let out = t.agent.apply(gw, pin, cfg)?;
        println!(
            "{gw}: programs on {dev} (egress + ingress), pins in {}",
            pin.display()
        );
        for l in out.lines().filter(|l| !l.trim().is_empty()) {
            println!("    {l}");
        }
    }
    check_interrupt()?;

    title("ping");
    for (from, to, label) in [
        (&t.a_pod, addr::B_POD_FROM_A, "a-pod -> B's pod"),
        (&t.b_pod, addr::A_POD_FROM_B, "b-pod -> A's pod"),
    ] {
        let p = traffic::ping(&t.bed, from, to, 3, "0.2", &[])?;
        println!(
            "{label}: ping {to}: {}/{} replies, avg rtt {}",
            p.received,
            p.transmitted,
            p.rtt_avg_ms
                .map(|r| format!("{r:.3} ms"))
                .unwrap_or_else(|| "-".into())
        );
        if p.received == 0 {
            bail!("no replies:\n{}", p.output);
        }
    }
    check_interrupt()?;

    title("TCP and UDP: what each side sees");
    for (proto, client, server, dst, port, cl, sl, server_ip) in [
        (
            "TCP",
            &t.a_pod,
            &t.b_pod,
            addr::B_POD_FROM_A,
            8080u16,
            "a-pod",
            "b-pod",
            addr::B_POD,
        ),
        (
            "TCP",
            &t.b_pod,
            &t.a_pod,
            addr::A_POD_FROM_B,
            8080,
            "b-pod",
            "a-pod",
            addr::A_POD,
        ),
        (
            "UDP",
            &t.a_pod,
            &t.b_pod,
            addr::B_POD_FROM_A,
            5353,
            "a-pod",
            "b-pod",
            addr::B_POD,
        ),
        (
            "UDP",
            &t.b_pod,
            &t.a_pod,
            addr::A_POD_FROM_B,
            5353,
            "b-pod",
            "a-pod",
            addr::A_POD,
        ),
    ] {
        let pr = if proto == "TCP" {
            traffic::tcp_probe(client, server, dst, port)?
        } else {
            traffic::udp_probe(client, server, dst, port)?
        };
        println!(
            "{proto}: {cl} ({}) connects to {}  =>  {sl} ({}) sees the client as {}",
            pr.client_local.ip(),
            pr.client_dst,
            pr.server_local
                .map_or(server_ip.to_owned(), |a| a.ip().to_string()),
            pr.server_saw.ip()
        );
        check_interrupt()?;
    }
    println!(
        "Both pods are {}; each only ever sees addresses unique in its own cluster.",
        addr::A_POD
    );

    title("Path MTU across the rewrite (ICMP errors are remapped inside too)");
    t.bed.ip(
        &t.b_gw,
        &["link", "set", fabric_tests::topo::B_PL_IF, "mtu", "1400"],
    )?;
    t.bed.ip(
        &t.b_pod,
        &["link", "set", fabric_tests::topo::POD_IF, "mtu", "1400"],
    )?;
    let p = traffic::ping(
        &t.bed,
        &t.a_pod,
        addr::B_POD_FROM_A,
        2,
        "0.2",
        &["-M", "do", "-s", "1472"],
    )?;
    for l in p
        .output
        .lines()
        .filter(|l| l.contains("Frag") || l.contains("mtu"))
    {
        println!("a-pod$ ping -M do -s 1472: {l}");
    }
    let r = t.bed.ip(&t.a_pod, &["route", "get", addr::B_POD_FROM_A])?;
    println!(
        "a-pod$ ip route get {}: {}",
        addr::B_POD_FROM_A,
        r.split_whitespace().collect::<Vec<_>>().join(" ")
    );
    check_interrupt()?;

    title("fabric-agent datapath show (a-gw)");
    let (a, b) = t.show().context("datapath show")?;
    print!("{a}");
    title("fabric-agent datapath show (b-gw)");
    print!("{b}");
    println!(
        "\nInspect the maps with bpftool too: bpftool map dump pinned {}/FABRIC_REMAP_EG",
        t.a_pin.display()
    );

    title("Cleaning up");
    drop(t);
    println!("removed namespaces, links and pins.");
    Ok(())
}

fn main() -> ExitCode {
    if !is_root() {
        eprintln!("demo: needs root (network namespaces, eBPF); run `sudo cargo xtask demo`");
        return ExitCode::FAILURE;
    }
    install_interrupt_handler();
    match demo() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("\ndemo failed: {e:#}\n(everything it created has been removed)");
            ExitCode::FAILURE
        }
    }
}
