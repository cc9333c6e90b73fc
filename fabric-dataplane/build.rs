//! Compiles `fabric-ebpf` for the bpf target (nightly + build-std + bpf-linker, as aya-build
//! does) and leaves the object in OUT_DIR, so every binary that links this crate carries its
//! own programs. Unlike aya-build, it keeps the nested cargo quiet unless something is wrong:
//! only compiler diagnostics of the programs, or the whole output on failure, reach the user.
//!
//! Without the `programs` feature (a tool that only reads pinned maps) it builds nothing, so
//! such a tool needs neither the nightly toolchain nor bpf-linker.
use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

fn main() -> anyhow::Result<()> {
    if env::var_os("CARGO_FEATURE_PROGRAMS").is_none() {
        println!("cargo:rerun-if-changed=build.rs");
        return Ok(());
    }
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR")?);
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").context("OUT_DIR")?);
    let root = manifest.parent().context("workspace root")?;
    for dir in ["fabric-ebpf", "fabric-common/src"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    println!(
        "cargo:rerun-if-changed={}",
        root.join("fabric-common/Cargo.toml").display()
    );
    let endian = env::var("CARGO_CFG_TARGET_ENDIAN").context("CARGO_CFG_TARGET_ENDIAN")?;
    let target = if endian == "big" {
        "bpfeb-unknown-none"
    } else {
        "bpfel-unknown-none"
    };
    let arch = env::var("CARGO_CFG_TARGET_ARCH").context("CARGO_CFG_TARGET_ARCH")?;

    let toolchain = pinned_nightly(root)?;
    let mut cmd = Command::new("rustup");
    cmd.current_dir(root)
        .args([
            "run",
            &toolchain,
            "cargo",
            "build",
            "--locked",
            "--package",
            "fabric-ebpf",
            "--bins",
        ])
        .args([
            "--message-format=json-render-diagnostics",
            "--release",
            "--target",
            target,
        ])
        .args(["-Z", "build-std=core", "--target-dir"])
        .arg(out_dir.join("ebpf-target"))
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            format!("--cfg=bpf_target_arch=\"{arch}\"\x1f-Cdebuginfo=2\x1f-Clink-arg=--btf"),
        );
    // The outer build's compiler settings are for the host, not for the programs.
    for var in [
        "RUSTC",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS_HOST",
    ] {
        cmd.env_remove(var);
    }
    let out = cmd
        .output()
        .with_context(|| format!("running `rustup run {toolchain} cargo build` for the eBPF programs (is rustup installed? `cargo xtask setup` installs the toolchain)"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let mut exe = None;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] == "compiler-artifact"
            && msg["target"]["name"] == "fabric"
            && let Some(e) = msg["executable"].as_str()
        {
            exe = Some(PathBuf::from(e));
        }
    }
    // Diagnostics of our own programs (rendered on stderr by cargo) are worth seeing.
    for l in stderr
        .lines()
        .filter(|l| l.starts_with("warning") || l.starts_with("error"))
    {
        if !l.contains("Compiling") {
            println!("cargo:warning=fabric-ebpf: {l}");
        }
    }
    if !out.status.success() {
        for l in stderr.lines() {
            println!("cargo:warning={l}");
        }
        bail!(
            "building the eBPF programs failed ({}); see the warnings above",
            out.status
        );
    }
    let exe = exe.context("the eBPF build produced no `fabric` object")?;
    copy(&exe, &out_dir.join("fabric"))
}

fn copy(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(())
}

#[derive(serde::Deserialize)]
struct ToolchainFile {
    toolchain: Toolchain,
}

#[derive(serde::Deserialize)]
struct Toolchain {
    channel: String,
}

/// The dated nightly of `fabric-ebpf/rust-toolchain.toml` (one place for it and xtask).
fn pinned_nightly(root: &Path) -> anyhow::Result<String> {
    let path = root.join("fabric-ebpf/rust-toolchain.toml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let file: ToolchainFile =
        toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    Ok(file.toolchain.channel)
}
