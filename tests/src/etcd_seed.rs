//! The fabric's CRDs already in etcd when a test's API server starts: etcd's data of a server
//! that installed them, made once per machine for this kubelite and these CRDs, copied into
//! each new server's data directory before its etcd starts.
//!
//! Installing the 19 CRDs costs a fresh server about 1 s of CPU (each one rebuilds the
//! server's OpenAPI and is established by its controllers), and the suite starts about 90
//! servers on two cores; a server that finds them in etcd at start takes about half of that.
//! A server started this way is as one restarted after the CRDs were installed: the CRDs are
//! served once it is ready, and the bootstrap objects (namespaces, RBAC roles) are there.
//!
//! The start script (`../shared/kubelite/start.sh`) wipes the data directory and then runs
//! `$ETCD --data-dir DIR ...`: [`etcd_command`] is a script that copies the seed into `DIR`
//! and runs etcd.
use std::{
    hash::{Hash, Hasher},
    io::Write as _,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

/// Where seeds live: beside the unpacked kubelite binary, kept across runs.
const DIR: &str = "/var/tmp";

/// The `ETCD` command for the start script that starts etcd on a copy of the seed, making the
/// seed first if this machine has none for this kubelite and these CRDs; None (a server
/// without CRDs) when `FABRIC_TEST_ETCD_SEED=0`, or when the seed cannot be made (said on
/// stderr).
pub fn etcd_command() -> Option<PathBuf> {
    static MADE: OnceLock<Option<PathBuf>> = OnceLock::new();
    MADE.get_or_init(|| {
        if std::env::var_os("FABRIC_TEST_ETCD_SEED").is_some_and(|v| v == "0") {
            return None;
        }
        match made() {
            Ok(script) => Some(script),
            Err(e) => {
                eprintln!("API servers start without CRDs in etcd: {e:#}");
                None
            }
        }
    })
    .clone()
}

/// What the seed depends on: the kubelite binary (its checksum) and the CRDs.
fn key() -> Result<u64> {
    let sum = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/kubelite/kubelite.sha256"),
    )
    .context("reading kubelite.sha256")?;
    let crds = serde_json::to_string(&fabric_api::crds()).context("the CRDs")?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (sum.trim(), crds).hash(&mut h);
    Ok(h.finish())
}

fn made() -> Result<PathBuf> {
    let key = key()?;
    let seed = Path::new(DIR).join(format!("fabric-etcd-seed-{key:016x}"));
    let script = seed.with_extension("sh");
    if script.exists() {
        return Ok(script);
    }
    // Tests beside this one (other processes) may be making it too: one makes it, the others
    // wait for it.
    let lock = std::fs::File::create(Path::new(DIR).join("fabric-etcd-seed.lock"))
        .context("creating the seed's lock file")?;
    // SAFETY: flock on a file we hold open; released when it is closed.
    if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) } != 0 {
        bail!("locking the seed: {}", std::io::Error::last_os_error());
    }
    if script.exists() {
        return Ok(script);
    }
    let t0 = Instant::now();
    forget_old(&seed);
    let _ = std::fs::remove_dir_all(&seed);
    make(&seed)?;
    let etcd = which("etcd")?;
    let text = format!(
        "#!/bin/sh\n# Written by fabric-tests (tests/src/etcd_seed.rs): etcd on a copy of {seed}.\n\
         [ \"$1\" = --data-dir ] || exit 2\n\
         cp -a --sparse=always {seed} \"$2\" || exit 1\n\
         exec {etcd} \"$@\"\n",
        seed = seed.display(),
        etcd = etcd.display()
    );
    let tmp = script.with_extension("sh.tmp");
    let mut f = std::fs::File::create(&tmp).context("writing the etcd script")?;
    f.write_all(text.as_bytes())?;
    f.set_permissions(std::fs::Permissions::from_mode(0o755))?;
    drop(f);
    std::fs::rename(&tmp, &script).context("placing the etcd script")?;
    eprintln!(
        "made the API servers' etcd seed (the fabric's CRDs) in {:.1}s: {}",
        t0.elapsed().as_secs_f64(),
        seed.display()
    );
    Ok(script)
}

/// Removes seeds of other CRDs or kubelites (62 MB each) not used for a day: a checkout with
/// other CRDs may still use a recent one.
fn forget_old(keep: &Path) {
    let Ok(entries) = std::fs::read_dir(DIR) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let ours = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("fabric-etcd-seed-"));
        let unused = e
            .metadata()
            .and_then(|m| m.accessed())
            .is_ok_and(|t| t.elapsed().unwrap_or_default() > Duration::from_secs(24 * 3600));
        if ours && unused && path.with_extension("") != keep {
            let _ = std::fs::remove_dir_all(&path);
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// Starts a server without a seed, installs the CRDs, stops it cleanly and keeps its etcd
/// data as `seed`.
fn make(seed: &Path) -> Result<()> {
    let server = crate::apiserver::ApiServer::start_bare_with_auth("etcd-seed");
    server.install_crds();
    let dir = server
        .run_dir()
        .context("the seed's server has no run directory")?
        .to_owned();
    for daemon in ["kubelite.pid", "etcd.pid"] {
        let pid: i32 = std::fs::read_to_string(dir.join(daemon))
            .with_context(|| format!("reading {daemon}"))?
            .trim()
            .parse()
            .with_context(|| format!("parsing {daemon}"))?;
        stop(pid).with_context(|| format!("stopping the seed's {daemon}"))?;
    }
    let tmp = seed.with_extension("tmp");
    let _ = std::fs::remove_dir_all(&tmp);
    let out = Command::new("cp")
        .args(["-a", "--sparse=always"])
        .arg(dir.join("etcd-data"))
        .arg(&tmp)
        .output()
        .context("running cp")?;
    if !out.status.success() {
        bail!(
            "copying etcd's data: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    std::fs::rename(&tmp, seed).context("placing the seed")?;
    Ok(())
}

/// SIGTERM, then waits until the process is gone: etcd has written everything when it exits.
fn stop(pid: i32) -> Result<()> {
    // SAFETY: signalling a daemon of the server this module started.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let t0 = Instant::now();
    // Gone, or a zombie nobody reaped yet (the start script's daemons are not our children).
    let running = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit_once(") ")
                .is_some_and(|(_, rest)| !rest.starts_with('Z'))
        })
    };
    while running() {
        if t0.elapsed() > Duration::from_secs(20) {
            bail!("{pid} still runs 20 s after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn which(tool: &str) -> Result<PathBuf> {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .with_context(|| format!("looking for {tool}"))?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || path.is_empty() {
        bail!("no {tool} on PATH");
    }
    Ok(PathBuf::from(path))
}
