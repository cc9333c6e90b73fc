//! The election policy, free of I/O: what a candidate does with the Lease it just read.
//!
//! A holder counts as gone once its record has not changed for leaseDurationSeconds of the
//! candidate's own clock, as in client-go: comparing the holder's renewTime with our clock
//! would make clock skew between nodes decide who leads. The clock is passed in.
use std::time::{Duration, Instant};

/// What a candidate knows about the Lease: the last record it saw, and when (by its own
/// clock) it first saw it.
#[derive(Debug, Default)]
pub struct Observed {
    record: Option<(String, String)>,
    since: Option<Instant>,
}

impl Observed {
    /// Notes the Lease's current holder and renewTime as seen at `now`.
    pub fn observe(&mut self, holder: &str, renew_time: &str, now: Instant) {
        let rec = (holder.to_owned(), renew_time.to_owned());
        if self.record.as_ref() != Some(&rec) {
            self.record = Some(rec);
            self.since = Some(now);
        }
    }

    /// Whether the record has stayed the same for `duration` (never true before a first
    /// observation).
    pub fn expired(&self, duration: Duration, now: Instant) -> bool {
        self.since
            .is_some_and(|t| now.saturating_duration_since(t) >= duration)
    }
}

/// What a candidate does with the Lease it just read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// It is ours: renew it.
    Renew,
    /// Free, released or expired: take it.
    Take,
    /// Someone else holds it.
    Standby,
}

/// The verdict for candidate `me` on a Lease held by `holder` (None or empty: nobody), given
/// what it has `seen` and the holder's `duration`, at `now`.
pub fn verdict(
    me: &str,
    holder: Option<&str>,
    seen: &Observed,
    duration: Duration,
    now: Instant,
) -> Verdict {
    match holder.filter(|h| !h.is_empty()) {
        Some(h) if h == me => Verdict::Renew,
        None => Verdict::Take,
        Some(_) if seen.expired(duration, now) => Verdict::Take,
        Some(_) => Verdict::Standby,
    }
}

/// leaseDurationSeconds for a duration: whole seconds, at least one.
pub fn lease_seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_holder_loses_the_lease_after_its_duration_of_local_time() {
        let d = Duration::from_secs(4);
        let t0 = Instant::now();
        let mut seen = Observed::default();
        seen.observe("gw-0", "2025-01-01T00:00:00.000000Z", t0);
        assert_eq!(
            verdict("gw-1", Some("gw-0"), &seen, d, t0),
            Verdict::Standby
        );
        // Renewals keep it alive, however long it has been held.
        let t1 = t0 + Duration::from_secs(3);
        seen.observe("gw-0", "2025-01-01T00:00:03.000000Z", t1);
        let t2 = t0 + Duration::from_secs(6);
        seen.observe("gw-0", "2025-01-01T00:00:03.000000Z", t2);
        assert_eq!(
            verdict("gw-1", Some("gw-0"), &seen, d, t2),
            Verdict::Standby
        );
        // The same record for the whole duration: the holder is gone.
        let t3 = t1 + d;
        seen.observe("gw-0", "2025-01-01T00:00:03.000000Z", t3);
        assert_eq!(verdict("gw-1", Some("gw-0"), &seen, d, t3), Verdict::Take);
        // Its renewTime says nothing about our clock: a record renewed "in the future" still
        // expires on local time.
        let mut skewed = Observed::default();
        skewed.observe("gw-0", "2099-01-01T00:00:00.000000Z", t0);
        assert_eq!(
            verdict("gw-1", Some("gw-0"), &skewed, d, t0),
            Verdict::Standby
        );
        assert_eq!(
            verdict("gw-1", Some("gw-0"), &skewed, d, t0 + d),
            Verdict::Take
        );
    }

    #[test]
    fn free_or_own_leases_are_taken_or_renewed_at_once() {
        let d = Duration::from_secs(4);
        let t0 = Instant::now();
        let mut seen = Observed::default();
        seen.observe("gw-1", "x", t0);
        assert_eq!(verdict("gw-1", Some("gw-1"), &seen, d, t0), Verdict::Renew);
        seen.observe("", "x", t0);
        // Released on shutdown: no waiting.
        assert_eq!(verdict("gw-1", Some(""), &seen, d, t0), Verdict::Take);
        assert_eq!(verdict("gw-1", None, &seen, d, t0), Verdict::Take);
        // Nothing observed yet never counts as expired.
        assert!(!Observed::default().expired(d, t0 + d * 10));
    }

    #[test]
    fn lease_seconds_are_whole_and_positive() {
        assert_eq!(lease_seconds(Duration::from_millis(200)), 1);
        assert_eq!(lease_seconds(Duration::from_millis(4500)), 4);
        assert_eq!(lease_seconds(Duration::from_secs(u64::MAX)), i32::MAX);
    }
}
