//! How long a tenant's ShadowPods live on the provider, decided by the provider alone, as
//! pure functions of the objects and the clock: a drained tenant's ShadowPods are deleted
//! once the drain grace has passed since it was drained ([`drained`], [`drain`]), whatever
//! its virtual kubelet does; a ShadowPod whose pod finished is deleted once the retention
//! has passed since it finished ([`finished_at`], [`collect`]), so that a consumer cannot
//! fill the provider's store with finished ones. The I/O is in [`super::drainer`] and
//! [`super::controller`].
use std::time::Duration;

use fabric_api::{
    authentication::v1alpha1::{
        TenantState, WorkingMode,
        tenant_condition::{DRAINED, TETHERED},
    },
    offloading::v1alpha1::ShadowPodStatus,
    quantity::Amounts,
};
use fabric_kube::status::{Reason as _, Verdict, with_condition};
use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};

use super::decide::terminal;

fabric_kube::reasons! {
    /// Why a Tenant's Drained condition says what it does.
    pub enum Drained {
        NotDrained = "NotDrained",
        /// Drained: its ShadowPods are deleted once the grace has passed.
        Draining = "Draining",
        /// Drained, the grace passed: its ShadowPods were deleted by the provider.
        Stopped = "Stopped",
    }
}

/// The Drained condition of a tenant in `state` whose conditions were `prev`; `stopped`:
/// its ShadowPods were deleted after the grace. The lastTransitionTime is when it was
/// drained (kept while it stays drained), which [`drain`] counts the grace from.
pub fn drained(
    prev: &[Condition],
    state: TenantState,
    stopped: bool,
    grace: Duration,
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    let verdict = match (state, stopped) {
        (TenantState::Drained, false) => Verdict::ok(
            Drained::Draining,
            format!(
                "granted nothing; its ShadowPods are deleted {}s after the drain",
                grace.as_secs()
            ),
        ),
        (TenantState::Drained, true) => Verdict::ok(
            Drained::Stopped,
            format!(
                "its ShadowPods were deleted by the provider {}s after the drain",
                grace.as_secs()
            ),
        ),
        _ => Verdict::not(Drained::NotDrained, "the tenant is not drained"),
    };
    with_condition(prev, verdict.condition(DRAINED, generation, now))
}

/// Whether `conditions` say the tenant's ShadowPods were deleted after its drain grace.
pub fn stopped(conditions: &[Condition]) -> bool {
    Verdict::<Drained>::find(conditions, DRAINED).is_some_and(|v| v.reason == Drained::Stopped)
}

/// What to do about a tenant's ShadowPods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drain {
    /// Not drained (or not yet recorded as drained): they stay.
    Keep,
    /// Drained, within the grace: look again after this long.
    Wait(Duration),
    /// Drained for the whole grace: delete them.
    Stop,
}

/// [`Drain`] for a tenant in `state` whose status has `conditions` (the Drained one as
/// [`drained`] wrote it), at `now`.
pub fn drain(
    state: TenantState,
    conditions: &[Condition],
    grace: Duration,
    now: Timestamp,
) -> Drain {
    let since = conditions
        .iter()
        .find(|c| c.type_ == DRAINED && c.status == "True")
        .map(|c| c.last_transition_time.0);
    match (state, since) {
        (TenantState::Drained, Some(since)) => match left(since, grace, now) {
            Some(wait) => Drain::Wait(wait),
            None => Drain::Stop,
        },
        _ => Drain::Keep,
    }
}

fabric_kube::reasons! {
    /// Why a Tenant's Tethered condition says what it does.
    pub enum Tethered {
        /// The provider is tethered to the tenant.
        Tethered = "Tethered",
        /// The provider left tethered mode: the tenant's ShadowPods beyond its (smaller) grant
        /// are deleted once the drain grace has passed.
        Leaving = "Leaving",
        Autonomous = "Autonomous",
    }
}

/// The Tethered condition of a tenant in `mode` whose conditions were `prev`: leaving
/// tethered mode is recorded (its lastTransitionTime, which [`leaving`] counts the grace
/// from) and kept until [`settled`] says the excess was stopped.
pub fn tethered(
    prev: &[Condition],
    mode: WorkingMode,
    grace: Duration,
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    let before = Verdict::<Tethered>::find(prev, TETHERED).map(|v| v.reason);
    let verdict = match (mode, before) {
        (WorkingMode::Tethered, _) => Verdict::ok(
            Tethered::Tethered,
            "the provider is tethered to this tenant: it is offered all of what is free",
        ),
        (WorkingMode::Autonomous, Some(Tethered::Tethered | Tethered::Leaving)) => Verdict::not(
            Tethered::Leaving,
            format!(
                "the provider left tethered mode: its ShadowPods beyond its grant are deleted \
                 {}s after, newest first",
                grace.as_secs()
            ),
        ),
        // As it was said (after leaving: how many went).
        (WorkingMode::Autonomous, Some(Tethered::Autonomous)) => return prev.to_vec(),
        (WorkingMode::Autonomous, None) => Verdict::not(
            Tethered::Autonomous,
            "the provider keeps control of its resources",
        ),
    };
    with_condition(prev, verdict.condition(TETHERED, generation, now))
}

/// The Tethered condition once the ShadowPods beyond the grant were stopped (`stopped` of
/// them) after leaving tethered mode.
pub fn settled(
    prev: &[Condition],
    stopped: usize,
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    let verdict = Verdict::not(
        Tethered::Autonomous,
        match stopped {
            0 => "left tethered mode; none of the tenant's ShadowPods was beyond its grant".into(),
            n => format!("left tethered mode; {n} ShadowPods beyond the grant were deleted"),
        },
    );
    with_condition(prev, verdict.condition(TETHERED, generation, now))
}

/// Whether the ShadowPods beyond the grant are to go: [`Drain::Stop`] once the grace has
/// passed since the provider left tethered mode (the Tethered condition's `Leaving`).
pub fn leaving(conditions: &[Condition], grace: Duration, now: Timestamp) -> Drain {
    let since = conditions
        .iter()
        .find(|c| c.type_ == TETHERED && c.reason == Tethered::Leaving.as_str())
        .map(|c| c.last_transition_time.0);
    match since.map(|s| left(s, grace, now)) {
        None => Drain::Keep,
        Some(Some(wait)) => Drain::Wait(wait),
        Some(None) => Drain::Stop,
    }
}

/// Which live ShadowPods (key, creation time, what each is charged) go so that the rest fit
/// `granted`: the newest first, until every resource of the grant holds; then any of those
/// that fits again after all is kept, the older first (creation times are to the second:
/// of two made together, the one whose going does not help stays). Resources the grant
/// does not name are not weighed (the webhook admitted none beyond the grant).
pub fn excess(shadows: &[(String, Option<Timestamp>, Amounts)], granted: &Amounts) -> Vec<String> {
    let mut used = Amounts::new();
    for (_, _, a) in shadows {
        for (r, v) in a {
            *used.entry(r.clone()).or_default() += v;
        }
    }
    let over = |used: &Amounts| {
        granted
            .iter()
            .any(|(r, g)| used.get(r).copied().unwrap_or(0) > *g)
    };
    let mut newest_first: Vec<&(String, Option<Timestamp>, Amounts)> = shadows.iter().collect();
    newest_first.sort_by(|a, b| (b.1, &b.0).cmp(&(a.1, &a.0)));
    let mut out = Vec::new();
    for item in newest_first {
        if !over(&used) {
            break;
        }
        for (r, v) in &item.2 {
            *used.entry(r.clone()).or_default() -= v;
        }
        out.push(item);
    }
    let mut kept = Vec::new();
    for (i, (_, _, a)) in out.iter().enumerate().rev() {
        let mut with = used.clone();
        for (r, v) in a {
            *with.entry(r.clone()).or_default() += v;
        }
        if !over(&with) {
            used = with;
            kept.push(i);
        }
    }
    out.iter()
        .enumerate()
        .filter(|(i, _)| !kept.contains(i))
        .map(|(_, (k, _, _))| k.clone())
        .collect()
}

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

/// How long a ShadowPod whose pod finished stays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Once the consumer has recorded the end at home
    /// ([`fabric_api::names::annotation::HOME_RECORDED`]).
    pub recorded: Duration,
    /// Until then (never shorter than `recorded`): a consumer away when its pod finished
    /// finds out how it ended when it comes back within it.
    pub unrecorded: Duration,
}

/// [`Collect`] for a ShadowPod with `status` (its end `recorded` at home or not), at `now`.
pub fn collect(
    status: Option<&ShadowPodStatus>,
    recorded: bool,
    retention: Retention,
    now: Timestamp,
) -> Collect {
    let Some(status) = status.filter(|s| terminal(s.phase.as_deref())) else {
        return Collect::Live;
    };
    let retention = if recorded {
        retention.recorded
    } else {
        retention.unrecorded.max(retention.recorded)
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

    const GRACE: Duration = Duration::from_secs(60);

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    #[test]
    fn leaving_tethered_mode_is_recorded_and_the_excess_goes_after_the_grace() {
        use WorkingMode::{Autonomous, Tethered as On};
        let calm = tethered(&[], Autonomous, GRACE, Some(1), t(0));
        assert_eq!(calm[0].reason, "Autonomous");
        assert_eq!(leaving(&calm, GRACE, t(0)), Drain::Keep);
        let on = tethered(&calm, On, GRACE, Some(2), t(5));
        assert_eq!(
            (on[0].status.as_str(), on[0].reason.as_str()),
            ("True", "Tethered")
        );
        assert_eq!(leaving(&on, GRACE, t(5)), Drain::Keep);
        // Left at 10: counted from then, kept so on later writes.
        let left10 = tethered(&on, Autonomous, GRACE, Some(3), t(10));
        let left30 = tethered(&left10, Autonomous, GRACE, Some(3), t(30));
        assert_eq!(left30[0].reason, "Leaving");
        assert_eq!(left30[0].last_transition_time, Time(t(10)));
        assert_eq!(
            leaving(&left30, GRACE, t(30)),
            Drain::Wait(Duration::from_secs(40))
        );
        assert_eq!(leaving(&left30, GRACE, t(70)), Drain::Stop);
        // Settled: nothing more goes; tethered again before the grace: nothing goes.
        let done = settled(&left30, 1, Some(3), t(71));
        assert_eq!(done[0].reason, "Autonomous");
        assert_eq!(leaving(&done, GRACE, t(500)), Drain::Keep);
        assert_eq!(tethered(&done, Autonomous, GRACE, Some(3), t(501)), done);
        assert_eq!(
            tethered(&done, Autonomous, GRACE, Some(3), t(501))[0].reason,
            "Autonomous"
        );
        let back = tethered(&left30, On, GRACE, Some(4), t(40));
        assert_eq!(leaving(&back, GRACE, t(500)), Drain::Keep);
    }

    #[test]
    fn the_newest_shadow_pods_beyond_the_grant_go() {
        let a = |cpu: i128, mem: i128| Amounts::from([("cpu".into(), cpu), ("memory".into(), mem)]);
        let pods = vec![
            ("old".to_owned(), Some(t(1)), a(1000, 10)),
            ("mid".to_owned(), Some(t(2)), a(3000, 10)),
            ("new".to_owned(), Some(t(3)), a(500, 10)),
        ];
        // Within the grant: none.
        assert!(excess(&pods, &a(4500, 30)).is_empty());
        // 4.5 CPU on 4: the newest alone suffices.
        assert_eq!(
            excess(&pods, &Amounts::from([("cpu".into(), 4000)])),
            ["new"]
        );
        // 4.5 CPU on 1.2: the two newest.
        assert_eq!(excess(&pods, &a(1200, 100)), ["new", "mid"]);
        // Memory alone over: resources outside the grant are not weighed.
        assert_eq!(
            excess(&pods, &Amounts::from([("memory".into(), 15)])),
            ["new", "mid"]
        );
        // Made in the same second: the small one whose going would not help stays.
        let same = vec![
            ("big".to_owned(), Some(t(5)), a(7500, 10)),
            ("web".to_owned(), Some(t(5)), a(100, 10)),
        ];
        assert_eq!(
            excess(&same, &Amounts::from([("cpu".into(), 7200)])),
            ["big"]
        );
    }

    #[test]
    fn a_drained_tenant_is_stopped_after_the_grace_counted_from_the_drain() {
        let active = drained(&[], TenantState::Active, false, GRACE, Some(1), t(0));
        assert_eq!(
            drain(TenantState::Active, &active, GRACE, t(0)),
            Drain::Keep
        );
        // Drained at 10: the condition says since when, and stays so on later writes.
        let at10 = drained(&active, TenantState::Drained, false, GRACE, Some(2), t(10));
        let at30 = drained(&at10, TenantState::Drained, false, GRACE, Some(2), t(30));
        assert_eq!(at30[0].last_transition_time, Time(t(10)));
        assert_eq!(at30[0].reason, "Draining");
        assert_eq!(
            drain(TenantState::Drained, &at30, GRACE, t(30)),
            Drain::Wait(Duration::from_secs(40))
        );
        assert_eq!(
            drain(TenantState::Drained, &at30, GRACE, t(70)),
            Drain::Stop
        );
        assert_eq!(
            drain(TenantState::Drained, &at30, GRACE, t(500)),
            Drain::Stop
        );
        let stopped = drained(&at30, TenantState::Drained, true, GRACE, Some(2), t(70));
        assert_eq!(stopped[0].reason, "Stopped");
        assert!(super::stopped(&stopped) && !super::stopped(&at30));
        assert_eq!(stopped[0].last_transition_time, Time(t(10)));
    }

    #[test]
    fn undrained_within_the_grace_stops_nothing_and_a_new_drain_starts_it_again() {
        let at10 = drained(&[], TenantState::Drained, false, GRACE, Some(2), t(10));
        // Active again at 40, before the grace ended: nothing is stopped, however late.
        let back = drained(&at10, TenantState::Active, false, GRACE, Some(3), t(40));
        assert_eq!(drain(TenantState::Active, &back, GRACE, t(40)), Drain::Keep);
        assert_eq!(
            drain(TenantState::Active, &back, GRACE, t(900)),
            Drain::Keep
        );
        let cordoned = drained(&back, TenantState::Cordoned, false, GRACE, Some(4), t(50));
        assert_eq!(
            drain(TenantState::Cordoned, &cordoned, GRACE, t(900)),
            Drain::Keep
        );
        // Drained again at 100: a grace of its own, not the remainder of the first.
        let again = drained(
            &cordoned,
            TenantState::Drained,
            false,
            GRACE,
            Some(5),
            t(100),
        );
        assert_eq!(
            drain(TenantState::Drained, &again, GRACE, t(100)),
            Drain::Wait(GRACE)
        );
    }

    #[test]
    fn a_drain_not_recorded_yet_or_stamped_ahead_gets_the_whole_grace() {
        // The spec says Drained, the status does not yet: the grace starts when it does.
        let active = drained(&[], TenantState::Active, false, GRACE, Some(1), t(0));
        assert_eq!(
            drain(TenantState::Drained, &active, GRACE, t(500)),
            Drain::Keep
        );
        assert_eq!(drain(TenantState::Drained, &[], GRACE, t(500)), Drain::Keep);
        let ahead = drained(&[], TenantState::Drained, false, GRACE, Some(2), t(100));
        assert_eq!(
            drain(TenantState::Drained, &ahead, GRACE, t(50)),
            Drain::Wait(GRACE)
        );
    }

    fn both(d: Duration) -> Retention {
        Retention {
            recorded: d,
            unrecorded: d,
        }
    }

    #[test]
    fn an_end_the_consumer_has_not_recorded_is_kept_longer() {
        let retention = Retention {
            recorded: Duration::from_secs(3600),
            unrecorded: Duration::from_secs(86_400),
        };
        let done = ShadowPodStatus {
            phase: Some("Succeeded".into()),
            finished_at: Some(Time(t(0))),
            ..Default::default()
        };
        assert_eq!(
            collect(Some(&done), true, retention, t(3600)),
            Collect::Delete
        );
        assert_eq!(
            collect(Some(&done), false, retention, t(3600)),
            Collect::Wait(Duration::from_secs(86_400 - 3600))
        );
        assert_eq!(
            collect(Some(&done), false, retention, t(86_400)),
            Collect::Delete
        );
        // Never shorter than the recorded one.
        let odd = Retention {
            recorded: Duration::from_secs(3600),
            unrecorded: Duration::from_secs(60),
        };
        assert_eq!(
            collect(Some(&done), false, odd, t(60)),
            Collect::Wait(Duration::from_secs(3540))
        );
    }

    #[test]
    fn a_finished_pod_is_collected_after_the_retention_counted_from_its_end() {
        let retention = Duration::from_secs(3600);
        let running = ShadowPodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        };
        assert_eq!(finished_at(&running, Some("Running"), t(0)), None);
        assert_eq!(
            collect(Some(&running), true, both(retention), t(0)),
            Collect::Live
        );
        assert_eq!(collect(None, true, both(retention), t(0)), Collect::Live);
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
                collect(Some(&done), true, both(retention), t(5)),
                Collect::Wait(retention)
            );
            assert_eq!(
                collect(Some(&done), true, both(retention), t(3604)),
                Collect::Wait(Duration::from_secs(1))
            );
            assert_eq!(
                collect(Some(&done), true, both(retention), t(3605)),
                Collect::Delete
            );
        }
        // Finished, its end not stamped (an earlier release): stamped first, then counted.
        let unstamped = ShadowPodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        };
        assert_eq!(
            collect(Some(&unstamped), true, both(retention), t(9999)),
            Collect::Live
        );
    }
}
