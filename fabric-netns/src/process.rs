//! Child processes that die with the process that started them.
//!
//! A test run that is SIGKILLed (a CI timeout, `kill -9`, a hung test killed by hand) cannot
//! clean up; whatever it started would keep running (gateways holding TUN devices, agents,
//! controllers). [`die_with_parent`] asks the kernel to SIGKILL the child when its parent goes
//! (`PR_SET_PDEATHSIG`). The kernel ties that to the *thread* that forked the child, not the
//! process: a child spawned from a short-lived thread would be killed when that thread ends.
//! [`spawn`] therefore forks every long-running child from one thread that lives as long as the
//! process. The setting survives `exec` (also through `ip netns exec`, which execs), but not a
//! fork: daemons that a script starts in the background need the reaper instead
//! ([`crate::testbed::reap_stale`]).
use std::{
    io,
    os::unix::process::CommandExt,
    process::{Child, Command},
    sync::{Mutex, OnceLock, mpsc},
};

/// Arranges for the child of `cmd` to get SIGKILL when the thread that spawns it exits (see the
/// module comment). Use it directly for children the calling thread waits for (`output()`,
/// `status()`), and [`spawn`] for children that outlive the call.
pub fn die_with_parent(cmd: &mut Command) -> &mut Command {
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: prctl and getppid are async-signal-safe and touch only the child.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl: then nobody would signal us.
            if libc::getppid() != parent {
                return Err(io::Error::other("parent exited before the child started"));
            }
            Ok(())
        })
    }
}

type Request = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawns `cmd` (with [`die_with_parent`]) from a thread that lives as long as the process, so
/// the child dies when the process does, and not before. The returned [`Child`] is the caller's
/// to wait for or kill, as with [`Command::spawn`].
pub fn spawn(mut cmd: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();
    die_with_parent(&mut cmd);
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("fabric-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("starting the spawner thread");
        Mutex::new(tx)
    });
    let (tx, rx) = mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((cmd, tx))
        .map_err(|_| io::Error::other("the spawner thread is gone"))?;
    rx.recv()
        .map_err(|_| io::Error::other("the spawner thread is gone"))?
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    fn alive(pid: u32) -> bool {
        // A zombie (dead, not yet reaped) counts as gone.
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    }

    #[test]
    fn children_outlive_the_thread_that_asked_for_them() {
        let mut child = std::thread::spawn(|| {
            let mut c = Command::new("sleep");
            c.arg("30");
            spawn(c).unwrap()
        })
        .join()
        .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert!(alive(child.id()), "killed when the requesting thread ended");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn children_die_with_the_spawning_thread() {
        // What die_with_parent does, seen from a thread that exits: its child goes with it.
        let pid = std::thread::spawn(|| {
            let mut c = Command::new("sleep");
            c.arg("30");
            die_with_parent(&mut c);
            let child = c.spawn().unwrap();
            // Leaked on purpose: the kernel, not Drop, has to end it.
            let pid = child.id();
            std::mem::forget(child);
            pid
        })
        .join()
        .unwrap();
        let t0 = Instant::now();
        while alive(pid) {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "child {pid} survived"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // Reap the zombie.
        // SAFETY: our own child.
        unsafe { libc::waitpid(pid as i32, std::ptr::null_mut(), 0) };
    }
}
