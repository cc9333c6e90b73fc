//! Developer tasks for the fabric workspace: `cargo xtask <task>`.
//!
//! - `setup`: installs what a fresh Debian machine lacks (idempotent, quick when present).
//! - `test`: setup, build every binary, run the whole test suite (netns tests need root), test
//!   binaries in parallel lanes (`testrun`).
//! - `demo`: setup, build, run the two-cluster demo in network namespaces.
//! - `bench datapath`: setup, build, compare plain forwarding, the eBPF remap and nftables NAT.
//! - `bench gateway`: setup, build (release), compare our WireGuard gateway with boringtun-cli.
//! - `bench fabric`: setup, build, pod to pod across two clusters against pod to pod in one.
//! - `bench storage`: setup, build, a claim's first consumer on a virtual vs a real node, and a
//!   volume moved between clusters vs a plain copy.
//! - `bench peering`, `bench offload`, `bench reflection`: build, time the sharing layer on two
//!   API servers.
//! - `codegen`: regenerate deploy/crds from the Rust API types.
//! - `deny`: the supply-chain check (cargo-deny: advisories, licenses, bans, sources).
//! - `fuzz`: run one of the fuzz targets in fuzz/ (cargo-fuzz, nightly) from its seeds.
//!
//! Kept dependency-light on purpose (anyhow, ctrlc, serde_json): it is compiled before anything else.
use std::{
    env,
    ffi::OsStr,
    io::Write,
    path::{Path, PathBuf},
    process::{Command, ExitCode, Stdio},
    time::Instant,
};

use anyhow::{Context as _, Result, bail};

mod deny;
mod setup;
mod testrun;
mod wggo;

use setup::{setup, setup_nightly};

/// Tests run side by side: most of the suite's time is end-to-end tests waiting on servers
/// and timers, not on the CPU. On the 2-core VM the tests and their API servers used about
/// 620 s of CPU in 1,340 s of jobs: three lanes kept the machine 71% busy and took 447-459 s,
/// four 85% and 392-398 s (two runs, no test failing). With the suite grown (154 jobs, about
/// 560 s of CPU with their API servers), four kept it 84% busy and took 350 s on a fresh
/// clone, five 92% and 314 s, no test failing: the README's two commands back under 12
/// minutes (12 min 45 s with four, 11 min 40 s with five).
const DEFAULT_LANES: usize = 5;

const USAGE: &str = "\
usage: cargo xtask <task>

tasks:
  setup             install missing system packages, the pinned nightly (fabric-ebpf/rust-toolchain.toml)
                    with rust-src, bpf-linker; mount bpffs
  test [ARGS] [-- TEST-ARGS]
                    setup, build all binaries and test binaries (ARGS select them as for
                    `cargo test`), run the test binaries in FABRIC_TEST_LANES parallel lanes
                    (default 5), TEST-ARGS passed to each (e.g. a test name filter)
  demo              setup, build, run the two-cluster demo (network namespaces, needs root)
  bench datapath    setup, build, benchmark plain forwarding vs eBPF remap vs nftables NAT
                    (extra args are passed to fabric-bench, e.g. `-- --quick`)
  bench gateway     setup, build (release), benchmark fabric-gateway vs boringtun-cli vs veth
  bench fabric      setup, build, pod to pod across the fixture's two clusters (overlay, remap,
                    same pod CIDR) against pod to pod inside one: TCP 1 and 4 streams,
                    request/response p50/p99 at a fixed rate, new connections/s, gateway CPU
                    per Gbit (`-- --quick`: a short run; `-- --release`: binaries built and run
                    in release mode, as the figures in docs/benchmarks.md are)
  bench storage     setup, build, on the fixture's two clusters with their sharing layers: a
                    claim's first consumer on a real node vs on a virtual node (until Bound,
                    until Running; p50, ratio), and `fabricctl move volume` of 256 MiB vs a
                    plain TCP copy over the same tunnel (`-- --quick`: 2 runs, 32 MiB;
                    `-- --runs N`, `-- --move-mib N`; `-- --release` as for fabric)
  bench control     setup, build, time peering and API-to-route reactions, idle memory
  bench peering     build, time `fabricctl peer out-of-band` to the virtual node Ready (p50 of
                    5 runs), memory of 50 peers' virtual kubelets and the controllers
                    (extra args go to fabric-bench, e.g. `-- --runs 10 --memory-peers 0`)
  bench offload     build, time pods bound to the virtual node until Running at home (p50, p99,
                    all) for 1, 100, 1000 pods against the same burst on the provider's own
                    (hollow) node, and the virtual kubelet's memory (e.g. `-- --sizes 1,100`;
                    `-- --webhook`: with the provider's ShadowPod webhook; `-- --grace 30`:
                    offloaded pods deleted with that grace period; `-- --release`: the
                    bench's binaries built and run in release mode)
  bench reflection  build, time 1,000 EndpointSlice changes at home until translated on the
                    provider (p50, p90, p99, max), then the virtual kubelet's and the provider's
                    memory with 10,000 reflected objects (`-- --quick`: a tenth; `-- --rate N`:
                    changes per second, default 20; `-- --release` as for offload)
  codegen           regenerate the CRD YAML in deploy/crds from the fabric-api types
  deny [CHECKS]     cargo-deny with deny.toml: RustSec advisories (offline from
                    ../shared/advisory-db when present), licenses, bans, sources
  fuzz --list       list the fuzz targets (fuzz/, built by cargo-fuzz on the nightly toolchain)
  fuzz TARGET [--time SECONDS] [-- LIBFUZZER-ARGS]
                    fuzz one target from its seeds for SECONDS (default 60); installs
                    cargo-fuzz if missing; crashing inputs land in fuzz/artifacts/TARGET
";

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let res = match args.first().map(String::as_str) {
        Some("setup") => setup().map(|()| ExitCode::SUCCESS),
        Some("test") => test(&args[1..]),
        Some("demo") => demo(&args[1..]),
        Some("codegen") => codegen(),
        Some("deny") => deny::deny(&args[1..]).map(|()| ExitCode::SUCCESS),
        Some("fuzz") => fuzz(&args[1..]),
        Some("bench") => match args.get(1).map(String::as_str) {
            Some("datapath") => bench_datapath(&args[2..]),
            Some("gateway") => bench_gateway(&args[2..]),
            Some("control") => bench_control(),
            Some(which @ ("fabric" | "storage")) => bench_clusters(which, &args[2..]),
            Some("peering") => bench_peering(&args[2..]),
            Some(which @ ("offload" | "reflection")) => bench_offload(which, &args[2..]),
            _ => {
                eprint!("{USAGE}");
                return ExitCode::from(2);
            }
        },
        Some("-h" | "--help" | "help") => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => {
            eprint!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match res {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------------------------
// helpers

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_owned()
}

fn target_dir() -> PathBuf {
    match env::var_os("CARGO_TARGET_DIR") {
        Some(d) => {
            let d = PathBuf::from(d);
            if d.is_absolute() {
                d
            } else {
                workspace_root().join(d)
            }
        }
        None => workspace_root().join("target"),
    }
}

/// The cargo that runs us (so `cargo +toolchain xtask` stays on that toolchain).
fn cargo() -> Command {
    let mut c = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(workspace_root());
    // A CI run builds everything once from a fresh clone: incremental compilation's caches
    // (gigabytes under target/debug/incremental) are written for no later build to read.
    if env::var_os("CI").is_some() && env::var_os("CARGO_INCREMENTAL").is_none() {
        c.env("CARGO_INCREMENTAL", "0");
    }
    c
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc_geteuid() == 0 }
}

unsafe extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

fn step(msg: &str) {
    use std::io::IsTerminal as _;
    if std::io::stdout().is_terminal() {
        println!("\x1b[1m==> {msg}\x1b[0m");
    } else {
        println!("==> {msg}");
    }
    let _ = std::io::stdout().flush();
}

fn show(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs a command with inherited stdio; fails on a non-zero exit.
fn run(cmd: &mut Command) -> Result<()> {
    let desc = show(cmd);
    println!("    $ {desc}");
    let st = cmd.status().with_context(|| format!("starting `{desc}`"))?;
    if !st.success() {
        bail!("`{desc}` failed: {st}");
    }
    Ok(())
}

/// Whether a command runs and exits 0 (output discarded).
fn works<I, S>(prog: &str, args: I) -> bool
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn output(cmd: &mut Command) -> Result<String> {
    let desc = show(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("starting `{desc}`"))?;
    if !out.status.success() {
        bail!(
            "`{desc}` failed: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

// ---------------------------------------------------------------------------------------------
// test

fn agent_bin() -> PathBuf {
    target_dir().join("debug").join("fabric-agent")
}

/// The whole workspace but `fabric-ebpf`, which builds only for the bpf target (the data
/// plane's build script does that): built for the host it would be compiled for nothing.
fn workspace_args() -> [String; 3] {
    ["--workspace", "--exclude", "fabric-ebpf"].map(String::from)
}

fn build_bins(pkgs: &[&str]) -> Result<()> {
    let mut c = cargo();
    // --locked: build exactly what Cargo.lock names (supply chain), never a fresh resolution.
    c.args(["build", "--locked"]);
    if pkgs.is_empty() {
        c.args(workspace_args());
    } else {
        for p in pkgs {
            c.args(["-p", p]);
        }
    }
    c.arg("--bins");
    run(&mut c).context("building the binaries")
}

#[derive(Default)]
struct Totals {
    passed: u64,
    failed: u64,
    ignored: u64,
    measured: u64,
    filtered: u64,
}

fn parse_count(line: &str, what: &str) -> u64 {
    // "... 12 passed; 0 failed; ..." -> the number before `what`.
    line.split(';')
        .find_map(|part| {
            let mut w = part.split_whitespace().rev();
            let name = w.next()?;
            let n = w.next()?;
            (name == what).then(|| n.parse().ok()).flatten()
        })
        .unwrap_or(0)
}

fn test(extra: &[String]) -> Result<ExitCode> {
    let start = Instant::now();
    setup()?;
    if !is_root() {
        println!(
            "    note: not root; the network-namespace tests will skip themselves (run as root for the full suite)"
        );
    }
    step("build: all binaries (the integration tests drive target/debug/fabric-agent)");
    build_bins(&[])?;
    // `cargo xtask test ARGS -- TEST-ARGS`: ARGS select what cargo builds (as for `cargo
    // test`), TEST-ARGS go to every test binary (a name filter, `--ignored`, ...).
    let (cargo_args, test_args) = match extra.iter().position(|a| a == "--") {
        Some(i) => (&extra[..i], &extra[i + 1..]),
        None => (extra, &[][..]),
    };
    step("test: build every test binary (cargo test --no-run)");
    let mut cargo_args = cargo_args.to_vec();
    if !cargo_args
        .iter()
        .any(|a| a == "-p" || a == "--package" || a.starts_with("--package="))
    {
        cargo_args = workspace_args().into_iter().chain(cargo_args).collect();
    }
    cargo_args.insert(0, "--locked".into());
    let bins = testrun::build(cargo(), &cargo_args)?;
    let lanes = env::var("FABRIC_TEST_LANES")
        .ok()
        .and_then(|l| l.parse().ok())
        .unwrap_or(DEFAULT_LANES);
    let phases = target_dir().join("xtask-test-phases.tsv");
    let _ = std::fs::remove_file(&phases);
    let servers = target_dir().join("xtask-test-api-servers.tsv");
    let _ = std::fs::remove_file(&servers);
    let envs = vec![
        (
            "FABRIC_AGENT_BIN".to_owned(),
            agent_bin().to_string_lossy().into_owned(),
        ),
        (
            "FABRIC_TEST_PHASES".to_owned(),
            phases.to_string_lossy().into_owned(),
        ),
        (
            "FABRIC_TEST_API_SERVERS".to_owned(),
            servers.to_string_lossy().into_owned(),
        ),
    ];
    let nbins = bins.len();
    let jobs = testrun::jobs(bins, test_args, &envs);
    step(&format!(
        "test: {nbins} test binaries, {} jobs (integration tests one process each) in {lanes} \
         lanes (FABRIC_TEST_LANES)",
        jobs.len()
    ));
    let running = Instant::now();
    let stat = || {
        std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| testrun::machine_cpu(&s))
    };
    let cpu_before = stat();
    let outcomes = testrun::run(jobs, lanes, test_args, &envs);
    let busy = cpu_before
        .zip(stat())
        .and_then(|(b, a)| testrun::busy_share(b, a));
    let ran = running.elapsed().as_secs_f64();
    let secs = start.elapsed().as_secs_f64();
    let mut totals = Totals::default();
    let mut cpu = 0.0;
    println!();
    println!("==> summary (setup + build + test in {secs:.0}s)");
    for o in &outcomes {
        let r = o
            .result
            .as_deref()
            .unwrap_or("no result line: the binary crashed or was killed");
        totals.passed += parse_count(r, "passed");
        totals.failed += parse_count(r, "failed");
        totals.ignored += parse_count(r, "ignored");
        totals.measured += parse_count(r, "measured");
        // A test run alone filters out its binary's others, which run in jobs of their own.
        if !o.single {
            totals.filtered += parse_count(r, "out");
        }
        let used = o.cpu.map(|c| c.as_secs_f64());
        cpu += used.unwrap_or_default();
        println!(
            "    {:<64} {:>6.1}s {:>6} cpu  {}{}",
            o.label,
            o.elapsed.as_secs_f64(),
            used.map(|c| format!("{c:.1}s")).unwrap_or_default(),
            if o.success { "" } else { "FAILED: " },
            r.trim_start_matches("test result: ")
        );
    }
    println!(
        "    ran {} jobs in {ran:.0}s in {lanes} lanes; their processes used {cpu:.0}s of CPU \
         (not counting the API servers they started)",
        outcomes.len()
    );
    let cost = testrun::api_server_cost(&std::fs::read_to_string(&servers).unwrap_or_default(), 8);
    if let Some(c) = cost {
        // The servers are daemons of the start script, outside the jobs' CPU figures.
        println!(
            "    the tests started {} API servers (kubelite and etcd); they used {:.0}s of CPU \
             ({:.1}s each, alive {:.0}s each on average); the tests whose servers used most:",
            c.servers,
            c.cpu,
            c.cpu / c.servers as f64,
            c.alive / c.servers as f64
        );
        for (test, n, cpu) in c.top {
            println!("      {cpu:>6.1}s  {n:>2} servers  {test}");
        }
    }
    let slow = testrun::slowest_phases(&std::fs::read_to_string(&phases).unwrap_or_default(), 15);
    if !slow.is_empty() {
        // Where the long tests spend their time: what to shorten first.
        println!("    the slowest phases of the long tests:");
        for l in slow {
            println!("      {l}");
        }
    }
    if let Some(b) = busy {
        // Says whether more lanes could help: a machine busy near 100% gains nothing from them.
        println!(
            "    the machine's CPUs ({}) were busy {:.0}% of that time (everything on it: \
             tests, API servers, anything else)",
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            b * 100.0
        );
    }
    let crashed = outcomes.iter().filter(|o| !o.success).count();
    let ok = crashed == 0 && totals.failed == 0;
    // Last line, in cargo test's own format.
    println!(
        "test result: {}. {} passed; {} failed; {} ignored; {} measured; {} filtered out; finished in {secs:.2}s",
        if ok { "ok" } else { "FAILED" },
        totals.passed,
        totals.failed,
        totals.ignored,
        totals.measured,
        totals.filtered
    );
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

// ---------------------------------------------------------------------------------------------
// demo, bench

/// Runs one of our binaries as a child; Ctrl-C reaches it too (same process group), and we
/// wait for it to finish its cleanup instead of dying first.
fn run_child(bin: &Path, args: &[String]) -> Result<ExitCode> {
    run_child_with_agent(bin, args, &agent_bin())
}

/// [`run_child`] with the agent binary `agent` (of the same build as `bin`).
fn run_child_with_agent(bin: &Path, args: &[String], agent: &Path) -> Result<ExitCode> {
    run_child_with_env(bin, args, agent, &[])
}

/// [`run_child_with_agent`] with more environment variables.
fn run_child_with_env(
    bin: &Path,
    args: &[String],
    agent: &Path,
    env: &[(&str, PathBuf)],
) -> Result<ExitCode> {
    let _ = ctrlc::set_handler(|| {});
    let mut c = Command::new(bin);
    c.args(args).env("FABRIC_AGENT_BIN", agent);
    c.envs(env.iter().map(|(k, v)| (k, v)));
    println!("    $ {}", show(&c));
    let st = c
        .status()
        .with_context(|| format!("starting {}", bin.display()))?;
    Ok(if st.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn need_root(what: &str) -> Result<()> {
    if !is_root() {
        bail!("{what} creates network namespaces and loads eBPF programs: run it as root");
    }
    Ok(())
}

fn demo(args: &[String]) -> Result<ExitCode> {
    need_root("the demo")?;
    setup()?;
    step("build: all binaries (same feature set as `cargo xtask test`, so nothing rebuilds twice)");
    build_bins(&[])?;
    step("demo");
    run_child(&target_dir().join("debug/demo"), args)
}

fn bench_datapath(args: &[String]) -> Result<ExitCode> {
    need_root("the benchmark")?;
    setup()?;
    step("build: all binaries (same feature set as `cargo xtask test`, so nothing rebuilds twice)");
    build_bins(&[])?;
    step("bench datapath");
    let mut a = vec!["datapath".to_owned()];
    a.extend(args.iter().filter(|a| *a != "--").cloned());
    run_child(&target_dir().join("debug/fabric-bench"), &a)
}

fn bench_gateway(args: &[String]) -> Result<ExitCode> {
    need_root("the benchmark")?;
    setup()?;
    step(
        "build: the gateway benchmark, which runs the gateway's code (release: this measures speed)",
    );
    run(cargo().args([
        "build",
        "--locked",
        "--release",
        "-p",
        "fabric-bench",
        "--bin",
        "fabric-gateway-bench",
    ]))
    .context("building the gateway benchmark")?;
    step("bench gateway");
    let a: Vec<String> = args.iter().filter(|a| *a != "--").cloned().collect();
    run_child(&target_dir().join("release/fabric-gateway-bench"), &a)
}

/// Every binary the two-cluster fixture runs, in release mode with `-- --release` (the
/// gateway's and the agent's speed is what it measures).
/// `bench fabric` and `bench storage`: both run on the netns fixture's clusters with every
/// binary of the workspace, in the build `--release` chooses.
fn bench_clusters(which: &str, args: &[String]) -> Result<ExitCode> {
    need_root("the benchmark")?;
    setup()?;
    let release = args.iter().any(|a| a == "--release");
    let profile = if release { "release" } else { "debug" };
    step(&format!("build: all binaries ({profile})"));
    let mut c = cargo();
    c.args(["build", "--locked"]);
    if release {
        c.arg("--release");
    }
    c.args(workspace_args()).arg("--bins");
    run(&mut c).context("building the binaries")?;
    let env: Vec<(&str, PathBuf)> = if which == "fabric" {
        step("setup: wireguard-go (Debian sid's, for the wireguard-go column)");
        // Without it the bench still runs, and says the column was not measured.
        match wggo::wireguard_go() {
            Ok(bin) => vec![("WIREGUARD_GO", bin)],
            Err(e) => {
                println!("    wireguard-go unavailable, its column is skipped: {e:#}");
                vec![]
            }
        }
    } else {
        vec![]
    };
    step(&format!("bench {which}"));
    let mut a = vec![which.to_owned()];
    a.extend(
        args.iter()
            .filter(|a| *a != "--" && *a != "--release")
            .cloned(),
    );
    run_child_with_env(
        &target_dir().join(profile).join("fabric-bench"),
        &a,
        &target_dir().join(profile).join("fabric-agent"),
        &env,
    )
}

fn bench_control() -> Result<ExitCode> {
    need_root("the benchmark")?;
    setup()?;
    step("build: all binaries");
    build_bins(&[])?;
    step("bench control");
    run_child(
        &target_dir().join("debug/fabric-bench"),
        &["control".to_owned()],
    )
}

/// Needs no root: two API servers and processes on the host.
fn bench_peering(args: &[String]) -> Result<ExitCode> {
    step("build: all binaries");
    build_bins(&[])?;
    step("bench peering");
    let mut a = vec!["peering".to_owned()];
    a.extend(args.iter().filter(|a| *a != "--").cloned());
    run_child(&target_dir().join("debug/fabric-bench"), &a)
}

/// `bench offload` or `bench reflection` (`which`), on the same stack: needs no root, two API
/// servers, processes on the host and a hollow test node.
fn bench_offload(which: &str, args: &[String]) -> Result<ExitCode> {
    let release = args.iter().any(|a| a == "--release");
    if release {
        // Only what the bench runs (the API servers are kubelite's): the controllers, the
        // virtual kubelet, the hollow node and the bench, which finds them beside itself.
        step(&format!(
            "build: the {which} benchmark's binaries (release)"
        ));
        run(cargo().args([
            "build",
            "--locked",
            "--release",
            "-p",
            "fabric-controller",
            "-p",
            "fabric-virtual-kubelet",
            "-p",
            "fabric-tests",
            "-p",
            "fabric-bench",
            "--bin",
            "fabric-controller",
            "--bin",
            "fabric-virtual-kubelet",
            "--bin",
            "fabric-test-node",
            "--bin",
            "fabric-bench",
        ]))
        .context("building the binaries")?;
    } else {
        step("build: all binaries");
        build_bins(&[])?;
    }
    step(&format!("bench {which}"));
    let mut a = vec![which.to_owned()];
    a.extend(
        args.iter()
            .filter(|a| *a != "--" && *a != "--release")
            .cloned(),
    );
    let profile = if release { "release" } else { "debug" };
    run_child(&target_dir().join(profile).join("fabric-bench"), &a)
}

fn codegen() -> Result<ExitCode> {
    step("codegen: deploy/crds from fabric-api");
    run(cargo()
        .args([
            "run",
            "--locked",
            "-q",
            "-p",
            "fabric-api",
            "--bin",
            "fabric-crds",
            "--",
        ])
        .arg(workspace_root().join("deploy/crds")))
    .context("generating CRDs")?;
    Ok(ExitCode::SUCCESS)
}

// ---------------------------------------------------------------------------------------------
// fuzz

fn fuzz_dir() -> PathBuf {
    workspace_root().join("fuzz")
}

/// The targets: one file each in fuzz/fuzz_targets.
fn fuzz_targets() -> Result<Vec<String>> {
    let dir = fuzz_dir().join("fuzz_targets");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            Some(name.strip_suffix(".rs")?.to_owned())
        })
        .collect();
    names.sort();
    Ok(names)
}

fn setup_cargo_fuzz(nightly: &str) -> Result<()> {
    if works("rustup", ["run", nightly, "cargo", "fuzz", "--version"]) {
        println!("    cargo-fuzz: present");
        return Ok(());
    }
    run(cargo().args(["install", "cargo-fuzz", "--locked"])).context("installing cargo-fuzz")
}

/// `fuzz TARGET [--time SECONDS] [-- ARGS]`: splits the arguments.
fn fuzz_args(args: &[String]) -> Result<(String, u64, Vec<String>)> {
    let (ours, libfuzzer) = match args.iter().position(|a| a == "--") {
        Some(i) => (&args[..i], args[i + 1..].to_vec()),
        None => (args, Vec::new()),
    };
    let mut target = None;
    let mut secs = 60;
    let mut it = ours.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--time" => {
                let v = it.next().context("--time needs a number of seconds")?;
                secs = v
                    .parse()
                    .with_context(|| format!("--time {v:?}: not a number of seconds"))?;
            }
            t if target.is_none() && !t.starts_with('-') => target = Some(t.to_owned()),
            other => bail!("unexpected argument {other:?}\n{USAGE}"),
        }
    }
    let target = target.with_context(|| format!("which target?\n{USAGE}"))?;
    Ok((target, secs, libfuzzer))
}

fn fuzz(args: &[String]) -> Result<ExitCode> {
    let targets = fuzz_targets()?;
    if args.first().map(String::as_str) == Some("--list") {
        for t in &targets {
            println!("{t}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let (target, secs, extra) = fuzz_args(args)?;
    if !targets.contains(&target) {
        bail!(
            "no fuzz target {target:?}; the targets are: {}",
            targets.join(", ")
        );
    }
    step("setup: nightly toolchain and cargo-fuzz");
    let (nightly, _) = setup_nightly()?;
    setup_cargo_fuzz(&nightly)?;
    // libFuzzer adds what it finds to the first directory (not committed) and only reads
    // the committed seeds.
    let dir = fuzz_dir();
    let corpus = dir.join("corpus").join(&target);
    std::fs::create_dir_all(&corpus).with_context(|| format!("creating {}", corpus.display()))?;
    step(&format!("fuzz {target} for {secs} s"));
    let mut c = Command::new("rustup");
    c.current_dir(&dir)
        .args(["run", &nightly, "cargo", "fuzz", "run", &target])
        .arg(&corpus)
        .arg(dir.join("seeds").join(&target))
        .arg("--")
        .arg(format!("-max_total_time={secs}"))
        .args(extra);
    // The cargo and rustc that run xtask are stable ones; cargo-fuzz must use nightly's.
    for var in ["CARGO", "RUSTC", "RUSTDOC", "RUSTUP_TOOLCHAIN"] {
        c.env_remove(var);
    }
    run(&mut c).with_context(|| {
        format!(
            "fuzzing {target} (a crashing input is in fuzz/artifacts/{target}/; replay it in \
             fuzz/ with `rustup run {nightly} cargo fuzz run {target} artifacts/{target}/FILE`)"
        )
    })?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn fuzz_arguments() {
        let (t, secs, extra) = fuzz_args(&args(&["segment"])).unwrap();
        assert_eq!((t.as_str(), secs, extra.len()), ("segment", 60, 0));
        let (t, secs, extra) =
            fuzz_args(&args(&["--time", "5", "uapi", "--", "-max_len=100"])).unwrap();
        assert_eq!((t.as_str(), secs), ("uapi", 5));
        assert_eq!(extra, ["-max_len=100"]);
        assert!(fuzz_args(&args(&[])).is_err());
        assert!(fuzz_args(&args(&["uapi", "--time"])).is_err());
        assert!(fuzz_args(&args(&["uapi", "--time", "soon"])).is_err());
        assert!(fuzz_args(&args(&["uapi", "config"])).is_err());
    }

    #[test]
    fn fuzz_targets_are_listed() {
        let t = fuzz_targets().unwrap();
        assert!(
            t.contains(&"segment".to_owned()) && t.contains(&"uapi".to_owned()),
            "{t:?}"
        );
    }
}
