//! The status a home pod shows for its offloaded copy, as a pure function of the ShadowPod's
//! status (the provider's pod, copied there by the provider's controller; bounded first by
//! [`super::bounds`]), whether the provider answers, the remap of its pod addresses and the
//! virtual node's address.
//!
//! The home status is written with server-side apply under the virtual kubelet's field
//! manager, so what it computes is every field it owns: the scheduler's `PodScheduled` stays
//! the scheduler's.
use fabric_api::offloading::v1alpha1::{ShadowPod, shadow_pod_condition::POD_CREATED};
use fabric_kube::status::{Reason, Verdict};
use fabric_offloading::shadowpod::{decide::PodCreated, resize};
use k8s_openapi::{
    api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStatus, HostIP, PodCondition, PodIP,
        PodStatus,
    },
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};

use super::{
    bounds,
    translate::{self, Remap, Untranslatable},
};

/// The home pod's condition about its offloading: True once the ShadowPod exists (reason the
/// provider's: `Created`, `Recreated` with the count in the message, `Finished`), False while
/// it could not be created, the provider refuses its pod, or its pod waits for room on the
/// provider (reason and message say why).
pub const OFFLOADED: &str = "offloading.fabric.io/Offloaded";
pub const READY: &str = "Ready";
pub const CONTAINERS_READY: &str = "ContainersReady";

pub mod reason {
    /// The pod cannot run on this provider (its policy, or the provider's API refused it).
    pub const REFUSED: &str = "OffloadingRefused";
    /// The provider refused the ShadowPod for now (quota, webhook): tried again.
    pub const FORBIDDEN: &str = "ProviderForbidden";
    /// The provider does not answer: the pod is not Ready here (it may well run there).
    pub const UNREACHABLE: &str = "ProviderUnreachable";
    /// The provider's scheduler finds no node for the pod (yet): its message says why.
    pub const UNSCHEDULABLE: &str = "ProviderUnschedulable";
    /// The ShadowPod or its pod vanished from the provider.
    pub const VANISHED: &str = "ProviderPodVanished";
    /// The pod IP cannot be translated (no remap yet, or outside the provider's pod CIDR).
    pub const NO_ADDRESS: &str = "NoAddressHere";
    /// Under at-most-once semantics, the provider has been out of reach long enough to have
    /// stopped the pod: it failed (its controller may start a replacement).
    pub const PARTITIONED: &str = "ProviderPartitioned";
    /// The pod's namespace is offloaded, and the provider has no twin of it (not yet, or
    /// refused): the pod waits, never sent pod by pod instead.
    pub const NO_TWIN: &str = "NoTwinNamespace";
    /// The pod's service-account token could not be made (its service account missing at
    /// home, the request forbidden, a Secret of that name in the twin not ours): it waits,
    /// never started without it.
    pub const NO_TOKEN: &str = "ServiceAccountTokenFailed";
    /// Its twin's Service of the home API server has no cluster IP yet on the provider: the
    /// pod waits, never started without its way home (it would call the wrong server).
    pub const NO_HOME_API: &str = "WaitingForHomeApiServer";
    /// Under at-most-once semantics, the provider has not had this cluster's heartbeat
    /// lately (just after a partition, say): a pod made there now could be stopped at once
    /// for good, so it waits for the next renewal.
    pub const NO_HEARTBEAT: &str = "WaitingForHeartbeat";
    /// A PersistentVolumeClaim the pod mounts has no claim of ours in the twin yet (its
    /// virtual kubelet makes it once the claim's first consumer is placed on the node): the
    /// pod waits, never started without its data.
    pub const NO_VOLUME: &str = "RemoteVolumePending";
    /// The pod ran in its namespace's twin on the provider, and the twin is gone (the
    /// namespace unoffloaded, or this provider no longer selected): it failed, so that its
    /// controller makes another where the namespace's placement now allows.
    pub const ABORTED: &str = "OffloadingAborted";
}

/// What is known of the pod on the provider, for its home status.
#[derive(Debug, Clone, Copy)]
pub enum Seen<'a> {
    /// Its ShadowPod as last listed.
    Shadow(&'a ShadowPod),
    /// Not yet created, or not listed yet: the home status stays as it is, apart from
    /// readiness.
    Nothing,
    /// Created, and gone since (confirmed by a fresh read).
    Vanished,
    /// It could not be created: `retry` when the provider may accept it later.
    Refused { message: &'a str, retry: bool },
    /// Not created: its namespace is offloaded and has no twin on the provider (why).
    NoTwin { message: &'a str },
    /// Not created: its service-account token could not be made (why).
    NoToken { message: &'a str },
    /// Not created: its twin's Service of the home API server has no address yet (why).
    NoHomeApi { message: &'a str },
    /// Not created: the heartbeat on the provider is not recent (why).
    NoHeartbeat { message: &'a str },
    /// Not created: a claim it mounts is not on the provider yet (why).
    NoVolume { message: &'a str },
    /// It ran in a twin that is gone (why).
    Aborted { message: &'a str },
    /// Its ShadowPod as last listed, and the provider refused to resize it to what the home
    /// pod's spec now says: it keeps its size, the home pod says why
    /// ([`resize::RESIZE_PENDING`], reason [`resize::INFEASIBLE`], as a kubelet would).
    ResizeRefused {
        shadow: &'a ShadowPod,
        message: &'a str,
    },
}

/// Everything the home status depends on besides the pod itself.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    pub reachable: bool,
    /// Why the provider is not reachable (the node's Ready message).
    pub unreachable_message: &'a str,
    /// Under at-most-once semantics, once the provider has stopped the pods for sure: why.
    pub partitioned: Option<&'a str>,
    /// The remap of the provider's pod CIDR, or why there is none.
    pub remap: Result<&'a Remap, &'a Untranslatable>,
    /// The virtual node's address: hostIP of every offloaded pod.
    pub node_ip: &'a str,
    pub now: Timestamp,
}

fn cond(type_: &str, ok: bool, reason: &str, message: String) -> PodCondition {
    PodCondition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: Some(reason.into()),
        message: (!message.is_empty()).then_some(message),
        ..Default::default()
    }
}

/// Sets `new` among `out`, keeping the transition time `prev` has for the same status (as
/// Kubernetes does), else `now` unless `new` carries one.
fn put(out: &mut Vec<PodCondition>, prev: &[PodCondition], mut new: PodCondition, now: Timestamp) {
    match prev.iter().find(|c| c.type_ == new.type_) {
        Some(p) if p.status == new.status && p.last_transition_time.is_some() => {
            new.last_transition_time = p.last_transition_time.clone();
        }
        _ if new.last_transition_time.is_none() => new.last_transition_time = Some(Time(now)),
        _ => {}
    }
    new.last_probe_time = None;
    out.retain(|c| c.type_ != new.type_);
    out.push(new);
}

/// The home status of `pod` given what is `seen` of it on the provider; None when there is
/// nothing of ours to write yet (not offloaded, nothing refused).
pub fn home_status(
    prev: Option<&PodStatus>,
    seen: Seen<'_>,
    ctx: &Context<'_>,
) -> Option<PodStatus> {
    let empty = PodStatus::default();
    let prev = prev.unwrap_or(&empty);
    let prev_conds = prev.conditions.as_deref().unwrap_or_default();
    let had_ours = prev_conds.iter().any(|c| c.type_ == OFFLOADED);
    let host = |s: &mut PodStatus| {
        s.host_ip = Some(ctx.node_ip.to_owned());
        s.host_ips = Some(vec![HostIP {
            ip: ctx.node_ip.to_owned(),
        }]);
    };
    let mut conds: Vec<PodCondition> = Vec::new();
    let terminal_here = terminal(prev.phase.as_deref());
    if terminal_here && prev.reason.as_deref() == Some(reason::PARTITIONED) {
        // Declared stopped: whatever the provider says on reconnection, never revived here.
        return Some(ours(prev));
    }
    if let Some(why) = ctx.partitioned.filter(|_| had_ours && !terminal_here) {
        let mut s = ours(prev);
        conds = s.conditions.take().unwrap_or_default();
        failed_here(
            &mut s,
            &mut conds,
            prev_conds,
            reason::PARTITIONED,
            why,
            "stopped by the provider (at-most-once) while out of reach",
            ctx.now,
        );
        conds.sort_by(|a, b| a.type_.cmp(&b.type_));
        s.conditions = Some(conds);
        return Some(s);
    }
    let mut out = match seen {
        Seen::Nothing if !had_ours => return None,
        // Carry on from the home status as last written: only readiness may change.
        Seen::Nothing => {
            let mut s = ours(prev);
            conds = s.conditions.take().unwrap_or_default();
            s
        }
        Seen::Refused { message, retry } => {
            let mut s = PodStatus {
                phase: Some(if retry { "Pending" } else { "Failed" }.into()),
                reason: (!retry).then(|| reason::REFUSED.to_owned()),
                message: (!retry).then(|| message.to_owned()),
                ..Default::default()
            };
            host(&mut s);
            put(
                &mut conds,
                prev_conds,
                cond(
                    OFFLOADED,
                    false,
                    if retry {
                        reason::FORBIDDEN
                    } else {
                        reason::REFUSED
                    },
                    message.to_owned(),
                ),
                ctx.now,
            );
            s
        }
        Seen::NoTwin { message }
        | Seen::NoToken { message }
        | Seen::NoHomeApi { message }
        | Seen::NoHeartbeat { message }
        | Seen::NoVolume { message } => {
            let mut s = PodStatus {
                phase: Some("Pending".into()),
                ..Default::default()
            };
            host(&mut s);
            let why = match seen {
                Seen::NoTwin { .. } => reason::NO_TWIN,
                Seen::NoToken { .. } => reason::NO_TOKEN,
                Seen::NoVolume { .. } => reason::NO_VOLUME,
                Seen::NoHeartbeat { .. } => reason::NO_HEARTBEAT,
                _ => reason::NO_HOME_API,
            };
            put(
                &mut conds,
                prev_conds,
                cond(OFFLOADED, false, why, message.to_owned()),
                ctx.now,
            );
            s
        }
        Seen::Aborted { message } => {
            let mut s = ours(prev);
            conds = s.conditions.take().unwrap_or_default();
            failed_here(
                &mut s,
                &mut conds,
                prev_conds,
                reason::ABORTED,
                message,
                "its twin namespace is gone from the provider",
                ctx.now,
            );
            s
        }
        Seen::Vanished => {
            let mut s = ours(prev);
            conds = s.conditions.take().unwrap_or_default();
            failed_here(
                &mut s,
                &mut conds,
                prev_conds,
                reason::VANISHED,
                "the pod's ShadowPod vanished from the provider: it no longer runs there",
                "the ShadowPod is gone from the provider",
                ctx.now,
            );
            s
        }
        Seen::Shadow(shadow) | Seen::ResizeRefused { shadow, .. } => {
            // The provider's word, bounded before anything of it is used.
            let st = bounds::provider_status(shadow.status.clone().unwrap_or_default());
            let mut s = PodStatus {
                phase: Some(st.phase.clone().unwrap_or_else(|| "Pending".into())),
                reason: st.reason.clone(),
                message: st.message.clone(),
                start_time: st.start_time.clone(),
                container_statuses: (!st.container_statuses.is_empty())
                    .then(|| st.container_statuses.clone()),
                init_container_statuses: (!st.init_container_statuses.is_empty())
                    .then(|| st.init_container_statuses.clone()),
                ..Default::default()
            };
            host(&mut s);
            let ips: Vec<&String> = st.pod_ip.iter().chain(st.pod_ips.iter()).collect();
            let mut untranslatable: Option<Untranslatable> = None;
            let mut home_ips: Vec<String> = Vec::new();
            for ip in ips {
                match translate::to_home(ip, ctx.remap) {
                    Ok(h) if !home_ips.contains(&h.to_string()) => home_ips.push(h.to_string()),
                    Ok(_) => {}
                    Err(e) => untranslatable = Some(e),
                }
            }
            s.pod_ip = home_ips.first().cloned();
            s.pod_ips = (!home_ips.is_empty())
                .then(|| home_ips.iter().map(|ip| PodIP { ip: ip.clone() }).collect());
            // The provider's scheduling is its own affair: the home pod is scheduled on the
            // virtual node by the home scheduler.
            for c in st
                .pod_conditions
                .iter()
                .filter(|c| c.type_ != "PodScheduled")
            {
                put(&mut conds, prev_conds, c.clone(), ctx.now);
            }
            let created = Verdict::<PodCreated>::find(&st.conditions, POD_CREATED);
            let offloaded = match created {
                Some(c) => cond(
                    OFFLOADED,
                    c.ok,
                    c.reason.as_str(),
                    match st.recreations {
                        0 => c.message.clone(),
                        n if c.reason == PodCreated::Recreated => {
                            format!("the provider re-created the pod {n} time(s) after it vanished")
                        }
                        n => format!("{} (re-created {n} time(s))", c.message),
                    },
                ),
                None => cond(
                    OFFLOADED,
                    true,
                    "ShadowPodCreated",
                    "the ShadowPod exists; the provider has not reported its pod yet".into(),
                ),
            };
            // The home scheduler placed the pod on the virtual node; the provider's scheduler
            // finding no room for it there is the offloading's, said here.
            let unschedulable = st
                .pod_conditions
                .iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False");
            let offloaded = match unschedulable {
                Some(c) if offloaded.status == "True" => cond(
                    OFFLOADED,
                    false,
                    reason::UNSCHEDULABLE,
                    format!(
                        "the provider cannot schedule the pod yet: {}",
                        c.message
                            .as_deref()
                            .or(c.reason.as_deref())
                            .unwrap_or("no reason given")
                    ),
                ),
                _ => offloaded,
            };
            put(&mut conds, prev_conds, offloaded, ctx.now);
            // The provider refused to resize the real pod: pending at home, as a kubelet says.
            if let Some(c) = st
                .conditions
                .iter()
                .find(|c| c.type_ == resize::RESIZE_PENDING && c.status == "True")
            {
                put(
                    &mut conds,
                    prev_conds,
                    cond(resize::RESIZE_PENDING, true, &c.reason, c.message.clone()),
                    ctx.now,
                );
            }
            if let Some(e) = untranslatable.filter(|_| s.pod_ip.is_none()) {
                // Not Ready while unreachable at its address: Services would send traffic
                // to an address that means something else here.
                put(
                    &mut conds,
                    prev_conds,
                    cond(READY, false, reason::NO_ADDRESS, e.to_string()),
                    ctx.now,
                );
            }
            if let Seen::ResizeRefused { message, .. } = seen {
                put(
                    &mut conds,
                    prev_conds,
                    cond(
                        resize::RESIZE_PENDING,
                        true,
                        resize::INFEASIBLE,
                        message.to_owned(),
                    ),
                    ctx.now,
                );
            }
            s
        }
    };
    if !ctx.reachable && !terminal(out.phase.as_deref()) {
        for t in [READY, CONTAINERS_READY] {
            put(
                &mut conds,
                prev_conds,
                cond(
                    t,
                    false,
                    reason::UNREACHABLE,
                    ctx.unreachable_message.to_owned(),
                ),
                ctx.now,
            );
        }
    }
    conds.sort_by(|a, b| a.type_.cmp(&b.type_));
    out.conditions = Some(conds);
    Some(out)
}

fn terminal(phase: Option<&str>) -> bool {
    matches!(phase, Some("Succeeded" | "Failed"))
}

/// `s` (the home status as last written) Failed for `why`: no address, its containers
/// terminated with an unknown fate, Offloaded False, not Ready.
fn failed_here(
    s: &mut PodStatus,
    conds: &mut Vec<PodCondition>,
    prev_conds: &[PodCondition],
    why: &str,
    message: &str,
    offloaded: &str,
    now: Timestamp,
) {
    s.phase = Some("Failed".into());
    s.reason = Some(why.into());
    s.message = Some(message.into());
    s.pod_ip = None;
    s.pod_ips = None;
    let gone = |c: &ContainerStatus| terminated(c, message);
    s.container_statuses = s
        .container_statuses
        .take()
        .map(|cs| cs.iter().map(gone).collect());
    put(
        conds,
        prev_conds,
        cond(OFFLOADED, false, why, offloaded.into()),
        now,
    );
    for t in [READY, CONTAINERS_READY] {
        put(conds, prev_conds, cond(t, false, why, String::new()), now);
    }
}

/// A container as the kubelet reports one whose fate it does not know.
fn terminated(c: &ContainerStatus, message: &str) -> ContainerStatus {
    if c.state.as_ref().is_some_and(|s| s.terminated.is_some()) {
        return c.clone();
    }
    ContainerStatus {
        ready: false,
        started: Some(false),
        state: Some(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 137,
                reason: Some("ContainerStatusUnknown".into()),
                message: Some(message.into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..c.clone()
    }
}

/// The fields of `status` this process owns (what [`home_status`] sets), to compare with
/// what it would write; conditions are all but the scheduler's.
pub fn ours(status: &PodStatus) -> PodStatus {
    let conditions: Vec<PodCondition> = status
        .conditions
        .iter()
        .flatten()
        .filter(|c| c.type_ != "PodScheduled")
        .cloned()
        .collect();
    let mut conditions = conditions;
    conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
    PodStatus {
        phase: status.phase.clone(),
        reason: status.reason.clone(),
        message: status.message.clone(),
        host_ip: status.host_ip.clone(),
        host_ips: status.host_ips.clone(),
        pod_ip: status.pod_ip.clone(),
        pod_ips: status.pod_ips.clone(),
        start_time: status.start_time.clone(),
        conditions: Some(conditions),
        container_statuses: status.container_statuses.clone(),
        init_container_statuses: status.init_container_statuses.clone(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
