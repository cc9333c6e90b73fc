//! Lease leader election against the API: the thin edge around [`crate::election`].
//!
//! Candidates compete for one `coordination.k8s.io/v1` Lease (holder = their identity,
//! renewed every `retry`, writes guarded by the Lease's resourceVersion). A holder that has not
//! renewed for `renew_deadline` stops leading, and one that is unfit for the work hands the
//! Lease over (see [`crate::election`]). The holder may keep
//! annotations on the Lease for others to follow (the gateway operator publishes its
//! gateway's address there for the node agents).
use std::{collections::BTreeMap, future::Future, time::Duration};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::election::{Observed, Tenure, Verdict, lease_seconds, verdict};

/// How a replica takes part in an election.
#[derive(Debug, Clone)]
pub struct Election {
    /// Name of the Lease (in the namespace of the `Api` it is used with).
    pub lease: String,
    /// This replica's holderIdentity (the pod name).
    pub identity: String,
    /// leaseDurationSeconds: how long a silent holder keeps the Lease.
    pub duration: Duration,
    /// How often the holder renews and a standby checks.
    pub retry: Duration,
    /// How long the holder keeps leading without an accepted renewal: between `retry` and
    /// `duration`, so that it has stopped before a standby may take the Lease over.
    pub renew_deadline: Duration,
    /// Annotations this replica keeps on the Lease while it holds it; a key with None is
    /// removed. All of them are removed when it releases the Lease.
    pub annotations: BTreeMap<String, Option<String>>,
}

impl Election {
    /// An election with the usual timing (4 s Lease, renewed every second, leading for 3 s
    /// after the last accepted renewal) and no annotations.
    pub fn new(lease: impl Into<String>, identity: impl Into<String>) -> Self {
        Self {
            lease: lease.into(),
            identity: identity.into(),
            duration: Duration::from_secs(4),
            retry: Duration::from_secs(1),
            renew_deadline: Duration::from_secs(3),
            annotations: BTreeMap::new(),
        }
    }

    /// The timing for a Lease of `duration` renewed every `retry`: the holder leads for
    /// `duration - retry` after its last accepted renewal. None when `retry` is not shorter
    /// than `duration`.
    pub fn with_timing(mut self, duration: Duration, retry: Duration) -> Option<Self> {
        let deadline = duration.checked_sub(retry).filter(|d| !d.is_zero())?;
        self.duration = duration;
        self.retry = retry;
        self.renew_deadline = deadline;
        Some(self)
    }

    fn annotate(&self, meta: &mut ObjectMeta, holding: bool) {
        let ann = meta.annotations.get_or_insert_with(BTreeMap::new);
        for (k, v) in &self.annotations {
            match v.as_ref().filter(|_| holding) {
                Some(v) => ann.insert(k.clone(), v.clone()),
                None => ann.remove(k),
            };
        }
    }
}

/// One round of the election: creates, renews or takes the Lease when this replica may.
/// Returns whether this replica holds it now. Writes go through the Lease's resourceVersion,
/// so of two candidates taking an expired Lease at once, one gets a conflict and stands by.
pub async fn contend(api: &Api<Lease>, e: &Election, seen: &mut Seen) -> kube::Result<bool> {
    contend_fit(api, e, seen, true).await
}

/// What a candidate keeps between rounds: the holder and renewal it last saw (to tell a
/// silent holder), and the Lease as its own last write left it while it holds it.
#[derive(Debug, Default)]
pub struct Seen {
    observed: Observed,
    /// Renewing from this copy takes one request instead of a read and a write: its
    /// resourceVersion makes the write fail if anyone wrote since, and then the round reads.
    ours: Option<Lease>,
}

/// Renews `ours` (the Lease as this replica's last write left it) without reading it first.
/// None when someone wrote it since (or removed it): the round must read it.
async fn renew_unread(
    api: &Api<Lease>,
    e: &Election,
    mut ours: Lease,
) -> kube::Result<Option<Lease>> {
    let spec = ours.spec.get_or_insert_with(Default::default);
    spec.renew_time = Some(MicroTime(Timestamp::now()));
    spec.lease_duration_seconds = Some(lease_seconds(e.duration));
    e.annotate(&mut ours.metadata, true);
    match api.replace(&e.lease, &PostParams::default(), &ours).await {
        Ok(l) => Ok(Some(l)),
        Err(ref err) if crate::meta::is_conflict(err) || crate::meta::is_not_found(err) => Ok(None),
        Err(err) => Err(err),
    }
}

/// [`contend`] for a replica that may be unable to do the work: when not `fit` it takes
/// nothing, and hands the Lease over (as [`release`] does) when it holds it.
pub async fn contend_fit(
    api: &Api<Lease>,
    e: &Election,
    seen: &mut Seen,
    fit: bool,
) -> kube::Result<bool> {
    // A holder's renewal, the common round, writes without reading: the write is refused
    // unless the Lease is still as this replica left it, that is, still its own.
    if let Some(ours) = seen.ours.take().filter(|_| fit)
        && let Some(renewed) = renew_unread(api, e, ours).await?
    {
        seen.ours = Some(renewed);
        return Ok(true);
    }
    let stamp = MicroTime(Timestamp::now());
    let Some(mut lease) = api.get_opt(&e.lease).await? else {
        if !fit {
            return Ok(false);
        }
        let mut lease = Lease {
            metadata: ObjectMeta {
                name: Some(e.lease.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(e.identity.clone()),
                lease_duration_seconds: Some(lease_seconds(e.duration)),
                acquire_time: Some(stamp.clone()),
                renew_time: Some(stamp),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        e.annotate(&mut lease.metadata, true);
        return match api.create(&PostParams::default(), &lease).await {
            Ok(l) => {
                seen.ours = Some(l);
                Ok(true)
            }
            Err(ref e) if crate::meta::is_conflict(e) => Ok(false),
            Err(err) => Err(err),
        };
    };
    let spec = lease.spec.take().unwrap_or_default();
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let renewed = spec
        .renew_time
        .as_ref()
        .map(|t| t.0.to_string())
        .unwrap_or_default();
    let now = std::time::Instant::now();
    seen.observed.observe(&holder, &renewed, now);
    // The holder's own duration counts, not ours: replicas may run with different flags.
    let duration = spec.lease_duration_seconds.map_or(e.duration, |s| {
        Duration::from_secs(s.max(0).unsigned_abs().into())
    });
    let taking = match verdict(
        &e.identity,
        Some(&holder),
        &seen.observed,
        duration,
        fit,
        now,
    ) {
        Verdict::Standby => return Ok(false),
        Verdict::Release => {
            lease.spec = Some(spec);
            hand_over(api, e, lease).await?;
            warn!(lease = %e.lease, identity = %e.identity, "unfit for the work: handed the Lease over");
            return Ok(false);
        }
        Verdict::Renew => false,
        Verdict::Take => true,
    };
    lease.spec = Some(LeaseSpec {
        holder_identity: Some(e.identity.clone()),
        lease_duration_seconds: Some(lease_seconds(e.duration)),
        acquire_time: if taking {
            Some(stamp.clone())
        } else {
            spec.acquire_time.clone()
        },
        renew_time: Some(stamp),
        lease_transitions: Some(spec.lease_transitions.unwrap_or(0) + i32::from(taking)),
        ..spec
    });
    e.annotate(&mut lease.metadata, true);
    match api.replace(&e.lease, &PostParams::default(), &lease).await {
        Ok(l) => {
            if taking {
                info!(lease = %e.lease, previous = %holder, "took over the Lease");
            }
            seen.ours = Some(l);
            Ok(true)
        }
        // Someone else wrote first (took it, or renewed just now): theirs.
        Err(ref e) if crate::meta::is_conflict(e) => Ok(false),
        Err(err) => Err(err),
    }
}

/// Competes for the Lease for as long as it runs; `leading` says whether this replica holds
/// it. A holder that gets no renewal accepted for `renew_deadline` (the API cut off, or too
/// slow) stops leading at that moment, before a standby may take over: two replicas never act
/// as the holder at once, at the price that an API outage stops the work too.
pub async fn elect(api: Api<Lease>, e: Election, leading: watch::Sender<bool>) {
    let (_fit, always) = watch::channel(true);
    elect_fit(api, e, leading, always).await
}

/// [`elect`] for a replica whose fitness for the work (`fit`) can change: while it is false
/// the replica hands the Lease over and takes nothing.
///
/// The outcome of the first round the API answers is always sent, also when it is `false`
/// as before: a receiver that waits for `leading.changed()` once learns when the election
/// has decided, so that a restarted holder does not act as a standby (and undo its work)
/// for the moment before its first renewal.
pub async fn elect_fit(
    api: Api<Lease>,
    e: Election,
    leading: watch::Sender<bool>,
    mut fit: watch::Receiver<bool>,
) {
    let mut seen = Seen::default();
    let mut tenure = Tenure::default();
    let mut tick = tokio::time::interval(e.retry);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut fit_open = true;
    // Waits until the tenure ends (forever when not leading).
    let tenure_end = |t: &Tenure| {
        let end = t.ends(e.renew_deadline);
        async move {
            match end {
                Some(end) => tokio::time::sleep_until(end.into()).await,
                None => std::future::pending().await,
            }
        }
    };
    let mut decided = false;
    let publish = |now: bool| {
        leading.send_if_modified(|was| {
            if *was == now {
                return false;
            }
            if now {
                info!(identity = %e.identity, lease = %e.lease, "active: this replica holds the Lease");
            } else {
                info!(identity = %e.identity, lease = %e.lease, "standby: this replica does not hold the Lease");
            }
            *was = now;
            true
        })
    };
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = tenure_end(&tenure) => {}
            r = fit.changed(), if fit_open => fit_open = r.is_ok(),
        }
        let sent = std::time::Instant::now();
        let is_fit = *fit.borrow_and_update();
        let was_leading = tenure.leading(e.renew_deadline, sent);
        // The moment the tenure ends (or the replica turns unfit), not after this round.
        publish(was_leading && is_fit);
        let answered = if was_leading {
            // A request the API never answers must not outlast the tenure.
            let round = contend_fit(&api, &e, &mut seen, is_fit);
            tokio::select! {
                r = tokio::time::timeout(e.renew_deadline, round) => record(&mut tenure, sent, r, &e),
                () = tenure_end(&tenure) => {
                    warn!(lease = %e.lease, "no renewal accepted within the renew deadline: stepping down");
                    true
                }
            }
        } else {
            let round = contend_fit(&api, &e, &mut seen, is_fit);
            record(
                &mut tenure,
                sent,
                tokio::time::timeout(e.duration, round).await,
                &e,
            )
        };
        // An unfit holder whose hand-over failed still holds the Lease, but does not lead.
        let now = tenure.leading(e.renew_deadline, std::time::Instant::now()) && is_fit;
        if !publish(now) && !decided && answered {
            // Unchanged (a standby): said anyway, once the API has answered.
            leading.send_replace(now);
        }
        decided |= answered;
    }
}

/// Notes the outcome of one round, sent at `sent`; whether the API answered it.
fn record(
    tenure: &mut Tenure,
    sent: std::time::Instant,
    r: Result<kube::Result<bool>, tokio::time::error::Elapsed>,
    e: &Election,
) -> bool {
    match r {
        Ok(Ok(true)) => tenure.renewed(sent),
        Ok(Ok(false)) => tenure.ended(),
        Ok(Err(err)) => {
            warn!(error = %err, lease = %e.lease, "Lease");
            return false;
        }
        Err(_) => {
            warn!(lease = %e.lease, "Lease: no answer from the API");
            return false;
        }
    }
    true
}

/// Hands the Lease back on a clean shutdown, so a standby takes over at once instead of after
/// leaseDurationSeconds. Does nothing when another replica holds it.
pub async fn release(api: &Api<Lease>, e: &Election) -> kube::Result<()> {
    let Some(mut lease) = api.get_opt(&e.lease).await? else {
        return Ok(());
    };
    let spec = lease.spec.get_or_insert_with(Default::default);
    if spec.holder_identity.as_deref() != Some(e.identity.as_str()) {
        return Ok(());
    }
    hand_over(api, e, lease).await
}

/// Writes `lease` (held by this replica, as read) back without a holder.
async fn hand_over(api: &Api<Lease>, e: &Election, mut lease: Lease) -> kube::Result<()> {
    let spec = lease.spec.get_or_insert_with(Default::default);
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(MicroTime(Timestamp::now()));
    e.annotate(&mut lease.metadata, false);
    api.replace(&e.lease, &PostParams::default(), &lease)
        .await
        .map(|_| ())
}

/// How [`run_while_leading`] ended.
#[derive(Debug)]
pub enum Led<T> {
    /// The work finished (with its output) while this replica led.
    Done(T),
    /// This replica stopped leading (another replica took the Lease, or no renewal was
    /// accepted within the renew deadline): the work was dropped.
    Lost,
    /// Stopped (`stop` resolved: SIGTERM or SIGINT) before or during the work.
    Interrupted,
}

/// Runs `work` only while this replica holds the Lease: waits as a standby until it leads,
/// drops the work as soon as it stops leading (another holder, or no renewal accepted within
/// the renew deadline), and releases the Lease when it ends. Once `stop` resolves it ends
/// whatever state it is in: a standby at once; a leader gives its work up to the renew
/// deadline to finish (still leading meanwhile), then drops it. Either releases the Lease if
/// it holds it, waiting at most the renew deadline for an API that may be gone.
/// Work that keeps state (an allocator) should exit on [`Led::Lost`] and restart from the
/// API, rather than carry on from a copy that another leader may have made stale.
pub async fn run_while_leading<F: Future>(
    api: Api<Lease>,
    e: Election,
    work: F,
    stop: impl Future<Output = ()>,
) -> Led<F::Output> {
    let mut stop = std::pin::pin!(stop);
    let (tx, mut leading) = watch::channel(false);
    let elector = tokio::spawn(elect(api.clone(), e.clone(), tx));
    info!(lease = %e.lease, identity = %e.identity, "waiting to lead");
    let waited = async {
        while !*leading.borrow_and_update() {
            if leading.changed().await.is_err() {
                return false;
            }
        }
        true
    };
    let led = tokio::select! {
        led = waited => led,
        () = &mut stop => false,
    };
    if !led {
        elector.abort();
        // The elector may have taken the Lease just now.
        release_within(&api, &e).await;
        return Led::Interrupted;
    }
    info!(lease = %e.lease, "leading");
    let mut work = std::pin::pin!(work);
    let lost = |leading: &mut watch::Receiver<bool>| {
        let mut leading = leading.clone();
        async move {
            loop {
                if leading.changed().await.is_err() || !*leading.borrow() {
                    return;
                }
            }
        }
    };
    let mut out = tokio::select! {
        r = &mut work => Led::Done(r),
        () = lost(&mut leading) => Led::Lost,
        () = &mut stop => Led::Interrupted,
    };
    if matches!(out, Led::Interrupted) {
        info!(lease = %e.lease, grace = ?e.renew_deadline, "stopping: the work has the renew deadline to finish");
        out = tokio::select! {
            r = &mut work => Led::Done(r),
            () = lost(&mut leading) => Led::Interrupted,
            () = tokio::time::sleep(e.renew_deadline) => Led::Interrupted,
        };
    }
    elector.abort();
    release_within(&api, &e).await;
    out
}

/// [`release`], given up after the renew deadline (an API server that went away must not
/// hold a shutdown up; the Lease then expires on its own).
async fn release_within(api: &Api<Lease>, e: &Election) {
    match tokio::time::timeout(e.renew_deadline, release(api, e)).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => warn!(error = %err, lease = %e.lease, "releasing the Lease"),
        Err(_) => warn!(lease = %e.lease, "releasing the Lease: no answer from the API"),
    }
}

/// Runs the work `start` makes (controllers, ...) only while this replica holds the Lease
/// `e.lease`: a standby waits; a leader that stops leading (another holder, or no renewal
/// accepted within the renew deadline) drops the work and waits again, and starts it afresh
/// when it leads again, never carrying on from a copy that another leader may have made
/// stale. Returns the work's result when it ends while leading, or `Ok` after SIGTERM or
/// SIGINT, whichever state this replica is in then (see [`run_while_leading`]).
pub async fn run_elected<F, W, T, E>(api: Api<Lease>, e: Election, mut start: F) -> Result<T, E>
where
    F: FnMut() -> W,
    W: Future<Output = Result<T, E>>,
    T: Default,
{
    // One signal handler for the whole run: a signal that comes while the work is being
    // dropped (leadership lost) still stops the next round.
    let (stopped_tx, stopped) = watch::channel(false);
    let signal = tokio::spawn(async move {
        crate::controller::shutdown_signal().await;
        info!("signal received: stopping");
        stopped_tx.send_replace(true);
    });
    let _abort = AbortOnDrop(signal);
    loop {
        let mut stopped = stopped.clone();
        let stop = async move {
            // Sender dropped only with the task: then no signal can come any more.
            if stopped.wait_for(|s| *s).await.is_err() {
                std::future::pending::<()>().await
            }
        };
        match run_while_leading(api.clone(), e.clone(), start(), stop).await {
            Led::Done(r) => return r,
            Led::Interrupted => return Ok(T::default()),
            Led::Lost => warn!(
                lease = %e.lease,
                "stopped leading: the work is dropped until this replica leads again"
            ),
        }
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holder_keeps_its_annotations_and_removes_them_on_release() {
        let mut e = Election::new("l", "gw-0");
        e.annotations
            .insert("example.io/ip".into(), Some("10.0.0.1".into()));
        e.annotations.insert("example.io/gone".into(), None);
        let mut meta = ObjectMeta {
            annotations: Some(BTreeMap::from([
                ("example.io/gone".into(), "x".into()),
                ("other".into(), "kept".into()),
            ])),
            ..Default::default()
        };
        e.annotate(&mut meta, true);
        let ann = meta.annotations.clone().unwrap();
        assert_eq!(
            ann.get("example.io/ip").map(String::as_str),
            Some("10.0.0.1")
        );
        assert!(!ann.contains_key("example.io/gone"));
        assert_eq!(ann.get("other").map(String::as_str), Some("kept"));
        e.annotate(&mut meta, false);
        let ann = meta.annotations.unwrap();
        assert!(!ann.contains_key("example.io/ip"));
        assert_eq!(ann.len(), 1);
    }
}
