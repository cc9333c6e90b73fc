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
mod tests {
    use fabric_api::offloading::v1alpha1::{HomePod, ShadowPodSpec, ShadowPodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    use super::*;

    fn remap() -> Remap {
        Remap {
            real: "10.244.0.0/16".parse().unwrap(),
            seen: "10.71.0.0/16".parse().unwrap(),
        }
    }

    fn ctx(reachable: bool, remap: Option<&Remap>) -> Context<'_> {
        Context {
            reachable,
            unreachable_message: "no answer within 5s",
            partitioned: None,
            remap: remap.ok_or(&Untranslatable::NoRemap),
            node_ip: "192.0.2.1",
            now: Timestamp::from_second(1000).unwrap(),
        }
    }

    fn shadow(phase: &str, ready: bool, recreations: u32) -> ShadowPod {
        let mut s = ShadowPod::new(
            "shop.web",
            ShadowPodSpec {
                cluster_id: "a".into(),
                home: HomePod::default(),
                pod: Default::default(),
            },
        );
        let t = Time(Timestamp::from_second(10).unwrap());
        s.status = Some(ShadowPodStatus {
            phase: Some(phase.into()),
            pod_ip: Some("10.244.2.7".into()),
            pod_ips: vec!["10.244.2.7".into()],
            pod_conditions: vec![
                PodCondition {
                    type_: READY.into(),
                    status: if ready { "True" } else { "False" }.into(),
                    last_transition_time: Some(t.clone()),
                    ..Default::default()
                },
                PodCondition {
                    type_: "PodScheduled".into(),
                    status: "True".into(),
                    ..Default::default()
                },
            ],
            container_statuses: vec![ContainerStatus {
                name: "main".into(),
                ready,
                restart_count: 3,
                ..Default::default()
            }],
            recreations,
            conditions: vec![Condition {
                type_: POD_CREATED.into(),
                status: "True".into(),
                reason: if recreations > 0 {
                    "Recreated"
                } else {
                    "Created"
                }
                .into(),
                message: "the pod exists on the provider".into(),
                last_transition_time: t,
                observed_generation: None,
            }],
            ..Default::default()
        });
        s
    }

    fn c<'a>(s: &'a PodStatus, t: &str) -> &'a PodCondition {
        s.conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == t)
            .unwrap_or_else(|| panic!("no {t} in {s:?}"))
    }

    #[test]
    fn the_provider_pod_comes_home_at_its_address_here() {
        let r = remap();
        let sh = shadow("Running", true, 0);
        let s = home_status(None, Seen::Shadow(&sh), &ctx(true, Some(&r))).unwrap();
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(s.pod_ip.as_deref(), Some("10.71.2.7"));
        assert_eq!(s.pod_ips.as_ref().unwrap().len(), 1);
        assert_eq!(s.host_ip.as_deref(), Some("192.0.2.1"));
        assert_eq!(c(&s, READY).status, "True");
        assert_eq!(c(&s, OFFLOADED).reason.as_deref(), Some("Created"));
        assert_eq!(s.container_statuses.as_ref().unwrap()[0].restart_count, 3);
        assert!(
            !s.conditions
                .as_ref()
                .unwrap()
                .iter()
                .any(|c| c.type_ == "PodScheduled"),
            "the provider's scheduling stays there"
        );
        // Written again, nothing changes (no write loop).
        let again = home_status(Some(&s), Seen::Shadow(&sh), &ctx(true, Some(&r))).unwrap();
        assert_eq!(again, s);
        assert_eq!(ours(&s), s);
    }

    #[test]
    fn a_pod_the_provider_cannot_place_says_why_at_home() {
        let r = remap();
        let mut sh = shadow("Pending", false, 0);
        let st = sh.status.as_mut().unwrap();
        st.pod_ip = None;
        st.pod_ips.clear();
        st.pod_conditions[1] = PodCondition {
            type_: "PodScheduled".into(),
            status: "False".into(),
            reason: Some("Unschedulable".into()),
            message: Some("0/1 nodes are available: 1 Insufficient cpu.".into()),
            ..Default::default()
        };
        let s = home_status(None, Seen::Shadow(&sh), &ctx(true, Some(&r))).unwrap();
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        let o = c(&s, OFFLOADED);
        assert_eq!(o.status, "False");
        assert_eq!(o.reason.as_deref(), Some(reason::UNSCHEDULABLE));
        assert_eq!(
            o.message.as_deref(),
            Some(
                "the provider cannot schedule the pod yet: 0/1 nodes are available: 1 Insufficient cpu."
            )
        );
        // Placed and running: offloaded, as any other.
        let placed = shadow("Running", true, 0);
        let s = home_status(Some(&s), Seen::Shadow(&placed), &ctx(true, Some(&r))).unwrap();
        assert_eq!(c(&s, OFFLOADED).status, "True");
        assert_eq!(c(&s, OFFLOADED).reason.as_deref(), Some("Created"));
        // A refusal stays a refusal, whatever the scheduler says.
        sh.status.as_mut().unwrap().conditions[0].status = "False".into();
        sh.status.as_mut().unwrap().conditions[0].reason = "Forbidden".into();
        let s = home_status(None, Seen::Shadow(&sh), &ctx(true, Some(&r))).unwrap();
        assert_eq!(c(&s, OFFLOADED).reason.as_deref(), Some("Forbidden"));
    }

    #[test]
    fn recreations_show_in_the_offloaded_condition() {
        let r = remap();
        let sh = shadow("Running", true, 2);
        let s = home_status(None, Seen::Shadow(&sh), &ctx(true, Some(&r))).unwrap();
        let o = c(&s, OFFLOADED);
        assert_eq!(o.reason.as_deref(), Some("Recreated"));
        assert!(o.message.as_ref().unwrap().contains('2'), "{o:?}");
    }

    #[test]
    fn an_unreachable_provider_makes_the_pod_not_ready_and_keeps_the_rest() {
        let r = remap();
        let sh = shadow("Running", true, 0);
        let before = home_status(None, Seen::Shadow(&sh), &ctx(true, Some(&r))).unwrap();
        for seen in [Seen::Shadow(&sh), Seen::Nothing] {
            let s = home_status(Some(&before), seen, &ctx(false, Some(&r))).unwrap();
            assert_eq!(s.phase.as_deref(), Some("Running"));
            assert_eq!(s.pod_ip.as_deref(), Some("10.71.2.7"));
            for t in [READY, CONTAINERS_READY] {
                assert_eq!(c(&s, t).status, "False");
                assert_eq!(c(&s, t).reason.as_deref(), Some(reason::UNREACHABLE));
            }
            assert_eq!(c(&s, OFFLOADED).status, "True");
        }
        // Back: Ready as the provider says.
        let s = home_status(Some(&before), Seen::Shadow(&sh), &ctx(true, Some(&r))).unwrap();
        assert_eq!(c(&s, READY).status, "True");
    }

    /// Issue 19 §4: what a provider writes into a ShadowPod's status (with its own
    /// credentials, anything the schema lets through) comes home bounded per field and in
    /// all, truncated with a marker, its phase one of Kubernetes'.
    #[test]
    fn a_providers_status_comes_home_bounded() {
        let big = "x".repeat(16 << 10);
        let mut sh = shadow("Running", true, 0);
        let hostile: ShadowPodStatus = serde_json::from_value(serde_json::json!({
            "phase": format!("Running{big}"),
            "reason": big, "message": big,
            "podIP": "10.244.2.7",
            "podConditions": (0..200).map(|i| serde_json::json!({
                "type": format!("T{i}{}", &big[..1000]), "status": "True",
                "reason": big, "message": big,
            })).collect::<Vec<_>>(),
            "containerStatuses": (0..200).map(|i| serde_json::json!({
                "name": format!("c{i}"), "image": big, "imageID": big, "containerID": big,
                "ready": true, "restartCount": 1,
                "state": {"waiting": {"reason": big, "message": big}},
                "lastState": {"terminated": {"exitCode": 1, "reason": big, "message": big}},
            })).collect::<Vec<_>>(),
            "conditions": [{"type": POD_CREATED, "status": "True", "reason": "Created",
                            "message": big, "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        }))
        .unwrap();
        sh.status = Some(hostile);
        let s = home_status(None, Seen::Shadow(&sh), &ctx(true, Some(&remap()))).unwrap();
        let size = serde_json::to_vec(&s).unwrap().len();
        assert!(size <= bounds::TOTAL, "{size} bytes came home");
        assert_eq!(s.phase.as_deref(), Some("Unknown"));
        let message = s.message.as_deref().unwrap();
        assert!(message.len() <= bounds::MESSAGE && message.ends_with(bounds::MARKER));
        let offloaded = c(&s, OFFLOADED).message.as_deref().unwrap();
        assert!(offloaded.len() <= bounds::MESSAGE && offloaded.ends_with(bounds::MARKER));
        assert_eq!(s.pod_ip.as_deref(), Some("10.71.2.7"));
    }

    #[test]
    fn without_an_address_here_the_pod_is_not_ready() {
        let sh = shadow("Running", true, 0);
        let s = home_status(None, Seen::Shadow(&sh), &ctx(true, None)).unwrap();
        assert_eq!(s.pod_ip, None);
        assert_eq!(c(&s, READY).reason.as_deref(), Some(reason::NO_ADDRESS));
        let other = Remap {
            real: "10.245.0.0/16".parse().unwrap(),
            seen: "10.72.0.0/16".parse().unwrap(),
        };
        let s = home_status(None, Seen::Shadow(&sh), &ctx(true, Some(&other))).unwrap();
        assert_eq!(s.pod_ip, None);
        assert!(c(&s, READY).message.as_ref().unwrap().contains("outside"));
    }

    #[test]
    fn a_malformed_configuration_is_said_where_the_address_is_missing() {
        let sh = shadow("Running", true, 0);
        let bad = Untranslatable::BadConfiguration(translate::BadConfiguration::SizeMismatch {
            role: "pod",
            real: "10.244.0.0/16".parse().unwrap(),
            seen: "10.71.0.0/24".parse().unwrap(),
        });
        let s = home_status(
            None,
            Seen::Shadow(&sh),
            &Context {
                remap: Err(&bad),
                ..ctx(true, None)
            },
        )
        .unwrap();
        assert_eq!(s.pod_ip, None);
        let ready = c(&s, READY);
        assert_eq!(ready.reason.as_deref(), Some(reason::NO_ADDRESS));
        let message = ready.message.as_deref().unwrap();
        assert!(message.contains("Configuration"), "{message}");
        assert!(!message.contains("not configured yet"), "{message}");
    }

    #[test]
    fn a_vanished_pod_fails_and_is_never_left_running() {
        let r = remap();
        let sh = shadow("Running", true, 0);
        let before = home_status(None, Seen::Shadow(&sh), &ctx(true, Some(&r))).unwrap();
        let s = home_status(Some(&before), Seen::Vanished, &ctx(true, Some(&r))).unwrap();
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        assert_eq!(s.reason.as_deref(), Some(reason::VANISHED));
        assert_eq!(c(&s, READY).status, "False");
        let cs = &s.container_statuses.as_ref().unwrap()[0];
        assert!(!cs.ready);
        assert!(cs.state.as_ref().unwrap().terminated.is_some());
    }

    #[test]
    fn refusals_are_conditions_and_permanent_ones_fail_the_pod() {
        let s = home_status(
            None,
            Seen::Refused {
                message: "cpu: 2 requested, 1 left",
                retry: true,
            },
            &ctx(true, None),
        )
        .unwrap();
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        let o = c(&s, OFFLOADED);
        assert_eq!(
            (o.status.as_str(), o.reason.as_deref()),
            ("False", Some(reason::FORBIDDEN))
        );
        let s = home_status(
            None,
            Seen::Refused {
                message: "hostNetwork is not allowed on this provider",
                retry: false,
            },
            &ctx(true, None),
        )
        .unwrap();
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        assert_eq!(s.reason.as_deref(), Some(reason::REFUSED));
        assert_eq!(c(&s, OFFLOADED).reason.as_deref(), Some(reason::REFUSED));
    }

    #[test]
    fn a_pod_declared_stopped_fails_and_is_never_revived() {
        let r = remap();
        let sh = shadow("Running", true, 0);
        let before = home_status(None, Seen::Shadow(&sh), &ctx(true, Some(&r))).unwrap();
        // Unreachable, not yet declared: Running, not Ready.
        let waiting = home_status(Some(&before), Seen::Nothing, &ctx(false, Some(&r))).unwrap();
        assert_eq!(waiting.phase.as_deref(), Some("Running"));
        let declared = Context {
            partitioned: Some("the provider has stopped it"),
            ..ctx(false, Some(&r))
        };
        let s = home_status(Some(&waiting), Seen::Nothing, &declared).unwrap();
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        assert_eq!(s.reason.as_deref(), Some(reason::PARTITIONED));
        assert_eq!(s.message.as_deref(), Some("the provider has stopped it"));
        assert_eq!(s.pod_ip, None);
        assert_eq!(c(&s, READY).status, "False");
        assert_eq!(
            c(&s, OFFLOADED).reason.as_deref(),
            Some(reason::PARTITIONED)
        );
        let cs = &s.container_statuses.as_ref().unwrap()[0];
        assert!(cs.state.as_ref().unwrap().terminated.is_some());
        // Reconnected, whatever the provider says: it stays as declared.
        let after = home_status(Some(&s), Seen::Shadow(&sh), &ctx(true, Some(&r))).unwrap();
        assert_eq!(after, ours(&s));
        // A pod never offloaded has nothing to declare.
        assert_eq!(home_status(None, Seen::Nothing, &declared), None);
    }

    #[test]
    fn nothing_is_written_for_a_pod_not_offloaded_yet() {
        assert_eq!(home_status(None, Seen::Nothing, &ctx(true, None)), None);
    }

    #[test]
    fn a_resize_the_provider_refused_is_pending_at_home() {
        let r = remap();
        let mut sh = shadow("Running", true, 0);
        let st = sh.status.as_mut().unwrap();
        st.conditions = resize::pending(
            &st.conditions,
            Some((resize::DEFERRED, "exceeded quota: cpu".into())),
            None,
            Timestamp::from_second(20).unwrap(),
        );
        let s = home_status(None, Seen::Shadow(&sh), &ctx(true, Some(&r))).unwrap();
        let p = c(&s, resize::RESIZE_PENDING);
        assert_eq!(
            (p.status.as_str(), p.reason.as_deref(), p.message.as_deref()),
            ("True", Some(resize::DEFERRED), Some("exceeded quota: cpu"))
        );
        // Carried out after all: no longer pending.
        let st = sh.status.as_mut().unwrap();
        st.conditions = resize::pending(&st.conditions, None, None, Timestamp::UNIX_EPOCH);
        let s = home_status(Some(&s), Seen::Shadow(&sh), &ctx(true, Some(&r))).unwrap();
        assert!(
            !s.conditions
                .unwrap()
                .iter()
                .any(|c| c.type_ == resize::RESIZE_PENDING)
        );
    }
}
