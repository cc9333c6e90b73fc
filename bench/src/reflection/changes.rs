//! The endpoint changes the reflection bench makes at home, and how a state seen on the
//! provider tells which of them arrived: pure, so that the marker matching is unit-tested.
//!
//! Each slice's changes rotate through adding an endpoint (a fresh address, ready), flipping
//! the readiness of the newest and removing the oldest: every state of a slice is one it never
//! had before, so the endpoint set the provider shows names the change it reflects, and the
//! changes before it on that slice (superseded, or coalesced by a reflector) with it.
use std::{collections::VecDeque, net::Ipv4Addr};

/// Addresses a slice may use at most: its own block of the consumer's pod CIDR (smaller when
/// the CIDR holds too few for that many slices: every address stays in it, as an endpoint
/// controller's would, and none is refused on the provider).
const BLOCK: u32 = 1024;

/// One endpoint of a home slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Endpoint {
    pub address: Ipv4Addr,
    pub ready: bool,
}

/// What a change did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Add,
    Flip,
    Remove,
}

/// One change: on which slice, what it did, and the slice's endpoints after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub slice: usize,
    pub kind: Kind,
    pub endpoints: Vec<Endpoint>,
}

/// A state's marker: its endpoints, sorted (as the provider's slice may order them its way).
pub type Marker = Vec<Endpoint>;

pub fn marker(endpoints: &[Endpoint]) -> Marker {
    let mut m = endpoints.to_vec();
    m.sort();
    m
}

/// The endpoints each of `slices` slices starts with (`initial` each), and `changes` changes
/// made round-robin over them, in the order they are written. `pod_cidr` is the consumer's
/// (an IPv4 network: its base address and prefix length); slice `i` takes addresses from
/// `i * block` on, the block 1024 addresses or what the network has room for.
pub fn script(
    pod_cidr: Ipv4Addr,
    prefix: u8,
    slices: usize,
    initial: usize,
    changes: usize,
) -> (Vec<Vec<Endpoint>>, Vec<Change>) {
    let base = u32::from(pod_cidr);
    let room = (1u64 << (32 - u32::from(prefix.min(32)))) / slices.max(1) as u64;
    let block = room.min(u64::from(BLOCK)) as u32;
    assert!(
        block as usize > initial + 1,
        "{pod_cidr}/{prefix} holds too few addresses for {slices} slices of {initial}"
    );
    // Past the network's first address, as an endpoint controller would never write it.
    let address = |slice: usize, n: u32| Ipv4Addr::from(base + slice as u32 * block + 1 + n);
    let mut state: Vec<(VecDeque<Endpoint>, u32)> = (0..slices)
        .map(|s| {
            let eps = (0..initial as u32)
                .map(|n| Endpoint {
                    address: address(s, n),
                    ready: true,
                })
                .collect();
            (eps, initial as u32)
        })
        .collect();
    let start = state
        .iter()
        .map(|(e, _)| e.iter().copied().collect())
        .collect();
    let mut out = Vec::with_capacity(changes);
    for c in 0..changes {
        let slice = c % slices;
        let (eps, next) = &mut state[slice];
        let kind = match (c / slices) % 3 {
            0 => Kind::Add,
            1 => Kind::Flip,
            // Never down to none: an empty slice says less than a removal.
            _ if eps.len() <= 1 => Kind::Add,
            _ => Kind::Remove,
        };
        match kind {
            Kind::Add => {
                assert!(
                    *next + 1 < block,
                    "too many changes for a slice's addresses"
                );
                eps.push_back(Endpoint {
                    address: address(slice, *next),
                    ready: true,
                });
                *next += 1;
            }
            Kind::Flip => {
                if let Some(e) = eps.back_mut() {
                    e.ready = !e.ready;
                }
            }
            Kind::Remove => {
                eps.pop_front();
            }
        }
        out.push(Change {
            slice,
            kind,
            endpoints: eps.iter().copied().collect(),
        });
    }
    (start, out)
}

/// `endpoints` as the provider shows them: each address moved from the consumer's pod CIDR
/// `from` to where the provider sees it, `to` (both of prefix length `prefix`).
pub fn seen(endpoints: &[Endpoint], from: Ipv4Addr, to: Ipv4Addr, prefix: u8) -> Vec<Endpoint> {
    let host = u32::MAX.checked_shr(u32::from(prefix)).unwrap_or(0);
    let (from, to) = (u32::from(from), u32::from(to));
    endpoints
        .iter()
        .map(|e| {
            let a = u32::from(e.address);
            debug_assert_eq!(a & !host, from & !host);
            Endpoint {
                address: Ipv4Addr::from((to & !host) | (a & host)),
                ready: e.ready,
            }
        })
        .collect()
}

/// Which changes a slice's states, seen one after the other, show arrived.
#[derive(Debug)]
pub struct Tracker {
    /// Per slice, its markers: the start, then one per change of that slice, with the change's
    /// index in the script.
    states: Vec<Vec<(Marker, Option<usize>)>>,
    /// Per slice, how many of its states have been seen (the first, its start, is implied).
    seen: Vec<usize>,
}

impl Tracker {
    /// For the script `(start, changes)`, each state passed through `view` (e.g. [`seen`]).
    pub fn new(
        start: &[Vec<Endpoint>],
        changes: &[Change],
        view: impl Fn(&[Endpoint]) -> Vec<Endpoint>,
    ) -> Self {
        let mut states: Vec<Vec<(Marker, Option<usize>)>> = start
            .iter()
            .map(|s| vec![(marker(&view(s)), None)])
            .collect();
        for (i, c) in changes.iter().enumerate() {
            states[c.slice].push((marker(&view(&c.endpoints)), Some(i)));
        }
        Self {
            seen: vec![1; states.len()],
            states,
        }
    }

    /// Whether slice `slice` was ever seen in its start state, or a later one.
    pub fn started(&self, slice: usize, shown: &[Endpoint]) -> bool {
        let m = marker(shown);
        self.states[slice].iter().any(|(s, _)| *s == m)
    }

    /// Slice `slice` shown with `shown`: the changes (script indexes) that this shows arrived
    /// and were not seen before. A state that is none of the slice's, or an older one than
    /// already seen, shows nothing.
    pub fn observe(&mut self, slice: usize, shown: &[Endpoint]) -> Vec<usize> {
        let m = marker(shown);
        let states = &self.states[slice];
        let Some(at) = states
            .iter()
            .skip(self.seen[slice])
            .position(|(s, _)| *s == m)
        else {
            return Vec::new();
        };
        let upto = self.seen[slice] + at + 1;
        let arrived = states[self.seen[slice]..upto]
            .iter()
            .filter_map(|(_, i)| *i)
            .collect();
        self.seen[slice] = upto;
        arrived
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    const CIDR: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 0);

    #[test]
    fn many_slices_keep_their_addresses_in_the_network() {
        let (start, _) = script(CIDR, 16, 4500, 2, 0);
        let net = u32::from(CIDR);
        let all: HashSet<Ipv4Addr> = start.iter().flatten().map(|e| e.address).collect();
        assert_eq!(all.len(), 4500 * 2, "every address its own");
        assert!(
            all.iter()
                .all(|a| u32::from(*a) > net && u32::from(*a) < net + (1 << 16) - 1),
            "every address inside 10.244.0.0/16, past its first"
        );
    }

    #[test]
    fn every_state_of_a_slice_is_new_and_the_changes_rotate() {
        let (start, changes) = script(CIDR, 16, 3, 2, 300);
        assert_eq!(start.len(), 3);
        assert_eq!(changes.len(), 300);
        for (s, first) in start.iter().enumerate() {
            let mut states = HashSet::from([marker(first)]);
            let mine: Vec<&Change> = changes.iter().filter(|c| c.slice == s).collect();
            assert_eq!(mine.len(), 100);
            for c in &mine {
                assert!(!c.endpoints.is_empty());
                assert!(states.insert(marker(&c.endpoints)), "{c:?} repeats a state");
            }
            let kinds: Vec<Kind> = mine.iter().take(3).map(|c| c.kind).collect();
            assert_eq!(kinds, [Kind::Add, Kind::Flip, Kind::Remove]);
        }
        // Slices keep to their own addresses.
        let addresses = |s: usize| -> HashSet<Ipv4Addr> {
            changes
                .iter()
                .filter(|c| c.slice == s)
                .flat_map(|c| c.endpoints.iter().map(|e| e.address))
                .collect()
        };
        assert!(addresses(0).is_disjoint(&addresses(1)));
        assert_eq!(start[1][0].address, Ipv4Addr::new(10, 244, 4, 1));
    }

    #[test]
    fn addresses_are_seen_in_the_provider_s_view() {
        let e = |a: [u8; 4], ready| Endpoint {
            address: Ipv4Addr::from(a),
            ready,
        };
        let shown = seen(
            &[e([10, 244, 4, 1], true), e([10, 244, 255, 7], false)],
            CIDR,
            Ipv4Addr::new(10, 245, 0, 0),
            16,
        );
        assert_eq!(
            shown,
            [e([10, 245, 4, 1], true), e([10, 245, 255, 7], false)]
        );
    }

    #[test]
    fn a_state_shown_marks_its_change_and_those_it_superseded() {
        let (start, changes) = script(CIDR, 16, 2, 1, 8);
        let mut t = Tracker::new(&start, &changes, |e| e.to_vec());
        // Slice 0's changes are 0, 2, 4, 6.
        assert!(t.started(0, &start[0]));
        assert_eq!(t.observe(0, &start[0]), Vec::<usize>::new());
        assert_eq!(t.observe(0, &changes[0].endpoints), [0]);
        // The provider's order is not the home's.
        let mut reversed = changes[4].endpoints.clone();
        reversed.reverse();
        assert_eq!(t.observe(0, &reversed), [2, 4]);
        // An older state again, or one never written, shows nothing.
        assert_eq!(t.observe(0, &changes[2].endpoints), Vec::<usize>::new());
        assert_eq!(t.observe(0, &changes[1].endpoints), Vec::<usize>::new());
        assert_eq!(t.observe(1, &changes[3].endpoints), [1, 3]);
        assert_eq!(t.observe(0, &changes[6].endpoints), [6]);
    }
}
