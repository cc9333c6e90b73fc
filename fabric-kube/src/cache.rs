//! Watch caches: a kube-runtime reflector [`Store`] kept current by a watch that is retried
//! with kube's default back-off, built the same way wherever a controller or an edge needs
//! one. The caller drives the returned stream (a controller's `owns_stream`/`watches_stream`,
//! a `select!` loop), or [`notifying`] and [`lean`] drive it on a task of their own.
use std::{fmt::Debug, hash::Hash, sync::Arc};

use futures::{Stream, StreamExt};
use kube::{
    Api, Resource,
    runtime::{
        WatchStreamExt,
        reflector::{self, Store},
        watcher,
    },
};
use serde::de::DeserializeOwned;
use tokio::{
    sync::{Notify, watch},
    task::JoinHandle,
};
use tracing::warn;

/// A cache of what `api` holds (as `cfg` selects), and the watch events that fill it.
pub fn events<K>(
    api: Api<K>,
    cfg: watcher::Config,
) -> (
    Store<K>,
    impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    events_with(api, cfg, Default::default())
}

/// [`events`] for a type known at run time (`dt`: a [`kube::api::DynamicObject`]'s
/// `ApiResource`), which has no default.
pub fn events_with<K>(
    api: Api<K>,
    cfg: watcher::Config,
    dt: K::DynamicType,
) -> (
    Store<K>,
    impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    let writer = reflector::store::Writer::new(dt);
    let store = writer.as_reader();
    let stream = reflector::reflector(writer, watcher::watcher(api, cfg)).default_backoff();
    (store, stream)
}

/// [`events`] as the objects touched (created, changed, or seen in a relist): what a
/// `Controller` maps to the objects it reconciles.
pub fn touched<K>(
    api: Api<K>,
    cfg: watcher::Config,
) -> (
    Store<K>,
    impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let (store, events) = events(api, cfg);
    (store, events.touched_objects())
}

/// [`touched`] for a type known at run time (`dt`: a [`kube::api::DynamicObject`]'s
/// `ApiResource`), which has no default.
pub fn touched_with<K>(
    api: Api<K>,
    cfg: watcher::Config,
    dt: K::DynamicType,
) -> (
    Store<K>,
    impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    let (store, events) = events_with(api, cfg, dt);
    (store, events.touched_objects())
}

/// A cache driven on a task of its own that wakes `changed` on every watch event (a failed
/// watch is logged and retried; the cache keeps what it had meanwhile).
pub fn notifying<K>(
    api: Api<K>,
    cfg: watcher::Config,
    changed: Arc<Notify>,
) -> (Store<K>, JoinHandle<()>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let (store, events) = events(api, cfg);
    let task = tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        while let Some(ev) = events.next().await {
            match ev {
                Ok(_) => changed.notify_one(),
                Err(e) => warn!(error = %e, kind = %K::kind(&Default::default()), "watch"),
            }
        }
    });
    (store, task)
}

/// A cache of objects without their managedFields (most of a large object, and nothing a
/// decision reads), driven on a task of its own; `what` names it in the logs of a failed
/// watch (retried; the cache keeps what it had meanwhile).
pub fn lean<K>(api: Api<K>, cfg: watcher::Config, what: &'static str) -> (Store<K>, JoinHandle<()>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let (store, writer) = reflector::store();
    let events = watcher::watcher(api, cfg)
        .default_backoff()
        .modify(|o: &mut K| o.meta_mut().managed_fields = None)
        .reflect(writer);
    let task = tokio::spawn(events.for_each(move |ev| async move {
        if let Err(e) = ev {
            warn!(error = %e, "{what} cache: watch failed; retrying");
        }
    }));
    (store, task)
}

/// The latest state of one named object, kept by a watch (retrying with backoff on errors).
/// The channel's first value (None) is a placeholder: the first change is what the API
/// said.
pub fn follow<K>(api: Api<K>, name: &str) -> watch::Receiver<Option<K>>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (tx, rx) = watch::channel(None);
    let stream = watcher::watch_object(api, name).default_backoff();
    let what = format!("{}/{name}", K::kind(&()));
    tokio::spawn(forward(stream, tx, what));
    rx
}

async fn forward<K, S>(stream: S, tx: watch::Sender<Option<K>>, what: String)
where
    S: Stream<Item = Result<Option<K>, watcher::Error>>,
{
    let mut stream = std::pin::pin!(stream);
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(obj) => {
                if tx.send(obj).is_err() {
                    return;
                }
            }
            Err(e) => warn!(error = %e, object = %what, "watch"),
        }
    }
}
