//! `packet`: the gateway's look at every decrypted packet (`src_addr`, checked against the
//! peer's allowed IPs) and at probe replies (`parse_probe_reply_v4`), and the probes it builds.
//!
//! Input: a packet; its first bytes also give a probe's source, destination and sequence.
//! Checked: `src_addr` finds the address etherparse finds in every IP header it accepts and
//! never reads one from something too short; a reply is only recognised with our ICMP id and
//! type, from the probed peer to our address, and gives its sequence; a probe built from the input is a valid
//! IPv4 echo request (checksums verified by etherparse) whose reply is recognised.

use std::net::{IpAddr, Ipv4Addr};

use etherparse::{Icmpv4Slice, Icmpv4Type, Ipv4HeaderSlice, Ipv6HeaderSlice, checksum};
use fabric_gateway::packet::{
    PROBE_ICMP_ID, PROBE_LEN, build_probe_v4, parse_probe_reply_v4, src_addr,
};

pub fn check(data: &[u8]) {
    check_src_addr(data);
    check_reply(data);
    check_probe(data);
}

fn check_src_addr(data: &[u8]) {
    let got = src_addr(data);
    if let Ok(h) = Ipv4HeaderSlice::from_slice(data) {
        assert_eq!(got, Some(IpAddr::from(h.source())));
    } else if let Ok(h) = Ipv6HeaderSlice::from_slice(data) {
        assert_eq!(got, Some(IpAddr::from(h.source())));
    }
    match got {
        Some(IpAddr::V4(a)) => {
            assert!(data[0] >> 4 == 4 && data.len() >= 20 && data[12..16] == a.octets())
        }
        Some(IpAddr::V6(a)) => {
            assert!(data[0] >> 4 == 6 && data.len() >= 40 && data[8..24] == a.octets())
        }
        None => {}
    }
}

fn check_reply(data: &[u8]) {
    // As the gateway calls it, with its own tunnel address and the peer's; here taken from
    // the packet's destination and source, so that replies can match.
    let addr = |at: usize, or: Ipv4Addr| {
        data.get(at..at + 4)
            .map_or(or, |d| Ipv4Addr::from(<[u8; 4]>::try_from(d).unwrap()))
    };
    let ours = addr(16, Ipv4Addr::new(169, 254, 0, 1));
    let peer = addr(12, Ipv4Addr::new(169, 254, 0, 2));
    let Some(seq) = parse_probe_reply_v4(data, ours, peer) else {
        return;
    };
    let ihl = usize::from(data[0] & 0x0f) * 4;
    assert!(
        data[0] >> 4 == 4 && data[9] == 1 && ihl >= 20,
        "not ICMP over IPv4"
    );
    assert_eq!(data[16..20], ours.octets(), "not to our address");
    assert_eq!(data[12..16], peer.octets(), "not from the peer");
    let icmp = &data[ihl..];
    assert_eq!(icmp[0], 0, "not an echo reply");
    assert_eq!(icmp[4..6], PROBE_ICMP_ID.to_be_bytes(), "not our ICMP id");
    assert_eq!(icmp[6..8], seq.to_be_bytes());
    // Anyone else behind the peer cannot answer for it.
    let other = Ipv4Addr::from(u32::from(peer).wrapping_add(1));
    assert_eq!(
        parse_probe_reply_v4(data, ours, other),
        None,
        "a reply from another host"
    );
}

fn check_probe(data: &[u8]) {
    let Some((addrs, rest)) = data.split_first_chunk::<8>() else {
        return;
    };
    let src = Ipv4Addr::new(addrs[0], addrs[1], addrs[2], addrs[3]);
    let dst = Ipv4Addr::new(addrs[4], addrs[5], addrs[6], addrs[7]);
    let seq = rest
        .get(..2)
        .map_or(0, |s| u16::from_be_bytes([s[0], s[1]]));
    let mut buf = [0u8; 64];
    let n = build_probe_v4(&mut buf, src, dst, seq);
    assert_eq!(n, PROBE_LEN);
    let p = &buf[..n];
    let ip = Ipv4HeaderSlice::from_slice(p).expect("probe IPv4 header");
    assert_eq!(usize::from(ip.total_len()), n);
    assert!(ip.dont_fragment());
    assert_eq!((ip.source_addr(), ip.destination_addr()), (src, dst));
    assert_eq!(
        checksum::Sum16BitWords::new()
            .add_slice(ip.slice())
            .ones_complement(),
        0,
        "probe IPv4 header checksum"
    );
    let icmp = Icmpv4Slice::from_slice(&p[ip.slice().len()..]).expect("probe ICMP");
    let Icmpv4Type::EchoRequest(echo) = icmp.icmp_type() else {
        panic!("probe is {:?}", icmp.icmp_type());
    };
    assert_eq!((echo.id, echo.seq), (PROBE_ICMP_ID, seq));
    assert_eq!(
        icmp.checksum(),
        icmp.icmp_type().calc_checksum(icmp.payload())
    );

    // The peer's kernel answers: addresses swapped, type 0, checksums fixed.
    let mut reply = p.to_vec();
    reply[12..16].copy_from_slice(&dst.octets());
    reply[16..20].copy_from_slice(&src.octets());
    reply[20] = 0;
    assert_eq!(parse_probe_reply_v4(&reply, src, dst), Some(seq));
    if src != dst {
        assert_eq!(
            parse_probe_reply_v4(&reply, dst, src),
            None,
            "a reply to someone else"
        );
    }
    reply[24] ^= 1;
    assert_eq!(
        parse_probe_reply_v4(&reply, src, dst),
        None,
        "another ICMP id"
    );
}
