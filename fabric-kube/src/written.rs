//! Our own writes over a lagging watch cache.
//!
//! A controller that decides from a watch cache and writes what it decided sees its cache
//! show the version its write replaced for a while after the write (the echo has not arrived
//! yet). Deciding again from that stale copy writes the same thing again, or is refused with
//! a 409 when the write is conditioned on the version. The object the write returned is
//! fresher than the cache for exactly as long as the cache shows a version one of our writes
//! replaced: [`Written`] records those versions for a run of writes in a row, [`freshest`]
//! says which copy to decide from, and [`Writes`] keeps one record per object for a
//! controller whose reconciles run side by side.
use std::{collections::HashMap, hash::Hash, sync::Arc};

use kube::Resource;

/// How many of our own writes in a row a lagging cache is recognised behind.
const CHAIN: usize = 8;

/// The writes this controller made in a row on an object: the resourceVersions they were
/// written over (oldest first), and the object as the last one left it.
#[derive(Debug, Clone)]
pub struct Written<K> {
    over: Vec<String>,
    after: K,
}

impl<K: Resource> Written<K> {
    /// The record after one more write, over version `over`, that left `after`: the chain
    /// goes on when `over` is what our previous write left, else it starts again.
    pub fn then(prev: Option<Self>, over: String, after: K) -> Self {
        let mut chain = match prev {
            Some(p) if p.after.meta().resource_version.as_deref() == Some(over.as_str()) => p.over,
            _ => Vec::new(),
        };
        chain.push(over);
        if chain.len() > CHAIN {
            chain.remove(0);
        }
        Self { over: chain, after }
    }

    /// The versions our writes in a row replaced, oldest first.
    pub fn over(&self) -> &[String] {
        &self.over
    }

    /// The object as our last write left it.
    pub fn after(&self) -> &K {
        &self.after
    }
}

/// Which copy of an object to decide from: the watch cache's (`None`), or the one our last
/// write returned when the cache still shows a version one of our writes in a row replaced
/// (the echoes of our own writes have not arrived yet). A cache copy without a
/// resourceVersion is taken as it is.
pub fn freshest<'a, K: Resource>(cached: &K, written: Option<&'a Written<K>>) -> Option<&'a K> {
    let written = written?;
    let rv = cached.meta().resource_version.as_deref()?;
    written
        .over
        .iter()
        .any(|o| o == rv)
        .then_some(&written.after)
}

/// One [`Written`] record per object (by key `Q`), for reconciles that run side by side.
#[derive(Debug)]
pub struct Writes<Q, K> {
    records: std::sync::Mutex<HashMap<Q, Written<K>>>,
}

impl<Q, K> Default for Writes<Q, K> {
    fn default() -> Self {
        Self {
            records: std::sync::Mutex::new(HashMap::new()),
        }
    }
}

impl<Q: Eq + Hash, K: Resource + Clone> Writes<Q, K> {
    fn records(&self) -> std::sync::MutexGuard<'_, HashMap<Q, Written<K>>> {
        // A panic elsewhere while holding the lock leaves a map that is still consistent.
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The copy of `key`'s object to decide from ([`freshest`]); the record is dropped once
    /// the cache has caught up or moved on.
    pub fn freshest(&self, key: &Q, cached: Arc<K>) -> Arc<K> {
        let mut records = self.records();
        match records
            .get(key)
            .and_then(|w| freshest(cached.as_ref(), Some(w)))
        {
            Some(ours) => Arc::new(ours.clone()),
            None => {
                records.remove(key);
                cached
            }
        }
    }

    /// Records a write of `key`'s object over version `over` (the version of the copy it was
    /// decided from; `None`: unknown, so nothing is recorded) that left `after`.
    pub fn wrote(&self, key: Q, over: Option<String>, after: K) {
        let mut records = self.records();
        let prev = records.remove(&key);
        if let Some(over) = over {
            records.insert(key, Written::then(prev, over, after));
        }
    }

    /// Forgets `key` (its object is gone).
    pub fn forget(&self, key: &Q) {
        self.records().remove(key);
    }

    pub fn len(&self) -> usize {
        self.records().len()
    }

    pub fn is_empty(&self) -> bool {
        self.records().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use fabric_api::offloading::v1alpha1::{HomePod, ShadowPod, ShadowPodSpec, ShadowPodStatus};

    use super::*;

    fn shadow() -> ShadowPod {
        ShadowPod::new(
            "web",
            ShadowPodSpec {
                cluster_id: "alpha".into(),
                home: HomePod {
                    namespace: "shop".into(),
                    name: "web".into(),
                    uid: "home-uid".into(),
                },
                pod: Default::default(),
            },
        )
    }

    #[test]
    fn our_last_write_stands_in_for_a_cache_that_has_not_seen_it() {
        let mut before = shadow();
        before.metadata.resource_version = Some("7".into());
        let mut after = before.clone();
        after.metadata.resource_version = Some("8".into());
        after.status = Some(ShadowPodStatus {
            recreations: 1,
            ..Default::default()
        });
        let w = Written::then(None, "7".into(), after.clone());
        assert!(freshest(&before, None).is_none());
        assert_eq!(
            freshest(&before, Some(&w)).map(|s| &s.status),
            Some(&after.status)
        );
        // Caught up, or moved on (another writer): the cache's copy.
        assert!(freshest(&after, Some(&w)).is_none());
        let mut later = after.clone();
        later.metadata.resource_version = Some("9".into());
        assert!(freshest(&later, Some(&w)).is_none());

        // A second write over the first one's result: a cache still at "7" (two echoes
        // behind) or at "8" (one behind) stands in for neither.
        let mut third = after.clone();
        third.metadata.resource_version = Some("10".into());
        third.status.as_mut().unwrap().recreations = 2;
        let w2 = Written::then(Some(w.clone()), "8".into(), third.clone());
        for behind in [&before, &after] {
            assert_eq!(
                freshest(behind, Some(&w2)).map(|s| &s.status),
                Some(&third.status)
            );
        }
        assert!(freshest(&third, Some(&w2)).is_none());
        // Written over a version our last write did not leave: the chain starts again.
        let w3 = Written::then(Some(w2), "9".into(), third.clone());
        assert_eq!(w3.over(), ["9".to_owned()]);
        assert!(freshest(&before, Some(&w3)).is_none());
    }

    #[test]
    fn the_chain_keeps_the_last_writes_only() {
        let mut w: Option<Written<ShadowPod>> = None;
        for rv in 1..=20u32 {
            let mut after = shadow();
            after.metadata.resource_version = Some((rv + 1).to_string());
            w = Some(Written::then(w, rv.to_string(), after));
        }
        let w = w.unwrap();
        assert_eq!(w.over().len(), CHAIN);
        assert_eq!(w.over().first().map(String::as_str), Some("13"));
        let mut old = shadow();
        old.metadata.resource_version = Some("3".into());
        assert!(freshest(&old, Some(&w)).is_none(), "too far behind");
        // A cache copy without a version is not ours to second-guess.
        assert!(freshest(&shadow(), Some(&w)).is_none());
    }

    #[test]
    fn a_record_per_object_until_the_cache_catches_up() {
        let writes: Writes<&str, ShadowPod> = Writes::default();
        let mut cached = shadow();
        cached.metadata.resource_version = Some("7".into());
        let cached = Arc::new(cached);
        assert!(Arc::ptr_eq(&writes.freshest(&"a", cached.clone()), &cached));
        let mut after = (*cached).clone();
        after.metadata.resource_version = Some("8".into());
        writes.wrote("a", Some("7".into()), after.clone());
        // Unknown version: nothing to recognise later.
        writes.wrote("b", None, after.clone());
        assert_eq!(writes.len(), 1);
        let ours = writes.freshest(&"a", cached.clone());
        assert_eq!(ours.metadata.resource_version.as_deref(), Some("8"));
        // Another object's cache is its own.
        assert!(Arc::ptr_eq(&writes.freshest(&"b", cached.clone()), &cached));
        // Caught up: the cache's copy, and the record goes.
        let caught_up = Arc::new(after);
        assert!(Arc::ptr_eq(
            &writes.freshest(&"a", caught_up.clone()),
            &caught_up
        ));
        assert!(writes.is_empty());
        writes.wrote("a", Some("8".into()), (*caught_up).clone());
        writes.forget(&"a");
        assert!(writes.is_empty());
    }
}
