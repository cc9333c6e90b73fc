//! TUN -> (segment) -> encrypt -> UDP: a peer's outgoing packets, sent in batches.

use std::{net::SocketAddr, sync::atomic::Ordering};

use boringtun::noise::TunnResult;

use super::{
    Gateway, POLL_TIMEOUT,
    peer::{Peer, PeerDrop},
    rx::BUF,
};
use crate::{
    offload::{self, VNET_HDR_LEN, VnetHdr},
    packet, udp,
};

/// Encrypted segments of one super-packet: 64 KiB of payload plus per-segment
/// headers and WireGuard overhead, which stays below this down to an MSS of 88.
const SEG_OUT: usize = 256 * 1024;

/// Per-thread buffers of the TUN -> UDP direction, allocated once.
pub(super) struct TunBufs {
    pub(super) src: Vec<u8>,
    scratch: Vec<u8>,
    dst: Vec<u8>,
    lens: Vec<usize>,
    pad: Vec<u8>,
}

impl TunBufs {
    pub(super) fn new() -> Self {
        Self {
            src: vec![0u8; VNET_HDR_LEN + BUF],
            scratch: vec![0u8; BUF],
            dst: vec![0u8; SEG_OUT],
            lens: Vec::with_capacity(1024),
            pad: vec![0u8; packet::PAD_BUF],
        }
    }
}

impl Gateway {
    pub(super) fn send_to_peer(&self, peer: &Peer, pkt: &[u8]) {
        let ep = *peer.endpoint.read().unwrap();
        match ep {
            Some(ep) => self.send_to(peer, pkt, ep),
            None => peer.counters.drop(PeerDrop::NoEndpoint),
        }
    }

    fn send_to(&self, peer: &Peer, pkt: &[u8], ep: SocketAddr) {
        match self.udp.send_to(pkt, ep) {
            Ok(n) => {
                peer.counters
                    .tx_bytes
                    .fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e) => {
                peer.counters.drop(PeerDrop::UdpSend);
                tracing::trace!(peer = %peer.name, error = %e, "udp send failed");
            }
        }
    }

    /// Sends encrypted datagrams laid out back to back in `buf` (`lens` gives their
    /// sizes), grouping runs of equal size into UDP_SEGMENT sends.
    fn send_batch(&self, peer: &Peer, buf: &[u8], lens: &[usize], ep: SocketAddr) {
        let gso = self.udp_gso.load(Ordering::Relaxed);
        let (mut i, mut off) = (0, 0);
        while i < lens.len() {
            let seg = lens[i];
            let (mut j, mut total) = (i + 1, seg);
            // A run: equal sizes, optionally ending with one shorter datagram.
            while gso
                && j < lens.len()
                && j - i < udp::MAX_SEGMENTS
                && lens[j] <= seg
                && lens[j - 1] == seg
                && total + lens[j] <= udp::MAX_GSO_BYTES
            {
                total += lens[j];
                j += 1;
            }
            let run = &buf[off..off + total];
            match udp::send_segments(&self.udp, run, seg, ep) {
                Ok(n) => {
                    peer.counters
                        .tx_bytes
                        .fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(e)
                    if j - i > 1
                        && matches!(
                            e.raw_os_error(),
                            Some(libc::EIO | libc::EINVAL | libc::ENOPROTOOPT)
                        ) =>
                {
                    tracing::warn!(error = %e, "UDP segmentation offload refused; sending datagrams one by one");
                    self.udp_gso.store(false, Ordering::Relaxed);
                    let mut o = off;
                    for &l in &lens[i..j] {
                        self.send_to(peer, &buf[o..o + l], ep);
                        o += l;
                    }
                }
                Err(e) => {
                    for _ in i..j {
                        peer.counters.drop(PeerDrop::UdpSend);
                    }
                    tracing::trace!(peer = %peer.name, error = %e, "udp send failed");
                }
            }
            off += total;
            i = j;
        }
    }

    /// The reader thread of one peer's device (without busy polling).
    pub(super) fn tun_loop(&self, peer: &Peer) {
        let mut bufs = TunBufs::new();
        while !peer.stop.load(Ordering::Relaxed) && !self.stop.load(Ordering::Relaxed) {
            peer.beat.beat();
            match peer.tun.recv_timeout(&mut bufs.src, POLL_TIMEOUT) {
                Ok(Some(n)) => self.tun_packet(peer, n, &mut bufs),
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(peer = %peer.name, error = %e, "TUN read failed; stopping reader");
                    return;
                }
            }
        }
    }

    /// One read from a peer's TUN (`n` bytes in `bufs.src`). It may be a 64 KiB TSO
    /// super-packet; its segments are encrypted under one lock and leave in a few
    /// UDP_SEGMENT sends.
    pub(super) fn tun_packet(&self, peer: &Peer, n: usize, bufs: &mut TunBufs) {
        let TunBufs {
            src,
            scratch,
            dst,
            lens,
            pad,
        } = bufs;
        let mtu = usize::from(self.iface.mtu);
        let Some(ep) = *peer.endpoint.read().unwrap() else {
            // A server-side peer that never contacted us: nowhere to send, and
            // queueing inside Tunn would only deliver stale packets later.
            peer.counters.drop(PeerDrop::NoEndpoint);
            return;
        };
        let (hdr, pkt) = if peer.tun.vnet_hdr() {
            if n < VNET_HDR_LEN {
                peer.counters.drop(PeerDrop::Malformed);
                return;
            }
            let (h, p) = src[..n].split_at_mut(VNET_HDR_LEN);
            (
                VnetHdr::parse((&*h).try_into().expect("split at VNET_HDR_LEN")),
                p,
            )
        } else {
            (VnetHdr::default(), &mut src[..n])
        };
        lens.clear();
        let mut used = 0;
        let mut inner = 0u64;
        let res = {
            let mut tunn = peer.tunn.lock().unwrap();
            offload::segment(&hdr, pkt, scratch, |p| {
                let room = &mut dst[used..];
                if room.len() < p.len() + 64 {
                    peer.counters.drop(PeerDrop::Malformed);
                    return;
                }
                match tunn.encapsulate(packet::pad_transport(p, mtu, pad), room) {
                    TunnResult::WriteToNetwork(out) => {
                        used += out.len();
                        lens.push(out.len());
                        inner += 1;
                    }
                    TunnResult::Done => {}
                    TunnResult::Err(e) => {
                        tracing::debug!(peer = %peer.name, error = ?e, "encapsulate failed")
                    }
                    TunnResult::WriteToTunnelV4(..) | TunnResult::WriteToTunnelV6(..) => {}
                }
            })
        };
        if let Err(e) = res {
            peer.counters.drop(PeerDrop::Malformed);
            tracing::debug!(peer = %peer.name, error = ?e, "unusable packet from TUN");
        }
        peer.counters.tx_packets.fetch_add(inner, Ordering::Relaxed);
        self.send_batch(peer, &dst[..used], lens, ep);
    }
}
