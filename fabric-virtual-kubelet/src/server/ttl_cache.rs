//! Answers of the API server kept for a while, each for its own time, in bounded memory: the
//! SubjectAccessReviews' ([`super::authz::Cache`]) and the TokenReviews'
//! ([`super::authn::Tokens`]).
use std::{
    collections::HashMap,
    hash::Hash,
    time::{Duration, Instant},
};

#[derive(Debug)]
pub struct TtlCache<K, V> {
    entries: HashMap<K, (V, Instant)>,
}

impl<K: Eq + Hash, V: Clone> TtlCache<K, V> {
    /// Beyond it, expired entries are dropped, and if none were, all of them (a client that
    /// makes up users or tokens cannot grow it without bound; the answers are only asked
    /// again).
    pub const CAPACITY: usize = 4096;

    pub fn new() -> Self {
        TtlCache {
            entries: HashMap::new(),
        }
    }

    /// The value for `key` if it has not expired at `now`.
    pub fn get(&self, key: &K, now: Instant) -> Option<V> {
        self.entries
            .get(key)
            .filter(|(_, expires)| now < *expires)
            .map(|(v, _)| v.clone())
    }

    /// Keeps `value` for `key` from `now` for `ttl`.
    pub fn put(&mut self, key: K, value: V, ttl: Duration, now: Instant) {
        if self.entries.len() >= Self::CAPACITY && !self.entries.contains_key(&key) {
            self.entries.retain(|_, (_, expires)| now < *expires);
            if self.entries.len() >= Self::CAPACITY {
                self.entries.clear();
            }
        }
        self.entries.insert(key, (value, now + ttl));
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl<K: Eq + Hash, V: Clone> Default for TtlCache<K, V> {
    fn default() -> Self {
        Self::new()
    }
}
