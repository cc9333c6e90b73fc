//! The overlay guard in real namespaces: a datagram to the guarded port gets through only from
//! an allowed source; other ports are untouched; detaching (drop) lets everything through.
use std::{
    collections::BTreeSet,
    net::{Ipv4Addr, UdpSocket},
    os::fd::AsRawFd,
    path::Path,
    process::Command,
    time::Duration,
};

use fabric_dataplane::guard::OverlayGuard;

fn sh(args: &[&str]) {
    let o = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

struct Ns(Vec<String>);
impl Drop for Ns {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

/// Runs `f` on a thread inside namespace `ns`.
fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let fd = std::fs::File::open(path).unwrap();
        // SAFETY: a namespace fd we just opened; the thread is ours.
        assert_eq!(
            unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) },
            0
        );
        f()
    })
    .join()
    .unwrap()
}

#[test]
fn only_allowed_sources_reach_the_guarded_port() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root (network namespaces, BPF)");
        return;
    }
    let tag = format!("fdg{}", std::process::id());
    let (a, b) = (format!("{tag}a"), format!("{tag}b"));
    let _ns = Ns(vec![a.clone(), b.clone()]);
    for n in [&a, &b] {
        sh(&["ip", "netns", "add", n]);
    }
    sh(&[
        "ip", "link", "add", "ga", "netns", &a, "type", "veth", "peer", "name", "gb", "netns", &b,
    ]);
    sh(&["ip", "-n", &a, "addr", "add", "10.9.0.1/24", "dev", "ga"]);
    sh(&["ip", "-n", &a, "addr", "add", "10.9.0.3/24", "dev", "ga"]);
    sh(&["ip", "-n", &b, "addr", "add", "10.9.0.2/24", "dev", "gb"]);
    sh(&["ip", "-n", &a, "link", "set", "ga", "up"]);
    sh(&["ip", "-n", &b, "link", "set", "gb", "up"]);

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

    let mut guard = OverlayGuard::attach(Path::new(&format!("/run/netns/{b}")), 4790).unwrap();
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
