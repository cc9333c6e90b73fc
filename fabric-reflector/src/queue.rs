//! A reflector's work queue, pure: keys to look at in the order they were marked, each at
//! most once in the queue and never twice at the same time; a key marked while its sync runs
//! is looked at again once that sync is done (what it read may already be old). And the
//! back-off of keys whose sync failed ([`Retries`]).
use std::{
    collections::{HashMap, HashSet, VecDeque},
    hash::Hash,
    time::Duration,
};

/// When a key whose sync failed `failures` times in a row (the remote API answered 5xx,
/// timed out, ...) is looked at again: half a second after the first failure, doubling up to
/// the 30 s of the periodic resync, so a transient error costs a moment rather than a resync
/// period, and a remote cluster that keeps failing is not hammered.
pub fn retry_after(failures: u32) -> Duration {
    const FIRST: Duration = Duration::from_millis(500);
    const MAX: Duration = Duration::from_secs(30);
    let doublings = failures.saturating_sub(1).min(16);
    FIRST.saturating_mul(1 << doublings).min(MAX)
}

/// Keys to sync: marked ([`Queue::push`]), taken ([`Queue::start`]) and finished
/// ([`Queue::done`]).
#[derive(Debug)]
pub struct Queue<K> {
    order: VecDeque<K>,
    queued: HashSet<K>,
    running: HashSet<K>,
}

impl<K> Default for Queue<K> {
    fn default() -> Self {
        Self {
            order: VecDeque::new(),
            queued: HashSet::new(),
            running: HashSet::new(),
        }
    }
}

impl<K: Clone + Eq + Hash> Queue<K> {
    /// Marks `k` to be looked at (again).
    pub fn push(&mut self, k: K) {
        if self.queued.insert(k.clone()) {
            self.order.push_back(k);
        }
    }

    /// The oldest marked key whose sync is not running, now counted as running.
    pub fn start(&mut self) -> Option<K> {
        let i = self.order.iter().position(|k| !self.running.contains(k))?;
        let k = self.order.remove(i)?;
        self.queued.remove(&k);
        self.running.insert(k.clone());
        Some(k)
    }

    /// The sync of `k` is over.
    pub fn done(&mut self, k: &K) {
        self.running.remove(k);
    }

    pub fn running(&self) -> usize {
        self.running.len()
    }

    pub fn queued(&self) -> usize {
        self.order.len()
    }
}

/// The syncs of each key that failed in a row, and so when each is tried again.
#[derive(Debug)]
pub struct Retries<K> {
    failures: HashMap<K, u32>,
}

impl<K> Default for Retries<K> {
    fn default() -> Self {
        Self {
            failures: HashMap::new(),
        }
    }
}

impl<K: Eq + Hash> Retries<K> {
    /// One more failed sync of `k`: when to try it again ([`retry_after`]).
    pub fn failed(&mut self, k: K) -> Duration {
        let n = self.failures.entry(k).or_default();
        *n = n.saturating_add(1);
        retry_after(*n)
    }

    /// A sync of `k` went through: the next failure starts the back-off again.
    pub fn succeeded(&mut self, k: &K) {
        self.failures.remove(k);
    }

    /// The failed syncs of `k` in a row.
    pub fn failures(&self, k: &K) -> u32 {
        self.failures.get(k).copied().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_syncs_are_retried_soon_then_less_often() {
        let ms = |f| retry_after(f).as_millis();
        assert_eq!((ms(1), ms(2), ms(3), ms(4)), (500, 1000, 2000, 4000));
        assert_eq!(ms(7), 30_000);
        assert_eq!(ms(1000), 30_000);
        assert_eq!(ms(0), 500);
    }

    #[test]
    fn the_back_off_is_per_key_and_starts_again_after_a_success() {
        let mut r = Retries::default();
        let ms = |d: Duration| d.as_millis();
        assert_eq!(ms(r.failed("a")), 500);
        assert_eq!(ms(r.failed("a")), 1000);
        assert_eq!(ms(r.failed("b")), 500);
        assert_eq!((r.failures(&"a"), r.failures(&"b")), (2, 1));
        r.succeeded(&"a");
        assert_eq!(r.failures(&"a"), 0);
        assert_eq!(ms(r.failed("a")), 500);
        assert_eq!(ms(r.failed("b")), 1000);
    }

    #[test]
    fn keys_come_once_in_marking_order() {
        let mut q = Queue::default();
        for k in ["b", "a", "b", "c"] {
            q.push(k);
        }
        assert_eq!(q.queued(), 3);
        assert_eq!(q.start(), Some("b"));
        assert_eq!(q.start(), Some("a"));
        assert_eq!(q.start(), Some("c"));
        assert_eq!(q.start(), None);
        assert_eq!(q.running(), 3);
    }

    #[test]
    fn a_key_marked_while_running_waits_for_its_sync_to_end() {
        let mut q = Queue::default();
        q.push("a");
        q.push("b");
        assert_eq!(q.start(), Some("a"));
        q.push("a");
        // "a" runs: "b" goes first, and "a" not a second time meanwhile.
        assert_eq!(q.start(), Some("b"));
        assert_eq!(q.start(), None);
        q.done(&"a");
        assert_eq!(q.start(), Some("a"));
        q.done(&"a");
        q.done(&"b");
        assert_eq!((q.running(), q.queued()), (0, 0));
        assert_eq!(q.start(), None);
    }
}
