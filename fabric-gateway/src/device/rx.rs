//! UDP -> find peer -> decrypt -> TUN: datagrams from the socket (GRO batches cut into
//! datagrams) to the peers' devices (decrypted packets merged again where possible).

use std::{
    io,
    net::{IpAddr, SocketAddr},
    sync::{Arc, atomic::Ordering},
    time::Instant,
};

use boringtun::noise::{
    Packet, TunnResult, errors::WireGuardError, handshake::parse_handshake_anon,
};

use super::{
    Gateway, GlobalDrop, Identity,
    liveness::Heartbeat,
    peer::{Peer, PeerDrop},
};
use crate::{
    key::PublicKey,
    offload::{self, VNET_HDR_LEN},
    packet, roam, udp,
};

/// Largest datagram/packet we handle (a TSO super-packet or a GRO batch is at most 64 KiB).
pub(super) const BUF: usize = 65_536;
/// WireGuard data overhead plus room for handshake messages.
pub(super) const BUF_OUT: usize = BUF + 256;

/// Per-thread state of the UDP -> TUN direction.
pub(super) struct UdpBufs {
    buf: Vec<u8>,
    out: Vec<u8>,
    gro: TunGro,
    keys: ThreadKeys,
}

/// A packet thread's copy of the gateway's identity, in the form the handshake code takes.
struct ThreadKeys {
    generation: u64,
    id: Arc<Identity>,
    static_private: boringtun::x25519::StaticSecret,
    static_public: boringtun::x25519::PublicKey,
}

impl ThreadKeys {
    fn of(gw: &Gateway) -> Self {
        // The generation first: a rotation in between is then seen at the next receive.
        let generation = gw.identity_gen.load(Ordering::Acquire);
        let id = gw.identity();
        Self {
            generation,
            static_private: id.private_key.to_dalek(),
            static_public: id.public_key.to_dalek(),
            id,
        }
    }

    /// Picks up a rotated key: one atomic load per receive.
    fn refresh(&mut self, gw: &Gateway) {
        if gw.identity_gen.load(Ordering::Acquire) != self.generation {
            *self = Self::of(gw);
        }
    }
}

impl UdpBufs {
    pub(super) fn new(gw: &Gateway) -> Self {
        Self {
            buf: vec![0u8; BUF],
            out: vec![0u8; BUF_OUT],
            gro: TunGro::default(),
            keys: ThreadKeys::of(gw),
        }
    }
}

/// Decrypted packets on their way to a peer's TUN, merged where possible
/// (see `offload::Coalescer`). Holds packets of one peer at a time.
#[derive(Default)]
struct TunGro {
    co: offload::Coalescer,
    peer: Option<Arc<Peer>>,
}

fn tun_write(peer: &Peer, hdr: &[u8; VNET_HDR_LEN], pkt: &[u8]) {
    if let Err(e) = peer.tun.send_with_hdr(hdr, pkt) {
        peer.counters.drop(PeerDrop::TunWrite);
        tracing::trace!(peer = %peer.name, error = %e, "TUN write failed");
    }
}

impl TunGro {
    fn push(&mut self, peer: &Arc<Peer>, pkt: &[u8]) {
        if !peer.tun.vnet_hdr() {
            tun_write(peer, &[0; VNET_HDR_LEN], pkt);
            return;
        }
        if self.peer.as_ref().is_some_and(|p| !Arc::ptr_eq(p, peer)) {
            self.flush();
        }
        let p = self.peer.get_or_insert_with(|| peer.clone());
        self.co.push(pkt, &mut |h, b| tun_write(p, h, b));
    }

    fn flush(&mut self) {
        if let Some(p) = self.peer.take() {
            self.co.flush(&mut |h, b| tun_write(&p, h, b));
        }
    }
}

impl Gateway {
    /// The UDP reader thread (without busy polling).
    pub(super) fn udp_loop(&self, beat: &Heartbeat) {
        let mut bufs = UdpBufs::new(self);
        while !self.stop.load(Ordering::Relaxed) {
            beat.beat();
            self.udp_receive(&mut bufs);
        }
    }

    /// One receive from the UDP socket. With UDP GRO it may carry many datagrams
    /// of the same sender, cut at the reported segment size. Returns whether
    /// anything arrived.
    pub(super) fn udp_receive(&self, bufs: &mut UdpBufs) -> bool {
        let (n, from, seg) = match udp::recv_segments(&self.udp, &mut bufs.buf) {
            Ok(r) => r,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                return false;
            }
            Err(e) => {
                // ICMP port unreachable from a dead endpoint surfaces here; not fatal.
                tracing::trace!(error = %e, "udp recv error");
                return true;
            }
        };
        if n == 0 {
            self.drops[GlobalDrop::Invalid as usize].fetch_add(1, Ordering::Relaxed);
            return true;
        }
        bufs.keys.refresh(self);
        let UdpBufs {
            buf,
            out,
            gro,
            keys,
        } = bufs;
        // The datagrams of one batch come from one sender and nearly always go to one
        // session: its peer is looked up once, not under the table's lock per datagram.
        let mut last = None;
        for datagram in buf[..n].chunks(seg.max(1)) {
            self.handle_datagram(datagram, from, out, gro, keys, &mut last);
        }
        // Never hold packets past the batch they came in: no added latency.
        gro.flush();
        true
    }

    fn handle_datagram(
        &self,
        datagram: &[u8],
        from: SocketAddr,
        out: &mut [u8],
        gro: &mut TunGro,
        keys: &ThreadKeys,
        last: &mut Option<(u32, Arc<Peer>)>,
    ) {
        let kind;
        let peer = {
            let packet = match keys
                .id
                .rate_limiter
                .verify_packet(Some(from.ip()), datagram, out)
            {
                Ok(p) => p,
                Err(TunnResult::WriteToNetwork(cookie)) => {
                    self.cookies_sent.fetch_add(1, Ordering::Relaxed);
                    let _ = self.udp.send_to(cookie, from);
                    return;
                }
                Err(TunnResult::Err(WireGuardError::UnderLoad)) => {
                    self.drops[GlobalDrop::UnderLoad as usize].fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Err(_) => {
                    self.drops[GlobalDrop::Invalid as usize].fetch_add(1, Ordering::Relaxed);
                    return;
                }
            };
            kind = roam::Kind::of(&packet);
            if let Packet::PacketData(ref p) = packet
                && let Some((idx, peer)) = last.as_ref()
                && *idx == p.receiver_idx >> 8
            {
                self.handle_peer_datagram(peer, kind, datagram, from, out, gro);
                return;
            }
            let t = self.peers.read().unwrap();
            let found = match packet {
                Packet::HandshakeInit(ref p) => {
                    if !self.handshake_allowed(from) {
                        return;
                    }
                    match parse_handshake_anon(&keys.static_private, &keys.static_public, p) {
                        Ok(hh) => t
                            .by_key
                            .get(&PublicKey::from_bytes(hh.peer_static_public))
                            .cloned(),
                        Err(_) => None,
                    }
                }
                Packet::HandshakeResponse(ref p) => {
                    if !self.handshake_allowed(from) {
                        return;
                    }
                    t.by_index.get(&(p.receiver_idx >> 8)).cloned()
                }
                Packet::PacketCookieReply(ref p) => t.by_index.get(&(p.receiver_idx >> 8)).cloned(),
                Packet::PacketData(ref p) => {
                    let found = t.by_index.get(&(p.receiver_idx >> 8)).cloned();
                    if let Some(peer) = &found {
                        *last = Some((p.receiver_idx >> 8, peer.clone()));
                    }
                    found
                }
            };
            match found {
                Some(p) => p,
                None => {
                    self.drops[GlobalDrop::UnknownPeer as usize].fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
        };
        self.handle_peer_datagram(&peer, kind, datagram, from, out, gro);
    }

    /// Whether a handshake message from `from` (its MACs verified, its cookie too when the
    /// gateway is under load) may cost the receive thread a handshake: not when its source
    /// is over its share while under load. Called once per handshake message, never for data.
    fn handshake_allowed(&self, from: SocketAddr) -> bool {
        let ok = self
            .sources
            .lock()
            .unwrap()
            .allow(from.ip(), std::time::Instant::now());
        if !ok {
            self.drops[GlobalDrop::HandshakeFlood as usize].fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    fn handle_peer_datagram(
        &self,
        peer: &Arc<Peer>,
        kind: roam::Kind,
        datagram: &[u8],
        from: SocketAddr,
        out: &mut [u8],
        gro: &mut TunGro,
    ) {
        let mut tunn = peer.tunn.lock().unwrap();
        // The shared limiter has already verified and counted this datagram; the peer's own
        // never limits (see `new_tunn`), so the datagram is not limited twice.
        let res = tunn.decapsulate(None, datagram, out);
        let authenticated = roam::proves_peer(kind, &res);
        match res {
            TunnResult::Err(e) => {
                drop(tunn);
                peer.counters.drop(PeerDrop::Decrypt);
                tracing::trace!(peer = %peer.name, error = ?e, "decapsulate failed");
                return;
            }
            TunnResult::Done => {}
            TunnResult::WriteToNetwork(pkt) => {
                // Handshake response or cookie for the sender, then flush packets
                // that were queued while the session was being established.
                let _ = self.udp.send_to(pkt, from).map(|n| {
                    peer.counters
                        .tx_bytes
                        .fetch_add(n as u64, Ordering::Relaxed)
                });
                while let TunnResult::WriteToNetwork(pkt) = tunn.decapsulate(None, &[], out) {
                    peer.counters.tx_packets.fetch_add(1, Ordering::Relaxed);
                    let _ = self.udp.send_to(pkt, from).map(|n| {
                        peer.counters
                            .tx_bytes
                            .fetch_add(n as u64, Ordering::Relaxed)
                    });
                }
            }
            TunnResult::WriteToTunnelV4(pkt, src) => {
                drop(tunn);
                self.deliver(peer, pkt, IpAddr::V4(src), gro);
            }
            TunnResult::WriteToTunnelV6(pkt, src) => {
                drop(tunn);
                self.deliver(peer, pkt, IpAddr::V6(src), gro);
            }
        }
        if authenticated {
            peer.counters
                .rx_bytes
                .fetch_add(datagram.len() as u64, Ordering::Relaxed);
            // Roaming: only authenticated datagrams may move the endpoint.
            let cur = *peer.endpoint.read().unwrap();
            if cur != Some(from) {
                tracing::info!(peer = %peer.name, old = ?cur, new = %from, "peer endpoint changed");
                *peer.endpoint.write().unwrap() = Some(from);
                self.remember_endpoints();
            }
        }
    }

    fn deliver(&self, peer: &Arc<Peer>, pkt: &[u8], src: IpAddr, gro: &mut TunGro) {
        if packet::src_addr(pkt).is_none() {
            peer.counters.drop(PeerDrop::Malformed);
            return;
        }
        if !peer.allowed.read().unwrap().contains(src) {
            peer.counters.drop(PeerDrop::NotAllowedSource);
            tracing::trace!(peer = %peer.name, %src, "source outside allowed IPs");
            return;
        }
        // Only an ICMP packet can be a probe's reply: others skip the probe's lock.
        if packet::may_be_probe_reply_v4(pkt) {
            let mut probe = peer.probe.lock().unwrap();
            if let Some(pr) = probe.as_mut()
                && let Some(seq) = packet::parse_probe_reply_v4(pkt, pr.src, pr.dst)
            {
                pr.timers.on_reply(seq, Instant::now());
                return;
            }
        }
        if !peer.dataplane_ready.load(Ordering::Acquire) {
            peer.counters.drop(PeerDrop::DataplaneNotReady);
            return;
        }
        peer.counters.rx_packets.fetch_add(1, Ordering::Relaxed);
        gro.push(peer, pkt);
    }
}
