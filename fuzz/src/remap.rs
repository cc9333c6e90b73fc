//! The remap arithmetic of `fabric-common` that the eBPF programs run on every packet: the
//! inline prefix remaps (`FastRemap`), the LPM tries' `Rewrite`, and the incremental checksum
//! updates that go with a rewritten address.
//!
//! Input: a local and a remote IPv4 prefix (4 bytes each, then a length byte), a packet's
//! source and destination (4 bytes each), its TCP ports (4 bytes) and payload. Checked, as the
//! data plane builds its entries: a remap rewrites exactly the addresses inside its prefix,
//! keeps the host bits, and ingress undoes egress; `Rewrite` agrees with it; after the
//! programs' incremental update of the IPv4 and TCP checksums (egress rewrites the
//! destination, ingress the source) the packet still verifies (etherparse builds it, the
//! checks sum it independently).

use etherparse::PacketBuilder;
use fabric_common::{FastRemap, Rewrite, csum, prefix_mask};

use crate::tcpip::valid_tcp;

fn addr(b: &[u8]) -> [u8; 4] {
    b.try_into().unwrap()
}

pub fn check(data: &[u8]) {
    let Some((head, rest)) = data.split_first_chunk::<21>() else {
        return;
    };
    let len = head[8] % 33;
    let mask = prefix_mask(len);
    let local = u32::from_be_bytes(addr(&head[0..4])) & mask;
    let remote = u32::from_be_bytes(addr(&head[4..8])) & mask;
    // As fabric-dataplane's state.rs writes it into the interface entry.
    let fast = FastRemap {
        local: local.to_be(),
        remote: remote.to_be(),
        mask: mask.to_be(),
    };
    let (src, dst) = (addr(&head[9..13]), addr(&head[13..17]));
    // Addresses as the program loads them from the packet.
    let (src_ne, dst_ne) = (u32::from_ne_bytes(src), u32::from_ne_bytes(dst));

    let out = fast.egress(dst_ne);
    assert_eq!(out.is_some(), u32::from_be_bytes(dst) & mask == local);
    if let Some(n) = out {
        let host = u32::from_be(n);
        assert_eq!(host & mask, remote, "egress left the remote prefix");
        assert_eq!(
            host & !mask,
            u32::from_be_bytes(dst) & !mask,
            "host bits changed"
        );
        assert_eq!(
            fast.ingress(n),
            Some(dst_ne),
            "ingress does not undo egress"
        );
        assert_eq!(Rewrite::new(remote, len).apply(dst_ne), n);
    }
    let inb = fast.ingress(src_ne);
    assert_eq!(inb.is_some(), u32::from_be_bytes(src) & mask == remote);
    if let Some(n) = inb {
        assert_eq!(fast.egress(n), Some(src_ne), "egress does not undo ingress");
        assert_eq!(Rewrite::new(local, len).apply(src_ne), n);
    }
    assert_eq!(Rewrite::new(remote, len).prefix_len(), u32::from(len));

    // Both directions on one packet, checksums updated as the programs do.
    let (ports, payload) = rest.split_at(rest.len().min(4));
    let port = |i: usize| {
        ports
            .get(i..i + 2)
            .map_or(0, |p| u16::from_be_bytes([p[0], p[1]]))
    };
    let mut pkt = Vec::new();
    let built = PacketBuilder::ipv4(src, dst, 64)
        .tcp(port(0), port(2), 1, 1000)
        .write(&mut pkt, payload);
    if built.is_err() {
        // A payload longer than an IPv4 packet can carry.
        return;
    }
    for egress in [true, false] {
        let (old_src, old_dst) = (
            u32::from_ne_bytes(addr(&pkt[12..16])),
            u32::from_ne_bytes(addr(&pkt[16..20])),
        );
        let (new_src, new_dst) = if egress {
            (old_src, fast.egress(old_dst).unwrap_or(old_dst))
        } else {
            (fast.ingress(old_src).unwrap_or(old_src), old_dst)
        };
        let diff = csum::add(
            csum::diff32(old_src, new_src),
            csum::diff32(old_dst, new_dst),
        );
        pkt[12..16].copy_from_slice(&new_src.to_ne_bytes());
        pkt[16..20].copy_from_slice(&new_dst.to_ne_bytes());
        let ip_check = u16::from_ne_bytes([pkt[10], pkt[11]]);
        pkt[10..12].copy_from_slice(&csum::replace_by_diff(ip_check, diff).to_ne_bytes());
        let tcp_check = u16::from_ne_bytes([pkt[36], pkt[37]]);
        pkt[36..38].copy_from_slice(&csum::replace_by_diff(tcp_check, diff).to_ne_bytes());
        assert!(
            valid_tcp(&pkt).is_some(),
            "checksums wrong after the {} rewrite",
            if egress { "egress" } else { "ingress" }
        );
    }
}
