//! The generic edge: one loop per (kind, pair) keeping both sides' watch caches, its work
//! queue and retries, and running the syncs ([`crate::sync`]) side by side. The guarantees
//! it gives are listed in the crate's documentation.
use std::{
    collections::{HashMap, HashSet},
    pin::pin,
    sync::Arc,
    time::{Duration, Instant},
};

use fabric_kube::{cache, events::Events, written::Writes};
use futures::{
    FutureExt as _, Stream, StreamExt as _,
    future::BoxFuture,
    stream::{BoxStream, FuturesUnordered, SelectAll},
};
use kube::{
    Api, Client,
    runtime::{
        reflector::{ObjectRef, Store},
        watcher,
    },
};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::time::{DelayQueue, delay_queue};
use tracing::{debug, info, warn};

use crate::{
    gate::{Gate, Reachability, RemoteCache},
    key::{Key, Pair},
    kind::{Endpoint, Kind, Next, everywhere, namespaced, owned},
    metrics::{KindMetrics, Share},
    queue::{Queue, Retries},
    sync::{self, Snapshot},
};

/// What a kind is registered with: its workers and resync period, and what else resyncs it.
#[derive(Clone)]
pub struct Options {
    /// Keys synced at the same time, per pair (each sync a few calls to either API).
    pub workers: usize,
    /// How often every key is looked at again besides the watches' events (and orphans
    /// looked for).
    pub resync: Duration,
    pub(crate) triggers: Vec<Trigger>,
}

impl Options {
    pub fn new(workers: usize, resync: Duration) -> Self {
        Self {
            workers,
            resync,
            triggers: Vec::new(),
        }
    }

    /// Every key is looked at again whenever `rx`'s value changes (an input of the kind's
    /// decisions that no watch of the edge shows, such as the remap of addresses).
    pub fn resync_on<T: Send + Sync + 'static>(mut self, rx: watch::Receiver<T>) -> Self {
        self.triggers.push(Trigger::on(rx));
        self
    }
}

/// A change that resyncs every key: a stream of `()` per change, made anew for each pair.
#[derive(Clone)]
pub(crate) struct Trigger(Arc<dyn Fn() -> BoxStream<'static, ()> + Send + Sync>);

impl Trigger {
    fn on<T: Send + Sync + 'static>(rx: watch::Receiver<T>) -> Self {
        Trigger(Arc::new(move || {
            let mut rx = rx.clone();
            rx.mark_unchanged();
            futures::stream::unfold(rx, |mut rx| async move {
                rx.changed().await.ok()?;
                Some(((), rx))
            })
            .boxed()
        }))
    }
}

/// What every pair of every kind is fed with.
#[derive(Clone)]
pub(crate) struct Inputs {
    pub remote: watch::Receiver<Option<Endpoint>>,
    pub reachability: watch::Receiver<Reachability>,
}

/// A kind as registered: shared by its pairs.
pub(crate) struct Shared<K: Kind> {
    pub kind: K,
    pub home: Client,
    pub events: Events,
    pub metrics: KindMetrics,
    pub options: Options,
}

/// Why a pair's loop ended without being stopped.
#[derive(Debug, thiserror::Error)]
pub enum Ended {
    #[error("{kind} {pair}: the home watch ended")]
    HomeWatch { kind: &'static str, pair: Pair },
    #[error("{kind} {pair}: whoever gives the remote client is gone")]
    Endpoint { kind: &'static str, pair: Pair },
    #[error("{kind} {pair}: whoever tells whether the remote answers is gone")]
    Reachability { kind: &'static str, pair: Pair },
}

/// The remote side of a pair on one client: its cache of the pair's remote namespace.
pub(crate) struct RemoteSide<K: Kind> {
    pub endpoint: Endpoint,
    pub namespace: String,
    pub store: Store<K::Remote>,
    /// The remote objects' run-time type ([`Kind::remote_type`]).
    pub dt: <K::Remote as kube::Resource>::DynamicType,
}

impl<K: Kind> RemoteSide<K> {
    pub fn listed(&self) -> bool {
        matches!(self.store.wait_until_ready().now_or_never(), Some(Ok(())))
    }

    /// The remote object `name` as listed (`None`: not listed yet).
    pub fn lookup(&self, name: &str) -> Option<Option<Arc<K::Remote>>> {
        self.listed().then(|| {
            self.store
                .get(&ObjectRef::new_with(name, self.dt.clone()).within(&self.namespace))
        })
    }

    pub fn api(&self) -> Api<K::Remote> {
        namespaced(self.endpoint.client.clone(), &self.namespace, &self.dt)
    }
}

/// A pair's state the syncs share with its loop.
pub(crate) struct PairState<K: Kind> {
    pub shared: Arc<Shared<K>>,
    pub pair: Pair,
    pub home: Store<K::Home>,
    pub writes: Writes<Key, K::Home>,
    /// Keys whose remote object is someone else's, already told at home.
    pub foreign: std::sync::Mutex<HashSet<Key>>,
}

/// A watch keeping its cache from a task of its own, so that the cache is as fresh as the API
/// allows however busy the loop is; the keys of the objects it touches come through `keys`.
/// Stopped when dropped.
struct Watch {
    keys: mpsc::UnboundedReceiver<Key>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Watch {
    /// Drives `stream` (a reflector's), sending the key of every object it touches, per
    /// `key_of`; its errors go to `failed` (the watch retries with back-off).
    fn drive<O, S>(
        stream: S,
        key_of: impl Fn(&O) -> Option<Key> + Send + 'static,
        failed: impl Fn(&watcher::Error) + Send + 'static,
    ) -> Self
    where
        O: Send + 'static,
        S: Stream<Item = Result<O, watcher::Error>> + Send + 'static,
    {
        let (tx, keys) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            let mut stream = pin!(stream);
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(o) => {
                        if let Some(k) = key_of(&o)
                            && tx.send(k).is_err()
                        {
                            return;
                        }
                    }
                    Err(e) => failed(&e),
                }
            }
        });
        Self { keys, task }
    }
}

/// The next key `watch` sends; `None` once it ended, never while there is no watch.
async fn next_key(watch: &mut Option<Watch>) -> Option<Key> {
    match watch {
        Some(w) => w.keys.recv().await,
        None => std::future::pending().await,
    }
}

/// A cache and watch of the pair's remote namespace through `endpoint`, and a future that
/// ends once the cache has listed.
fn remote_side<K: Kind>(
    shared: &Arc<Shared<K>>,
    pair: &Pair,
    endpoint: Endpoint,
) -> (Arc<RemoteSide<K>>, Watch, BoxFuture<'static, ()>) {
    let namespace = pair.remote_namespace(&endpoint.client).to_owned();
    let dt = shared.kind.remote_type();
    let api: Api<K::Remote> = namespaced(endpoint.client.clone(), &namespace, &dt);
    let (store, stream) = cache::touched_with(api, shared.kind.watch_remote(), dt.clone());
    let (kind, p) = (shared.clone(), pair.clone());
    let watch = Watch::drive(
        stream,
        move |r| kind.kind.key_of(&p, r),
        // The remote cluster out of reach is common and said elsewhere (the virtual
        // kubelet: its node's condition).
        |e| debug!(kind = K::NAME, error = %e, "watching the remote cluster"),
    );
    let listed = {
        let store = store.clone();
        async move {
            let _ = store.wait_until_ready().await;
        }
        .boxed()
    };
    let side = RemoteSide {
        endpoint,
        namespace,
        store,
        dt,
    };
    (Arc::new(side), watch, listed)
}

/// The keys of the remote objects of ours whose home object is gone as far as the home cache
/// knows ([`Kind::orphaned`]): their syncs delete them once a fresh read confirms.
pub(crate) fn orphans<K: Kind>(
    kind: &K,
    pair: &Pair,
    side: &RemoteSide<K>,
    home: &Store<K::Home>,
) -> Vec<Key> {
    let dt = kind.home_type();
    side.store
        .state()
        .iter()
        .filter(|r| owned(kind, &side.endpoint.marks, r))
        .filter_map(|r| {
            let k = kind.key_of(pair, r)?;
            let h = home.get(&ObjectRef::new_with(&k.name, dt.clone()).within(&k.namespace));
            kind.orphaned(r, h.as_deref()).then_some(k)
        })
        .collect()
}

/// A pair's bookkeeping: the keys queued, the retries pending, the remote side in use.
struct Loop<K: Kind> {
    state: Arc<PairState<K>>,
    remote: Option<Arc<RemoteSide<K>>>,
    remote_watch: Option<Watch>,
    queue: Queue<Key>,
    retries: Retries<Key>,
    delays: DelayQueue<Key>,
    delayed: HashMap<Key, delay_queue::Key>,
    /// Keys the periodic look found orphaned: their next sync deletes them (if a fresh read
    /// at home agrees).
    swept: HashSet<Key>,
    share: Share,
}

impl<K: Kind> Loop<K> {
    fn gate(&self, reachability: Reachability) -> Gate {
        Gate {
            home_listed: matches!(
                self.state.home.wait_until_ready().now_or_never(),
                Some(Ok(()))
            ),
            remote: match &self.remote {
                None => RemoteCache::NoClient,
                Some(s) if s.listed() => RemoteCache::Listed,
                Some(_) => RemoteCache::Listing,
            },
            reachability,
        }
    }

    /// The next key to sync, and what its sync is to know.
    fn next(&mut self, gate: Gate) -> Option<(Key, Snapshot<K>)> {
        let k = self.queue.start()?;
        if self.retries.failures(&k) > 0 {
            self.share.metrics().retries.inc();
        }
        let snap = Snapshot {
            gate,
            remote: self.remote.clone(),
            swept: self.swept.remove(&k),
        };
        Some((k, snap))
    }

    /// The sync of `k` is over, after `took`: counted, and `k` looked at again when it asks
    /// to be or failed (not once the pair is stopping).
    fn done(&mut self, k: Key, r: Result<Next, String>, took: Duration, stopping: bool) {
        self.queue.done(&k);
        let m = self.share.metrics();
        m.syncs.inc();
        m.latency.observe(took.as_secs_f64());
        let again = match r {
            Ok(Next::Done) => {
                self.retries.succeeded(&k);
                None
            }
            Ok(Next::After(d)) => {
                self.retries.succeeded(&k);
                Some(d)
            }
            Err(e) => {
                m.errors.inc();
                let after = self.retries.failed(k.clone());
                warn!(kind = K::NAME, key = %k, error = %e, retry_in = ?after, "sync failed");
                Some(after)
            }
        };
        if let Some(d) = again.filter(|_| !stopping) {
            match self.delayed.get(&k) {
                Some(at) => self.delays.reset(at, d),
                None => {
                    let at = self.delays.insert(k.clone(), d);
                    self.delayed.insert(k, at);
                }
            }
        }
    }

    /// A wait asked for by [`Loop::done`] is over.
    fn expired(&mut self, k: Key) {
        self.delayed.remove(&k);
        self.queue.push(k);
    }

    /// Takes `endpoint` (or none) for the remote side: a new cache and watch, and a future
    /// that ends once that cache has listed.
    fn connect(&mut self, endpoint: Option<Endpoint>) -> BoxFuture<'static, ()> {
        match endpoint {
            Some(e) => {
                let (side, watch, listed) = remote_side(&self.state.shared, &self.state.pair, e);
                (self.remote, self.remote_watch) = (Some(side), Some(watch));
                listed
            }
            None => {
                (self.remote, self.remote_watch) = (None, None);
                futures::future::pending().boxed()
            }
        }
    }

    /// Queues every key of both caches.
    fn everything(&mut self) {
        for h in self.state.home.state() {
            self.queue.push(Key::of(h.as_ref()));
        }
        if let Some(side) = &self.remote {
            for r in side.store.state() {
                if let Some(k) = self.state.shared.kind.key_of(&self.state.pair, &r) {
                    self.queue.push(k);
                }
            }
        }
    }

    /// Queues the keys of orphans of ours, if they may be deleted now.
    fn sweep(&mut self, gate: Gate) {
        let Some(side) = self.remote.as_ref().filter(|_| gate.may_delete_orphans()) else {
            return;
        };
        let (kind, pair) = (&self.state.shared.kind, &self.state.pair);
        for k in orphans(kind, pair, side, &self.state.home) {
            self.swept.insert(k.clone());
            self.queue.push(k);
        }
    }
}

/// Runs the reflector of `shared`'s kind for `pair` until `stop` fires (then lets the syncs
/// under way finish) or an input ends.
pub(crate) async fn run<K: Kind>(
    shared: Arc<Shared<K>>,
    pair: Pair,
    inputs: Inputs,
    mut stop: oneshot::Receiver<()>,
) -> Result<(), Ended> {
    let home_dt = shared.kind.home_type();
    let home_api: Api<K::Home> = match &pair.home {
        Some(ns) => namespaced(shared.home.clone(), ns, &home_dt),
        None => everywhere(shared.home.clone(), &home_dt),
    };
    let (home, home_stream) = cache::touched_with(home_api, shared.kind.watch_home(), home_dt);
    let p = pair.clone();
    let mut home_watch = Some(Watch::drive(
        home_stream,
        |o: &K::Home| Some(Key::of(o)),
        move |e| warn!(kind = K::NAME, pair = %p, error = %e, "watching at home"),
    ));
    let Inputs {
        remote: mut endpoints,
        reachability: mut reach,
    } = inputs;
    let mut lp = Loop {
        state: Arc::new(PairState {
            shared: shared.clone(),
            pair: pair.clone(),
            home,
            writes: Writes::default(),
            foreign: Default::default(),
        }),
        remote: None,
        remote_watch: None,
        queue: Queue::default(),
        retries: Retries::default(),
        delays: DelayQueue::new(),
        delayed: HashMap::new(),
        swept: HashSet::new(),
        share: Share::new(shared.metrics.clone()),
    };
    let mut remote_listed = lp.connect(endpoints.borrow_and_update().clone());
    let mut triggers: SelectAll<BoxStream<'static, ()>> =
        shared.options.triggers.iter().map(|t| (t.0)()).collect();
    let mut resync = tokio::time::interval(shared.options.resync);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut syncs = FuturesUnordered::new();
    let mut stopping = false;
    info!(kind = K::NAME, %pair, "reflecting");
    let ended = loop {
        let gate = lp.gate(*reach.borrow());
        // Keys are synced as they come, up to `workers` at a time, while the watches go on
        // being read: a burst of changes is reflected side by side, not one per round.
        while gate.open() && !stopping && syncs.len() < shared.options.workers {
            let Some((k, snap)) = lp.next(gate) else {
                break;
            };
            let state = lp.state.clone();
            syncs.push(async move {
                let t0 = Instant::now();
                let r = sync::sync(&state, &k, snap).await;
                (k, r, t0.elapsed())
            });
        }
        lp.share.set(lp.queue.queued(), syncs.len());
        if stopping && syncs.is_empty() {
            break None;
        }
        let mut everything = false;
        tokio::select! {
            Some((k, r, took)) = syncs.next(), if !syncs.is_empty() => lp.done(k, r, took, stopping),
            Some(expired) = lp.delays.next(), if !lp.delays.is_empty() => lp.expired(expired.into_inner()),
            k = next_key(&mut home_watch), if !stopping => match k {
                Some(k) => lp.queue.push(k),
                None => break Some(Ended::HomeWatch { kind: K::NAME, pair: pair.clone() }),
            },
            k = next_key(&mut lp.remote_watch), if !stopping => match k {
                Some(k) => lp.queue.push(k),
                None => {
                    // Cannot happen (the watch retries for ever); a new client starts another.
                    warn!(kind = K::NAME, %pair, "the remote watch ended");
                    lp.remote_watch = None;
                }
            },
            () = &mut remote_listed => {
                remote_listed = futures::future::pending().boxed();
                everything = true;
            }
            r = endpoints.changed(), if !stopping => {
                if r.is_err() {
                    break Some(Ended::Endpoint { kind: K::NAME, pair: pair.clone() });
                }
                // The old client's watch and cache go; syncs under way keep theirs.
                remote_listed = lp.connect(endpoints.borrow_and_update().clone());
                everything = true;
            }
            r = reach.changed(), if !stopping => {
                if r.is_err() {
                    break Some(Ended::Reachability { kind: K::NAME, pair: pair.clone() });
                }
                everything = true;
            }
            Some(()) = triggers.next(), if !stopping => everything = true,
            _ = resync.tick(), if !stopping => {
                everything = true;
                lp.sweep(gate);
            }
            _ = &mut stop, if !stopping => stopping = true,
        }
        if everything {
            lp.everything();
        }
    };
    match ended {
        None => {
            info!(kind = K::NAME, %pair, "stopped");
            Ok(())
        }
        Some(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::ConfigMap, apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp,
    };
    use kube::runtime::reflector::store::Writer;

    use super::*;
    use crate::{
        marks::Marks,
        mirror::{
            Mirror,
            tests::{ConfigMaps, cm},
        },
    };

    fn store(objs: Vec<ConfigMap>) -> Store<ConfigMap> {
        let mut w = Writer::default();
        w.apply_watcher_event(&watcher::Event::Init);
        for o in objs {
            w.apply_watcher_event(&watcher::Event::InitApply(o));
        }
        w.apply_watcher_event(&watcher::Event::InitDone);
        w.as_reader()
    }

    fn twin(name: &str, marks: Option<&Marks>) -> ConfigMap {
        let mut c = cm(name, &[], &[]);
        c.metadata.namespace = Some("shop-alpha".into());
        c.metadata.labels = marks.map(Marks::labels);
        c
    }

    #[tokio::test]
    async fn the_periodic_look_finds_our_objects_whose_home_object_is_gone() {
        let marks = Marks::new("alpha", "beta");
        let config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
        let side = RemoteSide::<Mirror<ConfigMaps>> {
            endpoint: Endpoint {
                client: Client::try_from(config).unwrap(),
                marks: marks.clone(),
            },
            namespace: "shop-alpha".into(),
            dt: (),
            store: {
                let mut going = twin("going", Some(&marks));
                going.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
                store(vec![
                    twin("kept", Some(&marks)),
                    twin("orphan", Some(&marks)),
                    // Someone else's, with no home object: not ours to delete.
                    twin("theirs", None),
                    // Ours, already going.
                    going,
                ])
            },
        };
        let home = store(vec![cm("kept", &[], &[])]);
        let pair = Pair::namespaces("shop", "shop-alpha");
        assert_eq!(
            orphans(&Mirror(ConfigMaps), &pair, &side, &home),
            [Key::new("shop", "orphan")]
        );
        assert!(side.listed());
        assert!(side.lookup("kept").unwrap().is_some());
        assert!(side.lookup("nothing").unwrap().is_none());
    }
}
