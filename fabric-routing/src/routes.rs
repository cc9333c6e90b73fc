//! Node routes towards the gateway for every remapped peer CIDR, kept in line with the API
//! and repaired when someone removes or changes them.
//!
//! Our routes carry their own routing protocol number, so we only ever touch routes we made
//! and can find all of them again after a restart (to remove those of departed peers).
use std::{collections::BTreeSet, net::Ipv4Addr};

use futures::TryStreamExt;
use ipnetwork::Ipv4Network;
use rtnetlink::{
    Handle, RouteMessageBuilder,
    packet_route::route::{RouteAddress, RouteAttribute, RouteFlags, RouteMessage, RouteProtocol},
};

/// rtm_protocol of fabric routes (`ip route show proto 250`).
pub const RTPROT_FABRIC: u8 = 250;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Route {
    pub dst: Ipv4Network,
    pub via: Ipv4Addr,
    /// Out through this device with `via` taken as on-link (the overlay): the next hop need
    /// not be on any subnet of the device. None: the kernel picks the device that reaches
    /// `via` directly.
    pub dev: Option<u32>,
}

impl Route {
    pub fn via(dst: Ipv4Network, via: Ipv4Addr) -> Self {
        Self {
            dst,
            via,
            dev: None,
        }
    }
}

impl std::fmt::Display for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} via {}", self.dst, self.via)?;
        if let Some(d) = self.dev {
            write!(f, " dev #{d} onlink")?;
        }
        Ok(())
    }
}

/// What to add and what to remove to go from `cur` to `want`. A route whose next hop
/// changed shows up in both (removal of the old, addition of the new).
pub fn diff(cur: &BTreeSet<Route>, want: &BTreeSet<Route>) -> (Vec<Route>, Vec<Route>) {
    let add = want.difference(cur).copied().collect();
    let del = cur.difference(want).copied().collect();
    (add, del)
}

fn parse(msg: &RouteMessage) -> Option<Route> {
    if msg.header.protocol != RouteProtocol::Other(RTPROT_FABRIC) {
        return None;
    }
    let mut dst = Ipv4Addr::UNSPECIFIED;
    let mut via = None;
    let mut oif = None;
    for a in &msg.attributes {
        match a {
            RouteAttribute::Destination(RouteAddress::Inet(d)) => dst = *d,
            RouteAttribute::Gateway(RouteAddress::Inet(g)) => via = Some(*g),
            RouteAttribute::Oif(i) => oif = Some(*i),
            _ => {}
        }
    }
    Some(Route {
        dst: Ipv4Network::new(dst, msg.header.destination_prefix_length).ok()?,
        via: via?,
        dev: oif.filter(|_| msg.header.flags.contains(RouteFlags::Onlink)),
    })
}

fn message(r: &Route) -> RouteMessage {
    let b = RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(r.dst.network(), r.dst.prefix())
        .gateway(r.via)
        .protocol(RouteProtocol::Other(RTPROT_FABRIC));
    match r.dev {
        Some(i) => {
            let mut m = b.output_interface(i).build();
            m.header.flags |= RouteFlags::Onlink;
            m
        }
        None => b.build(),
    }
}

/// Our routes as the kernel has them now (main table). A route we did not make (another
/// protocol) is never listed, so never removed.
pub async fn current(h: &Handle) -> Result<BTreeSet<Route>, rtnetlink::Error> {
    let mut out = BTreeSet::new();
    let mut s = h
        .route()
        .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
        .execute();
    while let Some(m) = s.try_next().await? {
        if let Some(r) = parse(&m) {
            out.insert(r);
        }
    }
    Ok(out)
}

const ENETUNREACH: i32 = 101;
const EHOSTUNREACH: i32 = 113;

/// The interface the kernel would send to `dst` through (`ip route get DST`): where traffic
/// from `dst` legitimately arrives, as strict reverse-path filtering sees it. `None` when the
/// kernel has no route, or only one without an output interface (unreachable, blackhole).
pub async fn egress_ifindex(h: &Handle, dst: Ipv4Addr) -> Result<Option<u32>, rtnetlink::Error> {
    let mut s = h
        .route()
        .get(
            RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(dst, 32)
                .build(),
        )
        .execute();
    let m = match s.try_next().await {
        Ok(m) => m,
        // No route is an answer, not a failure.
        Err(rtnetlink::Error::NetlinkError(e))
            if matches!(-e.raw_code(), ENETUNREACH | EHOSTUNREACH) =>
        {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    Ok(m.and_then(|m| {
        m.attributes.iter().find_map(|a| match a {
            RouteAttribute::Oif(i) => Some(*i),
            _ => None,
        })
    }))
}

/// Outcome of one reconcile pass.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pass {
    pub added: Vec<Route>,
    pub removed: Vec<Route>,
}

/// Makes our routes exactly `want`. Removals first, so a prefix moving to a new next hop is
/// replaced rather than refused as existing.
pub async fn reconcile(h: &Handle, want: &BTreeSet<Route>) -> Result<Pass, rtnetlink::Error> {
    let cur = current(h).await?;
    let (add, del) = diff(&cur, want);
    for r in &del {
        match h.route().del(message(r)).execute().await {
            Ok(()) => {}
            // Gone already (someone else removed it): that is what we wanted.
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ESRCH => {}
            Err(e) => return Err(e),
        }
    }
    for r in &add {
        h.route().add(message(r)).replace().execute().await?;
    }
    Ok(Pass {
        added: add,
        removed: del,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(dst: &str, via: &str) -> Route {
        Route::via(dst.parse().unwrap(), via.parse().unwrap())
    }

    #[test]
    fn diff_adds_removes_and_moves() {
        let cur: BTreeSet<_> =
            [r("10.71.0.0/16", "10.0.0.5"), r("10.73.0.0/16", "10.0.0.5")].into();
        let want: BTreeSet<_> =
            [r("10.71.0.0/16", "10.0.0.6"), r("10.75.0.0/16", "10.0.0.6")].into();
        let (add, del) = diff(&cur, &want);
        assert_eq!(
            add,
            vec![r("10.71.0.0/16", "10.0.0.6"), r("10.75.0.0/16", "10.0.0.6")]
        );
        assert_eq!(
            del,
            vec![r("10.71.0.0/16", "10.0.0.5"), r("10.73.0.0/16", "10.0.0.5")]
        );
        assert_eq!(diff(&want, &want), (vec![], vec![]));
    }

    #[test]
    fn parses_only_our_routes() {
        let over = Route {
            dev: Some(7),
            ..r("10.71.0.0/16", "10.0.0.5")
        };
        assert_eq!(parse(&message(&over)), Some(over));
        let mut m = message(&r("10.71.0.0/16", "10.0.0.5"));
        assert_eq!(parse(&m), Some(r("10.71.0.0/16", "10.0.0.5")));
        m.header.protocol = RouteProtocol::Boot;
        assert_eq!(parse(&m), None);
    }
}
