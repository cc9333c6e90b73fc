//! `cargo xtask bench datapath`: what the data plane costs, measured against plain forwarding
//! in the same run.
//!
//! (a) Per-packet cost of the programs with `BPF_PROG_TEST_RUN`, through the agent's
//!     `datapath bench` subcommand (see [`prog_cost`]), as a ratio to an empty program measured
//!     in the same run; reported as skipped (and (b) still runs) when that fails.
//! (b) Across the two-cluster topology (traffic crosses both gateway namespaces), for three
//!     modes, each on a fresh topology:
//!     - `plain`: distinct pod CIDRs, plain routed forwarding, no NAT (the baseline);
//!     - `ebpf`: overlapping CIDRs, our tc programs on the underlay devices;
//!     - `nft`: overlapping CIDRs, nftables prefix NAT with conntrack (what Liqo does).
//!
//! Metrics of (b): iperf3 TCP throughput with 1 and 4 streams, ping RTT, and the rate of new
//! TCP connections. Everything is bounded in count and time.
use std::{fmt::Write as _, time::Duration};

use anyhow::{Context as _, Result, bail};

use fabric_tests::{
    Agent, Testbed, check_interrupt,
    topo::{Addressing, TwoClusters},
    traffic,
};

#[derive(Debug, Clone)]
pub struct Options {
    /// Seconds per iperf3 run.
    pub iperf_secs: u32,
    /// Pings for the RTT (at 10 ms intervals).
    pub pings: u32,
    /// Seconds of the connection-rate loop.
    pub conn_secs: f64,
    /// Upper bound on connections per mode.
    pub max_conns: u64,
    /// Repetitions for `BPF_PROG_TEST_RUN`.
    pub prog_repeat: u32,
    /// Interleaved rounds over the modes (the median is reported): on a small VM one run of
    /// a metric can be off by 2x, drift hits all modes alike when they take turns.
    pub rounds: u32,
}

impl Options {
    pub fn standard() -> Self {
        Self {
            iperf_secs: 3,
            pings: 200,
            conn_secs: 2.0,
            max_conns: 20_000,
            prog_repeat: 1_000_000,
            rounds: 3,
        }
    }

    pub fn quick() -> Self {
        Self {
            iperf_secs: 1,
            pings: 50,
            conn_secs: 1.0,
            max_conns: 5_000,
            prog_repeat: 100_000,
            rounds: 1,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Plain,
    Ebpf,
    Nft,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::Plain, Mode::Ebpf, Mode::Nft];

    pub fn label(self) -> &'static str {
        match self {
            Mode::Plain => "plain forwarding",
            Mode::Ebpf => "eBPF remap",
            Mode::Nft => "nftables NAT",
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Measurement {
    pub tcp1_bps: f64,
    pub tcp4_bps: f64,
    pub rtt_ms: f64,
    pub conns_per_s: f64,
}

/// Builds the topology for `mode` and checks that a-pod reaches b-pod through it.
pub fn prepare(mode: Mode) -> Result<TwoClusters> {
    let addressing = match mode {
        Mode::Plain => Addressing::Distinct,
        Mode::Ebpf | Mode::Nft => Addressing::Overlapping,
    };
    let t = TwoClusters::new(addressing)?;
    match mode {
        Mode::Plain => {}
        Mode::Ebpf => t.apply()?,
        Mode::Nft => t.install_nft_nat()?,
    }
    let dst = t.b_pod_from_a();
    // Warm up (ARP, conntrack, caches) and check the path before measuring.
    let warm = traffic::ping(&t.bed, &t.a_pod, dst, 3, "0.1", &[])?;
    if warm.received == 0 {
        bail!(
            "{}: no connectivity from a-pod to {dst}:\n{}",
            mode.label(),
            warm.output
        );
    }
    let probe = traffic::tcp_probe(&t.a_pod, &t.b_pod, dst, 5300)?;
    println!(
        "  {:<17} a-pod {} -> {} ; b-pod saw the client as {}",
        mode.label(),
        probe.client_local.ip(),
        dst,
        probe.server_saw.ip()
    );
    Ok(t)
}

/// One sample of every metric on a prepared topology (`round` picks fresh ports).
pub fn measure(t: &mut TwoClusters, o: &Options, round: u32) -> Result<Measurement> {
    let dst = t.b_pod_from_a();
    let (a_pod, b_pod) = (t.a_pod.clone(), t.b_pod.clone());
    let bed: &mut Testbed = &mut t.bed;
    let tcp1_bps = traffic::iperf3(bed, &a_pod, &b_pod, dst, 1, o.iperf_secs)?;
    check_interrupt()?;
    let tcp4_bps = traffic::iperf3(bed, &a_pod, &b_pod, dst, 4, o.iperf_secs)?;
    check_interrupt()?;
    let p = traffic::ping(bed, &a_pod, dst, o.pings, "0.01", &["-q"])?;
    let rtt_ms = p
        .rtt_avg_ms
        .with_context(|| format!("no RTT from ping:\n{}", p.output))?;
    check_interrupt()?;
    let (n, el) = traffic::conn_rate(
        &a_pod,
        &b_pod,
        dst,
        5301 + round as u16,
        Duration::from_secs_f64(o.conn_secs),
        o.max_conns,
    )?;
    Ok(Measurement {
        tcp1_bps,
        tcp4_bps,
        rtt_ms,
        conns_per_s: n as f64 / el.as_secs_f64(),
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Per-metric medians over the rounds.
fn medians(samples: &[Measurement]) -> Measurement {
    let m = |f: fn(&Measurement) -> f64| median(samples.iter().map(f).collect());
    Measurement {
        tcp1_bps: m(|r| r.tcp1_bps),
        tcp4_bps: m(|r| r.tcp4_bps),
        rtt_ms: m(|r| r.rtt_ms),
        conns_per_s: m(|r| r.conns_per_s),
    }
}

/// Per-packet cost of the programs, from `fabric-agent datapath bench --repeat N --output json`
/// (BPF_PROG_TEST_RUN on private, unpinned maps; run in a scratch namespace anyway). The agent
/// prints `[{"case": .., "egress": bool, "ns_per_packet": f64}, ..]`, the baseline (an empty
/// program) first. Returns `Err(reason)` when the agent cannot do it, so (b) still runs.
pub fn prog_cost(o: &Options) -> Result<std::result::Result<Vec<(String, f64)>, String>> {
    let agent = Agent::locate()?;
    let mut bed = Testbed::new()?;
    {
        let agent = agent.clone();
        bed.on_pin_cleanup(move |ns, pin| agent.reset(ns, pin).map(drop));
    }
    let ns = bed.add_netns("prog")?;
    let repeat = o.prog_repeat.to_string();
    let out = match agent.run(
        &ns,
        &["datapath", "bench", "--repeat", &repeat, "--output", "json"],
    ) {
        Ok(o) => o,
        Err(e) => {
            return Ok(Err(format!(
                "`fabric-agent datapath bench` failed: {}",
                shorten(&e)
            )));
        }
    };
    let v: serde_json::Value =
        serde_json::from_str(&out).context("parsing `datapath bench` JSON")?;
    let rows = v
        .as_array()
        .or_else(|| v.get("results").and_then(|r| r.as_array()));
    let cases: Vec<(String, f64)> = rows
        .map(|a| {
            a.iter()
                .filter_map(|c| {
                    let name = c.get("case")?.as_str()?;
                    let dir = match c.get("egress").and_then(|e| e.as_bool()) {
                        Some(true) => " [egress]",
                        Some(false) => " [ingress]",
                        None => "",
                    };
                    Some((format!("{name}{dir}"), c.get("ns_per_packet")?.as_f64()?))
                })
                .collect()
        })
        .unwrap_or_default();
    if cases.is_empty() {
        return Ok(Err(format!("`datapath bench` printed no results: {out}")));
    }
    Ok(Ok(cases))
}

/// Verifier logs can be huge: keeps the head and the tail of an error.
fn shorten(e: &anyhow::Error) -> String {
    let msg = format!("{e:#}");
    let lines: Vec<&str> = msg.lines().collect();
    if lines.len() > 10 {
        format!(
            "{}\n    [... {} lines ...]\n{}",
            lines[..4].join("\n"),
            lines.len() - 8,
            lines[lines.len() - 4..].join("\n")
        )
    } else {
        msg
    }
}

fn ratio(v: f64, base: f64) -> String {
    if base > 0.0 {
        format!("{:.2}x", v / base)
    } else {
        "-".into()
    }
}

/// Renders the table of (b).
pub fn table(results: &[(Mode, Measurement)]) -> String {
    let base = results
        .iter()
        .find(|(m, _)| *m == Mode::Plain)
        .map(|(_, r)| r.clone())
        .unwrap_or_default();
    let mut s = String::new();
    let _ = write!(s, "{:<26}", "metric");
    for (m, _) in results {
        let _ = write!(s, "{:>24}", m.label());
    }
    s.push('\n');
    type Get = fn(&Measurement) -> f64;
    let rows: [(&str, Get, f64, &str); 4] = [
        ("TCP 1 stream", |r| r.tcp1_bps, 1e9, "Gbit/s"),
        ("TCP 4 streams", |r| r.tcp4_bps, 1e9, "Gbit/s"),
        ("ping RTT avg (lower=better)", |r| r.rtt_ms, 1e-3, "us"),
        ("new TCP connections", |r| r.conns_per_s, 1.0, "/s"),
    ];
    for (name, get, scale, unit) in rows {
        let _ = write!(s, "{name:<26}");
        for (m, r) in results {
            let v = get(r);
            let cell = if *m == Mode::Plain {
                format!("{:.1} {unit}", v / scale)
            } else {
                format!("{:.1} {unit} ({})", v / scale, ratio(v, get(&base)))
            };
            let _ = write!(s, "{cell:>24}");
        }
        s.push('\n');
    }
    s
}

/// The whole benchmark: (a) then (b), printed as it goes.
pub fn run(o: &Options) -> Result<()> {
    println!("datapath benchmark: one run, ratios against a baseline measured in the same run");
    println!(
        "(all traffic inside namespaces fabt-{}-*)\n",
        std::process::id()
    );
    println!(
        "(a) per-packet program cost (BPF_PROG_TEST_RUN, repeat {})",
        o.prog_repeat
    );
    match prog_cost(o)? {
        Ok(cases) => {
            // The baseline row (empty program) comes first.
            let base = cases
                .iter()
                .find(|(c, _)| c.contains("baseline"))
                .or(cases.first())
                .map(|(_, v)| *v)
                .unwrap_or(0.0);
            for (c, v) in &cases {
                println!("  {c:<40} {v:>8.1} ns/packet  {:>7}", ratio(*v, base));
            }
        }
        Err(reason) => println!("  skipped: {reason}"),
    }
    check_interrupt()?;
    println!(
        "\n(b) a-pod -> b-pod across both gateway namespaces; per round and mode: iperf3 {}s x 1 and 4 streams, {} pings at 10 ms, {:.0}s of new connections; median of {} interleaved round(s)",
        o.iperf_secs, o.pings, o.conn_secs, o.rounds
    );
    // All three topologies exist side by side (separate namespaces); the modes take turns.
    let mut beds: Vec<(Mode, TwoClusters, Vec<Measurement>)> = Vec::new();
    let mut failed = Vec::new();
    for mode in Mode::ALL {
        check_interrupt()?;
        match prepare(mode) {
            Ok(t) => beds.push((mode, t, Vec::new())),
            Err(e) => {
                check_interrupt()?;
                if mode == Mode::Plain {
                    return Err(e.context("preparing the plain-forwarding baseline"));
                }
                println!("  {:<17} FAILED: {}", mode.label(), shorten(&e));
                failed.push(mode.label());
            }
        }
    }
    for round in 0..o.rounds {
        println!("  round {}/{}", round + 1, o.rounds);
        let mut i = 0;
        while i < beds.len() {
            check_interrupt()?;
            let (mode, t, samples) = &mut beds[i];
            match measure(t, o, round) {
                Ok(m) => {
                    samples.push(m);
                    i += 1;
                }
                Err(e) => {
                    check_interrupt()?;
                    if *mode == Mode::Plain {
                        return Err(e.context("measuring the plain-forwarding baseline"));
                    }
                    println!("  {:<17} FAILED: {}", mode.label(), shorten(&e));
                    failed.push(mode.label());
                    beds.remove(i);
                }
            }
        }
    }
    let results: Vec<(Mode, Measurement)> = beds.iter().map(|(m, _, s)| (*m, medians(s))).collect();
    drop(beds);
    println!();
    print!("{}", table(&results));
    if !failed.is_empty() {
        println!("(not measured, see above: {})", failed.join(", "));
    }
    println!(
        "\nratios: value / plain forwarding (throughput and connections: higher is better; RTT: lower is better)"
    );
    Ok(())
}
