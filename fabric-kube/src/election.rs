//! The election policy, free of I/O: what a candidate does with the Lease it just read.
//!
//! A holder counts as gone once its record has not changed for leaseDurationSeconds of the
//! candidate's own clock, as in client-go: comparing the holder's renewTime with our clock
//! would make clock skew between nodes decide who leads. The clock is passed in.
//!
//! The holder, in turn, stops leading once it has not renewed for its renew deadline (shorter
//! than the Lease's duration), counted from when it *sent* its last successful renewal: the
//! server wrote that renewal after it was sent, and a standby waits a whole duration from
//! when it saw it, so the old holder has stopped before anyone else may take over
//! ([`Tenure`]). A replica that cannot do its work (`fit` false) gives the Lease up and does
//! not take it.
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
    /// Someone else holds it, or this replica is unfit to take it.
    Standby,
    /// It is ours but this replica cannot do the work: hand it over at once.
    Release,
}

/// The verdict for candidate `me` on a Lease held by `holder` (None or empty: nobody), given
/// what it has `seen`, the holder's `duration`, and whether `me` is `fit` to do the work, at
/// `now`.
pub fn verdict(
    me: &str,
    holder: Option<&str>,
    seen: &Observed,
    duration: Duration,
    fit: bool,
    now: Instant,
) -> Verdict {
    match holder.filter(|h| !h.is_empty()) {
        Some(h) if h == me && fit => Verdict::Renew,
        Some(h) if h == me => Verdict::Release,
        _ if !fit => Verdict::Standby,
        None => Verdict::Take,
        Some(_) if seen.expired(duration, now) => Verdict::Take,
        Some(_) => Verdict::Standby,
    }
}

/// The holder's side of the Lease: whether it still leads, by its own clock.
#[derive(Debug, Default)]
pub struct Tenure {
    /// When the last renewal (or take) that the API accepted was sent.
    renewed: Option<Instant>,
}

impl Tenure {
    /// A renewal sent at `sent` was accepted.
    pub fn renewed(&mut self, sent: Instant) {
        self.renewed = Some(sent);
    }

    /// The Lease is someone else's (or was released): no leading until the next renewal.
    pub fn ended(&mut self) {
        self.renewed = None;
    }

    /// When leading ends without another accepted renewal (None: not leading).
    pub fn ends(&self, deadline: Duration) -> Option<Instant> {
        self.renewed.map(|t| t + deadline)
    }

    /// Whether this replica leads at `now`: a renewal accepted less than `deadline` ago.
    pub fn leading(&self, deadline: Duration, now: Instant) -> bool {
        self.ends(deadline).is_some_and(|end| now < end)
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
            verdict("gw-1", Some("gw-0"), &seen, d, true, t0),
            Verdict::Standby
        );
        // Renewals keep it alive, however long it has been held.
        let t1 = t0 + Duration::from_secs(3);
        seen.observe("gw-0", "2025-01-01T00:00:03.000000Z", t1);
        let t2 = t0 + Duration::from_secs(6);
        seen.observe("gw-0", "2025-01-01T00:00:03.000000Z", t2);
        assert_eq!(
            verdict("gw-1", Some("gw-0"), &seen, d, true, t2),
            Verdict::Standby
        );
        // The same record for the whole duration: the holder is gone.
        let t3 = t1 + d;
        seen.observe("gw-0", "2025-01-01T00:00:03.000000Z", t3);
        assert_eq!(
            verdict("gw-1", Some("gw-0"), &seen, d, true, t3),
            Verdict::Take
        );
        // Its renewTime says nothing about our clock: a record renewed "in the future" still
        // expires on local time.
        let mut skewed = Observed::default();
        skewed.observe("gw-0", "2099-01-01T00:00:00.000000Z", t0);
        assert_eq!(
            verdict("gw-1", Some("gw-0"), &skewed, d, true, t0),
            Verdict::Standby
        );
        assert_eq!(
            verdict("gw-1", Some("gw-0"), &skewed, d, true, t0 + d),
            Verdict::Take
        );
    }

    #[test]
    fn free_or_own_leases_are_taken_or_renewed_at_once() {
        let d = Duration::from_secs(4);
        let t0 = Instant::now();
        let mut seen = Observed::default();
        seen.observe("gw-1", "x", t0);
        assert_eq!(
            verdict("gw-1", Some("gw-1"), &seen, d, true, t0),
            Verdict::Renew
        );
        seen.observe("", "x", t0);
        // Released on shutdown: no waiting.
        assert_eq!(verdict("gw-1", Some(""), &seen, d, true, t0), Verdict::Take);
        assert_eq!(verdict("gw-1", None, &seen, d, true, t0), Verdict::Take);
        // Nothing observed yet never counts as expired.
        assert!(!Observed::default().expired(d, t0 + d * 10));
    }

    #[test]
    fn an_unfit_replica_hands_the_lease_over_and_never_takes_it() {
        let d = Duration::from_secs(4);
        let t0 = Instant::now();
        let mut seen = Observed::default();
        seen.observe("gw-0", "x", t0);
        assert_eq!(
            verdict("gw-0", Some("gw-0"), &seen, d, false, t0),
            Verdict::Release
        );
        // Not a free Lease, not an expired one.
        assert_eq!(verdict("gw-1", None, &seen, d, false, t0), Verdict::Standby);
        assert_eq!(
            verdict("gw-1", Some(""), &seen, d, false, t0),
            Verdict::Standby
        );
        assert_eq!(
            verdict("gw-1", Some("gw-0"), &seen, d, false, t0 + d * 2),
            Verdict::Standby
        );
    }

    #[test]
    fn a_holder_that_cannot_renew_stops_leading_before_a_standby_may_take_over() {
        let (duration, deadline) = (Duration::from_secs(4), Duration::from_secs(3));
        let t0 = Instant::now();
        let mut tenure = Tenure::default();
        assert!(!tenure.leading(deadline, t0), "leads before any renewal");
        // The renewal sent at t0 reached the server at t0 + 0.5 s; the standby saw that
        // record at t0 + 0.7 s.
        tenure.renewed(t0);
        let mut seen = Observed::default();
        seen.observe("gw-0", "t0", t0 + Duration::from_millis(700));
        // Every renewal after that fails (the API is cut off from the holder).
        let mut last_leading = t0;
        let mut taken = None;
        for ms in (0..10_000).step_by(50) {
            let now = t0 + Duration::from_millis(ms);
            if tenure.leading(deadline, now) {
                last_leading = now;
            }
            if taken.is_none()
                && verdict("gw-1", Some("gw-0"), &seen, duration, true, now) == Verdict::Take
            {
                taken = Some(now);
            }
        }
        let taken = taken.expect("the standby never takes over");
        assert!(
            last_leading < taken,
            "the old holder led until {last_leading:?}, the standby took over at {taken:?}"
        );
        assert_eq!(tenure.ends(deadline), Some(t0 + deadline));
        // A renewal accepted again extends it; a Lease found with another holder ends it.
        tenure.renewed(t0 + Duration::from_secs(5));
        assert!(tenure.leading(deadline, t0 + Duration::from_secs(7)));
        tenure.ended();
        assert!(!tenure.leading(deadline, t0 + Duration::from_secs(5)));
        assert_eq!(tenure.ends(deadline), None);
    }

    #[test]
    fn lease_seconds_are_whole_and_positive() {
        assert_eq!(lease_seconds(Duration::from_millis(200)), 1);
        assert_eq!(lease_seconds(Duration::from_millis(4500)), 4);
        assert_eq!(lease_seconds(Duration::from_secs(u64::MAX)), i32::MAX);
    }
}
