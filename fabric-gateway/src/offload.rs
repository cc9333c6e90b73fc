//! TUN offloads in user space: the kernel hands us TCP super-packets (TSO) and
//! packets with only a partial checksum; WireGuard must encrypt real, MTU-sized
//! packets with complete checksums, so we segment and checksum here, as
//! wireguard-go does. Pure functions on byte slices.

use fabric_common::csum::{wide_add, wide_fold};

/// `struct virtio_net_hdr` as TUN prepends it with IFF_VNET_HDR (native endian).
pub const VNET_HDR_LEN: usize = 10;

/// `virtio_net_hdr` flags and GSO types, and the TCP flags segmentation treats specially.
pub const F_NEEDS_CSUM: u8 = 1;
pub const GSO_NONE: u8 = 0;
pub const GSO_TCPV4: u8 = 1;
pub const GSO_TCPV6: u8 = 4;
pub const GSO_ECN: u8 = 0x80;

pub const TCP_FIN: u8 = 0x01;
pub const TCP_PSH: u8 = 0x08;
pub const TCP_CWR: u8 = 0x80;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VnetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl VnetHdr {
    pub fn parse(b: &[u8; VNET_HDR_LEN]) -> Self {
        let u = |i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
        Self {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u(2),
            gso_size: u(4),
            csum_start: u(6),
            csum_offset: u(8),
        }
    }

    pub fn encode(&self) -> [u8; VNET_HDR_LEN] {
        let mut b = [0u8; VNET_HDR_LEN];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_ne_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_ne_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_ne_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_ne_bytes());
        b
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum OffloadError {
    /// Headers inconsistent with the packet or the offload request.
    Malformed,
    /// A GSO type we never enabled.
    Unsupported(u8),
}

/// Pseudo-header sum for a TCP/UDP segment of `l4_len` bytes in IP packet `ip`.
fn pseudo_sum(ip: &[u8], proto: u8, l4_len: usize) -> u64 {
    match ip[0] >> 4 {
        4 => wide_add(0, &ip[12..20]) + u64::from(proto) + l4_len as u64,
        _ => wide_add(0, &ip[8..40]) + u64::from(proto) + l4_len as u64,
    }
}

fn ipv4_header_csum(ip: &mut [u8], ihl: usize) {
    ip[10] = 0;
    ip[11] = 0;
    let c = !wide_fold(wide_add(0, &ip[..ihl]));
    ip[10..12].copy_from_slice(&c.to_be_bytes());
}

/// Completes a partial checksum as the kernel requests with NEEDS_CSUM: the
/// field already holds the pseudo-header sum; sum from `csum_start` to the end.
fn complete_csum(pkt: &mut [u8], h: &VnetHdr) -> Result<(), OffloadError> {
    let start = usize::from(h.csum_start);
    let field = start + usize::from(h.csum_offset);
    if field + 2 > pkt.len() {
        return Err(OffloadError::Malformed);
    }
    let c = !wide_fold(wide_add(0, &pkt[start..]));
    pkt[field..field + 2].copy_from_slice(&c.to_be_bytes());
    Ok(())
}

/// Returns (IP header length, TCP header length) of a TCP packet.
fn tcp_headers(pkt: &[u8], v6: bool) -> Result<(usize, usize), OffloadError> {
    let iphl = if v6 {
        if pkt.len() < 40 || pkt[0] >> 4 != 6 || pkt[6] != 6 {
            return Err(OffloadError::Malformed);
        }
        40
    } else {
        if pkt.len() < 20 || pkt[0] >> 4 != 4 || pkt[9] != 6 {
            return Err(OffloadError::Malformed);
        }
        usize::from(pkt[0] & 0x0f) * 4
    };
    if iphl < 20 || pkt.len() < iphl + 20 {
        return Err(OffloadError::Malformed);
    }
    let tcphl = usize::from(pkt[iphl + 12] >> 4) * 4;
    if tcphl < 20 || pkt.len() < iphl + tcphl {
        return Err(OffloadError::Malformed);
    }
    Ok((iphl, tcphl))
}

/// Turns one packet read from an offloading TUN into ordinary packets, calling
/// `emit` for each: a TSO super-packet is cut into `gso_size` segments (built in
/// `scratch`, which must hold one segment), each with correct lengths, IDs,
/// sequence numbers, flags and checksums.
pub fn segment(
    h: &VnetHdr,
    pkt: &mut [u8],
    scratch: &mut [u8],
    mut emit: impl FnMut(&[u8]),
) -> Result<(), OffloadError> {
    let gso = h.gso_type & !GSO_ECN;
    if gso == GSO_NONE {
        if h.flags & F_NEEDS_CSUM != 0 {
            complete_csum(pkt, h)?;
        }
        emit(pkt);
        return Ok(());
    }
    let v6 = match gso {
        GSO_TCPV4 => false,
        GSO_TCPV6 => true,
        other => return Err(OffloadError::Unsupported(other)),
    };
    let (iphl, tcphl) = tcp_headers(pkt, v6)?;
    let hl = iphl + tcphl;
    let mss = usize::from(h.gso_size);
    // A read into a 64 KiB buffer can be one byte longer than any IPv4 length field.
    let longest = if v6 { 40 + 65_535 } else { 65_535 };
    if mss == 0 || scratch.len() < hl + mss || pkt.len() > longest {
        return Err(OffloadError::Malformed);
    }
    let payload_len = pkt.len() - hl;
    if payload_len <= mss {
        // Nothing to cut (the kernel may still mark it GSO): finish the checksum.
        fix_tcp(pkt, iphl, v6);
        emit(pkt);
        return Ok(());
    }
    let (hdr, payload) = pkt.split_at(hl);
    let seq0 = u32::from_be_bytes([hdr[iphl + 4], hdr[iphl + 5], hdr[iphl + 6], hdr[iphl + 7]]);
    let id0 = u16::from_be_bytes([hdr[4], hdr[5]]);
    let flags0 = hdr[iphl + 13];
    let n = payload_len.div_ceil(mss);
    for (i, chunk) in payload.chunks(mss).enumerate() {
        let len = hl + chunk.len();
        let s = &mut scratch[..len];
        s[..hl].copy_from_slice(hdr);
        s[hl..].copy_from_slice(chunk);
        let seq = seq0.wrapping_add((i * mss) as u32);
        s[iphl + 4..iphl + 8].copy_from_slice(&seq.to_be_bytes());
        let mut flags = flags0;
        if i + 1 < n {
            flags &= !(TCP_FIN | TCP_PSH);
        }
        if i > 0 {
            flags &= !TCP_CWR;
        }
        s[iphl + 13] = flags;
        if !v6 {
            s[4..6].copy_from_slice(&id0.wrapping_add(i as u16).to_be_bytes());
        }
        fix_tcp(s, iphl, v6);
        emit(s);
    }
    Ok(())
}

/// Sets the IP length fields and the IPv4/TCP checksums of a complete TCP packet.
fn fix_tcp(s: &mut [u8], iphl: usize, v6: bool) {
    let len = s.len();
    if v6 {
        s[4..6].copy_from_slice(&((len - 40) as u16).to_be_bytes());
    } else {
        s[2..4].copy_from_slice(&(len as u16).to_be_bytes());
        ipv4_header_csum(s, iphl);
    }
    s[iphl + 16] = 0;
    s[iphl + 17] = 0;
    let sum = pseudo_sum(s, 6, len - iphl);
    let c = !wide_fold(wide_add(sum, &s[iphl..]));
    s[iphl + 16..iphl + 18].copy_from_slice(&c.to_be_bytes());
}

/// Merges consecutive in-order TCP segments of one flow into a GSO super-packet
/// for a single TUN write (user-space GRO, as wireguard-go does): the kernel
/// then forwards and delivers one large packet instead of up to 45 small ones.
/// Only segments whose IP and TCP checksums verify are merged; the rest pass
/// through unchanged, so the kernel still sees and drops anything corrupt.
pub struct Coalescer {
    buf: Vec<u8>,
    /// Bytes of the pending packet (0: none).
    len: usize,
    iphl: usize,
    tcphl: usize,
    v6: bool,
    mss: usize,
    segs: usize,
    next_seq: u32,
    /// A short segment or PSH ends a super-packet, as in the kernel's GRO.
    closed: bool,
}

impl Default for Coalescer {
    fn default() -> Self {
        Self {
            buf: vec![0u8; 65_535],
            len: 0,
            iphl: 0,
            tcphl: 0,
            v6: false,
            mss: 0,
            segs: 0,
            next_seq: 0,
            closed: false,
        }
    }
}

const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const TCP_URG: u8 = 0x20;

/// (IP header length, TCP header length, v6) of a packet that may join a super-packet.
fn mergeable(pkt: &[u8]) -> Option<(usize, usize, bool)> {
    let v6 = match pkt.first()? >> 4 {
        4 => false,
        6 => true,
        _ => return None,
    };
    let (iphl, tcphl) = tcp_headers(pkt, v6).ok()?;
    if v6 {
        if usize::from(u16::from_be_bytes([pkt[4], pkt[5]])) + 40 != pkt.len() {
            return None;
        }
    } else {
        let frag = u16::from_be_bytes([pkt[6], pkt[7]]);
        if usize::from(u16::from_be_bytes([pkt[2], pkt[3]])) != pkt.len()
            || frag & 0x3fff != 0
            || wide_fold(wide_add(0, &pkt[..iphl])) != 0xffff
        {
            return None;
        }
    }
    let flags = pkt[iphl + 13];
    if flags & (TCP_SYN | TCP_FIN | TCP_RST | TCP_URG) != 0 || pkt.len() == iphl + tcphl {
        return None;
    }
    let sum = pseudo_sum(pkt, 6, pkt.len() - iphl);
    (wide_fold(wide_add(sum, &pkt[iphl..])) == 0xffff).then_some((iphl, tcphl, v6))
}

impl Coalescer {
    /// Adds a complete packet. `write` receives finished packets with their
    /// `virtio_net_hdr`; call `flush` when no more packets follow right now.
    pub fn push(&mut self, pkt: &[u8], write: &mut impl FnMut(&[u8; VNET_HDR_LEN], &[u8])) {
        // An IPv6 packet can be 40 bytes longer than the buffer; it cannot start a merge.
        let m = mergeable(pkt).filter(|_| pkt.len() <= self.buf.len());
        if let Some((iphl, tcphl, v6)) = m
            && self.can_append(pkt, iphl, tcphl, v6)
        {
            let payload = &pkt[iphl + tcphl..];
            self.buf[self.len..self.len + payload.len()].copy_from_slice(payload);
            self.len += payload.len();
            self.segs += 1;
            self.next_seq = self.next_seq.wrapping_add(payload.len() as u32);
            let psh = pkt[iphl + 13] & TCP_PSH;
            self.buf[iphl + 13] |= psh;
            self.closed = payload.len() < self.mss || psh != 0;
            return;
        }
        self.flush(write);
        match m {
            Some((iphl, tcphl, v6)) => {
                self.buf[..pkt.len()].copy_from_slice(pkt);
                self.len = pkt.len();
                (self.iphl, self.tcphl, self.v6) = (iphl, tcphl, v6);
                self.mss = pkt.len() - iphl - tcphl;
                self.segs = 1;
                let t = &pkt[iphl..];
                self.next_seq =
                    u32::from_be_bytes([t[4], t[5], t[6], t[7]]).wrapping_add(self.mss as u32);
                self.closed = t[13] & TCP_PSH != 0;
            }
            None => write(&[0; VNET_HDR_LEN], pkt),
        }
    }

    fn can_append(&self, pkt: &[u8], iphl: usize, tcphl: usize, v6: bool) -> bool {
        if self.len == 0 || self.closed || (iphl, tcphl, v6) != (self.iphl, self.tcphl, self.v6) {
            return false;
        }
        let payload = pkt.len() - iphl - tcphl;
        if payload > self.mss || self.len + payload > self.buf.len() {
            return false;
        }
        let cur = &self.buf[..iphl + tcphl];
        let same_ip = if v6 {
            cur[..4] == pkt[..4] && cur[6..40] == pkt[6..40]
        } else {
            // Everything but length, ID and checksum: TOS/ECN, DF, TTL, addresses, options.
            cur[..2] == pkt[..2] && cur[6..10] == pkt[6..10] && cur[12..iphl] == pkt[12..iphl]
        };
        let (ct, pt) = (&cur[iphl..], &pkt[iphl..]);
        same_ip
            && ct[..4] == pt[..4]
            && u32::from_be_bytes([pt[4], pt[5], pt[6], pt[7]]) == self.next_seq
            // ACK number, data offset, flags (PSH aside), window, options.
            && ct[8..13] == pt[8..13]
            && ct[13] & !TCP_PSH == pt[13] & !TCP_PSH
            && ct[14..16] == pt[14..16]
            && ct[20..tcphl] == pt[20..tcphl]
    }

    /// Writes out the pending packet, if any.
    pub fn flush(&mut self, write: &mut impl FnMut(&[u8; VNET_HDR_LEN], &[u8])) {
        if self.len == 0 {
            return;
        }
        let (len, iphl) = (self.len, self.iphl);
        self.len = 0;
        if self.segs == 1 {
            write(&[0; VNET_HDR_LEN], &self.buf[..len]);
            return;
        }
        let p = &mut self.buf[..len];
        if self.v6 {
            p[4..6].copy_from_slice(&((len - 40) as u16).to_be_bytes());
        } else {
            p[2..4].copy_from_slice(&(len as u16).to_be_bytes());
            ipv4_header_csum(p, iphl);
        }
        // NEEDS_CSUM contract: the field holds the folded pseudo-header sum.
        let ps = wide_fold(pseudo_sum(p, 6, len - iphl));
        p[iphl + 16..iphl + 18].copy_from_slice(&ps.to_be_bytes());
        let h = VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: if self.v6 { GSO_TCPV6 } else { GSO_TCPV4 },
            hdr_len: (iphl + self.tcphl) as u16,
            gso_size: self.mss as u16,
            csum_start: iphl as u16,
            csum_offset: 16,
        };
        write(&h.encode(), p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp_v4(payload: usize, flags: u8) -> Vec<u8> {
        let mut p = vec![0u8; 40 + payload];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&((40 + payload) as u16).to_be_bytes());
        p[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
        p[8] = 64;
        p[9] = 6;
        p[12..16].copy_from_slice(&[10, 10, 0, 2]);
        p[16..20].copy_from_slice(&[10, 20, 0, 2]);
        p[20..22].copy_from_slice(&5001u16.to_be_bytes());
        p[22..24].copy_from_slice(&80u16.to_be_bytes());
        p[24..28].copy_from_slice(&0xffff_fff0u32.to_be_bytes());
        p[32] = 5 << 4;
        p[33] = flags;
        for (i, b) in p[40..].iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
        p
    }

    fn verify_v4(s: &[u8]) {
        assert_eq!(wide_fold(wide_add(0, &s[..20])), 0xffff, "IP checksum");
        let sum = pseudo_sum(s, 6, s.len() - 20);
        assert_eq!(wide_fold(wide_add(sum, &s[20..])), 0xffff, "TCP checksum");
        assert_eq!(usize::from(u16::from_be_bytes([s[2], s[3]])), s.len());
    }

    #[test]
    fn tso_split_v4_lengths_seq_ids_flags_checksums() {
        let mut p = tcp_v4(3000, TCP_PSH | TCP_FIN | TCP_CWR | 0x10);
        let orig = p.clone();
        let h = VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_TCPV4,
            hdr_len: 40,
            gso_size: 1380,
            csum_start: 20,
            csum_offset: 16,
        };
        let mut scratch = vec![0u8; 1500];
        let mut segs = vec![];
        segment(&h, &mut p, &mut scratch, |s| segs.push(s.to_vec())).unwrap();
        assert_eq!(
            segs.iter().map(Vec::len).collect::<Vec<_>>(),
            [1420, 1420, 280]
        );
        let mut payload = vec![];
        for (i, s) in segs.iter().enumerate() {
            verify_v4(s);
            let seq = u32::from_be_bytes([s[24], s[25], s[26], s[27]]);
            assert_eq!(seq, 0xffff_fff0u32.wrapping_add(1380 * i as u32));
            assert_eq!(u16::from_be_bytes([s[4], s[5]]), 0x1234 + i as u16);
            let f = s[33];
            assert_eq!(f & (TCP_PSH | TCP_FIN) != 0, i == 2, "seg {i} flags {f:#x}");
            assert_eq!(f & TCP_CWR != 0, i == 0);
            assert_eq!(f & 0x10, 0x10, "ACK kept");
            payload.extend_from_slice(&s[40..]);
        }
        assert_eq!(payload, orig[40..]);
    }

    #[test]
    fn partial_checksum_completed() {
        let mut p = tcp_v4(100, 0x18);
        // What the kernel leaves with NEEDS_CSUM: the pseudo-header sum, not inverted.
        let ps = wide_fold(pseudo_sum(&p, 6, p.len() - 20));
        p[36..38].copy_from_slice(&ps.to_be_bytes());
        ipv4_header_csum(&mut p, 20);
        let h = VnetHdr {
            flags: F_NEEDS_CSUM,
            csum_start: 20,
            csum_offset: 16,
            ..Default::default()
        };
        let mut out = vec![];
        segment(&h, &mut p, &mut [], |s| out = s.to_vec()).unwrap();
        verify_v4(&out);
    }

    /// `len` bytes: an IPv6 header (fd.. -> fe..) and a 20-byte TCP header with ACK set.
    fn tcp_v6(len: usize) -> Vec<u8> {
        let mut p = vec![0u8; len];
        p[0] = 0x60;
        p[6] = 6;
        p[7] = 64;
        p[8..24].copy_from_slice(&[0xfd; 16]);
        p[24..40].copy_from_slice(&[0xfe; 16]);
        p[52] = 5 << 4;
        p[53] = 0x10;
        p
    }

    #[test]
    fn tso_split_v6() {
        let mut p = tcp_v6(60 + 2000);
        let h = VnetHdr {
            gso_type: GSO_TCPV6,
            gso_size: 1000,
            ..Default::default()
        };
        let mut scratch = vec![0u8; 1100];
        let mut n = 0;
        segment(&h, &mut p, &mut scratch, |s| {
            assert_eq!(usize::from(u16::from_be_bytes([s[4], s[5]])), s.len() - 40);
            let sum = pseudo_sum(s, 6, s.len() - 40);
            assert_eq!(wide_fold(wide_add(sum, &s[40..])), 0xffff);
            n += 1;
        })
        .unwrap();
        assert_eq!(n, 2);
    }

    #[test]
    fn garbage_rejected() {
        let h = VnetHdr {
            gso_type: GSO_TCPV4,
            gso_size: 100,
            ..Default::default()
        };
        let mut scratch = vec![0u8; 200];
        for len in [0usize, 1, 19, 20, 39] {
            let mut p = vec![0x45u8; len];
            assert!(segment(&h, &mut p, &mut scratch, |_| panic!("emitted")).is_err());
        }
        let udp = VnetHdr {
            gso_type: 3,
            gso_size: 100,
            ..Default::default()
        };
        let mut p = tcp_v4(500, 0);
        assert_eq!(
            segment(&udp, &mut p, &mut scratch, |_| {}),
            Err(OffloadError::Unsupported(3))
        );
        let bad_csum = VnetHdr {
            flags: F_NEEDS_CSUM,
            csum_start: 60,
            csum_offset: 16,
            ..Default::default()
        };
        let mut p = tcp_v4(10, 0);
        assert!(segment(&bad_csum, &mut p, &mut scratch, |_| {}).is_err());
    }

    fn with_csums(mut p: Vec<u8>) -> Vec<u8> {
        ipv4_header_csum(&mut p, 20);
        p[36] = 0;
        p[37] = 0;
        let sum = pseudo_sum(&p, 6, p.len() - 20);
        let c = !wide_fold(wide_add(sum, &p[20..]));
        p[36..38].copy_from_slice(&c.to_be_bytes());
        p
    }

    /// A super-packet cut by `segment` and merged again is the original stream.
    #[test]
    fn coalesce_round_trip_and_boundaries() {
        let orig = tcp_v4(5000, 0x10 | TCP_PSH);
        let mut p = orig.clone();
        let h = VnetHdr {
            gso_type: GSO_TCPV4,
            gso_size: 1000,
            ..Default::default()
        };
        let mut scratch = vec![0u8; 1100];
        let mut segs = vec![];
        segment(&h, &mut p, &mut scratch, |s| segs.push(s.to_vec())).unwrap();
        let mut co = Coalescer::default();
        let mut out: Vec<(VnetHdr, Vec<u8>)> = vec![];
        let mut w = |h: &[u8; VNET_HDR_LEN], p: &[u8]| out.push((VnetHdr::parse(h), p.to_vec()));
        for s in &segs {
            co.push(s, &mut w);
        }
        // An unrelated, corrupt segment of the same flow must not join.
        let mut bad = segs[0].clone();
        bad[45] ^= 1;
        co.push(&bad, &mut w);
        co.flush(&mut w);
        assert_eq!(
            out.len(),
            2,
            "{:?}",
            out.iter().map(|o| o.1.len()).collect::<Vec<_>>()
        );
        let (h0, p0) = &out[0];
        assert_eq!(h0.gso_type, GSO_TCPV4);
        assert_eq!(usize::from(h0.gso_size), 1000);
        assert_eq!(p0.len(), orig.len());
        assert_eq!(p0[40..], orig[40..]);
        assert_eq!(p0[33], 0x10 | TCP_PSH);
        assert_eq!(
            out[1].0,
            VnetHdr::default(),
            "corrupt packet passed through as is"
        );
        assert_eq!(out[1].1, bad);
        // Re-cutting the merged packet gives valid segments again.
        let mut merged = p0.clone();
        let mut n = 0;
        segment(&h0.clone(), &mut merged, &mut scratch, |s| {
            verify_v4(s);
            n += 1;
        })
        .unwrap();
        assert_eq!(n, 5);
    }

    #[test]
    fn coalesce_refuses_gaps_other_flows_and_flags() {
        let a = with_csums(tcp_v4(100, 0x10));
        let mut gap = tcp_v4(100, 0x10);
        gap[24..28].copy_from_slice(&0xffff_fff0u32.wrapping_add(200).to_be_bytes());
        let gap = with_csums(gap);
        let mut other = tcp_v4(100, 0x10);
        other[24..28].copy_from_slice(&0xffff_fff0u32.wrapping_add(100).to_be_bytes());
        other[20] ^= 1;
        let other = with_csums(other);
        let syn = with_csums(tcp_v4(100, TCP_SYN));
        // In sequence right after `a`, but its payload no longer matches its checksum.
        let mut corrupt = tcp_v4(100, 0x10);
        corrupt[24..28].copy_from_slice(&0xffff_fff0u32.wrapping_add(100).to_be_bytes());
        let mut corrupt = with_csums(corrupt);
        corrupt[70] ^= 0x40;
        let mut co = Coalescer::default();
        let mut n = 0;
        let mut w = |h: &[u8; VNET_HDR_LEN], _: &[u8]| {
            assert_eq!(h, &[0; VNET_HDR_LEN]);
            n += 1;
        };
        for p in [&a, &corrupt, &gap, &other, &syn] {
            co.push(p, &mut w);
        }
        co.flush(&mut w);
        assert_eq!(n, 5);
    }

    /// The longest IPv6 packet (payload length 65535) is 40 bytes longer than the
    /// coalescing buffer: it passes through instead of overflowing it.
    #[test]
    fn coalesce_passes_the_longest_ipv6_packet_through() {
        let mut p = tcp_v6(40 + 65_535);
        fix_tcp(&mut p, 40, true);
        assert!(mergeable(&p).is_some());
        let mut co = Coalescer::default();
        let mut out = vec![];
        let mut w = |h: &[u8; VNET_HDR_LEN], b: &[u8]| out.push((*h, b.len()));
        co.push(&p, &mut w);
        co.flush(&mut w);
        assert_eq!(out, [([0; VNET_HDR_LEN], p.len())]);
    }

    /// A packet longer than its IPv4 length field can say is refused, not emitted with a
    /// wrapped length.
    #[test]
    fn segment_refuses_an_ipv4_packet_beyond_65535_bytes() {
        let mut p = tcp_v4(65_536 - 40, 0x10);
        let h = VnetHdr {
            gso_type: GSO_TCPV4,
            gso_size: u16::MAX,
            ..Default::default()
        };
        let mut scratch = vec![0u8; 65_536 + 64];
        let r = segment(&h, &mut p, &mut scratch, |_| panic!("emitted"));
        assert_eq!(r, Err(OffloadError::Malformed));
        let mut p = tcp_v4(65_535 - 40, 0x10);
        let mut n = 0;
        segment(&h, &mut p, &mut scratch, |s| {
            verify_v4(s);
            n += 1;
        })
        .unwrap();
        assert_eq!(n, 1);
    }
}
