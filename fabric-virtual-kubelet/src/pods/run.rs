//! The I/O edge of pod offloading: watches the home pods bound to this node, the provider's
//! ShadowPods (through the identity, rebuilt when the identity Secret changes) and the
//! peer's Configuration (the remap of its pod CIDR); carries out [`decide`]'s steps and
//! writes [`status`]'s home status.
use std::{collections::HashMap, sync::Arc, time::Duration};

use anyhow::{Context as _, Result};
use fabric_api::{
    authentication::v1alpha1::Tenant, names, networking::v1alpha1::Configuration,
    offloading::v1alpha1::ShadowPod,
};
use fabric_kube::events::{Event, Events};
use fabric_sharing::{
    identity,
    shadowpod::{
        forge::{self, Offer, Policy},
        resize,
    },
};
use futures::{FutureExt as _, StreamExt};
use k8s_openapi::{
    api::core::v1::{Pod, Secret},
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams, Preconditions},
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use serde_json::json;
use tokio::sync::{OnceCell, mpsc, watch};
use tracing::{debug, info, warn};

use super::{
    decide::{self, Remote, Step},
    failures,
    queue::{Queue, retry_after},
    status::{self, Context, Seen},
    translate::Remap,
};
use crate::run::FIELD_MANAGER;

/// Pods synced at the same time (each a few calls to either API).
const SYNCS: usize = 32;

/// Whether the node is Ready (the provider and the tunnel answer), and why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    pub ready: bool,
    pub message: String,
    /// Under at-most-once semantics, once the provider has stopped the pods for sure: why
    /// they are Failed here ([`crate::heartbeat::declared`]).
    pub partitioned: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Opts {
    pub node_name: String,
    /// The node's address: every offloaded pod's hostIP.
    pub node_ip: String,
    /// The provider's cluster id: the name of its Configuration.
    pub provider_id: String,
    /// Where the peer's Configuration is.
    pub fabric_namespace: String,
    /// How often every pod is looked at again (a ShadowPod deleted while the provider's
    /// watch was down, a quota that freed up).
    pub resync: Duration,
}

/// The provider as this process reaches it: a client, the ShadowPods of the tenant
/// namespace as last listed, and this cluster's id there (the Tenant the provider keeps).
struct Provider {
    client: Client,
    shadows: Store<ShadowPod>,
    consumer: OnceCell<String>,
    watch: tokio::task::JoinHandle<()>,
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

impl Provider {
    fn api(&self) -> Api<ShadowPod> {
        Api::default_namespaced(self.client.clone())
    }

    /// This cluster's id as the provider knows it: its Tenant in the tenant namespace (what
    /// the provider's admission compares the ShadowPods' `clusterId` with).
    async fn consumer(&self) -> Result<&str> {
        self.consumer
            .get_or_try_init(|| async {
                let tenants: Api<Tenant> = Api::default_namespaced(self.client.clone());
                let list = tenants
                    .list(&ListParams::default().limit(2))
                    .await
                    .context("reading the Tenant on the provider")?;
                match &list.items[..] {
                    [t] => Ok(t.spec.cluster_id.clone()),
                    other => anyhow::bail!(
                        "{} Tenants in the tenant namespace on the provider, not one",
                        other.len()
                    ),
                }
            })
            .await
            .map(String::as_str)
    }

    fn listed(&self) -> bool {
        self.shadows.wait_until_ready().now_or_never().is_some()
    }

    /// The ShadowPod of home pod `ns/name` as listed (`None`: not listed yet).
    fn cached(&self, ns: &str, name: &str) -> Option<Option<Arc<ShadowPod>>> {
        self.listed().then(|| {
            self.shadows.get(
                &ObjectRef::new(&forge::name(ns, name)).within(self.client.default_namespace()),
            )
        })
    }
}

type Key = (String, String);

fn home_key(s: &ShadowPod) -> Key {
    (s.spec.home.namespace.clone(), s.spec.home.name.clone())
}

/// Follows the identity Secret: a client and a ShadowPod watch per version of it; every
/// ShadowPod touched is sent as its home pod's key.
async fn follow_provider(
    mut secret: watch::Receiver<Option<Secret>>,
    out: watch::Sender<Option<Arc<Provider>>>,
    touched: mpsc::UnboundedSender<Key>,
) {
    loop {
        let current = secret.borrow_and_update().clone();
        let client = match current.as_ref().and_then(identity::kubeconfig_of) {
            Some(text) => identity::client_from_kubeconfig(&text).await.ok(),
            None => None,
        };
        let provider = client.map(|client| {
            let (shadows, writer) = reflector::store();
            let api: Api<ShadowPod> = Api::default_namespaced(client.clone());
            let tx = touched.clone();
            let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
                .default_backoff()
                .touched_objects();
            let watch = tokio::spawn(async move {
                let mut stream = std::pin::pin!(stream);
                while let Some(ev) = stream.next().await {
                    match ev {
                        Ok(s) => {
                            if tx.send(home_key(&s)).is_err() {
                                return;
                            }
                        }
                        Err(e) => debug!(error = %e, "the provider's ShadowPods"),
                    }
                }
            });
            Arc::new(Provider {
                client,
                shadows,
                consumer: OnceCell::new(),
                watch,
            })
        });
        if out.send(provider).is_err() || secret.changed().await.is_err() {
            return;
        }
    }
}

struct Loop {
    pods: Api<Pod>,
    store: Store<Pod>,
    provider: watch::Receiver<Option<Arc<Provider>>>,
    config: watch::Receiver<Option<Configuration>>,
    ready: watch::Receiver<Option<Readiness>>,
    events: Events,
    opts: Opts,
    /// Per pod, the home status write whose echo the watch cache has not shown yet: the
    /// pod's resourceVersion in the cache when it was written, and the pod as the write left
    /// it (see [`Loop::freshest`]).
    written: std::sync::Mutex<HashMap<Key, (String, Arc<Pod>)>>,
    /// Per pod, the syncs that failed in a row, and where a retry is sent
    /// ([`super::queue::retry_after`]): without it a failed create or delete waited for the
    /// next event or the periodic resync.
    failures: std::sync::Mutex<HashMap<Key, u32>>,
    retry: mpsc::UnboundedSender<Key>,
}

/// What [`Loop::step`] saw of the provider, for the status.
enum Outcome {
    Shadow(Box<ShadowPod>),
    Nothing,
    Vanished,
    Refused {
        message: String,
        retry: bool,
    },
    ResizeRefused {
        shadow: Box<ShadowPod>,
        message: String,
    },
    /// The home pod is gone: no status to write.
    Gone,
}

impl Loop {
    /// The copy of a home pod to decide from: the watch cache's, or the one our last status
    /// write returned while the cache still shows the version that write replaced (deciding
    /// on the cache then writes the same status again, and a pod's status flows through
    /// three or four writes on its way to Running). `over`: the cache's version, recorded
    /// with the next write.
    fn freshest(&self, key: &Key, cached: Arc<Pod>) -> (Arc<Pod>, Option<String>) {
        let over = cached.metadata.resource_version.clone();
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        match written.get(key) {
            Some((at, after)) if over.as_deref() == Some(at.as_str()) => (after.clone(), over),
            Some(_) => {
                written.remove(key);
                (cached, over)
            }
            None => (cached, over),
        }
    }

    /// Counts a failed sync of `key` and sends it to be synced again after
    /// [`retry_after`] that many failures in a row.
    fn retry_later(&self, key: &Key, error: &anyhow::Error) {
        let failures = {
            let mut f = self.failures.lock().unwrap_or_else(|e| e.into_inner());
            let n = f.entry(key.clone()).or_default();
            *n = n.saturating_add(1);
            *n
        };
        let after = retry_after(failures);
        warn!(pod = %format!("{}/{}", key.0, key.1), error = %format!("{error:#}"), retry_in = ?after, "offloading");
        let (tx, k) = (self.retry.clone(), key.clone());
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let _ = tx.send(k);
        });
    }

    async fn sync(&self, key: &Key) {
        let Some(cached) = self.store.get(&ObjectRef::new(&key.1).within(&key.0)) else {
            self.written
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(key);
            match self.sync_gone(key).await {
                Ok(()) => {
                    self.failures
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(key);
                }
                Err(e) => self.retry_later(key, &e),
            }
            return;
        };
        let (pod, over) = self.freshest(key, cached);
        let Some(readiness) = self.ready.borrow().clone() else {
            return;
        };
        let provider = self.provider.borrow().clone();
        let outcome = match self.step(&pod, provider.as_deref(), readiness.ready).await {
            Ok(o) => {
                self.failures
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(key);
                o
            }
            Err(e) => {
                self.retry_later(key, &e);
                Outcome::Nothing
            }
        };
        let seen = match &outcome {
            Outcome::Gone => return,
            Outcome::Shadow(s) => Seen::Shadow(s),
            Outcome::Nothing => Seen::Nothing,
            Outcome::Vanished => Seen::Vanished,
            Outcome::Refused { message, retry } => Seen::Refused {
                message,
                retry: *retry,
            },
            Outcome::ResizeRefused { shadow, message } => Seen::ResizeRefused { shadow, message },
        };
        let remap = self
            .config
            .borrow()
            .as_ref()
            .and_then(|c| Remap::of(c).ok());
        let ctx = Context {
            reachable: readiness.ready,
            unreachable_message: &readiness.message,
            partitioned: readiness.partitioned.as_deref(),
            remap: remap.as_ref(),
            node_ip: &self.opts.node_ip,
            now: Timestamp::now(),
        };
        let Some(want) = status::home_status(pod.status.as_ref(), seen, &ctx) else {
            return;
        };
        if pod.status.as_ref().map(status::ours) == Some(want.clone()) {
            return;
        }
        match FIELD_MANAGER
            .apply_status_at(&self.pods_in(&key.0), &key.1, None, &want)
            .await
        {
            Ok(after) => {
                debug!(pod = %format!("{}/{}", key.0, key.1), "status home");
                if let Some(over) = over {
                    self.written
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(key.clone(), (over, Arc::new(after)));
                }
                for f in failures::new_failures(pod.status.as_ref(), &want) {
                    self.events
                        .publish(pod.as_ref(), &Event::warning(f.reason, f.action, f.message))
                        .await;
                }
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => {
                warn!(pod = %format!("{}/{}", key.0, key.1), error = %e, "writing the pod status")
            }
        }
    }

    /// A pod gone from the watch cache: its ShadowPod, if one still stands for it, goes
    /// ([`decide::orphan`]).
    async fn sync_gone(&self, key: &Key) -> Result<()> {
        let Some(p) = self.provider.borrow().clone() else {
            return Ok(());
        };
        let reachable = self.ready.borrow().as_ref().is_some_and(|r| r.ready);
        let cached = p.cached(&key.0, &key.1);
        match decide::orphan(Remote::of(cached.as_ref().map(Option::as_deref)), reachable) {
            Some(s) => self.delete_orphan(&p, s).await,
            None => Ok(()),
        }
    }

    /// Deletes ShadowPod `s` once a fresh read of its home pod confirms the pod is gone.
    async fn delete_orphan(&self, p: &Provider, s: &ShadowPod) -> Result<()> {
        let (ns, name) = home_key(s);
        let home = self
            .pods_in(&ns)
            .get_opt(&name)
            .await
            .context("reading the home pod")?;
        if !decide::orphaned(s, home.as_ref()) {
            return Ok(());
        }
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: s.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match p.api().delete(&s.name_any(), &dp).await {
            Ok(_) => info!(shadowpod = %s.name_any(), "its home pod is gone: deleting it"),
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => return Err(e).context("deleting the ShadowPod of a pod gone at home"),
        }
        Ok(())
    }

    fn pods_in(&self, ns: &str) -> Api<Pod> {
        Api::namespaced(self.pods.clone().into_client(), ns)
    }

    async fn step(
        &self,
        pod: &Pod,
        provider: Option<&Provider>,
        reachable: bool,
    ) -> Result<Outcome> {
        let ns = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        let shadow_name = forge::name(&ns, &name);
        let cached = provider.and_then(|p| p.cached(&ns, &name));
        let remote = Remote::of(cached.as_ref().map(Option::as_deref));
        let step = decide::decide(pod, remote, reachable);
        let own = match remote {
            Remote::Present(s) if decide::owns(s, pod) => Outcome::Shadow(Box::new(s.clone())),
            _ => Outcome::Nothing,
        };
        let Some(p) = provider else {
            return Ok(own);
        };
        let uid = pod.metadata.uid.clone();
        Ok(match step {
            Step::Report | Step::Wait => own,
            Step::Create => self.create(pod, p, &shadow_name).await?,
            Step::UpdateMetadata => {
                let consumer = p.consumer().await?;
                let (labels, annotations) = decide::wanted_metadata(pod, consumer);
                let patch = json!({
                    "metadata": { "labels": labels, "annotations": annotations },
                    "spec": { "pod": { "labels": labels, "annotations": annotations } },
                });
                // JSON merge patch: keys gone at home must be removed there too.
                let s = match &own {
                    Outcome::Shadow(s) => s,
                    _ => return Ok(own),
                };
                let patch = with_removals(patch, s, &labels, &annotations);
                let updated = p
                    .api()
                    .patch(&shadow_name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .context("updating the ShadowPod's labels and annotations")?;
                Outcome::Shadow(Box::new(updated))
            }
            Step::Resize => self.resize(pod, p, &shadow_name, own).await?,
            Step::DeleteRemote { grace_seconds } => {
                let dp = DeleteParams {
                    grace_period_seconds: grace_seconds.and_then(|g| u32::try_from(g).ok()),
                    preconditions: match &own {
                        Outcome::Shadow(s) => Some(Preconditions {
                            uid: s.metadata.uid.clone(),
                            resource_version: None,
                        }),
                        _ => None,
                    },
                    ..Default::default()
                };
                match p.api().delete(&shadow_name, &dp).await {
                    Ok(_) => info!(pod = %format!("{ns}/{name}"), "deleting its ShadowPod"),
                    Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                    Err(e) => return Err(e).context("deleting the ShadowPod"),
                }
                own
            }
            Step::DeleteStale => {
                if let Some(Some(s)) = &cached {
                    let dp = DeleteParams {
                        preconditions: Some(Preconditions {
                            uid: s.metadata.uid.clone(),
                            resource_version: None,
                        }),
                        ..Default::default()
                    };
                    match p.api().delete(&shadow_name, &dp).await {
                        Ok(_) => {
                            info!(pod = %format!("{ns}/{name}"), "deleting an earlier pod's ShadowPod of the same name")
                        }
                        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                        Err(e) => return Err(e).context("deleting a stale ShadowPod"),
                    }
                }
                Outcome::Nothing
            }
            Step::FinishDeletion => {
                let dp = DeleteParams {
                    grace_period_seconds: Some(0),
                    preconditions: Some(Preconditions {
                        uid,
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                match self.pods_in(&ns).delete(&name, &dp).await {
                    Ok(_) => {
                        info!(pod = %format!("{ns}/{name}"), "deleted: nothing runs for it on the provider")
                    }
                    Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                    Err(e) => return Err(e).context("completing the pod's deletion"),
                }
                Outcome::Gone
            }
            Step::Vanished => {
                // Failing the pod cannot be undone: the cache's word is not enough.
                match p.api().get_opt(&shadow_name).await {
                    Ok(Some(s)) if decide::owns(&s, pod) => Outcome::Shadow(Box::new(s)),
                    Ok(Some(_)) | Ok(None) => {
                        self.events
                            .publish(
                                pod,
                                &Event::warning(
                                    status::reason::VANISHED,
                                    "Offload",
                                    "the pod's ShadowPod vanished from the provider: the pod failed",
                                ),
                            )
                            .await;
                        warn!(pod = %format!("{ns}/{name}"), "its ShadowPod vanished from the provider");
                        Outcome::Vanished
                    }
                    Err(e) => return Err(e).context("reading the ShadowPod again"),
                }
            }
        })
    }

    /// Carries the home pod's container resources into its ShadowPod (over the version it
    /// was decided on); a refusal (the grant would be exceeded) leaves the pod at its size
    /// and is said at home.
    async fn resize(
        &self,
        pod: &Pod,
        p: &Provider,
        shadow_name: &str,
        own: Outcome,
    ) -> Result<Outcome> {
        let s = match own {
            Outcome::Shadow(s) => s,
            other => return Ok(other),
        };
        let want = pod.spec.clone().unwrap_or_default();
        let Some(resized) = resize::resized(&want, &s.spec.pod.spec) else {
            return Ok(Outcome::Shadow(s));
        };
        let patch = json!({
            "metadata": { "resourceVersion": s.metadata.resource_version },
            "spec": { "pod": { "spec": resized } },
        });
        let key = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
        match p
            .api()
            .patch(shadow_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(updated) => {
                info!(pod = %key, "resized its ShadowPod");
                Ok(Outcome::Shadow(Box::new(updated)))
            }
            // Changed meanwhile: decided again on the next version.
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Outcome::Shadow(s)),
            Err(kube::Error::Api(e)) if matches!(e.code, 400 | 403 | 422) => {
                let message = format!("the provider refused the resize: {}", e.message);
                warn!(pod = %key, code = e.code, error = %e.message, "resize refused");
                self.events
                    .publish(
                        pod,
                        &Event::warning(resize::INFEASIBLE, "Resize", message.clone()),
                    )
                    .await;
                Ok(Outcome::ResizeRefused { shadow: s, message })
            }
            Err(e) => Err(e).context("resizing the ShadowPod"),
        }
    }

    async fn create(&self, pod: &Pod, p: &Provider, shadow_name: &str) -> Result<Outcome> {
        let consumer = p.consumer().await?;
        let spec = match forge::forge(pod, consumer, &Offer::default(), &Policy::default()) {
            Ok(spec) => spec,
            Err(refusal) => {
                let message = refusal.to_string();
                self.events
                    .publish(
                        pod,
                        &Event::warning(status::reason::REFUSED, "Offload", message.clone()),
                    )
                    .await;
                return Ok(Outcome::Refused {
                    message,
                    retry: false,
                });
            }
        };
        let (labels, annotations) = decide::wanted_metadata(pod, consumer);
        let shadow = ShadowPod {
            metadata: ObjectMeta {
                name: Some(shadow_name.to_owned()),
                namespace: Some(p.client.default_namespace().to_owned()),
                labels: Some(labels),
                annotations: (!annotations.is_empty()).then_some(annotations),
                // The provider's controller would add its finalizer first thing (a patch and
                // a round of its reconciler per pod): set at creation, it goes straight on.
                finalizers: Some(vec![names::finalizer::SHADOW_POD.to_owned()]),
                ..Default::default()
            },
            spec,
            status: None,
        };
        let key = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
        match p.api().create(&PostParams::default(), &shadow).await {
            Ok(s) => {
                info!(pod = %key, shadowpod = %shadow_name, "offloaded");
                self.events
                    .publish(
                        pod,
                        &Event::normal(
                            "Offloaded",
                            "Offload",
                            format!("ShadowPod {shadow_name} created on the provider"),
                        ),
                    )
                    .await;
                Ok(Outcome::Shadow(Box::new(s)))
            }
            // Created by an earlier run whose listing had not caught up.
            Err(kube::Error::Api(e)) if e.code == 409 => {
                match p.api().get_opt(shadow_name).await? {
                    Some(s) if decide::owns(&s, pod) => Ok(Outcome::Shadow(Box::new(s))),
                    _ => Ok(Outcome::Nothing),
                }
            }
            Err(kube::Error::Api(e)) if matches!(e.code, 400 | 403 | 422) => {
                let retry = e.code == 403;
                let message = format!("the provider refused the ShadowPod: {}", e.message);
                warn!(pod = %key, code = e.code, error = %e.message, "ShadowPod refused");
                self.events
                    .publish(
                        pod,
                        &Event::warning(
                            if retry {
                                status::reason::FORBIDDEN
                            } else {
                                status::reason::REFUSED
                            },
                            "Offload",
                            message.clone(),
                        ),
                    )
                    .await;
                Ok(Outcome::Refused { message, retry })
            }
            Err(e) => Err(e).context("creating the ShadowPod"),
        }
    }

    /// ShadowPods whose home pod is gone (deleted at home without this process, or force
    /// deleted): they go too, once a fresh read of the home pod confirms it.
    async fn collect_orphans(&self) {
        let Some(p) = self.provider.borrow().clone() else {
            return;
        };
        if !p.listed() || !self.ready.borrow().as_ref().is_some_and(|r| r.ready) {
            return;
        }
        for s in p.shadows.state() {
            let (ns, name) = home_key(&s);
            let here = self.store.get(&ObjectRef::new(&name).within(&ns));
            if !decide::orphaned(&s, here.as_deref()) {
                continue;
            }
            if let Err(e) = self.delete_orphan(&p, &s).await {
                warn!(shadowpod = %s.name_any(), error = %format!("{e:#}"), "an orphan");
            }
        }
    }
}

/// A merge patch removes keys by setting them to null: those the ShadowPod has and the home
/// pod no longer has.
fn with_removals(
    mut patch: serde_json::Value,
    s: &ShadowPod,
    labels: &std::collections::BTreeMap<String, String>,
    annotations: &std::collections::BTreeMap<String, String>,
) -> serde_json::Value {
    let stale = |have: Option<&std::collections::BTreeMap<String, String>>,
                 want: &std::collections::BTreeMap<String, String>| {
        have.into_iter()
            .flatten()
            .filter(|(k, _)| !want.contains_key(*k))
            .map(|(k, _)| k.clone())
            .collect::<Vec<_>>()
    };
    for (path, have, want) in [
        (
            &["metadata", "labels"][..],
            s.metadata.labels.as_ref(),
            labels,
        ),
        (
            &["metadata", "annotations"][..],
            s.metadata.annotations.as_ref(),
            annotations,
        ),
        (
            &["spec", "pod", "labels"][..],
            Some(&s.spec.pod.labels),
            labels,
        ),
        (
            &["spec", "pod", "annotations"][..],
            Some(&s.spec.pod.annotations),
            annotations,
        ),
    ] {
        let mut at = &mut patch;
        for p in path {
            at = &mut at[*p];
        }
        for k in stale(have, want) {
            at[k] = serde_json::Value::Null;
        }
    }
    patch
}

/// Runs the pod loop until the watches end (they do not).
pub async fn run(
    local: Client,
    opts: Opts,
    secret: watch::Receiver<Option<Secret>>,
    ready: watch::Receiver<Option<Readiness>>,
) -> Result<()> {
    let (provider_tx, mut provider_rx) = watch::channel(None);
    let (touched_tx, mut touched_rx) = mpsc::unbounded_channel();
    let retry = touched_tx.clone();
    tokio::spawn(follow_provider(secret, provider_tx, touched_tx));
    let mut config = crate::run::follow(
        Api::<Configuration>::namespaced(local.clone(), &opts.fabric_namespace),
        &opts.provider_id,
    );
    let pods: Api<Pod> = Api::all(local.clone());
    let (store, writer) = reflector::store();
    let bound = watcher::Config::default().fields(&format!("spec.nodeName={}", opts.node_name));
    let pod_events = reflector::reflector(writer, watcher(pods.clone(), bound))
        .default_backoff()
        .touched_objects();
    let mut pod_events = std::pin::pin!(pod_events);
    let mut ready_rx = ready.clone();
    let events = Events::new(
        local,
        names::field_manager::VIRTUAL_KUBELET,
        Some(opts.node_name.clone()),
    );
    let l = Loop {
        pods,
        store: store.clone(),
        provider: provider_rx.clone(),
        config: config.clone(),
        ready,
        events,
        opts: opts.clone(),
        written: Default::default(),
        failures: Default::default(),
        retry,
    };
    let mut resync = tokio::time::interval(opts.resync);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Pods are synced as they come, up to SYNCS at a time, while the watches go on being
    // read: a burst of bindings is offloaded side by side, not one event per round.
    let mut queue: Queue<Key> = Queue::default();
    let mut syncs = futures::stream::FuturesUnordered::new();
    loop {
        if store.wait_until_ready().now_or_never().is_some() {
            while syncs.len() < SYNCS {
                let Some(k) = queue.start() else { break };
                let l = &l;
                syncs.push(async move {
                    l.sync(&k).await;
                    k
                });
            }
        }
        let mut all = false;
        tokio::select! {
            Some(k) = syncs.next(), if !syncs.is_empty() => queue.done(&k),
            ev = pod_events.next() => match ev {
                Some(Ok(p)) => queue.push((p.namespace().unwrap_or_default(), p.name_any())),
                Some(Err(e)) => warn!(error = %e, "watching the pods bound to the node"),
                None => anyhow::bail!("the pod watch ended"),
            },
            Some(k) = touched_rx.recv() => queue.push(k),
            r = provider_rx.changed() => { r.context("the provider follower ended")?; all = true; }
            r = config.changed() => { r.context("the Configuration watch ended")?; all = true; }
            r = ready_rx.changed() => { r.context("the node loop ended")?; all = true; }
            _ = resync.tick() => {
                all = true;
                l.collect_orphans().await;
            }
        }
        if all {
            for p in store.state() {
                queue.push((p.namespace().unwrap_or_default(), p.name_any()));
            }
        }
    }
}
