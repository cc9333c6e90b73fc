//! The pod loop's work queue, pure: pods to look at in the order they were marked, each at
//! most once in the queue and never twice at the same time. A pod marked while its sync runs
//! is looked at again once that sync is done (what it read may already be old).
use std::{
    collections::{HashSet, VecDeque},
    hash::Hash,
    time::Duration,
};

/// When a pod whose sync failed `failures` times in a row (the provider's API answered 5xx,
/// timed out, ...) is looked at again: half a second after the first failure, doubling up to
/// the 30 s of the periodic resync, so a transient error costs a moment rather than a resync
/// period, and a provider that keeps failing is not hammered.
pub fn retry_after(failures: u32) -> Duration {
    const FIRST: Duration = Duration::from_millis(500);
    const MAX: Duration = Duration::from_secs(30);
    let doublings = failures.saturating_sub(1).min(16);
    FIRST.saturating_mul(1 << doublings).min(MAX)
}

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
