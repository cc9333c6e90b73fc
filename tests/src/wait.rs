//! Waiting for a condition in tests: poll with a deadline, never sleep-and-assert (CI runs on a
//! loaded 2-core VM, where controller round trips take seconds).
use std::{future::Future, time::Duration};

/// How often `eventually` asks again.
pub const POLL: Duration = Duration::from_millis(200);

/// Polls `f` until it returns `Some`, panicking with `what` once `within` has passed.
pub async fn eventually<T, F, Fut>(what: &str, within: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let t0 = tokio::time::Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(t0.elapsed() < within, "timed out waiting for {what}");
        tokio::time::sleep(POLL).await;
    }
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
}
