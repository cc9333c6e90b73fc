//! The overlay on real kernels: two namespaces on different subnets, joined only through a
//! router that knows neither side's "pod" addresses. Traffic between those addresses can only
//! flow through the VXLAN devices and on-link routes this crate sets up.
use std::{collections::BTreeSet, net::Ipv4Addr};

use fabric_netns::testbed::{Testbed, is_root};
use fabric_routing::{
    overlay::{self, Entry, Overlay},
    routes::{self, Route},
};

/// Runs `f` with an rtnetlink handle inside namespace `n`.
fn in_ns<T: Send + 'static>(
    n: &str,
    f: impl FnOnce(rtnetlink::Handle) -> std::pin::Pin<Box<dyn Future<Output = T>>> + Send + 'static,
) -> T {
    fabric_netns::run_in(n, move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let (conn, h, _) = rtnetlink::new_connection().unwrap();
            tokio::spawn(conn);
            f(h).await
        })
    })
    .unwrap()
}

fn setup(n: &str, local: Ipv4Addr, remote: Ipv4Addr, dst: &'static str) -> (u32, Vec<Entry>) {
    in_ns(n, move |h| {
        Box::pin(async move {
            let o = Overlay::default();
            let (idx, ch) = overlay::ensure_device(&h, &o, local).await.unwrap();
            assert!(ch.created, "{ch:?}");
            let rc = overlay::sync_remotes(&h, idx, &[remote].into())
                .await
                .unwrap();
            let want: BTreeSet<Route> = [Route {
                dst: dst.parse().unwrap(),
                via: remote,
                dev: Some(idx),
            }]
            .into();
            routes::reconcile(&h, &want).await.unwrap();
            assert_eq!(routes::current(&h).await.unwrap(), want);
            (idx, rc.added)
        })
    })
}

#[test]
fn overlay_carries_traffic_across_a_routed_network_and_repairs_itself() {
    if !is_root() {
        eprintln!("skipped: needs root (network namespaces)");
        return;
    }
    let mut tb = Testbed::new().unwrap();
    let (a, r, b) = (
        tb.add_netns("a").unwrap(),
        tb.add_netns("r").unwrap(),
        tb.add_netns("b").unwrap(),
    );
    let ns = |n: &str, args: &[&str]| tb.exec(n, args).unwrap();
    for (n, dev, addr, gw) in [
        (&a, "ra", "10.1.0.2/24", "10.1.0.1"),
        (&b, "rb", "10.2.0.2/24", "10.2.0.1"),
    ] {
        tb.veth(&r, dev, n, "eth0").unwrap();
        ns(n, &["ip", "addr", "add", addr, "dev", "eth0"]);
        ns(n, &["ip", "route", "add", "default", "via", gw]);
    }
    ns(&r, &["ip", "addr", "add", "10.1.0.1/24", "dev", "ra"]);
    ns(&r, &["ip", "addr", "add", "10.2.0.1/24", "dev", "rb"]);
    ns(&r, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    // The "pods": addresses the router knows nothing about.
    ns(&a, &["ip", "addr", "add", "10.88.0.1/32", "dev", "lo"]);
    ns(&b, &["ip", "addr", "add", "10.99.0.1/32", "dev", "lo"]);
    // Without the overlay the peer's address is not a usable next hop: not on-link.
    let direct = tb
        .exec_any(
            &a,
            &["ip", "route", "add", "10.99.0.0/24", "via", "10.2.0.2"],
        )
        .unwrap();
    assert!(
        !direct.status.success(),
        "a routed next hop should be refused"
    );

    let la: Ipv4Addr = "10.1.0.2".parse().unwrap();
    let lb: Ipv4Addr = "10.2.0.2".parse().unwrap();
    let (ia, added) = setup(&a, la, lb, "10.99.0.0/24");
    assert_eq!(added.len(), 2);
    setup(&b, lb, la, "10.88.0.0/24");
    let out = ns(
        &a,
        &["ping", "-c", "2", "-W", "2", "-I", "10.88.0.1", "10.99.0.1"],
    );
    assert!(out.contains(" 0% packet loss"), "{out}");
    let link = ns(&a, &["ip", "-d", "link", "show", "fabric.vx"]);
    assert!(
        link.contains("vxlan id 4011") && link.contains("dstport 4790"),
        "{link}"
    );
    assert!(link.contains("02:fa:0a:01:00:02"), "{link}");

    // Someone deletes the forwarding entry and the neighbour: the next sync puts them back.
    ns(
        &a,
        &[
            "bridge",
            "fdb",
            "del",
            "02:fa:0a:02:00:02",
            "dev",
            "fabric.vx",
            "dst",
            "10.2.0.2",
        ],
    );
    ns(&a, &["ip", "neigh", "del", "10.2.0.2", "dev", "fabric.vx"]);
    let again = in_ns(&a, move |h| {
        Box::pin(async move {
            // Idempotent: the device is left alone.
            let (idx, ch) = overlay::ensure_device(&h, &Overlay::default(), la)
                .await
                .unwrap();
            assert_eq!(idx, ia);
            assert!(!ch.any(), "{ch:?}");
            overlay::sync_remotes(&h, idx, &[lb].into()).await.unwrap()
        })
    });
    assert_eq!(again.added, vec![Entry::Fdb(lb), Entry::Neighbour(lb)]);
    let out = ns(
        &a,
        &["ping", "-c", "1", "-W", "2", "-I", "10.88.0.1", "10.99.0.1"],
    );
    assert!(out.contains(" 0% packet loss"), "{out}");

    // The remote moves away: its entries go; removing the device removes everything.
    let gone = in_ns(&a, move |h| {
        Box::pin(async move {
            let c = overlay::sync_remotes(&h, ia, &BTreeSet::new())
                .await
                .unwrap();
            assert!(
                overlay::remove_device(&h, &Overlay::default())
                    .await
                    .unwrap()
            );
            assert!(routes::current(&h).await.unwrap().is_empty());
            c
        })
    });
    assert_eq!(gone.removed.len(), 2, "{gone:?}");
}
