//! Driving the `fabric-agent` binary, and writing its data-plane configuration.
//!
//! The binary is found, in order, at `$FABRIC_AGENT_BIN`, next to the running executable
//! (`target/<profile>/` for binaries, `target/<profile>/deps/..` for test executables), or at
//! `<workspace>/target/debug/fabric-agent`. Cargo does not build another package's binaries for
//! an integration test, so build them first: `cargo build --workspace --bins` (what
//! `cargo xtask test` does before `cargo test --workspace`).
//!
//! The agent joins the namespace itself (`--netns NAME`): `ip netns exec` would give it a fresh
//! /sys without the BPF filesystem the pins live on.
use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use crate::netns::run;

#[derive(Debug, Clone)]
pub struct Agent {
    pub bin: PathBuf,
}

impl Agent {
    /// Finds the agent binary (see the module docs).
    pub fn locate() -> Result<Self> {
        let mut tried = Vec::new();
        if let Some(p) = std::env::var_os("FABRIC_AGENT_BIN") {
            let p = PathBuf::from(p);
            if p.is_file() {
                return Ok(Self { bin: p });
            }
            bail!("FABRIC_AGENT_BIN={} does not exist", p.display());
        }
        if let Ok(exe) = std::env::current_exe() {
            for dir in exe.ancestors().skip(1).take(2) {
                tried.push(dir.join("fabric-agent"));
            }
        }
        tried.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/fabric-agent"));
        for p in &tried {
            if p.is_file() {
                return Ok(Self { bin: p.clone() });
            }
        }
        bail!(
            "fabric-agent binary not found (tried {tried:?}); build it first with \
             `cargo build --workspace --bins`, or run `cargo xtask test`, or set FABRIC_AGENT_BIN"
        )
    }

    fn cmd(&self, ns: &str) -> Command {
        let mut c = Command::new(&self.bin);
        c.args(["--netns", ns]);
        c
    }

    /// `fabric-agent --netns NS <args>`; returns stdout.
    pub fn run(&self, ns: &str, args: &[&str]) -> Result<String> {
        run(self.cmd(ns).args(args))
    }

    /// Loads/attaches and programs the maps from `config` (idempotent).
    pub fn apply(&self, ns: &str, pin_dir: &Path, config: &Path) -> Result<String> {
        run(self
            .cmd(ns)
            .args(["datapath", "apply", "--pin-dir"])
            .arg(pin_dir)
            .arg("--config")
            .arg(config))
    }

    /// Human-readable maps and counters.
    pub fn show(&self, ns: &str, pin_dir: &Path) -> Result<String> {
        run(self
            .cmd(ns)
            .args(["datapath", "show", "--pin-dir"])
            .arg(pin_dir))
    }

    /// Maps and counters as JSON (parsed loosely; see [`peer_counter`]).
    pub fn show_json(&self, ns: &str, pin_dir: &Path) -> Result<Value> {
        let out = run(self
            .cmd(ns)
            .args(["datapath", "show", "--pin-dir"])
            .arg(pin_dir)
            .args(["--output", "json"]))?;
        serde_json::from_str(&out)
            .with_context(|| format!("parsing `datapath show --output json`: {out}"))
    }

    /// Detaches and removes every pin in `pin_dir`.
    pub fn reset(&self, ns: &str, pin_dir: &Path) -> Result<String> {
        run(self
            .cmd(ns)
            .args(["datapath", "reset", "--pin-dir"])
            .arg(pin_dir))
    }
}

/// A counter of a peer from `show --output json`: `dir` is "egress" or "ingress", `name` e.g.
/// "packets" or "remapped". Missing fields read as 0 so small format changes fail an assertion
/// with a clear message instead of a parse error.
pub fn peer_counter(show: &Value, peer: &str, dir: &str, name: &str) -> u64 {
    show.get("peers")
        .and_then(Value::as_array)
        .and_then(|ps| {
            ps.iter()
                .find(|p| p.get("name").and_then(Value::as_str) == Some(peer))
        })
        .and_then(|p| p.get(dir))
        .and_then(|d| d.get(name))
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

/// One peer of a gateway's data-plane configuration.
#[derive(Debug, Clone)]
pub struct PeerConfig {
    pub name: String,
    pub id: u32,
    pub interface: String,
    pub mss: Option<u16>,
    /// (local view, peer's real prefix), same length.
    pub remaps: Vec<(String, String)>,
}

/// Renders the agent's TOML configuration. `local_cidrs`: what the peers may reach.
pub fn config_toml(
    local_cidrs: &[&str],
    peers: &[PeerConfig],
    externals: &[(String, String)],
) -> String {
    let mut s = String::new();
    if !local_cidrs.is_empty() {
        let _ = writeln!(s, "local_cidrs = {local_cidrs:?}\n");
    }
    for p in peers {
        let _ = writeln!(s, "[[peers]]");
        let _ = writeln!(s, "name = {:?}", p.name);
        let _ = writeln!(s, "id = {}", p.id);
        let _ = writeln!(s, "interface = {:?}", p.interface);
        if let Some(m) = p.mss {
            let _ = writeln!(s, "mss = {m}");
        }
        let remaps: Vec<String> = p
            .remaps
            .iter()
            .map(|(l, r)| format!("{{ local = {l:?}, remote = {r:?} }}"))
            .collect();
        let _ = writeln!(s, "remaps = [ {} ]\n", remaps.join(", "));
    }
    for (e, i) in externals {
        let _ = writeln!(s, "[[externals]]\nexternal = {e:?}\ninternal = {i:?}\n");
    }
    s
}
