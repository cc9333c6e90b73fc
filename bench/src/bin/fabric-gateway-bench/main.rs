//! Data-path benchmark: fabric-gateway vs boringtun-cli vs a plain veth path,
//! all on the same network-namespace topology and measured in the same run.
//!
//!   pa (10.10.0.2) -- ga == underlay veth 10.250.0.1 <-> 10.250.0.2 == gb -- pb (10.20.0.2)
//!
//! Every mode gets a fresh test bed (`fabric_netns::testbed`). Traffic never leaves its
//! namespaces. Every process and namespace is removed on success, error, panic, SIGINT/SIGTERM
//! and when the overall deadline passes; after a SIGKILL the processes die with the benchmark
//! and the next test bed reaps the rest.
//!
//! Our gateway runs as a child process of this very binary (`__gateway`), which
//! calls the same library code as `fabric-gateway run`, so that `cargo run --bin
//! fabric-gateway-bench` always measures the code it was built from.

mod procs;
mod report;

use procs::*;
use report::print_table;

use std::{
    fs,
    net::SocketAddr,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Mutex,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};
use clap::Parser;
use fabric_gateway::{
    config::{Config, PeerConfig},
    key::PrivateKey,
};
use fabric_netns::testbed::Testbed;
use ipnetwork::IpNetwork;

const A_UL: &str = "10.250.0.1";
const B_UL: &str = "10.250.0.2";
const POD_B: &str = "10.20.0.2";
const PORT: u16 = 51820;
const MTU: u16 = 1420;
const PREFIX: &str = "fgb";

#[derive(Parser)]
#[command(about = "Benchmark fabric-gateway against boringtun-cli and a plain veth path")]
struct Args {
    /// Seconds per iperf3 run.
    #[arg(long, default_value_t = 5)]
    time: u32,
    /// Pings for the RTT measurement (sent every 10 ms).
    #[arg(long, default_value_t = 200)]
    pings: u32,
    /// Peers for the large-configuration RSS measurement.
    #[arg(long, default_value_t = 100)]
    peers: usize,
    /// Spin window of the busy-poll column (fabric-gateway's `busy_poll_us`); it must
    /// exceed the 10 ms ping interval to spare the wake-ups.
    #[arg(long, default_value_t = 20_000)]
    busy_poll_us: u64,
    /// Only measure fabric-gateway (and the veth ceiling).
    #[arg(long)]
    skip_boringtun: bool,
    /// Abort (and clean up) if the whole run takes longer than this many seconds.
    #[arg(long, default_value_t = 600)]
    deadline: u64,
    /// Internal: run the gateway (used by the benchmark on itself).
    #[arg(long, hide = true, num_args = 3, value_names = ["CONFIG", "UAPI_DIR", "CONTROL_DIR"])]
    gateway: Option<Vec<PathBuf>>,
}

// -------------------------------------------------------------- topology

struct Topo {
    ga: String,
    gb: String,
    pa: String,
    pb: String,
    /// The test bed's scratch directory: keys, configurations, logs, sockets.
    dir: PathBuf,
    /// Short and unique: gateway and boringtun interface names start with it.
    tag: String,
    /// The test bed (kept in the registry, so that the signal thread can clean it up).
    bed_id: String,
}

fn topology(mode: &str) -> Result<Topo> {
    let tag = format!("{PREFIX}{}{mode}", std::process::id());
    // Built under the registry's lock: the signal thread cleans up either before the test bed
    // exists or after it is complete, never half of it.
    let mut r = registry();
    if r.closing {
        bail!("cleaning up");
    }
    r.beds.push(Testbed::new()?);
    let bed = r.beds.last_mut().expect("just pushed");
    let mut mk = |s: &str| -> Result<String> {
        let n = bed.add_netns(s)?;
        bed.sysctl(&n, "net.ipv4.ip_forward", "1")?;
        Ok(n)
    };
    let (ga, gb, pa, pb) = (mk("ga")?, mk("gb")?, mk("pa")?, mk("pb")?);
    bed.veth_addrs((&ga, "ula", "10.250.0.1/24"), (&gb, "ulb", "10.250.0.2/24"))?;
    bed.veth_addrs((&ga, "poda", "10.10.0.1/24"), (&pa, "eth0", "10.10.0.2/24"))?;
    bed.veth_addrs((&gb, "podb", "10.20.0.1/24"), (&pb, "eth0", "10.20.0.2/24"))?;
    bed.ip(&pa, &["route", "add", "default", "via", "10.10.0.1"])?;
    bed.ip(&pb, &["route", "add", "default", "via", "10.20.0.1"])?;
    Ok(Topo {
        ga,
        gb,
        pa,
        pb,
        dir: bed.dir().to_owned(),
        tag,
        bed_id: bed.id().to_owned(),
    })
}

fn teardown(t: &Topo) {
    // Processes first (they hold devices in the namespaces), then the namespaces.
    let pids = std::mem::take(&mut registry().pids);
    for pid in pids.into_iter().rev() {
        kill_and_reap(pid);
    }
    let bed = {
        let mut r = registry();
        let i = r.beds.iter().position(|b| b.id() == t.bed_id);
        i.map(|i| r.beds.swap_remove(i))
    };
    drop(bed);
}

fn wait_ping(t: &Topo, timeout: Duration, pids: &[i32]) -> Result<()> {
    let t0 = Instant::now();
    while t0.elapsed() < timeout {
        if let Some(p) = pids.iter().find(|&&p| !alive(p)) {
            bail!("gateway process {p} exited");
        }
        if ns_cmd(&t.pa, &["ping", "-c", "1", "-W", "1", POD_B], T).is_ok() {
            return Ok(());
        }
    }
    bail!("{POD_B} unreachable from the client pod after {timeout:?}")
}

fn write_key(dir: &Path, name: &str) -> Result<(PathBuf, String)> {
    let k = PrivateKey::generate()?;
    let p = dir.join(format!("{name}.key"));
    fs::write(&p, format!("{}\n", k.to_base64()))?;
    fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    Ok((p, k.public_key().to_base64()))
}

// ------------------------------------------------------------------ modes

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Veth,
    Boringtun,
    Ours,
    OursBusy,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::Veth => "plain veth",
            Mode::Boringtun => "boringtun-cli",
            Mode::Ours => "fabric-gateway",
            Mode::OursBusy => "fabric-gateway busy-poll",
        }
    }
}

/// Gateway processes of a running setup (empty for plain veth).
struct Setup {
    pids: Vec<i32>,
    /// The client-side gateway, whose RSS is reported.
    a_pid: Option<i32>,
}

fn setup_veth(t: &Topo) -> Result<Setup> {
    ns_cmd(
        &t.ga,
        &["ip", "route", "add", "10.20.0.0/24", "via", B_UL],
        T,
    )?;
    ns_cmd(
        &t.gb,
        &["ip", "route", "add", "10.10.0.0/24", "via", A_UL],
        T,
    )?;
    Ok(Setup {
        pids: vec![],
        a_pid: None,
    })
}

#[allow(clippy::too_many_arguments)]
fn ours_peer(
    name: &str,
    public_key: &str,
    endpoint: Option<&str>,
    allowed: &[String],
    device: &str,
    address: &str,
    routes: &[String],
    probe: Option<&str>,
) -> Result<PeerConfig> {
    let nets = |v: &[String]| -> Result<Vec<IpNetwork>> {
        v.iter()
            .map(|n| n.parse().with_context(|| format!("prefix {n}")))
            .collect()
    };
    let mut p = PeerConfig::builder(name, public_key.parse()?)
        .allowed_ips(nets(allowed)?)
        .device(device)
        .address(address.parse::<IpNetwork>()?)
        .routes(nets(routes)?);
    if let Some(e) = endpoint {
        p = p.endpoint(e.parse()?);
    }
    if let Some(ip) = probe {
        p = p.probe_address(ip.parse::<std::net::IpAddr>()?);
    }
    Ok(p.build())
}

fn start_ours(
    t: &Topo,
    ns: &str,
    which: &str,
    key: &Path,
    peers: Vec<PeerConfig>,
    busy_poll_us: u64,
) -> Result<i32> {
    let name = format!("{}{which}", t.tag);
    let cfg = t.dir.join(format!("{which}.toml"));
    let config = Config::builder(key)
        .name(name)
        .listen_port(PORT)
        .mtu(MTU)
        .busy_poll_us(busy_poll_us)
        .peers(peers)
        .build()?;
    fs::write(&cfg, config.to_toml()?)?;
    let exe = std::env::current_exe()?;
    let dir = t.dir.to_str().unwrap();
    spawn_in(
        ns,
        &[
            exe.to_str().unwrap(),
            "--gateway",
            cfg.to_str().unwrap(),
            dir,
            dir,
        ],
        &[("RUST_LOG", "warn")],
        &t.dir.join(format!("gw{which}.log")),
    )
}

/// Our gateway on both sides; A additionally gets `extra` unreachable peers.
fn setup_ours(t: &Topo, extra: usize, busy_poll_us: u64) -> Result<Setup> {
    let (ak, apub) = write_key(&t.dir, "a")?;
    let (bk, bpub) = write_key(&t.dir, "b")?;
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let mut a_peers = vec![ours_peer(
        "cluster-b",
        &bpub,
        Some(&format!("{B_UL}:{PORT}")),
        &s(&["10.20.0.0/24", "169.254.100.0/30"]),
        "fab-b",
        "169.254.100.1/30",
        &s(&["10.20.0.0/24"]),
        Some("169.254.100.2"),
    )?];
    for i in 0..extra {
        let (_, pk) = write_key(&t.dir, &format!("x{i}"))?;
        let (hi, lo) = (i / 64, (i % 64) * 4);
        // Endpoints on the underlay subnet that nobody answers: the peers exist,
        // keep handshaking, and never come up, like unreachable clusters.
        a_peers.push(ours_peer(
            &format!("extra-{i}"),
            &pk,
            Some(&format!("10.250.0.{}:{PORT}", 100 + i % 150)),
            &s(&[
                &format!("10.{}.{}.0/24", 100 + i / 256, i % 256),
                &format!("169.254.{}.{}/30", 200 + hi, lo),
            ]),
            &format!("fabx{i}"),
            &format!("169.254.{}.{}/30", 200 + hi, lo + 1),
            &s(&[&format!("10.{}.{}.0/24", 100 + i / 256, i % 256)]),
            Some(&format!("169.254.{}.{}", 200 + hi, lo + 2)),
        )?);
    }
    let b_peers = ours_peer(
        "cluster-a",
        &apub,
        None,
        &s(&["10.10.0.0/24", "169.254.100.0/30"]),
        "fab-a",
        "169.254.100.2/30",
        &s(&["10.10.0.0/24"]),
        Some("169.254.100.1"),
    )?;
    let b = start_ours(t, &t.gb, "b", &bk, vec![b_peers], busy_poll_us)?;
    let a = start_ours(t, &t.ga, "a", &ak, a_peers, busy_poll_us)?;
    Ok(Setup {
        pids: vec![a, b],
        a_pid: Some(a),
    })
}

fn setup_boringtun(t: &Topo, bt: &Path) -> Result<Setup> {
    let (ak, apub) = write_key(&t.dir, "a")?;
    let (bk, bpub) = write_key(&t.dir, "b")?;
    let mut pids = vec![];
    for (ns, side, key, peer_pub, allowed, addr, endpoint) in [
        (
            &t.gb,
            "b",
            &bk,
            &apub,
            "10.10.0.0/24",
            "169.254.100.2/30",
            None,
        ),
        (
            &t.ga,
            "a",
            &ak,
            &bpub,
            "10.20.0.0/24",
            "169.254.100.1/30",
            Some(format!("{B_UL}:{PORT}")),
        ),
    ] {
        let ifname = format!("{}{side}", t.tag);
        let sock = PathBuf::from(format!("/var/run/wireguard/{ifname}.sock"));
        registry().paths.push(sock.clone());
        let pid = spawn_in(
            ns,
            &[
                bt.to_str().unwrap(),
                "--foreground",
                "--disable-drop-privileges",
                "-v",
                "error",
                &ifname,
            ],
            &[("WG_SUDO", "true")],
            &t.dir.join(format!("bt{side}.log")),
        )?;
        pids.push(pid);
        let t0 = Instant::now();
        while !sock.exists() {
            if t0.elapsed() > T || !alive(pid) {
                bail!(
                    "boringtun-cli did not create {}: {}",
                    sock.display(),
                    fs::read_to_string(t.dir.join(format!("bt{side}.log"))).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut set = vec![
            "wg".to_string(),
            "set".into(),
            ifname.clone(),
            "private-key".into(),
            key.to_str().unwrap().into(),
            "listen-port".into(),
            PORT.to_string(),
            "peer".into(),
            peer_pub.clone(),
            "allowed-ips".into(),
            format!("{allowed},169.254.100.0/30"),
        ];
        if let Some(e) = endpoint {
            set.extend(["endpoint".into(), e]);
        }
        let set: Vec<&str> = set.iter().map(String::as_str).collect();
        ns_cmd(ns, &set, T)?;
        ns_cmd(ns, &["ip", "addr", "add", addr, "dev", &ifname], T)?;
        ns_cmd(
            ns,
            &["ip", "link", "set", &ifname, "mtu", &MTU.to_string(), "up"],
            T,
        )?;
        ns_cmd(ns, &["ip", "route", "add", allowed, "dev", &ifname], T)?;
    }
    Ok(Setup {
        a_pid: Some(pids[1]),
        pids,
    })
}

// ---------------------------------------------------------- measurements

#[derive(Default, Clone, Debug)]
struct Results {
    gbps_1: Option<f64>,
    retr_1: Option<u64>,
    cpu_1: Option<f64>,
    gbps_4: Option<f64>,
    retr_4: Option<u64>,
    cpu_4: Option<f64>,
    rtt_ms: Option<f64>,
    cpu_ping: Option<f64>,
    rss_kib: Option<u64>,
    rss_after_kib: Option<u64>,
}

fn ping_rtt(t: &Topo, n: u32) -> Result<f64> {
    let out = ns_cmd(
        &t.pa,
        &[
            "ping",
            "-q",
            "-c",
            &n.to_string(),
            "-i",
            "0.01",
            "-W",
            "1",
            POD_B,
        ],
        Duration::from_secs(30 + u64::from(n) / 50),
    )?;
    // "rtt min/avg/max/mdev = 0.041/0.057/0.120/0.010 ms"
    let line = out
        .lines()
        .find(|l| l.contains("min/avg/max"))
        .ok_or_else(|| anyhow!("no rtt summary in ping output: {out}"))?;
    let nums = line.split('=').nth(1).unwrap_or("").trim();
    Ok(nums
        .split('/')
        .nth(1)
        .ok_or_else(|| anyhow!("bad rtt line {line}"))?
        .parse()?)
}

/// Runs `f` and returns its result with the CPU the gateways `gws` used meanwhile,
/// as % of one core (None without gateways).
fn with_cpu<T>(gws: &[i32], f: impl FnOnce() -> Result<T>) -> Result<(T, Option<f64>)> {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let before: Vec<u64> = gws.iter().map(|&p| cpu_ticks(p)).collect::<Result<_>>()?;
    let t0 = Instant::now();
    let v = f()?;
    let wall = t0.elapsed().as_secs_f64();
    let after: Vec<u64> = gws.iter().map(|&p| cpu_ticks(p)).collect::<Result<_>>()?;
    let ticks: u64 = after.iter().zip(&before).map(|(a, b)| a - b).sum();
    Ok((
        v,
        (!gws.is_empty()).then(|| ticks as f64 / hz / wall * 100.0),
    ))
}

/// Returns (Gbit/s received, retransmits, gateway CPU as % of one core).
fn iperf(t: &Topo, streams: u32, secs: u32, gws: &[i32]) -> Result<(f64, u64, Option<f64>)> {
    let (out, cpu) = with_cpu(gws, || {
        ns_cmd(
            &t.pa,
            &[
                "iperf3",
                "-c",
                POD_B,
                "-t",
                &secs.to_string(),
                "-P",
                &streams.to_string(),
                "-J",
            ],
            Duration::from_secs(u64::from(secs) + 20),
        )
    })?;
    let v: serde_json::Value = serde_json::from_str(&out).context("iperf3 JSON")?;
    if let Some(e) = v.get("error") {
        bail!("iperf3: {e}");
    }
    let bps = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .ok_or_else(|| anyhow!("iperf3 JSON without end.sum_received"))?;
    let retr = v["end"]["sum_sent"]["retransmits"].as_u64().unwrap_or(0);
    Ok((bps / 1e9, retr, cpu))
}

fn measure(mode: Mode, args: &Args, bt: Option<&Path>) -> Result<Results> {
    let t = topology(match mode {
        Mode::Veth => "v",
        Mode::Boringtun => "t",
        Mode::Ours => "o",
        Mode::OursBusy => "q",
    })?;
    let res = (|| -> Result<Results> {
        let s = match mode {
            Mode::Veth => setup_veth(&t)?,
            Mode::Ours => setup_ours(&t, 0, 0)?,
            Mode::OursBusy => setup_ours(&t, 0, args.busy_poll_us)?,
            Mode::Boringtun => setup_boringtun(&t, bt.expect("checked by caller"))?,
        };
        wait_ping(&t, Duration::from_secs(20), &s.pids).with_context(|| {
            let logs: String = ["gwa", "gwb", "bta", "btb"]
                .iter()
                .filter_map(|l| fs::read_to_string(t.dir.join(format!("{l}.log"))).ok())
                .collect();
            format!("{} never passed traffic; logs:\n{logs}", mode.label())
        })?;
        spawn_in(
            &t.pb,
            &["iperf3", "-s", "-B", POD_B],
            &[],
            &t.dir.join("iperf3-server.log"),
        )?;
        let (rtt, cpu_ping) = with_cpu(&s.pids, || ping_rtt(&t, args.pings))?;
        let mut r = Results {
            rtt_ms: Some(rtt),
            cpu_ping,
            rss_kib: s.a_pid.map(vm_rss_kib).transpose()?,
            ..Default::default()
        };
        // The server needs a moment to listen; the ping above gave it that, but
        // retry once in case it was slower.
        let run = |n| {
            iperf(&t, n, args.time, &s.pids).or_else(|_| {
                std::thread::sleep(Duration::from_millis(500));
                iperf(&t, n, args.time, &s.pids)
            })
        };
        let (g, rt, c) = run(1)?;
        (r.gbps_1, r.retr_1, r.cpu_1) = (Some(g), Some(rt), c);
        let (g, rt, c) = run(4)?;
        (r.gbps_4, r.retr_4, r.cpu_4) = (Some(g), Some(rt), c);
        r.rss_after_kib = s.a_pid.map(vm_rss_kib).transpose()?;
        for &p in &s.pids {
            if !alive(p) {
                bail!("{} process {p} died during the run", mode.label());
            }
        }
        Ok(r)
    })();
    teardown(&t);
    res
}

/// VmRSS of our client-side gateway with `n` peers configured, one of them reachable.
fn rss_with_peers(n: usize, pings: u32) -> Result<u64> {
    let t = topology("p")?;
    let res = (|| -> Result<u64> {
        let s = setup_ours(&t, n.saturating_sub(1), 0)?;
        wait_ping(&t, Duration::from_secs(30), &s.pids).with_context(|| {
            let log = fs::read_to_string(t.dir.join("gwa.log")).unwrap_or_default();
            format!(
                "client gateway log:\n{}",
                &log[log.len().saturating_sub(3000)..]
            )
        })?;
        ping_rtt(&t, pings)?;
        let pid = s.a_pid.expect("ours has a client gateway");
        if !alive(pid) {
            bail!("gateway with {n} peers died");
        }
        vm_rss_kib(pid)
    })();
    teardown(&t);
    res
}

fn find_boringtun() -> std::result::Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("BORINGTUN_CLI") {
        return Ok(p.into());
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(h) = std::env::var_os("HOME") {
        dirs.push(Path::new(&h).join(".cargo/bin"));
    }
    dirs.into_iter()
        .map(|d| d.join("boringtun-cli"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            "boringtun-cli not found in PATH or ~/.cargo/bin \
             (install it with `WG_SUDO=true cargo install boringtun-cli --locked`)"
                .into()
        })
}

fn tool_missing(name: &str) -> bool {
    Command::new(name)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_err()
}

fn main() -> Result<()> {
    let args = Args::parse();
    if let Some(g) = args.gateway {
        tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
            )
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .init();
        return fabric_gateway::daemon::run_blocking(
            g[0].clone(),
            g[1].clone(),
            g[2].clone(),
            None::<SocketAddr>,
        );
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the benchmark needs root (network namespaces, TUN devices)");
    }
    for tool in ["iperf3", "ping", "ip", "timeout"] {
        if tool_missing(tool) {
            bail!("{tool} is required but not installed");
        }
    }
    install_reaper(Duration::from_secs(args.deadline));
    fabric_netns::testbed::reap_stale();
    let result = bench(&args);
    cleanup_all();
    result
}

fn bench(args: &Args) -> Result<()> {
    let bt = if args.skip_boringtun {
        Err("skipped with --skip-boringtun".to_string())
    } else if tool_missing("wg") {
        Err(
            "`wg` (wireguard-tools) is needed to configure boringtun-cli and is not installed"
                .into(),
        )
    } else {
        find_boringtun()
    };
    if let Err(why) = &bt {
        println!("boringtun-cli comparison skipped: {why}");
    }
    // SAFETY: sysconf has no preconditions.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    println!(
        "fabric-gateway benchmark: iperf3 {} s runs, {} pings at 10 ms, {cpus} CPU(s), MTU {MTU} in tunnels",
        args.time, args.pings
    );
    let mut cols = vec![];
    for mode in [Mode::Veth, Mode::Boringtun, Mode::Ours, Mode::OursBusy] {
        let r = match (mode, &bt) {
            (Mode::Boringtun, Err(why)) => Err(format!("skipped: {why}")),
            _ => {
                eprintln!("measuring {} ...", mode.label());
                measure(mode, args, bt.as_deref().ok()).map_err(|e| format!("{e:#}"))
            }
        };
        if let Err(e) = &r {
            eprintln!("{}: {e}", mode.label());
        }
        cols.push((mode, r));
    }
    eprintln!("measuring fabric-gateway RSS with {} peers ...", args.peers);
    let many = rss_with_peers(args.peers, args.pings.min(50));
    if let Err(e) = &many {
        eprintln!("{} peers: {e:#}", args.peers);
    }
    print_table(&cols);
    match &many {
        Ok(k) => println!(
            "{:<30} {:>35.1}",
            format!("client gw VmRSS, {} peers (MiB)", args.peers),
            *k as f64 / 1024.0
        ),
        Err(e) => println!("VmRSS with {} peers: failed: {e:#}", args.peers),
    }
    let failed: Vec<_> = cols
        .iter()
        .filter(|(m, r)| r.is_err() && !(*m == Mode::Boringtun && bt.is_err()))
        .map(|(m, _)| m.label())
        .collect();
    if !failed.is_empty() || many.is_err() {
        bail!("measurements failed: {failed:?}");
    }
    Ok(())
}
