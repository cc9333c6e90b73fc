//! The ShadowPods this process made lately. Right after a create, the remote watch cache does
//! not show the new ShadowPod yet, while the home pod already says it was offloaded (its
//! status was written from what the create returned). A sync in between would take the
//! ShadowPod for vanished and read it again from the provider (one GET a pod in a burst)
//! before it may conclude. For [`ECHO`] after its own create, the pod kind waits for the
//! watch instead: the ShadowPod's arrival (or its deletion) brings the key back, and the
//! sync is due again by then at the latest.
use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use fabric_reflector::Key;

/// How long after its own create a missing ShadowPod is taken as the watch not having shown
/// it yet.
pub const ECHO: Duration = Duration::from_secs(10);

/// The ShadowPods made lately: by key, the home pod's UID and when.
#[derive(Debug, Default)]
pub struct Made(Mutex<HashMap<Key, (String, Instant)>>);

impl Made {
    /// This process made the ShadowPod of `key` for the home pod of UID `uid` at `now`.
    pub fn record(&self, key: Key, uid: String, now: Instant) {
        let mut made = self.0.lock().unwrap_or_else(|e| e.into_inner());
        made.retain(|_, (_, at)| now.saturating_duration_since(*at) < ECHO);
        made.insert(key, (uid, now));
    }

    /// How much longer the watch may be behind the create of the ShadowPod of `key` for pod
    /// `uid`: `None` when this process did not make it within [`ECHO`] of `now`.
    pub fn echo_due(&self, key: &Key, uid: &str, now: Instant) -> Option<Duration> {
        let made = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (for_uid, at) = made.get(key)?;
        let since = now.saturating_duration_since(*at);
        (for_uid == uid && since < ECHO).then(|| ECHO - since)
    }

    /// The watch shows the ShadowPod of `key`: nothing to wait for any more.
    pub fn seen(&self, key: &Key) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_shadow_pod_is_awaited_only_briefly_after_our_own_create() {
        let made = Made::default();
        let t0 = Instant::now();
        let web = Key::new("shop", "web");
        assert_eq!(made.echo_due(&web, "u-1", t0), None, "not made here");
        made.record(web.clone(), "u-1".into(), t0);
        let later = t0 + Duration::from_secs(4);
        assert_eq!(
            made.echo_due(&web, "u-1", later),
            Some(ECHO - Duration::from_secs(4))
        );
        assert_eq!(
            made.echo_due(&web, "u-2", later),
            None,
            "another pod of that name"
        );
        assert_eq!(
            made.echo_due(&web, "u-1", t0 + ECHO),
            None,
            "too long: it vanished"
        );
        made.seen(&web);
        assert_eq!(
            made.echo_due(&web, "u-1", later),
            None,
            "the watch showed it"
        );
        // Old entries go as new ones come.
        made.record(web.clone(), "u-1".into(), t0);
        made.record(Key::new("shop", "db"), "u-3".into(), t0 + ECHO);
        assert_eq!(made.0.lock().unwrap().len(), 1);
    }
}
