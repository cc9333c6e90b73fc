//! The status snapshot of the running gateway (for `fabric-gateway status`, `/status`,
//! `/metrics`).

use std::{
    collections::BTreeMap,
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use super::{GLOBAL_DROP_NAMES, Gateway, peer::PEER_DROP_NAMES};
use crate::status::{DataplaneCounters, PeerStatus, Problem, Status};

/// Without a probe, a session younger than WireGuard's REJECT_AFTER_TIME is the best
/// evidence that a peer is up.
const REJECT_AFTER_TIME: Duration = Duration::from_secs(180);

impl Gateway {
    pub fn status(&self) -> Status {
        let now = Instant::now();
        let interval = Duration::from_secs(self.iface.probe_interval);
        // The remap programs' counters, when this gateway runs the data plane.
        let maps = fabric_dataplane::Maps::open_pinned(&self.iface.pin_dir()).ok();
        let peers = self
            .peers()
            .iter()
            .map(|p| {
                let (hs, ..) = p.tunn.lock().unwrap().stats();
                let probe = p.probe.lock().unwrap();
                let probe = probe.as_ref().map(|pr| pr.timers.state());
                let up = match probe {
                    Some(pr) => pr.is_up(now, interval),
                    None => hs.is_some_and(|d| d < REJECT_AFTER_TIME),
                };
                let c = &p.counters;
                PeerStatus {
                    name: p.name.clone(),
                    public_key: p.public_key.to_base64(),
                    device: p.tun.name().to_string(),
                    ifindex: p.tun.ifindex(),
                    endpoint: p.endpoint.read().unwrap().map(|e| e.to_string()),
                    allowed_ips: p
                        .allowed
                        .read()
                        .unwrap()
                        .nets()
                        .iter()
                        .map(|n| n.to_string())
                        .collect(),
                    up,
                    probe_enabled: probe.is_some(),
                    probe_rtt_seconds: probe.and_then(|p| p.last_rtt()).map(|d| d.as_secs_f64()),
                    probe_sent: probe.map_or(0, |p| p.sent()),
                    probe_received: probe.map_or(0, |p| p.received()),
                    probe_lost: probe.map_or(0, |p| p.lost(now, interval * 3)),
                    latest_handshake_age_seconds: hs.map(|d| d.as_secs_f64()),
                    rx_bytes: c.rx_bytes.load(Ordering::Relaxed),
                    tx_bytes: c.tx_bytes.load(Ordering::Relaxed),
                    rx_packets: c.rx_packets.load(Ordering::Relaxed),
                    tx_packets: c.tx_packets.load(Ordering::Relaxed),
                    drops: PEER_DROP_NAMES
                        .iter()
                        .zip(&c.drops)
                        .map(|(n, v)| (n.to_string(), v.load(Ordering::Relaxed)))
                        .collect(),
                    dataplane: maps.as_ref().and_then(|m| {
                        let id = p.cfg.lock().unwrap().id?;
                        let (eg, ing) = m.peer_counters(id).ok()?;
                        Some(DataplaneCounters::from_counters(&eg, &ing))
                    }),
                }
            })
            .collect();
        Status {
            name: self.iface.name.clone(),
            public_key: self.public_key().to_base64(),
            listen_port: self.listen_port(),
            uptime_seconds: self.started.elapsed().as_secs_f64(),
            drops: GLOBAL_DROP_NAMES
                .iter()
                .zip(&self.drops)
                .map(|(n, v)| (n.to_string(), v.load(Ordering::Relaxed)))
                .collect::<BTreeMap<_, _>>(),
            cookie_replies_sent: self.cookies_sent.load(Ordering::Relaxed),
            repairs: self.repairs.load(Ordering::Relaxed),
            peers,
            problems: self.problems(),
        }
    }

    /// What keeps this gateway from serving: packet threads that ended while it runs (a
    /// panicking one ends the process instead, see `daemon::fail_fast_on_panic`).
    fn problems(&self) -> Vec<Problem> {
        if self.stop.load(Ordering::Relaxed) {
            return Vec::new();
        }
        let now = std::time::Instant::now();
        let check = |h: &std::thread::JoinHandle<()>, beat: &super::liveness::Heartbeat| {
            let thread = h.thread().name().unwrap_or("unnamed").to_owned();
            if h.is_finished() {
                return Some(Problem::ThreadStopped { thread });
            }
            beat.stuck_for(now).map(|d| Problem::ThreadStuck {
                thread,
                seconds: d.as_secs(),
            })
        };
        let mut out: Vec<Problem> = self
            .threads
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(h, beat)| check(h, beat))
            .collect();
        for p in self.peers() {
            if p.stop.load(Ordering::Relaxed) {
                continue;
            }
            if let Some(h) = p.reader.lock().unwrap().as_ref() {
                out.extend(check(h, &p.beat));
            }
        }
        out
    }
}
