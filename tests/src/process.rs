//! Starting the fabric's binaries in tests: one builder for "run `fabric-controller sharing`
//! against this API server, logging there, as this pod, dying with the test" ([`Bin`]), the
//! guard that kills and reaps a child when the test ends ([`ChildGuard`]), and where the
//! binaries are found ([`locate_bin`]), and `fabricctl` run to its end ([`fabricctl`]).
use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
};

use anyhow::{Context as _, Result};

/// For children a test waits for or kills itself: they die with the test process too.
pub use fabric_netns::process::die_with_parent;

/// A child process that is killed and reaped when dropped, so a failing test leaves none
/// behind.
pub struct ChildGuard(pub Child);

impl ChildGuard {
    /// The child's process id.
    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `fabricctl ARGS` against the API server of `kubeconfig`, run to its end, with none of the
/// environment variables that would stand in for flags the test leaves out.
pub fn fabricctl(kubeconfig: &Path, args: &[&str]) -> Output {
    Command::new(locate_bin("fabricctl").expect("fabricctl is built"))
        .env("KUBECONFIG", kubeconfig)
        .env_remove("FABRIC_PEERING_TOKEN")
        .env_remove("FABRIC_AUTH_URL")
        .args(args)
        .output()
        .expect("fabricctl runs")
}

/// `kubectl ARGS` with `kubeconfig`, `input` on its standard input; the forms
/// [`crate::kubectl`] answers without a process, in-process.
pub fn kubectl_stdin(kubeconfig: &Path, args: &[&str], input: &str) -> Output {
    use std::io::Write as _;
    if let Some(o) = crate::kubectl::in_process(kubeconfig, args, Some(input)) {
        return o;
    }
    let mut c = Command::new("kubectl")
        .env("KUBECONFIG", kubeconfig)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl");
    c.stdin
        .take()
        .expect("kubectl's stdin")
        .write_all(input.as_bytes())
        .expect("writing to kubectl");
    c.wait_with_output().expect("kubectl runs")
}

/// Waits for `c` to exit until `deadline`, then kills it (SIGKILL) and reaps it: the end of a
/// clean stop that was asked for (SIGTERM) before, for one child or, with one deadline, many.
pub fn reap_by(c: &mut std::process::Child, deadline: std::time::Instant) {
    while std::time::Instant::now() < deadline {
        if let Ok(Some(_)) = c.try_wait() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = c.kill();
    let _ = c.wait();
}

/// What a process printed, stdout then stderr.
pub fn output_text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Finds one of the workspace's binaries (built by `cargo build --workspace --bins`): next to
/// the running test executable, or in ../target/debug.
pub fn locate_bin(name: &str) -> Result<PathBuf> {
    let mut tried = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1).take(2) {
            tried.push(dir.join(name));
        }
    }
    tried.push(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../target/debug")
            .join(name),
    );
    tried
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("{name} not found (tried {tried:?}); run `cargo build --workspace --bins` or `cargo xtask test`"))
}

/// One of the fabric's binaries as a test runs it: found with [`locate_bin`], `RUST_LOG=info`,
/// no stdin, output to a log file (or nowhere), dying with the test process (even when that is
/// SIGKILLed), killed and reaped when its [`ChildGuard`] drops.
///
/// ```no_run
/// # fn f(kubeconfig: &std::path::Path, dir: &std::path::Path) -> anyhow::Result<()> {
/// let _sharing = fabric_tests::process::Bin::new("fabric-controller")?
///     .arg("sharing")
///     .kubeconfig(kubeconfig)
///     .pod_name("sharing-0")
///     .log(dir.join("sharing.log"))
///     .spawn()?;
/// # Ok(()) }
/// ```
pub struct Bin {
    name: String,
    cmd: Command,
    log: Option<PathBuf>,
}

impl Bin {
    /// The binary `name` of the workspace.
    pub fn new(name: &str) -> Result<Self> {
        Ok(Self::with(name, Command::new(locate_bin(name)?)))
    }

    /// The binary at `path`: a crate's tests run their own package's binaries from
    /// `env!("CARGO_BIN_EXE_<name>")`, which cargo builds for them.
    pub fn at(path: impl AsRef<Path>) -> Self {
        let path = path.as_ref();
        let name = path.file_name().unwrap_or(path.as_os_str());
        Self::with(&name.to_string_lossy(), Command::new(path))
    }

    /// The binary `name`, run as `container` of deploy/ runs it (its user, groups and
    /// capabilities: [`crate::manifests::Container::command`]).
    pub fn as_container(name: &str, container: &crate::manifests::Container) -> Result<Self> {
        Ok(Self::with(name, container.command(&locate_bin(name)?)?))
    }

    fn with(name: &str, mut cmd: Command) -> Self {
        cmd.env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        Self {
            name: name.to_owned(),
            cmd,
            log: None,
        }
    }

    pub fn arg(mut self, a: impl AsRef<OsStr>) -> Self {
        self.cmd.arg(a);
        self
    }

    pub fn args<I, S>(mut self, a: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.cmd.args(a);
        self
    }

    pub fn env(mut self, k: impl AsRef<OsStr>, v: impl AsRef<OsStr>) -> Self {
        self.cmd.env(k, v);
        self
    }

    /// `KUBECONFIG`: the API server it talks to, and as whom.
    pub fn kubeconfig(self, path: impl AsRef<OsStr>) -> Self {
        self.env("KUBECONFIG", path)
    }

    /// `POD_NAME`: the replica's identity (leader election, field managers).
    pub fn pod_name(self, name: &str) -> Self {
        self.env("POD_NAME", name)
    }

    /// `RUST_LOG` (default `info`).
    pub fn rust_log(self, filter: &str) -> Self {
        self.env("RUST_LOG", filter)
    }

    /// Standard output and error to `path` (created afresh).
    pub fn log(mut self, path: impl Into<PathBuf>) -> Self {
        self.log = Some(path.into());
        self
    }

    /// Starts it.
    pub fn spawn(mut self) -> Result<ChildGuard> {
        if let Some(path) = &self.log {
            let f = std::fs::File::create(path)
                .with_context(|| format!("creating {}", path.display()))?;
            self.cmd.stdout(f.try_clone()?).stderr(f);
        }
        // From the process-long spawner thread: a fixture may start it from a thread of its
        // own, whose end must not kill it.
        let child = fabric_netns::process::spawn(self.cmd)
            .with_context(|| format!("starting {}", self.name))?;
        Ok(ChildGuard(child))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_binary_says_how_to_build_it() {
        let e = Bin::new("no-such-fabric-binary").err().unwrap().to_string();
        assert!(e.contains("cargo build --workspace --bins"), "{e}");
    }
}
