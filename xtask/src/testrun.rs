//! `cargo xtask test`'s runner: cargo builds every test binary once, then the tests run in
//! parallel lanes, longest first.
//!
//! Why not plain `cargo test`: it runs one binary after the other, and most of the suite's time
//! is spent in end-to-end tests that wait on API servers, tunnels and timers rather than on the
//! CPU; several of them side by side take little more than one.
//!
//! The unit of work is a [`Job`]: a whole binary for unit tests (a library's or a binary's
//! harness: milliseconds per test), one test in a process of its own for integration tests
//! (`BIN --exact NAME`, the names from `BIN --list`). `fabric-tests` keeps its end-to-end tests
//! in one binary per tier, each scenario a module; run whole, such a binary would be one lane's
//! work for minutes. A process per test balances the lanes at the grain of a test, and a crash
//! (an abort, a fixture that hangs in its `Drop`) stays that test's. Each job's output is kept
//! whole and printed when it ends, in cargo's own format (a `Running` line, then what the
//! binary printed), so a failure reads as it would under `cargo test`.
//!
//! Durations of the last run are kept in `target/xtask-test-durations.tsv` to start the longest
//! jobs first; a fresh clone (CI) has none, and takes the checked-in baseline
//! `xtask/test-durations.tsv` instead (without it, ties broken by name started the slowest
//! test last, and the suite waited on it alone at the end).
use std::{
    collections::HashMap,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex, mpsc},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

/// One test executable as cargo reported it.
#[derive(Debug, Clone)]
pub struct Binary {
    /// `package: path/of/the/target.rs`, stable across builds (the summary's and the durations
    /// file's key).
    pub label: String,
    pub exe: PathBuf,
    /// The package's directory: cargo runs test binaries there.
    pub dir: PathBuf,
    pub package: String,
    pub crate_name: String,
    /// An integration test (`tests/*.rs`, `tests/*/main.rs`) rather than unit tests of a lib
    /// or bin.
    pub integration: bool,
}

/// What a lane runs: a whole binary, or one test of it alone.
#[derive(Debug, Clone)]
pub struct Job {
    /// The binary's label, and for one test its name after a space.
    pub label: String,
    pub bin: Arc<Binary>,
    /// Run only this test (`--exact`).
    pub test: Option<String>,
    pub integration: bool,
}

/// What one job did.
#[derive(Debug)]
pub struct Outcome {
    pub label: String,
    pub success: bool,
    /// cargo's `test result: ...` line, when the binary got that far.
    pub result: Option<String>,
    pub elapsed: Duration,
    /// CPU time of the test process and the children it waited for (not of daemons it
    /// started and left to others, such as the API servers' etcd and kubelite).
    pub cpu: Option<Duration>,
    /// One test of a binary run alone: its "filtered out" are the binary's other tests.
    pub single: bool,
}

/// Parses one line of `cargo test --no-run --message-format=json`: a test executable, if the
/// line announces one.
pub fn parse_artifact(line: &str) -> Option<Binary> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    if v["reason"] != "compiler-artifact" || v["profile"]["test"] != true {
        return None;
    }
    let exe = PathBuf::from(v["executable"].as_str()?);
    let manifest = Path::new(v["manifest_path"].as_str()?);
    let dir = manifest.parent()?.to_owned();
    let target = &v["target"];
    let src = Path::new(target["src_path"].as_str()?);
    let package = package_name(v["package_id"].as_str()?, &dir);
    let rel = src.strip_prefix(&dir).unwrap_or(src);
    let integration = target["kind"]
        .as_array()
        .is_some_and(|k| k.iter().any(|k| k == "test"));
    Some(Binary {
        label: format!("{package}: {}", rel.display()),
        exe,
        dir,
        package,
        crate_name: target["name"].as_str()?.replace('-', "_"),
        integration,
    })
}

/// The package's name from a package id: `path+file:///x/fabric-api#0.1.0` (name = the
/// directory's) or `path+file:///x/y#name@0.1.0`; the manifest's directory name otherwise.
fn package_name(id: &str, dir: &Path) -> String {
    let frag = id.rsplit_once('#').map(|(_, f)| f).unwrap_or_default();
    match frag.split_once('@') {
        Some((name, _)) if !name.is_empty() => name.to_owned(),
        _ => dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    }
}

/// Builds the test binaries (`cargo_args` select them, as for `cargo test`) and lists them.
/// cargo's human diagnostics go to our stderr as they come.
pub fn build(mut cargo: Command, cargo_args: &[String]) -> Result<Vec<Binary>> {
    cargo
        .args([
            "test",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .args(cargo_args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    println!("    $ {}", super::show(&cargo));
    let mut child = cargo.spawn().context("starting cargo test --no-run")?;
    let out = child.stdout.take().context("cargo's stdout")?;
    let mut bins = Vec::new();
    for line in BufReader::new(out).lines() {
        let line = line.context("reading cargo's messages")?;
        if let Some(b) = parse_artifact(&line) {
            bins.push(b);
        }
    }
    let st = child.wait().context("waiting for cargo test --no-run")?;
    if !st.success() {
        bail!("building the tests failed ({st})");
    }
    Ok(bins)
}

/// The command that runs `b` as cargo would: in its package's directory, with the variables
/// cargo sets for a test binary at run time.
fn command(b: &Binary, envs: &[(String, String)]) -> Command {
    let mut c = Command::new(&b.exe);
    c.current_dir(&b.dir)
        .env("CARGO_MANIFEST_DIR", &b.dir)
        .env("CARGO_PKG_NAME", &b.package)
        .env("CARGO_CRATE_NAME", &b.crate_name)
        .envs(envs.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null());
    c
}

/// The tests of a binary, as `BIN --list --format terse` prints them (`name: test`).
pub fn parse_list(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_owned)
        .collect()
}

/// The jobs for `bins`: with no test arguments, a job per test of each integration binary and
/// one per unit-test binary; with test arguments (a filter, `--ignored`, ...), which the
/// binaries interpret themselves, one job per binary.
pub fn jobs(bins: Vec<Binary>, test_args: &[String], envs: &[(String, String)]) -> Vec<Job> {
    let mut jobs = Vec::new();
    for b in bins {
        let b = Arc::new(b);
        let whole = Job {
            label: b.label.clone(),
            bin: Arc::clone(&b),
            test: None,
            integration: b.integration,
        };
        if !b.integration || !test_args.is_empty() {
            jobs.push(whole);
            continue;
        }
        let listed = command(&b, envs)
            .args(["--list", "--format", "terse"])
            .stderr(Stdio::inherit())
            .output();
        match listed {
            Ok(o) if o.status.success() => {
                for name in parse_list(&String::from_utf8_lossy(&o.stdout)) {
                    jobs.push(Job {
                        label: format!("{} {name}", b.label),
                        bin: Arc::clone(&b),
                        test: Some(name),
                        integration: true,
                    });
                }
            }
            // Run whole: its own output says why it cannot list.
            _ => jobs.push(whole),
        }
    }
    jobs
}

fn durations_file(target: &Path) -> PathBuf {
    target.join("xtask-test-durations.tsv")
}

/// The checked-in per-job times, for jobs this target has not run yet.
const BASELINE: &str = include_str!("../test-durations.tsv");

/// `label<TAB>seconds` lines; `#` comments and anything unparsable skipped.
fn parse_durations(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (label, secs) = l.rsplit_once('\t')?;
            Some((label.to_owned(), secs.trim().parse().ok()?))
        })
        .collect()
}

/// The last local run's times over the baseline's.
fn load_durations(target: &Path) -> HashMap<String, f64> {
    let mut known = parse_durations(BASELINE);
    known.extend(parse_durations(
        &std::fs::read_to_string(durations_file(target)).unwrap_or_default(),
    ));
    known
}

/// The last local run's times only (what is saved back).
fn load_local_durations(target: &Path) -> HashMap<String, f64> {
    parse_durations(&std::fs::read_to_string(durations_file(target)).unwrap_or_default())
}

fn save_durations(target: &Path, outcomes: &[Outcome]) {
    let mut known = load_local_durations(target);
    for o in outcomes {
        known.insert(o.label.clone(), o.elapsed.as_secs_f64());
    }
    let mut lines: Vec<String> = known
        .into_iter()
        .map(|(l, s)| format!("{l}\t{s:.2}"))
        .collect();
    lines.sort();
    let _ = std::fs::write(durations_file(target), lines.join("\n") + "\n");
}

/// Longest first by the last run's durations; unknown ones as if integration tests took a
/// minute and unit tests nothing, so that a fresh clone still starts the slow ones early.
pub fn order(mut jobs: Vec<Job>, known: &HashMap<String, f64>) -> Vec<Job> {
    let guess = |j: &Job| {
        known
            .get(&j.label)
            .copied()
            .unwrap_or(if j.integration { 60.0 } else { 0.0 })
    };
    jobs.sort_by(|a, b| guess(b).total_cmp(&guess(a)).then(a.label.cmp(&b.label)));
    jobs
}

/// `struct rusage` of Linux on 64-bit targets: the two times, then 14 longs we do not read.
#[repr(C)]
#[derive(Default)]
struct Rusage {
    utime: [i64; 2],
    stime: [i64; 2],
    _rest: [i64; 14],
}

unsafe extern "C" {
    fn wait4(pid: i32, status: *mut i32, options: i32, usage: *mut Rusage) -> i32;
}

/// Waits for `child` as `Child::wait` would, and reports its CPU time too (its own and that of
/// the children it waited for), which std does not give.
fn wait_with_cpu(child: std::process::Child) -> (bool, Option<Duration>) {
    let pid = child.id() as i32;
    let (mut status, mut ru) = (0, Rusage::default());
    loop {
        // SAFETY: `child` is ours and not waited for yet; both pointers are to live locals.
        let r = unsafe { wait4(pid, &mut status, 0, &mut ru) };
        if r == pid {
            break;
        }
        if r < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        return (false, None);
    }
    let secs = |t: [i64; 2]| Duration::from_secs(t[0] as u64) + Duration::from_micros(t[1] as u64);
    // Exited normally with status 0.
    (status == 0, Some(secs(ru.utime) + secs(ru.stime)))
}

fn run_one(j: &Job, test_args: &[String], envs: &[(String, String)]) -> (Outcome, Vec<u8>) {
    let start = Instant::now();
    let mut out = Vec::new();
    let b = &j.bin;
    let rel = b
        .exe
        .strip_prefix(super::workspace_root())
        .unwrap_or(&b.exe);
    let mut c = command(b, envs);
    c.env("FABRIC_TEST_JOB", &j.label);
    match &j.test {
        Some(name) => {
            let _ = writeln!(
                out,
                "     Running {} ({} --exact {name})",
                j.label,
                rel.display()
            );
            c.args(["--exact", name]);
        }
        None => {
            let _ = writeln!(out, "     Running {} ({})", j.label, rel.display());
            c.args(test_args);
        }
    }
    let (success, cpu) = match std::io::pipe() {
        Ok((mut reader, writer)) => {
            let spawned = writer
                .try_clone()
                .and_then(|w| c.stdout(w).stderr(writer).spawn());
            drop(c);
            match spawned {
                Ok(child) => {
                    let _ = reader.read_to_end(&mut out);
                    wait_with_cpu(child)
                }
                Err(e) => {
                    let _ = writeln!(out, "xtask: cannot run {}: {e}", b.exe.display());
                    (false, None)
                }
            }
        }
        Err(e) => {
            let _ = writeln!(out, "xtask: cannot make a pipe: {e}");
            (false, None)
        }
    };
    let result = String::from_utf8_lossy(&out)
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with("test result:"))
        .map(|l| l.trim().to_owned());
    let outcome = Outcome {
        label: j.label.clone(),
        success,
        result,
        elapsed: start.elapsed(),
        cpu,
        single: j.test.is_some(),
    };
    (outcome, out)
}

/// The `n` slowest test phases of a run, from the lines the tests' phase harness appends
/// (`test<TAB>phase<TAB>seconds`), slowest first, as lines to print.
pub fn slowest_phases(recorded: &str, n: usize) -> Vec<String> {
    let mut all: Vec<(f64, &str, &str)> = recorded
        .lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, '\t');
            let (test, phase, secs) = (f.next()?, f.next()?, f.next()?);
            Some((secs.trim().parse().ok()?, test, phase))
        })
        .collect();
    all.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
    all.into_iter()
        .take(n)
        .map(|(secs, test, phase)| format!("{secs:>6.1}s  {test}: {phase}"))
        .collect()
}

/// What the API servers of a run cost, from the lines the tests' fixture appends when it stops
/// one (`test<TAB>cpu seconds<TAB>seconds alive`): how many, their CPU together, and the `n`
/// tests whose servers used the most (test, servers, CPU seconds), most first.
#[derive(Debug, PartialEq)]
pub struct ApiServerCost {
    pub servers: usize,
    pub cpu: f64,
    pub alive: f64,
    pub top: Vec<(String, usize, f64)>,
}

pub fn api_server_cost(recorded: &str, n: usize) -> Option<ApiServerCost> {
    let mut per_test: HashMap<&str, (usize, f64)> = HashMap::new();
    let (mut servers, mut cpu, mut alive) = (0, 0.0, 0.0);
    for l in recorded.lines() {
        let mut f = l.splitn(3, '\t');
        let (Some(test), Some(c), Some(a)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let (Ok(c), Ok(a)) = (c.trim().parse::<f64>(), a.trim().parse::<f64>()) else {
            continue;
        };
        servers += 1;
        cpu += c;
        alive += a;
        let t = per_test.entry(test).or_default();
        t.0 += 1;
        t.1 += c;
    }
    if servers == 0 {
        return None;
    }
    let mut top: Vec<(String, usize, f64)> = per_test
        .into_iter()
        .map(|(t, (k, c))| (t.to_owned(), k, c))
        .collect();
    top.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(&b.0)));
    top.truncate(n);
    Some(ApiServerCost {
        servers,
        cpu,
        alive,
        top,
    })
}

/// The machine's CPU time so far, from `/proc/stat`'s first line: (busy, all), in ticks, busy
/// being everything but idle and iowait. Two readings tell how much of the machine a run used
/// (the API servers the tests start included, which the jobs' own CPU figures leave out).
pub fn machine_cpu(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    // user nice system idle iowait irq softirq steal (guest time is already in user/nice).
    let all: u64 = ticks.iter().take(8).sum();
    let idle = ticks.get(3)? + ticks.get(4).copied().unwrap_or(0);
    Some((all - idle, all))
}

/// The share of the machine's CPU time that was busy between two [`machine_cpu`] readings.
pub fn busy_share(before: (u64, u64), after: (u64, u64)) -> Option<f64> {
    let all = after.1.checked_sub(before.1)?;
    (all > 0).then(|| after.0.saturating_sub(before.0) as f64 / all as f64)
}

/// Runs `jobs` in `lanes` parallel lanes, printing each job's output whole when it ends.
pub fn run(
    jobs: Vec<Job>,
    lanes: usize,
    test_args: &[String],
    envs: &[(String, String)],
) -> Vec<Outcome> {
    let target = super::target_dir();
    let queue = Arc::new(Mutex::new(
        order(jobs, &load_durations(&target)).into_iter(),
    ));
    let (tx, rx) = mpsc::channel();
    let workers: Vec<_> = (0..lanes.max(1))
        .map(|_| {
            let queue = Arc::clone(&queue);
            let tx = tx.clone();
            let test_args = test_args.to_vec();
            let envs = envs.to_vec();
            thread::spawn(move || {
                loop {
                    let next = queue.lock().map(|mut q| q.next()).unwrap_or(None);
                    let Some(j) = next else { break };
                    if tx.send(run_one(&j, &test_args, &envs)).is_err() {
                        break;
                    }
                }
            })
        })
        .collect();
    drop(tx);
    let mut outcomes = Vec::new();
    for (outcome, out) in rx {
        let stdout = std::io::stdout();
        let mut o = stdout.lock();
        let _ = o.write_all(&out);
        let _ = writeln!(o);
        let _ = o.flush();
        outcomes.push(outcome);
    }
    for w in workers {
        let _ = w.join();
    }
    save_durations(&target, &outcomes);
    outcomes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slowest_phases_first() {
        let rec = "a::x\tthe bed\t12.5\nb::y\tpods talk\t40.0\nbroken line\nc::z\tq\tnot a number\na::x\tcut\t3.0\n";
        assert_eq!(
            slowest_phases(rec, 2),
            ["  40.0s  b::y: pods talk", "  12.5s  a::x: the bed"]
        );
        assert_eq!(slowest_phases(rec, 10).len(), 3);
    }

    #[test]
    fn api_servers_are_summed_and_their_costliest_tests_named() {
        let recorded = "api: a\t1.50\t10.0\napi: b\t0.50\t4.0\napi: a\t2.00\t12.0\n\
                        torn line\napi: c\tx\t1\n";
        let cost = api_server_cost(recorded, 1).unwrap();
        assert_eq!(cost.servers, 3);
        assert!((cost.cpu - 4.0).abs() < 1e-9 && (cost.alive - 26.0).abs() < 1e-9);
        assert_eq!(cost.top, vec![("api: a".to_owned(), 2, 3.5)]);
        assert_eq!(api_server_cost("", 3), None);
    }

    #[test]
    fn the_machine_s_busy_share_leaves_out_idle_and_iowait() {
        let a = machine_cpu("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3\n").unwrap();
        assert_eq!(a, (150, 1000));
        let b = machine_cpu("cpu  400 0 150 1300 150 0 0 0 0 0\n").unwrap();
        assert_eq!(b, (550, 2000));
        assert_eq!(busy_share(a, b), Some(0.4));
        assert_eq!(busy_share(a, a), None);
        assert_eq!(machine_cpu("intr 1 2\n"), None);
    }

    fn artifact(kind: &str, src: &str, test: bool, exe: Option<&str>) -> String {
        serde_json::json!({
            "reason": "compiler-artifact",
            "package_id": "path+file:///w/tests#fabric-tests@0.1.0",
            "manifest_path": "/w/tests/Cargo.toml",
            "target": {"kind": [kind], "name": "pods", "src_path": src},
            "profile": {"test": test},
            "executable": exe,
        })
        .to_string()
    }

    #[test]
    fn test_executables_are_found_and_named_by_package_and_source() {
        let b = parse_artifact(&artifact(
            "test",
            "/w/tests/tests/pods.rs",
            true,
            Some("/w/target/debug/deps/pods-0123"),
        ))
        .unwrap();
        assert_eq!(b.label, "fabric-tests: tests/pods.rs");
        assert_eq!(b.dir, PathBuf::from("/w/tests"));
        assert!(b.integration);
        // Libraries built for the tests, and non-test profiles, are not binaries to run.
        assert!(parse_artifact(&artifact("lib", "/w/tests/src/lib.rs", false, None)).is_none());
        assert!(parse_artifact(&artifact("lib", "/w/tests/src/lib.rs", true, None)).is_none());
        assert!(parse_artifact("not json").is_none());
        assert!(parse_artifact(r#"{"reason":"build-finished","success":true}"#).is_none());
    }

    #[test]
    fn package_names_come_from_the_id_or_the_directory() {
        let d = Path::new("/w/fabric-api");
        assert_eq!(
            package_name("path+file:///w/fabric-api#0.1.0", d),
            "fabric-api"
        );
        assert_eq!(
            package_name("path+file:///w/tests#fabric-tests@0.1.0", d),
            "fabric-tests"
        );
    }

    #[test]
    fn every_line_of_the_baseline_counts() {
        let known = parse_durations(BASELINE);
        let lines = BASELINE
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .count();
        assert_eq!(known.len(), lines, "{known:?}");
        assert!(known.keys().all(|l| l.contains(": ")), "{known:?}");
        let parsed = parse_durations("# a comment\tno\na: b.rs\t12\nbroken\n");
        assert_eq!(parsed, HashMap::from([("a: b.rs".to_owned(), 12.0)]));
    }

    fn job(label: &str, integration: bool) -> Job {
        Job {
            label: label.into(),
            bin: Arc::new(Binary {
                label: label.into(),
                exe: PathBuf::new(),
                dir: PathBuf::new(),
                package: String::new(),
                crate_name: String::new(),
                integration,
            }),
            test: None,
            integration,
        }
    }

    #[test]
    fn the_longest_known_go_first_then_integration_tests() {
        let known = HashMap::from([("a".to_owned(), 5.0), ("b".to_owned(), 90.0)]);
        let got: Vec<String> = order(
            vec![
                job("unit", false),
                job("a", true),
                job("new", true),
                job("b", true),
            ],
            &known,
        )
        .into_iter()
        .map(|j| j.label)
        .collect();
        assert_eq!(got, ["b", "new", "a", "unit"]);
    }

    #[test]
    fn a_binary_lists_its_tests_tersely() {
        let listed = "offload::pods_come_home: test\nreaper::killed: test\nbench_x: benchmark\n\n";
        assert_eq!(
            parse_list(listed),
            ["offload::pods_come_home", "reaper::killed"]
        );
        assert!(parse_list("error: no such binary").is_empty());
    }

    #[test]
    fn with_test_arguments_binaries_run_whole() {
        let b = Binary {
            label: "fabric-tests: tests/api/main.rs".into(),
            exe: PathBuf::from("/nonexistent/api"),
            dir: PathBuf::from("/"),
            package: "fabric-tests".into(),
            crate_name: "api".into(),
            integration: true,
        };
        // A filter is the binary's to apply: no listing, one job.
        let got = jobs(vec![b.clone()], &["offload".to_owned()], &[]);
        assert_eq!(got.len(), 1);
        assert!(got[0].test.is_none());
        // One that cannot list its tests runs whole too (its own output says why).
        let got = jobs(vec![b], &[], &[]);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].label, "fabric-tests: tests/api/main.rs");
    }

    #[test]
    fn a_child_is_waited_for_with_its_status_and_cpu() {
        let ok = Command::new("true").spawn().unwrap();
        let (success, cpu) = wait_with_cpu(ok);
        assert!(success);
        assert!(cpu.is_some());
        let failed = Command::new("sh").args(["-c", "exit 3"]).spawn().unwrap();
        assert!(!wait_with_cpu(failed).0);
    }
}
