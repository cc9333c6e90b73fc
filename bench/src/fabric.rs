//! `cargo xtask bench fabric`: what a user gets, pod to pod across two clusters, end to end.
//!
//! The clusters are the fixture's ([`fabric_tests::clusters`]): overlay on, remap on, both on pod
//! CIDR 10.244.0.0/16 with the same pod addresses. A pod in A talks to a pod in B under the
//! address A's IPAM remapped it to (10.244.x.y -> 10.64.x.y): node, overlay, gateway, tunnel,
//! gateway, overlay, node. Measured against, in the same run:
//! - `in-cluster`: pod 0 to pod 1 of cluster A, across two nodes over the same node network
//!   (what the cluster's own pod network gives, with no gateway on the way);
//! - `wireguard-go`, `boringtun-cli`: the same clusters with fabric-gateway stopped and the
//!   other implementation in the gateway namespaces, its tunnel configured with `wg` and the
//!   remap done by nftables ([`fabric_tests::other_gateways`]). The operators (the gateways' ends of
//!   the VXLAN overlay) and the agents (the nodes' ends, the routes to the remapped CIDR) stay:
//!   the path is the same up to the gateway's process, and nothing of the fabric is on it
//!   from there to the other gateway's overlay.
//!
//! Per path: iperf3 TCP with 1 and 4 streams; request/response at a fixed rate over one
//! connection (p50, p99 of per-request latency); new TCP connections per second; and for
//! paths through gateways, each gateway process's CPU seconds per Gbit moved during the
//! 1-stream run (from /proc/PID/stat; equal to cores busy per Gbit/s). Figures from one run,
//! ratios to the in-cluster path of the same run: a benchmark, never a timed test.
use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result};

use fabric_tests::{
    check_interrupt,
    clusters::{Cluster, Options as FixtureOptions, POD_CIDR, PeeredClusters},
    figures::{cpu_secs, load_average, percentile, profile},
    other_gateways::{self, Implementation, Kind},
    traffic,
};

#[derive(Debug, Clone)]
pub struct Options {
    /// Seconds per iperf3 run.
    pub iperf_secs: u32,
    /// Requests per second of the request/response run, and its length.
    pub rr_rate: u32,
    pub rr_secs: f64,
    /// Bytes per request (and per response).
    pub rr_size: usize,
    /// Seconds of the connection-rate loop, and its bound on connections.
    pub conn_secs: f64,
    pub max_conns: u64,
    /// The other gateways to measure (in this order), and why any is not.
    pub others: Vec<Implementation>,
    pub missing: Vec<(Kind, String)>,
}

impl Options {
    pub fn standard() -> Self {
        Self {
            iperf_secs: 10,
            rr_rate: 1000,
            rr_secs: 10.0,
            rr_size: 64,
            conn_secs: 5.0,
            max_conns: 50_000,
            others: Vec::new(),
            missing: Vec::new(),
        }
    }

    pub fn quick() -> Self {
        Self {
            iperf_secs: 3,
            rr_rate: 1000,
            rr_secs: 3.0,
            rr_size: 64,
            conn_secs: 2.0,
            max_conns: 20_000,
            others: Vec::new(),
            missing: Vec::new(),
        }
    }

    /// With the other gateways this machine has: wireguard-go from `$WIREGUARD_GO` (which
    /// `cargo xtask bench fabric` sets to the Debian build it unpacked) or the PATH,
    /// boringtun-cli from `$BORINGTUN_CLI`, the PATH or ~/.cargo/bin; both need `wg`.
    pub fn with_other_gateways(mut self) -> Self {
        let wg = Command::new("wg")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        for (kind, env, name) in [
            (Kind::WireguardGo, "WIREGUARD_GO", "wireguard-go"),
            (Kind::Boringtun, "BORINGTUN_CLI", "boringtun-cli"),
        ] {
            let found = find_bin(env, name);
            match (wg, found) {
                (false, _) => self.missing.push((
                    kind,
                    "`wg` (wireguard-tools) configures it and is not installed".into(),
                )),
                (true, Some(bin)) => self.others.push(Implementation { kind, bin }),
                (true, None) => self.missing.push((
                    kind,
                    format!("not found (${env}, PATH, ~/.cargo/bin); `cargo xtask bench fabric` provides it"),
                )),
            }
        }
        self
    }
}

/// `$env` when set, else `name` in the PATH or ~/.cargo/bin.
fn find_bin(env: &str, name: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        return Some(p.into());
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend(std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo/bin")));
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

/// One path's figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Measurement {
    pub tcp1_bps: f64,
    pub tcp4_bps: f64,
    pub rr_p50: Duration,
    pub rr_p99: Duration,
    /// Requests answered (of `rate * secs` scheduled).
    pub rr_count: usize,
    pub conns_per_s: f64,
    /// Per gateway process on the path (name, CPU seconds per Gbit during the 1-stream run);
    /// empty for a path without gateways.
    pub gateway_cpu: Vec<(String, f64)>,
}

/// p50 and p99 of request latencies (unsorted); None when there are none.
pub fn latency_summary(samples: &[Duration]) -> Option<(Duration, Duration)> {
    if samples.is_empty() {
        return None;
    }
    let mut s = samples.to_vec();
    s.sort_unstable();
    Some((percentile(&s, 0.50), percentile(&s, 0.99)))
}

/// CPU seconds per Gbit moved: `cpu_s` spent while `bps` flowed for `secs`. None without
/// traffic (no rate to divide by).
pub fn cpu_per_gbit(cpu_s: f64, bps: f64, secs: f64) -> Option<f64> {
    let gbit = bps * secs / 1e9;
    (gbit > 0.0).then(|| cpu_s / gbit)
}

/// A path measured, under its column label.
#[derive(Debug, Clone)]
pub struct Column {
    pub label: String,
    pub m: Measurement,
}

fn ratio(v: f64, base: f64) -> Option<f64> {
    (base > 0.0).then(|| v / base)
}

/// The figures table: one column per path, the first is the baseline every other cell's
/// ratio is to.
pub fn table(cols: &[Column]) -> String {
    let mut s = String::new();
    let _ = write!(s, "{:<30}", "metric");
    for c in cols {
        let _ = write!(s, "{:>26}", c.label);
    }
    s.push('\n');
    type Get = fn(&Measurement) -> f64;
    let rows: [(&str, Get, f64, &str, usize); 5] = [
        ("TCP 1 stream", |m| m.tcp1_bps, 1e9, "Gbit/s", 2),
        ("TCP 4 streams", |m| m.tcp4_bps, 1e9, "Gbit/s", 2),
        (
            "RR p50 (lower=better)",
            |m| m.rr_p50.as_secs_f64(),
            1e-6,
            "us",
            0,
        ),
        (
            "RR p99 (lower=better)",
            |m| m.rr_p99.as_secs_f64(),
            1e-6,
            "us",
            0,
        ),
        ("new TCP connections", |m| m.conns_per_s, 1.0, "/s", 0),
    ];
    let base = cols.first().map(|c| c.m.clone()).unwrap_or_default();
    for (name, get, scale, unit, prec) in rows {
        let _ = write!(s, "{name:<30}");
        for (i, c) in cols.iter().enumerate() {
            let v = get(&c.m);
            let mut cell = format!("{:.prec$} {unit}", v / scale);
            if i > 0
                && let Some(r) = ratio(v, get(&base))
            {
                let _ = write!(cell, " ({r:.2}x)");
            }
            let _ = write!(s, "{cell:>26}");
        }
        s.push('\n');
    }
    let _ = write!(s, "{:<30}", "gateway CPU s per Gbit");
    for c in cols {
        let cell = if c.m.gateway_cpu.is_empty() {
            "-".to_owned()
        } else {
            c.m.gateway_cpu
                .iter()
                .map(|(_, v)| format!("{v:.2}"))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        let _ = write!(s, "{cell:>26}");
    }
    s.push('\n');
    s
}

/// A target a ratio is held to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Target {
    AtLeast(f64),
    AtMost(f64),
    /// Printed for the record, judged against nothing.
    None,
}

/// One line per ratio: `what: value (target >= t: met|MISSED)`; "not measured" when a path
/// is missing from `cols`.
pub fn ratio_lines(cols: &[Column], wanted: &[Ratio]) -> String {
    let mut s = String::new();
    for r in wanted {
        let find = |l: &str| cols.iter().find(|c| c.label == l).map(|c| &c.m);
        let value = match (find(r.num), find(r.den)) {
            (Some(n), Some(d)) => ratio((r.get)(n), (r.get)(d)),
            _ => None,
        };
        let target = match r.target {
            Target::AtLeast(t) => format!("target >= {t}x"),
            Target::AtMost(t) => format!("target <= {t}x"),
            Target::None => "no target".to_owned(),
        };
        let _ = match value {
            Some(v) => {
                let met = match r.target {
                    Target::AtLeast(t) => Some(v >= t),
                    Target::AtMost(t) => Some(v <= t),
                    Target::None => None,
                };
                let verdict = match met {
                    Some(true) => ": met",
                    Some(false) => ": MISSED",
                    None => "",
                };
                writeln!(s, "  {:<44} {v:>6.2}x  ({target}{verdict})", r.what)
            }
            None => writeln!(s, "  {:<44} {:>7}  ({target}: not measured)", r.what, "-"),
        };
    }
    s
}

/// A ratio of one metric between two columns (by label).
pub struct Ratio {
    pub what: &'static str,
    pub num: &'static str,
    pub den: &'static str,
    pub get: fn(&Measurement) -> f64,
    pub target: Target,
}

pub const IN_CLUSTER: &str = "in-cluster";
pub const FABRIC: &str = "fabric";
pub const WIREGUARD_GO: &str = "wireguard-go";
pub const BORINGTUN: &str = "boringtun-cli";

/// The ratios issue 22 sets targets for.
pub fn targets() -> Vec<Ratio> {
    vec![
        Ratio {
            what: "TCP 1 stream, fabric / in-cluster",
            num: FABRIC,
            den: IN_CLUSTER,
            get: |m| m.tcp1_bps,
            target: Target::AtLeast(0.4),
        },
        Ratio {
            what: "RR p99, fabric / in-cluster",
            num: FABRIC,
            den: IN_CLUSTER,
            get: |m| m.rr_p99.as_secs_f64(),
            target: Target::AtMost(1.5),
        },
        Ratio {
            what: "TCP 1 stream, fabric / wireguard-go",
            num: FABRIC,
            den: WIREGUARD_GO,
            get: |m| m.tcp1_bps,
            target: Target::AtLeast(2.0),
        },
        Ratio {
            what: "TCP 1 stream, fabric / boringtun-cli",
            num: FABRIC,
            den: BORINGTUN,
            get: |m| m.tcp1_bps,
            target: Target::None,
        },
    ]
}

/// How each cluster sees the other's pods: both IPAMs pick the first /16 of the fixture's
/// pool for their peer.
pub const PEER_VIEW: &str = "10.64.0.0/16";

/// How cluster A's pods see pod `k` of B: in [`PEER_VIEW`], host bits kept.
pub fn remote_pod(k: usize) -> String {
    Cluster::pod_ip(k).replacen("10.244.", "10.64.", 1)
}

/// Measures one path: from `client` (a pod namespace) to `dst`, served in `server`; the CPU
/// of the processes `gateways` (name, pid) is read around the 1-stream run.
pub fn measure(
    cl: &mut PeeredClusters,
    client: &str,
    server: &str,
    dst: &str,
    gateways: &[(String, u32)],
    o: &Options,
) -> Result<Measurement> {
    let pids: Vec<i32> = gateways.iter().map(|(_, p)| *p as i32).collect();
    let before: Vec<f64> = pids.iter().map(|p| cpu_secs(&[*p])).collect();
    let tcp1_bps = traffic::iperf3(&mut cl.tb, client, server, dst, 1, o.iperf_secs)
        .context("iperf3, 1 stream")?;
    let after: Vec<f64> = pids.iter().map(|p| cpu_secs(&[*p])).collect();
    let gateway_cpu = gateways
        .iter()
        .zip(before.iter().zip(&after))
        .filter_map(|((name, _), (b, a))| {
            // The CPU time spans the whole iperf3 run (its setup too); the rate is the
            // receiver's average over the run, so their quotient is CPU per Gbit moved.
            Some((
                name.clone(),
                cpu_per_gbit(a - b, tcp1_bps, f64::from(o.iperf_secs))?,
            ))
        })
        .collect();
    check_interrupt()?;
    let tcp4_bps = traffic::iperf3(&mut cl.tb, client, server, dst, 4, o.iperf_secs)
        .context("iperf3, 4 streams")?;
    check_interrupt()?;
    let lat = traffic::request_response(
        client,
        server,
        dst,
        5401,
        o.rr_rate,
        Duration::from_secs_f64(o.rr_secs),
        o.rr_size,
    )
    .context("request/response")?;
    let (rr_p50, rr_p99) = latency_summary(&lat).context("no request was answered")?;
    check_interrupt()?;
    let (n, el) = traffic::conn_rate(
        client,
        server,
        dst,
        5402,
        Duration::from_secs_f64(o.conn_secs),
        o.max_conns,
    )
    .context("connection rate")?;
    Ok(Measurement {
        tcp1_bps,
        tcp4_bps,
        rr_p50,
        rr_p99,
        rr_count: lat.len(),
        conns_per_s: n as f64 / el.as_secs_f64(),
        gateway_cpu,
    })
}

/// The fixture as issue 22 wants it: overlay, remap, two nodes per cluster (the in-cluster
/// path crosses them), one gateway replica each; peered and reachable.
pub fn peered() -> Result<PeeredClusters> {
    let mut cl = PeeredClusters::with_options(FixtureOptions {
        nodes: 2,
        replicas_a: 1,
        replicas_b: 1,
        overlay: true,
        listener_lb: false,
    })
    .context("building the two clusters")?;
    cl.peer_ok()?;
    cl.wait_reachable(&cl.a.pods[0], &remote_pod(0), Duration::from_secs(30))?;
    cl.wait_reachable(&cl.a.pods[0], &Cluster::pod_ip(1), Duration::from_secs(30))?;
    // Settled: the operators' first passes and the tunnel's first handshakes are behind us.
    std::thread::sleep(Duration::from_secs(2));
    Ok(cl)
}

/// The gateway processes on the A-to-B path, with their pids.
fn gateways(cl: &PeeredClusters) -> Result<Vec<(String, u32)>> {
    [&cl.a, &cl.b]
        .iter()
        .map(|c| {
            let name = c.replicas[0].identity.clone();
            let pid = cl
                .pid(&name)
                .with_context(|| format!("{name} is not running"))?;
            Ok((name, pid))
        })
        .collect()
}

/// Stops both fabric gateways (cleanly: their TUN devices, remap programs and routes go with
/// them) so that another implementation can take their place, port and namespace. Their
/// operators and the agents stay: they own the overlay and the nodes' routes, which the
/// other gateways use as they are.
fn replace_gateways(cl: &mut PeeredClusters) -> Result<()> {
    for name in [
        cl.a.replicas[0].identity.clone(),
        cl.b.replicas[0].identity.clone(),
    ] {
        cl.stop(&name)
            .with_context(|| format!("stopping fabric gateway {name}"))?;
    }
    // Nothing of the fabric is left to carry the traffic: the remapped pod is unreachable
    // until the other gateway runs (else the column would measure something else).
    let o = cl.tb.exec_any(
        &cl.a.pods[0],
        &["ping", "-c", "1", "-W", "1", &remote_pod(0)],
    )?;
    anyhow::ensure!(
        !o.status.success(),
        "{} still answers with the fabric gateways stopped",
        remote_pod(0)
    );
    Ok(())
}

/// The other implementation in both gateway namespaces, measured on the same path as the
/// fabric's; stopped again before returning.
fn measure_other(
    cl: &mut PeeredClusters,
    imp: &Implementation,
    o: &Options,
) -> Result<Measurement> {
    let end = |c: &Cluster, side| other_gateways::End {
        ns: c.replicas[0].ns.clone(),
        side,
        underlay_ip: c.replicas[0].underlay_ip.clone(),
    };
    let (ea, eb) = (end(&cl.a, 'a'), end(&cl.b, 'b'));
    let running = other_gateways::start(&cl.tb, imp, &ea, &eb, PEER_VIEW, POD_CIDR, &cl.logs)
        .with_context(|| format!("starting {}", imp.kind.label()))?;
    let (a0, b0) = (cl.a.pods[0].clone(), cl.b.pods[0].clone());
    cl.wait_reachable(&a0, &remote_pod(0), Duration::from_secs(30))
        .map_err(|e| anyhow::anyhow!("{e:#}\n{}", running.log_tails()))?;
    // The double NAT as the fabric does it: B's pod sees A's pod under the address B's IPAM
    // remapped it to, not its real one (the same string here: both views are PEER_VIEW).
    let p = traffic::tcp_probe(&a0, &b0, &remote_pod(0), 5403)
        .with_context(|| format!("TCP probe through {}", imp.kind.label()))?;
    anyhow::ensure!(
        p.server_saw.ip().to_string() == remote_pod(0),
        "through {}, B's pod saw A's pod as {}, not as B's view of it {}",
        imp.kind.label(),
        p.server_saw.ip(),
        remote_pod(0)
    );
    // The first handshake is behind us.
    std::thread::sleep(Duration::from_secs(1));
    let m = measure(cl, &a0, &b0, &remote_pod(0), &running.pids(), o).with_context(|| {
        format!(
            "measuring the {} path\n{}",
            imp.kind.label(),
            running.log_tails()
        )
    })?;
    drop(running);
    Ok(m)
}

/// The whole benchmark, printed as it goes.
pub fn run(o: &Options) -> Result<()> {
    println!(
        "fabric benchmark ({} build): pod to pod across two clusters (overlay, remap, same pod \
         CIDR) against pod to pod inside one; one run, ratios to the in-cluster path",
        profile()
    );
    println!(
        "per path: iperf3 {}s x 1 and 4 streams; request/response {} B at {}/s for {:.0}s over \
         one connection; {:.0}s of new connections",
        o.iperf_secs, o.rr_size, o.rr_rate, o.rr_secs, o.conn_secs
    );
    println!(
        "(all traffic inside namespaces fabt-{}-*)",
        std::process::id()
    );
    // Figures on a shared machine mean little without what else ran: say it with them.
    println!("machine load at the start: {}\n", load_average());
    let mut cols = Vec::new();
    {
        println!("building the fixture's two clusters (fabric-gateway) ...");
        let mut cl = peered()?;
        check_interrupt()?;
        let (a0, a1, b0) = (
            cl.a.pods[0].clone(),
            cl.a.pods[1].clone(),
            cl.b.pods[0].clone(),
        );
        println!(
            "  {IN_CLUSTER}: {} -> {} (A's pod 0 to pod 1)",
            Cluster::pod_ip(0),
            Cluster::pod_ip(1)
        );
        let m = measure(&mut cl, &a0, &a1, &Cluster::pod_ip(1), &[], o)
            .context("measuring the in-cluster path")?;
        cols.push(Column {
            label: IN_CLUSTER.into(),
            m,
        });
        check_interrupt()?;
        let gws = gateways(&cl)?;
        println!(
            "  {FABRIC}: {} -> {} (A's pod 0 to B's pod 0)",
            Cluster::pod_ip(0),
            remote_pod(0)
        );
        let m = measure(&mut cl, &a0, &b0, &remote_pod(0), &gws, o)
            .with_context(|| format!("measuring the fabric path\n{}", cl.log_tails()))?;
        cols.push(Column {
            label: FABRIC.into(),
            m,
        });
        for (kind, why) in &o.missing {
            println!("  {}: not measured: {why}", kind.label());
        }
        if !o.others.is_empty() {
            replace_gateways(&mut cl)?;
        }
        for imp in &o.others {
            check_interrupt()?;
            let label = imp.kind.label();
            println!(
                "  {label}: {} -> {} (A's pod 0 to B's pod 0; {} in the gateway namespaces, \
                 nftables NAT)",
                Cluster::pod_ip(0),
                remote_pod(0),
                imp.bin.display()
            );
            let m = measure_other(&mut cl, imp, o)?;
            cols.push(Column {
                label: label.into(),
                m,
            });
        }
    }
    println!();
    print!("{}", table(&cols));
    for c in &cols {
        if !c.m.gateway_cpu.is_empty() {
            let per: Vec<String> =
                c.m.gateway_cpu
                    .iter()
                    .map(|(n, v)| format!("{n} {v:.2}"))
                    .collect();
            println!("  {}: gateway CPU s per Gbit: {}", c.label, per.join(", "));
        }
        let scheduled = (o.rr_secs * f64::from(o.rr_rate)) as usize;
        if c.m.rr_count < scheduled {
            println!(
                "  {}: {} of {scheduled} requests sent on schedule (the rest fell behind)",
                c.label, c.m.rr_count
            );
        }
    }
    println!("machine load at the end: {}", load_average());
    println!("\nratios (throughput, connections: higher is better; latency: lower is better):");
    print!("{}", ratio_lines(&cols, &targets()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn latency_percentiles() {
        assert_eq!(latency_summary(&[]), None);
        // 1..=100 us, shuffled: the median rounds to the 51st, p99 to the 99th.
        let mut v: Vec<Duration> = (1..=100).rev().map(us).collect();
        v.swap(3, 77);
        assert_eq!(latency_summary(&v), Some((us(51), us(99))));
        assert_eq!(latency_summary(&[us(7)]), Some((us(7), us(7))));
    }

    #[test]
    fn cpu_per_gbit_divides_by_what_moved() {
        // 2 Gbit/s for 10 s is 20 Gbit; 5 CPU seconds over it is 0.25 s per Gbit.
        assert_eq!(cpu_per_gbit(5.0, 2e9, 10.0), Some(0.25));
        assert_eq!(cpu_per_gbit(5.0, 0.0, 10.0), None);
    }

    fn col(label: &str, gbps: f64, p99_us: u64, cpu: &[f64]) -> Column {
        Column {
            label: label.into(),
            m: Measurement {
                tcp1_bps: gbps * 1e9,
                tcp4_bps: 2.0 * gbps * 1e9,
                rr_p50: us(p99_us / 2),
                rr_p99: us(p99_us),
                rr_count: 1000,
                conns_per_s: 1000.0,
                gateway_cpu: cpu
                    .iter()
                    .enumerate()
                    .map(|(i, v)| (format!("gateway{i}"), *v))
                    .collect(),
            },
        }
    }

    #[test]
    fn table_shows_ratios_to_the_first_column() {
        let t = table(&[
            col(IN_CLUSTER, 10.0, 100, &[]),
            col(FABRIC, 4.0, 200, &[0.5, 0.25]),
        ]);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].contains(IN_CLUSTER) && lines[0].contains(FABRIC));
        assert!(lines[1].starts_with("TCP 1 stream"));
        assert!(lines[1].contains("10.00 Gbit/s"), "{t}");
        assert!(lines[1].contains("4.00 Gbit/s (0.40x)"), "{t}");
        assert!(lines[4].contains("200 us (2.00x)"), "{t}");
        assert!(lines[6].contains("0.50 / 0.25"), "{t}");
        // The baseline has no ratio and no gateway.
        assert!(!lines[1].contains("(1.00x)"), "{t}");
        assert!(lines[6].contains(" -"), "{t}");
    }

    #[test]
    fn ratio_lines_judge_targets() {
        let cols = [col(IN_CLUSTER, 10.0, 100, &[]), col(FABRIC, 3.0, 150, &[])];
        let s = ratio_lines(&cols, &targets());
        let lines: Vec<&str> = s.lines().collect();
        assert!(
            lines[0].contains("0.30x") && lines[0].contains(">= 0.4x: MISSED"),
            "{s}"
        );
        assert!(
            lines[1].contains("1.50x") && lines[1].contains("<= 1.5x: met"),
            "{s}"
        );
        let s = ratio_lines(&cols[..1], &targets());
        assert!(s.lines().all(|l| l.contains("not measured")), "{s}");
    }

    #[test]
    fn ratios_to_the_other_gateways() {
        // The columns are labelled by the implementations' own labels.
        assert_eq!(Kind::WireguardGo.label(), WIREGUARD_GO);
        assert_eq!(Kind::Boringtun.label(), BORINGTUN);
        let cols = [
            col(IN_CLUSTER, 10.0, 100, &[]),
            col(FABRIC, 3.0, 150, &[]),
            col(WIREGUARD_GO, 1.0, 300, &[]),
        ];
        let s = ratio_lines(&cols, &targets());
        let lines: Vec<&str> = s.lines().collect();
        assert!(
            lines[2].contains("fabric / wireguard-go")
                && lines[2].contains("3.00x")
                && lines[2].contains(">= 2x: met"),
            "{s}"
        );
        // boringtun-cli not measured; its ratio has no target to meet.
        assert!(
            lines[3].contains("fabric / boringtun-cli")
                && lines[3].contains("(no target: not measured)"),
            "{s}"
        );
        let s = ratio_lines(
            &[cols[1].clone(), col(BORINGTUN, 6.0, 100, &[])],
            &targets(),
        );
        let last = s.lines().last().unwrap();
        assert!(last.contains("0.50x  (no target)"), "{s}");
    }
}
