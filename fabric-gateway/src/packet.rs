//! Allocation-free helpers for raw IP packets: address extraction and the
//! in-tunnel ICMP echo used as a health probe.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use fabric_common::csum::checksum;

/// Source address of an IPv4/IPv6 packet, or None if the header is truncated.
pub fn src_addr(p: &[u8]) -> Option<IpAddr> {
    match p.first()? >> 4 {
        4 if p.len() >= 20 => Some(IpAddr::V4(Ipv4Addr::new(p[12], p[13], p[14], p[15]))),
        6 if p.len() >= 40 => {
            let b: [u8; 16] = p[8..24].try_into().ok()?;
            Some(IpAddr::V6(Ipv6Addr::from(b)))
        }
        _ => None,
    }
}

/// WireGuard pads every transport payload with zeros to a multiple of 16 bytes, never past the
/// tunnel MTU, so that the exact sizes of inner packets do not show on the underlay; boringtun
/// 0.7 does not, so the gateway does it before encrypting. Receivers (boringtun, the kernel)
/// trim by the IP header's total length. Returns `p` itself when it needs no padding (or `buf`
/// is too small), else a padded copy in `buf`.
pub fn pad_transport<'a>(p: &'a [u8], mtu: usize, buf: &'a mut [u8]) -> &'a [u8] {
    let want = p.len().next_multiple_of(16).min(mtu.max(p.len()));
    if want == p.len() || buf.len() < want {
        return p;
    }
    buf[..p.len()].copy_from_slice(p);
    buf[p.len()..want].fill(0);
    &buf[..want]
}

/// The largest packet [`pad_transport`] writes into its buffer (the largest MTU the gateway
/// accepts).
pub const PAD_BUF: usize = 9000;

/// ICMP identifier that marks our probes, so echo replies to real pods are
/// never swallowed by the gateway.
pub const PROBE_ICMP_ID: u16 = 0xFAB0;
pub const PROBE_LEN: usize = 20 + 8 + 8;

/// Writes an IPv4 ICMP echo request (id = PROBE_ICMP_ID, seq) into `buf` and
/// returns its length. The payload carries `seq` again so replies can be matched.
pub fn build_probe_v4(buf: &mut [u8], src: Ipv4Addr, dst: Ipv4Addr, seq: u16) -> usize {
    let p = &mut buf[..PROBE_LEN];
    p.fill(0);
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(PROBE_LEN as u16).to_be_bytes());
    p[6] = 0x40; // DF: a probe must not be fragmented, so it also detects MTU black holes for tiny packets
    p[8] = 64;
    p[9] = 1; // ICMP
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    // A native-endian checksum is stored as it is (see fabric_common::csum).
    let c = checksum(&p[..20]);
    p[10..12].copy_from_slice(&c.to_ne_bytes());
    let icmp = &mut p[20..];
    icmp[0] = 8; // echo request
    icmp[4..6].copy_from_slice(&PROBE_ICMP_ID.to_be_bytes());
    icmp[6..8].copy_from_slice(&seq.to_be_bytes());
    icmp[8..10].copy_from_slice(b"fg");
    icmp[10..12].copy_from_slice(&seq.to_be_bytes());
    let c = checksum(icmp);
    icmp[2..4].copy_from_slice(&c.to_ne_bytes());
    PROBE_LEN
}

/// Whether `p` is an IPv4 ICMP packet long enough to be a probe's echo reply: the cheap test
/// before [`parse_probe_reply_v4`] (and the lock around the probe's state).
pub fn may_be_probe_reply_v4(p: &[u8]) -> bool {
    p.len() >= 28 && p[0] >> 4 == 4 && p[9] == 1
}

/// If `p` is an echo reply to one of our probes, from the address probed (`peer_addr`) to
/// `our_addr`, returns its sequence number. Matching the source too means that no other host
/// behind the peer (any of its pods) can keep a dead tunnel looking up with forged replies.
pub fn parse_probe_reply_v4(p: &[u8], our_addr: Ipv4Addr, peer_addr: Ipv4Addr) -> Option<u16> {
    if !may_be_probe_reply_v4(p) {
        return None;
    }
    let ihl = ((p[0] & 0xf) as usize) * 4;
    if ihl < 20
        || p.len() < ihl + 8
        || p[16..20] != our_addr.octets()
        || p[12..16] != peer_addr.octets()
    {
        return None;
    }
    let icmp = &p[ihl..];
    if icmp[0] != 0 || icmp[4..6] != PROBE_ICMP_ID.to_be_bytes() {
        return None;
    }
    Some(u16::from_be_bytes([icmp[6], icmp[7]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_is_valid_ipv4_icmp() {
        let mut b = [0u8; 64];
        let n = build_probe_v4(&mut b, [169, 254, 0, 1].into(), [169, 254, 0, 2].into(), 7);
        assert_eq!(n, PROBE_LEN);
        assert_eq!(checksum(&b[..20]), 0, "ip header checksum must verify");
        assert_eq!(checksum(&b[20..n]), 0, "icmp checksum must verify");
        assert_eq!(src_addr(&b[..n]), Some("169.254.0.1".parse().unwrap()));
    }

    #[test]
    fn transport_padding_to_16_within_the_mtu() {
        let mut buf = [0xffu8; PAD_BUF];
        for (len, mtu, want) in [
            (36, 1420, 48),
            (48, 1420, 48),
            (1, 1420, 16),
            (1401, 1420, 1408),
            (1415, 1420, 1420),
            (1420, 1420, 1420),
            (1500, 1420, 1500),
        ] {
            let p: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let out = pad_transport(&p, mtu, &mut buf).to_vec();
            assert_eq!(out.len(), want, "len {len} mtu {mtu}");
            assert_eq!(&out[..len], &p[..], "payload kept");
            assert!(out[len..].iter().all(|&b| b == 0), "zero padding");
        }
    }

    /// A padded packet goes through real WireGuard state machines: the ciphertext hides the
    /// exact size, and the receiver hands back the packet at its IP length.
    #[test]
    fn padded_packets_decrypt_to_their_ip_length() {
        use boringtun::{
            noise::{Tunn, TunnResult},
            x25519::{PublicKey, StaticSecret},
        };
        let (ka, kb) = (StaticSecret::from([3u8; 32]), StaticSecret::from([4u8; 32]));
        let (pa, pb) = (PublicKey::from(&ka), PublicKey::from(&kb));
        let mut a = Tunn::new(ka, pb, None, None, 1 << 8, None);
        let mut b = Tunn::new(kb, pa, None, None, 2 << 8, None);
        let mut buf = vec![0u8; 2048];
        let mut out = vec![0u8; 2048];
        let init = match a.format_handshake_initiation(&mut buf, false) {
            TunnResult::WriteToNetwork(p) => p.to_vec(),
            r => panic!("{r:?}"),
        };
        let resp = match b.decapsulate(None, &init, &mut out) {
            TunnResult::WriteToNetwork(p) => p.to_vec(),
            r => panic!("{r:?}"),
        };
        let _ = a.decapsulate(None, &resp, &mut out);
        let mut probe = [0u8; 64];
        let n = build_probe_v4(&mut probe, [10, 0, 0, 1].into(), [10, 0, 0, 2].into(), 9);
        let mut pad = [0u8; PAD_BUF];
        let padded = pad_transport(&probe[..n], 1420, &mut pad);
        let wire = match a.encapsulate(padded, &mut buf) {
            TunnResult::WriteToNetwork(p) => p.to_vec(),
            r => panic!("{r:?}"),
        };
        // 16 bytes of header, the padded payload, a 16-byte tag.
        assert_eq!(wire.len(), 16 + 48 + 16);
        match b.decapsulate(None, &wire, &mut out) {
            TunnResult::WriteToTunnelV4(p, _) => assert_eq!(p, &probe[..n]),
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn reply_parsing_matches_only_our_probes() {
        let mut b = [0u8; 64];
        let ours: Ipv4Addr = [169, 254, 0, 1].into();
        let theirs: Ipv4Addr = [169, 254, 0, 2].into();
        // Simulate the peer kernel's answer: swap addresses, type 0.
        let n = build_probe_v4(&mut b, theirs, ours, 42);
        b[20] = 0;
        assert_eq!(parse_probe_reply_v4(&b[..n], ours, theirs), Some(42));
        assert_eq!(
            parse_probe_reply_v4(&b[..n], [10, 0, 0, 1].into(), theirs),
            None
        );
        // The same reply forged by another host behind the peer (a pod).
        assert_eq!(
            parse_probe_reply_v4(&b[..n], ours, [10, 244, 2, 7].into()),
            None
        );
        b[24] = 0x12; // a pod's ping id
        assert_eq!(parse_probe_reply_v4(&b[..n], ours, theirs), None);
        b[24] = 0xFA;
        b[20] = 8; // a request, not a reply
        assert_eq!(parse_probe_reply_v4(&b[..n], ours, theirs), None);
        assert_eq!(parse_probe_reply_v4(&b[..10], ours, theirs), None);
    }

    #[test]
    fn probe_prefilter_passes_replies_and_skips_data() {
        // The receive path takes the probe's lock only for what passes the prefilter.
        let mut b = [0u8; 64];
        let n = build_probe_v4(&mut b, [169, 254, 0, 2].into(), [169, 254, 0, 1].into(), 9);
        b[20] = 0;
        assert!(may_be_probe_reply_v4(&b[..n]));
        let mut tcp = b;
        tcp[9] = 6;
        assert!(!may_be_probe_reply_v4(&tcp[..n]), "TCP");
        assert!(
            !may_be_probe_reply_v4(&b[..27]),
            "shorter than IP + ICMP echo header"
        );
        let mut v6 = [0u8; 64];
        v6[0] = 0x60;
        v6[9] = 1;
        assert!(!may_be_probe_reply_v4(&v6), "IPv6");
    }

    #[test]
    fn src_addr_handles_v6_and_garbage() {
        let mut p = [0u8; 40];
        p[0] = 0x60;
        p[8..24].copy_from_slice(&"fd00::5".parse::<Ipv6Addr>().unwrap().octets());
        assert_eq!(src_addr(&p), Some("fd00::5".parse().unwrap()));
        assert_eq!(src_addr(&p[..30]), None);
        assert_eq!(src_addr(&[0x45; 10]), None);
        assert_eq!(src_addr(&[]), None);
    }
}
