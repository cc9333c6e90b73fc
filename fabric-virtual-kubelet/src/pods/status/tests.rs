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
