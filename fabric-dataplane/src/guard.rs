//! The overlay guard: fabric-ebpf's sk_lookup program `fabric_overlay_guard` on a network
//! namespace, refusing datagrams to the overlay's UDP port from anyone but the known
//! endpoints. It lives as long as this value: sk_lookup programs attach through a link, and
//! links cannot be pinned on the reference kernel, so the agent or operator that holds it is
//! what keeps it (restarted in seconds by Kubernetes; the overlay stays up meanwhile).
use std::{collections::BTreeSet, fs::File, net::Ipv4Addr, path::Path};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, PerCpuArray},
    programs::SkLookup,
};

use crate::{EBPF_OBJECT, Error};

const PROGRAM: &str = "fabric_overlay_guard";
const SOURCES: &str = "FABRIC_OVERLAY_SOURCES";
const PORT: &str = "FABRIC_OVERLAY_PORT";
const DROPS: &str = "FABRIC_OVERLAY_DROPS";

pub struct OverlayGuard {
    ebpf: Ebpf,
}

/// The map key of an address: the kernel compares `remote_ip4`, which is in network order.
fn key(ip: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(ip.octets())
}

impl OverlayGuard {
    /// Attaches the guard for UDP `port` to the network namespace at `netns` (e.g.
    /// `/proc/self/ns/net`). Until [`OverlayGuard::set_sources`] is called nothing reaches
    /// the port.
    pub fn attach(netns: &Path, port: u16) -> Result<Self, Error> {
        // The object also declares the data plane's maps; this loader never uses them, so
        // they get one entry each instead of their full (per-CPU, preallocated) size.
        let mut loader = EbpfLoader::new();
        for name in crate::names::ALL {
            loader.map_max_entries(name, 1);
        }
        let mut ebpf = loader.load(EBPF_OBJECT)?;
        let p: &mut SkLookup = ebpf
            .program_mut(PROGRAM)
            .ok_or_else(|| Error::Config(format!("program {PROGRAM} missing from the object")))?
            .try_into()
            .map_err(Error::prog(PROGRAM))?;
        p.load()
            .map_err(Error::prog(format!("verifying {PROGRAM}")))?;
        let ns =
            File::open(netns).map_err(|e| Error::io(format!("opening {}", netns.display()), e))?;
        p.attach(ns).map_err(Error::prog(format!(
            "attaching {PROGRAM} to {}",
            netns.display()
        )))?;
        let mut ports: Array<_, u32> = Array::try_from(
            ebpf.map_mut(PORT)
                .ok_or_else(|| Error::Config(format!("map {PORT} missing")))?,
        )
        .map_err(Error::map(PORT))?;
        ports.set(0, u32::from(port), 0).map_err(Error::map(PORT))?;
        Ok(Self { ebpf })
    }

    /// Makes the allowed sources exactly `want`, reading the map back (so entries removed by
    /// hand come back). Returns how many entries it added and removed.
    pub fn set_sources(&mut self, want: &BTreeSet<Ipv4Addr>) -> Result<(usize, usize), Error> {
        let mut m: HashMap<_, u32, u32> = HashMap::try_from(
            self.ebpf
                .map_mut(SOURCES)
                .ok_or_else(|| Error::Config(format!("map {SOURCES} missing")))?,
        )
        .map_err(Error::map(SOURCES))?;
        let have: BTreeSet<u32> = m.keys().filter_map(Result::ok).collect();
        let want: BTreeSet<u32> = want.iter().map(|ip| key(*ip)).collect();
        for k in want.difference(&have) {
            m.insert(k, 1, 0).map_err(Error::map(SOURCES))?;
        }
        for k in have.difference(&want) {
            m.remove(k).map_err(Error::map(SOURCES))?;
        }
        Ok((
            want.difference(&have).count(),
            have.difference(&want).count(),
        ))
    }

    /// Datagrams refused so far.
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

/// Keeps a guard in `slot` (attached on first use, for `port` in the namespace at `netns`)
/// admitting exactly `sources`, and returns its refusal count. Callers keep the overlay
/// working without it: a failure is returned (and nothing attached), not fatal.
pub fn keep(
    slot: &mut Option<OverlayGuard>,
    netns: &Path,
    port: u16,
    sources: &BTreeSet<Ipv4Addr>,
) -> Result<u64, Error> {
    if slot.is_none() {
        *slot = Some(OverlayGuard::attach(netns, port)?);
        tracing::info!(
            port,
            ?sources,
            "overlay guard attached: only these may send to the overlay port"
        );
    }
    let g = slot.as_mut().expect("attached above");
    let (added, removed) = g.set_sources(sources)?;
    if added + removed > 0 {
        tracing::info!(?sources, added, removed, "overlay guard sources");
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
