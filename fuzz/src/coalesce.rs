//! `offload::Coalescer`: decrypted packets from a peer, merged into TSO super-packets for the
//! TUN device (user-space GRO).
//!
//! Input: a list of records, each starting with an op byte (low two bits):
//! - 0: a packet as given (2-byte big-endian length, then the bytes);
//! - 3: the same, with lengths and checksums made valid;
//! - 1: the next segment of the previous packet (2-byte payload length, then payload bytes,
//!   repeated to that length): same headers, sequence number right after the previous
//!   payload, lengths and checksums valid. With op bit 0x04 a byte follows that is XORed into
//!   the TCP flags first; with bit 0x08 the checksums are left stale;
//! - 2: flush (the gateway flushes when a batch of reads ends).
//!
//! Checked: every packet pushed comes out exactly once, in order: either unchanged, or as part
//! of a super-packet whose `virtio_net_hdr` is consistent, whose partial checksum completes
//! to a valid one, and which the kernel's segmentation (the gateway's `segment`, itself
//! checked by the `segment` target) cuts back into the very segments that went in (payload,
//! sequence numbers, headers), each of which was valid.

use fabric_gateway::offload::{Coalescer, VNET_HDR_LEN, VnetHdr, segment};

use crate::tcpip::{complete_partial, make_valid, tcp_shape, valid_tcp};

/// Longest packet an IPv6 header can describe (payload length 65535).
const MAX_PACKET: usize = 65_535 + 40;
const MAX_RECORDS: usize = 256;
const TCP_CWR: u8 = 0x80;

enum Op {
    Push(Vec<u8>),
    Flush,
}

fn take<'a>(data: &mut &'a [u8], n: usize) -> &'a [u8] {
    let (a, b) = data.split_at(n.min(data.len()));
    *data = b;
    a
}

fn take_len(data: &mut &[u8]) -> usize {
    match take(data, 2) {
        [a, b] => usize::from(u16::from_be_bytes([*a, *b])),
        _ => 0,
    }
}

/// The segment after `prev` in its flow, or None when `prev` is not TCP-shaped.
fn next_segment(prev: &[u8], payload: &[u8], len: usize) -> Option<Vec<u8>> {
    let (iphl, thl, _) = tcp_shape(prev)?;
    let hl = iphl + thl;
    let seq = u32::from_be_bytes(prev[iphl + 4..iphl + 8].try_into().unwrap())
        .wrapping_add((prev.len() - hl) as u32);
    let mut p = prev[..hl].to_vec();
    p[iphl + 4..iphl + 8].copy_from_slice(&seq.to_be_bytes());
    p.extend(
        payload
            .iter()
            .copied()
            .cycle()
            .take(len.min(MAX_PACKET - hl)),
    );
    Some(p)
}

fn ops(mut data: &[u8]) -> Vec<Op> {
    let mut ops = Vec::new();
    let mut prev: Option<Vec<u8>> = None;
    while let Some((&op, rest)) = data.split_first() {
        if ops.len() == MAX_RECORDS {
            break;
        }
        data = rest;
        let pkt = match op & 3 {
            2 => {
                ops.push(Op::Flush);
                continue;
            }
            1 => {
                let len = take_len(&mut data);
                let flip = if op & 0x04 != 0 {
                    take(&mut data, 1).first().copied()
                } else {
                    None
                };
                let payload = take(&mut data, len).to_vec();
                let Some(mut p) = prev
                    .as_deref()
                    .and_then(|prev| next_segment(prev, &payload, len))
                else {
                    continue;
                };
                if let (Some(f), Some((iphl, _, _))) = (flip, tcp_shape(&p)) {
                    p[iphl + 13] ^= f;
                }
                if op & 0x08 == 0 {
                    make_valid(&mut p);
                }
                p
            }
            kind => {
                let len = take_len(&mut data);
                let mut p = take(&mut data, len).to_vec();
                if kind == 3 {
                    make_valid(&mut p);
                }
                p
            }
        };
        prev = Some(pkt.clone());
        ops.push(Op::Push(pkt));
    }
    ops
}

pub fn check(data: &[u8]) {
    let mut co = Coalescer::default();
    let mut out: Vec<([u8; VNET_HDR_LEN], Vec<u8>)> = Vec::new();
    let mut write = |h: &[u8; VNET_HDR_LEN], p: &[u8]| out.push((*h, p.to_vec()));
    let mut pushed: Vec<Vec<u8>> = Vec::new();
    for op in ops(data) {
        match op {
            Op::Push(p) => {
                co.push(&p, &mut write);
                pushed.push(p);
            }
            Op::Flush => co.flush(&mut write),
        }
    }
    co.flush(&mut write);
    let mut next = 0;
    for (i, (h, p)) in out.iter().enumerate() {
        if h == &[0; VNET_HDR_LEN] {
            assert!(next < pushed.len(), "output {i}: more packets out than in");
            assert_eq!(
                p, &pushed[next],
                "output {i}: a packet passed through changed"
            );
            next += 1;
        } else {
            next += check_merged(i, &VnetHdr::parse(h), p, &pushed[next..]);
        }
    }
    assert_eq!(
        next,
        pushed.len(),
        "{} packets pushed, {next} came out",
        pushed.len()
    );
}

/// Checks super-packet `p` (output `i`) against the packets pushed from `ins` on; returns
/// how many of them it holds.
fn check_merged(i: usize, h: &VnetHdr, p: &[u8], ins: &[Vec<u8>]) -> usize {
    let (iphl, thl, v6) = tcp_shape(p).unwrap_or_else(|| panic!("output {i}: not TCP"));
    let expect = VnetHdr {
        flags: 1,
        gso_type: if v6 { 4 } else { 1 },
        hdr_len: (iphl + thl) as u16,
        gso_size: h.gso_size,
        csum_start: iphl as u16,
        csum_offset: 16,
    };
    assert_eq!(h, &expect, "output {i}: virtio_net_hdr");
    let mut full = p.to_vec();
    complete_partial(&mut full, iphl, 16);
    assert!(
        valid_tcp(&full).is_some(),
        "output {i}: the completed super-packet is invalid"
    );

    let mut cut = p.to_vec();
    let mut scratch = vec![0u8; 65_536];
    let mut segs: Vec<Vec<u8>> = Vec::new();
    segment(h, &mut cut, &mut scratch, |s| segs.push(s.to_vec()))
        .unwrap_or_else(|e| panic!("output {i}: cannot be segmented again: {e:?}"));
    assert!(segs.len() >= 2, "output {i}: a super-packet of one segment");
    assert!(
        segs.len() <= ins.len(),
        "output {i}: more segments than packets pushed"
    );
    for (k, (s, input)) in segs.iter().zip(ins).enumerate() {
        let a =
            valid_tcp(input).unwrap_or_else(|| panic!("output {i}: merged packet {k} was invalid"));
        let b = valid_tcp(s).unwrap_or_else(|| panic!("output {i}: segment {k} invalid"));
        if k == 0 {
            assert_eq!(
                a.payload.len(),
                usize::from(h.gso_size),
                "output {i}: gso_size"
            );
        }
        assert_eq!(a.payload, b.payload, "output {i}: payload of segment {k}");
        assert_eq!(a.seq(), b.seq(), "output {i}: seq of segment {k}");
        // Merged segments agree on every flag but PSH, which only the last may carry. The
        // kernel's segmentation keeps CWR on the first segment only.
        let cwr = if k > 0 { TCP_CWR } else { 0 };
        assert_eq!(
            a.flags() & !cwr,
            b.flags() & !cwr,
            "output {i}: flags of segment {k}"
        );
        let (x, y) = (a.ip, b.ip);
        if v6 {
            assert!(
                x[..4] == y[..4] && x[6..] == y[6..],
                "output {i}: IPv6 header {k}"
            );
        } else {
            // The IPv4 ID of a merged segment is not kept (GRO does not keep it either).
            assert!(
                x[..2] == y[..2] && x[6..10] == y[6..10] && x[12..] == y[12..],
                "output {i}: IPv4 header {k}"
            );
        }
        assert!(
            a.tcp[..13] == b.tcp[..13] && a.tcp[14..16] == b.tcp[14..16],
            "output {i}: TCP ports, seq, ack, offset or window of segment {k}"
        );
        assert_eq!(a.tcp[18..], b.tcp[18..], "output {i}: TCP options {k}");
    }
    segs.len()
}
