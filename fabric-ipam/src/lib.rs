//! IPAM for the fabric, free of I/O: decides under which CIDR this cluster sees each peer's
//! networks so that nothing clashes. The controller persists every grant in the API (`Network`
//! objects) and rebuilds an [`Ipam`] from them on start, so a restart never re-allocates.
//!
//! Rules:
//! - A peer's real CIDR is kept when it clashes with nothing (no rewrite needed then).
//! - Otherwise the first free block of the same length in the pools is granted (host bits
//!   are kept by the data plane, so the length must match).
//! - Reserved ranges (own pod, service and external CIDRs, ...), the addresses the cluster is
//!   seen using (its nodes', its API server's: [`Ipam::set_in_use`]) and every other grant are
//!   never overlapped: a claim covering a node is remapped, so no node routes its own subnet
//!   into a tunnel.
//! - A claim larger than the configured limit ([`Ipam::with_largest_claim`]) is refused: a
//!   peer announcing a /8 would otherwise have every node route it to the peer.
use std::collections::BTreeMap;

use ipnetwork::Ipv4Network;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IpamError {
    #[error("no free /{len} left in the pools {pools}; add a pool or release peers")]
    Exhausted { len: u8, pools: String },
    #[error("{cidr} has host bits set; did you mean {network}/{len}?")]
    HostBits {
        cidr: Ipv4Network,
        network: std::net::Ipv4Addr,
        len: u8,
    },
    #[error(
        "{cidr} is larger than a peer may claim here (a /{len} or longer prefix); \
         ask the peer for its real pod or external CIDR"
    )]
    TooLarge { cidr: Ipv4Network, len: u8 },
    #[error("restoring grant {cidr} for {owner}: it overlaps {other}")]
    Conflict {
        owner: String,
        cidr: Ipv4Network,
        other: String,
    },
}

#[derive(Debug, Clone, Default)]
pub struct Ipam {
    pools: Vec<Ipv4Network>,
    reserved: Vec<Ipv4Network>,
    /// Addresses in use in the cluster (nodes, API server), found at run time.
    in_use: Vec<Ipv4Network>,
    /// Shortest prefix a claim may have (0: any).
    largest: u8,
    grants: BTreeMap<String, Ipv4Network>,
}

fn range(n: Ipv4Network) -> (u64, u64) {
    let start = u64::from(u32::from(n.network()));
    (start, start + (1u64 << (32 - n.prefix())))
}

fn check(n: Ipv4Network) -> Result<(), IpamError> {
    if n.ip() != n.network() {
        return Err(IpamError::HostBits {
            cidr: n,
            network: n.network(),
            len: n.prefix(),
        });
    }
    Ok(())
}

impl Ipam {
    /// `pools`: where remapped CIDRs are carved from. `reserved`: never handed out.
    pub fn new(pools: Vec<Ipv4Network>, reserved: Vec<Ipv4Network>) -> Result<Self, IpamError> {
        for n in pools.iter().chain(&reserved) {
            check(*n)?;
        }
        Ok(Self {
            pools,
            reserved,
            in_use: Vec::new(),
            largest: 0,
            grants: BTreeMap::new(),
        })
    }

    /// Refuses claims with a prefix shorter than `len` (a /`len` is the largest granted).
    pub fn with_largest_claim(mut self, len: u8) -> Self {
        self.largest = len.min(32);
        self
    }

    /// The addresses the cluster uses now (its nodes', its API server's): never granted, and
    /// a grant that has come to cover one is moved at its next [`Ipam::allocate`].
    pub fn set_in_use(&mut self, addrs: impl IntoIterator<Item = std::net::Ipv4Addr>) {
        self.in_use = addrs.into_iter().map(Ipv4Network::from).collect();
        self.in_use.sort_unstable();
        self.in_use.dedup();
    }

    pub fn grants(&self) -> &BTreeMap<String, Ipv4Network> {
        &self.grants
    }

    /// What `cidr` would collide with, other than `owner`'s own grant.
    fn clash(&self, owner: &str, cidr: Ipv4Network) -> Option<String> {
        if let Some(r) = self.reserved.iter().find(|r| r.overlaps(cidr)) {
            return Some(format!("reserved {r}"));
        }
        if let Some(a) = self.in_use.iter().find(|a| a.overlaps(cidr)) {
            return Some(format!("{} in use in this cluster", a.ip()));
        }
        self.grants
            .iter()
            .find(|(o, g)| o.as_str() != owner && g.overlaps(cidr))
            .map(|(o, g)| format!("{g} of {o}"))
    }

    /// Re-adds a grant read back from the API. A grant that now clashes (say, the reserved
    /// ranges changed) is refused with the reason, so the caller can re-allocate it.
    pub fn restore(&mut self, owner: &str, cidr: Ipv4Network) -> Result<(), IpamError> {
        check(cidr)?;
        if let Some(other) = self.clash(owner, cidr) {
            return Err(IpamError::Conflict {
                owner: owner.to_owned(),
                cidr,
                other,
            });
        }
        self.grants.insert(owner.to_owned(), cidr);
        Ok(())
    }

    /// Grants `owner` a CIDR standing for `wanted`. Idempotent: an owner keeps its grant as
    /// long as it asks for the same length.
    pub fn allocate(&mut self, owner: &str, wanted: Ipv4Network) -> Result<Ipv4Network, IpamError> {
        check(wanted)?;
        if wanted.prefix() < self.largest {
            return Err(IpamError::TooLarge {
                cidr: wanted,
                len: self.largest,
            });
        }
        if let Some(g) = self.grants.get(owner)
            && g.prefix() == wanted.prefix()
            && self.clash(owner, *g).is_none()
        {
            return Ok(*g);
        }
        let grant = if self.clash(owner, wanted).is_none() {
            wanted
        } else {
            self.first_free(owner, wanted.prefix())?
        };
        self.grants.insert(owner.to_owned(), grant);
        Ok(grant)
    }

    /// Grants `owner` the first free block of length `len` in the pools, whatever it asked
    /// for (addresses of the local external CIDR for `IP` objects). Idempotent like
    /// [`Ipam::allocate`].
    pub fn allocate_free(&mut self, owner: &str, len: u8) -> Result<Ipv4Network, IpamError> {
        if let Some(g) = self.grants.get(owner)
            && g.prefix() == len
        {
            return Ok(*g);
        }
        let grant = self.first_free(owner, len)?;
        self.grants.insert(owner.to_owned(), grant);
        Ok(grant)
    }

    pub fn release(&mut self, owner: &str) -> Option<Ipv4Network> {
        self.grants.remove(owner)
    }

    /// First aligned block of length `len` in the pools that overlaps nothing. Walks the used
    /// ranges in order and jumps past each one, so the cost is in the number of used ranges,
    /// not in the size of the pools.
    fn first_free(&self, owner: &str, len: u8) -> Result<Ipv4Network, IpamError> {
        let size = 1u64 << (32 - len);
        let mut used: Vec<(u64, u64)> = self
            .reserved
            .iter()
            .chain(&self.in_use)
            .copied()
            .chain(
                self.grants
                    .iter()
                    .filter(|(o, _)| o.as_str() != owner)
                    .map(|(_, g)| *g),
            )
            .map(range)
            .collect();
        used.sort_unstable();
        for pool in &self.pools {
            if pool.prefix() > len {
                continue;
            }
            let (start, end) = range(*pool);
            let mut cand = start;
            while cand + size <= end {
                match used.iter().find(|(s, e)| *s < cand + size && cand < *e) {
                    None => {
                        let net =
                            Ipv4Network::new((cand as u32).into(), len).expect("length checked");
                        return Ok(net);
                    }
                    // Jump past the blocking range, aligned up to the block size.
                    Some((_, e)) => cand = e.div_ceil(size) * size,
                }
            }
        }
        Err(IpamError::Exhausted {
            len,
            pools: self
                .pools
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn n(s: &str) -> Ipv4Network {
        s.parse().unwrap()
    }

    fn ipam() -> Ipam {
        Ipam::new(
            vec![n("10.64.0.0/10")],
            vec![n("10.244.0.0/16"), n("10.96.0.0/12"), n("10.70.0.0/16")],
        )
        .unwrap()
    }

    #[test]
    fn keeps_real_cidr_when_free_and_remaps_when_not() {
        let mut i = ipam();
        assert_eq!(
            i.allocate("b/pod", n("10.50.0.0/16")).unwrap(),
            n("10.50.0.0/16")
        );
        // same as our own pod CIDR: remapped into the pool
        let g = i.allocate("c/pod", n("10.244.0.0/16")).unwrap();
        assert_eq!(g, n("10.64.0.0/16"));
        // a third cluster with the same real CIDR gets the next block
        assert_eq!(
            i.allocate("d/pod", n("10.244.0.0/16")).unwrap(),
            n("10.65.0.0/16")
        );
        // and one clashing with another peer's kept real CIDR is remapped too
        assert_eq!(
            i.allocate("e/pod", n("10.50.0.0/16")).unwrap(),
            n("10.66.0.0/16")
        );
        // the reserved service CIDR sits inside the pool's reach: never granted
        for g in i.grants().values() {
            assert!(!g.overlaps(n("10.96.0.0/12")));
        }
    }

    #[test]
    fn idempotent_release_and_exhaustion() {
        let mut i = Ipam::new(vec![n("192.168.0.0/23")], vec![n("10.244.0.0/16")]).unwrap();
        let a = i.allocate("a", n("10.244.0.0/24")).unwrap();
        assert_eq!(i.allocate("a", n("10.244.0.0/24")).unwrap(), a);
        let b = i.allocate("b", n("10.244.0.0/24")).unwrap();
        assert_ne!(a, b);
        let e = i.allocate("c", n("10.244.0.0/24")).unwrap_err();
        assert!(e.to_string().contains("no free /24"), "{e}");
        assert_eq!(i.release("a"), Some(a));
        assert_eq!(i.allocate("c", n("10.244.0.0/24")).unwrap(), a);
    }

    #[test]
    fn free_addresses_from_a_pool() {
        let mut i = Ipam::new(vec![n("10.70.0.0/30")], vec![n("10.70.0.0/32")]).unwrap();
        assert_eq!(i.allocate_free("ip/a", 32).unwrap(), n("10.70.0.1/32"));
        assert_eq!(i.allocate_free("ip/b", 32).unwrap(), n("10.70.0.2/32"));
        assert_eq!(i.allocate_free("ip/a", 32).unwrap(), n("10.70.0.1/32"));
        assert_eq!(i.allocate_free("ip/c", 32).unwrap(), n("10.70.0.3/32"));
        assert!(i.allocate_free("ip/d", 32).is_err());
    }

    #[test]
    fn restore_refuses_clashes() {
        let mut i = ipam();
        i.restore("b", n("10.64.0.0/16")).unwrap();
        let e = i.restore("c", n("10.64.0.0/17")).unwrap_err();
        assert!(matches!(e, IpamError::Conflict { .. }), "{e}");
        let e = i.restore("d", n("10.244.1.0/24")).unwrap_err();
        assert!(e.to_string().contains("reserved 10.244.0.0/16"), "{e}");
        assert!(i.allocate("x", n("10.1.2.3/16")).is_err());
    }

    #[test]
    fn claims_are_bounded_and_never_cover_the_cluster() {
        let mut i = ipam().with_largest_claim(12);
        // A /8 (or anything shorter than the limit) is refused, whatever it clashes with.
        let e = i.allocate("b/pod", n("11.0.0.0/8")).unwrap_err();
        assert!(matches!(e, IpamError::TooLarge { len: 12, .. }), "{e}");
        assert!(e.to_string().contains("/12"), "{e}");
        assert!(i.grants().is_empty());
        assert_eq!(
            i.allocate("b/pod", n("172.16.0.0/12")).unwrap(),
            n("172.16.0.0/12")
        );
        // The node subnet, as the Nodes show it: a claim covering a node is remapped.
        i.set_in_use([
            "192.168.50.10".parse().unwrap(),
            "192.168.50.11".parse().unwrap(),
        ]);
        let g = i.allocate("c/pod", n("192.168.50.0/24")).unwrap();
        assert!(!g.contains("192.168.50.10".parse().unwrap()), "{g}");
        assert_eq!(g, n("10.64.0.0/24"));
        // A claim next to the nodes but not covering them is kept.
        assert_eq!(
            i.allocate("d/pod", n("192.168.51.0/24")).unwrap(),
            n("192.168.51.0/24")
        );
        // A node that appears inside a grant moves the grant at its next allocation.
        i.set_in_use(["192.168.51.7".parse().unwrap()]);
        let moved = i.allocate("d/pod", n("192.168.51.0/24")).unwrap();
        assert_ne!(moved, n("192.168.51.0/24"));
        assert!(!moved.contains("192.168.51.7".parse().unwrap()));
        // Free pool blocks skip addresses in use too.
        let mut j = Ipam::new(vec![n("10.64.0.0/22")], vec![n("10.244.0.0/16")]).unwrap();
        j.set_in_use(["10.64.0.9".parse().unwrap()]);
        assert_eq!(
            j.allocate("x", n("10.244.0.0/24")).unwrap(),
            n("10.64.1.0/24")
        );
    }

    #[derive(Debug, Clone)]
    enum Step {
        Alloc(u8, usize),
        Release(u8),
        Restart,
    }

    const WANTED: [&str; 6] = [
        "10.244.0.0/16",
        "10.50.0.0/16",
        "10.64.0.0/16",
        "10.70.0.0/24",
        "10.244.0.0/20",
        "172.16.0.0/12",
    ];

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            6 => (0u8..12, 0usize..WANTED.len()).prop_map(|(o, w)| Step::Alloc(o, w)),
            2 => (0u8..12).prop_map(Step::Release),
            1 => Just(Step::Restart),
        ]
    }

    proptest! {
        /// Across any sequence of peerings, unpeerings and restarts: grants never overlap each
        /// other or a reserved range, keep the asked length, keep the real CIDR when it was
        /// free, and survive restarts unchanged.
        #[test]
        fn never_overlaps(steps in proptest::collection::vec(step(), 1..60)) {
            let mut i = ipam();
            for s in steps {
                match s {
                    Step::Alloc(o, w) => {
                        let owner = format!("peer{o}");
                        let wanted = n(WANTED[w]);
                        let free = i.clash(&owner, wanted).is_none();
                        let had = i.grants().get(&owner).copied();
                        match i.allocate(&owner, wanted) {
                            Ok(g) => {
                                prop_assert_eq!(g.prefix(), wanted.prefix());
                                match had {
                                    Some(h) if h.prefix() == wanted.prefix() => prop_assert_eq!(g, h),
                                    _ if free => prop_assert_eq!(g, wanted),
                                    _ => {}
                                }
                            }
                            Err(e) => prop_assert!(matches!(e, IpamError::Exhausted { .. }), "{}", e),
                        }
                    }
                    Step::Release(o) => {
                        i.release(&format!("peer{o}"));
                    }
                    Step::Restart => {
                        let saved = i.grants().clone();
                        i = ipam();
                        for (o, g) in &saved {
                            i.restore(o, *g).unwrap();
                        }
                        prop_assert_eq!(i.grants(), &saved);
                    }
                }
                let g: Vec<_> = i.grants().values().copied().collect();
                for (x, a) in g.iter().enumerate() {
                    for b in &g[x + 1..] {
                        prop_assert!(!a.overlaps(*b), "{} overlaps {}", a, b);
                    }
                    for r in &i.reserved {
                        prop_assert!(!a.overlaps(*r), "{} overlaps reserved {}", a, r);
                    }
                }
            }
        }
    }
}
