//! Watching the provider during a burst: when each home pod's ShadowPod or real pod was first
//! seen in the state a stage counts.
use super::*;

/// A step on the offloaded pods' way, watched on the provider: when each home pod's
/// ShadowPod or real pod was first seen in the state that counts.
pub(super) struct Stage {
    pub(super) label: &'static str,
    pub(super) client: Client,
    /// The home namespace (the provider's objects are named `<namespace>.<name>`).
    pub(super) home_ns: String,
    pub(super) on: Step,
}

/// What a [`Stage`] waits for.
#[derive(Clone, Copy)]
pub(super) enum Step {
    ShadowPodCreated,
    PodCreated,
    PodBound,
    PodRunning,
    ShadowPodRunning,
    /// Marked for deletion, or gone.
    ShadowPodDeleting,
    PodDeleting,
    PodGone,
    ShadowPodGone,
}

/// The stages `steps` of the provider's objects standing for the home pods of `home_ns`.
pub(super) fn provider_stages(
    stack: &Stack,
    home_ns: &str,
    steps: &[(&'static str, Step)],
) -> Vec<Stage> {
    steps
        .iter()
        .map(|&(label, on)| Stage {
            label,
            client: stack.p.clone(),
            home_ns: home_ns.to_owned(),
            on,
        })
        .collect()
}

pub(crate) type Seen = (Arc<Mutex<HashMap<String, Instant>>>, JoinHandle<()>);

impl Stage {
    pub(super) async fn start(&self) -> Seen {
        let tenant = names::namespace::tenant(CONSUMER);
        let prefix = format!("{}.", self.home_ns);
        let home = move |name: String| name.strip_prefix(&prefix).map(str::to_owned);
        let step = self.on;
        let going = move |m: &ObjectMeta, gone: bool| match step {
            Step::ShadowPodDeleting | Step::PodDeleting => {
                Some(gone || m.deletion_timestamp.is_some())
            }
            Step::ShadowPodGone | Step::PodGone => Some(gone),
            _ if gone => Some(false),
            _ => None,
        };
        match step {
            Step::ShadowPodCreated
            | Step::ShadowPodRunning
            | Step::ShadowPodDeleting
            | Step::ShadowPodGone => {
                let api: Api<ShadowPod> = Api::namespaced(self.client.clone(), &tenant);
                first_event(api, move |s: &ShadowPod, gone| {
                    let phase = s.status.as_ref().and_then(|s| s.phase.as_deref());
                    let counts = going(&s.metadata, gone).unwrap_or(
                        matches!(step, Step::ShadowPodCreated) || phase == Some("Running"),
                    );
                    counts.then(|| home(s.name_any())).flatten()
                })
                .await
            }
            _ => {
                let api: Api<Pod> = Api::namespaced(self.client.clone(), &tenant);
                first_event(api, move |p: &Pod, gone| {
                    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                    let bound = p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some();
                    let counts = going(&p.metadata, gone).unwrap_or(match step {
                        Step::PodBound => bound,
                        Step::PodRunning => phase == Some("Running"),
                        _ => true,
                    });
                    counts.then(|| home(p.name_any())).flatten()
                })
                .await
            }
        }
    }
}

/// Watches `api` and records, per key `key_of` gives, when it was first given one; returns
/// once the watch has listed what exists.
pub(crate) async fn first_seen<K, F>(api: Api<K>, key_of: F) -> Seen
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    F: Fn(&K) -> Option<String> + Send + 'static,
{
    first_event(api, move |o: &K, gone| if gone { None } else { key_of(o) }).await
}

/// As [`first_seen`], `key_of` also told whether the object was deleted (`true`) or applied.
pub(super) async fn first_event<K, F>(api: Api<K>, key_of: F) -> Seen
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    F: Fn(&K, bool) -> Option<String> + Send + 'static,
{
    let seen: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let (synced_tx, synced_rx) = tokio::sync::oneshot::channel();
    let task = {
        let seen = seen.clone();
        tokio::spawn(async move {
            let mut synced = Some(synced_tx);
            let mut s = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
            while let Some(ev) = s.next().await {
                let (obj, gone) = match ev {
                    Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => (o, false),
                    Ok(watcher::Event::Delete(o)) => (o, true),
                    Ok(watcher::Event::InitDone) => {
                        if let Some(tx) = synced.take() {
                            let _ = tx.send(());
                        }
                        continue;
                    }
                    _ => continue,
                };
                if let Some(k) = key_of(&obj, gone) {
                    seen.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .entry(k)
                        .or_insert_with(Instant::now);
                }
            }
        })
    };
    let _ = synced_rx.await;
    (seen, task)
}
