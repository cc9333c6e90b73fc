//! Whether the virtual node is Ready: a pure function of what the virtual kubelet observed
//! (the provider's API through the identity, the tunnel's `Connection`) and an injected clock.
//!
//! The node is Ready while the provider's API answers with the identity's credentials AND the
//! tunnel to the provider is Connected. Otherwise it is NotReady with a reason an operator can
//! act on (`ProviderUnreachable`, `ProviderRefused`, `TunnelDown`, `TunnelMissing`), and the
//! node's `NetworkUnavailable` condition says whether the tunnel is the cause. The Lease keeps
//! being renewed while this process runs, so the reason written here stays visible instead
//! of being replaced by the node lifecycle controller's "Kubelet stopped posting node status".
use std::{collections::BTreeMap, time::Duration};

use fabric_api::networking::v1alpha1::ConnectionState;
use k8s_openapi::{
    api::core::v1::NodeCondition, apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp,
};

pub const READY: &str = "Ready";
pub const NETWORK_UNAVAILABLE: &str = "NetworkUnavailable";
/// Whether the provider refuses custom kinds this virtual kubelet reflects (only on a node
/// that reflects some: `--reflect-custom-resource`).
pub const CUSTOM_RESOURCES_REFUSED: &str = "CustomResourcesRefused";
/// Custom kinds this virtual kubelet is to reflect that its own cluster does not serve (their
/// CRD not installed yet): only while there are some.
pub const CUSTOM_RESOURCES_NOT_SERVED: &str = "CustomResourcesNotServed";

/// Reasons of the Ready condition.
pub mod reason {
    pub const READY: &str = "VirtualKubeletReady";
    /// No probe of the provider has completed yet.
    pub const NOT_PROBED: &str = "ProviderNotProbed";
    /// The provider's API did not answer (connection refused, timeout, 5xx) for longer than
    /// the grace period.
    pub const PROVIDER_UNREACHABLE: &str = "ProviderUnreachable";
    /// The provider's API answered but refused the identity (401/403): expired or revoked
    /// credentials.
    pub const PROVIDER_REFUSED: &str = "ProviderRefused";
    /// The tunnel's Connection exists but is not Connected.
    pub const TUNNEL_DOWN: &str = "TunnelDown";
    /// No Connection for the provider: the network peering is missing.
    pub const TUNNEL_MISSING: &str = "TunnelMissing";
    /// The identity Secret is missing or holds no usable kubeconfig.
    pub const NO_IDENTITY: &str = "IdentityUnavailable";
    /// Reason of NetworkUnavailable=False.
    pub const TUNNEL_CONNECTED: &str = "TunnelConnected";
    /// CustomResourcesRefused=True: the provider answered 403 to some of them.
    pub const PROVIDER_REFUSES_KINDS: &str = "ProviderRefusesKinds";
    /// CustomResourcesRefused=False.
    pub const ALL_ACCEPTED: &str = "AllAccepted";
    /// CustomResourcesNotServed=True.
    pub const NOT_SERVED_HERE: &str = "NotServedHere";
}

/// The outcome of one probe of the provider's API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// It answered and accepted the identity.
    Answered,
    /// It answered 401/403.
    Refused(String),
    /// No answer, or a server error.
    Unreachable(String),
    /// No usable credentials: the identity Secret is missing or unreadable.
    NoIdentity(String),
}

/// The tunnel as the local `Connection` for the provider reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tunnel {
    /// No Connection object (yet).
    Missing,
    Reported {
        state: ConnectionState,
        message: Option<String>,
    },
}

/// What the virtual kubelet knows about the provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// The provider's cluster id (for messages).
    pub provider: String,
    /// The last completed probe and when it completed.
    pub last_probe: Option<(Timestamp, Probe)>,
    /// When the provider last answered.
    pub last_answer: Option<Timestamp>,
    pub tunnel: Tunnel,
    /// The custom kinds the provider refuses now, with what it said (`None`: this virtual
    /// kubelet reflects no custom kind).
    pub refused_kinds: Option<BTreeMap<String, String>>,
    /// The custom kinds to reflect that this cluster does not serve, with why.
    pub unserved_kinds: BTreeMap<String, String>,
}

impl Observed {
    pub fn new(provider: impl Into<String>) -> Self {
        Self {
            provider: provider.into(),
            last_probe: None,
            last_answer: None,
            tunnel: Tunnel::Missing,
            refused_kinds: None,
            unserved_kinds: BTreeMap::new(),
        }
    }

    /// Records a probe that completed at `at`.
    pub fn probed(&mut self, at: Timestamp, probe: Probe) {
        if probe == Probe::Answered {
            self.last_answer = Some(at);
        }
        self.last_probe = Some((at, probe));
    }
}

/// How tolerant the decision is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// A provider that answered less than this long ago stays Ready through failed probes,
    /// so that one lost request does not flap the node.
    pub grace: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(10),
        }
    }
}

/// The verdict on one side (provider or tunnel): healthy, or the reason and message why not.
type Verdict = Result<String, (&'static str, String)>;

fn provider_verdict(o: &Observed, now: Timestamp, policy: Policy) -> Verdict {
    let Some((_, probe)) = &o.last_probe else {
        return Err((
            reason::NOT_PROBED,
            format!("the API of provider {} was not probed yet", o.provider),
        ));
    };
    match probe {
        Probe::Answered => Ok(format!("the API of provider {} answers", o.provider)),
        Probe::Refused(msg) => Err((
            reason::PROVIDER_REFUSED,
            format!(
                "the API of provider {} refuses this cluster's identity: {msg}",
                o.provider
            ),
        )),
        Probe::NoIdentity(msg) => Err((
            reason::NO_IDENTITY,
            format!("no identity for provider {}: {msg}", o.provider),
        )),
        Probe::Unreachable(msg) => {
            let silent = o
                .last_answer
                .map(|t| now.duration_since(t).unsigned_abs())
                .filter(|d| *d < policy.grace);
            match silent {
                Some(_) => Ok(format!(
                    "the API of provider {} answered recently (last probe: {msg})",
                    o.provider
                )),
                None => Err((
                    reason::PROVIDER_UNREACHABLE,
                    match o.last_answer {
                        Some(t) => format!(
                            "the API of provider {} has not answered since {t}: {msg}",
                            o.provider
                        ),
                        None => {
                            format!("the API of provider {} does not answer: {msg}", o.provider)
                        }
                    },
                )),
            }
        }
    }
}

fn tunnel_verdict(o: &Observed) -> Verdict {
    match &o.tunnel {
        Tunnel::Missing => Err((
            reason::TUNNEL_MISSING,
            format!(
                "no Connection to provider {}: the network is not peered",
                o.provider
            ),
        )),
        Tunnel::Reported {
            state: ConnectionState::Connected,
            ..
        } => Ok(format!(
            "the tunnel to provider {} is connected",
            o.provider
        )),
        Tunnel::Reported { state, message } => Err((
            reason::TUNNEL_DOWN,
            format!(
                "the tunnel to provider {} is {state:?}{}",
                o.provider,
                message
                    .as_deref()
                    .map(|m| format!(": {m}"))
                    .unwrap_or_default()
            ),
        )),
    }
}

fn condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    previous: &[NodeCondition],
    now: Timestamp,
) -> NodeCondition {
    // As the kubelet: the transition time moves only when the status does, so a restart
    // that observes the same state leaves the condition as it was (no flap).
    let transition = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    NodeCondition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(message),
        last_heartbeat_time: Some(Time(now)),
        last_transition_time: Some(transition),
    }
}

/// The node's conditions (Ready, NetworkUnavailable) from what was observed, given the ones
/// it has now (`previous`, for transition times).
pub fn node_conditions(
    o: &Observed,
    previous: &[NodeCondition],
    now: Timestamp,
    policy: Policy,
) -> Vec<NodeCondition> {
    let provider = provider_verdict(o, now, policy);
    let tunnel = tunnel_verdict(o);
    let ready = match (&provider, &tunnel) {
        (Ok(p), Ok(t)) => condition(
            READY,
            "True",
            reason::READY,
            format!("{p}; {t}"),
            previous,
            now,
        ),
        // Before the first probe nothing is known about the provider: Unknown, as the node
        // lifecycle controller says of a node it has not heard from.
        (Err((r, m)), _) if *r == reason::NOT_PROBED => {
            condition(READY, "Unknown", r, m.clone(), previous, now)
        }
        // The provider first: without its API nothing can be offloaded, whatever the tunnel.
        (Err((r, m)), t) => {
            let also = match t {
                Err((_, tm)) => format!("; {tm}"),
                Ok(_) => String::new(),
            };
            condition(READY, "False", r, format!("{m}{also}"), previous, now)
        }
        (Ok(_), Err((r, m))) => condition(READY, "False", r, m.clone(), previous, now),
    };
    let network = match tunnel {
        Ok(m) => condition(
            NETWORK_UNAVAILABLE,
            "False",
            reason::TUNNEL_CONNECTED,
            m,
            previous,
            now,
        ),
        Err((r, m)) => condition(NETWORK_UNAVAILABLE, "True", r, m, previous, now),
    };
    let mut all = vec![ready, network];
    if let Some(refused) = &o.refused_kinds {
        all.push(kinds_condition(&o.provider, refused, previous, now));
    }
    if !o.unserved_kinds.is_empty() {
        let each: Vec<&str> = o.unserved_kinds.values().map(String::as_str).collect();
        let m = format!(
            "{}; not reflected until this cluster serves them (looked up every {}s; the \
             virtual kubelet restarts to take a kind up)",
            each.join("; "),
            crate::custom::LOOK_AGAIN.as_secs()
        );
        all.push(condition(
            CUSTOM_RESOURCES_NOT_SERVED,
            "True",
            reason::NOT_SERVED_HERE,
            m,
            previous,
            now,
        ));
    }
    all
}

/// CustomResourcesRefused: which kinds the provider refuses and what it said, or that it
/// refuses none. The pods go on either way: only those kinds are not reflected.
fn kinds_condition(
    provider: &str,
    refused: &BTreeMap<String, String>,
    previous: &[NodeCondition],
    now: Timestamp,
) -> NodeCondition {
    if refused.is_empty() {
        let m = format!("provider {provider} accepts the custom kinds reflected so far");
        return condition(
            CUSTOM_RESOURCES_REFUSED,
            "False",
            reason::ALL_ACCEPTED,
            m,
            previous,
            now,
        );
    }
    let each: Vec<String> = refused
        .iter()
        .map(|(kind, said)| format!("{kind} ({said})"))
        .collect();
    let m = format!(
        "provider {provider} does not accept {} from this cluster: not reflected until its \
         admin grants tenants these kinds (asked every few seconds)",
        each.join("; ")
    );
    condition(
        CUSTOM_RESOURCES_REFUSED,
        "True",
        reason::PROVIDER_REFUSES_KINDS,
        m,
        previous,
        now,
    )
}

/// Whether two sets of conditions say the same (heartbeat times aside): if so, the node's
/// status need not be written before its periodic refresh.
pub fn same_state(a: &[NodeCondition], b: &[NodeCondition]) -> bool {
    let key = |c: &NodeCondition| {
        (
            c.type_.clone(),
            c.status.clone(),
            c.reason.clone(),
            c.message.clone(),
            c.last_transition_time.clone(),
        )
    };
    let mut a: Vec<_> = a.iter().map(key).collect();
    let mut b: Vec<_> = b.iter().map(key).collect();
    a.sort();
    b.sort();
    a == b
}

/// Whether the node is Ready (the provider and the tunnel answer), and why not.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Readiness {
    pub ready: bool,
    pub message: String,
    /// Under at-most-once semantics, once the provider has stopped the pods for sure: why
    /// they are Failed here ([`crate::heartbeat::declared`]).
    pub partitioned: Option<String>,
    /// Under at-most-once semantics, why new pods wait ([`crate::heartbeat::offload_waits`]).
    pub offload_waits: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn connected() -> Tunnel {
        Tunnel::Reported {
            state: ConnectionState::Connected,
            message: None,
        }
    }

    fn ready(c: &[NodeCondition]) -> (&str, &str) {
        let r = c.iter().find(|c| c.type_ == READY).unwrap();
        (r.status.as_str(), r.reason.as_deref().unwrap())
    }

    #[test]
    fn ready_when_the_provider_answers_and_the_tunnel_is_up() {
        let mut o = Observed::new("p");
        o.tunnel = connected();
        o.probed(at(0), Probe::Answered);
        let c = node_conditions(&o, &[], at(0), Policy::default());
        assert_eq!(ready(&c), ("True", reason::READY));
        let net = c.iter().find(|c| c.type_ == NETWORK_UNAVAILABLE).unwrap();
        assert_eq!(net.status, "False");
    }

    #[test]
    fn unknown_before_the_first_probe() {
        let mut o = Observed::new("p");
        o.tunnel = connected();
        let c = node_conditions(&o, &[], at(0), Policy::default());
        assert_eq!(ready(&c), ("Unknown", reason::NOT_PROBED));
    }

    #[test]
    fn a_failed_probe_within_the_grace_period_does_not_flap() {
        let policy = Policy {
            grace: Duration::from_secs(10),
        };
        let mut o = Observed::new("p");
        o.tunnel = connected();
        o.probed(at(0), Probe::Answered);
        o.probed(at(5), Probe::Unreachable("timeout".into()));
        let c = node_conditions(&o, &[], at(5), policy);
        assert_eq!(ready(&c), ("True", reason::READY));
        // Silent for longer than the grace period: NotReady, saying since when.
        o.probed(at(11), Probe::Unreachable("connection refused".into()));
        let c = node_conditions(&o, &c, at(11), policy);
        assert_eq!(ready(&c), ("False", reason::PROVIDER_UNREACHABLE));
        let msg = c[0].message.as_deref().unwrap();
        assert!(
            msg.contains("connection refused") && msg.contains("since"),
            "{msg}"
        );
        // Never answered at all: NotReady at once.
        let mut fresh = Observed::new("p");
        fresh.tunnel = connected();
        fresh.probed(at(0), Probe::Unreachable("refused".into()));
        assert_eq!(
            ready(&node_conditions(&fresh, &[], at(0), policy)),
            ("False", reason::PROVIDER_UNREACHABLE)
        );
    }

    #[test]
    fn a_refused_identity_is_not_ready_at_once() {
        let mut o = Observed::new("p");
        o.tunnel = connected();
        o.probed(at(0), Probe::Answered);
        o.probed(at(1), Probe::Refused("403 forbidden".into()));
        let c = node_conditions(&o, &[], at(1), Policy::default());
        assert_eq!(ready(&c), ("False", reason::PROVIDER_REFUSED));
        o.probed(
            at(2),
            Probe::NoIdentity("the identity Secret does not exist".into()),
        );
        let c = node_conditions(&o, &[], at(2), Policy::default());
        assert_eq!(ready(&c), ("False", reason::NO_IDENTITY));
    }

    #[test]
    fn the_tunnel_decides_too_and_shows_in_network_unavailable() {
        let mut o = Observed::new("p");
        o.probed(at(0), Probe::Answered);
        let c = node_conditions(&o, &[], at(0), Policy::default());
        assert_eq!(ready(&c), ("False", reason::TUNNEL_MISSING));
        o.tunnel = Tunnel::Reported {
            state: ConnectionState::Error,
            message: Some("no handshake".into()),
        };
        let c = node_conditions(&o, &[], at(0), Policy::default());
        assert_eq!(ready(&c), ("False", reason::TUNNEL_DOWN));
        assert!(c[0].message.as_deref().unwrap().contains("no handshake"));
        let net = c.iter().find(|c| c.type_ == NETWORK_UNAVAILABLE).unwrap();
        assert_eq!(
            (net.status.as_str(), net.reason.as_deref()),
            ("True", Some(reason::TUNNEL_DOWN))
        );
        // Both down: the provider is the reason, the message names both.
        o.probed(at(1), Probe::Refused("401".into()));
        let c = node_conditions(&o, &[], at(1), Policy::default());
        assert_eq!(ready(&c), ("False", reason::PROVIDER_REFUSED));
        assert!(c[0].message.as_deref().unwrap().contains("tunnel"));
    }

    #[test]
    fn transition_times_move_only_with_the_status() {
        let mut o = Observed::new("p");
        o.tunnel = connected();
        o.probed(at(0), Probe::Answered);
        let first = node_conditions(&o, &[], at(0), Policy::default());
        // Later, same state (e.g. after a restart that read the node's conditions back).
        o.probed(at(30), Probe::Answered);
        let later = node_conditions(&o, &first, at(30), Policy::default());
        assert_eq!(later[0].last_transition_time, Some(Time(at(0))));
        assert_eq!(later[0].last_heartbeat_time, Some(Time(at(30))));
        assert!(same_state(&first, &later));
        o.tunnel = Tunnel::Reported {
            state: ConnectionState::Connecting,
            message: None,
        };
        let down = node_conditions(&o, &later, at(40), Policy::default());
        assert_eq!(down[0].last_transition_time, Some(Time(at(40))));
        assert!(!same_state(&later, &down));
    }

    #[test]
    fn custom_kinds_this_cluster_does_not_serve_are_named_while_there_are_some() {
        let mut o = Observed::new("b");
        o.tunnel = connected();
        o.probed(at(0), Probe::Answered);
        let unserved = |c: &[NodeCondition]| {
            c.iter()
                .find(|c| c.type_ == CUSTOM_RESOURCES_NOT_SERVED)
                .map(|c| {
                    (
                        c.status.clone(),
                        c.reason.clone().unwrap_or_default(),
                        c.message.clone().unwrap_or_default(),
                    )
                })
        };
        assert_eq!(
            unserved(&node_conditions(&o, &[], at(0), Policy::default())),
            None
        );
        o.unserved_kinds = BTreeMap::from([(
            "doohickeys.example.com/v1".to_owned(),
            "--reflect-custom-resource doohickeys.example.com/v1: this cluster does not serve it"
                .to_owned(),
        )]);
        let all = node_conditions(&o, &[], at(0), Policy::default());
        let (status, reason, message) = unserved(&all).unwrap();
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("True", reason::NOT_SERVED_HERE)
        );
        assert!(
            message.contains("doohickeys.example.com/v1: this cluster does not serve it")
                && message.contains("not reflected until"),
            "{message}"
        );
        // The node is Ready all the same: only that kind waits.
        assert_eq!(all[0].status, "True", "{:?}", all[0]);
    }

    #[test]
    fn refused_custom_kinds_are_named_on_a_node_that_reflects_some() {
        let mut o = Observed::new("b");
        o.probed(at(0), Probe::Answered);
        let kinds = |c: &[NodeCondition]| {
            c.iter()
                .find(|c| c.type_ == CUSTOM_RESOURCES_REFUSED)
                .map(|c| (c.status.clone(), c.message.clone().unwrap_or_default()))
        };
        // A node reflecting no custom kind has no such condition.
        assert_eq!(
            kinds(&node_conditions(&o, &[], at(0), Policy::default())),
            None
        );
        o.refused_kinds = Some(BTreeMap::new());
        let (status, _) = kinds(&node_conditions(&o, &[], at(0), Policy::default())).unwrap();
        assert_eq!(status, "False");
        o.refused_kinds = Some(BTreeMap::from([(
            "gadgets.example.com/v1".to_owned(),
            "gadgets is forbidden".to_owned(),
        )]));
        let (status, message) = kinds(&node_conditions(&o, &[], at(1), Policy::default())).unwrap();
        assert_eq!(status, "True");
        assert!(
            message.contains("gadgets.example.com/v1 (gadgets is forbidden)"),
            "{message}"
        );
    }
}
