//! `offload::segment`: what the gateway does with every packet it reads from an offloading
//! TUN device (a `virtio_net_hdr` and a packet the local kernel, or a local process through
//! a raw socket, produced).
//!
//! Input: the 10-byte `virtio_net_hdr`, one byte that grows the packet (n × 256 bytes more,
//! repeating its own bytes, so short inputs reach super-packet sizes), the packet.
//! Checked on success: a TSO packet comes out as segments that a receiver accepts (lengths
//! and checksums verified by etherparse), whose payloads put together are the input's, with
//! consecutive sequence numbers and IDs, FIN/PSH only on the last and CWR only on the first,
//! and every other header field unchanged; a plain packet comes out once, unchanged but for a
//! requested checksum, which then verifies. On failure nothing was emitted.

use fabric_gateway::offload::{
    F_NEEDS_CSUM, GSO_ECN, GSO_NONE, GSO_TCPV4, GSO_TCPV6, TCP_CWR, TCP_FIN, TCP_PSH, VNET_HDR_LEN,
    VnetHdr, segment,
};

use crate::tcpip::{sums_to_zero_with, valid_tcp};

/// The gateway's TUN read buffer (and the largest packet it can hand to `segment`).
pub const MAX_PACKET: usize = 65_536;

/// `pkt` followed by `grow` × 256 more bytes cycling through `pkt`, cut at `max` bytes (as a
/// read into a buffer of that size would be).
pub fn grown(pkt: &[u8], grow: u8, max: usize) -> Vec<u8> {
    let want = (pkt.len() + usize::from(grow) * 256).min(max);
    pkt.iter().copied().cycle().take(want).collect()
}

pub fn check(data: &[u8]) {
    let Some((hdr, rest)) = data.split_first_chunk::<VNET_HDR_LEN>() else {
        return;
    };
    let Some((&grow, pkt)) = rest.split_first() else {
        return;
    };
    let h = VnetHdr::parse(hdr);
    let mut pkt = grown(pkt, grow, MAX_PACKET);
    let orig = pkt.clone();
    let mut scratch = vec![0u8; MAX_PACKET];
    let mut out: Vec<Vec<u8>> = Vec::new();
    let res = segment(&h, &mut pkt, &mut scratch, |s| out.push(s.to_vec()));
    if res.is_err() {
        assert!(
            out.is_empty(),
            "{res:?} after emitting {} packets",
            out.len()
        );
        return;
    }
    match h.gso_type & !GSO_ECN {
        GSO_NONE => check_plain(&h, &orig, &out),
        GSO_TCPV4 | GSO_TCPV6 => check_tso(&h, &orig, &out),
        other => panic!("gso_type {other} accepted"),
    }
}

fn check_plain(h: &VnetHdr, orig: &[u8], out: &[Vec<u8>]) {
    let [p] = out else {
        panic!("a plain packet came out as {} packets", out.len());
    };
    assert_eq!(p.len(), orig.len());
    if h.flags & F_NEEDS_CSUM == 0 {
        assert_eq!(p, orig, "a packet without offloads was changed");
        return;
    }
    let start = usize::from(h.csum_start);
    let field = start + usize::from(h.csum_offset);
    for (i, (a, b)) in p.iter().zip(orig).enumerate() {
        assert!(
            a == b || (field..field + 2).contains(&i),
            "byte {i} changed"
        );
    }
    // The kernel only ever asks for a 16-bit aligned field (TCP 16, UDP 6); at an odd
    // offset the value lands byte-swapped in the sum and nothing can verify.
    if h.csum_offset % 2 == 0 {
        let seed = u16::from_be_bytes([orig[field], orig[field + 1]]);
        assert!(
            sums_to_zero_with(seed, &p[start..]),
            "completed checksum does not verify"
        );
    }
}

fn check_tso(h: &VnetHdr, orig: &[u8], out: &[Vec<u8>]) {
    let v6 = h.gso_type & !GSO_ECN == GSO_TCPV6;
    let iphl = if v6 {
        40
    } else {
        usize::from(orig[0] & 0x0f) * 4
    };
    let thl = usize::from(orig[iphl + 12] >> 4) * 4;
    let (hdr, payload) = orig.split_at(iphl + thl);
    let mss = usize::from(h.gso_size);
    let chunks: Vec<&[u8]> = if payload.len() <= mss {
        vec![payload]
    } else {
        payload.chunks(mss).collect()
    };
    assert_eq!(
        out.len(),
        chunks.len(),
        "segments for {} bytes at mss {mss}",
        payload.len()
    );
    let seq0 = u32::from_be_bytes(hdr[iphl + 4..iphl + 8].try_into().unwrap());
    let id0 = u16::from_be_bytes([hdr[4], hdr[5]]);
    let flags0 = hdr[iphl + 13];
    let last = out.len() - 1;
    for (i, (s, chunk)) in out.iter().zip(&chunks).enumerate() {
        let t = valid_tcp(s)
            .unwrap_or_else(|| panic!("segment {i} of {} has bad lengths or checksums", out.len()));
        assert_eq!(
            (t.ip.len(), t.tcp.len()),
            (iphl, thl),
            "segment {i} headers"
        );
        assert_eq!(t.payload, *chunk, "segment {i} payload");
        assert_eq!(
            t.seq(),
            seq0.wrapping_add((i * mss) as u32),
            "segment {i} seq"
        );
        let mut flags = flags0;
        if i < last {
            flags &= !(TCP_FIN | TCP_PSH);
        }
        if i > 0 {
            flags &= !TCP_CWR;
        }
        assert_eq!(t.flags(), flags, "segment {i} flags");
        let (ip, oip) = (t.ip, &hdr[..iphl]);
        if v6 {
            assert!(
                ip[..4] == oip[..4] && ip[6..] == oip[6..],
                "segment {i} IPv6 header"
            );
        } else {
            // Length, ID and checksum are the segment's own; the rest is the input's.
            assert!(
                ip[..2] == oip[..2] && ip[6..10] == oip[6..10] && ip[12..] == oip[12..],
                "segment {i} IPv4 header"
            );
            assert_eq!(
                u16::from_be_bytes([ip[4], ip[5]]),
                id0.wrapping_add(i as u16)
            );
        }
        let (tcp, otcp) = (t.tcp, &hdr[iphl..]);
        assert!(
            tcp[..4] == otcp[..4] && tcp[8..13] == otcp[8..13] && tcp[14..16] == otcp[14..16],
            "segment {i} TCP ports, ack, offset or window"
        );
        assert_eq!(
            tcp[18..],
            otcp[18..thl],
            "segment {i} TCP urgent pointer or options"
        );
    }
}
