//! A test bed of network namespaces with unique names and guaranteed cleanup.
//!
//! Everything a [`Testbed`] creates is named `fabt-<pid>-<n>-<role>` (namespaces) or
//! `/sys/fs/bpf/fabric-test-<pid>-<n>-<tag>` (pin directories) and kept in a scratch directory
//! `<tmp>/fabt-<pid>-<n>`, and removed again in `Drop`: processes still running inside our
//! namespaces, data-plane pins (through the hook given to [`Testbed::on_pin_cleanup`], then
//! `rm -r` as a fallback), the namespaces themselves (which deletes the veths in them) and the
//! scratch directory. Other fixtures name their scratch directories `fabt-<pid>-…` as well (see
//! [`scratch_dir`]).
//!
//! A test process that is killed before it can clean up (SIGKILL, a CI timeout) cannot remove
//! any of that itself; its children die with it when they were started through
//! [`crate::process::spawn`], and a watcher started with its first fixture removes its
//! namespaces, processes, pins and scratch directories once it is gone (see `reap_at_exit`).
//! The next test bed (or [`reap_stale`]) removes whatever is left: for every
//! name with our prefixes whose pid is no longer alive, it kills the processes inside its
//! namespaces and those whose command line names its scratch directories (daemons a script
//! started, such as an API server and its etcd), then deletes namespaces, pins and directories.
use std::{
    fs::File,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::{
        Mutex, OnceLock,
        atomic::{AtomicU32, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::process;

/// Prefix of every namespace a test bed creates, and of every scratch directory.
pub const NETNS_PREFIX: &str = "fabt-";
/// Prefix of every pin directory a test bed hands out.
pub const PIN_PREFIX: &str = "/sys/fs/bpf/fabric-test-";
/// Scratch directories (in the temp dir) that fixtures of earlier versions named otherwise; a
/// run killed by such a build is reaped too.
const LEGACY_SCRATCH_PREFIXES: &[&str] = &["fabric-api-"];
/// Gateway names (`<prefix><pid><letters>`, short: they become interface names) of the gateway
/// tests and the gateway benchmark. A gateway killed with its run leaves its pins
/// (`/sys/fs/bpf/fabric-gw-<name>`) and a UAPI socket (`/var/run/wireguard/<name>.sock`).
pub const GATEWAY_NAME_PREFIXES: &[&str] = &["fgw", "fgb"];
const GATEWAY_PIN_PREFIX: &str = "fabric-gw-";
const UAPI_DIR: &str = "/var/run/wireguard";

static SEQ: AtomicU32 = AtomicU32::new(0);
static REAPED: Mutex<bool> = Mutex::new(false);

/// Whether we run as root (the test beds need it).
pub fn is_root() -> bool {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A scratch directory `<tmp>/fabt-<pid>-<what>` of this process, for fixtures that live
/// outside a test bed (an API server): reaped like a test bed's when the process dies.
pub fn scratch_dir(what: &str) -> PathBuf {
    std::env::temp_dir().join(format!("{NETNS_PREFIX}{}-{what}", std::process::id()))
}

fn cmd_desc(c: &Command) -> String {
    let mut s = c.get_program().to_string_lossy().into_owned();
    for a in c.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs a command, returns its stdout; an error carries the command line and its stderr.
pub fn run(c: &mut Command) -> Result<String> {
    let desc = cmd_desc(c);
    let out = process::die_with_parent(c)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("starting `{desc}`"))?;
    if !out.status.success() {
        bail!(
            "`{desc}` failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a command and returns its output whatever the exit status.
pub fn run_any(c: &mut Command) -> Result<Output> {
    let desc = cmd_desc(c);
    process::die_with_parent(c)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("starting `{desc}`"))
}

fn ip() -> Command {
    Command::new("ip")
}

/// Makes sure /sys/fs/bpf is a BPF filesystem (a fresh machine may have an empty directory).
pub fn ensure_bpffs() -> Result<()> {
    let fs = run(Command::new("stat").args(["-f", "-c", "%T", "/sys/fs/bpf"])).unwrap_or_default();
    if fs.trim() == "bpf_fs" {
        return Ok(());
    }
    std::fs::create_dir_all("/sys/fs/bpf").context("creating /sys/fs/bpf")?;
    run(Command::new("mount").args(["-t", "bpf", "bpf", "/sys/fs/bpf"]))?;
    Ok(())
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Kills every process inside a namespace (only ever called on namespaces we created).
fn kill_netns_pids(ns: &str) {
    let Ok(out) = run(ip().args(["netns", "pids", ns])) else {
        return;
    };
    for pid in out.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
        // SAFETY: plain syscall; the pid lives in a namespace this process tree created.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// The pid in `<prefix><pid>-…` (or `<prefix><pid>` alone), when `name` has that shape.
fn owner_pid(name: &str, prefix: &str) -> Option<u32> {
    name.strip_prefix(prefix)?.split('-').next()?.parse().ok()
}

/// Whether `name` belongs to a run (not this one) whose process is gone.
fn is_stale(name: &str, prefix: &str) -> bool {
    owner_pid(name, prefix).is_some_and(stale_pid)
}

fn stale_pid(pid: u32) -> bool {
    pid != std::process::id() && !pid_alive(pid)
}

/// The pid in a gateway name `<prefix><pid><letters>` (see [`GATEWAY_NAME_PREFIXES`]).
fn gateway_owner_pid(name: &str) -> Option<u32> {
    GATEWAY_NAME_PREFIXES.iter().find_map(|p| {
        let rest = name.strip_prefix(p)?;
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        rest[..digits].parse().ok()
    })
}

/// Whether a command line (NUL-separated, as in /proc/PID/cmdline) names `dir` or something
/// inside it.
fn names_dir(cmdline: &[u8], dir: &Path) -> bool {
    let dir = dir.as_os_str().as_encoded_bytes();
    cmdline.split(|b| *b == 0).any(|arg| {
        // `--flag=DIR/...` as well as `DIR/...`.
        (0..arg.len()).any(|i| {
            (i == 0 || arg[i - 1] == b'=')
                && arg[i..].starts_with(dir)
                && matches!(arg.get(i + dir.len()), None | Some(b'/'))
        })
    })
}

/// Kills every process whose command line names one of `dirs`.
fn kill_processes_naming(dirs: &[PathBuf]) {
    if dirs.is_empty() {
        return;
    }
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        if let Some(d) = dirs.iter().find(|d| names_dir(&cmdline, d)) {
            eprintln!(
                "fabric-netns: killing {pid} ({}) of a dead run ({})",
                String::from_utf8_lossy(cmdline.split(|b| *b == 0).next().unwrap_or_default()),
                d.display()
            );
            // SAFETY: plain syscall; the process belongs to a run whose owner is dead.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Removes what earlier test processes left when they died without cleaning up: processes in
/// their namespaces or naming their scratch directories, the namespaces, pin directories and
/// scratch directories. Only names with our prefixes and a pid that no longer exists are
/// touched. Runs once per process (a test bed calls it); later calls do nothing.
pub fn reap_stale() {
    let mut done = REAPED.lock().unwrap_or_else(|e| e.into_inner());
    if *done {
        return;
    }
    *done = true;
    reap_stale_now();
    if let Err(e) = reap_at_exit() {
        eprintln!("fabric-netns: no reaper for this run ({e:#}): the next run cleans up after it");
    }
}

/// What [`reap_at_exit`]'s watcher runs once this process is gone: processes in our
/// namespaces, processes naming our scratch directories (daemons a script started with
/// `setsid`), then the namespaces, pin directories and scratch directories. The gateway pins and
/// sockets are left to the next run's [`reap_stale_now`].
const REAPER_SCRIPT: &str = r#"cat >/dev/null
pid=$1 tmp=$2 pins=$3
spaces=$(ip netns list | while read -r ns _; do case $ns in "fabt-$pid-"*) echo "$ns";; esac; done)
for ns in $spaces; do kill -KILL $(ip netns pids "$ns") 2>/dev/null; done
pkill -KILL -f -- "$tmp/fabt-$pid-"
for ns in $spaces; do ip netns del "$ns"; done
rm -rf "$pins$pid-"* "$tmp/fabt-$pid-"*
"#;

/// Starts a watcher that cleans up after this process when it ends, however it ends: it holds
/// the read end of a pipe whose write end only this process has (close-on-exec, so children
/// don't inherit it) and reads end-of-file when the process is gone. It runs in a session of its
/// own, so a kill of the whole process group (a CI timeout) does not take it along. A process
/// that cleaned up after itself leaves it nothing to do.
fn reap_at_exit() -> Result<()> {
    static WRITE_END: OnceLock<std::process::ChildStdin> = OnceLock::new();
    let tmp = std::env::temp_dir();
    let mut child = Command::new("setsid")
        .args(["sh", "-c", REAPER_SCRIPT, "fabric-reaper"])
        .arg(std::process::id().to_string())
        .arg(tmp.as_os_str())
        .arg(PIN_PREFIX)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting setsid sh")?;
    let stdin = child.stdin.take().context("the reaper's stdin")?;
    let _ = WRITE_END.set(stdin);
    Ok(())
}

/// [`reap_stale`] without the once-per-process guard.
pub fn reap_stale_now() {
    let names = |dir: &Path| -> Vec<(String, PathBuf)> {
        std::fs::read_dir(dir)
            .map(|rd| {
                rd.flatten()
                    .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
                    .collect()
            })
            .unwrap_or_default()
    };
    let scratch: Vec<PathBuf> = names(&std::env::temp_dir())
        .into_iter()
        .filter(|(n, _)| {
            std::iter::once(NETNS_PREFIX)
                .chain(LEGACY_SCRATCH_PREFIXES.iter().copied())
                .any(|p| is_stale(n, p))
        })
        .map(|(_, p)| p)
        .collect();
    // Processes first: they hold devices in the namespaces and files in the directories.
    for (name, _) in names(Path::new(crate::NETNS_RUN_DIR)) {
        if is_stale(&name, NETNS_PREFIX) {
            kill_netns_pids(&name);
        }
    }
    kill_processes_naming(&scratch);
    for (name, _) in names(Path::new(crate::NETNS_RUN_DIR)) {
        if is_stale(&name, NETNS_PREFIX) {
            eprintln!("fabric-netns: removing stale namespace {name}");
            let _ = run(ip().args(["netns", "del", &name]));
        }
    }
    let pin_name = PIN_PREFIX.trim_start_matches("/sys/fs/bpf/");
    for (name, path) in names(Path::new("/sys/fs/bpf")) {
        if is_stale(&name, pin_name) {
            eprintln!(
                "fabric-netns: removing stale pin directory {}",
                path.display()
            );
            let _ = std::fs::remove_dir_all(path);
        }
    }
    for (name, path) in names(Path::new("/sys/fs/bpf")) {
        if name
            .strip_prefix(GATEWAY_PIN_PREFIX)
            .and_then(gateway_owner_pid)
            .is_some_and(stale_pid)
        {
            eprintln!(
                "fabric-netns: removing stale gateway pins {}",
                path.display()
            );
            let _ = std::fs::remove_dir_all(path);
        }
    }
    for (name, path) in names(Path::new(UAPI_DIR)) {
        if name.ends_with(".sock") && gateway_owner_pid(&name).is_some_and(stale_pid) {
            let _ = std::fs::remove_file(path);
        }
    }
    for dir in scratch {
        eprintln!("fabric-netns: removing stale {}", dir.display());
        // Some fixtures leave plain files (logs) under the prefix.
        if std::fs::remove_dir_all(&dir).is_err() {
            let _ = std::fs::remove_file(&dir);
        }
    }
}

/// A process running in the background (usually inside a namespace). Killed and reaped on drop.
pub struct Bg {
    child: Option<Child>,
    desc: String,
    out: PathBuf,
    err: PathBuf,
}

impl Bg {
    /// Waits up to `timeout` for the process to exit and returns its output. On timeout the
    /// process is killed and an error returned.
    pub fn wait(mut self, timeout: Duration) -> Result<Output> {
        let mut child = self.child.take().expect("child present until waited");
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(st) = child.try_wait().context("waiting")? {
                break st;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("`{}` did not finish within {timeout:?}", self.desc);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Ok(Output {
            status,
            stdout: std::fs::read(&self.out).unwrap_or_default(),
            stderr: std::fs::read(&self.err).unwrap_or_default(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(&self.out);
        let _ = std::fs::remove_file(&self.err);
    }
}

/// Resets a pin directory whose data plane lives in a namespace (the namespace, the directory).
type PinCleanup = Box<dyn Fn(&str, &Path) -> Result<()> + Send>;

/// Namespaces, pin directories and scratch files of one test, removed on drop.
pub struct Testbed {
    id: String,
    namespaces: Vec<String>,
    pins: Vec<(String, PathBuf)>,
    tmp: PathBuf,
    keep_scratch: bool,
    bg_seq: u32,
    pin_cleanup: Option<PinCleanup>,
}

impl Testbed {
    /// A new, empty test bed. Fails when not root.
    pub fn new() -> Result<Self> {
        if !is_root() {
            bail!("network-namespace test beds need root");
        }
        reap_stale();
        ensure_bpffs()?;
        let id = format!(
            "{NETNS_PREFIX}{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let tmp = std::env::temp_dir().join(&id);
        std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        Ok(Self {
            id,
            namespaces: Vec::new(),
            pins: Vec::new(),
            tmp,
            keep_scratch: false,
            bg_seq: 0,
            pin_cleanup: None,
        })
    }

    /// Unique id of this bed (`fabt-<pid>-<n>`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The scratch directory (removed on drop unless [`Testbed::keep_scratch`]).
    pub fn dir(&self) -> &Path {
        &self.tmp
    }

    /// Leaves the scratch directory (logs) in place on drop, for debugging.
    pub fn keep_scratch(&mut self, keep: bool) {
        self.keep_scratch = keep;
    }

    /// How registered pin directories are reset on drop, before they are removed (the agent's
    /// `datapath reset`, which also detaches the programs).
    pub fn on_pin_cleanup(&mut self, f: impl Fn(&str, &Path) -> Result<()> + Send + 'static) {
        self.pin_cleanup = Some(Box::new(f));
    }

    /// Creates namespace `<id>-<role>` with loopback up; returns its full name.
    pub fn add_netns(&mut self, role: &str) -> Result<String> {
        let name = format!("{}-{role}", self.id);
        run(ip().args(["netns", "add", &name]))?;
        self.namespaces.push(name.clone());
        self.ip(&name, &["link", "set", "lo", "up"])?;
        Ok(name)
    }

    /// Creates a veth pair with one end in each namespace, both up.
    pub fn veth(&self, ns1: &str, if1: &str, ns2: &str, if2: &str) -> Result<()> {
        run(ip().args([
            "link", "add", "name", if1, "netns", ns1, "type", "veth", "peer", "name", if2, "netns",
            ns2,
        ]))?;
        self.ip(ns1, &["link", "set", if1, "up"])?;
        self.ip(ns2, &["link", "set", if2, "up"])?;
        Ok(())
    }

    /// A veth pair as [`Testbed::veth`], with an address (`a.b.c.d/len`) on each end.
    pub fn veth_addrs(
        &self,
        (ns1, if1, addr1): (&str, &str, &str),
        (ns2, if2, addr2): (&str, &str, &str),
    ) -> Result<()> {
        self.veth(ns1, if1, ns2, if2)?;
        self.ip(ns1, &["addr", "add", addr1, "dev", if1])?;
        self.ip(ns2, &["addr", "add", addr2, "dev", if2])?;
        Ok(())
    }

    /// Creates bridge `name` in `ns`, up.
    pub fn bridge(&self, ns: &str, name: &str) -> Result<()> {
        self.ip(ns, &["link", "add", name, "type", "bridge"])?;
        self.ip(ns, &["link", "set", name, "up"])?;
        Ok(())
    }

    /// `ip -n <ns> <args>`.
    pub fn ip(&self, ns: &str, args: &[&str]) -> Result<String> {
        run(ip().args(["-n", ns]).args(args))
    }

    /// A command to run inside `ns` (`ip netns exec`).
    pub fn cmd(&self, ns: &str, argv: &[&str]) -> Command {
        let mut c = ip();
        c.args(["netns", "exec", ns]).args(argv);
        c
    }

    /// Runs `argv` in `ns`, fails on a non-zero exit; returns stdout.
    pub fn exec(&self, ns: &str, argv: &[&str]) -> Result<String> {
        run(&mut self.cmd(ns, argv))
    }

    /// Runs `argv` in `ns` and returns its output whatever the exit status.
    pub fn exec_any(&self, ns: &str, argv: &[&str]) -> Result<Output> {
        run_any(&mut self.cmd(ns, argv))
    }

    /// Starts `argv` in `ns` in the background (killed when the guard drops, and with this
    /// process).
    pub fn spawn(&mut self, ns: &str, argv: &[&str]) -> Result<Bg> {
        self.bg_seq += 1;
        let out = self.tmp.join(format!("bg{}.out", self.bg_seq));
        let err = self.tmp.join(format!("bg{}.err", self.bg_seq));
        let mut c = self.cmd(ns, argv);
        let desc = cmd_desc(&c);
        c.stdin(Stdio::null())
            .stdout(File::create(&out)?)
            .stderr(File::create(&err)?);
        let child = process::spawn(c).with_context(|| format!("starting `{desc}`"))?;
        Ok(Bg {
            child: Some(child),
            desc,
            out,
            err,
        })
    }

    /// Sets a sysctl inside `ns`.
    pub fn sysctl(&self, ns: &str, key: &str, value: &str) -> Result<()> {
        self.exec(ns, &["sysctl", "-qw", &format!("{key}={value}")])?;
        Ok(())
    }

    /// A fresh pin directory for a data plane whose devices live in `ns`; it is reset (see
    /// [`Testbed::on_pin_cleanup`]) and removed on drop.
    pub fn pin_dir(&mut self, ns: &str, tag: &str) -> PathBuf {
        let rest = self.id.trim_start_matches(NETNS_PREFIX);
        let p = PathBuf::from(format!("{PIN_PREFIX}{rest}-{tag}"));
        self.pins.push((ns.to_owned(), p.clone()));
        p
    }

    /// Writes a scratch file (removed on drop) and returns its path.
    pub fn write_file(&self, name: &str, contents: &str) -> Result<PathBuf> {
        let p = self.tmp.join(name);
        std::fs::write(&p, contents).with_context(|| format!("writing {}", p.display()))?;
        Ok(p)
    }

    /// Runs `f` on a thread that has entered `ns`; sockets it creates live in `ns`.
    pub fn spawn_in<T, F>(&self, ns: &str, f: F) -> JoinHandle<Result<T>>
    where
        F: FnOnce() -> Result<T> + Send + 'static,
        T: Send + 'static,
    {
        spawn_in_netns(ns, f)
    }

    /// Removes everything now (also done by drop). Returns the problems met, if any.
    pub fn cleanup(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        for ns in &self.namespaces {
            kill_netns_pids(ns);
        }
        for (ns, pin) in self.pins.drain(..) {
            if !pin.exists() {
                continue;
            }
            if let Some(reset) = &self.pin_cleanup
                && let Err(e) = reset(&ns, &pin)
            {
                problems.push(format!("reset of {}: {e:#}", pin.display()));
            }
            if pin.exists()
                && let Err(e) = std::fs::remove_dir_all(&pin)
            {
                problems.push(format!("removing {}: {e}", pin.display()));
            }
        }
        for ns in self.namespaces.drain(..).rev() {
            if let Err(e) = run(ip().args(["netns", "del", &ns])) {
                problems.push(format!("{e:#}"));
            }
        }
        if !self.keep_scratch {
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
        problems
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        for p in self.cleanup() {
            eprintln!("fabric-netns: cleanup of {}: {p}", self.id);
        }
    }
}

/// Runs `f` on a new thread that first joins the network namespace `ns` (see
/// [`crate::spawn_in`]), with `anyhow` errors.
pub fn spawn_in_netns<T, F>(ns: &str, f: F) -> JoinHandle<Result<T>>
where
    F: FnOnce() -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    crate::spawn_in(ns, f)
}

/// Joins a thread started with [`spawn_in_netns`], flattening panics into errors.
pub fn join<T>(h: JoinHandle<Result<T>>) -> Result<T> {
    match h.join() {
        Ok(r) => r,
        Err(p) => bail!("thread panicked: {}", crate::panic_message(p.as_ref())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_of_names() {
        assert_eq!(owner_pid("fabt-123-4-a-gw", NETNS_PREFIX), Some(123));
        assert_eq!(owner_pid("fabt-123", NETNS_PREFIX), Some(123));
        assert_eq!(owner_pid("fabric-api-77-a", "fabric-api-"), Some(77));
        assert_eq!(owner_pid("fabt-x-1", NETNS_PREFIX), None);
        assert_eq!(owner_pid("other-1", NETNS_PREFIX), None);
        assert!(!is_stale(
            &format!("fabt-{}-0", std::process::id()),
            NETNS_PREFIX
        ));
        assert_eq!(gateway_owner_pid("fgw4321r"), Some(4321));
        assert_eq!(gateway_owner_pid("fgb77o.sock"), Some(77));
        assert_eq!(gateway_owner_pid("fgwx"), None);
        assert_eq!(gateway_owner_pid("wg0.sock"), None);
    }

    #[test]
    fn command_lines_that_name_a_directory() {
        let d = Path::new("/tmp/fabt-12-api-a");
        let cl = |args: &[&str]| args.join("\0").into_bytes();
        assert!(names_dir(
            &cl(&["etcd", "--data-dir", "/tmp/fabt-12-api-a/etcd-data"]),
            d
        ));
        assert!(names_dir(
            &cl(&["kubelite", "--cert-dir=/tmp/fabt-12-api-a/certs"]),
            d
        ));
        assert!(names_dir(&cl(&["x", "/tmp/fabt-12-api-a"]), d));
        // Another run's directory that merely starts with the same characters.
        assert!(!names_dir(&cl(&["x", "/tmp/fabt-12-api-ab/certs"]), d));
        assert!(!names_dir(&cl(&["x", "--dir=/var/tmp/fabt-12-api-a"]), d));
    }
}
