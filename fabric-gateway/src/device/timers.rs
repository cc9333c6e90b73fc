//! The timer thread: every tick, boringtun's timers and the fabric's timer policy
//! (`crate::timers`) for each peer, and the rate limiter's reset.

use std::{
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use boringtun::noise::{TunnResult, errors::WireGuardError};

use super::{Gateway, peer::Peer, rx::BUF_OUT};
use crate::{
    packet,
    timers::{self, PeerView, TunnTimers},
};

impl Gateway {
    pub(super) fn timer_loop(&self, beat: &super::liveness::Heartbeat) {
        let mut out = vec![0u8; BUF_OUT];
        let mut probe_buf = [0u8; packet::PROBE_LEN];
        let mut last_reset = Instant::now();
        let interval = Duration::from_secs(self.iface.probe_interval);
        while !self.stop.load(Ordering::Relaxed) {
            beat.beat();
            std::thread::sleep(timers::TICK);
            let now = Instant::now();
            if now.duration_since(last_reset) >= Duration::from_secs(1) {
                // The shared limiter is not reset by the Tunns (they were given it), so do it here.
                self.identity().rate_limiter.reset_count();
                // Sources that went quiet hold nothing worth keeping.
                self.sources.lock().unwrap().forget_idle(now);
                last_reset = now;
            }
            for peer in self.peers() {
                self.peer_tick(&peer, now, interval, &mut out, &mut probe_buf);
            }
        }
    }

    fn peer_tick(
        &self,
        peer: &Peer,
        now: Instant,
        interval: Duration,
        out: &mut [u8],
        probe_buf: &mut [u8; packet::PROBE_LEN],
    ) {
        let mut tunn = peer.tunn.lock().unwrap();
        let res = tunn.update_timers(out);
        let session = tunn.stats().0.is_some();
        drop(tunn);
        let view = PeerView {
            tunn: match res {
                TunnResult::WriteToNetwork(_) => TunnTimers::Packet,
                TunnResult::Err(WireGuardError::ConnectionExpired) => TunnTimers::Expired,
                _ => TunnTimers::Quiet,
            },
            session,
            endpoint: peer.endpoint.read().unwrap().is_some(),
        };
        let (act, probe_len) = {
            let mut probe = peer.probe.lock().unwrap();
            let act = timers::on_tick(now, interval, view, probe.as_mut().map(|p| &mut p.timers));
            let len = match (act.probe, probe.as_ref()) {
                (Some(seq), Some(pr)) => packet::build_probe_v4(probe_buf, pr.src, pr.dst, seq),
                _ => 0,
            };
            (act, len)
        };
        if let (true, TunnResult::WriteToNetwork(pkt)) = (act.send_timer_packet, res) {
            self.send_to_peer(peer, pkt);
        }
        if act.redial_expired {
            self.send_initiation(peer, out);
        }
        if let Some(why) = act.force_handshake {
            tracing::debug!(peer = %peer.name, ?why, "forcing a new handshake");
            self.send_initiation(peer, out);
        }
        if probe_len > 0 {
            let mut pad = [0u8; packet::PROBE_LEN.next_multiple_of(16)];
            let probe = packet::pad_transport(
                &probe_buf[..probe_len],
                usize::from(self.iface.mtu),
                &mut pad,
            );
            let res = peer.tunn.lock().unwrap().encapsulate(probe, out);
            if let TunnResult::WriteToNetwork(pkt) = res {
                self.send_to_peer(peer, pkt);
            }
        }
    }

    /// A handshake initiation even if one is in flight (boringtun would wait for its timeout).
    fn send_initiation(&self, peer: &Peer, out: &mut [u8]) {
        let res = peer
            .tunn
            .lock()
            .unwrap()
            .format_handshake_initiation(out, true);
        if let TunnResult::WriteToNetwork(pkt) = res {
            self.send_to_peer(peer, pkt);
        }
    }
}
