//! The pod kind's writes: [`decide`]'s step carried out on the provider (the ShadowPod
//! created, its labels and annotations followed, resized, deleted) or at home (a deletion
//! completed), then the home status [`status`] computes written under the virtual kubelet's
//! field manager, with the Events a kubelet would record.
use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use fabric_api::{names, offloading::v1alpha1::ShadowPod};
use fabric_kube::{
    events::Event,
    meta::{self, GoneOk},
};
use fabric_offloading::shadowpod::{
    forge::{self, Offer, Policy},
    resize,
};
use fabric_reflector::{Cx, Deleted, Marks, Next};
use k8s_openapi::{api::core::v1::Pod, jiff::Timestamp};
use kube::{
    Api, ResourceExt,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
};
use serde_json::json;
use tracing::{debug, info, warn};

use super::{
    decide::{self, Step},
    failures,
    kind::{Placement, Pods},
    status::{self, Context, Seen},
};
use crate::{
    FIELD_MANAGER,
    tokens::{self, edge as token_edge},
};

/// What carrying out a step saw of the provider, for the status.
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
    /// The pod is another reflection's (its ShadowPod is in the tenant namespace): no status.
    Skip,
    /// Its namespace has no twin on the provider (why).
    NoTwin(String),
    /// It ran in a twin that is gone (why).
    Aborted(String),
    /// Its service-account token could not be made (why): not created.
    NoToken(String),
    /// Its twin's Service of the home API server has no address yet (why): not created.
    NoHomeApi(String),
    /// The heartbeat on the provider is not recent (why): not created.
    NoHeartbeat(String),
    /// A claim it mounts is not in the twin yet (why): not created.
    NoVolume(String),
    /// Its ShadowPod, made by this process moments ago, is not in the watch yet: looked at
    /// again by then ([`super::made`]).
    AwaitEcho(Duration),
}

/// How soon a pod whose token could not be made, or refreshed, is looked at again.
const TOKEN_RETRY: Duration = Duration::from_secs(30);
/// How soon a pod waiting for the heartbeat is looked at again (renewals come at least
/// every second under short partition times).
const HEARTBEAT_RETRY: Duration = Duration::from_secs(1);
/// How soon a pod waiting for a claim in its twin is looked at again.
const VOLUME_RETRY: Duration = Duration::from_secs(2);

/// Carries out `step` for the pod of `cx`, then writes its home status. A failed step still
/// reports what is known (the pod not Ready while the provider is out of reach, say) and is
/// retried with back-off.
pub async fn act(pods: &Pods, cx: &Cx<'_, Pods>, step: Step) -> Result<Next> {
    if step == Step::Skip {
        return Ok(Next::Done);
    }
    let alive = matches!(
        step,
        Step::Create
            | Step::Report
            | Step::Wait
            | Step::UpdateMetadata
            | Step::Resize
            | Step::AwaitHomeApi(_)
            | Step::AwaitHeartbeat(_)
    );
    let (outcome, failed) = match carry_out(pods, cx, step).await {
        Ok(o) => (o, None),
        Err(e) => (Outcome::Nothing, Some(e)),
    };
    let next = match &outcome {
        Outcome::AwaitEcho(d) => Next::After(*d),
        Outcome::NoToken(_) => Next::After(TOKEN_RETRY),
        Outcome::NoVolume(_) => Next::After(VOLUME_RETRY),
        Outcome::NoHeartbeat(_) => Next::After(HEARTBEAT_RETRY),
        Outcome::Shadow(_) if alive && cx.view.reachable && pods.placement == Placement::Twin => {
            refresh_tokens(cx).await
        }
        _ => Next::Done,
    };
    report(pods, cx, outcome).await;
    match failed {
        Some(e) => Err(e),
        None => Ok(next),
    }
}

/// The home pod as it runs in its twin ([`tokens::rewrite`]) and the tokens that takes.
fn with_tokens(pod: &Pod) -> (Pod, Vec<tokens::Wanted>) {
    let mut p = pod.clone();
    let wanted = match p.spec.as_mut() {
        Some(spec) => tokens::rewrite(pod, spec),
        None => Vec::new(),
    };
    (p, wanted)
}

/// The twin's Secrets through the pair's endpoint, if it has one.
fn twin_secrets<'a>(cx: &'a Cx<'_, Pods>) -> Option<token_edge::Twin<'a>> {
    Some(token_edge::twin(
        cx.remote_client()?,
        cx.remote_namespace()?,
        cx.view.marks?,
    ))
}

/// Makes the tokens of the pod of `cx` that are missing or due; when the next is due.
async fn ensure_tokens(
    cx: &Cx<'_, Pods>,
    wanted: &[tokens::Wanted],
) -> Result<Option<Duration>, token_edge::Error> {
    let Some(twin) = twin_secrets(cx) else {
        return Ok(None);
    };
    let home = cx.home_api().into_client();
    token_edge::ensure(&home, &twin, cx.view.home.as_ref(), wanted, Timestamp::now).await
}

/// Refreshes the tokens of a running pod that are due; looked at again when the next is.
async fn refresh_tokens(cx: &Cx<'_, Pods>) -> Next {
    let pod = cx.view.home.as_ref();
    if decide::terminal(pod) || pod.metadata.deletion_timestamp.is_some() {
        return Next::Done;
    }
    let (_, wanted) = with_tokens(pod);
    if wanted.is_empty() {
        return Next::Done;
    }
    match ensure_tokens(cx, &wanted).await {
        Ok(Some(d)) => Next::After(d),
        Ok(None) => Next::Done,
        Err(e) => {
            warn!(pod = %key(pod), error = %e, "refreshing its service-account tokens");
            if !token_edge::transient(&e) {
                cx.event(&Event::warning(
                    status::reason::NO_TOKEN,
                    "RefreshToken",
                    e.to_string(),
                ))
                .await;
            }
            Next::After(TOKEN_RETRY)
        }
    }
}

fn key(pod: &Pod) -> String {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

/// Whether the pod's Offloaded condition says `reason` and `message` already (its Event
/// was recorded then).
fn says(pod: &Pod, reason: &str, message: &str) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| {
            c.type_ == status::OFFLOADED
                && c.reason.as_deref() == Some(reason)
                && c.message.as_deref() == Some(message)
        })
}

/// Publishes `event` about `pod` unless its Offloaded condition already says the event's
/// reason and note (the Event was recorded when the condition was written).
async fn say_once(cx: &Cx<'_, Pods>, pod: &Pod, event: Event) {
    if !says(pod, event.reason, &event.note) {
        cx.event(&event).await;
    }
}

/// Whether `pod` was offloaded pod by pod, before its namespace was: its ShadowPod is in the
/// tenant namespace, and the twin reflection leaves it to the tenant one. Read fresh: this
/// decides whether a second ShadowPod is made, or the pod failed.
async fn offloaded_to_tenant(cx: &Cx<'_, Pods>, pod: &Pod) -> Result<bool> {
    let Some(client) = cx.remote_client() else {
        return Ok(false);
    };
    let tenant: Api<ShadowPod> = Api::default_namespaced(client.clone());
    let name = forge::name(&pod.namespace().unwrap_or_default(), &pod.name_any());
    let found = tenant
        .get_opt(&name)
        .await
        .context("looking for the pod's ShadowPod in the tenant namespace")?;
    Ok(found.is_some_and(|s| decide::owns(&s, pod)))
}

async fn carry_out(pods: &Pods, cx: &Cx<'_, Pods>, step: Step) -> Result<Outcome> {
    let twin = pods.placement == Placement::Twin;
    let pod = cx.view.home.as_ref();
    let shadow_name = cx.remote_name();
    let own = match cx.view.remote.ours() {
        Some(s) if decide::owns(s, pod) => {
            pods.made.seen(cx.view.key);
            Outcome::Shadow(Box::new(s.clone()))
        }
        _ => Outcome::Nothing,
    };
    let (Some(api), Some(marks)) = (cx.remote_api(), cx.view.marks) else {
        return Ok(own);
    };
    Ok(match step {
        Step::Report | Step::Wait => own,
        Step::Skip => Outcome::Skip,
        Step::AwaitTwin(why) => {
            say_once(
                cx,
                pod,
                Event::warning(status::reason::NO_TWIN, "Offload", &why),
            )
            .await;
            Outcome::NoTwin(why)
        }
        Step::AwaitHomeApi(why) => {
            say_once(
                cx,
                pod,
                Event::normal(status::reason::NO_HOME_API, "Offload", &why),
            )
            .await;
            Outcome::NoHomeApi(why)
        }
        Step::AwaitHeartbeat(why) => Outcome::NoHeartbeat(why),
        Step::Aborted(why) => {
            // Failing the pod cannot be undone: offloaded pod by pod, it is not the twin's.
            if offloaded_to_tenant(cx, pod).await? {
                return Ok(own);
            }
            cx.event(&Event::warning(status::reason::ABORTED, "Offload", &why))
                .await;
            warn!(pod = %key(pod), why, "its twin namespace is gone: the pod failed");
            Outcome::Aborted(why)
        }
        Step::Create if twin && offloaded_to_tenant(cx, pod).await? => Outcome::Skip,
        Step::Create => match pods.home_api_for(pod) {
            Some(home_api) => {
                let made = create(cx, &api, marks, &shadow_name, twin, home_api).await?;
                if matches!(made, Outcome::Shadow(_)) {
                    let uid = pod.metadata.uid.clone().unwrap_or_default();
                    pods.made.record(cx.view.key.clone(), uid, Instant::now());
                }
                made
            }
            // Its twin's Service lost its address since the decision: decided again then.
            None => own,
        },
        Step::UpdateMetadata => {
            let Outcome::Shadow(s) = &own else {
                return Ok(own);
            };
            let (labels, annotations) = decide::wanted_metadata(pod, marks.origin());
            let mut marked = labels.clone();
            marks.stamp(&mut marked);
            let patch = json!({
                "metadata": { "labels": marked, "annotations": annotations },
                "spec": { "pod": { "labels": labels, "annotations": annotations } },
            });
            // JSON merge patch: keys gone at home must be removed there too.
            let patch = with_removals(patch, s, &marked, &labels, &annotations);
            let updated = api
                .patch(&shadow_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .context("updating the ShadowPod's labels and annotations")?;
            Outcome::Shadow(Box::new(updated))
        }
        Step::Resize => resize(cx, &api, &shadow_name, own).await?,
        Step::DeleteRemote { grace_seconds } => {
            if let Outcome::Shadow(s) = &own {
                let grace = grace_seconds.and_then(|g| u32::try_from(g).ok());
                let deleted = cx
                    .delete_remote(s, grace)
                    .await
                    .context("deleting the ShadowPod")?;
                if deleted == Deleted::Asked {
                    info!(pod = %key(pod), "deleting its ShadowPod");
                }
            }
            own
        }
        Step::DeleteStale => {
            if let Some(s) = cx.view.remote.ours() {
                let deleted = cx
                    .delete_remote(s, None)
                    .await
                    .context("deleting a stale ShadowPod")?;
                if deleted == Deleted::Asked {
                    info!(pod = %key(pod), "deleting an earlier pod's ShadowPod of the same name");
                }
            }
            Outcome::Nothing
        }
        Step::FinishDeletion => {
            // Its tokens go first: a failure here is retried before the pod is gone.
            if let (true, Some(t)) = (twin, twin_secrets(cx)) {
                let (_, wanted) = with_tokens(pod);
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                token_edge::remove(&t, &uid, &wanted)
                    .await
                    .context("removing the pod's token Secrets from the twin")?;
            }
            let dp = meta::only_uid(pod.metadata.uid.clone(), Some(0));
            let deleted = meta::delete(&cx.home_api(), &pod.name_any(), &dp)
                .await
                .context("completing the pod's deletion")?;
            if deleted == meta::Deleted::Asked {
                info!(pod = %key(pod), "deleted: nothing runs for it on the provider")
            }
            Outcome::Gone
        }
        Step::Vanished => {
            let uid = pod.metadata.uid.as_deref().unwrap_or_default();
            if let Some(due) = pods.made.echo_due(cx.view.key, uid, Instant::now()) {
                return Ok(Outcome::AwaitEcho(due));
            }
            // Failing the pod cannot be undone: the cache's word is not enough.
            match api.get_opt(&shadow_name).await {
                Ok(Some(s)) if cx.ours(&s) && decide::owns(&s, pod) => Outcome::Shadow(Box::new(s)),
                Ok(_) if twin && offloaded_to_tenant(cx, pod).await? => Outcome::Skip,
                Ok(Some(_)) | Ok(None) => {
                    cx.event(&Event::warning(
                        status::reason::VANISHED,
                        "Offload",
                        "the pod's ShadowPod vanished from the provider: the pod failed",
                    ))
                    .await;
                    warn!(pod = %key(pod), "its ShadowPod vanished from the provider");
                    Outcome::Vanished
                }
                Err(e) => return Err(e).context("reading the ShadowPod again"),
            }
        }
    })
}

/// Writes the home status for what `outcome` saw, if it says something new.
async fn report(pods: &Pods, cx: &Cx<'_, Pods>, outcome: Outcome) {
    let pod = cx.view.home.as_ref();
    let seen = match &outcome {
        Outcome::Gone | Outcome::Skip | Outcome::AwaitEcho(_) => return,
        Outcome::NoTwin(message) => Seen::NoTwin { message },
        Outcome::NoToken(message) => Seen::NoToken { message },
        Outcome::NoHomeApi(message) => Seen::NoHomeApi { message },
        Outcome::NoHeartbeat(message) => Seen::NoHeartbeat { message },
        Outcome::NoVolume(message) => Seen::NoVolume { message },
        Outcome::Aborted(message) => Seen::Aborted { message },
        Outcome::Shadow(s) => Seen::Shadow(s),
        Outcome::Nothing => Seen::Nothing,
        Outcome::Vanished => Seen::Vanished,
        Outcome::Refused { message, retry } => Seen::Refused {
            message,
            retry: *retry,
        },
        Outcome::ResizeRefused { shadow, message } => Seen::ResizeRefused { shadow, message },
    };
    let readiness = pods.ready.borrow().clone().unwrap_or_default();
    let remap = pods.remap.borrow().clone();
    let ctx = Context {
        reachable: cx.view.reachable,
        unreachable_message: &readiness.message,
        partitioned: readiness.partitioned.as_deref(),
        remap: remap.as_ref(),
        node_ip: &pods.node_ip,
        now: Timestamp::now(),
    };
    let Some(want) = status::home_status(pod.status.as_ref(), seen, &ctx) else {
        return;
    };
    let shadow = match &outcome {
        Outcome::Shadow(s) | Outcome::ResizeRefused { shadow: s, .. } => Some(s.as_ref()),
        _ => None,
    };
    if pod.status.as_ref().map(status::ours) == Some(want.clone()) {
        record_end(cx, shadow, &want).await;
        return;
    }
    let written = FIELD_MANAGER
        .apply_status_at(&cx.home_api(), &pod.name_any(), None, &want)
        .await
        .gone_ok();
    match written {
        Ok(Some(after)) => {
            debug!(pod = %key(pod), "status home");
            cx.wrote_home(after);
            for f in failures::new_failures(pod.status.as_ref(), &want) {
                cx.event(&Event::warning(f.reason, f.action, f.message))
                    .await;
            }
            record_end(cx, shadow, &want).await;
        }
        Ok(None) => {}
        Err(e) => warn!(pod = %key(pod), error = %e, "writing the pod status"),
    }
}

/// Tells the provider that the home pod's status says how its pod ended (`home`, as
/// written), so that it may collect the finished ShadowPod after its shorter retention
/// (annotation [`names::annotation::HOME_RECORDED`], once).
async fn record_end(
    cx: &Cx<'_, Pods>,
    shadow: Option<&ShadowPod>,
    home: &k8s_openapi::api::core::v1::PodStatus,
) {
    let (Some(s), Some(phase)) = (shadow, home.phase.as_deref()) else {
        return;
    };
    let finished_there = s.status.as_ref().is_some_and(|st| st.finished_at.is_some());
    if !matches!(phase, "Succeeded" | "Failed")
        || !finished_there
        || s.annotations()
            .contains_key(names::annotation::HOME_RECORDED)
        || s.metadata.deletion_timestamp.is_some()
    {
        return;
    }
    let Some(api) = cx.remote_api() else {
        return;
    };
    let patch = json!({"metadata": {"annotations": {names::annotation::HOME_RECORDED: phase}}});
    if let Err(e) = api
        .patch(
            &s.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        // Only shortens how long the provider keeps it: looked at again on the next sync.
        debug!(shadowpod = s.name_any(), error = %e, "recording the end at home on the ShadowPod");
    }
}

/// Carries the home pod's container resources into its ShadowPod (over the version it was
/// decided on); a refusal (the grant would be exceeded) leaves the pod at its size and is
/// said at home.
async fn resize(
    cx: &Cx<'_, Pods>,
    api: &Api<ShadowPod>,
    shadow_name: &str,
    own: Outcome,
) -> Result<Outcome> {
    let pod = cx.view.home.as_ref();
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
    match api
        .patch(shadow_name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(updated) => {
            info!(pod = %key(pod), "resized its ShadowPod");
            Ok(Outcome::Shadow(Box::new(updated)))
        }
        // Changed meanwhile: decided again on the next version.
        Err(ref e) if meta::is_conflict(e) => Ok(Outcome::Shadow(s)),
        Err(kube::Error::Api(e)) if matches!(e.code, 400 | 403 | 422) => {
            let message = format!("the provider refused the resize: {}", e.message);
            warn!(pod = %key(pod), code = e.code, error = %e.message, "resize refused");
            cx.event(&Event::warning(
                resize::INFEASIBLE,
                "Resize",
                message.clone(),
            ))
            .await;
            Ok(Outcome::ResizeRefused { shadow: s, message })
        }
        Err(e) => Err(e).context("resizing the ShadowPod"),
    }
}

/// The claims `pod` mounts, by name.
fn claims_of(pod: &Pod) -> Vec<String> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| Some(v.persistent_volume_claim.as_ref()?.claim_name.clone()))
        .collect()
}

/// Why the pod of `cx` waits for one of `claims` in its twin (none of ours there yet);
/// `None`: they are all there. Read fresh: the pod is created once, after.
async fn missing_claim(cx: &Cx<'_, Pods>, claims: &[String]) -> Result<Option<String>> {
    let (Some(client), Some(ns), Some(marks)) =
        (cx.remote_client(), cx.remote_namespace(), cx.view.marks)
    else {
        return Ok(None);
    };
    let api: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(client.clone(), ns);
    for c in claims {
        let found = api
            .get_opt(c)
            .await
            .with_context(|| format!("looking for claim {c} in the twin"))?;
        if !found.is_some_and(|r| marks.on(&r.metadata)) {
            return Ok(Some(format!(
                "waiting for its PersistentVolumeClaim {c} on the provider (in {ns})"
            )));
        }
    }
    Ok(None)
}

async fn create(
    cx: &Cx<'_, Pods>,
    api: &Api<ShadowPod>,
    marks: &Marks,
    shadow_name: &str,
    twin: bool,
    home_api: Option<forge::HomeApi>,
) -> Result<Outcome> {
    let home = cx.view.home.as_ref();
    let claims = claims_of(home);
    if !claims.is_empty() && !twin {
        let message = format!(
            "it mounts PersistentVolumeClaims ({}): only pods of a namespace offloaded to the \
             provider take their claims there (offload namespace {})",
            claims.join(", "),
            home.namespace().unwrap_or_default()
        );
        cx.event(&Event::warning(
            status::reason::REFUSED,
            "Offload",
            message.clone(),
        ))
        .await;
        return Ok(Outcome::Refused {
            message,
            retry: false,
        });
    }
    // Its claims first: the pod must not start without its data.
    if let Some(message) = missing_claim(cx, &claims).await? {
        let event = Event::normal(status::reason::NO_VOLUME, "Offload", message.clone());
        say_once(cx, home, event).await;
        return Ok(Outcome::NoVolume(message));
    }
    // In a twin, its tokens first: the pod must not start without them.
    let (rewritten, wanted) = with_tokens(home);
    let pod = if twin { &rewritten } else { home };
    if twin && !wanted.is_empty() {
        match ensure_tokens(cx, &wanted).await {
            Ok(_) => {}
            Err(e) if token_edge::transient(&e) => {
                return Err(e).context("delivering the pod's service-account tokens");
            }
            Err(e) => {
                let message = e.to_string();
                let event = Event::warning(status::reason::NO_TOKEN, "Offload", message.clone());
                say_once(cx, home, event).await;
                warn!(pod = %key(home), error = message, "no service-account token");
                return Ok(Outcome::NoToken(message));
            }
        }
    }
    let consumer = marks.origin();
    let spec = match forge::forge(pod, consumer, &Offer::default(), &Policy::default()) {
        Ok(mut spec) => {
            if let Some(at) = &home_api {
                forge::home_api(&mut spec.pod.spec, at);
            }
            spec
        }
        Err(refusal) => {
            let message = refusal.to_string();
            cx.event(&Event::warning(
                status::reason::REFUSED,
                "Offload",
                message.clone(),
            ))
            .await;
            return Ok(Outcome::Refused {
                message,
                retry: false,
            });
        }
    };
    let (mut labels, annotations) = decide::wanted_metadata(pod, consumer);
    marks.stamp(&mut labels);
    let shadow = ShadowPod {
        metadata: ObjectMeta {
            name: Some(shadow_name.to_owned()),
            namespace: cx.remote_namespace().map(str::to_owned),
            labels: Some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            // The provider's controller would add its finalizer first thing (a patch and a
            // round of its reconciler per pod): set at creation, it goes straight on.
            finalizers: Some(vec![names::finalizer::SHADOW_POD.to_owned()]),
            ..Default::default()
        },
        spec,
        status: None,
    };
    match api.create(&PostParams::default(), &shadow).await {
        Ok(s) => {
            info!(pod = %key(pod), shadowpod = %shadow_name, "offloaded");
            let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
            cx.event(&Event::normal(
                "Offloaded",
                "Offload",
                decide::offloaded_note(shadow_name, ns, twin),
            ))
            .await;
            Ok(Outcome::Shadow(Box::new(s)))
        }
        // Created by an earlier run whose listing had not caught up.
        Err(ref e) if meta::is_conflict(e) => match api.get_opt(shadow_name).await? {
            Some(s) if cx.ours(&s) && decide::owns(&s, pod) => Ok(Outcome::Shadow(Box::new(s))),
            _ => Ok(Outcome::Nothing),
        },
        Err(kube::Error::Api(e)) if matches!(e.code, 400 | 403 | 422) => {
            let retry = e.code == 403;
            let message = format!("the provider refused the ShadowPod: {}", e.message);
            warn!(pod = %key(pod), code = e.code, error = %e.message, "ShadowPod refused");
            let reason = if retry {
                status::reason::FORBIDDEN
            } else {
                status::reason::REFUSED
            };
            cx.event(&Event::warning(reason, "Offload", message.clone()))
                .await;
            Ok(Outcome::Refused { message, retry })
        }
        Err(e) => Err(e).context("creating the ShadowPod"),
    }
}

/// A merge patch removes keys by setting them to null: those the ShadowPod has and the home
/// pod no longer has (`marked`: the labels its metadata should have, ours included;
/// `labels`, `annotations`: its pod template's).
fn with_removals(
    mut patch: serde_json::Value,
    s: &ShadowPod,
    marked: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> serde_json::Value {
    let stale = |have: Option<&BTreeMap<String, String>>, want: &BTreeMap<String, String>| {
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
            marked,
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
