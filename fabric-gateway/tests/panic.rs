//! A panic in any gateway thread ends the process (so it gets restarted), instead of leaving a
//! half-alive gateway whose health checks still pass.
use std::{
    os::unix::process::ExitStatusExt as _,
    process::Command,
    time::{Duration, Instant},
};

const CHILD: &str = "FABRIC_GATEWAY_PANIC_TEST_CHILD";

#[test]
fn a_panicking_thread_ends_the_process() {
    if std::env::var_os(CHILD).is_some() {
        // The child: what the gateway binary installs, then a worker thread that panics while
        // the main thread would go on.
        fabric_gateway::daemon::fail_fast_on_panic();
        std::thread::spawn(|| panic!("a packet thread fails"));
        std::thread::sleep(Duration::from_secs(10));
        return;
    }
    let t0 = Instant::now();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_panicking_thread_ends_the_process",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGABRT),
        "the child survived its panicking thread: {:?}\n{err}",
        out.status
    );
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t0.elapsed()
    );
    assert!(err.contains("a packet thread fails"), "{err}");
    assert!(
        err.contains("exiting so that the gateway is restarted"),
        "{err}"
    );
}
