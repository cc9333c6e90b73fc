//! What the operator reports about each tunnel, free of I/O: the `Connection` status a
//! gateway's peer status amounts to, whether the stored one is due for a rewrite, and the
//! Event a change of state is worth.
use std::time::{Duration, Instant};

use fabric_api::networking::v1alpha1::{ConnectionState, ConnectionStatus};
use fabric_kube::{events::Event, status::condition};
use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Condition, jiff::Timestamp};

/// The gateway's view of one peer, as far as the report goes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tunnel {
    pub up: bool,
    pub rtt_seconds: Option<f64>,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
}

/// The Connection status for a peer the gateway reports as `tunnel` (None: the gateway does
/// not run it, or could not be asked).
pub fn connection_status(tunnel: Option<Tunnel>) -> ConnectionStatus {
    let bytes = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let (value, latency, rx, tx, message) = match tunnel {
        Some(g) if g.up => (
            ConnectionState::Connected,
            g.rtt_seconds.map(|s| format!("{:.2}ms", s * 1e3)),
            bytes(g.rx_bytes),
            bytes(g.tx_bytes),
            None,
        ),
        Some(g) => (
            ConnectionState::Connecting,
            None,
            bytes(g.rx_bytes),
            bytes(g.tx_bytes),
            Some("no recent handshake".to_owned()),
        ),
        None => (
            ConnectionState::Error,
            None,
            0,
            0,
            Some("gateway does not run this peer".to_owned()),
        ),
    };
    ConnectionStatus {
        value,
        latency,
        rx_bytes: rx,
        tx_bytes: tx,
        message,
        conditions: vec![],
    }
}

/// Whether the stored status `stored` must be rewritten as `want`: at once when the state or
/// its message changed (or nothing is stored), and for counters alone (latency, bytes, which
/// move with every probe) at most every `refresh` since this replica last wrote it
/// (`written`, None: not yet).
pub fn due(
    stored: Option<&ConnectionStatus>,
    want: &ConnectionStatus,
    written: Option<Instant>,
    now: Instant,
    refresh: Duration,
) -> bool {
    let Some(stored) = stored else {
        return true;
    };
    if stored.value != want.value || stored.message != want.message {
        return true;
    }
    if stored == want {
        return false;
    }
    written.is_none_or(|t| now.saturating_duration_since(t) >= refresh)
}

/// The Event a change of state from `before` (None: no Connection yet) to `now` is worth.
pub fn transition(
    peer: &str,
    before: Option<ConnectionState>,
    now: &ConnectionStatus,
) -> Option<Event> {
    let why = now.message.clone().unwrap_or_default();
    match (before, now.value) {
        (b, n) if b == Some(n) => None,
        (_, ConnectionState::Connected) => Some(Event::normal(
            "Connected",
            "Report",
            match &now.latency {
                Some(l) => format!("tunnel to {peer} up, latency {l}"),
                None => format!("tunnel to {peer} up"),
            },
        )),
        (Some(ConnectionState::Connected), ConnectionState::Connecting) => Some(Event::warning(
            "Disconnected",
            "Report",
            format!("tunnel to {peer} down: {why}"),
        )),
        (_, ConnectionState::Error) => Some(Event::warning(
            "Error",
            "Report",
            format!("tunnel to {peer}: {why}"),
        )),
        // Not up yet (a new peer, or after an error): nothing happened worth telling.
        (_, ConnectionState::Connecting) => None,
    }
}

/// The condition the operator sets on a peer's Configuration and on an `IP`: whether the
/// gateway runs it, or left it out of its configuration (and why).
pub const ACCEPTED: &str = "GatewayAccepted";

/// The [`ACCEPTED`] condition `what` (a peer, an IP) must carry when the gateway left it out
/// for `why_not` (None: it runs), with the Event the change is worth; None when `current`
/// (its conditions as last seen or written) already says so.
pub fn accepted(
    what: &str,
    why_not: Option<&str>,
    current: &[Condition],
    generation: Option<i64>,
    now: Timestamp,
) -> Option<(Condition, Option<Event>)> {
    let (ok, reason, message) = match why_not {
        None => (true, "Running", "the gateway runs it".to_owned()),
        Some(why) => (
            false,
            "LeftOut",
            format!("left out of the gateway's configuration: {why}"),
        ),
    };
    let old = current.iter().find(|c| c.type_ == ACCEPTED);
    let mut want = condition(ACCEPTED, ok, reason, message, generation, now);
    if let Some(old) = old {
        if old.status == want.status && old.reason == want.reason && old.message == want.message {
            return None;
        }
        if old.status == want.status {
            want.last_transition_time = old.last_transition_time.clone();
        }
    }
    let was_ok = old.map(|c| c.status == "True");
    let event = match (why_not, was_ok) {
        (Some(why), _) => Some(Event::warning(
            "LeftOut",
            "Render",
            format!("the gateway left {what} out of its configuration: {why}"),
        )),
        (None, Some(false)) => Some(Event::normal(
            "Accepted",
            "Render",
            format!("the gateway runs {what} again"),
        )),
        (None, _) => None,
    };
    Some((want, event))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resource_left_out_says_why_once() {
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let t1: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        // A new peer the gateway runs: the condition, nothing worth an Event.
        let (ok, ev) = accepted("peer b", None, &[], Some(1), t0).unwrap();
        assert_eq!((ok.status.as_str(), ev), ("True", None));
        assert!(accepted("peer b", None, std::slice::from_ref(&ok), Some(1), t1).is_none());
        // Left out: a warning that names the reason.
        let (bad, ev) = accepted(
            "peer b",
            Some("same key as c"),
            std::slice::from_ref(&ok),
            Some(1),
            t1,
        )
        .unwrap();
        assert_eq!(
            (bad.status.as_str(), bad.reason.as_str()),
            ("False", "LeftOut")
        );
        assert!(bad.message.contains("same key as c"));
        assert_eq!(bad.last_transition_time.0, t1);
        let ev = ev.unwrap();
        assert!(ev.warning && ev.note.contains("peer b") && ev.note.contains("same key"));
        // Once said, said: no new write, no new Event.
        let two = [ok.clone(), bad.clone()].map(|mut c| {
            c.type_ = if c.status == "True" {
                "Ready".into()
            } else {
                c.type_
            };
            c
        });
        assert!(accepted("peer b", Some("same key as c"), &two, Some(1), t1).is_none());
        // Another reason is written and told; the transition time stays.
        let (other, ev) = accepted(
            "peer b",
            Some("overlap"),
            std::slice::from_ref(&bad),
            Some(1),
            t0,
        )
        .unwrap();
        assert_eq!(other.last_transition_time.0, t1);
        assert!(ev.is_some());
        // Back in: told once.
        let (back, ev) = accepted("peer b", None, std::slice::from_ref(&bad), Some(1), t0).unwrap();
        assert_eq!(back.status, "True");
        assert_eq!(ev.unwrap().reason, "Accepted");
    }

    fn up(rtt: f64, rx: u64) -> Option<Tunnel> {
        Some(Tunnel {
            up: true,
            rtt_seconds: Some(rtt),
            rx_bytes: rx,
            tx_bytes: rx,
        })
    }

    #[test]
    fn the_status_says_what_the_gateway_sees() {
        let s = connection_status(up(0.00042, 10));
        assert_eq!(s.value, ConnectionState::Connected);
        assert_eq!(s.latency.as_deref(), Some("0.42ms"));
        assert_eq!((s.rx_bytes, s.message), (10, None));
        let down = connection_status(Some(Tunnel {
            up: false,
            rtt_seconds: Some(0.1),
            rx_bytes: 5,
            tx_bytes: 6,
        }));
        assert_eq!(down.value, ConnectionState::Connecting);
        assert_eq!((down.latency, down.tx_bytes), (None, 6));
        let gone = connection_status(None);
        assert_eq!(gone.value, ConnectionState::Error);
        assert!(gone.message.unwrap().contains("does not run"));
    }

    #[test]
    fn states_are_written_at_once_counters_at_the_refresh() {
        let t0 = Instant::now();
        let r = Duration::from_secs(10);
        let a = connection_status(up(0.001, 10));
        let b = connection_status(up(0.002, 20));
        assert!(due(None, &a, None, t0, r), "nothing stored");
        assert!(!due(Some(&a), &a, Some(t0), t0, r), "unchanged");
        assert!(!due(Some(&a), &a, None, t0 + r * 9, r), "unchanged, ever");
        assert!(!due(Some(&a), &b, Some(t0), t0 + r / 2, r), "counters only");
        assert!(
            due(Some(&a), &b, Some(t0), t0 + r, r),
            "counters, refreshed"
        );
        // Written by another replica (a takeover): ours has not written it yet.
        assert!(due(Some(&a), &b, None, t0, r));
        let down = connection_status(None);
        assert!(
            due(Some(&a), &down, Some(t0), t0, r),
            "a state change is at once"
        );
    }

    #[test]
    fn changes_of_state_make_events() {
        let on = connection_status(up(0.001, 1));
        let connecting = connection_status(Some(Tunnel {
            up: false,
            rtt_seconds: None,
            rx_bytes: 0,
            tx_bytes: 0,
        }));
        let err = connection_status(None);
        use ConnectionState::*;
        let reason = |b, n| transition("b", b, n).map(|e| (e.reason, e.warning));
        assert_eq!(reason(None, &on), Some(("Connected", false)));
        assert_eq!(reason(Some(Connecting), &on), Some(("Connected", false)));
        assert_eq!(reason(Some(Error), &on), Some(("Connected", false)));
        assert_eq!(reason(Some(Connected), &on), None);
        assert_eq!(
            reason(Some(Connected), &connecting),
            Some(("Disconnected", true))
        );
        assert_eq!(reason(None, &connecting), None);
        assert_eq!(reason(Some(Error), &connecting), None);
        assert_eq!(reason(Some(Connected), &err), Some(("Error", true)));
        assert_eq!(reason(None, &err), Some(("Error", true)));
        assert_eq!(reason(Some(Error), &err), None);
        let e = transition("cluster-b", Some(Connected), &connecting).unwrap();
        assert!(e.note.contains("cluster-b") && e.note.contains("no recent handshake"));
    }
}
