//! Link/address/route configuration of the per-peer TUN devices over rtnetlink.

use std::net::IpAddr;

use futures_util::TryStreamExt;
use ipnetwork::IpNetwork;
use rtnetlink::{Handle, LinkUnspec, RouteMessageBuilder};

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
