//! A pod's network: its namespace, a veth into the node's namespace, its address and routes,
//! built with `ip` and removed with what runs in it.
use std::{net::Ipv4Addr, process::Command};

use anyhow::{Context as _, Result, bail};
use tracing::warn;

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The pod's namespace, a veth `host` (here) ↔ `eth0` (there), `addr/32` on eth0 with the
/// default route via `gw` (on-link), and here a host route to the pod and `gw` on the veth,
/// so that the pod's ARP for its gateway is answered whatever else this namespace has.
pub(super) fn build_net(ns: &str, host: &str, addr: Ipv4Addr, gw: Ipv4Addr) -> Result<()> {
    ip(&["netns", "add", ns])?;
    ip(&[
        "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", ns,
    ])?;
    ip(&["addr", "add", &format!("{gw}/32"), "dev", host])?;
    ip(&["link", "set", host, "up"])?;
    ip(&["route", "add", &format!("{addr}/32"), "dev", host])?;
    ip(&["-n", ns, "link", "set", "lo", "up"])?;
    ip(&[
        "-n",
        ns,
        "addr",
        "add",
        &format!("{addr}/32"),
        "dev",
        "eth0",
    ])?;
    ip(&["-n", ns, "link", "set", "eth0", "up"])?;
    ip(&[
        "-n",
        ns,
        "route",
        "add",
        "default",
        "via",
        &gw.to_string(),
        "dev",
        "eth0",
        "onlink",
    ])?;
    Ok(())
}

/// Removes every pod namespace of this process (and what runs in them), on shutdown.
pub fn remove_all() {
    let prefix = format!("fabt-{}-pod-", std::process::id());
    let names: Vec<String> = std::fs::read_dir(fabric_netns::NETNS_RUN_DIR)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default();
    for ns in names {
        remove_net(&ns);
    }
}

pub(super) fn remove_net(ns: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
        for pid in String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            // SAFETY: plain syscall; the process lives in the pod's namespace, which we made.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    if let Err(e) = ip(&["netns", "del", ns]) {
        warn!(ns, error = %format!("{e:#}"), "removing the pod namespace");
    }
}
