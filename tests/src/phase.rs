//! Scenario tests in named phases: a long end-to-end test builds its bed once and then runs
//! one named function per phase over it. Each phase says when it starts and how long it took
//! (stderr: the harness shows it with a failure, `--nocapture` shows it live), and a phase
//! that panics says which one failed, so the failure is not only a line number in a long
//! test, and the log shows where a slow test spends its time.
use std::{future::Future, time::Instant};

/// Runs `f` as the phase `name` (see the module documentation).
pub fn phase<T>(name: &str, f: impl FnOnce() -> T) -> T {
    let p = Phase::start(name);
    let v = f();
    p.done();
    v
}

/// [`phase`] for async code.
pub async fn phase_async<T>(name: &str, f: impl Future<Output = T>) -> T {
    let p = Phase::start(name);
    let v = f.await;
    p.done();
    v
}

/// A running phase: reports its end, or its failure when dropped by a panic.
struct Phase<'a> {
    name: &'a str,
    t0: Instant,
    done: bool,
}

impl<'a> Phase<'a> {
    fn start(name: &'a str) -> Self {
        eprintln!("=== phase: {name}");
        Self {
            name,
            t0: Instant::now(),
            done: false,
        }
    }

    fn done(mut self) {
        self.done = true;
        let secs = self.t0.elapsed().as_secs_f64();
        eprintln!("=== phase: {} done in {secs:.1}s", self.name);
        record(self.name, secs);
    }
}

/// Appends `test<TAB>phase<TAB>seconds` to the file `$FABRIC_TEST_PHASES` names, if any
/// (`cargo xtask test` sets it and prints the slowest phases of the whole run).
fn record(name: &str, secs: f64) {
    append(
        "FABRIC_TEST_PHASES",
        None,
        &format!("{}\t{secs:.1}", name.replace(['\t', '\n'], " ")),
    );
}

/// Appends `test<TAB>cpu seconds<TAB>seconds alive` for an API server this test started and
/// stopped to the file `$FABRIC_TEST_API_SERVERS` names, if any (`cargo xtask test` sets it
/// and prints what the run's API servers cost).
pub fn record_api_server(cpu_secs: f64, alive_secs: f64) {
    // A server may be dropped on a runtime's thread: the job's label names the test then.
    let who = std::env::var("FABRIC_TEST_JOB").ok();
    append(
        "FABRIC_TEST_API_SERVERS",
        who.as_deref(),
        &format!("{cpu_secs:.2}\t{alive_secs:.1}"),
    );
}

/// Appends `test<TAB>fields` to the file the variable `var` names, if it is set; the test is
/// `who`, or this thread's name (the test harness names a test's thread after it).
fn append(var: &str, who: Option<&str>, fields: &str) {
    use std::io::Write as _;
    let Some(path) = std::env::var_os(var) else {
        return;
    };
    let thread = std::thread::current();
    let test = who.or(thread.name()).unwrap_or("?");
    let line = format!("{test}\t{fields}\n");
    // One short write in append mode: lines of parallel tests do not interleave.
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = f.write_all(line.as_bytes());
    }
}

impl Drop for Phase<'_> {
    fn drop(&mut self) {
        if !self.done {
            eprintln!(
                "=== phase FAILED: {} (after {:.1}s)",
                self.name,
                self.t0.elapsed().as_secs_f64()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_returns_what_its_body_returns() {
        assert_eq!(phase("sync", || 3), 3);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert_eq!(rt.block_on(phase_async("async", async { 4 })), 4);
    }

    #[test]
    fn a_panicking_phase_still_panics() {
        let r = std::panic::catch_unwind(|| phase("boom", || panic!("inside")));
        assert!(r.is_err());
    }
}
