//! IPAM's ledger, free of I/O: every CIDR and peer id granted, as stored in the ConfigMap
//! [`IPAM_LEDGER`](fabric_api::names::config_map::IPAM_LEDGER). An allocation is computed
//! from the ledger as last read and written back conditionally on the resourceVersion it was
//! read at (see `store`), never from a copy kept in memory: a leader that lost the Lease
//! without noticing (paused, cut off) gets a conflict, reads again, and grants around what
//! the new leader granted.
use std::{collections::BTreeMap, net::Ipv4Addr};

use fabric_ipam::{Ipam, IpamError};
use ipnetwork::Ipv4Network;
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::Settings;

/// The ConfigMap key holding the ledger (JSON).
pub const DATA_KEY: &str = "ledger.json";

/// Peer ids are 1..=MAX_PEER_ID (the data plane's maps are sized for them).
const MAX_PEER_ID: u32 = 4095;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ledger {
    /// Owner (`<namespace>/<configuration>/<role>`) -> granted CIDR.
    #[serde(default)]
    pub grants: BTreeMap<String, Ipv4Network>,
    /// Configuration (`<namespace>/<name>`) -> data-plane peer id.
    #[serde(default)]
    pub ids: BTreeMap<String, u32>,
    /// `IP` (`<namespace>/<name>`) -> its address in the local external CIDR.
    #[serde(default)]
    pub ips: BTreeMap<String, Ipv4Addr>,
}

/// What a Configuration was granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub pod: Ipv4Network,
    pub external: Ipv4Network,
    pub id: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    #[error(transparent)]
    Ipam(#[from] IpamError),
    #[error("all {MAX_PEER_ID} peer ids are in use")]
    NoPeerId,
}

#[derive(Debug, thiserror::Error)]
#[error("ConfigMap key {DATA_KEY}: {0}")]
pub struct Unreadable(#[source] serde_json::Error);

/// The owner of a Configuration's grant for `role` ("pod" or "external").
pub fn owner(key: &str, role: &str) -> String {
    format!("{key}/{role}")
}

impl Ledger {
    /// The ledger in a ConfigMap's data (none there: an empty ledger).
    pub fn from_data(data: Option<&BTreeMap<String, String>>) -> Result<Self, Unreadable> {
        match data.and_then(|d| d.get(DATA_KEY)) {
            None => Ok(Self::default()),
            Some(json) => serde_json::from_str(json).map_err(Unreadable),
        }
    }

    pub fn to_data(&self) -> BTreeMap<String, String> {
        let json = serde_json::to_string(self).expect("a ledger serializes");
        BTreeMap::from([(DATA_KEY.to_owned(), json)])
    }

    /// An allocator holding this ledger's grants. A grant that clashes now (the reserved
    /// ranges changed) is dropped from the ledger, so that its owner gets a new one.
    fn ipam(&mut self, settings: &Settings, in_use: &[Ipv4Addr]) -> Result<Ipam, IpamError> {
        let mut ipam = Ipam::new(settings.pools.clone(), settings.reserved.clone())?
            .with_largest_claim(settings.largest_claim);
        self.grants
            .retain(|owner, cidr| match ipam.restore(owner, *cidr) {
                Ok(()) => true,
                Err(e) => {
                    warn!(%owner, error = %e, "grant no longer valid; it is granted again");
                    false
                }
            });
        ipam.set_in_use(in_use.iter().copied());
        Ok(ipam)
    }

    /// Grants Configuration `key` the CIDRs under which this cluster sees the peer's `pod`
    /// and `external` networks, and a peer id. Idempotent: what it holds it keeps, as long as
    /// it still fits. On an error the ledger is left as it was.
    pub fn grant(
        &mut self,
        settings: &Settings,
        in_use: &[Ipv4Addr],
        key: &str,
        pod: Ipv4Network,
        external: Ipv4Network,
    ) -> Result<Grant, GrantError> {
        let mut next = self.clone();
        let mut ipam = next.ipam(settings, in_use)?;
        let pod = ipam.allocate(&owner(key, "pod"), pod)?;
        let external = ipam.allocate(&owner(key, "external"), external)?;
        let id = match next.ids.get(key) {
            Some(id) => *id,
            None => (1..=MAX_PEER_ID)
                .find(|i| !next.ids.values().any(|v| v == i))
                .ok_or(GrantError::NoPeerId)?,
        };
        next.ids.insert(key.to_owned(), id);
        next.grants = ipam.grants().clone();
        *self = next;
        Ok(Grant { pod, external, id })
    }

    /// The allocator of addresses in the local `external` CIDR (its network address is never
    /// handed out) holding this ledger's `IP` grants; one that no longer fits (the CIDR
    /// changed) is dropped, so that its owner gets a new one.
    fn ip_pool(&mut self, external: Ipv4Network) -> Result<Ipam, IpamError> {
        let first = Ipv4Network::new(external.network(), 32).expect("a /32 is valid");
        let mut ipam = Ipam::new(vec![external], vec![first])?;
        self.ips.retain(|owner, addr| {
            let cidr = Ipv4Network::new(*addr, 32).expect("a /32 is valid");
            if !external.contains(*addr) {
                warn!(%owner, %addr, %external, "address outside the external CIDR; it is granted again");
                return false;
            }
            match ipam.restore(owner, cidr) {
                Ok(()) => true,
                Err(e) => {
                    warn!(%owner, error = %e, "address no longer valid; it is granted again");
                    false
                }
            }
        });
        Ok(ipam)
    }

    /// Gives `IP` `key` an address in `external`. Idempotent: the address it holds it keeps.
    /// On an error the ledger is left as it was.
    pub fn grant_ip(&mut self, external: Ipv4Network, key: &str) -> Result<Ipv4Addr, IpamError> {
        let mut next = self.clone();
        let addr = next.ip_pool(external)?.allocate_free(key, 32)?.ip();
        next.ips.insert(key.to_owned(), addr);
        *self = next;
        Ok(addr)
    }

    /// Records the address `IP` `key` shows in its status, granted before the ledger kept
    /// addresses, unless the ledger already has one for it or gave that address to another.
    /// Whether it was recorded.
    pub fn adopt_ip(&mut self, external: Ipv4Network, key: &str, addr: Ipv4Addr) -> bool {
        if self.ips.contains_key(key) {
            return false;
        }
        let mut next = self.clone();
        let Ok(mut pool) = next.ip_pool(external) else {
            return false;
        };
        let cidr = Ipv4Network::new(addr, 32).expect("a /32 is valid");
        if !external.contains(addr) || pool.restore(key, cidr).is_err() {
            return false;
        }
        next.ips.insert(key.to_owned(), addr);
        *self = next;
        true
    }

    /// Releases the address of `IP` `key`.
    pub fn release_ip(&mut self, key: &str) {
        self.ips.remove(key);
    }

    /// Releases everything Configuration `key` holds.
    pub fn release(&mut self, key: &str) {
        for role in ["pod", "external"] {
            self.grants.remove(&owner(key, role));
        }
        self.ids.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            namespace: "fabric-system".into(),
            pools: vec!["10.64.0.0/12".parse().unwrap()],
            reserved: vec![
                "10.244.0.0/16".parse().unwrap(),
                "10.96.0.0/12".parse().unwrap(),
                "10.70.0.0/16".parse().unwrap(),
            ],
            largest_claim: 12,
        }
    }

    fn net(s: &str) -> Ipv4Network {
        s.parse().unwrap()
    }

    #[test]
    fn grants_come_from_the_ledger_and_survive_a_round_trip() {
        let s = settings();
        let mut l = Ledger::default();
        let b = l
            .grant(&s, &[], "ns/b", net("10.244.0.0/16"), net("10.70.0.0/16"))
            .unwrap();
        assert_eq!(
            (b.pod, b.external),
            (net("10.64.0.0/16"), net("10.65.0.0/16"))
        );
        // Asking again changes nothing.
        let before = l.clone();
        assert_eq!(
            l.grant(&s, &[], "ns/b", net("10.244.0.0/16"), net("10.70.0.0/16")),
            Ok(b)
        );
        assert_eq!(l, before);
        let back = Ledger::from_data(Some(&l.to_data())).unwrap();
        assert_eq!(back, l);
        // What another leader reads from it never overlaps what is in it.
        let mut other = back;
        let c = other
            .grant(&s, &[], "ns/c", net("10.244.0.0/16"), net("10.70.0.0/16"))
            .unwrap();
        assert!(!c.pod.overlaps(b.pod) && !c.pod.overlaps(b.external));
        assert_ne!(c.id, b.id);
    }

    #[test]
    fn ip_addresses_come_from_the_ledger_never_twice() {
        let ext = net("10.70.0.0/30");
        let mut l = Ledger::default();
        let a = l.grant_ip(ext, "ns/a").unwrap();
        assert_eq!(
            a,
            "10.70.0.1".parse::<Ipv4Addr>().unwrap(),
            "never the network address"
        );
        assert_eq!(l.grant_ip(ext, "ns/a"), Ok(a), "idempotent");
        // Another replica reading this ledger gives the next one out.
        let mut other = Ledger::from_data(Some(&l.to_data())).unwrap();
        let b = other.grant_ip(ext, "ns/b").unwrap();
        assert_ne!(a, b);
        // An address from before the ledger is adopted only when free.
        assert!(!other.adopt_ip(ext, "ns/c", a), "a's address is a's");
        assert!(other.adopt_ip(ext, "ns/c", "10.70.0.3".parse().unwrap()));
        let before = other.clone();
        assert!(other.grant_ip(ext, "ns/d").is_err(), "the /30 is full");
        assert_eq!(other, before, "a refused grant changes nothing");
        other.release_ip("ns/b");
        assert_eq!(other.grant_ip(ext, "ns/d"), Ok(b));
        // The external CIDR changed: grants outside it are given again.
        let moved = net("10.71.0.0/30");
        assert_eq!(
            other.grant_ip(moved, "ns/a"),
            Ok("10.71.0.1".parse().unwrap())
        );
        assert!(other.ips.values().all(|a| moved.contains(*a)));
    }

    #[test]
    fn a_refused_claim_leaves_the_ledger_alone_and_release_frees_everything() {
        let s = settings();
        let mut l = Ledger::default();
        l.grant(&s, &[], "ns/b", net("10.244.0.0/16"), net("10.70.0.0/16"))
            .unwrap();
        let before = l.clone();
        let e = l
            .grant(&s, &[], "ns/big", net("10.0.0.0/16"), net("10.0.0.0/8"))
            .unwrap_err();
        assert!(
            matches!(e, GrantError::Ipam(IpamError::TooLarge { .. })),
            "{e}"
        );
        assert_eq!(l, before, "a half-made grant was kept");
        l.release("ns/b");
        assert_eq!(l, Ledger::default());
        assert_eq!(Ledger::from_data(None).unwrap(), Ledger::default());
        assert!(Ledger::from_data(Some(&BTreeMap::from([(DATA_KEY.into(), "{".into())]))).is_err());
    }
}
