//! Waiting for a condition in tests: poll with a deadline, never sleep-and-assert (CI runs on a
//! loaded 2-core VM, where controller round trips take seconds). One schedule for every wait
//! of the suite, async ([`eventually`]) or blocking ([`eventually_blocking`]): ask at once, then
//! after a short pause that grows to [`POLL`], so that a condition that holds within a few
//! milliseconds is seen then, and a long wait does not hammer the API server.
use std::{
    future::Future,
    time::{Duration, Instant},
};

/// The longest pause between two asks.
pub const POLL: Duration = Duration::from_millis(200);
/// The first pause.
pub const FIRST: Duration = Duration::from_millis(10);

/// The pauses between asks: [`FIRST`], doubling up to [`POLL`], then [`POLL`] on.
pub fn pauses() -> impl Iterator<Item = Duration> {
    std::iter::successors(Some(FIRST), |p| Some((*p * 2).min(POLL)))
}

/// A wait that ran out: what it waited for, and how long.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("timed out waiting for {what} (after {within:?})")]
pub struct Timeout {
    pub what: String,
    pub within: Duration,
}

/// Asks `f` until it returns `Some`, or [`Timeout`] once `within` has passed.
pub async fn try_eventually<T, F, Fut>(what: &str, within: Duration, mut f: F) -> Result<T, Timeout>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let t0 = Instant::now();
    let mut pauses = pauses();
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        if t0.elapsed() >= within {
            return Err(Timeout {
                what: what.to_owned(),
                within,
            });
        }
        tokio::time::sleep(pauses.next().unwrap_or(POLL)).await;
    }
}

/// [`try_eventually`], panicking with `what` once `within` has passed.
#[track_caller]
pub fn eventually<T, F, Fut>(what: &str, within: Duration, f: F) -> impl Future<Output = T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    // The caller's location, not this function's, in the panic (an async fn cannot take it).
    let caller = std::panic::Location::caller();
    let wait = try_eventually(what, within, f);
    async move {
        match wait.await {
            Ok(v) => v,
            Err(e) => panic!("{e} ({caller})"),
        }
    }
}

/// [`try_eventually`] for blocking code: asks `f` on this thread, sleeping between asks.
pub fn try_eventually_blocking<T>(
    what: &str,
    within: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> Result<T, Timeout> {
    let t0 = Instant::now();
    let mut pauses = pauses();
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if t0.elapsed() >= within {
            return Err(Timeout {
                what: what.to_owned(),
                within,
            });
        }
        std::thread::sleep(pauses.next().unwrap_or(POLL));
    }
}

/// [`try_eventually_blocking`], panicking with `what` once `within` has passed.
#[track_caller]
pub fn eventually_blocking<T>(what: &str, within: Duration, f: impl FnMut() -> Option<T>) -> T {
    match try_eventually_blocking(what, within, f) {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}

/// [`eventually_blocking`] for a plain condition.
#[track_caller]
pub fn until(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
    eventually_blocking(what, within, || ok().then_some(()))
}

/// For the benchmarks: asks `f` until it says done (an error counts as not yet), failing after
/// `within`, or at once when Ctrl-C was pressed ([`crate::check_interrupt`]).
pub async fn until_done<F, Fut>(what: &str, within: Duration, mut f: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    try_eventually(what, within, || {
        let check = f();
        async move {
            if let Err(e) = crate::check_interrupt() {
                return Some(Err(e));
            }
            check.await.unwrap_or(false).then_some(Ok(()))
        }
    })
    .await?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn returns_the_first_answer() {
        let mut n = 0;
        let v = eventually("three asks", Duration::from_secs(5), || {
            n += 1;
            let done = (n == 3).then_some(n);
            async move { done }
        })
        .await;
        assert_eq!(v, 3);
    }

    #[tokio::test]
    #[should_panic(expected = "timed out waiting for nothing")]
    async fn gives_up_after_the_deadline() {
        eventually("nothing", Duration::from_millis(300), || async {
            None::<()>
        })
        .await;
    }

    #[tokio::test]
    async fn a_timeout_says_what_and_how_long() {
        let e = try_eventually("the moon", Duration::from_millis(50), || async {
            None::<()>
        })
        .await
        .unwrap_err();
        assert_eq!(e.what, "the moon");
        assert_eq!(e.to_string(), "timed out waiting for the moon (after 50ms)");
    }

    #[test]
    fn blocking_waits_ask_until_the_answer_or_the_deadline() {
        let mut n = 0;
        let v = eventually_blocking("three asks", Duration::from_secs(5), || {
            n += 1;
            (n == 3).then_some(n)
        });
        assert_eq!(v, 3);
        let e = try_eventually_blocking("nothing", Duration::from_millis(50), || None::<()>);
        assert_eq!(e.unwrap_err().what, "nothing");
    }

    #[test]
    fn pauses_start_short_and_grow_to_the_poll() {
        let p: Vec<Duration> = pauses().take(7).collect();
        assert_eq!(p[0], FIRST);
        assert!(p.windows(2).all(|w| w[0] <= w[1]), "{p:?}");
        assert_eq!(*p.last().unwrap(), POLL);
        // The first few pauses together are shorter than one poll used to be.
        assert!(p[..3].iter().sum::<Duration>() < POLL);
    }
}
