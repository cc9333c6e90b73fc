//! The overlay guard in real namespaces: a datagram to the guarded port gets through only from
//! an allowed source arriving on its interface; other ports are untouched; an unpinned guard
//! detaches with its holder, a pinned one outlives it with its allowed set.
use std::{
    net::{Ipv4Addr, UdpSocket},
    time::Duration,
};

use fabric_dataplane::guard::{OverlayGuard, Sources, remove_pinned};
use fabric_netns::{run_in, testbed::Testbed};

/// Runs `f` on a thread inside namespace `ns`.
fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    run_in(ns, f).unwrap()
}

#[test]
fn only_allowed_sources_reach_the_guarded_port() {
    if !fabric_netns::testbed::is_root() {
        eprintln!("skipped: needs root (network namespaces, BPF)");
        return;
    }
    let mut tb = Testbed::new().unwrap();
    let a = tb.add_netns("a").unwrap();
    let b = tb.add_netns("b").unwrap();
    tb.veth(&a, "ga", &b, "gb").unwrap();
    tb.ip(&a, &["addr", "add", "10.9.0.1/24", "dev", "ga"])
        .unwrap();
    tb.ip(&a, &["addr", "add", "10.9.0.3/24", "dev", "ga"])
        .unwrap();
    tb.ip(&b, &["addr", "add", "10.9.0.2/24", "dev", "gb"])
        .unwrap();

    // Receivers in B on the guarded port and on another one.
    let (guarded, other) = in_ns(&b, || {
        let g = UdpSocket::bind("0.0.0.0:4790").unwrap();
        let o = UdpSocket::bind("0.0.0.0:4791").unwrap();
        g.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        o.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        (g, o)
    });
    let send = |from: &'static str, port: u16| {
        in_ns(&a, move || {
            let s = UdpSocket::bind(format!("{from}:0")).unwrap();
            s.send_to(b"x", ("10.9.0.2", port)).unwrap();
        })
    };
    let got = |s: &UdpSocket| -> Option<Ipv4Addr> {
        let mut buf = [0u8; 16];
        match s.recv_from(&mut buf) {
            Ok((_, std::net::SocketAddr::V4(a))) => Some(*a.ip()),
            _ => None,
        }
    };

    let mut guard = OverlayGuard::attach(&fabric_netns::path_of(&b), 4790).unwrap();
    send("10.9.0.1", 4790);
    assert_eq!(got(&guarded), None, "nothing allowed yet");
    let allowed: Sources = [("10.9.0.1".parse().unwrap(), 0)].into();
    assert_eq!(guard.set_sources(&allowed).unwrap(), (1, 0));
    assert_eq!(guard.set_sources(&allowed).unwrap(), (0, 0), "idempotent");
    send("10.9.0.1", 4790);
    assert_eq!(got(&guarded), Some("10.9.0.1".parse().unwrap()));
    send("10.9.0.3", 4790);
    assert_eq!(got(&guarded), None, "an unknown source is refused");
    send("10.9.0.3", 4791);
    assert_eq!(
        got(&other),
        Some("10.9.0.3".parse().unwrap()),
        "other ports are not guarded"
    );
    assert_eq!(guard.drops().unwrap(), 2);

    drop(guard);
    send("10.9.0.3", 4790);
    assert_eq!(
        got(&guarded),
        Some("10.9.0.3".parse().unwrap()),
        "detached with its holder"
    );
}

#[test]
fn pinned_guard_outlives_its_holder_and_binds_sources_to_their_interface() {
    if !fabric_netns::testbed::is_root() {
        eprintln!("skipped: needs root (network namespaces, BPF)");
        return;
    }
    let mut tb = Testbed::new().unwrap();
    let a = tb.add_netns("a").unwrap();
    let b = tb.add_netns("b").unwrap();
    let c = tb.add_netns("c").unwrap();
    tb.veth(&a, "ga", &b, "gb").unwrap();
    tb.veth(&c, "gc", &b, "gbc").unwrap();
    for (ns, cidr, dev) in [
        (&a, "10.9.0.1/24", "ga"),
        (&a, "10.9.0.3/24", "ga"),
        (&b, "10.9.0.2/24", "gb"),
        (&b, "10.8.0.2/24", "gbc"),
        (&c, "10.8.0.1/24", "gc"),
        // C also claims A's address (a spoofing neighbour).
        (&c, "10.9.0.1/32", "gc"),
    ] {
        tb.ip(ns, &["addr", "add", cidr, "dev", dev]).unwrap();
    }
    let link: serde_json::Value =
        serde_json::from_str(&tb.ip(&b, &["-j", "link", "show", "gb"]).unwrap()).unwrap();
    let gb = link[0]["ifindex"].as_u64().unwrap() as u32;

    let guarded = in_ns(&b, || {
        let g = UdpSocket::bind("0.0.0.0:4790").unwrap();
        g.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        g
    });
    let send = |ns: &str, from: &'static str, to: &'static str| {
        let ns = ns.to_owned();
        in_ns(&ns, move || {
            let s = UdpSocket::bind(format!("{from}:0")).unwrap();
            s.send_to(b"x", (to, 4790)).unwrap();
        })
    };
    let got = |s: &UdpSocket| -> Option<Ipv4Addr> {
        let mut buf = [0u8; 16];
        match s.recv_from(&mut buf) {
            Ok((_, std::net::SocketAddr::V4(a))) => Some(*a.ip()),
            _ => None,
        }
    };
    let a1: Ipv4Addr = "10.9.0.1".parse().unwrap();

    let pins = tb.pin_dir(&b, "guard");
    let netns = fabric_netns::path_of(&b);
    let mut guard = OverlayGuard::attach_pinned(&netns, 4790, &pins).unwrap();
    let allowed: Sources = [(a1, gb)].into();
    assert_eq!(guard.set_sources(&allowed).unwrap(), (1, 0));
    send(&a, "10.9.0.1", "10.9.0.2");
    assert_eq!(
        got(&guarded),
        Some(a1),
        "the allowed source on its interface"
    );
    send(&c, "10.9.0.1", "10.8.0.2");
    assert_eq!(
        got(&guarded),
        None,
        "the allowed address from another interface is refused"
    );

    // The holder goes (as when the agent restarts): the guard stays, with its set.
    drop(guard);
    send(&a, "10.9.0.3", "10.9.0.2");
    assert_eq!(
        got(&guarded),
        None,
        "a stranger got through once the holder was gone"
    );
    send(&c, "10.9.0.1", "10.8.0.2");
    assert_eq!(
        got(&guarded),
        None,
        "a spoofer got through once the holder was gone"
    );
    send(&a, "10.9.0.1", "10.9.0.2");
    assert_eq!(got(&guarded), Some(a1));

    // The next holder takes the pinned set over (nothing to write) and replaces the link.
    let mut guard = OverlayGuard::attach_pinned(&netns, 4790, &pins).unwrap();
    assert_eq!(guard.set_sources(&allowed).unwrap(), (0, 0), "set kept");
    assert!(guard.drops().unwrap() >= 3, "counts kept too");
    send(&a, "10.9.0.3", "10.9.0.2");
    assert_eq!(got(&guarded), None);
    send(&a, "10.9.0.1", "10.9.0.2");
    assert_eq!(got(&guarded), Some(a1));

    // Removed (nothing peered): gone once unpinned and released.
    assert!(remove_pinned(&pins).unwrap());
    drop(guard);
    send(&a, "10.9.0.3", "10.9.0.2");
    assert_eq!(got(&guarded), Some("10.9.0.3".parse().unwrap()), "removed");
    assert!(!remove_pinned(&pins).unwrap(), "nothing left to remove");
}
