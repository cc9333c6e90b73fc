//! One sync of one key: what the caches hold for it, the orphan rule, the Warning about a
//! remote object someone else made, then the kind's [`Kind::decide`] and [`Kind::act`].
use std::sync::Arc;

use fabric_kube::events::Event;
use kube::{Api, Resource as _, runtime::reflector::ObjectRef};
use tracing::{debug, info, warn};

use crate::{
    edge::{PairState, RemoteSide},
    gate::{Gate, Remote},
    key::Key,
    kind::{Cx, Deleted, Kind, Next, View, delete_preconditioned, namespaced, owned},
};

/// What the loop knew when it started a sync.
pub(crate) struct Snapshot<K: Kind> {
    pub gate: Gate,
    pub remote: Option<Arc<RemoteSide<K>>>,
    /// The periodic look for orphans found this key's remote object orphaned.
    pub swept: bool,
}

/// The Event reason of a remote object in the way that is not ours.
pub const NOT_OURS: &str = "FailedReflection";

pub(crate) async fn sync<K: Kind>(
    state: &PairState<K>,
    key: &Key,
    snap: Snapshot<K>,
) -> Result<Next, String> {
    let kind = &state.shared.kind;
    let side = snap.remote.as_deref();
    let listed = side.and_then(|s| s.lookup(&kind.remote_name(key)));
    let ours = side.map(|s| |r: &K::Remote| owned(kind, &s.endpoint.marks, r));
    let remote = Remote::of(listed.as_ref().map(|o| o.as_deref()), ours);
    let cached = state
        .home
        .get(&ObjectRef::new_with(&key.name, kind.home_type()).within(&key.namespace));
    let Some(cached) = cached else {
        state.writes.forget(key);
        state.foreign().remove(key);
        return match (remote, side) {
            (Remote::Ours(r), Some(side))
                if snap.gate.may_delete_orphans() && kind.orphaned(r, None) =>
            {
                delete_orphan(state, key, r, side).await
            }
            (Remote::Ours(r), Some(side))
                if snap.gate.may_delete_orphans() && r.meta().deletion_timestamp.is_some() =>
            {
                home_gone(kind, key, r, side).await;
                Ok(Next::Done)
            }
            _ => Ok(Next::Done),
        };
    };
    let home = state.writes.freshest(key, cached);
    if let (Remote::Ours(r), Some(side)) = (remote, side)
        && snap.swept
        && snap.gate.may_delete_orphans()
        && kind.orphaned(r, Some(&home))
    {
        return delete_orphan(state, key, r, side).await;
    }
    tell_foreign(state, key, &home, remote, side).await;
    let view = View {
        key,
        pair: &state.pair,
        home: &home,
        remote,
        reachable: snap.gate.reachable(),
        marks: side.map(|s| &s.endpoint.marks),
    };
    let step = kind.decide(&view);
    debug!(kind = K::NAME, %key, ?step, "decided");
    let cx = Cx {
        view,
        kind,
        home_client: &state.shared.home,
        endpoint: side.map(|s| &s.endpoint),
        events: &state.shared.events,
        writes: &state.writes,
    };
    kind.act(&cx, step).await.map_err(|e| format!("{e:#}"))
}

/// Deletes remote object `r` of `key` once a fresh read of the home object confirms that it
/// stands for none (the cache may lag behind a home object created again).
async fn delete_orphan<K: Kind>(
    state: &PairState<K>,
    key: &Key,
    r: &K::Remote,
    side: &RemoteSide<K>,
) -> Result<Next, String> {
    let kind = &state.shared.kind;
    let home: Api<K::Home> =
        namespaced(state.shared.home.clone(), &key.namespace, &kind.home_type());
    let fresh = home
        .get_opt(&key.name)
        .await
        .map_err(|e| format!("reading {} {key} at home again: {e}", K::NAME))?;
    if !kind.orphaned(r, fresh.as_ref()) {
        return Ok(Next::Done);
    }
    let name = r.meta().name.clone().unwrap_or_default();
    let deleted = delete_preconditioned(&side.api(), r, None).await;
    if let Ok(d) = &deleted {
        if *d == Deleted::Asked {
            state.shared.metrics.orphans.inc();
            info!(kind = K::NAME, %key, remote = %name, "gone at home: deleting its remote copy");
        }
        home_gone(kind, key, r, side).await;
    }
    match deleted {
        Ok(_) => Ok(Next::Done),
        Err(e) => Err(format!(
            "deleting {} {name} of {key} gone at home: {e}",
            K::NAME
        )),
    }
}

/// What goes with `r` now that its home object is gone ([`Kind::home_gone`]).
async fn home_gone<K: Kind>(kind: &K, key: &Key, r: &K::Remote, side: &RemoteSide<K>) {
    if let Err(e) = kind.home_gone(&side.endpoint, r).await {
        let name = r.meta().name.clone().unwrap_or_default();
        warn!(kind = K::NAME, %key, remote = %name, error = e, "removing what went with a remote object");
    }
}

/// Says once, at home, that the remote object in the way is someone else's.
async fn tell_foreign<K: Kind>(
    state: &PairState<K>,
    key: &Key,
    home: &K::Home,
    remote: Remote<'_, K::Remote>,
    side: Option<&RemoteSide<K>>,
) {
    let (Remote::Foreign(_), Some(side)) = (remote, side) else {
        if !matches!(remote, Remote::Unknown) {
            state.foreign().remove(key);
        }
        return;
    };
    if !state.foreign().insert(key.clone()) {
        return;
    }
    let name = state.shared.kind.remote_name(key);
    let note = format!(
        "{} {}/{name} in cluster {} was not made by the fabric: it is left alone",
        K::NAME,
        side.namespace,
        side.endpoint.marks.destination()
    );
    warn!(kind = K::NAME, %key, "{note}");
    state
        .shared
        .events
        .publish_ref(
            &home.object_ref(&state.shared.kind.home_type()),
            &Event::warning(NOT_OURS, "Reflect", note),
        )
        .await;
}

impl<K: Kind> PairState<K> {
    fn foreign(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<Key>> {
        self.foreign.lock().unwrap_or_else(|e| e.into_inner())
    }
}
