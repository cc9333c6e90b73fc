//! How long a tenant's ShadowPods live on the provider, decided by the provider alone, as
//! pure functions of the objects and the clock: a ShadowPod whose pod finished is deleted
//! once the retention has passed since it finished ([`finished_at`], [`collect`]), so that
//! a consumer cannot fill the provider's store with finished ones. The I/O is in
//! [`super::controller`].
use std::time::Duration;

use fabric_api::offloading::v1alpha1::ShadowPodStatus;
use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};

use super::decide::terminal;

/// How long is left of `period` started at `since`, at `now`; None once it has passed. A
/// start stamped by a clock ahead of this one's counts from now.
fn left(since: Timestamp, period: Duration, now: Timestamp) -> Option<Duration> {
    let elapsed = now.duration_since(since);
    let elapsed = if elapsed.is_negative() {
        Duration::ZERO
    } else {
        elapsed.unsigned_abs()
    };
    period.checked_sub(elapsed).filter(|d| !d.is_zero())
}

/// When a ShadowPod whose status was `prev` and whose pod is now in `phase` finished: the
/// time already recorded, else `now` once the phase is terminal; None while it runs.
pub fn finished_at(prev: &ShadowPodStatus, phase: Option<&str>, now: Timestamp) -> Option<Time> {
    terminal(phase).then(|| prev.finished_at.clone().unwrap_or(Time(now)))
}

/// What to do about a ShadowPod whose pod may have finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collect {
    /// It has not finished (or its end is not recorded yet).
    Live,
    /// Finished, within the retention: look again after this long.
    Wait(Duration),
    /// Finished for the whole retention: delete it.
    Delete,
}

/// [`Collect`] for a ShadowPod with `status`, at `now`.
pub fn collect(status: Option<&ShadowPodStatus>, retention: Duration, now: Timestamp) -> Collect {
    let Some(status) = status.filter(|s| terminal(s.phase.as_deref())) else {
        return Collect::Live;
    };
    match &status.finished_at {
        None => Collect::Live,
        Some(at) => match left(at.0, retention, now) {
            Some(wait) => Collect::Wait(wait),
            None => Collect::Delete,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    #[test]
    fn a_finished_pod_is_collected_after_the_retention_counted_from_its_end() {
        let retention = Duration::from_secs(3600);
        let running = ShadowPodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        };
        assert_eq!(finished_at(&running, Some("Running"), t(0)), None);
        assert_eq!(collect(Some(&running), retention, t(0)), Collect::Live);
        assert_eq!(collect(None, retention, t(0)), Collect::Live);
        for phase in ["Succeeded", "Failed"] {
            let done = ShadowPodStatus {
                phase: Some(phase.into()),
                finished_at: finished_at(&running, Some(phase), t(5)),
                ..Default::default()
            };
            assert_eq!(done.finished_at, Some(Time(t(5))));
            // Seen finished again later: still the first time it was.
            assert_eq!(finished_at(&done, Some(phase), t(50)), Some(Time(t(5))));
            assert_eq!(
                collect(Some(&done), retention, t(5)),
                Collect::Wait(retention)
            );
            assert_eq!(
                collect(Some(&done), retention, t(3604)),
                Collect::Wait(Duration::from_secs(1))
            );
            assert_eq!(collect(Some(&done), retention, t(3605)), Collect::Delete);
        }
        // Finished, its end not stamped (an earlier release): stamped first, then counted.
        let unstamped = ShadowPodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        };
        assert_eq!(collect(Some(&unstamped), retention, t(9999)), Collect::Live);
    }
}
