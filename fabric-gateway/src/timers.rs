//! The gateway's timer policy for one peer, as a pure function of the time and the peer's
//! state: the caller passes the clock in and executes the returned [`Actions`].
//!
//! WireGuard's own timers (rekey after REKEY_AFTER_TIME, retrying an unanswered initiation
//! after REKEY_TIMEOUT, persistent keepalives, expiry) run inside boringtun's `Tunn`, whose
//! `update_timers` the caller runs each tick and reports here as [`TunnTimers`]. On top of
//! them the fabric adds what a WireGuard peer alone would do too slowly:
//! - a peer we can reach whose session expired is dialled again instead of going quiet;
//! - a new peer without a session is dialled every second in its first 30 s (its gateway is
//!   most likely still being set up), so a peering is up within a second of both sides being
//!   ready instead of after REKEY_TIMEOUT;
//! - while in-tunnel probes fail, a new handshake every 2 s: a restarted peer (or a standby
//!   replica behind the same address) silently drops our old session's packets, and
//!   WireGuard alone would notice only after about 15 s;
//! - in-tunnel probes every 200 ms from a new session until the first reply (the tunnel is
//!   reported up as soon as it is), then every probe interval.

use std::time::{Duration, Instant};

use crate::probe::ProbeState;

/// How often the caller runs [`on_tick`] for every peer.
pub const TICK: Duration = Duration::from_millis(100);
/// While probes fail, a new handshake this often. Shorter than WireGuard's REKEY_TIMEOUT (5 s):
/// the peer behind a Service may have been replaced by a replica that only waits for our
/// handshake, and one initiation every 2 s per dead peer is still no load.
pub const FORCED_REKEY_EVERY: Duration = Duration::from_secs(2);
/// A peer without a session in its first 30 s is dialled again every second.
pub const FRESH_PEER_WINDOW: Duration = Duration::from_secs(30);
pub const FRESH_PEER_RETRY: Duration = Duration::from_secs(1);
/// Probe pace between a new session and the first probe reply.
pub const FIRST_PROBE_EVERY: Duration = Duration::from_millis(200);
/// Failing probes count only once this many were sent.
const PROBES_BEFORE_FAILING: u64 = 3;

/// What `Tunn::update_timers` returned on this tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TunnTimers {
    Quiet,
    /// A packet to send: a keepalive, or boringtun's own handshake initiation.
    Packet,
    /// The session expired (or boringtun gave up handshaking).
    Expired,
}

/// The peer as the policy sees it on one tick.
#[derive(Clone, Copy, Debug)]
pub struct PeerView {
    pub tunn: TunnTimers,
    /// boringtun holds a session, i.e. a handshake completed.
    pub session: bool,
    /// Where to send is known: configured (the dialing side) or learnt from the peer.
    pub endpoint: bool,
}

/// Why the gateway sends a handshake initiation of its own on top of boringtun's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForcedHandshake {
    /// A new peer that has not answered yet.
    Fresh,
    /// Probes fail on a session that may be dead on the other side.
    ProbesFailing,
}

/// What to do for a peer on this tick, executed in field order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Actions {
    /// Send the packet boringtun's timers produced (to the endpoint; without one it is
    /// counted as a drop).
    pub send_timer_packet: bool,
    /// Send a new handshake initiation because the session expired.
    pub redial_expired: bool,
    /// Send a new handshake initiation for this reason.
    pub force_handshake: Option<ForcedHandshake>,
    /// Send an in-tunnel probe with this sequence number.
    pub probe: Option<u16>,
}

/// Per-peer bookkeeping of the probes and of the handshakes the policy forced, for peers
/// with a probe address (without one there are neither probes nor forced handshakes).
#[derive(Clone, Debug)]
pub struct ProbeTimers {
    state: ProbeState,
    created: Instant,
    last_sent: Option<Instant>,
    last_forced_handshake: Option<Instant>,
}

impl ProbeTimers {
    /// For a peer (or a probe configuration) set up at `now`.
    pub fn new(now: Instant) -> Self {
        Self {
            state: ProbeState::default(),
            created: now,
            last_sent: None,
            // The dialing side sends its first initiation when the peer is added.
            last_forced_handshake: Some(now),
        }
    }

    pub fn state(&self) -> &ProbeState {
        &self.state
    }

    /// Records a probe reply; false for unknown, duplicate or too old sequence numbers.
    pub fn on_reply(&mut self, seq: u16, now: Instant) -> bool {
        self.state.on_reply(seq, now)
    }
}

/// Decides what a peer needs on the tick at `now`. `probe` carries the peer's probe
/// bookkeeping, which this updates (probes and forced handshakes are booked even when there
/// is no endpoint to send them to, exactly as if they had been lost).
pub fn on_tick(
    now: Instant,
    probe_interval: Duration,
    peer: PeerView,
    probe: Option<&mut ProbeTimers>,
) -> Actions {
    let mut act = Actions {
        send_timer_packet: peer.tunn == TunnTimers::Packet,
        // Dialing peers keep trying; a silent server peer just waits.
        redial_expired: peer.tunn == TunnTimers::Expired && peer.endpoint,
        ..Actions::default()
    };
    let Some(pr) = probe else {
        return act;
    };
    let fresh = !peer.session && now.duration_since(pr.created) < FRESH_PEER_WINDOW;
    let failing = pr.state.sent() >= PROBES_BEFORE_FAILING && !pr.state.is_up(now, probe_interval);
    let pace = if fresh {
        FRESH_PEER_RETRY
    } else {
        FORCED_REKEY_EVERY
    };
    if (fresh || failing)
        && pr
            .last_forced_handshake
            .is_none_or(|t| now.duration_since(t) >= pace)
    {
        pr.last_forced_handshake = Some(now);
        if peer.endpoint {
            act.force_handshake = Some(if fresh {
                ForcedHandshake::Fresh
            } else {
                ForcedHandshake::ProbesFailing
            });
        }
    }
    let every = if peer.session && pr.state.received() == 0 {
        FIRST_PROBE_EVERY.min(probe_interval)
    } else {
        probe_interval
    };
    if pr.last_sent.is_none_or(|t| now.duration_since(t) >= every) {
        pr.last_sent = Some(now);
        let seq = pr.state.on_send(now);
        if peer.endpoint {
            act.probe = Some(seq);
        }
    }
    act
}

#[cfg(test)]
mod tests {
    use super::*;

    const IV: Duration = Duration::from_secs(1);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn view(session: bool) -> PeerView {
        PeerView {
            tunn: TunnTimers::Quiet,
            session,
            endpoint: true,
        }
    }

    /// Runs the policy every TICK over `[from, to)`, answering probes through `reply`
    /// (given the send time, returns the RTT of its reply or None for a lost probe), and
    /// returns the times of the handshakes it forced and of the probes it sent.
    struct Run {
        forced: Vec<(Duration, ForcedHandshake)>,
        probes: Vec<Duration>,
    }

    fn run(
        t0: Instant,
        pr: &mut ProbeTimers,
        from: Duration,
        to: Duration,
        session: impl Fn(Duration) -> bool,
        reply: impl Fn(Duration) -> Option<Duration>,
    ) -> Run {
        let mut out = Run {
            forced: vec![],
            probes: vec![],
        };
        let mut pending = vec![];
        let mut at = from;
        while at < to {
            let now = t0 + at;
            pending.retain(|&(due, seq)| {
                if due <= at {
                    pr.on_reply(seq, t0 + due);
                    false
                } else {
                    true
                }
            });
            let a = on_tick(now, IV, view(session(at)), Some(pr));
            if let Some(why) = a.force_handshake {
                out.forced.push((at, why));
            }
            if let Some(seq) = a.probe {
                out.probes.push(at);
                if let Some(rtt) = reply(at) {
                    pending.push((at + rtt, seq));
                }
            }
            at += TICK;
        }
        out
    }

    #[test]
    fn a_new_peer_that_never_answers_is_dialled_every_second_for_30_s() {
        let t0 = Instant::now();
        let mut pr = ProbeTimers::new(t0);
        let r = run(t0, &mut pr, ms(0), ms(40_000), |_| false, |_| None);
        let fresh: Vec<_> = r
            .forced
            .iter()
            .filter(|f| f.1 == ForcedHandshake::Fresh)
            .map(|f| f.0)
            .collect();
        // The initiation sent when the peer was added counts as the one at 0 s.
        let expect: Vec<_> = (1..30).map(Duration::from_secs).collect();
        assert_eq!(fresh, expect);
        // Past the window, the failing probes keep a handshake going every 2 s.
        let later: Vec<_> = r.forced.iter().filter(|f| f.0 >= ms(30_000)).collect();
        assert!(later.iter().all(|f| f.1 == ForcedHandshake::ProbesFailing));
        assert_eq!(
            later.iter().map(|f| f.0).collect::<Vec<_>>(),
            [31_000, 33_000, 35_000, 37_000, 39_000].map(ms)
        );
        // No session: probes at the normal interval only.
        assert_eq!(r.probes.len(), 40);
        assert!(r.probes.windows(2).all(|w| w[1] - w[0] == IV));
    }

    #[test]
    fn probes_every_200_ms_from_a_new_session_until_the_first_reply() {
        let t0 = Instant::now();
        let mut pr = ProbeTimers::new(t0);
        // Session from 1.5 s; replies come back (after 50 ms) only to probes sent from 2.2 s.
        let r = run(
            t0,
            &mut pr,
            ms(0),
            ms(5_000),
            |at| at >= ms(1_500),
            |at| (at >= ms(2_200)).then_some(ms(50)),
        );
        assert_eq!(
            r.probes,
            [0, 1_000, 1_500, 1_700, 1_900, 2_100, 2_300, 3_300, 4_300].map(ms)
        );
        // Up from the reply at 2.35 s, so nothing forced once the session exists.
        assert!(r.forced.iter().all(|f| f.0 < ms(1_500)));
        assert!(pr.state().is_up(t0 + ms(5_000), IV));
    }

    #[test]
    fn first_probe_pace_never_exceeds_a_shorter_interval() {
        let t0 = Instant::now();
        let mut pr = ProbeTimers::new(t0);
        let iv = ms(100);
        let mut sent = 0;
        for i in 0..10 {
            if on_tick(t0 + TICK * i, iv, view(true), Some(&mut pr))
                .probe
                .is_some()
            {
                sent += 1;
            }
        }
        assert_eq!(sent, 10);
    }

    #[test]
    fn failing_probes_after_success_rehandshake_every_2_s_and_stop_on_recovery() {
        let t0 = Instant::now();
        let mut pr = ProbeTimers::new(t0);
        let start = ms(60_000); // long past the fresh-peer window
        // Replies until 70 s, none until 90 s, replies again after.
        let r = run(
            t0,
            &mut pr,
            start,
            ms(110_000),
            |_| true,
            |at| (at < ms(70_000) || at >= ms(90_000)).then_some(ms(5)),
        );
        let forced: Vec<_> = r.forced.iter().map(|f| f.0).collect();
        assert!(
            r.forced
                .iter()
                .all(|f| f.1 == ForcedHandshake::ProbesFailing)
        );
        // The last reply (to the 69 s probe) keeps the peer up for 3 intervals + 1 s.
        assert_eq!(forced.first(), Some(&ms(73_100)));
        assert!(forced.windows(2).all(|w| w[1] - w[0] == ms(2_000)));
        // The first probe after the outage is answered at 90.005 s; no handshake after that.
        assert_eq!(forced.last(), Some(&ms(89_100)));
        assert!(pr.state().is_up(t0 + ms(110_000), IV));
    }

    #[test]
    fn no_forced_handshake_before_three_probes_once_the_fresh_window_is_over() {
        let t0 = Instant::now();
        let mut pr = ProbeTimers::new(t0);
        // A probe configuration replaced while the session lives: not fresh, no probe sent yet.
        let later = t0 + ms(100_000);
        pr.created = later - FRESH_PEER_WINDOW;
        let mut forced = vec![];
        for i in 0..40 {
            let a = on_tick(later + TICK * i, IV, view(true), Some(&mut pr));
            if a.force_handshake.is_some() {
                forced.push(i);
            }
        }
        // Probes at 0, 200, 400 ms, none answered: failing from the tick after the third.
        assert_eq!(forced, [5, 25]);
    }

    #[test]
    fn timer_packets_are_sent_and_expiry_redials_only_with_an_endpoint() {
        let now = Instant::now();
        let mut p = view(true);
        p.tunn = TunnTimers::Packet;
        let a = on_tick(now, IV, p, None);
        assert_eq!(
            a,
            Actions {
                send_timer_packet: true,
                ..Actions::default()
            }
        );
        p.tunn = TunnTimers::Expired;
        assert!(on_tick(now, IV, p, None).redial_expired);
        p.endpoint = false;
        assert_eq!(on_tick(now, IV, p, None), Actions::default());
        p.tunn = TunnTimers::Quiet;
        p.endpoint = true;
        assert_eq!(on_tick(now, IV, p, None), Actions::default());
    }

    #[test]
    fn without_an_endpoint_probes_and_handshakes_are_booked_not_sent() {
        let t0 = Instant::now();
        let mut pr = ProbeTimers::new(t0);
        let p = PeerView {
            tunn: TunnTimers::Quiet,
            session: false,
            endpoint: false,
        };
        for i in 0..30 {
            assert_eq!(
                on_tick(t0 + TICK * i, IV, p, Some(&mut pr)),
                Actions::default()
            );
        }
        assert_eq!(pr.state().sent(), 3);
        assert_eq!(pr.last_forced_handshake, Some(t0 + ms(2_000)));
        // Once the endpoint is learnt, the schedule goes on from there.
        let a = on_tick(t0 + ms(3_000), IV, view(false), Some(&mut pr));
        assert_eq!(a.force_handshake, Some(ForcedHandshake::Fresh));
        assert_eq!(a.probe, Some(4));
    }
}
