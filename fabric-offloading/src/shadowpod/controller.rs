//! The provider's ShadowPod controller (I/O edge of [`super::decide`]): from watch caches of
//! ShadowPods and of the pods they own (one reflector of owned pods is both the controller's
//! trigger and the store it reads, so a reconcile sees at least the pod change that caused
//! it). Nothing here talks to the consumer: its pods keep running, and vanished ones are
//! re-created, while the consumer is unreachable. A real pod carries the controller's
//! finalizer until its end is written in the ShadowPod's status, so that one that finished
//! is never made again, even if it was removed while the controller was down. A change of the ShadowPod's container
//! resources resizes the real pod in place ([`super::resize`]). A pod is only made from a
//! ShadowPod whose pod keeps to the provider's [`super::policy`]. A ShadowPod whose pod
//! finished is deleted once the provider admin's retention has passed since it did
//! ([`super::lifetime::collect`]), so that finished ones do not pile up in the store.
use std::{sync::Arc, time::Duration};

use fabric_api::{
    authentication::v1alpha1::Tenant,
    names::{self, field_manager, finalizer as finalizers, label},
    offloading::v1alpha1::{ShadowPod, ShadowPodStatus},
};
use fabric_kube::{
    cache,
    controller::{Backoff, FinalizerError, Runner, finalized},
    status::FieldManager,
    written::Writes,
};
use futures::StreamExt;
use k8s_openapi::{api::core::v1::Pod, jiff::Timestamp};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        predicates,
        reflector::{ObjectRef, Store},
        watcher,
    },
};
use tracing::{debug, info, warn};

use super::{
    decide::{self, Cached, Decision},
    lifetime::{self, Collect},
    policy::Rules,
    resize,
};

const STATUS: FieldManager = FieldManager(field_manager::SHADOW_POD);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Finalizer(#[from] FinalizerError),
    /// The ShadowPod waits for its pod to end before it goes.
    #[error("pod {0} is still terminating")]
    Terminating(String),
}

struct Ctx {
    client: Client,
    /// The pods this controller owns, as its watch has them.
    owned: Store<Pod>,
    fences: super::fence::Fences,
    events: fabric_kube::events::Events,
    /// Whether the API server serves `pods/resize` (Kubernetes 1.33 on), once asked.
    resize_served: tokio::sync::OnceCell<bool>,
    /// Our last status writes per ShadowPod (by [`key`]) until the watch cache shows them.
    written: Writes<String, ShadowPod>,
    /// What the provider lets tenants' pods do and where they run: a pod breaking it is
    /// never made. A Tenant may have a level of its own ([`Self::rules_for`]).
    rules: Rules,
    tenants: Store<Tenant>,
    /// How long a ShadowPod whose pod finished stays.
    finished_retention: lifetime::Retention,
}

impl Ctx {
    /// The rules for `shadow`'s pod: its tenant's level, if the admin gave it one.
    fn rules_for(&self, shadow: &ShadowPod) -> Rules {
        let consumer = &shadow.spec.cluster_id;
        let level = self
            .tenants
            .get(&ObjectRef::new(consumer).within(&names::namespace::tenant(consumer)))
            .and_then(|t| t.spec.pod_security);
        self.rules.for_tenant(level)
    }

    /// Writes `status` conditioned on the version of `copy` and remembers the write;
    /// `false`: the stored ShadowPod has moved on from that copy (409).
    async fn write_over(
        &self,
        shadows: &Api<ShadowPod>,
        copy: &ShadowPod,
        status: &ShadowPodStatus,
    ) -> Result<bool, Error> {
        let rv = copy.metadata.resource_version.clone();
        match STATUS
            .apply_status_at(shadows, &copy.name_any(), rv.as_deref(), status)
            .await
        {
            Ok(after) => {
                self.written.wrote(key(copy), rv, after);
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// A Warning Event on `shadow` when its pod has just been found to break the provider's
    /// current policy (`status` written over the copy's): what the provider's admin looks for
    /// after tightening it.
    async fn say_breaking(&self, shadow: &ShadowPod, status: &ShadowPodStatus) {
        let prev = shadow.status.clone().unwrap_or_default();
        if let Some(why) = decide::newly_breaking(&prev, status) {
            warn!(shadowpod = %key(shadow), %why, "a running pod breaks the provider's current policy");
            self.events
                .publish(
                    shadow,
                    &fabric_kube::events::Event::warning("BreaksCurrentPolicy", "Check", why),
                )
                .await;
        }
    }

    /// The watch cache's copy of pod `ns/name`.
    fn cached_pod(&self, ns: &str, name: &str) -> Option<Arc<Pod>> {
        self.owned.get(&ObjectRef::new(name).within(ns))
    }
}

/// How making a ShadowPod's first pod from the cached copy went.
enum Made {
    /// Done (made and counted, or refused and said): nothing more this time.
    Done(Action),
    /// The cached copy was behind, or the name is taken: decide on a fresh read.
    Fresh,
}

/// Makes the first pod of `cached`, which the cache says never had one, and writes its
/// status conditioned on the cached copy's version. The name makes a second pod impossible:
/// a pod already there (made by an earlier reconcile the cache has not shown yet, or by
/// someone else) is left to the fresh read.
async fn create_first(
    cached: &ShadowPod,
    ctx: &Ctx,
    pods: &Api<Pod>,
    shadows: &Api<ShadowPod>,
) -> Result<Made, Error> {
    let k = key(cached);
    let prev = cached.status.clone().unwrap_or_default();
    let generation = cached.metadata.generation;
    let status = match pods
        .create(
            &PostParams::default(),
            &decide::real_pod(cached, &ctx.rules),
        )
        .await
    {
        Ok(pod) => {
            info!(shadowpod = %k, "created the pod");
            decide::mirrored(&prev, &pod, false, generation, Timestamp::now())
        }
        Err(kube::Error::Api(e)) if e.code == 409 => return Ok(Made::Fresh),
        Err(kube::Error::Api(e)) if matches!(e.code, 400 | 403 | 422) => {
            warn!(shadowpod = %k, error = %e.message, "pod refused");
            decide::refused(
                &prev,
                &e.reason,
                e.message.clone(),
                generation,
                Timestamp::now(),
            )
        }
        Err(e) => return Err(e.into()),
    };
    let refused = status.pod_uid.is_none();
    if !ctx.write_over(shadows, cached, &status).await? {
        // Written meanwhile: the made pod's own watch event brings it back here, and it is
        // then counted from what was written.
        debug!(shadowpod = %k, "cached copy behind after creating");
        if refused {
            return Ok(Made::Fresh);
        }
    }
    // A refusal is tried again later: a quota may free up.
    Ok(Made::Done(if refused {
        Action::requeue(Duration::from_secs(30))
    } else {
        Action::await_change()
    }))
}

/// Resizes the pod in place: through the `resize` subresource where it is served (a plain
/// update of the resources is refused there), else by updating the pod.
async fn resize_pod(
    ctx: &Ctx,
    pods: &Api<Pod>,
    name: &str,
    patch: &serde_json::Value,
) -> Result<(), Error> {
    let served = *ctx
        .resize_served
        .get_or_try_init(|| async {
            let core = ctx.client.list_core_api_resources("v1").await?;
            Ok::<_, kube::Error>(core.resources.iter().any(|r| r.name == "pods/resize"))
        })
        .await?;
    let pp = PatchParams::default();
    if served {
        pods.patch_subresource("resize", name, &pp, &Patch::Strategic(patch))
            .await?;
    } else {
        pods.patch(name, &pp, &Patch::Strategic(patch)).await?;
    }
    Ok(())
}

/// Adds (`hold`) or removes the controller's finalizer on `pod` ([`decide::finalizer_patch`]);
/// a pod changed meanwhile (409) or gone is left to its next event.
pub(super) async fn hold_pod(pods: &Api<Pod>, pod: &Pod, hold: bool) -> kube::Result<()> {
    let Some(patch) = decide::finalizer_patch(pod, hold) else {
        return Ok(());
    };
    match pods
        .patch(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if matches!(e.code, 404 | 409) => Ok(()),
        Err(e) => Err(e),
    }
}

fn key(s: &ShadowPod) -> String {
    format!("{}/{}", s.namespace().unwrap_or_default(), s.name_any())
}

async fn get_pod(pods: &Api<Pod>, name: &str) -> Result<Option<Pod>, Error> {
    Ok(pods.get_opt(name).await?)
}

/// [`apply`], and the ShadowPod deleted once its pod has been finished for the retention
/// (its end as recorded in its status; the finalizer's cleanup then removes the pod).
async fn apply_or_collect(cached: Arc<ShadowPod>, ctx: &Ctx) -> Result<Action, Error> {
    // Our own last write stands in for the cache's copy until the cache shows it.
    let cached = ctx.written.freshest(&key(&cached), cached);
    let recorded = cached
        .annotations()
        .contains_key(names::annotation::HOME_RECORDED);
    let collect = lifetime::collect(
        cached.status.as_ref(),
        recorded,
        ctx.finished_retention,
        Timestamp::now(),
    );
    if collect == Collect::Delete {
        let shadows: Api<ShadowPod> =
            Api::namespaced(ctx.client.clone(), &cached.namespace().unwrap_or_default());
        let dp = fabric_kube::meta::only_uid(cached.metadata.uid.clone(), None);
        fabric_kube::meta::delete(&shadows, &cached.name_any(), &dp).await?;
        info!(shadowpod = %key(&cached), retention = ?ctx.finished_retention, "the pod finished; collected its ShadowPod");
        return Ok(Action::await_change());
    }
    let action = apply(cached, ctx).await?;
    Ok(match collect {
        // A shorter wait of its own (a pod being let go) comes first; it ends in waiting
        // for a change, which is then the retention's end.
        Collect::Wait(left) if action == Action::await_change() => Action::requeue(left),
        _ => action,
    })
}

async fn apply(cached: Arc<ShadowPod>, ctx: &Ctx) -> Result<Action, Error> {
    let k = key(&cached);
    let ns = cached.namespace().unwrap_or_default();
    let name = cached.name_any();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let shadows: Api<ShadowPod> = Api::namespaced(ctx.client.clone(), &ns);
    // Most reconciles (the pod's status changing, our own writes echoed) only mirror the pod:
    // decided on the cached copies, written over the ShadowPod's version, reading nothing.
    // The pod cache is the trigger's own: it holds at least the change that caused this.
    if ctx.owned.wait_until_ready().await.is_err() {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let seen = ctx.cached_pod(&ns, &name);
    let stopping = matches!(
        ctx.fences.verdict(&cached.spec.cluster_id),
        super::partition::Verdict::Stop { .. }
    );
    let resizing = seen.as_ref().is_some_and(|p| {
        let want = decide::wanted(&cached, &ctx.rules);
        resize::patch(&want, &p.spec.clone().unwrap_or_default()).is_some()
    });
    match decide::from_cache(
        &cached,
        seen.as_deref(),
        stopping,
        resizing,
        &ctx.rules_for(&cached),
        Timestamp::now(),
    ) {
        Cached::Settled => return Ok(Action::await_change()),
        Cached::Write(status) => {
            if ctx.write_over(&shadows, &cached, &status).await? {
                ctx.say_breaking(&cached, &status).await;
                return Ok(Action::await_change());
            }
            // The cache was behind: decided again below on a fresh read.
            debug!(shadowpod = %k, "cached copy behind; reading afresh")
        }
        Cached::Create => match create_first(&cached, ctx, &pods, &shadows).await? {
            Made::Done(action) => return Ok(action),
            Made::Fresh => {}
        },
        Cached::Fresh => {}
    }
    // The watch cache can lag behind our own status writes: deciding from a stale copy would
    // undo a counted re-creation or, worse, revive a pod that finished. Read it afresh.
    let Some(shadow) = shadows.get_opt(&name).await? else {
        return Ok(Action::await_change());
    };
    // Only this controller writes a ShadowPod's status or makes its pod, one reconcile per
    // ShadowPod at a time: the pod read now is what a fresh read of the ShadowPod is decided
    // with.
    let pod = get_pod(&pods, &name).await?;
    if shadow.metadata.deletion_timestamp.is_some() {
        // Going away: the finalizer's cleanup follows, nothing is created meanwhile.
        return Ok(Action::await_change());
    }
    let prev = shadow.status.clone().unwrap_or_default();
    let generation = shadow.metadata.generation;
    let fenced = super::fence::enforce(
        &ctx.fences,
        &ctx.events,
        &STATUS,
        &shadows,
        &pods,
        &shadow,
        pod.as_ref(),
    );
    if fenced.await? {
        return Ok(Action::await_change());
    }
    let status: ShadowPodStatus = match decide::decide(
        &shadow,
        pod.as_ref(),
        &ctx.rules_for(&shadow),
    ) {
        // Its end stamped, if an earlier release did not: the retention counts from it.
        Decision::Finished if prev.finished_at.is_none() => ShadowPodStatus {
            finished_at: lifetime::finished_at(&prev, prev.phase.as_deref(), Timestamp::now()),
            ..prev.clone()
        },
        Decision::Finished => return Ok(Action::await_change()),
        // Made once the ShadowPod's pod is changed to keep to the policy (its watch event).
        Decision::Disallowed(refusal) => {
            warn!(shadowpod = %key(&shadow), %refusal, "pod disallowed by the provider's policy");
            decide::disallowed(&prev, &refusal, generation, Timestamp::now())
        }
        Decision::Foreign => decide::foreign(&prev, generation, Timestamp::now()),
        Decision::Mirror => {
            let pod = pod.expect("Mirror has a pod");
            if let Some(patch) = decide::metadata_patch(&shadow, &pod) {
                pods.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                debug!(shadowpod = %key(&shadow), "labels and annotations updated");
            }
            let running = pod.spec.clone().unwrap_or_default();
            let mut refusal = None;
            let want = decide::wanted(&shadow, &ctx.rules);
            if let Some(patch) = resize::patch(&want, &running) {
                match resize_pod(ctx, &pods, &name, &patch).await {
                    Ok(()) => info!(shadowpod = %key(&shadow), "resized the pod in place"),
                    // Refused here: said on the ShadowPod (the consumer shows it at home),
                    // tried again on the next change.
                    Err(Error::Kube(kube::Error::Api(e)))
                        if matches!(e.code, 400 | 403 | 409 | 422 | 429) =>
                    {
                        warn!(shadowpod = %key(&shadow), error = %e.message, "resize refused");
                        refusal = Some((resize::refusal_reason(e.code), e.message.clone()));
                    }
                    Err(e) => return Err(e),
                }
            }
            // The status is mirrored from the cache's copy, never from a read fresher than
            // it: the next reconcile mirrors the cache again, which would undo that read's
            // newer status. A pod the cache has not shown yet is mirrored on its event.
            let Some(seen) = ctx
                .cached_pod(&ns, &name)
                .filter(|p| p.metadata.uid == pod.metadata.uid)
            else {
                return Ok(Action::await_change());
            };
            let now = Timestamp::now();
            let mut st = decide::with_compliance(
                decide::mirrored(&prev, &seen, false, generation, now),
                &shadow,
                &ctx.rules_for(&shadow),
                generation,
                now,
            );
            st.conditions = resize::pending(&st.conditions, refusal, generation, now);
            if pod.metadata.deletion_timestamp.is_none() {
                // A pod made by an earlier release gets the finalizer.
                hold_pod(&pods, &pod, true).await?;
            } else if decide::held(&pod) {
                // Going: let go once its end is written (below), else on the cache's
                // next copy of it.
                write_status(ctx, &shadows, &shadow, &st).await?;
                if decide::recorded(&st, &pod) {
                    hold_pod(&pods, &pod, false).await?;
                    debug!(shadowpod = %key(&shadow), "the pod's end recorded; let go");
                    return Ok(Action::await_change());
                }
                return Ok(Action::requeue(Duration::from_secs(1)));
            }
            st
        }
        Decision::Create { again } => {
            match pods
                .create(
                    &PostParams::default(),
                    &decide::real_pod(&shadow, &ctx.rules),
                )
                .await
            {
                Ok(pod) => {
                    info!(shadowpod = %key(&shadow), again, "created the pod");
                    decide::mirrored(&prev, &pod, again, generation, Timestamp::now())
                }
                // Refused by admission, quota or validation: said in the status, tried
                // again later (a quota may free up).
                Err(kube::Error::Api(e)) if matches!(e.code, 400 | 403 | 422) => {
                    warn!(shadowpod = %key(&shadow), error = %e.message, "pod refused");
                    let status = decide::refused(
                        &prev,
                        &e.reason,
                        e.message.clone(),
                        generation,
                        Timestamp::now(),
                    );
                    let after = STATUS
                        .apply_status_at(&shadows, &name, None, &status)
                        .await?;
                    ctx.written
                        .wrote(k, shadow.metadata.resource_version.clone(), after);
                    return Ok(Action::requeue(Duration::from_secs(30)));
                }
                Err(e) => return Err(e.into()),
            }
        }
    };
    write_status(ctx, &shadows, &shadow, &status).await?;
    ctx.say_breaking(&shadow, &status).await;
    Ok(Action::await_change())
}

/// Writes `status` decided on a fresh read of `shadow`, if it differs. Not conditioned: a
/// pod just made must be counted whatever else (labels) changed meanwhile.
async fn write_status(
    ctx: &Ctx,
    shadows: &Api<ShadowPod>,
    shadow: &ShadowPod,
    status: &ShadowPodStatus,
) -> Result<(), Error> {
    if shadow.status.as_ref() != Some(status) {
        let after = STATUS
            .apply_status_at(shadows, &shadow.name_any(), None, status)
            .await?;
        ctx.written
            .wrote(key(shadow), shadow.metadata.resource_version.clone(), after);
    }
    Ok(())
}

/// Deletes the pod gracefully and keeps the ShadowPod until the pod is gone, so that the
/// consumer sees its pod terminating as long as it runs.
async fn cleanup(shadow: Arc<ShadowPod>, ctx: &Ctx) -> Result<Action, Error> {
    let ns = shadow.namespace().unwrap_or_default();
    let name = shadow.name_any();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    ctx.written.forget(&key(&shadow));
    match get_pod(&pods, &name).await? {
        Some(pod) if decide::owned_by(&pod, &shadow) => {
            if pod.metadata.deletion_timestamp.is_none() {
                pods.delete(&name, &DeleteParams::default()).await?;
                info!(shadowpod = %key(&shadow), "deleting the pod");
            } else {
                // Nothing left to record: the ShadowPod goes too. The pod still ends
                // gracefully (the finalizer never held its containers).
                hold_pod(&pods, &pod, false).await?;
            }
            Err(Error::Terminating(key(&shadow)))
        }
        _ => Ok(Action::await_change()),
    }
}

async fn reconcile(shadow: Arc<ShadowPod>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let api: Api<ShadowPod> =
        Api::namespaced(ctx.client.clone(), &shadow.namespace().unwrap_or_default());
    finalized(
        &api,
        finalizers::SHADOW_POD,
        shadow,
        |s| apply_or_collect(s, &ctx),
        |s| cleanup(s, &ctx),
    )
    .await
}

/// ShadowPods reconciled at the same time (each a few calls to the API), as many as the
/// consumer's virtual kubelet syncs pods: at 100 pods faster than unbounded (Running 5.1 vs
/// 7.8 s), and at 1,000 no 429s where unbounded had thousands (issue 22 §4).
const SYNCS: u16 = 32;

/// Retries after 1 s, then at most every 5 s.
const BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(5));

/// Runs the controller over every namespace's ShadowPods until a signal stops it.
/// `rules`: what the provider lets tenants' pods do and where they run (the webhook's too);
/// `finished_retention`: how long a ShadowPod whose pod finished stays.
pub async fn run(
    client: Client,
    rules: Rules,
    finished_retention: lifetime::Retention,
) -> Result<(), Error> {
    let shadows: Api<ShadowPod> = Api::all(client.clone());
    let pods: Api<Pod> = Api::all(client.clone());
    // Only the pods the fabric runs for consumers: a provider's own pods stay out of the cache.
    let owned_cfg = watcher::Config::default().labels(label::REMOTE_CLUSTER);
    let (owned, owned_pods) = cache::touched(pods, owned_cfg);
    let (fences, mut silent) = super::fence::spawn(client.clone());
    let events = fabric_kube::events::Events::new(client.clone(), field_manager::SHADOW_POD, None);
    // A consumer turned silent: every ShadowPod is looked at again (those of others are left
    // as they are), which is rare enough not to need a finer trigger.
    let silent = futures::stream::poll_fn(move |cx| silent.poll_recv(cx)).map(|_ns| ());
    // A Tenant's spec changed (its pod security level, by the provider's admin): every
    // ShadowPod is looked at again, so that its running pods are judged by the new level.
    // Status writes (the webhook's charges) do not move the generation.
    // Read before any pod is made: a tenant's own level must never be missed for the default.
    let (tenants, _tenants_task) = cache::lean(
        Api::<Tenant>::all(client.clone()),
        watcher::Config::default(),
        "Tenant",
    );
    // The reconciles read the level from that cache, which another watch fills: the trigger
    // waits until the cache has the generation it saw, or a reconcile could judge by the old
    // level and nothing would trigger one again.
    let seen_by_cache = tenants.clone();
    let tenant_specs = watcher::watcher(
        Api::<Tenant>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .applied_objects()
    .predicate_filter(predicates::generation, Default::default())
    .filter_map(|t| futures::future::ready(t.ok()))
    .then(move |t| {
        let cache = seen_by_cache.clone();
        async move {
            let key = kube::runtime::reflector::ObjectRef::from_obj(&t);
            let wanted = t.metadata.generation;
            for _ in 0..200 {
                let cached = cache.get(&key).and_then(|c| c.metadata.generation);
                if cached >= wanted {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    let controller = Controller::new(shadows, watcher::Config::default())
        .owns_stream(owned_pods)
        .reconcile_all_on(futures::stream::select(silent, tenant_specs));
    if tenants.wait_until_ready().await.is_err() {
        return Ok(());
    }
    let ctx = Arc::new(Ctx {
        client,
        owned,
        fences,
        events,
        resize_served: tokio::sync::OnceCell::new(),
        written: Default::default(),
        rules,
        tenants,
        finished_retention,
    });
    Runner::new("shadowpods", BACKOFF)
        .concurrency(SYNCS)
        // The pod is ending: its ShadowPod goes once it has.
        .waits(|e| matches!(e, Error::Terminating(_)).then_some(Duration::from_secs(2)))
        .run(controller, reconcile, ctx)
        .await;
    Ok(())
}
