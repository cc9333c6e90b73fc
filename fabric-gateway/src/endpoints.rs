//! Endpoints learnt from peers, remembered across restarts of the gateway.
//!
//! The listening side of a peering has no endpoint for its peer in its configuration: it
//! learns it from the peer's first authenticated datagram (roaming). A restarted listening
//! gateway has lost every session and, without an endpoint, cannot dial: it waits until the
//! dialing peer notices its old session is dead (its in-tunnel probes fail for seconds) and
//! hand-shakes again. With the endpoint it last saw, it dials at once instead, as the dialing
//! side does, and traffic is back after one round trip.
//!
//! The file (`<control_dir>/<name>.endpoints`, beside the control socket, so on the pod's
//! emptyDir) holds one `PUBLIC_KEY ADDRESS:PORT` line per peer with a learnt endpoint. It is
//! only a hint: the handshake proves the peer, and a configured endpoint always wins. Pure
//! here; the device reads it at start and writes it when an endpoint moves.
use std::{collections::BTreeMap, net::SocketAddr};

use crate::key::PublicKey;

/// Learnt endpoints by peer.
pub type Learnt = BTreeMap<PublicKey, SocketAddr>;

/// Reads the file's text; lines that are not `KEY ADDRESS:PORT` are skipped (a file cut short
/// by a crash costs a hint, never the start).
pub fn parse(text: &str) -> Learnt {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (key, addr) = (w.next()?, w.next()?);
            if w.next().is_some() {
                return None;
            }
            Some((PublicKey::from_base64(key).ok()?, addr.parse().ok()?))
        })
        .collect()
}

/// The file's text for `learnt`.
pub fn render(learnt: &Learnt) -> String {
    learnt
        .iter()
        .map(|(k, a)| format!("{} {a}\n", k.to_base64()))
        .collect()
}

/// Where a peer is reached when it is added: its configured endpoint, else the one it was
/// last seen at.
pub fn starting_endpoint(
    configured: Option<SocketAddr>,
    learnt: Option<SocketAddr>,
) -> Option<SocketAddr> {
    configured.or(learnt)
}

/// What to remember of the running peers, given each one's configured and live endpoint:
/// the live endpoints of those without a configured one (peers that are gone are forgotten).
pub fn to_remember(
    peers: impl IntoIterator<Item = (PublicKey, Option<SocketAddr>, Option<SocketAddr>)>,
) -> Learnt {
    peers
        .into_iter()
        .filter(|(_, configured, _)| configured.is_none())
        .filter_map(|(k, _, live)| Some((k, live?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> PublicKey {
        PublicKey::from_bytes([b; 32])
    }

    #[test]
    fn the_file_round_trips_and_skips_what_it_cannot_read() {
        let learnt: Learnt = [
            (key(1), "192.168.77.1:51820".parse().unwrap()),
            (key(2), "[2001:db8::1]:4000".parse().unwrap()),
        ]
        .into();
        let text = render(&learnt);
        assert_eq!(parse(&text), learnt);
        let damaged = format!(
            "{text}garbage\n{} not-an-address\n{} 10.0.0.1:1 extra\n{}",
            key(3).to_base64(),
            key(4).to_base64(),
            // Cut short by a crash.
            &key(5).to_base64()[..10]
        );
        assert_eq!(parse(&damaged), learnt);
        assert!(parse("").is_empty());
    }

    #[test]
    fn a_configured_endpoint_wins_and_only_learnt_ones_are_kept() {
        let (a, b): (SocketAddr, SocketAddr) = (
            "192.0.2.1:51820".parse().unwrap(),
            "198.51.100.7:4000".parse().unwrap(),
        );
        assert_eq!(starting_endpoint(Some(a), Some(b)), Some(a));
        assert_eq!(starting_endpoint(None, Some(b)), Some(b));
        assert_eq!(starting_endpoint(None, None), None);
        // A dialing peer (configured) is not remembered, nor a listening one not seen yet.
        let kept = to_remember([
            (key(1), Some(a), Some(b)),
            (key(2), None, Some(b)),
            (key(3), None, None),
        ]);
        assert_eq!(kept, [(key(2), b)].into());
    }
}
