//! A test bed of network namespaces with unique names and guaranteed cleanup.
//!
//! Everything a [`Testbed`] creates is named `fabt-<pid>-<n>-<role>` (namespaces) or
//! `/sys/fs/bpf/fabric-test-<pid>-<n>-<tag>` (pin directories), and removed again in `Drop`:
//! processes still running inside our namespaces, data-plane pins (through
//! `fabric-agent datapath reset`, then `rm -r` as a fallback), the namespaces themselves (which
//! deletes the veths in them) and the scratch directory. Leftovers of a test process that was
//! killed before it could clean up (SIGKILL, Ctrl-C under `cargo test`) are reaped by the next
//! test bed: anything with our prefix whose pid is no longer alive.
use std::{
    fs::File,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::{
        Mutex,
        atomic::{AtomicU32, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::agent::Agent;

/// Prefix of every namespace a test bed creates.
pub const NETNS_PREFIX: &str = "fabt-";
/// Prefix of every pin directory a test bed hands out.
pub const PIN_PREFIX: &str = "/sys/fs/bpf/fabric-test-";

static SEQ: AtomicU32 = AtomicU32::new(0);
static REAPED: Mutex<bool> = Mutex::new(false);

/// Whether we run as root (the test beds need it).
pub fn is_root() -> bool {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() == 0 }
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
    let out = c
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
    c.stdin(Stdio::null())
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

/// Removes namespaces and pin directories of earlier test processes that died without cleaning
/// up. Only names with our prefixes and a pid that no longer exists are touched.
fn reap_stale() {
    let mut done = REAPED.lock().unwrap_or_else(|e| e.into_inner());
    if *done {
        return;
    }
    *done = true;
    let stale = |name: &str, prefix: &str| -> bool {
        name.strip_prefix(prefix)
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
            .is_some_and(|pid| pid != std::process::id() && !pid_alive(pid))
    };
    if let Ok(rd) = std::fs::read_dir("/run/netns") {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if stale(&name, NETNS_PREFIX) {
                eprintln!("fabric-tests: removing stale namespace {name}");
                kill_netns_pids(&name);
                let _ = run(ip().args(["netns", "del", &name]));
            }
        }
    }
    if let Ok(rd) = std::fs::read_dir("/sys/fs/bpf") {
        let pin_name = PIN_PREFIX.trim_start_matches("/sys/fs/bpf/");
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if stale(&name, pin_name) {
                eprintln!("fabric-tests: removing stale pin directory /sys/fs/bpf/{name}");
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    if let Ok(rd) = std::fs::read_dir(std::env::temp_dir()) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if stale(&name, NETNS_PREFIX) {
                let _ = std::fs::remove_dir_all(e.path());
            }
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

/// Namespaces, pin directories and scratch files of one test, removed on drop.
pub struct Testbed {
    id: String,
    namespaces: Vec<String>,
    pins: Vec<(String, PathBuf)>,
    tmp: PathBuf,
    bg_seq: u32,
    agent: Option<Agent>,
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
            bg_seq: 0,
            agent: None,
        })
    }

    /// Unique id of this bed (`fabt-<pid>-<n>`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The agent used to reset registered pin directories on drop.
    pub fn set_agent(&mut self, agent: Agent) {
        self.agent = Some(agent);
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

    /// Starts `argv` in `ns` in the background (killed when the guard drops).
    pub fn spawn(&mut self, ns: &str, argv: &[&str]) -> Result<Bg> {
        self.bg_seq += 1;
        let out = self.tmp.join(format!("bg{}.out", self.bg_seq));
        let err = self.tmp.join(format!("bg{}.err", self.bg_seq));
        let mut c = self.cmd(ns, argv);
        let desc = cmd_desc(&c);
        let child = c
            .stdin(Stdio::null())
            .stdout(File::create(&out)?)
            .stderr(File::create(&err)?)
            .spawn()
            .with_context(|| format!("starting `{desc}`"))?;
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

    /// A fresh pin directory for a data plane whose devices live in `ns`; it is reset (through
    /// the agent) and removed on drop.
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
            if let Some(agent) = &self.agent
                && let Err(e) = agent.reset(&ns, &pin)
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
        let _ = std::fs::remove_dir_all(&self.tmp);
        problems
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        for p in self.cleanup() {
            eprintln!("fabric-tests: cleanup of {}: {p}", self.id);
        }
    }
}

/// Runs `f` on a new thread that first joins the network namespace `/run/netns/<ns>`.
/// `setns(CLONE_NEWNET)` only affects the calling thread, so the rest of the process is
/// untouched; sockets opened by `f` belong to `ns`, and so do children it spawns.
pub fn spawn_in_netns<T, F>(ns: &str, f: F) -> JoinHandle<Result<T>>
where
    F: FnOnce() -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    let path = PathBuf::from("/run/netns").join(ns);
    std::thread::spawn(move || {
        enter_netns(&path)?;
        f()
    })
}

/// Moves the calling thread into the namespace at `path`.
pub fn enter_netns(path: &Path) -> Result<()> {
    let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: valid fd; affects only the calling thread.
    let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    if r != 0 {
        bail!(
            "setns({}): {}",
            path.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// Joins a thread started with [`spawn_in_netns`], flattening panics into errors.
pub fn join<T>(h: JoinHandle<Result<T>>) -> Result<T> {
    match h.join() {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            bail!("thread panicked: {msg}")
        }
    }
}
