//! Health probe bookkeeping (pure logic; the gateway does the I/O).
//!
//! A peer is Up only while probe replies keep coming back through the tunnel:
//! a healthy UDP socket or a fresh handshake alone does not prove that data
//! packets pass (MTU black holes, wrong allowed-ips, routing on the far side).

use std::time::{Duration, Instant};

const WINDOW: usize = 16;

#[derive(Debug, Clone)]
pub struct ProbeState {
    next_seq: u16,
    outstanding: [Option<(u16, Instant)>; WINDOW],
    last_reply: Option<Instant>,
    last_rtt: Option<Duration>,
    sent: u64,
    received: u64,
}

impl Default for ProbeState {
    fn default() -> Self {
        Self {
            next_seq: 1,
            outstanding: [None; WINDOW],
            last_reply: None,
            last_rtt: None,
            sent: 0,
            received: 0,
        }
    }
}

impl ProbeState {
    /// Registers a probe about to be sent and returns its sequence number.
    pub fn on_send(&mut self, now: Instant) -> u16 {
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        self.outstanding[seq as usize % WINDOW] = Some((seq, now));
        self.sent += 1;
        seq
    }

    /// Records a reply; false for unknown/duplicate/too-old sequence numbers.
    pub fn on_reply(&mut self, seq: u16, now: Instant) -> bool {
        let slot = &mut self.outstanding[seq as usize % WINDOW];
        match *slot {
            Some((s, sent_at)) if s == seq => {
                *slot = None;
                self.received += 1;
                self.last_reply = Some(now);
                self.last_rtt = Some(now.saturating_duration_since(sent_at));
                true
            }
            _ => false,
        }
    }

    /// Up while a reply arrived within three probe intervals (plus slack for the first handshake).
    pub fn is_up(&self, now: Instant, interval: Duration) -> bool {
        match self.last_reply {
            Some(t) => now.saturating_duration_since(t) <= interval * 3 + Duration::from_secs(1),
            None => false,
        }
    }

    pub fn last_rtt(&self) -> Option<Duration> {
        self.last_rtt
    }

    pub fn last_reply_age(&self, now: Instant) -> Option<Duration> {
        self.last_reply.map(|t| now.saturating_duration_since(t))
    }

    pub fn sent(&self) -> u64 {
        self.sent
    }

    pub fn received(&self) -> u64 {
        self.received
    }

    /// Probes never answered, counting those still in flight after `timeout` as lost.
    pub fn lost(&self, now: Instant, timeout: Duration) -> u64 {
        let in_flight = self
            .outstanding
            .iter()
            .flatten()
            .filter(|(_, at)| now.saturating_duration_since(*at) < timeout)
            .count() as u64;
        self.sent.saturating_sub(self.received + in_flight)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn up_after_reply_down_after_silence() {
        let t0 = Instant::now();
        let iv = Duration::from_secs(1);
        let mut p = ProbeState::default();
        assert!(!p.is_up(t0, iv));
        let s = p.on_send(t0);
        assert!(p.on_reply(s, t0 + Duration::from_millis(3)));
        assert_eq!(p.last_rtt(), Some(Duration::from_millis(3)));
        assert!(p.is_up(t0 + Duration::from_secs(2), iv));
        assert!(!p.is_up(t0 + Duration::from_secs(5), iv));
    }

    #[test]
    fn duplicate_and_unknown_replies_ignored_and_loss_counted() {
        let t0 = Instant::now();
        let mut p = ProbeState::default();
        let a = p.on_send(t0);
        let _b = p.on_send(t0);
        assert!(p.on_reply(a, t0));
        assert!(!p.on_reply(a, t0), "duplicate");
        assert!(!p.on_reply(999, t0), "never sent");
        assert_eq!(p.lost(t0, Duration::from_secs(2)), 0, "b still in flight");
        assert_eq!(
            p.lost(t0 + Duration::from_secs(3), Duration::from_secs(2)),
            1
        );
        assert_eq!((p.sent(), p.received()), (2, 1));
    }

    #[test]
    fn old_slot_overwritten_reply_rejected() {
        let t0 = Instant::now();
        let mut p = ProbeState::default();
        let first = p.on_send(t0);
        for _ in 0..WINDOW {
            p.on_send(t0);
        }
        assert!(!p.on_reply(first, t0));
    }
}
