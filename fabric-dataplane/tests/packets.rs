//! Packet tests: the real programs run on crafted frames through BPF_PROG_TEST_RUN. Every
//! checksum in the output is checked with etherparse, an implementation independent of ours.
use std::net::Ipv4Addr;

use aya::programs::{TestRun, TestRunOptions};
use etherparse::{
    Icmpv4Header, Icmpv4Type, IpNumber, Ipv4Header, TcpHeader, TcpOptionElement, UdpHeader,
    icmpv4::DestUnreachableHeader,
};
use fabric_common::drop;
use fabric_dataplane::{Dataplane, DataplaneConfig, state};

const TC_ACT_OK: u32 = 0;
const TC_ACT_SHOT: u32 = 2;

const CONFIG: &str = r#"
local_cidrs = ["10.244.0.0/16"]
[[peers]]
name = "cluster-b"
id = 7
interface = "lo"
mss = 1360
remaps = [
  { local = "10.71.0.0/16", remote = "10.244.0.0/16" },
  { local = "10.81.0.0/20", remote = "172.16.16.0/20" },
  { local = "10.99.0.7/32", remote = "192.168.50.9/32" },
  { local = "11.0.0.0/8",   remote = "12.0.0.0/8" },
]
[[externals]]
external = "10.70.0.5/32"
internal = "192.168.1.5/32"
"#;

fn ip(s: &str) -> [u8; 4] {
    s.parse::<Ipv4Addr>().unwrap().octets()
}

/// Needs root (BPF). Outside CI a non-root run says so and passes; in CI it must run.
fn fixture() -> Option<Dataplane> {
    fixture_with(CONFIG)
}

fn fixture_with(config: &str) -> Option<Dataplane> {
    fixture_owning(config, &[])
}

/// A fixture whose host owns `own` (what the loader would find on the interfaces).
fn fixture_owning(config: &str, own: &[&str]) -> Option<Dataplane> {
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var_os("CI").is_none(),
            "packet tests need root in CI"
        );
        eprintln!("skipped: BPF_PROG_TEST_RUN needs root");
        return None;
    }
    let cfg = DataplaneConfig::from_toml(config).unwrap();
    let mut dp = Dataplane::load(None).expect("load programs");
    // test_run hands the program an skb on loopback: configure ifindex of `lo` as the device.
    let links = [(
        "lo".to_string(),
        fabric_dataplane::sys::link_facts("lo").unwrap(),
    )]
    .into();
    let own = own.iter().map(|a| a.parse().unwrap()).collect();
    dp.maps()
        .reconcile(&state::desired(&cfg, &links, &own))
        .unwrap();
    Some(dp)
}

fn run(dp: &Dataplane, egress: bool, frame: &[u8]) -> (u32, Vec<u8>) {
    let mut out = vec![0u8; frame.len() + 256];
    let r = dp
        .program(egress)
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            repeat: 1,
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("test_run of a {}-byte frame: {e}", frame.len()));
    out.truncate(r.data_size_out as usize);
    (r.return_value, out)
}

// ---- packet construction (etherparse computes every checksum) ----

fn eth(ethertype: u16, l3: &[u8]) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1];
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(l3);
    f
}

fn ipv4(src: &str, dst: &str, proto: IpNumber, l4: &[u8]) -> Ipv4Header {
    let mut h = Ipv4Header::new(l4.len() as u16, 64, proto, ip(src), ip(dst)).unwrap();
    h.header_checksum = h.calc_header_checksum();
    h
}

fn packet(h: &Ipv4Header, l4: &[u8]) -> Vec<u8> {
    let mut v = h.to_bytes().to_vec();
    v.extend_from_slice(l4);
    v
}

fn tcp(src: &str, dst: &str, syn: bool, mss: Option<u16>, payload: &[u8]) -> Vec<u8> {
    let opts = match mss {
        Some(m) => vec![
            TcpOptionElement::MaximumSegmentSize(m),
            TcpOptionElement::SelectiveAcknowledgementPermitted,
            TcpOptionElement::Timestamp(1, 0),
            TcpOptionElement::Noop,
            TcpOptionElement::WindowScale(7),
        ],
        None => vec![],
    };
    tcp_with(src, dst, syn, &opts, payload)
}

fn tcp_with(src: &str, dst: &str, syn: bool, opts: &[TcpOptionElement], payload: &[u8]) -> Vec<u8> {
    let mut t = TcpHeader::new(40000, 80, 1, 64240);
    t.syn = syn;
    t.ack = !syn;
    t.set_options(opts).unwrap();
    t.checksum = t.calc_checksum_ipv4_raw(ip(src), ip(dst), payload).unwrap();
    let mut v = t.to_bytes().to_vec();
    v.extend_from_slice(payload);
    v
}

fn udp(src: &str, dst: &str, payload: &[u8], zero_csum: bool) -> Vec<u8> {
    let mut u = UdpHeader {
        source_port: 5353,
        destination_port: 9999,
        length: (8 + payload.len()) as u16,
        checksum: 0,
    };
    if !zero_csum {
        u.checksum = u.calc_checksum_ipv4_raw(ip(src), ip(dst), payload).unwrap();
    }
    let mut v = u.to_bytes().to_vec();
    v.extend_from_slice(payload);
    v
}

fn icmp(ty: Icmpv4Type, payload: &[u8]) -> Vec<u8> {
    let h = Icmpv4Header::with_checksum(ty, payload);
    let mut v = h.to_bytes().to_vec();
    v.extend_from_slice(payload);
    v
}

fn frame_tcp(src: &str, dst: &str, syn: bool, mss: Option<u16>) -> Vec<u8> {
    let seg = tcp(src, dst, syn, mss, b"hello fabric");
    eth(0x0800, &packet(&ipv4(src, dst, IpNumber::TCP, &seg), &seg))
}

fn frame_udp(src: &str, dst: &str, zero_csum: bool) -> Vec<u8> {
    let d = udp(src, dst, b"datagram payload", zero_csum);
    eth(0x0800, &packet(&ipv4(src, dst, IpNumber::UDP, &d), &d))
}

// ---- verification ----

/// Parses the output, checks the IPv4 checksum, returns header and L4 bytes.
fn parse(out: &[u8]) -> (Ipv4Header, Vec<u8>) {
    assert_eq!(&out[12..14], &[0x08, 0x00]);
    let (h, rest) = Ipv4Header::from_slice(&out[14..]).expect("ipv4 header");
    assert_eq!(
        h.header_checksum,
        h.calc_header_checksum(),
        "IPv4 header checksum"
    );
    let l4 = rest[..h.payload_len().unwrap() as usize].to_vec();
    (h, l4)
}

fn assert_tcp_ok(h: &Ipv4Header, l4: &[u8]) -> TcpHeader {
    let (t, payload) = TcpHeader::from_slice(l4).unwrap();
    assert_eq!(
        t.checksum,
        t.calc_checksum_ipv4(h, payload).unwrap(),
        "TCP checksum"
    );
    t
}

fn assert_udp_ok(h: &Ipv4Header, l4: &[u8]) -> UdpHeader {
    let (u, payload) = UdpHeader::from_slice(l4).unwrap();
    if u.checksum != 0 {
        assert_eq!(
            u.checksum,
            u.calc_checksum_ipv4(h, payload).unwrap(),
            "UDP checksum"
        );
    }
    u
}

fn assert_icmp_ok(l4: &[u8]) -> (Icmpv4Header, Vec<u8>) {
    let (i, payload) = Icmpv4Header::from_slice(l4).unwrap();
    assert_eq!(
        i.checksum,
        i.icmp_type.calc_checksum(payload),
        "ICMP checksum"
    );
    (i, payload.to_vec())
}

fn addrs(h: &Ipv4Header) -> (Ipv4Addr, Ipv4Addr) {
    (h.source.into(), h.destination.into())
}

fn a(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

// ---- the table ----

#[test]
fn tcp_both_directions_and_prefix_lengths() {
    let Some(dp) = fixture() else { return };
    // (egress?, src, dst, expected src, expected dst)
    let table = [
        (
            true,
            "10.244.1.10",
            "10.71.2.7",
            "10.244.1.10",
            "10.244.2.7",
        ),
        (
            false,
            "10.244.2.7",
            "10.244.1.10",
            "10.71.2.7",
            "10.244.1.10",
        ),
        (
            true,
            "10.244.1.10",
            "10.81.5.9",
            "10.244.1.10",
            "172.16.21.9",
        ), // /20
        (
            false,
            "172.16.31.255",
            "10.244.1.10",
            "10.81.15.255",
            "10.244.1.10",
        ),
        (
            true,
            "10.244.1.10",
            "10.99.0.7",
            "10.244.1.10",
            "192.168.50.9",
        ), // /32
        (
            false,
            "192.168.50.9",
            "10.244.1.10",
            "10.99.0.7",
            "10.244.1.10",
        ),
        (
            true,
            "10.244.1.10",
            "11.200.3.4",
            "10.244.1.10",
            "12.200.3.4",
        ), // /8
        (false, "12.0.0.1", "10.244.1.10", "11.0.0.1", "10.244.1.10"),
        // externals: a local IP leaves under its external address and is reached by it
        (true, "192.168.1.5", "10.71.0.9", "10.70.0.5", "10.244.0.9"),
        (false, "10.244.0.9", "10.70.0.5", "10.71.0.9", "192.168.1.5"),
    ];
    for (egress, src, dst, esrc, edst) in table {
        let (ret, out) = run(&dp, egress, &frame_tcp(src, dst, false, None));
        assert_eq!(ret, TC_ACT_OK, "{src}->{dst}");
        let (h, l4) = parse(&out);
        assert_eq!(
            addrs(&h),
            (a(esrc), a(edst)),
            "{src}->{dst} egress={egress}"
        );
        let t = assert_tcp_ok(&h, &l4);
        assert_eq!((t.source_port, t.destination_port), (40000, 80));
    }
}

#[test]
fn udp_with_and_without_checksum() {
    let Some(dp) = fixture() else { return };
    let (ret, out) = run(&dp, true, &frame_udp("10.244.1.10", "10.71.2.7", false));
    assert_eq!(ret, TC_ACT_OK);
    let (h, l4) = parse(&out);
    assert_eq!(addrs(&h).1, a("10.244.2.7"));
    assert_ne!(assert_udp_ok(&h, &l4).checksum, 0);

    let (ret, out) = run(&dp, false, &frame_udp("10.244.2.7", "10.244.1.10", true));
    assert_eq!(ret, TC_ACT_OK);
    let (h, l4) = parse(&out);
    assert_eq!(addrs(&h).0, a("10.71.2.7"));
    assert_eq!(
        assert_udp_ok(&h, &l4).checksum,
        0,
        "a zero UDP checksum stays zero"
    );
}

#[test]
fn icmp_echo() {
    let Some(dp) = fixture() else { return };
    let msg = icmp(
        Icmpv4Type::EchoRequest(etherparse::IcmpEchoHeader { id: 77, seq: 1 }),
        b"ping payload",
    );
    let f = eth(
        0x0800,
        &packet(
            &ipv4("10.244.1.10", "10.71.2.7", IpNumber::ICMP, &msg),
            &msg,
        ),
    );
    let (ret, out) = run(&dp, true, &f);
    assert_eq!(ret, TC_ACT_OK);
    let (h, l4) = parse(&out);
    assert_eq!(addrs(&h).1, a("10.244.2.7"));
    assert_icmp_ok(&l4);
    assert_eq!(l4, msg, "ICMP echo itself is untouched");
}

/// B's gateway (10.244.1.1 in B) tells A's pod that its packet to B's pod did not fit. On A's
/// ingress the outer source and the embedded destination must both become A's view of B,
/// with every checksum right, or PMTUD across the fabric breaks.
#[test]
fn icmp_frag_needed_inner_header_ingress() {
    let Some(dp) = fixture() else { return };
    for inner_proto in [IpNumber::UDP, IpNumber::TCP] {
        let (inner_l4, inner_l4_rewritten) = if inner_proto == IpNumber::UDP {
            (
                udp("10.244.1.10", "10.244.2.7", b"too big", false),
                udp("10.244.1.10", "10.71.2.7", b"too big", false),
            )
        } else {
            (
                tcp("10.244.1.10", "10.244.2.7", false, None, b"too big"),
                tcp("10.244.1.10", "10.71.2.7", false, None, b"too big"),
            )
        };
        let inner = packet(
            &ipv4("10.244.1.10", "10.244.2.7", inner_proto, &inner_l4),
            &inner_l4,
        );
        let msg = icmp(
            Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::FragmentationNeeded {
                next_hop_mtu: 1400,
            }),
            &inner,
        );
        let f = eth(
            0x0800,
            &packet(
                &ipv4("10.244.1.1", "10.244.1.10", IpNumber::ICMP, &msg),
                &msg,
            ),
        );
        let (ret, out) = run(&dp, false, &f);
        assert_eq!(ret, TC_ACT_OK);
        let (h, l4) = parse(&out);
        assert_eq!(addrs(&h), (a("10.71.1.1"), a("10.244.1.10")));
        let (icmp_h, quoted) = assert_icmp_ok(&l4);
        assert!(matches!(
            icmp_h.icmp_type,
            Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::FragmentationNeeded {
                next_hop_mtu: 1400
            })
        ));
        let (ih, irest) = Ipv4Header::from_slice(&quoted).unwrap();
        assert_eq!(
            ih.header_checksum,
            ih.calc_header_checksum(),
            "inner IPv4 checksum"
        );
        assert_eq!(addrs(&ih), (a("10.244.1.10"), a("10.71.2.7")));
        // The embedded segment is exactly what A's pod would have sent to 10.71.2.7.
        assert_eq!(irest, &inner_l4_rewritten[..], "{inner_proto:?}");
    }
}

/// The mirror case: A's gateway reports to B's pod (seen in A as 10.71.2.7) about a packet
/// B's pod sent. On egress the outer destination and the embedded source go back to real.
#[test]
fn icmp_time_exceeded_inner_header_egress() {
    let Some(dp) = fixture() else { return };
    let inner_l4 = udp("10.71.2.7", "10.244.1.10", b"traceroute", false);
    let inner = packet(
        &ipv4("10.71.2.7", "10.244.1.10", IpNumber::UDP, &inner_l4),
        &inner_l4,
    );
    let msg = icmp(
        Icmpv4Type::TimeExceeded(etherparse::icmpv4::TimeExceededCode::TtlExceededInTransit),
        &inner,
    );
    let f = eth(
        0x0800,
        &packet(&ipv4("10.244.1.1", "10.71.2.7", IpNumber::ICMP, &msg), &msg),
    );
    let (ret, out) = run(&dp, true, &f);
    assert_eq!(ret, TC_ACT_OK);
    let (h, l4) = parse(&out);
    assert_eq!(addrs(&h), (a("10.244.1.1"), a("10.244.2.7")));
    let (_, quoted) = assert_icmp_ok(&l4);
    let (ih, irest) = Ipv4Header::from_slice(&quoted).unwrap();
    assert_eq!(ih.header_checksum, ih.calc_header_checksum());
    assert_eq!(addrs(&ih), (a("10.244.2.7"), a("10.244.1.10")));
    assert_eq!(
        irest,
        &udp("10.244.2.7", "10.244.1.10", b"traceroute", false)[..]
    );
}

/// A UDP datagram in two fragments: the first carries the L4 checksum for the whole datagram,
/// the second has no L4 header at all. Reassembled, the result must check out.
#[test]
fn fragments() {
    let Some(dp) = fixture() else { return };
    let payload: Vec<u8> = (0..200u8).collect();
    let dgram = udp("10.244.1.10", "10.71.2.7", &payload, false);
    let (first, second) = dgram.split_at(96);
    let mut h1 = ipv4("10.244.1.10", "10.71.2.7", IpNumber::UDP, first);
    h1.more_fragments = true;
    h1.header_checksum = h1.calc_header_checksum();
    let mut h2 = ipv4("10.244.1.10", "10.71.2.7", IpNumber::UDP, second);
    h2.fragment_offset = etherparse::IpFragOffset::try_new(96 / 8).unwrap();
    h2.header_checksum = h2.calc_header_checksum();

    let (r1, o1) = run(&dp, true, &eth(0x0800, &packet(&h1, first)));
    let (r2, o2) = run(&dp, true, &eth(0x0800, &packet(&h2, second)));
    assert_eq!((r1, r2), (TC_ACT_OK, TC_ACT_OK));
    let (p1, l1) = parse(&o1);
    let (p2, l2) = parse(&o2);
    assert_eq!(addrs(&p1).1, a("10.244.2.7"));
    assert_eq!(addrs(&p2).1, a("10.244.2.7"));
    assert_eq!(l2, second, "a later fragment's payload is never touched");
    let whole = [l1, l2].concat();
    let (u, rest) = UdpHeader::from_slice(&whole).unwrap();
    assert_eq!(
        u.checksum,
        u.calc_checksum_ipv4(&p1, rest).unwrap(),
        "reassembled UDP checksum"
    );
}

/// The MSS value at an odd offset of the TCP header straddles two 16-bit checksum words, so the
/// incremental update must use the byte-swapped values (RFC 1071): after a single NOP, or after
/// a window scale option, as some stacks send them.
#[test]
fn mss_clamping_at_odd_offsets() {
    let Some(dp) = fixture() else { return };
    let layouts: [&[TcpOptionElement]; 3] = [
        &[
            TcpOptionElement::Noop,
            TcpOptionElement::MaximumSegmentSize(1460),
        ],
        &[
            TcpOptionElement::WindowScale(7),
            TcpOptionElement::MaximumSegmentSize(8960),
            TcpOptionElement::Noop,
        ],
        &[
            TcpOptionElement::Noop,
            TcpOptionElement::Noop,
            TcpOptionElement::Noop,
            TcpOptionElement::MaximumSegmentSize(65495),
            TcpOptionElement::SelectiveAcknowledgementPermitted,
        ],
    ];
    for opts in layouts {
        let (src, dst) = ("10.244.1.10", "10.71.2.7");
        let seg = tcp_with(src, dst, true, opts, b"");
        let f = eth(0x0800, &packet(&ipv4(src, dst, IpNumber::TCP, &seg), &seg));
        let (ret, out) = run(&dp, true, &f);
        assert_eq!(ret, TC_ACT_OK, "{opts:?}");
        let (h, l4) = parse(&out);
        let t = assert_tcp_ok(&h, &l4);
        let mss = t.options_iterator().find_map(|o| match o {
            Ok(TcpOptionElement::MaximumSegmentSize(m)) => Some(m),
            _ => None,
        });
        assert_eq!(mss, Some(1360), "{opts:?}");
    }
}

#[test]
fn mss_clamping() {
    let Some(dp) = fixture() else { return };
    let mss_of = |t: &TcpHeader| {
        t.options_iterator()
            .find_map(|o| match o {
                Ok(TcpOptionElement::MaximumSegmentSize(m)) => Some(m),
                _ => None,
            })
            .unwrap()
    };
    // SYN towards the peer: clamped (and remapped), checksum right.
    let (ret, out) = run(
        &dp,
        true,
        &frame_tcp("10.244.1.10", "10.71.2.7", true, Some(1460)),
    );
    assert_eq!(ret, TC_ACT_OK);
    let (h, l4) = parse(&out);
    assert_eq!(mss_of(&assert_tcp_ok(&h, &l4)), 1360);
    // SYN-ACK from the peer: clamped too.
    let (_, out) = run(
        &dp,
        false,
        &frame_tcp("10.244.2.7", "10.244.1.10", true, Some(8960)),
    );
    let (h, l4) = parse(&out);
    assert_eq!(mss_of(&assert_tcp_ok(&h, &l4)), 1360);
    // Already small: left alone.
    let f = frame_tcp("10.244.1.10", "10.71.2.7", true, Some(1200));
    let (_, out) = run(&dp, true, &f);
    let (h, l4) = parse(&out);
    assert_eq!(mss_of(&assert_tcp_ok(&h, &l4)), 1200);
}

#[test]
fn untouched_traffic() {
    let Some(dp) = fixture() else { return };
    // no mapping for either address
    let f = frame_tcp("10.244.1.10", "10.50.0.1", false, None);
    assert_eq!(run(&dp, true, &f), (TC_ACT_OK, f.clone()));
    // IPv6 (even to an address whose low bits look like a mapped one)
    let mut v6 = vec![0x60, 0, 0, 0, 0, 8, 17, 64];
    v6.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 244, 1, 10]);
    v6.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 71, 2, 7]);
    v6.extend_from_slice(&[0, 53, 0, 53, 0, 8, 0, 0]);
    let f = eth(0x86dd, &v6);
    assert_eq!(run(&dp, true, &f), (TC_ACT_OK, f.clone()));
    // ARP
    let f = eth(
        0x0806,
        &[
            0, 1, 8, 0, 6, 4, 0, 1, 2, 0, 0, 0, 0, 1, 10, 244, 1, 10, 0, 0, 0, 0, 0, 0, 10, 71, 2,
            7,
        ],
    );
    assert_eq!(run(&dp, true, &f), (TC_ACT_OK, f.clone()));
    // SYN to an unmapped destination is still clamped (the device's MTU applies to all)
    let (_, out) = run(
        &dp,
        true,
        &frame_tcp("10.244.1.10", "10.50.0.1", true, Some(1460)),
    );
    let (h, l4) = parse(&out);
    assert_eq!(addrs(&h).1, a("10.50.0.1"));
    assert_tcp_ok(&h, &l4);
}

/// A peer may not steer this cluster's routing: redirects and source quenches coming out of a
/// tunnel are dropped with their own reason; the same types going out, and other ICMP errors
/// coming in, are not.
#[test]
fn icmp_redirect_and_source_quench_from_peers_are_dropped() {
    let Some(mut dp) = fixture() else { return };
    let quoted = {
        let seg = tcp("10.244.1.10", "10.244.2.7", false, None, b"");
        let mut q = ipv4("10.244.1.10", "10.244.2.7", IpNumber::TCP, &seg)
            .to_bytes()
            .to_vec();
        q.extend_from_slice(&seg[..8]);
        q
    };
    let frame = |ty: u8, code: u8, src: &str, dst: &str| {
        let msg = icmp(
            Icmpv4Type::Unknown {
                type_u8: ty,
                code_u8: code,
                bytes5to8: [10, 244, 1, 1],
            },
            &quoted,
        );
        eth(0x0800, &packet(&ipv4(src, dst, IpNumber::ICMP, &msg), &msg))
    };
    for (ty, code) in [(5, 0), (5, 1), (4, 0)] {
        let f = frame(ty, code, "10.244.2.7", "10.244.1.10");
        assert_eq!(
            run(&dp, false, &f).0,
            TC_ACT_SHOT,
            "type {ty} code {code} in"
        );
        let f = frame(ty, code, "10.244.1.10", "10.71.2.7");
        assert_eq!(run(&dp, true, &f).0, TC_ACT_OK, "type {ty} code {code} out");
    }
    let unreachable = frame(3, 1, "10.244.2.7", "10.244.1.10");
    assert_eq!(run(&dp, false, &unreachable).0, TC_ACT_OK);
    let drops = dp.maps().drops().unwrap();
    assert_eq!(drops[drop::name(drop::ICMP_REFUSED)], 3);
}

/// A peer reaches local pods, the local IPs exposed through the external CIDR and its tunnel
/// address; not the gateway itself, nodes, metadata services or anything else, IPv6 included.
#[test]
fn a_peer_reaches_only_pods_exposed_ips_and_its_tunnel_address() {
    let cfg = CONFIG.replace(
        "mss = 1360",
        "mss = 1360\ntunnel_addresses = [\"169.254.3.1\"]",
    );
    let own = ["10.244.1.1", "10.244.1.255", "169.254.3.1", "192.168.7.1"];
    let Some(mut dp) = fixture_owning(&cfg, &own) else {
        return;
    };
    let peer = "10.244.2.7";
    for (dst, want) in [
        ("10.244.1.10", Some("10.244.1.10")), // a pod
        ("10.244.9.3", Some("10.244.9.3")),   // a pod on another node
        ("10.70.0.5", Some("192.168.1.5")),   // an exposed local IP, by its external address
        ("169.254.3.1", Some("169.254.3.1")), // the tunnel address (probes)
        ("10.244.1.1", None),                 // the gateway's own address in the pod CIDR
        ("10.244.1.255", None),               // a broadcast address
        ("192.168.7.1", None),                // a node address of the gateway
        ("169.254.169.254", None),            // a metadata service
        ("192.168.1.5", None),                // an exposed IP, but not through its mapping
        ("10.50.0.1", None),                  // anywhere else
    ] {
        let (ret, out) = run(&dp, false, &frame_udp(peer, dst, false));
        match want {
            Some(to) => {
                assert_eq!(ret, TC_ACT_OK, "{peer} -> {dst}");
                let (h, l4) = parse(&out);
                assert_eq!(addrs(&h), (a("10.71.2.7"), a(to)), "{peer} -> {dst}");
                assert_udp_ok(&h, &l4);
            }
            None => assert_eq!(ret, TC_ACT_SHOT, "{peer} -> {dst} went through"),
        }
    }
    // IPv6 from a peer goes nowhere; ARP (Ethernet devices) passes.
    let mut v6 = vec![0x60, 0, 0, 0, 0, 8, 17, 64];
    v6.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 244, 2, 7]);
    v6.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 244, 1, 10]);
    v6.extend_from_slice(&[0, 53, 0, 53, 0, 8, 0, 0]);
    assert_eq!(run(&dp, false, &eth(0x86dd, &v6)).0, TC_ACT_SHOT);
    assert_eq!(run(&dp, false, &eth(0x0806, &[0u8; 28])).0, TC_ACT_OK);
    // Our own traffic going out is not the peer's to restrict.
    assert_eq!(
        run(&dp, true, &frame_udp("10.244.1.1", "10.71.2.7", false)).0,
        TC_ACT_OK
    );

    let (eg, ing) = dp.maps().peer_counters(7).unwrap();
    assert_eq!((ing.refused, ing.dropped), (7, 7));
    assert_eq!((eg.refused, eg.dropped), (0, 0));
    assert_eq!(dp.maps().drops().unwrap()[drop::name(drop::DST_REFUSED)], 7);
    let snap = dp.maps().snapshot().unwrap();
    assert!(snap.to_table().contains("REFUSED"));
    let json = serde_json::to_value(&snap).unwrap();
    assert_eq!(json["peers"][0]["ingress"]["refused"], 7, "{json}");
}

/// The device's entry deleted behind the loader's back: what comes in is dropped (it would
/// go in untranslated), what goes out is left to the peer's checks.
#[test]
fn a_device_without_its_entry_drops_what_comes_in() {
    let Some(mut dp) = fixture() else { return };
    let ifindex = fabric_dataplane::sys::link_facts("lo").unwrap().ifindex;
    dp.maps().write(&[state::Op::DelIface(ifindex)]).unwrap();
    let f = frame_udp("10.244.2.7", "10.244.1.10", false);
    assert_eq!(run(&dp, false, &f).0, TC_ACT_SHOT);
    let f = frame_udp("10.244.1.10", "10.71.2.7", false);
    assert_eq!(run(&dp, true, &f), (TC_ACT_OK, f.clone()));
    assert_eq!(
        dp.maps().drops().unwrap()[drop::name(drop::UNCONFIGURED)],
        1
    );
}

#[test]
fn malformed_packets_are_dropped_with_reasons() {
    let Some(mut dp) = fixture() else { return };
    // (A cut IPv4 header cannot be fed through BPF_PROG_TEST_RUN: the kernel refuses such
    // frames before the program runs. The program still counts them as truncated-ip.)
    let good = frame_tcp("10.244.1.10", "10.71.2.7", false, None);
    // IHL of 3, and a version that is not 4, behind an IPv4 ethertype
    let mut bad = good.clone();
    bad[14] = 0x43;
    assert_eq!(run(&dp, true, &bad).0, TC_ACT_SHOT);
    bad[14] = 0x65;
    assert_eq!(run(&dp, true, &bad).0, TC_ACT_SHOT);
    // a mapped TCP packet whose TCP header is cut
    let seg = tcp("10.244.1.10", "10.71.2.7", false, None, b"");
    let h = ipv4("10.244.1.10", "10.71.2.7", IpNumber::TCP, &seg[..10]);
    assert_eq!(
        run(&dp, true, &eth(0x0800, &packet(&h, &seg[..10]))).0,
        TC_ACT_SHOT
    );
    // an ICMP error whose quoted header is garbage
    let msg = icmp(
        Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::Host),
        &[0x99; 28],
    );
    let f = eth(
        0x0800,
        &packet(
            &ipv4("10.244.1.1", "10.244.1.10", IpNumber::ICMP, &msg),
            &msg,
        ),
    );
    assert_eq!(run(&dp, false, &f).0, TC_ACT_SHOT);

    let drops = dp.maps().drops().unwrap();
    for (reason, want) in [
        (drop::TRUNCATED_IP, 0),
        (drop::BAD_IP_HEADER, 2),
        (drop::TRUNCATED_L4, 1),
        (drop::BAD_ICMP_INNER, 1),
    ] {
        assert_eq!(drops[drop::name(reason)], want, "{}", drop::name(reason));
    }
    let (eg, ing) = dp.maps().peer_counters(7).unwrap();
    assert_eq!((eg.dropped, ing.dropped), (3, 1));
    assert_eq!((eg.packets, ing.packets), (3, 1));
}

#[test]
fn counters_per_peer_and_direction() {
    let Some(mut dp) = fixture() else { return };
    let f = frame_tcp("10.244.1.10", "10.71.2.7", true, Some(1460));
    for _ in 0..3 {
        run(&dp, true, &f);
    }
    run(&dp, false, &frame_udp("10.244.2.7", "10.244.1.10", false));
    let (eg, ing) = dp.maps().peer_counters(7).unwrap();
    assert_eq!((eg.packets, eg.remapped, eg.mss_clamped), (3, 3, 3));
    assert_eq!(eg.bytes, 3 * f.len() as u64);
    assert_eq!((ing.packets, ing.remapped, ing.mss_clamped), (1, 1, 0));
    let snap = dp.maps().snapshot().unwrap();
    assert_eq!(snap.peers[0].name, "cluster-b");
    assert_eq!(snap.remaps.len(), 4);
}

/// A peer with more remaps than fit inline goes through the LPM tries: same results.
#[test]
fn many_remaps_use_the_tries() {
    let mut cfg = CONFIG.replace(
        "  { local = \"11.0.0.0/8\",   remote = \"12.0.0.0/8\" },",
        "  { local = \"11.0.0.0/8\",   remote = \"12.0.0.0/8\" },\n  { local = \"10.90.0.0/24\", remote = \"10.244.200.0/24\" },\n  { local = \"10.91.0.0/24\", remote = \"10.245.0.0/24\" },",
    );
    // 10.244.200.0/24 sits inside 10.244.0.0/16, which the validation rejects: use another.
    cfg = cfg.replace("10.244.200.0/24", "10.246.0.0/24");
    let Some(dp) = fixture_with(&cfg) else { return };
    let table = [
        (
            true,
            "10.244.1.10",
            "10.71.2.7",
            "10.244.1.10",
            "10.244.2.7",
        ),
        (
            false,
            "10.244.2.7",
            "10.244.1.10",
            "10.71.2.7",
            "10.244.1.10",
        ),
        (
            true,
            "10.244.1.10",
            "10.91.0.9",
            "10.244.1.10",
            "10.245.0.9",
        ),
        (
            false,
            "10.246.0.3",
            "10.244.1.10",
            "10.90.0.3",
            "10.244.1.10",
        ),
        (true, "10.244.1.10", "11.1.1.1", "10.244.1.10", "12.1.1.1"),
        (true, "10.244.1.10", "10.92.0.1", "10.244.1.10", "10.92.0.1"),
    ];
    for (egress, src, dst, esrc, edst) in table {
        let (ret, out) = run(&dp, egress, &frame_udp(src, dst, false));
        assert_eq!(ret, TC_ACT_OK);
        let (h, l4) = parse(&out);
        assert_eq!(addrs(&h), (a(esrc), a(edst)), "{src}->{dst}");
        assert_udp_ok(&h, &l4);
    }
}
