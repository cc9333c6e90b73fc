//! A test run that is SIGKILLed cannot clean up after itself. Its children die with it; its own
//! reaper (a watcher started with its first fixture) ends the daemons (an API server and its
//! etcd) and removes its namespaces with their devices, pin directories and scratch directories
//! with keys and state; the next run's reaper removes what is named otherwise.
use std::{
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use fabric_tests::{Testbed, apiserver, skip_unless_root};
use serde_json::{Value, json};

/// Where the child run writes what it created (set only for the child).
const MANIFEST_ENV: &str = "FABRIC_REAPER_TEST_MANIFEST";

/// Whether a process runs (a zombie, dead but not yet reaped by its new parent, does not).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

fn strings(v: &Value, key: &str) -> Vec<String> {
    v[key]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The run to be killed: builds the fixture's pieces, reports them, and waits to be killed.
#[test]
#[ignore = "the run that the other tests here kill"]
fn fixture_of_a_run_that_gets_killed() -> Result<()> {
    let manifest = PathBuf::from(std::env::var_os(MANIFEST_ENV).context(MANIFEST_ENV)?);
    let mut tb = Testbed::new()?;
    let gw = tb.add_netns("gw")?;
    // A tunnel device with a filter on it, as a gateway has.
    tb.ip(&gw, &["tuntap", "add", "mode", "tun", "name", "fab-peer"])?;
    tb.exec(&gw, &["tc", "qdisc", "add", "dev", "fab-peer", "clsact"])?;
    let pin = tb.pin_dir(&gw, "gw");
    std::fs::create_dir_all(&pin)?;
    let key = tb.write_file("gateway.key", "not really a key\n")?;
    // What a gateway of the gateway tests leaves when it is killed: its pins and UAPI socket.
    let gw_name = format!("fgw{}k", std::process::id());
    let gw_pins = PathBuf::from(format!("/sys/fs/bpf/fabric-gw-{gw_name}"));
    std::fs::create_dir_all(&gw_pins)?;
    std::fs::create_dir_all("/var/run/wireguard")?;
    let uapi = PathBuf::from(format!("/var/run/wireguard/{gw_name}.sock"));
    std::fs::write(&uapi, "")?;
    // A component inside the namespace and one outside, as the fixture starts them.
    let in_ns = tb.spawn(&gw, &["sleep", "3600"])?;
    let mut c = Command::new("sleep");
    c.arg("3600").stdin(Stdio::null());
    let host = fabric_netns::process::spawn(c)?;
    // An API server: its start script daemonizes etcd and kubelite.
    let api = apiserver::ApiServer::start("reaped");
    let api_dir = api.kubeconfig.parent().context("run dir")?.to_owned();
    let daemons: Vec<u32> = ["etcd.pid", "kubelite.pid"]
        .iter()
        .map(|f| -> Result<u32> { Ok(std::fs::read_to_string(api_dir.join(f))?.trim().parse()?) })
        .collect::<Result<_>>()?;
    let report = json!({
        "namespaces": [gw],
        "paths": [pin, key.parent().unwrap(), api_dir, gw_pins, uapi],
        "children": [in_ns.pid(), host.id()],
        "daemons": daemons,
    });
    std::fs::write(&manifest, report.to_string())?;
    std::thread::sleep(Duration::from_secs(600));
    bail!("was not killed")
}

/// How the run is killed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kill {
    /// SIGKILL to the test process alone (`kill -9 PID`).
    Process,
    /// SIGKILL to its whole process group, as a CI timeout or a terminal does: helpers of the
    /// run in that group die too, only processes that left it (daemons) survive.
    Group,
}

#[test]
fn a_killed_run_takes_its_processes_along() -> Result<()> {
    killed_run("a_killed_run_takes_its_processes_along", Kill::Process)
}

#[test]
fn what_a_killed_run_group_leaves_the_reaper_removes() -> Result<()> {
    killed_run(
        "what_a_killed_run_group_leaves_the_reaper_removes",
        Kill::Group,
    )
}

fn wait_gone(pids: &[u32], what: &str) {
    let t0 = Instant::now();
    while let Some(p) = pids.iter().find(|p| running(**p)) {
        assert!(t0.elapsed() < Duration::from_secs(5), "{what} {p} survived");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The run to be killed as the test harness names it: its path in this binary's modules.
fn child_test() -> String {
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    format!("{module}::fixture_of_a_run_that_gets_killed")
}

/// Holds an exclusive lock on a file of this test's until dropped.
fn serial() -> Result<std::fs::File> {
    use std::os::fd::AsRawFd as _;
    let f = std::fs::File::create(std::env::temp_dir().join("fabric-tests-reaper.lock"))?;
    // SAFETY: plain syscall on a descriptor we own; the lock goes with the file.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(std::io::Error::last_os_error()).context("locking the reaper tests' file");
    }
    Ok(f)
}

fn killed_run(test: &str, how: Kill) -> Result<()> {
    if skip_unless_root(test) || !apiserver::require_tools(test) {
        return Ok(());
    }
    // One at a time: one test's reaper would otherwise reap the other's killed run early. A
    // lock on a file, not a mutex: `cargo xtask test` runs each test in a process of its own.
    let _serial = serial()?;
    let dir = fabric_netns::testbed::scratch_dir(test);
    std::fs::create_dir_all(&dir)?;
    let manifest = dir.join("manifest.json");
    let mut child = Command::new(std::env::current_exe()?)
        .args(["--exact", &child_test(), "--ignored", "--nocapture"])
        .env(MANIFEST_ENV, &manifest)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("child.log"))?)
        .spawn()?;
    let t0 = Instant::now();
    while !manifest.exists() {
        if let Some(st) = child.try_wait()? {
            bail!(
                "the child run ended ({st}) before building its fixture:\n{}",
                std::fs::read_to_string(dir.join("child.log")).unwrap_or_default()
            );
        }
        anyhow::ensure!(
            t0.elapsed() < Duration::from_secs(60),
            "no fixture after 60 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The file appears before it is complete only in theory (one write of a short text).
    std::thread::sleep(Duration::from_millis(100));
    let m: Value = serde_json::from_str(&std::fs::read_to_string(&manifest)?)?;
    let namespaces = strings(&m, "namespaces");
    let paths = strings(&m, "paths");
    let pids = |k: &str| -> Vec<u32> {
        m[k].as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|p| p.as_u64().map(|p| p as u32))
                    .collect()
            })
            .unwrap_or_default()
    };
    let (children, daemons) = (pids("children"), pids("daemons"));
    assert!(
        children.len() == 2 && daemons.len() == 2 && paths.len() == 5,
        "{m}"
    );
    for p in children.iter().chain(&daemons) {
        assert!(running(*p), "{p} should run before the kill");
    }

    match how {
        Kill::Process => child.kill()?,
        // SAFETY: plain syscall; the group is the child's own (process_group(0) above).
        Kill::Group => assert_eq!(
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) },
            0
        ),
    }
    child.wait()?;

    // Children die with their parent at once. The run's own reaper, a watcher in a session of
    // its own (a kill of the group does not take it along), then ends the daemons that left
    // the process group and removes the namespaces, pin and scratch directories, without
    // waiting for a next run.
    wait_gone(&children, "child");
    wait_gone(&daemons, "API server daemon");
    let t0 = Instant::now();
    // The first three paths are the run's pin, scratch and API server directories; the gateway
    // pins and socket are named otherwise and left to the next run.
    let own = &paths[..3];
    while let Some(left) = namespaces
        .iter()
        .find(|ns| fabric_netns::path_of(ns).exists())
        .or_else(|| own.iter().find(|p| Path::new(p).exists()))
    {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{left} survived the run's own reaper"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // The next run's reaper removes the rest.
    fabric_netns::testbed::reap_stale_now();
    for p in &paths {
        assert!(!Path::new(p).exists(), "{p} survived the reaper");
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
