//! Link/address/route configuration of the per-peer TUN devices over rtnetlink.

use std::{collections::BTreeSet, net::IpAddr};

use futures_util::TryStreamExt;
use ipnetwork::IpNetwork;
use rtnetlink::{
    Handle, LinkUnspec, RouteMessageBuilder,
    packet_route::{
        AddressFamily,
        route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteType},
    },
};

#[derive(Debug, thiserror::Error)]
pub enum NetconfError {
    #[error("netlink: {op} on ifindex {ifindex}: {source}")]
    Netlink {
        op: &'static str,
        ifindex: u32,
        #[source]
        source: rtnetlink::Error,
    },
    #[error("route {0}: {1}")]
    Route(IpNetwork, String),
    #[error("sysctl: {0}")]
    Sysctl(#[source] std::io::Error),
}

fn nl(op: &'static str, ifindex: u32) -> impl FnOnce(rtnetlink::Error) -> NetconfError {
    move |source| NetconfError::Netlink {
        op,
        ifindex,
        source,
    }
}

/// Sets MTU and brings the link up.
pub async fn link_up(h: &Handle, ifindex: u32, mtu: u16) -> Result<(), NetconfError> {
    h.link()
        .set(
            LinkUnspec::new_with_index(ifindex)
                .mtu(mtu as u32)
                .up()
                .build(),
        )
        .execute()
        .await
        .map_err(nl("link set up", ifindex))
}

/// Makes the device's addresses exactly `want` (addresses configured by others are left alone
/// unless they are in `previous`).
pub async fn sync_addresses(
    h: &Handle,
    ifindex: u32,
    previous: &[IpNetwork],
    want: &[IpNetwork],
) -> Result<(), NetconfError> {
    for old in previous.iter().filter(|o| !want.contains(o)) {
        let mut s = h
            .address()
            .get()
            .set_link_index_filter(ifindex)
            .set_address_filter(old.ip())
            .set_prefix_length_filter(old.prefix())
            .execute();
        while let Some(msg) = s.try_next().await.map_err(nl("address get", ifindex))? {
            h.address()
                .del(msg)
                .execute()
                .await
                .map_err(nl("address del", ifindex))?;
        }
    }
    for a in want {
        h.address()
            .add(ifindex, a.ip(), a.prefix())
            .replace()
            .execute()
            .await
            .map_err(nl("address add", ifindex))?;
    }
    Ok(())
}

fn route_msg(
    ifindex: u32,
    net: &IpNetwork,
) -> Result<rtnetlink::packet_route::route::RouteMessage, NetconfError> {
    let b = RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(net.network(), net.prefix())
        .map_err(|e| NetconfError::Route(*net, e.to_string()))?;
    Ok(b.output_interface(ifindex).build())
}

pub async fn sync_routes(
    h: &Handle,
    ifindex: u32,
    previous: &[IpNetwork],
    want: &[IpNetwork],
) -> Result<(), NetconfError> {
    for old in previous.iter().filter(|o| !want.contains(o)) {
        // The route may already be gone with the link; that is the state we want.
        let _ = h.route().del(route_msg(ifindex, old)?).execute().await;
    }
    for net in want {
        h.route()
            .add(route_msg(ifindex, net)?)
            .replace()
            .execute()
            .await
            .map_err(nl("route replace", ifindex))?;
    }
    Ok(())
}

/// rtm_protocol of the gateway's fallback routes (`ip route show proto 252`): neither the
/// kernel's nor the fabric's node routes (250), so each owner finds only its own.
pub const RTPROT_FALLBACK: u8 = 252;
/// Their metric: the last resort, below the device routes (metric 0) that carry traffic.
pub const FALLBACK_METRIC: u32 = u32::MAX;

/// What to add and remove to make the fallback routes (blackholes, see [`sync_fallbacks`])
/// exactly `want`.
pub fn fallback_diff(
    current: &BTreeSet<IpNetwork>,
    want: &BTreeSet<IpNetwork>,
) -> (Vec<IpNetwork>, Vec<IpNetwork>) {
    (
        want.difference(current).copied().collect(),
        current.difference(want).copied().collect(),
    )
}

fn fallback_msg(net: &IpNetwork) -> Result<RouteMessage, NetconfError> {
    Ok(RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(net.network(), net.prefix())
        .map_err(|e| NetconfError::Route(*net, e.to_string()))?
        .kind(RouteType::BlackHole)
        .protocol(RouteProtocol::Other(RTPROT_FALLBACK))
        .priority(FALLBACK_METRIC)
        .build())
}

/// The fallback routes in the namespace now.
async fn fallbacks(h: &Handle) -> Result<BTreeSet<IpNetwork>, NetconfError> {
    let mut out = BTreeSet::new();
    for msg in [
        RouteMessageBuilder::<std::net::Ipv4Addr>::new().build(),
        RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
    ] {
        let mut s = h.route().get(msg).execute();
        while let Some(m) = s.try_next().await.map_err(nl("route dump", 0))? {
            if m.header.protocol != RouteProtocol::Other(RTPROT_FALLBACK)
                || m.header.kind != RouteType::BlackHole
            {
                continue;
            }
            let dst = m.attributes.iter().find_map(|a| match a {
                RouteAttribute::Destination(RouteAddress::Inet(d)) => Some(IpAddr::V4(*d)),
                RouteAttribute::Destination(RouteAddress::Inet6(d)) => Some(IpAddr::V6(*d)),
                _ => None,
            });
            let dst = dst.unwrap_or(if m.header.address_family == AddressFamily::Inet6 {
                IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
            } else {
                IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
            });
            if let Ok(n) = IpNetwork::new(dst, m.header.destination_prefix_length) {
                out.insert(n);
            }
        }
    }
    Ok(out)
}

/// Makes the fallback routes exactly `want` (the prefixes routed into the tunnels): a
/// blackhole of the last resort per prefix. They are not tied to a device, so they outlive
/// the gateway process: while it restarts (its TUN devices, and their routes, go with it)
/// packets for a peer are dropped quietly instead of answered with "network unreachable",
/// which aborts a TCP connection being opened; its SYN is sent again and gets through once
/// the tunnel is back. Returns (added, removed).
pub async fn sync_fallbacks(
    h: &Handle,
    want: &BTreeSet<IpNetwork>,
) -> Result<(Vec<IpNetwork>, Vec<IpNetwork>), NetconfError> {
    let (add, del) = fallback_diff(&fallbacks(h).await?, want);
    for net in &del {
        match h.route().del(fallback_msg(net)?).execute().await {
            Ok(()) => {}
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ESRCH => {}
            Err(e) => return Err(nl("fallback route del", 0)(e)),
        }
    }
    for net in &add {
        h.route()
            .add(fallback_msg(net)?)
            .replace()
            .execute()
            .await
            .map_err(nl("fallback route add", 0))?;
    }
    Ok((add, del))
}

fn rp_filter_path(device: &str) -> std::path::PathBuf {
    std::path::Path::new("/proc/sys/net/ipv4/conf")
        .join(device)
        .join("rp_filter")
}

/// Turns on strict reverse-path filtering on a device (in the current network namespace).
/// Returns whether it was off. The kernel applies the larger of this and `conf/all`, so a
/// loose `all` (2) wins: warned about, since then only the remap program keeps untranslated
/// sources out.
pub fn strict_rp_filter(device: &str) -> std::io::Result<bool> {
    let path = rp_filter_path(device);
    let was = std::fs::read_to_string(&path)?;
    if was.trim() == "1" {
        return Ok(false);
    }
    std::fs::write(&path, "1")?;
    let all = std::fs::read_to_string(rp_filter_path("all")).unwrap_or_default();
    if all.trim() == "2" {
        tracing::warn!(
            device,
            "net.ipv4.conf.all.rp_filter is 2 (loose), which overrides the device's strict setting"
        );
    }
    Ok(true)
}

/// Whether both of the data plane's clsact filters (ingress and egress, at its fixed priority
/// and handle, kind `bpf`) are on the device.
pub async fn dataplane_filters_present(h: &Handle, ifindex: u32) -> Result<bool, NetconfError> {
    use netlink_packet_route::tc::{TcAttribute, TcHandle};
    for egress in [false, true] {
        let req = h.traffic_filter(ifindex as i32).get();
        let req = if egress { req.egress() } else { req.ingress() };
        let mut s = req.execute();
        let mut found = false;
        while let Some(msg) = s.try_next().await.map_err(nl("filter get", ifindex))? {
            let prio = (msg.header.info >> 16) as u16;
            let bpf = msg
                .attributes
                .iter()
                .any(|a| matches!(a, TcAttribute::Kind(k) if k == "bpf"));
            let want_parent = TcHandle {
                major: 0xffff,
                minor: if egress {
                    TcHandle::MIN_EGRESS
                } else {
                    TcHandle::MIN_INGRESS
                },
            };
            if bpf
                && prio == fabric_dataplane::FILTER_PRIORITY
                && msg.header.parent == want_parent
                && u32::from(msg.header.handle) == fabric_dataplane::FILTER_HANDLE
            {
                found = true;
            }
        }
        if !found {
            return Ok(false);
        }
    }
    Ok(true)
}

/// What is missing on a peer's device compared with its configuration: whether it is down,
/// the addresses and the routes (to the device) that are not there.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DeviceDrift {
    pub down: bool,
    pub addresses: Vec<IpNetwork>,
    pub routes: Vec<IpNetwork>,
}

impl DeviceDrift {
    pub fn count(&self) -> usize {
        usize::from(self.down) + self.addresses.len() + self.routes.len()
    }
}

/// Links, addresses and routes of the namespace, as far as drift checks need them: read once
/// per pass for all devices.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub up: std::collections::HashMap<u32, bool>,
    pub addresses: std::collections::HashSet<(u32, IpAddr, u8)>,
    /// (output device, destination, prefix length) of main-table routes.
    pub routes: std::collections::HashSet<(u32, IpAddr, u8)>,
}

impl Snapshot {
    /// What `ifindex` lacks compared with its configured addresses and routes.
    pub fn drift(
        &self,
        ifindex: u32,
        addresses: &[IpNetwork],
        routes: &[IpNetwork],
    ) -> DeviceDrift {
        DeviceDrift {
            down: !self.up.get(&ifindex).copied().unwrap_or(false),
            addresses: addresses
                .iter()
                .filter(|a| !self.addresses.contains(&(ifindex, a.ip(), a.prefix())))
                .copied()
                .collect(),
            routes: routes
                .iter()
                .filter(|r| !self.routes.contains(&(ifindex, r.network(), r.prefix())))
                .copied()
                .collect(),
        }
    }
}

/// Reads the namespace's links, addresses and routes (IPv4 and IPv6).
pub async fn snapshot(h: &Handle) -> Result<Snapshot, NetconfError> {
    use rtnetlink::packet_route::{
        address::AddressAttribute,
        link::LinkFlags,
        route::{RouteAddress, RouteAttribute},
    };
    let mut snap = Snapshot::default();
    let mut links = h.link().get().execute();
    while let Some(l) = links.try_next().await.map_err(nl("link dump", 0))? {
        snap.up
            .insert(l.header.index, l.header.flags.contains(LinkFlags::Up));
    }
    let mut s = h.address().get().execute();
    while let Some(m) = s.try_next().await.map_err(nl("address dump", 0))? {
        for a in &m.attributes {
            if let AddressAttribute::Address(ip) = a {
                snap.addresses
                    .insert((m.header.index, *ip, m.header.prefix_len));
            }
        }
    }
    for msg in [
        RouteMessageBuilder::<std::net::Ipv4Addr>::new().build(),
        RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
    ] {
        let mut s = h.route().get(msg).execute();
        while let Some(m) = s.try_next().await.map_err(nl("route dump", 0))? {
            let (mut oif, mut dst) = (None, None);
            for a in &m.attributes {
                match a {
                    RouteAttribute::Oif(i) => oif = Some(*i),
                    RouteAttribute::Destination(RouteAddress::Inet(d)) => {
                        dst = Some(IpAddr::V4(*d))
                    }
                    RouteAttribute::Destination(RouteAddress::Inet6(d)) => {
                        dst = Some(IpAddr::V6(*d))
                    }
                    _ => {}
                }
            }
            if let (Some(o), Some(d)) = (oif, dst) {
                snap.routes
                    .insert((o, d, m.header.destination_prefix_length));
            }
        }
    }
    Ok(snap)
}

#[cfg(test)]
mod tests {
    #[test]
    fn fallbacks_are_last_resort_blackholes_of_our_own() {
        let net = |s: &str| s.parse::<IpNetwork>().unwrap();
        let m = super::fallback_msg(&net("10.64.0.0/16")).unwrap();
        assert_eq!(m.header.kind, RouteType::BlackHole);
        assert_eq!(m.header.protocol, RouteProtocol::Other(RTPROT_FALLBACK));
        assert_eq!(m.header.destination_prefix_length, 16);
        assert!(
            m.attributes
                .contains(&RouteAttribute::Priority(FALLBACK_METRIC))
        );
        let cur: BTreeSet<_> = [net("10.64.0.0/16"), net("10.65.0.0/16")].into();
        let want: BTreeSet<_> = [net("10.65.0.0/16"), net("10.66.0.0/16")].into();
        assert_eq!(
            fallback_diff(&cur, &want),
            (vec![net("10.66.0.0/16")], vec![net("10.64.0.0/16")])
        );
        assert_eq!(fallback_diff(&want, &want), (vec![], vec![]));
    }

    use super::*;

    #[test]
    fn drift_lists_what_a_device_lacks() {
        let mut snap = Snapshot::default();
        snap.up.insert(4, true);
        snap.addresses
            .insert((4, "169.254.100.1".parse().unwrap(), 30));
        snap.routes.insert((4, "10.71.0.0".parse().unwrap(), 16));
        // The same prefix through another device does not count.
        snap.routes.insert((5, "10.73.0.0".parse().unwrap(), 16));
        let addrs: Vec<IpNetwork> = vec!["169.254.100.1/30".parse().unwrap()];
        let routes: Vec<IpNetwork> = vec![
            "10.71.0.0/16".parse().unwrap(),
            "10.73.0.0/16".parse().unwrap(),
        ];
        let d = snap.drift(4, &addrs, &routes);
        assert_eq!(
            d,
            DeviceDrift {
                down: false,
                addresses: vec![],
                routes: vec!["10.73.0.0/16".parse().unwrap()],
            }
        );
        assert_eq!(d.count(), 1);
        let d = snap.drift(9, &addrs, &[]);
        assert!(d.down && d.addresses.len() == 1, "{d:?}");
    }
}
