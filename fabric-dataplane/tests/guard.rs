//! The overlay guard in real namespaces: a datagram to the guarded port gets through only from
//! an allowed source; other ports are untouched; detaching (drop) lets everything through.
use std::{
    collections::BTreeSet,
    net::{Ipv4Addr, UdpSocket},
    time::Duration,
};

use fabric_dataplane::guard::OverlayGuard;
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
    let allowed: BTreeSet<Ipv4Addr> = ["10.9.0.1".parse().unwrap()].into();
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
