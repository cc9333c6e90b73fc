//! Loader and typed control of the fabric eBPF data plane, shared by the agent and the gateway.
//!
//! - [`Dataplane::load`] loads the programs embedded in this crate, reusing maps pinned under
//!   the pin directory (so a restart keeps state and traffic).
//! - [`Dataplane::apply`] reconciles attachments and maps with a [`DataplaneConfig`]: pure diff
//!   in [`state`], kernel writes here. Programs go on as clsact filters at a fixed priority
//!   and handle, which outlive the process (the README's "Why clsact filters and not TCX"); a
//!   reload swaps the program inside the existing filter atomically.
//! - [`Maps::open_pinned`] + [`Maps::snapshot`] read everything without loading anything.
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    io,
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{
        HashMap, LpmTrie, Map, MapData, MapError, MapInfo, PerCpuArray, PerCpuValues, lpm_trie::Key,
    },
    programs::{
        SchedClassifier, TcAttachType,
        tc::{
            NlOptions, SchedClassifierLink, TcAttachOptions, TcError, TcHandle, qdisc_add_clsact,
            qdisc_detach_program,
        },
    },
    util::nr_cpus,
};
use fabric_common::{
    Counters, DIR_EGRESS, DIR_INGRESS, ExtKey, IfaceConfig, MAX_DESTS, MAX_EXTERNALS, MAX_IFACES,
    MAX_PEERS, MAX_REMAPS, PeerMeta, RemapKey, Rewrite, counter_index, drop as reason,
    maps as names, progs,
};
use serde::Serialize;
use tracing::{debug, info, warn};

pub mod bench;
pub mod config;
pub mod guard;
pub mod state;
pub mod sys;

pub use config::{DataplaneConfig, ExternalMapping, PeerConfig, Remap};
pub use fabric_common::DEFAULT_PIN_DIR;
use state::{MapState, Op, PeerMetaEntry};

/// The compiled programs (built by build.rs from `fabric-ebpf`).
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/fabric"));

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("interface {name}: {reason}")]
    Interface { name: String, reason: String },
    #[error("BPF filesystem: {0}")]
    BpfFs(String),
    #[error("loading the eBPF object")]
    Load(#[from] aya::EbpfError),
    #[error("map {map}")]
    Map {
        map: &'static str,
        #[source]
        source: MapError,
    },
    #[error("{what}")]
    Program {
        what: String,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("pinning {what}")]
    Pin {
        what: String,
        #[source]
        source: aya::pin::PinError,
    },
    #[error("no fabric data plane is pinned at {0}; run `fabric-agent datapath apply` first")]
    NotLoaded(PathBuf),
    #[error(transparent)]
    Netns(#[from] fabric_netns::Error),
}

impl Error {
    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }
    fn map(map: &'static str) -> impl FnOnce(MapError) -> Self {
        move |source| Error::Map { map, source }
    }
    fn prog(what: impl Into<String>) -> impl FnOnce(aya::programs::ProgramError) -> Self {
        let what = what.into();
        move |source| Error::Program { what, source }
    }
}

/// Key size, value size and capacity of each map: a pinned map that does not match (left by
/// an older build) is replaced rather than reused with the wrong layout.
fn expected_shape(name: &str) -> (u32, u32, u32) {
    use std::mem::size_of;
    let (k, v, n) = match name {
        names::IFACES => (4, size_of::<IfaceConfig>(), MAX_IFACES),
        names::PEERS => (4, size_of::<PeerMeta>(), MAX_PEERS),
        names::REMAP_EGRESS | names::REMAP_INGRESS => {
            (4 + size_of::<RemapKey>(), size_of::<Rewrite>(), MAX_REMAPS)
        }
        names::EXT_DNAT | names::EXT_SNAT => {
            (4 + size_of::<ExtKey>(), size_of::<Rewrite>(), MAX_EXTERNALS)
        }
        names::DESTS => (4 + size_of::<RemapKey>(), 4, MAX_DESTS),
        names::COUNTERS => (4, size_of::<Counters>(), MAX_PEERS * 2),
        names::DROPS => (4, 8, reason::COUNT),
        _ => unreachable!("unknown map {name}"),
    };
    (k as u32, v as u32, n)
}

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
    fn from_source(
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

    /// Everything, in a form for people (`show`) and for tools (JSON).
    pub fn snapshot(&self) -> Result<Snapshot, Error> {
        let s = self.read_state()?;
        let mut peers = Vec::new();
        let by_peer: BTreeMap<u32, (u32, IfaceConfig)> = s
            .ifaces
            .iter()
            .map(|(i, c)| (c.peer_id, (*i, *c)))
            .collect();
        for (id, meta) in &s.peers {
            let (egress, ingress) = self.peer_counters(*id)?;
            let iface = by_peer.get(id);
            peers.push(PeerStatus {
                id: *id,
                name: meta.name.clone(),
                interface: meta.ifname.clone(),
                ifindex: iface.map(|(i, _)| *i),
                mss: iface.map(|(_, c)| c.mss).filter(|m| *m != 0),
                egress,
                ingress,
            });
        }
        let cidr = |addr: u32, len: u8| format!("{}/{len}", Ipv4Addr::from(addr));
        let remaps = s
            .remap_egress
            .iter()
            .map(|((peer, len, addr), rw)| RemapStatus {
                peer_id: *peer,
                peer: s
                    .peers
                    .get(peer)
                    .map(|m| m.name.clone())
                    .unwrap_or_default(),
                local: cidr(*addr, *len),
                remote: cidr(u32::from_be(rw.prefix), *len),
            })
            .collect();
        let externals = s
            .ext_dnat
            .iter()
            .map(|((len, addr), rw)| ExternalStatus {
                external: cidr(*addr, *len),
                internal: cidr(u32::from_be(rw.prefix), *len),
            })
            .collect();
        Ok(Snapshot {
            peers,
            remaps,
            externals,
            drops: self
                .drops()?
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
        })
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    pub peers: Vec<PeerStatus>,
    pub remaps: Vec<RemapStatus>,
    pub externals: Vec<ExternalStatus>,
    pub drops: BTreeMap<String, u64>,
}

impl Snapshot {
    /// The snapshot as tables for people (`datapath show`, `fabricctl network dump`).
    pub fn to_table(&self) -> String {
        let s = self;
        let mut o = String::new();
        let _ = writeln!(o, "PEERS");
        let _ = writeln!(
            o,
            "  {:>4}  {:<16} {:<12} {:>7} {:>5}  {:<7} {:>12} {:>14} {:>10} {:>8} {:>8} {:>8} {:>8}",
            "ID",
            "NAME",
            "INTERFACE",
            "IFINDEX",
            "MSS",
            "DIR",
            "PACKETS",
            "BYTES",
            "REMAPPED",
            "CLAMPED",
            "ICMPERR",
            "DROPPED",
            "REFUSED"
        );
        for p in &s.peers {
            for (i, (dir, c)) in [("egress", &p.egress), ("ingress", &p.ingress)]
                .into_iter()
                .enumerate()
            {
                let (id, name, ifname, idx, mss) = if i == 0 {
                    (
                        p.id.to_string(),
                        p.name.as_str(),
                        p.interface.as_str(),
                        p.ifindex.map_or("-".into(), |i| i.to_string()),
                        p.mss.map_or("-".into(), |m| m.to_string()),
                    )
                } else {
                    (String::new(), "", "", String::new(), String::new())
                };
                let _ = writeln!(
                    o,
                    "  {id:>4}  {name:<16} {ifname:<12} {idx:>7} {mss:>5}  {dir:<7} {:>12} {:>14} {:>10} {:>8} {:>8} {:>8} {:>8}",
                    c.packets,
                    c.bytes,
                    c.remapped,
                    c.mss_clamped,
                    c.icmp_errors,
                    c.dropped,
                    c.refused
                );
            }
        }
        if s.peers.is_empty() {
            let _ = writeln!(o, "  (none)");
        }
        let _ = writeln!(
            o,
            "\nREMAPS (this cluster's view -> the peer's real prefix)"
        );
        for r in &s.remaps {
            let _ = writeln!(o, "  {:<16} {:>18} -> {}", r.peer, r.local, r.remote);
        }
        if s.remaps.is_empty() {
            let _ = writeln!(o, "  (none)");
        }
        let _ = writeln!(o, "\nEXTERNALS (local external-CIDR address -> local IP)");
        for e in &s.externals {
            let _ = writeln!(o, "  {:>18} -> {}", e.external, e.internal);
        }
        if s.externals.is_empty() {
            let _ = writeln!(o, "  (none)");
        }
        let _ = writeln!(o, "\nDROPS");
        for (k, v) in &s.drops {
            let _ = writeln!(o, "  {k:<16} {v}");
        }
        o
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct PeerStatus {
    pub id: u32,
    pub name: String,
    pub interface: String,
    /// None when the peer's interface is not being handled (device gone).
    pub ifindex: Option<u32>,
    pub mss: Option<u16>,
    #[serde(serialize_with = "ser_counters")]
    pub egress: Counters,
    #[serde(serialize_with = "ser_counters")]
    pub ingress: Counters,
}

fn ser_counters<S: serde::Serializer>(c: &Counters, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeStruct;
    let mut st = s.serialize_struct("Counters", 7)?;
    st.serialize_field("packets", &c.packets)?;
    st.serialize_field("bytes", &c.bytes)?;
    st.serialize_field("remapped", &c.remapped)?;
    st.serialize_field("mss_clamped", &c.mss_clamped)?;
    st.serialize_field("icmp_errors", &c.icmp_errors)?;
    st.serialize_field("dropped", &c.dropped)?;
    st.serialize_field("refused", &c.refused)?;
    st.end()
}

#[derive(Debug, Clone, Serialize)]
pub struct RemapStatus {
    pub peer_id: u32,
    pub peer: String,
    /// This cluster's view of the peer's prefix.
    pub local: String,
    /// The peer's real prefix.
    pub remote: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ExternalStatus {
    pub external: String,
    pub internal: String,
}

/// What an apply did, for logs and the CLI.
#[derive(Debug, Default, Clone, Serialize)]
pub struct ApplyReport {
    pub attached: Vec<String>,
    pub replaced: Vec<String>,
    pub detached: Vec<String>,
    pub map_writes: usize,
}

/// Loaded programs plus their maps.
pub struct Dataplane {
    ebpf: Ebpf,
    maps: Maps,
    pin_dir: Option<PathBuf>,
}

/// Where our filters sit in the clsact hooks (`tc filter show dev X egress`: pref 1, handle
/// 0xfab). Fixed, so a reload finds and replaces them and a checker can tell they are there.
pub const FILTER_PRIORITY: u16 = 1;
pub const FILTER_HANDLE: u32 = 0xfab;
const TC_PRIORITY: u16 = FILTER_PRIORITY;
const TC_HANDLE: TcHandle = TcHandle::new(0, FILTER_HANDLE as u16);

const DIRS: [(TcAttachType, &str, &str); 2] = [
    (TcAttachType::Egress, progs::EGRESS, "egress"),
    (TcAttachType::Ingress, progs::INGRESS, "ingress"),
];

impl Dataplane {
    /// Loads the programs. With a pin directory, maps are pinned there and reused when already
    /// pinned (state survives restarts); without one they are private to this process (tests).
    pub fn load(pin_dir: Option<&Path>) -> Result<Self, Error> {
        let mut loader = EbpfLoader::new();
        if let Some(dir) = pin_dir {
            sys::ensure_pin_dir(dir)?;
            for name in names::ALL {
                let path = dir.join(name);
                if path.exists() {
                    let want = expected_shape(name);
                    match MapInfo::from_pin(&path) {
                        Ok(i) if (i.key_size(), i.value_size(), i.max_entries()) == want => {}
                        other => {
                            warn!(map = name, found = ?other.map(|i| (i.key_size(), i.value_size(), i.max_entries())), expected = ?want,
                                "pinned map has another layout; replacing it");
                            std::fs::remove_file(&path).map_err(|e| {
                                Error::io(format!("removing {}", path.display()), e)
                            })?;
                        }
                    }
                }
                loader.map_pin_path(name, path);
            }
        }
        let mut ebpf = loader.load(EBPF_OBJECT)?;
        for (_, prog, _) in DIRS {
            let p: &mut SchedClassifier = ebpf
                .program_mut(prog)
                .ok_or_else(|| Error::Config(format!("program {prog} missing from the object")))?
                .try_into()
                .map_err(Error::prog(prog))?;
            p.load().map_err(Error::prog(format!("verifying {prog}")))?;
        }
        let maps = Maps::from_source(|name| {
            ebpf.take_map(name)
                .ok_or_else(|| Error::Config(format!("map {name} missing from the object")))
        })?;
        Ok(Self {
            ebpf,
            maps,
            pin_dir: pin_dir.map(Path::to_owned),
        })
    }

    pub fn maps(&mut self) -> &mut Maps {
        &mut self.maps
    }

    /// The empty program, loaded on demand, for measuring the test harness.
    pub fn noop_program(&mut self) -> Result<&SchedClassifier, Error> {
        let p: &mut SchedClassifier = self
            .ebpf
            .program_mut(progs::NOOP)
            .ok_or_else(|| Error::Config("noop program missing".into()))?
            .try_into()
            .map_err(Error::prog(progs::NOOP))?;
        if p.fd().is_err() {
            p.load().map_err(Error::prog(progs::NOOP))?;
        }
        Ok(p)
    }

    /// The program for a direction, e.g. to run it with `BPF_PROG_TEST_RUN`.
    pub fn program(&self, egress: bool) -> &SchedClassifier {
        let name = if egress {
            progs::EGRESS
        } else {
            progs::INGRESS
        };
        self.ebpf
            .program(name)
            .expect("program checked at load")
            .try_into()
            .expect("program type checked at load")
    }

    /// Attaches both programs to `ifname` as clsact filters at a fixed priority and handle.
    /// An existing filter of ours is replaced in place (the kernel swaps the program under
    /// RCU: no packet sees a gap or both programs). Returns whether one was replaced.
    ///
    /// Why not TCX: a TCX link lives only as long as its fd or its bpffs pin, and this
    /// project's reference kernel refuses to pin links (EPERM), so a restarted agent would
    /// leave traffic un-translated. clsact filters persist on their own.
    fn attach(&mut self, ifname: &str) -> Result<bool, Error> {
        match qdisc_add_clsact(ifname) {
            Ok(()) => {}
            Err(TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => {
                return Err(Error::Program {
                    what: format!("adding the clsact qdisc to {ifname}"),
                    source: e.into(),
                });
            }
        }
        let mut replaced = true;
        for (ty, prog, _) in DIRS {
            let p: &mut SchedClassifier = self
                .ebpf
                .program_mut(prog)
                .expect("checked at load")
                .try_into()
                .expect("checked at load");
            let existing = SchedClassifierLink::attached(ifname, ty, TC_PRIORITY, TC_HANDLE, None)
                .map_err(|e| Error::io(format!("looking up {ifname}"), e))?;
            let id = match p.attach_to_link(existing) {
                Ok(id) => id,
                Err(_) => {
                    // Nothing there yet (or something else at our slot): create it.
                    replaced = false;
                    let _ = qdisc_detach_program(ifname, ty, prog);
                    p.attach_with_options(
                        ifname,
                        ty,
                        TcAttachOptions::Netlink(NlOptions {
                            priority: TC_PRIORITY,
                            handle: TC_HANDLE,
                            classid: None,
                        }),
                    )
                    .map_err(|e| Error::Program {
                        what: format!("attaching {prog} to {ifname}"),
                        source: e,
                    })?
                }
            };
            // The filter must outlive this process: dropping the link would detach it.
            let link = p.take_link(id).map_err(Error::prog("taking link"))?;
            std::mem::forget(link);
        }
        Ok(replaced)
    }

    /// Removes our filters from an interface (in the current netns). Missing ones are fine.
    fn detach(ifname: &str) -> Result<(), Error> {
        if sys::link_facts(ifname).is_err() {
            return Ok(()); // device gone, filters with it
        }
        for (ty, prog, _) in DIRS {
            match qdisc_detach_program(ifname, ty, prog) {
                Ok(()) => {}
                Err(TcError::IoError(e)) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(Error::Program {
                        what: format!("detaching {prog} from {ifname}"),
                        source: e.into(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Makes attachments and maps match `cfg`. Safe to repeat; a reload of a new build goes
    /// through here too (maps reused, programs swapped in place).
    pub fn apply(&mut self, cfg: &DataplaneConfig) -> Result<ApplyReport, Error> {
        cfg.validate()?;
        if self.pin_dir.is_none() {
            return Err(Error::Config("attaching needs a pin directory".into()));
        }
        let mut links = BTreeMap::new();
        for p in &cfg.peers {
            links.insert(p.interface.clone(), sys::link_facts(&p.interface)?);
        }
        // Rewrites first, then programs: a freshly attached program finds its entries ready.
        let own = sys::own_ipv4_addrs()?;
        let (cur, map_writes) = self.maps.reconcile(&state::desired(cfg, &links, &own))?;
        let previously: Vec<String> = cur.peers.values().map(|m| m.ifname.clone()).collect();
        let mut report = ApplyReport {
            map_writes,
            ..Default::default()
        };
        for p in &cfg.peers {
            if self.attach(&p.interface)? {
                report.replaced.push(p.interface.clone());
            } else {
                report.attached.push(p.interface.clone());
            }
        }
        for ifname in previously {
            if !links.contains_key(&ifname) {
                Self::detach(&ifname)?;
                report.detached.push(ifname);
            }
        }
        info!(?report, "data plane applied");
        Ok(report)
    }

    /// Loads the data plane pinned at `pin_dir` and applies `cfg`: what `fabric-agent datapath
    /// apply` does. A configuration naming a missing device fails before anything is loaded,
    /// and when this call created the pin directory, a failure removes what it pinned or
    /// attached again: a failed first apply leaves nothing half-done. A running data plane
    /// (pins already there) is left as it was.
    pub fn load_and_apply(pin_dir: &Path, cfg: &DataplaneConfig) -> Result<ApplyReport, Error> {
        cfg.validate()?;
        for p in &cfg.peers {
            sys::link_facts(&p.interface)?;
        }
        let fresh = !pin_dir.exists();
        let r = Self::load(Some(pin_dir)).and_then(|mut dp| dp.apply(cfg));
        if r.is_err()
            && fresh
            && let Err(e) = Self::reset(pin_dir)
        {
            warn!(pin_dir = %pin_dir.display(), error = %e, "cleaning up after a failed apply");
        }
        r
    }

    /// Puts back map entries that differ from `cfg` (deleted or overwritten by someone else)
    /// without touching the attachments. Returns how many entries it wrote: 0 when nothing
    /// had drifted.
    pub fn repair_maps(&mut self, cfg: &DataplaneConfig) -> Result<usize, Error> {
        let mut links = BTreeMap::new();
        for p in &cfg.peers {
            links.insert(p.interface.clone(), sys::link_facts(&p.interface)?);
        }
        let own = sys::own_ipv4_addrs()?;
        let (_, writes) = self.maps.reconcile(&state::desired(cfg, &links, &own))?;
        Ok(writes)
    }

    /// Detaches from every interface the maps know and removes every pin under `pin_dir`.
    /// Idempotent. Run it in the network namespace the data plane was applied in.
    pub fn reset(pin_dir: &Path) -> Result<Vec<String>, Error> {
        if !pin_dir.exists() {
            return Ok(Vec::new());
        }
        let mut ifaces = Vec::new();
        if let Ok(maps) = Maps::open_pinned(pin_dir) {
            let st = maps.read_state()?;
            ifaces.extend(st.peers.values().map(|m| m.ifname.clone()));
            ifaces.extend(st.ifaces.keys().filter_map(|i| sys::ifname(*i)));
            ifaces.sort();
            ifaces.dedup();
        }
        for i in &ifaces {
            Self::detach(i)?;
        }
        for name in names::ALL {
            let p = pin_dir.join(name);
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(format!("removing {}", p.display()), e)),
            }
        }
        std::fs::remove_dir(pin_dir).map_err(|e| {
            Error::io(
                format!("removing {} (unknown files left in it?)", pin_dir.display()),
                e,
            )
        })?;
        Ok(ifaces)
    }
}
