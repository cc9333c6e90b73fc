//! Loading the embedded programs and attaching them: [`Dataplane::load`] (maps pinned and
//! reused across restarts), [`Dataplane::apply`] (maps first, then clsact filters replaced in
//! place) and [`Dataplane::reset`]. Only with the `programs` feature, which embeds the object.
use std::{
    collections::BTreeMap,
    io,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::MapInfo,
    programs::{
        SchedClassifier, TcAttachType,
        tc::{
            NlOptions, SchedClassifierLink, TcAttachOptions, TcError, TcHandle, qdisc_add_clsact,
            qdisc_detach_program,
        },
    },
};
use fabric_common::{
    Counters, ExtKey, IfaceConfig, MAX_DESTS, MAX_EXTERNALS, MAX_IFACES, MAX_PEERS, MAX_REMAPS,
    PeerMeta, RemapKey, Rewrite, drop as reason, maps as names, progs,
};
use serde::Serialize;
use tracing::{info, warn};

use crate::{DataplaneConfig, Error, FILTER_HANDLE, FILTER_PRIORITY, Maps, pins, state, sys};

/// The compiled programs (built by build.rs from `fabric-ebpf`).
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/fabric"));

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

/// What an apply did, for logs and the CLI.
#[derive(Debug, Default, Clone, Serialize)]
pub struct ApplyReport {
    pub attached: Vec<String>,
    pub replaced: Vec<String>,
    pub detached: Vec<String>,
    pub map_writes: usize,
}

/// What the log says when a restart adopts the programs pinned by an earlier run of its build.
pub const ADOPTED: &str = "programs adopted from their pins";

/// Loaded programs plus their maps.
pub struct Dataplane {
    programs: Programs,
    maps: Maps,
    pin_dir: Option<PathBuf>,
}

/// Where the programs come from: the object, loaded and verified by this process, or the
/// pins of an earlier run of this build ([`pins`]).
enum Programs {
    Object(Box<Ebpf>),
    /// Egress, ingress.
    Pinned(Box<(SchedClassifier, SchedClassifier)>),
}

impl Programs {
    fn get(&self, name: &str) -> &SchedClassifier {
        match self {
            Self::Object(ebpf) => ebpf
                .program(name)
                .expect("program checked at load")
                .try_into()
                .expect("program type checked at load"),
            Self::Pinned(p) => match name {
                progs::EGRESS => &p.0,
                _ => &p.1,
            },
        }
    }

    fn get_mut(&mut self, name: &str) -> &mut SchedClassifier {
        match self {
            Self::Object(ebpf) => ebpf
                .program_mut(name)
                .expect("program checked at load")
                .try_into()
                .expect("program type checked at load"),
            Self::Pinned(p) => match name {
                progs::EGRESS => &mut p.0,
                _ => &mut p.1,
            },
        }
    }
}

const TC_PRIORITY: u16 = FILTER_PRIORITY;
const TC_HANDLE: TcHandle = TcHandle::new(0, FILTER_HANDLE as u16);

const DIRS: [(TcAttachType, &str, &str); 2] = [
    (TcAttachType::Egress, progs::EGRESS, "egress"),
    (TcAttachType::Ingress, progs::INGRESS, "ingress"),
];

impl Dataplane {
    /// Loads the programs. With a pin directory, maps are pinned there and reused when already
    /// pinned (state survives restarts), and so are the verified programs: a restart of the
    /// same build adopts them without loading the object again ([`pins`]). Without one they
    /// are private to this process (tests).
    pub fn load(pin_dir: Option<&Path>) -> Result<Self, Error> {
        if let Some(dir) = pin_dir {
            sys::ensure_pin_dir(dir)?;
            match pins::adopt(dir) {
                Ok((egress, ingress, maps)) => {
                    info!(pin_dir = %dir.display(), "{ADOPTED}");
                    return Ok(Self {
                        programs: Programs::Pinned(Box::new((egress, ingress))),
                        maps,
                        pin_dir: Some(dir.to_owned()),
                    });
                }
                Err(why) => info!(pin_dir = %dir.display(), why, "loading the programs"),
            }
        }
        let mut loader = EbpfLoader::new();
        if let Some(dir) = pin_dir {
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
            // A program not pinned still runs: the next start loads it again, no more.
            if let Some(dir) = pin_dir
                && let Err(e) = Self::pin_program(p, dir, prog)
            {
                warn!(error = ?e, "the next start will load the programs again");
            }
        }
        if let Some(dir) = pin_dir {
            for old in pins::stale_in(dir) {
                if let Err(e) = remove_pin(&old) {
                    warn!(error = ?e, "another build's program left pinned");
                }
            }
        }
        let maps = Maps::from_source(|name| {
            ebpf.take_map(name)
                .ok_or_else(|| Error::Config(format!("map {name} missing from the object")))
        })?;
        Ok(Self {
            programs: Programs::Object(Box::new(ebpf)),
            maps,
            pin_dir: pin_dir.map(Path::to_owned),
        })
    }

    /// Pins verified program `prog` for the next run of this build, in place of a pin of
    /// that name it could not adopt (its maps were replaced since).
    fn pin_program(p: &mut SchedClassifier, dir: &Path, prog: &str) -> Result<(), Error> {
        let path = pins::pin_path(dir, prog);
        remove_pin(&path)?;
        p.pin(&path).map_err(|source| Error::Pin {
            what: format!("{prog} at {}", path.display()),
            source,
        })
    }

    pub fn maps(&mut self) -> &mut Maps {
        &mut self.maps
    }

    /// The empty program, loaded on demand, for measuring the test harness.
    pub fn noop_program(&mut self) -> Result<&SchedClassifier, Error> {
        let Programs::Object(ebpf) = &mut self.programs else {
            return Err(Error::Config(
                "the noop program is only in a data plane loaded from the object".into(),
            ));
        };
        let p: &mut SchedClassifier = ebpf
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
        self.programs.get(name)
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
            let p = self.programs.get_mut(prog);
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
            remove_pin(&pin_dir.join(name))?;
        }
        for p in pins::all_in(pin_dir) {
            remove_pin(&p)?;
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

/// Removes a pin; one already gone is fine.
fn remove_pin(p: &Path) -> Result<(), Error> {
    match std::fs::remove_file(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("removing {}", p.display()), e)),
    }
}
