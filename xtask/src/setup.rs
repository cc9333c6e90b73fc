//! `cargo xtask setup`: installs what a fresh Debian machine lacks for the tests, the demo and
//! the benchmarks (apt packages, the pinned nightly with rust-src and bpf-linker for the eBPF
//! programs, the BPF filesystem, boringtun-cli). Idempotent, and quick when all is present.
use std::{
    env,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, Result, bail};

use crate::{cargo, is_root, output, run, step, works, workspace_root};

/// Packages the tests, demo and bench need. `wireguard-tools` goes separately, without
/// recommends (they pull a kernel image).
const APT_PACKAGES: &[&str] = &[
    "iproute2",
    "iperf3",
    "bpftool",
    "nftables",
    "conntrack",
    "etcd-server",
    "xz-utils",
    "curl",
    "iputils-ping",
    "procps",
    // The DNS server of the discovery test (the binary only: `dnsmasq` would start a service).
    "dnsmasq-base",
];
const APT_NO_RECOMMENDS: &[&str] = &["wireguard-tools"];

fn dpkg_installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map(|o| {
            o.status.success()
                && String::from_utf8_lossy(&o.stdout).contains("install ok installed")
        })
        .unwrap_or(false)
}

fn apt_install(pkgs: &[&str], extra: &[&str]) -> Result<()> {
    run(Command::new("apt-get")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .args(["install", "-y", "-q"])
        .args(extra)
        .args(pkgs))
    .context("installing system packages")
}

fn setup_apt() -> Result<()> {
    if !Path::new("/usr/bin/dpkg-query").exists() {
        println!(
            "    (no dpkg: not a Debian-like system; install {APT_PACKAGES:?} and {APT_NO_RECOMMENDS:?} yourself)"
        );
        return Ok(());
    }
    let missing: Vec<&str> = APT_PACKAGES
        .iter()
        .copied()
        .filter(|p| !dpkg_installed(p))
        .collect();
    let missing_nr: Vec<&str> = APT_NO_RECOMMENDS
        .iter()
        .copied()
        .filter(|p| !dpkg_installed(p))
        .collect();
    if missing.is_empty() && missing_nr.is_empty() {
        println!("    system packages: all present");
        return Ok(());
    }
    if !is_root() {
        bail!(
            "missing packages {:?}; run as root (or `sudo apt-get install {}`)",
            [&missing[..], &missing_nr[..]].concat(),
            [&missing[..], &missing_nr[..]].concat().join(" ")
        );
    }
    println!(
        "    missing: {}",
        [&missing[..], &missing_nr[..]].concat().join(" ")
    );
    run(Command::new("apt-get")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .args(["update", "-q"]))
    .context("apt-get update")?;
    if !missing.is_empty() {
        apt_install(&missing, &[])?;
    }
    if !missing_nr.is_empty() {
        apt_install(&missing_nr, &["--no-install-recommends"])?;
    }
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

/// The dated nightly that builds the eBPF programs (and the fuzz targets), from
/// `fabric-ebpf/rust-toolchain.toml`, which fabric-dataplane's build script reads too.
fn pinned_nightly() -> Result<String> {
    let path = workspace_root().join("fabric-ebpf/rust-toolchain.toml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let file: ToolchainFile =
        toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    Ok(file.toolchain.channel)
}

fn sysroot_of(toolchain: &str) -> Result<PathBuf> {
    output(
        Command::new("rustc")
            .arg(format!("+{toolchain}"))
            .args(["--print", "sysroot"]),
    )
    .map(PathBuf::from)
    .with_context(|| format!("asking the {toolchain} rustc for its sysroot"))
}

/// The date rustup installed a toolchain's channel manifest for (`date = "YYYY-MM-DD"`).
fn manifest_date(sysroot: &Path) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Manifest {
        date: String,
    }
    let text = std::fs::read_to_string(sysroot.join("lib/rustlib/multirust-channel-manifest.toml"))
        .ok()?;
    toml::from_str::<Manifest>(&text).ok().map(|m| m.date)
}

/// Makes the pinned nightly available. A floating `nightly` that rustup installed for the very
/// same date is that toolchain: it is entered under the dated name (rustup refuses
/// `toolchain link` for official names, so as the directory rustup would have created) instead
/// of downloading it again.
fn install_pinned_nightly(pinned: &str) -> Result<()> {
    let date = pinned.trim_start_matches("nightly-");
    if let Ok(floating) = sysroot_of("nightly")
        && manifest_date(&floating).as_deref() == Some(date)
        && let Some(toolchains) = floating.parent()
    {
        let host = output(Command::new("rustc").arg("-vV"))?
            .lines()
            .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
            .context("rustc -vV printed no host")?;
        let dir = toolchains.join(format!("{pinned}-{host}"));
        std::os::unix::fs::symlink(&floating, &dir)
            .with_context(|| format!("linking {} -> {}", dir.display(), floating.display()))?;
        println!(
            "    {pinned}: the installed nightly of that date ({})",
            dir.display()
        );
        return Ok(());
    }
    run(Command::new("rustup").args([
        "toolchain",
        "install",
        pinned,
        "--profile",
        "minimal",
        "--component",
        "rust-src",
    ]))
    .with_context(|| format!("installing the {pinned} toolchain (rustup required)"))
}

pub(crate) fn setup_nightly() -> Result<(String, PathBuf)> {
    let pinned = pinned_nightly()?;
    if !works("rustc", [format!("+{pinned}").as_str(), "--version"]) {
        install_pinned_nightly(&pinned)?;
    }
    let sysroot = sysroot_of(&pinned)?;
    if sysroot.join("lib/rustlib/src/rust/library").is_dir() {
        println!("    {pinned} rust-src: present");
    } else {
        run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", &pinned]))
            .with_context(|| format!("adding rust-src to {pinned}"))?;
    }
    Ok((pinned, sysroot))
}

fn setup_bpf_linker(sysroot: &Path) -> Result<()> {
    if works("bpf-linker", ["--version"]) {
        println!("    bpf-linker: present");
        return Ok(());
    }
    // Build it against rustc's own LLVM, so the bitcode rustc emits and the linker agree.
    let lib = sysroot.join("lib");
    let llvm = std::fs::read_dir(&lib)
        .with_context(|| format!("listing {}", lib.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("libLLVM.so."))
        .max()
        .with_context(|| {
            format!(
                "no libLLVM.so.* in {} (rustup component llvm-tools?)",
                lib.display()
            )
        })?;
    let major = llvm
        .trim_start_matches("libLLVM.so.")
        .split('.')
        .next()
        .unwrap_or("22")
        .to_owned();
    let link = lib.join("libLLVM.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&llvm, &link)
        .with_context(|| format!("linking {} -> {llvm}", link.display()))?;
    println!("    linked {} -> {llvm}", link.display());
    run(cargo()
        .env("LLVM_PREFIX", sysroot)
        .args([
            "install",
            "--locked",
            "bpf-linker",
            "--version",
            "^0.13",
            "--no-default-features",
            "--features",
        ])
        .arg(format!("llvm-{major}")))
    .context("installing bpf-linker")?;
    if !works("bpf-linker", ["--version"]) {
        bail!("bpf-linker installed but not runnable; is ~/.cargo/bin on PATH?");
    }
    Ok(())
}

fn setup_bpffs() -> Result<()> {
    let fs = Command::new("stat")
        .args(["-f", "-c", "%T", "/sys/fs/bpf"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    if fs == "bpf_fs" {
        println!("    bpffs: mounted at /sys/fs/bpf");
        return Ok(());
    }
    if !is_root() {
        println!("    bpffs: not mounted at /sys/fs/bpf (needs root; the agent mounts it itself)");
        return Ok(());
    }
    std::fs::create_dir_all("/sys/fs/bpf").context("creating /sys/fs/bpf")?;
    run(Command::new("mount").args(["-t", "bpf", "bpf", "/sys/fs/bpf"])).context("mounting bpffs")
}

fn setup_boringtun_cli() -> Result<()> {
    let home_bin = env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(".cargo/bin/boringtun-cli"))
        .filter(|p| p.exists());
    if works("boringtun-cli", ["--version"]) || home_bin.is_some() {
        println!("    boringtun-cli: present");
        return Ok(());
    }
    run(cargo().args(["install", "boringtun-cli", "--locked", "--version", "^0.7"]))
        .context("installing boringtun-cli")
}

pub(crate) fn setup() -> Result<()> {
    let t = Instant::now();
    step("setup: system packages");
    setup_apt()?;
    step("setup: nightly toolchain and bpf-linker (to build the eBPF programs)");
    let (_, sysroot) = setup_nightly()?;
    setup_bpf_linker(&sysroot)?;
    step("setup: BPF filesystem");
    setup_bpffs()?;
    step("setup: boringtun-cli (the other WireGuard implementation for interop tests and benches)");
    setup_boringtun_cli()?;
    println!("    setup done in {:.1}s", t.elapsed().as_secs_f64());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The eBPF programs build with a nightly of a fixed date, not whatever `nightly` is
    /// newest (supply chain).
    #[test]
    fn the_ebpf_nightly_is_pinned_by_date() {
        let pinned = pinned_nightly().unwrap();
        let date = pinned
            .strip_prefix("nightly-")
            .unwrap_or_else(|| panic!("{pinned}"));
        let ok = date.len() == 10
            && date.char_indices().all(|(i, c)| {
                if i == 4 || i == 7 {
                    c == '-'
                } else {
                    c.is_ascii_digit()
                }
            });
        assert!(ok, "not a dated nightly: {pinned}");
        let build =
            std::fs::read_to_string(workspace_root().join("fabric-dataplane/build.rs")).unwrap();
        assert!(
            !build.contains("\"nightly\""),
            "build.rs names the floating nightly"
        );
    }
}
