//! Typed handles on the pinned (or freshly loaded) maps: reading everything the programs read
//! as a [`MapState`], and writing the operations [`state::diff`] computes. No program is
//! loaded here, so inspection (`fabricctl network dump`) needs no eBPF object.
use std::{collections::BTreeMap, path::Path};

use aya::{
    maps::{HashMap, LpmTrie, Map, MapData, PerCpuArray, PerCpuValues, lpm_trie::Key},
    util::nr_cpus,
};
use fabric_common::{
    Counters, DIR_EGRESS, DIR_INGRESS, ExtKey, IfaceConfig, PeerMeta, RemapKey, Rewrite,
    counter_index, drop as reason, maps as names,
};
use tracing::debug;

use crate::{
    Error,
    state::{self, MapState, Op, PeerMetaEntry},
    sys,
};

/// Typed handles on every map.
pub struct Maps {
    ifaces: HashMap<MapData, u32, IfaceConfig>,
    peers: HashMap<MapData, u32, PeerMeta>,
    remap_egress: LpmTrie<MapData, RemapKey, Rewrite>,
    remap_ingress: LpmTrie<MapData, RemapKey, Rewrite>,
    ext_dnat: LpmTrie<MapData, ExtKey, Rewrite>,
    ext_snat: LpmTrie<MapData, ExtKey, Rewrite>,
    dests: LpmTrie<MapData, RemapKey, u32>,
    counters: PerCpuArray<MapData, Counters>,
    drops: PerCpuArray<MapData, u64>,
}

fn remap_key((peer, len, addr): state::RemapEntry) -> Key<RemapKey> {
    Key::new(
        32 + len as u32,
        RemapKey {
            peer_id_be: peer.to_be(),
            addr: addr.to_be(),
        },
    )
}

fn ext_key((len, addr): state::ExtEntry) -> Key<ExtKey> {
    Key::new(len as u32, ExtKey { addr: addr.to_be() })
}

impl Maps {
    pub(crate) fn from_source(
        mut take: impl FnMut(&'static str) -> Result<Map, Error>,
    ) -> Result<Self, Error> {
        macro_rules! typed {
            ($name:expr) => {
                take($name)?.try_into().map_err(Error::map($name))?
            };
        }
        Ok(Self {
            ifaces: typed!(names::IFACES),
            peers: typed!(names::PEERS),
            remap_egress: typed!(names::REMAP_EGRESS),
            remap_ingress: typed!(names::REMAP_INGRESS),
            ext_dnat: typed!(names::EXT_DNAT),
            ext_snat: typed!(names::EXT_SNAT),
            dests: typed!(names::DESTS),
            counters: typed!(names::COUNTERS),
            drops: typed!(names::DROPS),
        })
    }

    /// Opens the maps pinned under `pin_dir` (read and write) without loading programs.
    pub fn open_pinned(pin_dir: &Path) -> Result<Self, Error> {
        if !pin_dir.join(names::IFACES).exists() {
            return Err(Error::NotLoaded(pin_dir.to_owned()));
        }
        Self::from_source(|name| {
            let data = MapData::from_pin(pin_dir.join(name)).map_err(Error::map(name))?;
            Ok(match name {
                names::IFACES | names::PEERS => Map::HashMap(data),
                names::COUNTERS | names::DROPS => Map::PerCpuArray(data),
                _ => Map::LpmTrie(data),
            })
        })
    }

    /// Everything the programs read, as plain data.
    pub fn read_state(&self) -> Result<MapState, Error> {
        let mut s = MapState::default();
        for kv in self.ifaces.iter() {
            let (k, v) = kv.map_err(Error::map(names::IFACES))?;
            s.ifaces.insert(k, v);
        }
        for kv in self.peers.iter() {
            let (k, v) = kv.map_err(Error::map(names::PEERS))?;
            s.peers.insert(
                k,
                PeerMetaEntry {
                    name: sys::from_cbuf(&v.name),
                    ifname: sys::from_cbuf(&v.ifname),
                },
            );
        }
        for (trie, out, name) in [
            (&self.remap_egress, &mut s.remap_egress, names::REMAP_EGRESS),
            (
                &self.remap_ingress,
                &mut s.remap_ingress,
                names::REMAP_INGRESS,
            ),
        ] {
            for kv in trie.iter() {
                let (k, v) = kv.map_err(Error::map(name))?;
                let data = k.data();
                out.insert(
                    (
                        u32::from_be(data.peer_id_be),
                        (k.prefix_len() - 32) as u8,
                        u32::from_be(data.addr),
                    ),
                    v,
                );
            }
        }
        for kv in self.dests.iter() {
            let (k, v) = kv.map_err(Error::map(names::DESTS))?;
            let data = k.data();
            s.dests.insert(
                (
                    u32::from_be(data.peer_id_be),
                    (k.prefix_len() - 32) as u8,
                    u32::from_be(data.addr),
                ),
                v,
            );
        }
        for (trie, out, name) in [
            (&self.ext_dnat, &mut s.ext_dnat, names::EXT_DNAT),
            (&self.ext_snat, &mut s.ext_snat, names::EXT_SNAT),
        ] {
            for kv in trie.iter() {
                let (k, v) = kv.map_err(Error::map(name))?;
                out.insert((k.prefix_len() as u8, u32::from_be(k.data().addr)), v);
            }
        }
        Ok(s)
    }

    /// Makes the maps hold `want`: reads what they hold, writes only the difference. Returns
    /// what they held before and how many writes it took.
    pub fn reconcile(&mut self, want: &MapState) -> Result<(MapState, usize), Error> {
        let cur = self.read_state()?;
        let ops = state::diff(&cur, want);
        self.write(&ops)?;
        Ok((cur, ops.len()))
    }

    /// Performs the writes in order. Stops at the first failure (a later apply resumes).
    pub fn write(&mut self, ops: &[Op]) -> Result<(), Error> {
        for op in ops {
            debug!(?op, "map write");
            match op {
                Op::SetIface(k, v) => self
                    .ifaces
                    .insert(k, v, 0)
                    .map_err(Error::map(names::IFACES))?,
                Op::DelIface(k) => self.ifaces.remove(k).map_err(Error::map(names::IFACES))?,
                Op::SetPeer(k, v) => {
                    let meta = PeerMeta {
                        name: sys::to_cbuf(&v.name),
                        ifname: sys::to_cbuf(&v.ifname),
                    };
                    self.peers
                        .insert(k, meta, 0)
                        .map_err(Error::map(names::PEERS))?
                }
                Op::DelPeer(k) => self.peers.remove(k).map_err(Error::map(names::PEERS))?,
                Op::SetRemapEgress(k, v) => self
                    .remap_egress
                    .insert(&remap_key(*k), v, 0)
                    .map_err(Error::map(names::REMAP_EGRESS))?,
                Op::DelRemapEgress(k) => self
                    .remap_egress
                    .remove(&remap_key(*k))
                    .map_err(Error::map(names::REMAP_EGRESS))?,
                Op::SetRemapIngress(k, v) => self
                    .remap_ingress
                    .insert(&remap_key(*k), v, 0)
                    .map_err(Error::map(names::REMAP_INGRESS))?,
                Op::DelRemapIngress(k) => self
                    .remap_ingress
                    .remove(&remap_key(*k))
                    .map_err(Error::map(names::REMAP_INGRESS))?,
                Op::SetExtDnat(k, v) => self
                    .ext_dnat
                    .insert(&ext_key(*k), v, 0)
                    .map_err(Error::map(names::EXT_DNAT))?,
                Op::DelExtDnat(k) => self
                    .ext_dnat
                    .remove(&ext_key(*k))
                    .map_err(Error::map(names::EXT_DNAT))?,
                Op::SetExtSnat(k, v) => self
                    .ext_snat
                    .insert(&ext_key(*k), v, 0)
                    .map_err(Error::map(names::EXT_SNAT))?,
                Op::DelExtSnat(k) => self
                    .ext_snat
                    .remove(&ext_key(*k))
                    .map_err(Error::map(names::EXT_SNAT))?,
                Op::SetDest(k, v) => self
                    .dests
                    .insert(&remap_key(*k), v, 0)
                    .map_err(Error::map(names::DESTS))?,
                Op::DelDest(k) => self
                    .dests
                    .remove(&remap_key(*k))
                    .map_err(Error::map(names::DESTS))?,
                Op::ResetCounters(id) => {
                    let cpus = nr_cpus().map_err(|(_, e)| Error::io("counting CPUs", e))?;
                    for dir in [DIR_EGRESS, DIR_INGRESS] {
                        let zero = PerCpuValues::try_from(vec![Counters::default(); cpus])
                            .map_err(|e| Error::io("counter buffer", e))?;
                        self.counters
                            .set(counter_index(*id, dir), zero, 0)
                            .map_err(Error::map(names::COUNTERS))?;
                    }
                }
            }
        }
        Ok(())
    }

    /// A peer's counters summed over CPUs: (egress, ingress).
    pub fn peer_counters(&self, peer_id: u32) -> Result<(Counters, Counters), Error> {
        let sum = |dir| -> Result<Counters, Error> {
            let mut total = Counters::default();
            let per_cpu = self
                .counters
                .get(&counter_index(peer_id, dir), 0)
                .map_err(Error::map(names::COUNTERS))?;
            for c in per_cpu.iter() {
                total.add(c);
            }
            Ok(total)
        };
        Ok((sum(DIR_EGRESS)?, sum(DIR_INGRESS)?))
    }

    /// Drops by reason name, summed over CPUs.
    pub fn drops(&self) -> Result<BTreeMap<&'static str, u64>, Error> {
        let mut out = BTreeMap::new();
        for i in 0..reason::COUNT {
            let v = self.drops.get(&i, 0).map_err(Error::map(names::DROPS))?;
            out.insert(reason::name(reason::BASE + i), v.iter().sum());
        }
        Ok(out)
    }
}
