//! The test node's decisions about a pod, free of I/O: what to do when a container exits
//! (restart policy, back-off), the pod's phase, and the `PodStatus` it reports, as the kubelet
//! builds them.
use std::time::Duration;

use k8s_openapi::{
    api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
        ContainerStatus, HostIP, PodCondition, PodIP, PodStatus,
    },
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};

/// One run of a container that ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    pub code: i32,
    pub started: Timestamp,
    pub finished: Timestamp,
}

impl Exit {
    /// The kubelet's reasons: `Completed` for 0, `Error` otherwise.
    fn reason(&self) -> &'static str {
        if self.code == 0 { "Completed" } else { "Error" }
    }
}

/// Where a container is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Run {
    /// Not started yet (`ContainerCreating`) or cannot be (`CreateContainerError` etc.).
    Waiting {
        reason: String,
        message: Option<String>,
    },
    Running {
        started: Timestamp,
    },
    /// Exited; `restart_at` is set while a restart is pending (shown as `CrashLoopBackOff`).
    Exited {
        exit: Exit,
        restarting: bool,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    pub name: String,
    pub image: String,
    pub run: Run,
    /// The run before the current one, when it was restarted.
    pub last: Option<Exit>,
    pub restart_count: i32,
}

/// What follows a container's exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterExit {
    /// Start it again after this delay.
    Restart(Duration),
    /// It stays exited.
    Stay,
}

/// The restart policy applied to an exit (`restarts` = restarts so far): `Always` restarts
/// every exit, `OnFailure` non-zero ones, `Never` none. The delay doubles from `base` with
/// every restart up to five minutes, the kubelet's CrashLoopBackOff.
pub fn after_exit(policy: Option<&str>, code: i32, restarts: i32, base: Duration) -> AfterExit {
    let restart = match policy.unwrap_or("Always") {
        "Never" => false,
        "OnFailure" => code != 0,
        _ => true,
    };
    if !restart {
        return AfterExit::Stay;
    }
    let factor = 1u32 << restarts.clamp(0, 16);
    AfterExit::Restart((base * factor).min(Duration::from_secs(300)))
}

/// The pod's phase from its containers (no init containers), as the kubelet's `getPhase`.
pub fn phase(containers: &[Container]) -> &'static str {
    let never_started = |c: &Container| matches!(c.run, Run::Waiting { .. }) && c.last.is_none();
    if containers.is_empty() || containers.iter().any(never_started) {
        return "Pending";
    }
    let live = |c: &Container| match &c.run {
        Run::Running { .. } => true,
        Run::Exited { restarting, .. } => *restarting,
        // Waiting after a run: a restart is under way.
        Run::Waiting { .. } => true,
    };
    if containers.iter().any(live) {
        return "Running";
    }
    let all_ok = containers
        .iter()
        .all(|c| matches!(&c.run, Run::Exited { exit, .. } if exit.code == 0));
    if all_ok { "Succeeded" } else { "Failed" }
}

fn terminated(e: &Exit) -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: e.code,
            reason: Some(e.reason().into()),
            started_at: Some(Time(e.started)),
            finished_at: Some(Time(e.finished)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn container_status(c: &Container) -> ContainerStatus {
    let state = match &c.run {
        Run::Waiting { reason, message } => ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.clone()),
                message: message.clone(),
            }),
            ..Default::default()
        },
        Run::Running { started } => ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(Time(*started)),
            }),
            ..Default::default()
        },
        Run::Exited {
            restarting: true,
            exit,
        } => ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("CrashLoopBackOff".into()),
                message: Some(format!(
                    "back-off restarting failed container {} (exit code {})",
                    c.name, exit.code
                )),
            }),
            ..Default::default()
        },
        Run::Exited { exit, .. } => terminated(exit),
    };
    // While a restart is pending the run that just ended is the last state.
    let last = match &c.run {
        Run::Exited {
            restarting: true,
            exit,
        } => Some(exit),
        _ => c.last.as_ref(),
    };
    ContainerStatus {
        name: c.name.clone(),
        image: c.image.clone(),
        image_id: String::new(),
        ready: matches!(c.run, Run::Running { .. }),
        started: Some(matches!(c.run, Run::Running { .. })),
        restart_count: c.restart_count,
        state: Some(state),
        last_state: last.map(terminated),
        ..Default::default()
    }
}

/// Everything the pod's status is built from.
#[derive(Debug, Clone)]
pub struct Observed<'a> {
    pub host_ip: &'a str,
    pub pod_ip: Option<&'a str>,
    pub start_time: Timestamp,
    pub containers: &'a [Container],
    /// Earlier conditions (their transition times are kept while the status does not change).
    pub previous: &'a [PodCondition],
    pub now: Timestamp,
}

/// The pod's status: phase, IPs, start time, conditions (PodScheduled, Initialized,
/// ContainersReady, Ready) and one status per container.
pub fn pod_status(o: &Observed<'_>) -> PodStatus {
    let phase = phase(o.containers);
    let ready = !o.containers.is_empty()
        && o.containers
            .iter()
            .all(|c| matches!(c.run, Run::Running { .. }));
    let cond = |type_: &str, ok: bool, reason: Option<&str>| {
        let status = if ok { "True" } else { "False" };
        let since = o
            .previous
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .and_then(|c| c.last_transition_time.clone())
            .unwrap_or(Time(o.now));
        PodCondition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.map(str::to_owned),
            last_transition_time: Some(since),
            ..Default::default()
        }
    };
    let not_ready = (!ready).then_some(if phase == "Succeeded" || phase == "Failed" {
        "PodCompleted"
    } else {
        "ContainersNotReady"
    });
    let ips = o.pod_ip.map(|ip| vec![PodIP { ip: ip.to_owned() }]);
    PodStatus {
        phase: Some(phase.into()),
        host_ip: Some(o.host_ip.to_owned()),
        host_ips: Some(vec![HostIP {
            ip: o.host_ip.to_owned(),
        }]),
        pod_ip: o.pod_ip.map(str::to_owned),
        pod_ips: ips,
        start_time: Some(Time(o.start_time)),
        conditions: Some(vec![
            cond("PodScheduled", true, None),
            cond("Initialized", true, None),
            cond("ContainersReady", ready, not_ready),
            cond("Ready", ready, not_ready),
        ]),
        container_statuses: Some(o.containers.iter().map(container_status).collect()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    fn c(run: Run, last: Option<Exit>, restarts: i32) -> Container {
        Container {
            name: "app".into(),
            image: "x".into(),
            run,
            last,
            restart_count: restarts,
        }
    }

    fn exit(code: i32) -> Exit {
        Exit {
            code,
            started: t(0),
            finished: t(1),
        }
    }

    #[test]
    fn restart_policies() {
        let b = Duration::from_millis(100);
        assert_eq!(after_exit(Some("Never"), 1, 0, b), AfterExit::Stay);
        assert_eq!(after_exit(Some("OnFailure"), 0, 0, b), AfterExit::Stay);
        assert_eq!(
            after_exit(Some("OnFailure"), 2, 0, b),
            AfterExit::Restart(b)
        );
        assert_eq!(after_exit(Some("Always"), 0, 0, b), AfterExit::Restart(b));
        assert_eq!(after_exit(None, 0, 0, b), AfterExit::Restart(b));
        // Back-off doubles and is capped at five minutes.
        assert_eq!(after_exit(None, 1, 3, b), AfterExit::Restart(b * 8));
        assert_eq!(
            after_exit(None, 1, 40, Duration::from_secs(10)),
            AfterExit::Restart(Duration::from_secs(300))
        );
    }

    #[test]
    fn phases() {
        let waiting = Run::Waiting {
            reason: "ContainerCreating".into(),
            message: None,
        };
        let running = Run::Running { started: t(0) };
        assert_eq!(phase(&[]), "Pending");
        assert_eq!(phase(&[c(waiting.clone(), None, 0)]), "Pending");
        assert_eq!(phase(&[c(running.clone(), None, 0)]), "Running");
        let done = |code, restarting| Run::Exited {
            exit: exit(code),
            restarting,
        };
        assert_eq!(phase(&[c(done(0, false), None, 0)]), "Succeeded");
        assert_eq!(phase(&[c(done(3, false), None, 0)]), "Failed");
        // Waiting to restart is still Running, as is a restarted one that is being started.
        assert_eq!(phase(&[c(done(3, true), None, 0)]), "Running");
        assert_eq!(phase(&[c(waiting, Some(exit(1)), 1)]), "Running");
        // One container still running keeps the pod Running.
        assert_eq!(
            phase(&[c(done(0, false), None, 0), c(running, None, 0)]),
            "Running"
        );
        assert_eq!(
            phase(&[c(done(0, false), None, 0), c(done(1, false), None, 0)]),
            "Failed"
        );
    }

    #[test]
    fn status_of_a_restarting_container() {
        let containers = [c(
            Run::Exited {
                exit: exit(2),
                restarting: true,
            },
            Some(exit(2)),
            1,
        )];
        let s = pod_status(&Observed {
            host_ip: "10.0.1.10",
            pod_ip: Some("10.244.1.2"),
            start_time: t(0),
            containers: &containers,
            previous: &[],
            now: t(5),
        });
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(s.pod_ip.as_deref(), Some("10.244.1.2"));
        let cs = &s.container_statuses.unwrap()[0];
        assert_eq!(cs.restart_count, 1);
        assert!(!cs.ready);
        let st = cs.state.as_ref().unwrap();
        assert_eq!(
            st.waiting.as_ref().unwrap().reason.as_deref(),
            Some("CrashLoopBackOff")
        );
        let last = cs.last_state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!((last.exit_code, last.reason.as_deref()), (2, Some("Error")));
        let ready = s
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason.as_deref(), Some("ContainersNotReady"));
    }

    #[test]
    fn conditions_keep_their_transition_time() {
        let containers = [c(Run::Running { started: t(0) }, None, 0)];
        let first = pod_status(&Observed {
            host_ip: "h",
            pod_ip: Some("p"),
            start_time: t(0),
            containers: &containers,
            previous: &[],
            now: t(1),
        });
        let prev = first.conditions.unwrap();
        let again = pod_status(&Observed {
            host_ip: "h",
            pod_ip: Some("p"),
            start_time: t(0),
            containers: &containers,
            previous: &prev,
            now: t(9),
        });
        assert_eq!(again.conditions.unwrap(), prev);
        let ready = prev.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.status, "True");
        assert_eq!(ready.last_transition_time, Some(Time(t(1))));
        let cs = &again.container_statuses.unwrap()[0];
        assert!(cs.ready);
        assert!(cs.state.as_ref().unwrap().running.is_some());
    }
}
