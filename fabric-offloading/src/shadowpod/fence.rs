//! At-most-once on the provider, the I/O edge of [`super::partition`]: follows the consumers'
//! heartbeat Leases and the terms agreed in their slices' status, tells the ShadowPod
//! controller which consumers have been silent too long (live, at each reconcile) and when a
//! consumer turns silent (a trigger to reconcile its ShadowPods), and stops a ShadowPod's pod
//! ([`enforce`], called by the controller before anything else it decides).
use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use fabric_api::{
    authentication::v1alpha1::ResourceSlice,
    names,
    offloading::v1alpha1::{ShadowPod, shadow_pod_condition::PARTITIONED},
};
use fabric_kube::{
    cache,
    events::{Event, Events},
    meta,
    status::FieldManager,
};
use futures::StreamExt;
use k8s_openapi::{
    api::{coordination::v1::Lease, core::v1::Pod},
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt,
    runtime::{WatchStreamExt, watcher},
};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::{
    decide,
    partition::{self, Heartbeats, InForce, Verdict},
};

#[derive(Default)]
struct State {
    terms: BTreeMap<String, InForce>,
    heartbeats: Heartbeats,
}

/// What the ShadowPod controller asks: has a consumer been silent too long?
#[derive(Clone)]
pub struct Fences {
    state: Arc<Mutex<State>>,
    client: Client,
}

impl Fences {
    /// The verdict on `consumer` now, as the watch has seen its heartbeat.
    pub fn verdict(&self, consumer: &str) -> Verdict {
        let ns = partition::tenant_namespace(consumer);
        let s = self.state.lock().expect("fence state poisoned");
        partition::verdict(
            s.terms.get(&ns).copied(),
            &s.heartbeats,
            &ns,
            Instant::now(),
        )
    }

    /// [`Fences::verdict`] once the heartbeat is read afresh, for a stop (which cannot be
    /// undone): the Lease watch and the ShadowPod watch are separate streams, and a consumer
    /// back from a partition renews before it makes pods, so a ShadowPod seen before that
    /// renewal's watch event must not be stopped for a silence that has already ended.
    pub async fn confirmed(&self, consumer: &str) -> kube::Result<Verdict> {
        let seen = self.verdict(consumer);
        if !matches!(seen, Verdict::Stop { .. }) {
            return Ok(seen);
        }
        let ns = partition::tenant_namespace(consumer);
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &ns);
        if let Some(l) = leases.get_opt(names::lease::CONSUMER).await? {
            let age = written_ago(&l, Timestamp::now());
            let version = l.resource_version().unwrap_or_default();
            let mut s = self.state.lock().expect("fence state poisoned");
            s.heartbeats.observe(&ns, &version, age, Instant::now());
        }
        Ok(self.verdict(consumer))
    }
}

/// How long ago this cluster's API server last wrote `lease` (by its managedFields times);
/// zero when it does not say or says the future.
fn written_ago(lease: &Lease, now: Timestamp) -> Duration {
    lease
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.time.as_ref())
        .map(|t| t.0)
        .max()
        .and_then(|t| Duration::try_from(now.duration_since(t)).ok())
        .unwrap_or_default()
}

/// Follows the heartbeats and the agreed terms; returns what the controller asks and a
/// stream of the tenant namespaces whose consumers have just turned silent.
pub fn spawn(client: Client) -> (Fences, mpsc::UnboundedReceiver<String>) {
    let fences = Fences {
        state: Arc::default(),
        client: client.clone(),
    };
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(follow(client, fences.clone(), tx));
    (fences, rx)
}

async fn follow(client: Client, fences: Fences, tx: mpsc::UnboundedSender<String>) {
    let leases: Api<Lease> = Api::all(client.clone());
    let heartbeats = watcher(
        leases,
        watcher::Config::default().fields(&format!("metadata.name={}", names::lease::CONSUMER)),
    )
    .default_backoff();
    let (slices, slice_events) = cache::events(
        Api::<ResourceSlice>::all(client),
        watcher::Config::default(),
    );
    let mut heartbeats = std::pin::pin!(heartbeats);
    let mut slice_events = std::pin::pin!(slice_events);
    // Leases seen in a (re)list: those not in it are gone.
    let mut relisted: Option<BTreeSet<String>> = None;
    let mut silent: BTreeSet<String> = BTreeSet::new();
    let mut next: Option<Instant> = None;
    loop {
        let wake = next.map(tokio::time::Instant::from_std);
        tokio::select! {
            ev = heartbeats.next() => {
                let Some(ev) = ev else { return };
                let now = Instant::now();
                let mut s = fences.state.lock().expect("fence state poisoned");
                match ev {
                    Ok(watcher::Event::Init) => relisted = Some(BTreeSet::new()),
                    Ok(watcher::Event::InitApply(l)) => {
                        let ns = l.namespace().unwrap_or_default();
                        let age = written_ago(&l, Timestamp::now());
                        s.heartbeats.observe(&ns, &l.resource_version().unwrap_or_default(), age, now);
                        relisted.get_or_insert_default().insert(ns);
                    }
                    Ok(watcher::Event::InitDone) => {
                        s.heartbeats.keep_only(&relisted.take().unwrap_or_default());
                    }
                    Ok(watcher::Event::Apply(l)) => {
                        let ns = l.namespace().unwrap_or_default();
                        s.heartbeats.observe(&ns, &l.resource_version().unwrap_or_default(), Duration::ZERO, now);
                    }
                    Ok(watcher::Event::Delete(l)) => s.heartbeats.forget(&l.namespace().unwrap_or_default()),
                    Err(e) => warn!(error = %e, "watching consumers' heartbeats"),
                }
            }
            ev = slice_events.next() => {
                match ev {
                    None => return,
                    Some(Err(e)) => warn!(error = %e, "watching ResourceSlices (at-most-once terms)"),
                    Some(Ok(_)) => {
                        let all = slices.state();
                        let agreed = partition::terms_by_namespace(all.iter().map(|s| s.as_ref()));
                        let mut s = fences.state.lock().expect("fence state poisoned");
                        s.terms = partition::in_force(&s.terms, agreed, Instant::now());
                    }
                }
            }
            () = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {}
        }
        let (verdicts, upcoming) = {
            let s = fences.state.lock().expect("fence state poisoned");
            partition::verdicts(&s.terms, &s.heartbeats, Instant::now())
        };
        next = upcoming;
        let now_silent: BTreeSet<String> = verdicts
            .into_iter()
            .filter(|(_, v)| matches!(v, Verdict::Stop { .. }))
            .map(|(ns, _)| ns)
            .collect();
        for ns in now_silent.difference(&silent) {
            info!(tenant_namespace = %ns, "the consumer's heartbeat stopped: stopping its pods (at-most-once)");
            if tx.send(ns.clone()).is_err() {
                return;
            }
        }
        for ns in silent.difference(&now_silent) {
            info!(tenant_namespace = %ns, "the consumer's heartbeat is back");
        }
        silent = now_silent;
    }
}

async fn delete(pods: &Api<Pod>, p: &Pod, grace: u32) -> kube::Result<()> {
    let only_this = meta::only_uid(p.metadata.uid.clone(), Some(grace));
    meta::delete(pods, &p.name_any(), &only_this).await?;
    Ok(())
}

/// At-most-once, before the controller decides anything else about `shadow` (read afresh)
/// and its `pod`: a ShadowPod stopped for a partition stays stopped (its pod goes if it is
/// still there), and one whose consumer is silent too long is stopped now: status first
/// (so that nothing re-creates the pod, even after a crash here), then the pod, with the
/// agreed grace period. True when it dealt with the ShadowPod.
pub async fn enforce(
    fences: &Fences,
    events: &Events,
    status: &FieldManager,
    shadows: &Api<ShadowPod>,
    pods: &Api<Pod>,
    shadow: &ShadowPod,
    pod: Option<&Pod>,
) -> kube::Result<bool> {
    let prev = shadow.status.clone().unwrap_or_default();
    let name = shadow.name_any();
    let own = pod.filter(|p| decide::owned_by(p, shadow));
    if partition::partitioned(&prev) {
        // Late already: no grace left to give. The status says how it ended: the pod may go.
        match own {
            Some(p) if p.metadata.deletion_timestamp.is_none() => delete(pods, p, 0).await?,
            Some(p) => super::controller::hold_pod(pods, p, false).await?,
            None => {}
        }
        return Ok(true);
    }
    let pod_phase = own.and_then(|p| p.status.as_ref()?.phase.as_deref());
    if decide::terminal(prev.phase.as_deref()) || decide::terminal(pod_phase) {
        // It ended by itself: reported as it ended.
        return Ok(false);
    }
    let Verdict::Stop { silent, terms } = fences.confirmed(&shadow.spec.cluster_id).await? else {
        return Ok(false);
    };
    let stopped = partition::stopped(
        &prev,
        silent,
        terms,
        shadow.metadata.generation,
        Timestamp::now(),
    );
    status.apply_status(shadows, &name, &stopped).await?;
    if let Some(p) = own.filter(|p| p.metadata.deletion_timestamp.is_none()) {
        let grace = partition::stop_grace(
            terms,
            p.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds),
        );
        delete(pods, p, grace).await?;
        debug!(shadowpod = %name, grace, "pod deleted");
    }
    info!(
        shadowpod = %format!("{}/{name}", shadow.namespace().unwrap_or_default()),
        silent_secs = silent.as_secs(),
        "stopped: the consumer is silent beyond the at-most-once partition time"
    );
    events
        .publish(
            shadow,
            &Event::warning(
                PARTITIONED,
                "Stop",
                stopped.message.clone().unwrap_or_default(),
            ),
        )
        .await;
    Ok(true)
}
