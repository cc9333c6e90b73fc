//! What inspection shows of a running data plane: peers with their counters, remaps,
//! externals and drop reasons, as JSON for tools and as tables for people (`fabric-agent
//! datapath show`, `fabricctl network dump`).
use std::{collections::BTreeMap, fmt::Write as _, net::Ipv4Addr};

use fabric_common::{Counters, IfaceConfig};
use serde::Serialize;

use crate::{Error, Maps};

impl Maps {
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
