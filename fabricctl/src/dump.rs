//! `fabricctl network dump`: what the fabric programmed on this host (the data planes' maps,
//! the fabric's routes, the overlay device).
use std::path::PathBuf;

use anyhow::{Context as _, Result};
use serde::Serialize;

use crate::cli::Output;

/// Data planes pinned under /sys/fs/bpf (directories holding the interface map).
fn pinned_dataplanes() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir("/sys/fs/bpf")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("FABRIC_IFACES").exists())
        .collect();
    out.sort();
    out
}

#[derive(Serialize)]
struct Dump {
    dataplanes: Vec<(PathBuf, fabric_dataplane::Snapshot)>,
    routes: Vec<String>,
    /// The overlay device between nodes and gateway, when there is one.
    overlay: Option<OverlayDump>,
}

#[derive(Serialize)]
struct OverlayDump {
    device: String,
    vni: Option<u32>,
    port: Option<u16>,
    mac: String,
    /// Remote endpoints with both their forwarding and neighbour entries.
    endpoints: Vec<std::net::Ipv4Addr>,
    /// Remote endpoints with only one of the two (the agent or operator restores the other).
    incomplete: Vec<std::net::Ipv4Addr>,
    foreign_entries: usize,
}

fn ifname(i: u32) -> String {
    fabric_dataplane::sys::ifname(i).unwrap_or_else(|| i.to_string())
}

/// Our routes (protocol 250) and the overlay device in the current network namespace.
async fn fabric_routing_state() -> Result<(Vec<String>, Option<OverlayDump>)> {
    use fabric_routing::overlay;
    let (conn, handle, _) = rtnetlink::new_connection().context("netlink")?;
    tokio::spawn(conn);
    let mut routes: Vec<String> = fabric_routing::routes::current(&handle)
        .await
        .context("listing routes")?
        .into_iter()
        .map(|r| match r.dev {
            Some(d) => format!("{} via {} dev {} onlink", r.dst, r.via, ifname(d)),
            None => format!("{} via {}", r.dst, r.via),
        })
        .collect();
    routes.sort();
    let ov = overlay::inspect(&handle, overlay::DEFAULT_DEVICE)
        .await
        .context("reading the overlay device")?
        .map(|i| {
            let (endpoints, incomplete) = i.endpoints();
            OverlayDump {
                device: overlay::DEFAULT_DEVICE.into(),
                vni: i.vni,
                port: i.port,
                mac: i
                    .mac
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<Vec<_>>()
                    .join(":"),
                endpoints,
                incomplete,
                foreign_entries: i.foreign,
            }
        });
    Ok((routes, ov))
}

pub fn network_dump(pin_dirs: Vec<PathBuf>, output: Output) -> Result<()> {
    let dirs = if pin_dirs.is_empty() {
        pinned_dataplanes()
    } else {
        pin_dirs
    };
    let mut dump = Dump {
        dataplanes: Vec::new(),
        routes: Vec::new(),
        overlay: None,
    };
    for d in dirs {
        let snap = fabric_dataplane::Maps::open_pinned(&d)
            .and_then(|m| m.snapshot())
            .with_context(|| format!("reading the data plane pinned at {}", d.display()))?;
        dump.dataplanes.push((d, snap));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    (dump.routes, dump.overlay) = rt.block_on(fabric_routing_state())?;
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&dump)?),
        Output::Yaml => print!("{}", serde_saphyr::to_string(&dump)?),
        Output::Table => {
            for (d, snap) in &dump.dataplanes {
                println!(
                    "== data plane pinned at {}\n{}",
                    d.display(),
                    snap.to_table()
                );
            }
            if dump.dataplanes.is_empty() {
                println!("== no data plane pinned under /sys/fs/bpf (is this a gateway host?)\n");
            }
            println!("== fabric routes (proto 250)");
            for r in &dump.routes {
                println!("  {r}");
            }
            if dump.routes.is_empty() {
                println!("  (none)");
            }
            match &dump.overlay {
                None => println!("== no overlay device"),
                Some(o) => {
                    println!(
                        "== overlay {} (VNI {}, UDP {}, MAC {})",
                        o.device,
                        o.vni.map_or("?".into(), |v| v.to_string()),
                        o.port.map_or("?".into(), |v| v.to_string()),
                        o.mac
                    );
                    for e in &o.endpoints {
                        println!("  endpoint {e}");
                    }
                    for e in &o.incomplete {
                        println!(
                            "  endpoint {e} (incomplete: forwarding or neighbour entry missing)"
                        );
                    }
                    if o.endpoints.is_empty() && o.incomplete.is_empty() {
                        println!("  (no endpoints)");
                    }
                    if o.foreign_entries > 0 {
                        println!("  {} entries not written by the fabric", o.foreign_entries);
                    }
                }
            }
        }
    }
    Ok(())
}
