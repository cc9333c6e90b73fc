//! The VXLAN overlay between the nodes and the gateway.
//!
//! The routed design sends peer traffic from a node straight to the gateway's address, which
//! only works when that address is on a subnet of the node (a flat network, or a
//! host-network gateway). With the overlay, every node and the gateway have a VXLAN device
//! (`fabric.vx`) and routes point at the other side's real address *on-link through that
//! device*: the kernel wraps the packet in UDP to that address, which the cluster network
//! reaches however it is built (routed node subnets, a pod overlay of its own, ...).
//!
//! No overlay addresses and no ARP: each device's MAC is derived from its endpoint's IP
//! ([`mac`]), so each side writes a permanent neighbour entry (IP -> MAC) and a forwarding
//! entry (MAC -> IP) for every remote endpoint. Nothing is learnt or flooded, every entry can
//! be recomputed from the endpoint list, and drift repair is a diff.
use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr},
};

use futures::TryStreamExt;
use netlink_packet_route::{
    AddressFamily,
    link::{InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage},
    neighbour::{
        NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
    },
};
use rtnetlink::{Handle, LinkUnspec, LinkVxlan};

/// Device name on nodes and on the gateway.
pub const DEFAULT_DEVICE: &str = "fabric.vx";
/// VXLAN network identifier of the fabric overlay.
pub const DEFAULT_VNI: u32 = 0xfab;
/// UDP port: not 4789 (Calico, Cilium and others use it) nor 8472 (flannel).
pub const DEFAULT_PORT: u16 = 4790;
/// Inner MTU: a 1500-byte underlay minus the VXLAN encapsulation (50 bytes).
pub const DEFAULT_MTU: u32 = 1450;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlay {
    pub device: String,
    pub vni: u32,
    pub port: u16,
    pub mtu: u32,
}

impl Default for Overlay {
    fn default() -> Self {
        Self {
            device: DEFAULT_DEVICE.into(),
            vni: DEFAULT_VNI,
            port: DEFAULT_PORT,
            mtu: DEFAULT_MTU,
        }
    }
}

/// The overlay's settings as command-line flags, shared by the agent and the gateway operator
/// (both ends must agree on them).
#[derive(Debug, Clone, clap::Args)]
pub struct OverlayArgs {
    /// VXLAN network identifier of the overlay (24 bits; the same on nodes and gateway).
    #[arg(
        long = "overlay-vni",
        default_value_t = DEFAULT_VNI,
        value_parser = clap::value_parser!(u32).range(1..=0xff_ffff)
    )]
    pub vni: u32,
    /// UDP port of the overlay (the same on nodes and gateway).
    #[arg(
        long = "overlay-port",
        default_value_t = DEFAULT_PORT,
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    pub port: u16,
}

impl OverlayArgs {
    pub fn overlay(&self) -> Overlay {
        Overlay {
            vni: self.vni,
            port: self.port,
            ..Default::default()
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OverlayError {
    #[error("netlink: {op}: {source}")]
    Netlink {
        op: String,
        #[source]
        source: rtnetlink::Error,
    },
    #[error(
        "{0} exists and is not a VXLAN device; rename or remove it, or pick another --overlay-device"
    )]
    NotVxlan(String),
}

fn nl(op: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> OverlayError {
    let op = op.into();
    move |source| OverlayError::Netlink { op, source }
}

/// The overlay MAC of the endpoint with address `ip`: locally administered, unicast.
pub fn mac(ip: Ipv4Addr) -> [u8; 6] {
    let o = ip.octets();
    [0x02, 0xfa, o[0], o[1], o[2], o[3]]
}

/// What matters of an existing device.
#[derive(Debug, PartialEq, Eq)]
struct DeviceFacts {
    index: u32,
    vxlan: bool,
    vni: Option<u32>,
    port: Option<u16>,
    local: Option<Ipv4Addr>,
    mac: Vec<u8>,
    mtu: Option<u32>,
    up: bool,
}

fn facts(m: &LinkMessage) -> DeviceFacts {
    let mut f = DeviceFacts {
        index: m.header.index,
        vxlan: false,
        vni: None,
        port: None,
        local: None,
        mac: Vec::new(),
        mtu: None,
        up: m.header.flags.contains(LinkFlags::Up),
    };
    for a in &m.attributes {
        match a {
            LinkAttribute::Address(a) => f.mac = a.clone(),
            LinkAttribute::Mtu(v) => f.mtu = Some(*v),
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    match i {
                        LinkInfo::Kind(InfoKind::Vxlan) => f.vxlan = true,
                        LinkInfo::Data(InfoData::Vxlan(v)) => {
                            for x in v {
                                match x {
                                    InfoVxlan::Id(id) => f.vni = Some(*id),
                                    InfoVxlan::Port(p) => f.port = Some(*p),
                                    InfoVxlan::Local(a) => f.local = Some(*a),
                                    _ => {}
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    f
}

async fn find(h: &Handle, name: &str) -> Result<Option<DeviceFacts>, OverlayError> {
    let mut s = h.link().get().match_name(name.to_owned()).execute();
    match s.try_next().await {
        Ok(m) => Ok(m.as_ref().map(facts)),
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(None),
        Err(e) => Err(nl(format!("looking up {name}"))(e)),
    }
}

/// An overlay device as it is now, for inspection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inspection {
    pub ifindex: u32,
    pub vni: Option<u32>,
    pub port: Option<u16>,
    pub mac: Vec<u8>,
    /// The entries of ours on it (each remote endpoint should have both kinds).
    pub entries: BTreeSet<Entry>,
    /// Entries that are not ours (other MACs): the next sync removes them.
    pub foreign: usize,
}

impl Inspection {
    /// Remote endpoints with both entries, and those with only one of the two.
    pub fn endpoints(&self) -> (Vec<Ipv4Addr>, Vec<Ipv4Addr>) {
        let of = |want_fdb: bool| -> BTreeSet<Ipv4Addr> {
            self.entries
                .iter()
                .filter_map(|e| match *e {
                    Entry::Fdb(ip) if want_fdb => Some(ip),
                    Entry::Neighbour(ip) if !want_fdb => Some(ip),
                    _ => None,
                })
                .collect()
        };
        let (fdb, neigh) = (of(true), of(false));
        (
            fdb.intersection(&neigh).copied().collect(),
            fdb.symmetric_difference(&neigh).copied().collect(),
        )
    }
}

/// The overlay device `name` and its entries; None when there is no such VXLAN device.
pub async fn inspect(h: &Handle, name: &str) -> Result<Option<Inspection>, OverlayError> {
    let Some(f) = find(h, name).await?.filter(|f| f.vxlan) else {
        return Ok(None);
    };
    let (entries, foreign) = current(h, f.index).await?;
    Ok(Some(Inspection {
        ifindex: f.index,
        vni: f.vni,
        port: f.port,
        mac: f.mac,
        entries,
        foreign: foreign.len(),
    }))
}

/// What [`ensure_device`] had to do.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DeviceChange {
    pub created: bool,
    /// Recreated because its VNI or port was not ours.
    pub recreated: bool,
    /// MAC, MTU or up state put back.
    pub fixed: bool,
}

impl DeviceChange {
    pub fn any(&self) -> bool {
        self.created || self.recreated || self.fixed
    }
}

/// Makes the overlay device exist for the local endpoint `local`: our VNI and port, `local`
/// as the outer source (what the other side's guard expects, also on multi-homed hosts), no
/// learning, MAC [`mac`]`(local)`, MTU, up. Returns its ifindex and what changed.
pub async fn ensure_device(
    h: &Handle,
    o: &Overlay,
    local: Ipv4Addr,
) -> Result<(u32, DeviceChange), OverlayError> {
    let want_mac = mac(local).to_vec();
    let mut change = DeviceChange::default();
    if let Some(f) = find(h, &o.device).await? {
        if !f.vxlan {
            return Err(OverlayError::NotVxlan(o.device.clone()));
        }
        if f.vni == Some(o.vni) && f.port == Some(o.port) && f.local == Some(local) {
            if f.mac != want_mac || f.mtu != Some(o.mtu) || !f.up {
                h.link()
                    .set(
                        LinkUnspec::new_with_index(f.index)
                            .address(want_mac)
                            .mtu(o.mtu)
                            .up()
                            .build(),
                    )
                    .execute()
                    .await
                    .map_err(nl(format!("setting up {}", o.device)))?;
                change.fixed = true;
            }
            return Ok((f.index, change));
        }
        // A VNI, port or local address cannot be changed in place.
        h.link()
            .del(f.index)
            .execute()
            .await
            .map_err(nl(format!("removing {} to recreate it", o.device)))?;
        change.recreated = true;
    } else {
        change.created = true;
    }
    h.link()
        .add(
            LinkVxlan::new(&o.device, o.vni)
                .port(o.port)
                .local(local)
                .learning(false)
                .address(want_mac)
                .mtu(o.mtu)
                .up()
                .build(),
        )
        .execute()
        .await
        .map_err(nl(format!("creating VXLAN device {}", o.device)))?;
    let f = find(h, &o.device)
        .await?
        .ok_or_else(|| OverlayError::NotVxlan(o.device.clone()))?;
    if !f.up {
        h.link()
            .set(LinkUnspec::new_with_index(f.index).up().build())
            .execute()
            .await
            .map_err(nl(format!("bringing {} up", o.device)))?;
    }
    Ok((f.index, change))
}

/// Removes the overlay device (and with it its routes and entries). Fine when absent.
pub async fn remove_device(h: &Handle, o: &Overlay) -> Result<bool, OverlayError> {
    match find(h, &o.device).await? {
        Some(f) if f.vxlan => {
            h.link()
                .del(f.index)
                .execute()
                .await
                .map_err(nl(format!("removing {}", o.device)))?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// A forwarding entry (MAC -> remote IP) or a neighbour entry (IP -> MAC) on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Entry {
    Fdb(Ipv4Addr),
    Neighbour(Ipv4Addr),
}

/// The entries `remotes` need: both kinds for each.
pub fn desired(remotes: &BTreeSet<Ipv4Addr>) -> BTreeSet<Entry> {
    remotes
        .iter()
        .flat_map(|r| [Entry::Fdb(*r), Entry::Neighbour(*r)])
        .collect()
}

fn entry_of(m: &NeighbourMessage) -> Option<Entry> {
    let mut dst = None;
    let mut lla = None;
    for a in &m.attributes {
        match a {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) => dst = Some(*ip),
            // Forwarding entries (bridge family) come back with the address undecoded.
            NeighbourAttribute::Destination(NeighbourAddress::Other(b)) => {
                dst = <[u8; 4]>::try_from(b.as_slice()).ok().map(Ipv4Addr::from)
            }
            NeighbourAttribute::LinkLayerAddress(l) => lla = Some(l.as_slice()),
            _ => {}
        }
    }
    let (dst, lla) = (dst?, lla?);
    // Only what we would have written: other entries (the kernel's, someone's experiments
    // with other MACs) are listed as foreign by the caller via None.
    if lla != mac(dst) {
        return None;
    }
    match m.header.family {
        AddressFamily::Bridge => Some(Entry::Fdb(dst)),
        AddressFamily::Inet if m.header.state == NeighbourState::Permanent => {
            Some(Entry::Neighbour(dst))
        }
        _ => None,
    }
}

/// Entries on the device now: ours, and the messages of everything else that would get in
/// the way (forwarding entries of other MACs, neighbours with other MACs), to be removed.
async fn current(
    h: &Handle,
    ifindex: u32,
) -> Result<(BTreeSet<Entry>, Vec<NeighbourMessage>), OverlayError> {
    let mut ours = BTreeSet::new();
    let mut foreign = Vec::new();
    for family in [AddressFamily::Bridge, AddressFamily::Inet] {
        let mut s = h.neighbours().get().set_address_family(family).execute();
        while let Some(m) = s
            .try_next()
            .await
            .map_err(nl("listing neighbour and forwarding entries"))?
        {
            if m.header.ifindex != ifindex {
                continue;
            }
            match entry_of(&m) {
                Some(e) => {
                    ours.insert(e);
                }
                // Incomplete/failed ARP attempts are harmless and come back; leave them.
                None if m.header.family == AddressFamily::Inet
                    && m.header.state != NeighbourState::Permanent
                    && m.header.state != NeighbourState::Reachable
                    && m.header.state != NeighbourState::Stale => {}
                None => foreign.push(m),
            }
        }
    }
    Ok((ours, foreign))
}

/// What [`sync_remotes`] changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RemotesChange {
    pub added: Vec<Entry>,
    pub removed: Vec<Entry>,
    pub foreign_removed: usize,
}

/// Makes the device's forwarding and neighbour entries exactly those for `remotes`.
pub async fn sync_remotes(
    h: &Handle,
    ifindex: u32,
    remotes: &BTreeSet<Ipv4Addr>,
) -> Result<RemotesChange, OverlayError> {
    let want = desired(remotes);
    let (cur, foreign) = current(h, ifindex).await?;
    let mut change = RemotesChange::default();
    for m in foreign {
        match h.neighbours().del(m).execute().await {
            Ok(()) => change.foreign_removed += 1,
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENOENT => {}
            Err(e) => return Err(nl("removing a stray entry")(e)),
        }
    }
    for e in cur.difference(&want) {
        let m = message(ifindex, *e);
        match h.neighbours().del(m).execute().await {
            Ok(()) => {}
            Err(rtnetlink::Error::NetlinkError(x)) if x.raw_code() == -libc::ENOENT => {}
            Err(x) => return Err(nl(format!("removing {e:?}"))(x)),
        }
        change.removed.push(*e);
    }
    for e in want.difference(&cur) {
        let req = match *e {
            Entry::Fdb(ip) => h
                .neighbours()
                .add_bridge(ifindex, &mac(ip))
                .destination(IpAddr::V4(ip))
                .flags(NeighbourFlags::Own),
            Entry::Neighbour(ip) => h
                .neighbours()
                .add(ifindex, IpAddr::V4(ip))
                .link_layer_address(&mac(ip)),
        };
        req.replace()
            .execute()
            .await
            .map_err(nl(format!("adding {e:?}")))?;
        change.added.push(*e);
    }
    Ok(change)
}

fn message(ifindex: u32, e: Entry) -> NeighbourMessage {
    let mut m = NeighbourMessage::default();
    m.header.ifindex = ifindex;
    m.header.state = NeighbourState::Permanent;
    let ip = match e {
        Entry::Fdb(ip) => {
            m.header.family = AddressFamily::Bridge;
            m.header.flags = NeighbourFlags::Own;
            ip
        }
        Entry::Neighbour(ip) => {
            m.header.family = AddressFamily::Inet;
            ip
        }
    };
    m.attributes
        .push(NeighbourAttribute::LinkLayerAddress(mac(ip).to_vec()));
    m.attributes
        .push(NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)));
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_are_local_unicast_and_distinct() {
        let a = mac("10.0.1.10".parse().unwrap());
        let b = mac("10.0.1.11".parse().unwrap());
        assert_eq!(a, [0x02, 0xfa, 10, 0, 1, 10]);
        assert_ne!(a, b);
        assert_eq!(a[0] & 0x01, 0, "unicast");
        assert_eq!(a[0] & 0x02, 0x02, "locally administered");
    }

    #[test]
    fn entries_round_trip_through_messages() {
        for e in [
            Entry::Fdb("192.0.2.7".parse().unwrap()),
            Entry::Neighbour("192.0.2.7".parse().unwrap()),
        ] {
            assert_eq!(entry_of(&message(3, e)), Some(e));
        }
        // An entry with a MAC we would not have written is not ours.
        let mut m = message(3, Entry::Fdb("192.0.2.7".parse().unwrap()));
        m.attributes[0] = NeighbourAttribute::LinkLayerAddress(vec![2, 0, 0, 0, 0, 1]);
        assert_eq!(entry_of(&m), None);
        // As the kernel reports forwarding entries.
        let mut m = message(3, Entry::Fdb("192.0.2.7".parse().unwrap()));
        m.attributes[1] =
            NeighbourAttribute::Destination(NeighbourAddress::Other(vec![192, 0, 2, 7]));
        assert_eq!(entry_of(&m), Some(Entry::Fdb("192.0.2.7".parse().unwrap())));
    }

    #[test]
    fn desired_has_both_entries_per_remote() {
        let r: BTreeSet<Ipv4Addr> =
            ["10.0.1.10".parse().unwrap(), "10.0.1.11".parse().unwrap()].into();
        assert_eq!(desired(&r).len(), 4);
        assert!(desired(&BTreeSet::new()).is_empty());
    }
}
