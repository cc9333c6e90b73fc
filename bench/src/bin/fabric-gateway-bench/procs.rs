//! The benchmark's processes and test beds: everything that must go away however the run ends
//! (a registry the signal thread cleans up too), and running commands in the namespaces.
use super::*;

/// Everything that must go away however the run ends. Global so that the
/// signal thread can clean up while the main thread is blocked in a child.
#[derive(Default)]
pub(super) struct Registry {
    pub(super) pids: Vec<i32>,
    pub(super) beds: Vec<Testbed>,
    pub(super) paths: Vec<PathBuf>,
    /// Set once the final cleanup has begun: no new test beds from then on.
    pub(super) closing: bool,
}

pub(super) static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    pids: Vec::new(),
    beds: Vec::new(),
    paths: Vec::new(),
    closing: false,
});

pub(super) fn registry() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn kill_and_reap(pid: i32) {
    // SAFETY: pids in the registry are our own children that were not yet reaped.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut st = 0;
        // SAFETY: as above; WNOHANG never blocks.
        let r = unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG) };
        if r != 0 {
            return;
        }
        if Instant::now() > deadline {
            // SAFETY: as above.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut st, 0);
            }
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(super) fn cleanup_all() {
    // Whoever comes second (main returning, the signal thread) waits until the first is done,
    // so the process never exits in the middle of a cleanup.
    static CLEANING: Mutex<()> = Mutex::new(());
    let _one_at_a_time = CLEANING.lock().unwrap_or_else(|e| e.into_inner());
    let (pids, beds, paths) = {
        let mut r = registry();
        r.closing = true;
        (
            std::mem::take(&mut r.pids),
            std::mem::take(&mut r.beds),
            std::mem::take(&mut r.paths),
        )
    };
    for pid in pids.into_iter().rev() {
        kill_and_reap(pid);
    }
    // Namespaces and scratch directories go with their test beds.
    drop(beds);
    for p in paths {
        let _ = fs::remove_dir_all(&p).or_else(|_| fs::remove_file(&p));
    }
}

pub(super) fn signal_set() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise the set we pass them.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Blocks termination signals in every thread and handles them (and the
/// deadline) on one thread that cleans up and exits.
pub(super) fn install_reaper(deadline: Duration) {
    let set = signal_set();
    // SAFETY: valid set; called before any other thread exists, so all inherit it.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    std::thread::spawn(move || {
        let end = Instant::now() + deadline;
        let sig = loop {
            let left = end.saturating_duration_since(Instant::now());
            let ts = libc::timespec {
                tv_sec: left.as_secs() as libc::time_t,
                tv_nsec: libc::c_long::from(left.subsec_nanos() as i32),
            };
            // SAFETY: valid set and timespec; null siginfo is allowed.
            let sig = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &ts) };
            // EINTR (e.g. a debugger or profiler attaching) is not the deadline.
            if sig >= 0 || left.is_zero() || io_errno() != libc::EINTR {
                break sig;
            }
        };
        if sig < 0 {
            eprintln!("bench: deadline of {deadline:?} passed; cleaning up");
        } else {
            eprintln!("bench: signal {sig}; cleaning up");
        }
        cleanup_all();
        std::process::exit(if sig < 0 { 124 } else { 128 + sig });
    });
}

pub(super) fn io_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Children must not inherit the blocked signals, or SIGTERM could not stop them.
pub(super) fn unblocked(cmd: &mut Command) -> &mut Command {
    // SAFETY: pthread_sigmask is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(|| {
            let set = signal_set();
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            Ok(())
        })
    }
}

// ------------------------------------------------------------- processes

pub(super) fn run_cmd(args: &[&str], timeout: Duration) -> Result<String> {
    let mut cmd = Command::new("timeout");
    cmd.arg("-k")
        .arg("2")
        .arg(format!("{}", timeout.as_secs().max(1)))
        .args(args)
        .stdin(Stdio::null());
    let out = unblocked(fabric_netns::process::die_with_parent(&mut cmd))
        .output()
        .with_context(|| format!("spawning {args:?}"))?;
    if !out.status.success() {
        bail!(
            "{args:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub(super) fn ns_cmd(ns: &str, args: &[&str], timeout: Duration) -> Result<String> {
    let mut v = vec!["ip", "netns", "exec", ns];
    v.extend_from_slice(args);
    run_cmd(&v, timeout)
}

pub(super) const T: Duration = Duration::from_secs(10);

/// A long-running process in a namespace; `ip netns exec` execs, so the pid is the program's.
pub(super) fn spawn_in(ns: &str, args: &[&str], env: &[(&str, &str)], log: &Path) -> Result<i32> {
    let f = fs::File::create(log)?;
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns])
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(f.try_clone()?)
        .stderr(f);
    unblocked(&mut cmd);
    // Dies with the benchmark, even when that is SIGKILLed.
    let child: Child =
        fabric_netns::process::spawn(cmd).with_context(|| format!("spawning {args:?}"))?;
    let pid = child.id() as i32;
    // Reaped by pid in cleanup; the Child handle itself does not wait on drop.
    registry().pids.push(pid);
    Ok(pid)
}

pub(super) fn cpu_ticks(pid: i32) -> Result<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name may contain spaces; fields after it are fixed.
    let rest = &s[s.rfind(')').ok_or_else(|| anyhow!("bad stat"))? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15, i.e. 11 and 12 after "state".
    Ok(f[11].parse::<u64>()? + f[12].parse::<u64>()?)
}

pub(super) fn vm_rss_kib(pid: i32) -> Result<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = s
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .ok_or_else(|| anyhow!("no VmRSS for {pid}"))?;
    Ok(line.split_whitespace().nth(1).unwrap_or("0").parse()?)
}

pub(super) fn alive(pid: i32) -> bool {
    let mut st = 0;
    // SAFETY: our own child; WNOHANG never blocks. 0 means still running.
    unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG) == 0 }
}
