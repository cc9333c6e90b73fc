//! Reconfiguration as pure decisions: what a reload takes down, what an update changes on a
//! running peer. The device (`device::reconfig`) applies them; the `wg set` semantics are in
//! `uapi::plan_set`.

use std::{collections::HashMap, net::SocketAddr};

use crate::{
    config::{InterfaceConfig, PeerConfig},
    key::PublicKey,
};

/// The running peers (key, name, device) a reload to `wanted` removes: those no longer
/// wanted and those whose name or device changes (a device is not renamed under a live
/// peer: it is removed and added again). Removals go first, so that a device name can move
/// from an old peer to a new one.
pub fn reload_removals<'a>(
    running: impl IntoIterator<Item = (PublicKey, &'a str, &'a str)>,
    wanted: &[PeerConfig],
) -> Vec<PublicKey> {
    let wanted: HashMap<PublicKey, &PeerConfig> =
        wanted.iter().map(|p| (p.public_key, p)).collect();
    running
        .into_iter()
        .filter(|(key, name, device)| {
            !wanted
                .get(key)
                .is_some_and(|c| c.device_name() == *device && c.name == *name)
        })
        .map(|(key, ..)| key)
        .collect()
}

/// Whether `new` changes interface settings that only a restart applies.
pub fn needs_restart(old: &InterfaceConfig, new: &InterfaceConfig) -> bool {
    new.listen_port != old.listen_port
        || new.listen_address != old.listen_address
        || new.mtu != old.mtu
        || new.name != old.name
        || new.busy_poll_us != old.busy_poll_us
}

/// What changes on a running peer (same key, name and device) whose configuration goes
/// from one value to another. Addresses, routes and allowed IPs are always brought to the
/// new configuration (by diffing, so unchanged ones are not touched).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerUpdate {
    /// The endpoint to switch to; None keeps the live one, which may have roamed.
    pub endpoint: Option<Option<SocketAddr>>,
    /// A new session: boringtun cannot change the keepalive of a live `Tunn`, and a fresh
    /// one re-handshakes (about one round trip).
    pub new_session: bool,
    /// The probe's addresses may have changed: its bookkeeping starts over.
    pub new_probe: bool,
    /// Send a handshake initiation right away.
    pub dial: bool,
}

impl PeerUpdate {
    /// None when nothing changes.
    pub fn between(old: &PeerConfig, new: &PeerConfig) -> Option<Self> {
        if old == new {
            return None;
        }
        let new_session = old.persistent_keepalive != new.persistent_keepalive;
        let endpoint_changed = old.endpoint != new.endpoint;
        Some(Self {
            endpoint: endpoint_changed.then_some(new.endpoint),
            new_session,
            new_probe: old.probe_address != new.probe_address || old.addresses != new.addresses,
            dial: new.endpoint.is_some() && (endpoint_changed || new_session),
        })
    }

    /// The live endpoint after this update, given the one before.
    pub fn endpoint_after(&self, live: Option<SocketAddr>) -> Option<SocketAddr> {
        self.endpoint.unwrap_or(live)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn peer(name: &str, key: u8) -> PeerConfig {
        PeerConfig {
            name: name.into(),
            public_key: PublicKey::from_bytes([key; 32]),
            endpoint: None,
            allowed_ips: vec![],
            persistent_keepalive: None,
            device: None,
            addresses: vec![],
            routes: vec![],
            probe_address: None,
            id: None,
            remaps: vec![],
            mss: None,
        }
    }

    #[test]
    fn reload_removes_unwanted_renamed_and_moved_peers() {
        let (a, b, c, d) = (peer("a", 1), peer("b", 2), peer("c", 3), peer("d", 4));
        let mut b2 = b.clone();
        b2.name = "b2".into();
        let mut c2 = c.clone();
        c2.device = Some("fab-other".into());
        let mut d2 = d.clone();
        d2.endpoint = Some("192.0.2.1:51820".parse().unwrap());
        let running = [
            (a.public_key, "a", "fab-a"),
            (b.public_key, "b", "fab-b"),
            (c.public_key, "c", "fab-c"),
            (d.public_key, "d", "fab-d"),
        ];
        assert_eq!(
            reload_removals(running, &[b2, c2, d2]),
            [a.public_key, b.public_key, c.public_key]
        );
    }

    #[test]
    fn peer_update_lists_what_changes() {
        let old = peer("a", 1);
        assert_eq!(PeerUpdate::between(&old, &old), None);

        let mut new = old.clone();
        new.allowed_ips = vec!["10.0.0.0/8".parse().unwrap()];
        let u = PeerUpdate::between(&old, &new).unwrap();
        assert_eq!(
            u,
            PeerUpdate {
                endpoint: None,
                new_session: false,
                new_probe: false,
                dial: false
            }
        );
        let roamed = Some("198.51.100.7:4000".parse().unwrap());
        assert_eq!(u.endpoint_after(roamed), roamed);

        let ep = Some("192.0.2.1:51820".parse().unwrap());
        new.endpoint = ep;
        let u = PeerUpdate::between(&old, &new).unwrap();
        assert_eq!((u.endpoint, u.dial, u.new_session), (Some(ep), true, false));
        assert_eq!(u.endpoint_after(roamed), ep);

        let mut ka = new.clone();
        ka.persistent_keepalive = Some(25);
        let u = PeerUpdate::between(&new, &ka).unwrap();
        assert_eq!((u.endpoint, u.dial, u.new_session), (None, true, true));

        let mut pr = new.clone();
        pr.addresses = vec!["10.99.0.1/32".parse().unwrap()];
        let u = PeerUpdate::between(&new, &pr).unwrap();
        assert!(u.new_probe && !u.dial);
    }
}
