//! What the operator reports about each tunnel, free of I/O: the `Connection` status a
//! gateway's peer status amounts to, whether the stored one is due for a rewrite, and the
//! Event a change of state is worth.
use std::time::{Duration, Instant};

use fabric_api::networking::v1alpha1::{ConnectionState, ConnectionStatus};
use fabric_kube::events::Event;

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

#[cfg(test)]
mod tests {
    use super::*;

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
