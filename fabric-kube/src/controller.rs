//! Running a kube-runtime [`Controller`] the one way every fabric controller does: stopped by
//! SIGTERM/SIGINT (or only with its task), failures retried with a per-object back-off that a
//! success resets, results logged uniformly, and finalizers wrapped so that a reconcile returns
//! its own error type. A controller then only says what it watches and how it reconciles.
//!
//! kube-runtime has no back-off of its own for failed reconciles: the error policy's
//! [`Action`] is all there is. [`Failures`] counts failures in a row per object (reset by a
//! success, which the reconcile wrapper observes), and [`Backoff`] turns that count into a
//! wait. The back-off's arithmetic is pure and unit-tested; [`Runner::run`] is its thin edge.
use std::{
    collections::HashMap,
    fmt::Debug,
    future::Future,
    hash::Hash,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use kube::{
    Api, Resource,
    runtime::{
        Controller,
        controller::{self, Action},
        finalizer::{self, Event},
        reflector::ObjectRef,
    },
};
use serde::{Serialize, de::DeserializeOwned};
use tracing::{debug, warn};

/// How long to wait before retrying an object that failed `n` times in a row: `first`,
/// doubling with every further failure, never more than `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub first: Duration,
    pub max: Duration,
}

impl Backoff {
    /// 1 s doubling to 5 min: a failure that lasts is retried a dozen times an hour, a
    /// passing one at once.
    pub const STANDARD: Self = Self::new(Duration::from_secs(1), Duration::from_secs(300));

    pub const fn new(first: Duration, max: Duration) -> Self {
        Self { first, max }
    }

    /// A fixed wait: what a controller retrying a peer at its polling period asks for.
    pub const fn fixed(every: Duration) -> Self {
        Self::new(every, every)
    }

    /// The wait after the `failures`-th failure in a row (0 counts as 1).
    pub fn wait(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.first
            .checked_mul(1 << doublings)
            .unwrap_or(self.max)
            .min(self.max)
    }
}

/// Failures in a row per object: the state behind a [`Backoff`].
#[derive(Debug)]
pub struct Failures<Q> {
    counts: Mutex<HashMap<Q, u32>>,
}

impl<Q> Default for Failures<Q> {
    fn default() -> Self {
        Self {
            counts: Mutex::new(HashMap::new()),
        }
    }
}

impl<Q: Eq + Hash> Failures<Q> {
    fn counts(&self) -> std::sync::MutexGuard<'_, HashMap<Q, u32>> {
        // A panic elsewhere while holding the lock leaves a map that is still consistent.
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One more failure of `key`: how many in a row now.
    pub fn failed(&self, key: Q) -> u32 {
        let mut counts = self.counts();
        let n = counts.entry(key).or_default();
        *n = n.saturating_add(1);
        *n
    }

    /// `key` succeeded: its next failure waits the shortest again.
    pub fn succeeded(&self, key: &Q) {
        self.counts().remove(key);
    }

    pub fn len(&self) -> usize {
        self.counts().len()
    }

    pub fn is_empty(&self) -> bool {
        self.counts().is_empty()
    }
}

/// How a controller is run: its name in the logs, its back-off, which of its errors are
/// expected waits rather than failures, and whether a signal stops it.
pub struct Runner<E> {
    name: &'static str,
    backoff: Backoff,
    wait: fn(&E) -> Option<Duration>,
    on_signal: bool,
    concurrency: u16,
}

/// Reconciles one controller runs at once unless it says otherwise. kube-runtime's own default
/// is unbounded: a burst (a re-list after a lost Lease, a thousand objects made at once) then
/// sends as many writes together, and the API server answers many of them 429 (over its
/// in-flight limit) or 504, each retried (issue 22 §4 measured it with ShadowPods).
pub const CONCURRENCY: u16 = 16;

impl<E: std::error::Error + Send + 'static> Runner<E> {
    /// A controller named `name` in the logs, retrying failures after `backoff`, stopped
    /// gracefully (running reconciles finish) by SIGTERM or SIGINT.
    pub fn new(name: &'static str, backoff: Backoff) -> Self {
        Self {
            name,
            backoff,
            wait: |_| None,
            on_signal: true,
            concurrency: CONCURRENCY,
        }
    }

    /// At most `n` reconciles at once (0: unbounded) instead of [`CONCURRENCY`]; one object
    /// is never reconciled twice at once either way.
    pub fn concurrency(mut self, n: u16) -> Self {
        self.concurrency = n;
        self
    }

    /// Errors for which `wait` says how long are expected waits (a pod still terminating, a
    /// write that raced another): retried after that, logged at debug, and the back-off is
    /// left as it is.
    pub fn waits(mut self, wait: fn(&E) -> Option<Duration>) -> Self {
        self.wait = wait;
        self
    }

    /// Runs until its task is dropped, whatever signal comes: for a controller inside a
    /// process that stops some other way (one registering no handler leaves SIGTERM's default,
    /// which ends the process).
    pub fn until_dropped(mut self) -> Self {
        self.on_signal = false;
        self
    }

    /// The retry for `err` on an object that has failed `failures` times in a row (counting
    /// this one; not counted for an expected wait), and whether it is a failure.
    fn retry(&self, err: &E, failures: impl FnOnce() -> u32) -> (Duration, bool) {
        match (self.wait)(err) {
            Some(d) => (d, false),
            None => (self.backoff.wait(failures()), true),
        }
    }

    /// Runs `controller` with `reconcile` over `ctx` until its watches end (or a signal stops
    /// it, see [`Runner::until_dropped`]). The controller's config is replaced by the runner's
    /// (its [`Runner::concurrency`]): set it here, not on the controller.
    pub async fn run<K, C, F, Fut>(self, controller: Controller<K>, mut reconcile: F, ctx: Arc<C>)
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Eq + Hash + Clone + Debug + Default + Unpin + Send + Sync,
        C: Send + Sync + 'static,
        F: FnMut(Arc<K>, Arc<C>) -> Fut,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
    {
        let failures: Arc<Failures<ObjectRef<K>>> = Arc::default();
        let reset = failures.clone();
        let reconcile = move |obj: Arc<K>, ctx: Arc<C>| {
            let key = ObjectRef::from_obj(obj.as_ref());
            let reconciled = reconcile(obj, ctx);
            let reset = reset.clone();
            async move {
                let r = reconciled.await;
                if r.is_ok() {
                    reset.succeeded(&key);
                }
                r
            }
        };
        let (name, on_signal) = (self.name, self.on_signal);
        let controller =
            controller.with_config(controller::Config::default().concurrency(self.concurrency));
        let error_policy = move |obj: Arc<K>, err: &E, _: Arc<C>| {
            let key = ObjectRef::from_obj(obj.as_ref());
            let (after, failed) = self.retry(err, || failures.failed(key.clone()));
            if failed {
                warn!(controller = name, object = %key, error = %err, retry_in = ?after, "reconcile failed; retrying");
            } else {
                debug!(controller = name, object = %key, reason = %err, retry_in = ?after, "waiting");
            }
            Action::requeue(after)
        };
        let controller = if on_signal {
            controller.shutdown_on_signal()
        } else {
            controller
        };
        controller
            .run(reconcile, error_policy, ctx)
            .for_each(|r| async move {
                match r {
                    Ok((obj, _)) => debug!(controller = name, object = %obj, "reconciled"),
                    // Logged by the error policy, with the retry.
                    Err(controller::Error::ReconcilerFailed(..)) => {}
                    // An object removed after it was queued: nothing to do.
                    Err(e @ controller::Error::ObjectNotFound(_)) => {
                        debug!(controller = name, error = %e, "skipped")
                    }
                    Err(e) => warn!(controller = name, error = %e, "controller"),
                }
            })
            .await;
    }
}

/// What went wrong with a finalizer itself (the reconcile's own errors come through as they
/// are).
#[derive(Debug, thiserror::Error)]
pub enum FinalizerError {
    #[error("adding finalizer: {0}")]
    Add(#[source] kube::Error),
    #[error("removing finalizer: {0}")]
    Remove(#[source] kube::Error),
    #[error("object has no name")]
    UnnamedObject,
    #[error("invalid finalizer name")]
    InvalidFinalizer,
}

/// Reconciles `obj` under finalizer `name` (kube-runtime's [`finalizer::finalizer`]): `apply`
/// while it lives (after the finalizer is on), `cleanup` once it is deleting (the finalizer
/// comes off when it succeeds; it must be idempotent). Returns `apply`'s or `cleanup`'s error
/// as it is, or the finalizer's own as `E`.
pub async fn finalized<K, E, A, AF, CL, CF>(
    api: &Api<K>,
    name: &str,
    obj: Arc<K>,
    apply: A,
    cleanup: CL,
) -> Result<Action, E>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
    E: std::error::Error + From<FinalizerError> + 'static,
    A: FnOnce(Arc<K>) -> AF,
    AF: Future<Output = Result<Action, E>>,
    CL: FnOnce(Arc<K>) -> CF,
    CF: Future<Output = Result<Action, E>>,
{
    let r = finalizer::finalizer(api, name, obj, |event| async move {
        match event {
            Event::Apply(o) => apply(o).await,
            Event::Cleanup(o) => cleanup(o).await,
        }
    })
    .await;
    r.map_err(|e| match e {
        finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e) => e,
        finalizer::Error::AddFinalizer(e) => FinalizerError::Add(e).into(),
        finalizer::Error::RemoveFinalizer(e) => FinalizerError::Remove(e).into(),
        finalizer::Error::UnnamedObject => FinalizerError::UnnamedObject.into(),
        finalizer::Error::InvalidFinalizer => FinalizerError::InvalidFinalizer.into(),
    })
}

/// Resolves on the first SIGTERM or SIGINT: what a process that stops gracefully waits for.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let term = async {
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            // Without a handler SIGTERM keeps its default: it still ends the process.
            Err(e) => {
                warn!(error = %e, "no SIGTERM handler; stopping on SIGINT only");
                std::future::pending::<()>().await
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum E {
        #[error("busy")]
        Busy,
        #[error("broken")]
        Broken,
    }

    #[test]
    fn the_back_off_doubles_from_first_to_max() {
        let b = Backoff::STANDARD;
        let secs: Vec<u64> = (1..=11).map(|n| b.wait(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(b.wait(0), Duration::from_secs(1));
        // No overflow however long it fails.
        assert_eq!(b.wait(u32::MAX), Duration::from_secs(300));
        let slow = Backoff::new(Duration::from_secs(u64::MAX / 2), Duration::MAX);
        assert_eq!(slow.wait(3), Duration::MAX);
        assert_eq!(
            Backoff::fixed(Duration::from_secs(5)).wait(7),
            Duration::from_secs(5)
        );
    }

    #[test]
    fn failures_count_per_object_until_a_success() {
        let f: Failures<&str> = Failures::default();
        assert_eq!(f.failed("a"), 1);
        assert_eq!(f.failed("a"), 2);
        assert_eq!(f.failed("b"), 1);
        f.succeeded(&"a");
        assert_eq!(f.failed("a"), 1, "a success starts the count again");
        f.succeeded(&"a");
        f.succeeded(&"b");
        assert!(f.is_empty());
    }

    #[test]
    fn expected_waits_neither_back_off_nor_count() {
        let r = Runner::<E>::new("test", Backoff::STANDARD).waits(|e| match e {
            E::Busy => Some(Duration::from_millis(50)),
            E::Broken => None,
        });
        let f: Failures<&str> = Failures::default();
        assert_eq!(
            r.retry(&E::Busy, || f.failed("a")),
            (Duration::from_millis(50), false)
        );
        assert!(f.is_empty());
        assert_eq!(
            r.retry(&E::Broken, || f.failed("a")),
            (Duration::from_secs(1), true)
        );
        assert_eq!(
            r.retry(&E::Broken, || f.failed("a")),
            (Duration::from_secs(2), true)
        );
    }
}
