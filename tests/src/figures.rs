//! What the benchmarks print their figures with: percentiles of sorted durations, seconds,
//! a process's resident memory and CPU time.
use std::time::Duration;

/// The `p` percentile (0.0-1.0) of `sorted`, which must not be empty.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The build the benchmark's binaries are (the bench runs those beside it): `debug` or
/// `release`.
pub fn profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// The machine's load averages, to print beside figures taken on a shared machine.
pub fn load_average() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    match std::fs::read_to_string("/proc/loadavg") {
        Ok(l) => format!(
            "{} (1, 5, 15 min) on {cpus} CPUs",
            l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
        ),
        Err(e) => format!("unknown ({e})"),
    }
}

pub fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// VmRSS of a process, KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

pub fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// CPU time (user and system) of processes, in seconds.
pub fn cpu_secs(pids: &[i32]) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    pids.iter()
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // Fields after the command (which may hold spaces), from field 3 on.
            let rest = &stat[stat.rfind(')')? + 2..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some((f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?) as f64)
        })
        .sum::<f64>()
        / hz
}
