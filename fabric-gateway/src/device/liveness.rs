//! Whether the packet threads still loop. Each one stamps its heartbeat on every pass (they
//! all wake at least every `POLL_TIMEOUT` or timer tick, traffic or not); one silent for
//! [`STUCK_AFTER`] is blocked somewhere (a lock, a send, a device) and the gateway reports
//! itself unable to serve. A thread that ended is seen through its `JoinHandle` instead.
use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

/// Far above a pass (0.25 s at most) and below the operator's grace times a few.
pub(super) const STUCK_AFTER: Duration = Duration::from_secs(5);

pub(super) struct Heartbeat {
    since: Instant,
    /// Milliseconds from `since` to the last beat.
    last_ms: AtomicU64,
}

impl Heartbeat {
    pub(super) fn new(now: Instant) -> Self {
        Self {
            since: now,
            last_ms: AtomicU64::new(0),
        }
    }

    pub(super) fn beat(&self) {
        self.beat_at(Instant::now());
    }

    fn beat_at(&self, now: Instant) {
        let ms = now.saturating_duration_since(self.since).as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// How long the thread has been silent at `now`, when that is longer than [`STUCK_AFTER`].
    pub(super) fn stuck_for(&self, now: Instant) -> Option<Duration> {
        let last = self.since + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        let silent = now.saturating_duration_since(last);
        (silent > STUCK_AFTER).then_some(silent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_that_stops_beating_is_stuck_after_the_limit() {
        let t0 = Instant::now();
        let h = Heartbeat::new(t0);
        assert_eq!(h.stuck_for(t0 + STUCK_AFTER), None);
        let later = t0 + STUCK_AFTER + Duration::from_secs(1);
        assert_eq!(
            h.stuck_for(later),
            Some(STUCK_AFTER + Duration::from_secs(1))
        );
        h.beat_at(later);
        assert_eq!(h.stuck_for(later + Duration::from_secs(2)), None);
        assert!(h.stuck_for(later + Duration::from_secs(6)).is_some());
        // A clock that reads earlier than the last beat (another thread's Instant) is no alarm.
        assert_eq!(h.stuck_for(t0), None);
    }
}
