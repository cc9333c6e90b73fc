//! [`Reflection`]: the kinds registered in a process, started and stopped per namespace
//! pair.
use std::{collections::BTreeMap, sync::Arc};

use fabric_kube::events::Events;
use kube::Client;
use tokio::{
    sync::{oneshot, watch},
    task::JoinHandle,
};
use tracing::{error, info};

use crate::{
    edge::{self, Ended, Inputs, Options, Shared},
    gate::Reachability,
    key::Pair,
    kind::{Endpoint, Kind},
    metrics::Metrics,
};

/// A registered kind, its type erased.
trait Start: Send + Sync {
    fn name(&self) -> &'static str;
    fn start(&self, pair: Pair, inputs: Inputs, stop: oneshot::Receiver<()>) -> Task;
}

type Task = JoinHandle<Result<(), Ended>>;

impl<K: Kind> Start for Arc<Shared<K>> {
    fn name(&self) -> &'static str {
        K::NAME
    }

    fn start(&self, pair: Pair, inputs: Inputs, stop: oneshot::Receiver<()>) -> Task {
        tokio::spawn(edge::run(self.clone(), pair, inputs, stop))
    }
}

/// The reflectors of one pair, one per kind.
struct Running {
    stops: Vec<oneshot::Sender<()>>,
    tasks: Vec<Task>,
}

/// The reflection of one home cluster into one remote cluster: the kinds registered, each
/// running for every pair started. Dropping it stops them all.
pub struct Reflection {
    home: Client,
    events: Events,
    metrics: Arc<Metrics>,
    inputs: Inputs,
    kinds: Vec<Box<dyn Start>>,
    running: std::sync::Mutex<BTreeMap<Pair, Running>>,
    failed: watch::Sender<Option<String>>,
}

impl Reflection {
    /// Reflection from `home` (Events about home objects published with `events`) into the
    /// remote cluster `remote` gives (replaced whenever the identity changes; `None` while
    /// there is none), while `reachability` says whether it answers.
    pub fn new(
        home: Client,
        events: Events,
        metrics: Arc<Metrics>,
        remote: watch::Receiver<Option<Endpoint>>,
        reachability: watch::Receiver<Reachability>,
    ) -> Self {
        Self {
            home,
            events,
            metrics,
            inputs: Inputs {
                remote,
                reachability,
            },
            kinds: Vec::new(),
            running: Default::default(),
            failed: watch::channel(None).0,
        }
    }

    /// Adds `kind` to what every pair started from now on reflects; with `workers` 0, the
    /// kind is not reflected at all.
    pub fn register<K: Kind>(&mut self, kind: K, options: Options) -> &mut Self {
        if options.workers == 0 {
            info!(kind = K::NAME, "no workers: not reflected");
            return self;
        }
        let metrics = self.metrics.of(&kind.label());
        self.kinds.push(Box::new(Arc::new(Shared {
            kind,
            home: self.home.clone(),
            events: self.events.clone(),
            metrics,
            options,
        })));
        self
    }

    /// Starts every registered kind on `pair`; `false` if it runs already.
    pub fn start(&self, pair: Pair) -> bool {
        let mut running = self.running();
        if running.contains_key(&pair) {
            return false;
        }
        let (mut stops, mut tasks) = (Vec::new(), Vec::new());
        for k in &self.kinds {
            let (tx, rx) = oneshot::channel();
            let task = k.start(pair.clone(), self.inputs.clone(), rx);
            stops.push(tx);
            tasks.push(self.watched(k.name(), task));
        }
        running.insert(pair, Running { stops, tasks });
        true
    }

    /// Stops `pair`: its watches end, syncs under way finish, nothing more is reflected for
    /// it. Returns once that is done; `false` if it did not run. What it reflected stays.
    pub async fn stop(&self, pair: &Pair) -> bool {
        let Some(r) = self.running().remove(pair) else {
            return false;
        };
        for s in r.stops {
            let _ = s.send(());
        }
        for t in r.tasks {
            let _ = t.await;
        }
        true
    }

    /// The pairs running.
    pub fn pairs(&self) -> Vec<Pair> {
        self.running().keys().cloned().collect()
    }

    /// Waits until a reflector ends by itself (an input it needs is gone), and says why.
    pub async fn failure(&self) -> String {
        let mut rx = self.failed.subscribe();
        let failed = rx.wait_for(Option::is_some).await;
        match failed {
            Ok(why) => why.clone().unwrap_or_default(),
            // Unreachable while `self` holds the sender.
            Err(_) => "reflection dropped".to_owned(),
        }
    }

    /// The metrics of the kinds registered.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    fn running(&self) -> std::sync::MutexGuard<'_, BTreeMap<Pair, Running>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `task`, reporting its end by itself to [`Reflection::failure`].
    fn watched(&self, kind: &'static str, task: Task) -> Task {
        let failed = self.failed.clone();
        tokio::spawn(async move {
            let r = match task.await {
                Ok(r) => r,
                Err(e) if e.is_cancelled() => Ok(()),
                Err(e) => {
                    let why = format!("the {kind} reflector panicked: {e}");
                    error!("{why}");
                    failed.send_replace(Some(why));
                    return Ok(());
                }
            };
            if let Err(e) = &r {
                error!(error = %e, "a reflector ended");
                failed.send_replace(Some(e.to_string()));
            }
            r
        })
    }
}

impl Drop for Reflection {
    fn drop(&mut self) {
        // The loops end when their stop sender goes: syncs under way finish on their own.
        self.running().clear();
    }
}
