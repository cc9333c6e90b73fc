//! The overlay guard: fabric-ebpf's sk_lookup program `fabric_overlay_guard` on a network
//! namespace, refusing datagrams to the overlay's UDP port from anyone but the known
//! endpoints, each on the interface the route back to it uses (a local pod spoofing an
//! endpoint's address arrives on its own interface).
//!
//! With a pin directory ([`OverlayGuard::attach_pinned`]) the guard outlives its holder: the
//! link and the maps are pinned there, so while the agent or operator restarts the overlay
//! port stays guarded with the last allowed set, and the next holder takes that set over
//! rather than starting empty. Only [`remove_pinned`] (nothing peered any more) lifts it.
use std::{
    collections::{BTreeMap, BTreeSet},
    fs::File,
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, PerCpuArray},
    programs::{SkLookup, links::FdLink, links::PinnedLink},
};

use fabric_common::maps as names;

use crate::{EBPF_OBJECT, Error};

const PROGRAM: &str = "fabric_overlay_guard";
const SOURCES: &str = "FABRIC_OVERLAY_SOURCES";
const PORT: &str = "FABRIC_OVERLAY_PORT";
const DROPS: &str = "FABRIC_OVERLAY_DROPS";
/// The link's pin in the pin directory.
const LINK: &str = "link";

/// An allowed source and the interface its datagrams arrive on (0: any).
pub type Sources = BTreeMap<Ipv4Addr, u32>;

pub struct OverlayGuard {
    ebpf: Ebpf,
    /// The pinned link (the guard stays attached without it); None: it lives in `ebpf`.
    _pinned: Option<PinnedLink>,
}

/// The map key of an address: the kernel compares `remote_ip4`, which is in network order.
fn key(ip: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(ip.octets())
}

fn load(pin_dir: Option<&Path>) -> Result<Ebpf, Error> {
    // The object also declares the data plane's maps; this loader never uses them, so
    // they get one entry each instead of their full (per-CPU, preallocated) size.
    let mut loader = EbpfLoader::new();
    for name in names::ALL {
        loader.map_max_entries(name, 1);
    }
    // Pinned maps are reused as they are: the allowed set survives the holder.
    let pins: Vec<(&str, PathBuf)> = pin_dir
        .map(|d| [SOURCES, PORT, DROPS].map(|m| (m, d.join(m))).to_vec())
        .unwrap_or_default();
    for (m, path) in &pins {
        loader.map_pin_path(m, path.as_path());
    }
    let mut ebpf = loader.load(EBPF_OBJECT)?;
    let p: &mut SkLookup = ebpf
        .program_mut(PROGRAM)
        .ok_or_else(|| Error::Config(format!("program {PROGRAM} missing from the object")))?
        .try_into()
        .map_err(Error::prog(PROGRAM))?;
    p.load()
        .map_err(Error::prog(format!("verifying {PROGRAM}")))?;
    Ok(ebpf)
}

fn program(ebpf: &mut Ebpf) -> Result<&mut SkLookup, Error> {
    ebpf.program_mut(PROGRAM)
        .ok_or_else(|| Error::Config(format!("program {PROGRAM} missing from the object")))?
        .try_into()
        .map_err(Error::prog(PROGRAM))
}

fn open_netns(netns: &Path) -> Result<File, Error> {
    File::open(netns).map_err(|e| Error::io(format!("opening {}", netns.display()), e))
}

impl OverlayGuard {
    /// Attaches the guard for UDP `port` to the network namespace at `netns` (e.g.
    /// `/proc/self/ns/net`) for as long as this value lives. Until
    /// [`OverlayGuard::set_sources`] is called nothing reaches the port.
    pub fn attach(netns: &Path, port: u16) -> Result<Self, Error> {
        let mut ebpf = load(None)?;
        program(&mut ebpf)?
            .attach(open_netns(netns)?)
            .map_err(Error::prog(format!(
                "attaching {PROGRAM} to {}",
                netns.display()
            )))?;
        let mut g = Self {
            ebpf,
            _pinned: None,
        };
        g.set_port(port)?;
        Ok(g)
    }

    /// Attaches the guard with its link and maps pinned in `pin_dir` (on a BPF filesystem),
    /// so that it stays attached after this process ends. A guard already pinned there is
    /// taken over: its allowed sources are kept, and the new program is attached before the
    /// old link is unpinned, so the port is never unguarded in between (sk_lookup programs of
    /// a namespace all run; a datagram passes only if none refuses it).
    pub fn attach_pinned(netns: &Path, port: u16, pin_dir: &Path) -> Result<Self, Error> {
        crate::sys::ensure_pin_dir(pin_dir)?;
        let mut ebpf = load(Some(pin_dir))?;
        let p = program(&mut ebpf)?;
        let id = p.attach(open_netns(netns)?).map_err(Error::prog(format!(
            "attaching {PROGRAM} to {}",
            netns.display()
        )))?;
        let link: FdLink = p.take_link(id).map_err(Error::prog(PROGRAM))?.into();
        let path = pin_dir.join(LINK);
        // (bpffs refuses names with dots: EPERM.)
        let fresh = pin_dir.join(format!("{LINK}_new"));
        let _ = std::fs::remove_file(&fresh);
        let pinned = link.pin(&fresh).map_err(|source| Error::Pin {
            what: format!("the guard's link at {}", fresh.display()),
            source,
        })?;
        // Replaces (and so detaches) the previous holder's link, possibly one of a namespace
        // that is gone.
        std::fs::rename(&fresh, &path).map_err(|e| {
            Error::io(
                format!("renaming {} to {}", fresh.display(), path.display()),
                e,
            )
        })?;
        let mut g = Self {
            ebpf,
            _pinned: Some(pinned),
        };
        g.set_port(port)?;
        Ok(g)
    }

    fn set_port(&mut self, port: u16) -> Result<(), Error> {
        let mut ports: Array<_, u32> = Array::try_from(
            self.ebpf
                .map_mut(PORT)
                .ok_or_else(|| Error::Config(format!("map {PORT} missing")))?,
        )
        .map_err(Error::map(PORT))?;
        ports.set(0, u32::from(port), 0).map_err(Error::map(PORT))
    }

    /// Makes the allowed sources exactly `want` (address -> arrival interface), reading the
    /// map back (so entries removed or changed by hand come back). Returns how many entries
    /// it wrote and removed.
    pub fn set_sources(&mut self, want: &Sources) -> Result<(usize, usize), Error> {
        let mut m: HashMap<_, u32, u32> = HashMap::try_from(
            self.ebpf
                .map_mut(SOURCES)
                .ok_or_else(|| Error::Config(format!("map {SOURCES} missing")))?,
        )
        .map_err(Error::map(SOURCES))?;
        let have: BTreeMap<u32, u32> = m.iter().filter_map(Result::ok).collect();
        let want: BTreeMap<u32, u32> = want.iter().map(|(ip, i)| (key(*ip), *i)).collect();
        let mut written = 0;
        for (k, v) in &want {
            if have.get(k) != Some(v) {
                m.insert(k, v, 0).map_err(Error::map(SOURCES))?;
                written += 1;
            }
        }
        let stale: BTreeSet<u32> = have
            .keys()
            .filter(|k| !want.contains_key(k))
            .copied()
            .collect();
        for k in &stale {
            m.remove(k).map_err(Error::map(SOURCES))?;
        }
        Ok((written, stale.len()))
    }

    /// Datagrams refused so far (kept across holders when pinned).
    pub fn drops(&self) -> Result<u64, Error> {
        let m: PerCpuArray<_, u64> = PerCpuArray::try_from(
            self.ebpf
                .map(DROPS)
                .ok_or_else(|| Error::Config(format!("map {DROPS} missing")))?,
        )
        .map_err(Error::map(DROPS))?;
        Ok(m.get(&0, 0).map_err(Error::map(DROPS))?.iter().sum())
    }
}

/// Lifts a guard pinned in `pin_dir` (none there is fine): its link and maps are unpinned, so
/// it detaches once no process holds it.
pub fn remove_pinned(pin_dir: &Path) -> Result<bool, Error> {
    if !pin_dir.exists() {
        return Ok(false);
    }
    std::fs::remove_dir_all(pin_dir)
        .map_err(|e| Error::io(format!("removing {}", pin_dir.display()), e))?;
    Ok(true)
}

/// Keeps a guard in `slot` (attached on first use, for `port` in the namespace at `netns`,
/// pinned in `pin_dir` when given) admitting exactly `sources`, and returns its refusal
/// count. A failure is returned (and nothing attached), not fatal: a pinned guard of an
/// earlier holder stays in place meanwhile. When pinning is impossible (no BPF filesystem)
/// the guard is attached for this process's lifetime only, which is said in the log.
pub fn keep(
    slot: &mut Option<OverlayGuard>,
    netns: &Path,
    port: u16,
    pin_dir: Option<&Path>,
    sources: &Sources,
) -> Result<u64, Error> {
    if slot.is_none() {
        let g = match pin_dir {
            Some(dir) => match OverlayGuard::attach_pinned(netns, port, dir) {
                Ok(g) => g,
                Err(e @ Error::BpfFs(_)) => {
                    tracing::warn!(error = %e, "overlay guard not pinned: it lives only as long as this process");
                    OverlayGuard::attach(netns, port)?
                }
                Err(e) => return Err(e),
            },
            None => OverlayGuard::attach(netns, port)?,
        };
        *slot = Some(g);
        tracing::info!(
            port,
            ?sources,
            pinned = ?pin_dir,
            "overlay guard attached: only these may send to the overlay port, each on its interface"
        );
    }
    let g = slot.as_mut().expect("attached above");
    let (written, removed) = g.set_sources(sources)?;
    if written + removed > 0 {
        tracing::info!(?sources, written, removed, "overlay guard sources");
    }
    g.drops()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_in_network_order() {
        // remote_ip4 holds the address bytes as they are on the wire.
        let k = key(Ipv4Addr::new(10, 1, 2, 3));
        assert_eq!(k.to_ne_bytes(), [10, 1, 2, 3]);
    }
}
