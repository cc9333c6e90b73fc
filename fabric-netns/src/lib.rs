//! Network namespaces for the fabric and its tests, in one place.
//!
//! - [`enter`] moves the calling thread into a namespace given by name (under `/run/netns`) or
//!   path; [`spawn_in`] and [`run_in`] run a closure on a fresh thread that has entered one, so
//!   the rest of the process stays where it is (`setns(CLONE_NEWNET)` only affects the calling
//!   thread). The agent's `--netns` uses the same call before it starts other threads.
//! - [`process`] ties child processes to the life of the test process (`PR_SET_PDEATHSIG`).
//! - [`testbed`] (feature `testbed`) is the harness of every namespace test: namespaces with
//!   unique `fabt-<pid>-<n>-<role>` names, veths, scratch files, cleanup on drop, and the reaper
//!   of runs that died without cleaning up.
use std::{
    fs::File,
    io,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    thread::JoinHandle,
};

pub mod process;
#[cfg(feature = "testbed")]
pub mod testbed;

/// Where `ip netns add` puts named namespaces.
pub const NETNS_RUN_DIR: &str = "/run/netns";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("opening network namespace {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("entering network namespace {path}: {source}")]
    Enter { path: PathBuf, source: io::Error },
    #[error("a thread in network namespace {ns} panicked: {message}")]
    Panicked { ns: String, message: String },
}

/// The file of a namespace: `ns` itself when it is a path (contains a `/`), else
/// `/run/netns/<ns>`.
pub fn path_of(ns: &str) -> PathBuf {
    if ns.contains('/') {
        PathBuf::from(ns)
    } else {
        Path::new(NETNS_RUN_DIR).join(ns)
    }
}

/// Moves the calling thread into network namespace `ns` (a name or a path, see [`path_of`]).
/// Sockets the thread opens afterwards, and processes it spawns, live there. To move a whole
/// process, call it before starting other threads.
pub fn enter(ns: &str) -> Result<(), Error> {
    let path = path_of(ns);
    let f = File::open(&path).map_err(|source| Error::Open {
        path: path.clone(),
        source,
    })?;
    // SAFETY: a valid fd of a namespace file; affects only the calling thread.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(Error::Enter {
            path,
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Runs `f` on a new thread that first enters `ns`; the thread's result comes back through the
/// handle (see [`join`]). Failing to enter is `f`'s error type's business: it must convert from
/// [`Error`].
pub fn spawn_in<T, E, F>(ns: &str, f: F) -> JoinHandle<Result<T, E>>
where
    F: FnOnce() -> Result<T, E> + Send + 'static,
    T: Send + 'static,
    E: From<Error> + Send + 'static,
{
    let ns = ns.to_owned();
    std::thread::spawn(move || {
        enter(&ns)?;
        f()
    })
}

/// Runs `f` on a thread inside `ns` and waits for it. A panic in `f`, or failing to enter the
/// namespace, is an error.
pub fn run_in<T, F>(ns: &str, f: F) -> Result<T, Error>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let h = spawn_in(ns, move || Ok::<T, Error>(f()));
    join_as(ns, h)?
}

/// Joins a thread, turning a panic into [`Error::Panicked`].
pub fn join_as<T>(ns: &str, h: JoinHandle<T>) -> Result<T, Error> {
    h.join().map_err(|p| Error::Panicked {
        ns: ns.to_owned(),
        message: panic_message(p.as_ref()),
    })
}

/// The text of a panic payload (empty when it is not a string).
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_paths() {
        assert_eq!(path_of("fabt-1-0-a"), Path::new("/run/netns/fabt-1-0-a"));
        assert_eq!(path_of("/proc/1/ns/net"), Path::new("/proc/1/ns/net"));
    }

    #[test]
    fn a_missing_namespace_is_an_error_not_a_panic() {
        let e = run_in("fabt-no-such-namespace", || ()).unwrap_err();
        assert!(matches!(e, Error::Open { .. }), "{e}");
    }

    #[test]
    fn a_panic_inside_comes_back_as_an_error() {
        // Our own namespace: entering it needs CAP_SYS_ADMIN, so only as root.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let e = run_in("/proc/self/ns/net", || panic!("boom")).unwrap_err();
        assert!(
            matches!(e, Error::Panicked { ref message, .. } if message == "boom"),
            "{e}"
        );
    }

    #[test]
    fn entering_moves_only_the_thread() {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let name = format!("fabt-{}-lib", std::process::id());
        let ip = |a: &str| {
            std::process::Command::new("ip")
                .args(["netns", a, &name])
                .status()
                .unwrap()
        };
        assert!(ip("add").success());
        let ino = |p: &str| std::fs::metadata(p).unwrap().ino();
        let mine = ino("/proc/thread-self/ns/net");
        let named = ino(&format!("/run/netns/{name}"));
        let inside = run_in(&name, move || ino("/proc/thread-self/ns/net"));
        ip("del");
        assert_eq!(inside.unwrap(), named);
        assert_ne!(named, mine);
        assert_eq!(ino("/proc/thread-self/ns/net"), mine);
    }
}
