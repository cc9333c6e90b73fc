//! Map contents as plain data, and the pure reconciliation between what the maps hold and what
//! the configuration asks for. The loader reads `MapState` from the kernel, computes
//! `diff(current, desired)` here, and writes the resulting operations back.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
};

use fabric_common::{
    DEST_ALLOW, DEST_DENY, FAST_REMAPS, FastRemap, IFACE_F_EXTERNALS, IFACE_F_LPM, IfaceConfig,
    Rewrite, prefix_mask,
};

use crate::DataplaneConfig;

/// A remap trie key: (peer id, prefix length, network address in host order).
pub type RemapEntry = (u32, u8, u32);
/// An external trie key: (prefix length, network address in host order).
pub type ExtEntry = (u8, u32);

/// Name and device of a peer, kept in `FABRIC_PEERS` so inspection needs no config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerMetaEntry {
    pub name: String,
    pub ifname: String,
}

/// Everything the programs read, as plain data.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MapState {
    pub ifaces: BTreeMap<u32, IfaceConfig>,
    pub peers: BTreeMap<u32, PeerMetaEntry>,
    pub remap_egress: BTreeMap<RemapEntry, Rewrite>,
    pub remap_ingress: BTreeMap<RemapEntry, Rewrite>,
    pub ext_dnat: BTreeMap<ExtEntry, Rewrite>,
    pub ext_snat: BTreeMap<ExtEntry, Rewrite>,
    /// Destination rules, keyed like the remap tries: `DEST_ALLOW` or `DEST_DENY`.
    pub dests: BTreeMap<RemapEntry, u32>,
}

/// What the kernel tells us about a configured device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkFacts {
    pub ifindex: u32,
    pub l3_offset: u8,
}

/// One write to the maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    SetIface(u32, IfaceConfig),
    DelIface(u32),
    SetPeer(u32, PeerMetaEntry),
    DelPeer(u32),
    SetRemapEgress(RemapEntry, Rewrite),
    DelRemapEgress(RemapEntry),
    SetRemapIngress(RemapEntry, Rewrite),
    DelRemapIngress(RemapEntry),
    SetExtDnat(ExtEntry, Rewrite),
    DelExtDnat(ExtEntry),
    SetExtSnat(ExtEntry, Rewrite),
    DelExtSnat(ExtEntry),
    SetDest(RemapEntry, u32),
    DelDest(RemapEntry),
    /// A peer id left the configuration: its counters must not leak into the next peer
    /// that gets the id.
    ResetCounters(u32),
}

/// Builds the map contents for a validated configuration. `links` maps interface names to
/// what the kernel says about them; every configured interface must be present. `own` are
/// the host's addresses (local and broadcast): those inside the local CIDRs are denied to
/// every peer but the one whose tunnel address they are.
pub fn desired(
    cfg: &DataplaneConfig,
    links: &BTreeMap<String, LinkFacts>,
    own: &BTreeSet<Ipv4Addr>,
) -> MapState {
    let mut s = MapState::default();
    let ext_flag = if cfg.externals.is_empty() {
        0
    } else {
        IFACE_F_EXTERNALS
    };
    for p in &cfg.peers {
        let link = links[&p.interface];
        let real: Vec<_> = p.remaps.iter().filter(|r| r.local != r.remote).collect();
        let mut iface = IfaceConfig {
            peer_id: p.id,
            mss: p.mss.unwrap_or(0),
            l3_offset: link.l3_offset,
            flags: ext_flag,
            ..Default::default()
        };
        if real.len() <= FAST_REMAPS {
            iface.n_fast = real.len() as u8;
            for (slot, r) in iface.fast.iter_mut().zip(&real) {
                *slot = FastRemap {
                    local: u32::from(r.local.network()).to_be(),
                    remote: u32::from(r.remote.network()).to_be(),
                    mask: prefix_mask(r.local.prefix()).to_be(),
                };
            }
        } else {
            iface.flags |= IFACE_F_LPM;
        }
        s.ifaces.insert(link.ifindex, iface);
        s.peers.insert(
            p.id,
            PeerMetaEntry {
                name: p.name.clone(),
                ifname: p.interface.clone(),
            },
        );
        for n in &cfg.local_cidrs {
            s.dests
                .insert((p.id, n.prefix(), u32::from(n.network())), DEST_ALLOW);
        }
        for a in own {
            if !p.tunnel_addresses.contains(a) && cfg.local_cidrs.iter().any(|n| n.contains(*a)) {
                s.dests.insert((p.id, 32, u32::from(*a)), DEST_DENY);
            }
        }
        for a in &p.tunnel_addresses {
            s.dests.insert((p.id, 32, u32::from(*a)), DEST_ALLOW);
        }
        for r in &p.remaps {
            if r.local == r.remote {
                continue;
            }
            let len = r.local.prefix();
            s.remap_egress.insert(
                (p.id, len, u32::from(r.local.network())),
                Rewrite::new(u32::from(r.remote.network()), len),
            );
            s.remap_ingress.insert(
                (p.id, len, u32::from(r.remote.network())),
                Rewrite::new(u32::from(r.local.network()), len),
            );
        }
    }
    for e in &cfg.externals {
        let len = e.external.prefix();
        s.ext_dnat.insert(
            (len, u32::from(e.external.network())),
            Rewrite::new(u32::from(e.internal.network()), len),
        );
        s.ext_snat.insert(
            (len, u32::from(e.internal.network())),
            Rewrite::new(u32::from(e.external.network()), len),
        );
    }
    s
}

/// The writes that turn `cur` into `want`, ordered so that traffic never sees a half state:
/// new rewrites exist before an interface starts using them, and an interface stops being
/// handled before its rewrites disappear.
pub fn diff(cur: &MapState, want: &MapState) -> Vec<Op> {
    let mut ops = Vec::new();
    // 1. Stop handling interfaces that go away (or move to another peer, re-added below).
    for (idx, c) in &cur.ifaces {
        match want.ifaces.get(idx) {
            Some(w) if w.peer_id == c.peer_id => {}
            _ => ops.push(Op::DelIface(*idx)),
        }
    }
    // 2. Add and update rewrites.
    set_changed(
        &cur.remap_egress,
        &want.remap_egress,
        &mut ops,
        Op::SetRemapEgress,
    );
    set_changed(
        &cur.remap_ingress,
        &want.remap_ingress,
        &mut ops,
        Op::SetRemapIngress,
    );
    set_changed(&cur.ext_dnat, &want.ext_dnat, &mut ops, Op::SetExtDnat);
    set_changed(&cur.ext_snat, &want.ext_snat, &mut ops, Op::SetExtSnat);
    // Denials before the allowances they carve holes in: a host address never shows
    // through a pod CIDR that is being allowed.
    for allow in [false, true] {
        for (k, v) in &want.dests {
            if (*v == DEST_ALLOW) == allow && cur.dests.get(k) != Some(v) {
                ops.push(Op::SetDest(*k, *v));
            }
        }
    }
    set_changed(&cur.peers, &want.peers, &mut ops, Op::SetPeer);
    // 3. Interfaces (new, changed, or re-pointed).
    for (idx, w) in &want.ifaces {
        if cur.ifaces.get(idx) != Some(w) {
            ops.push(Op::SetIface(*idx, *w));
        }
    }
    // 4. Remove rewrites nobody uses any more.
    del_missing(
        &cur.remap_egress,
        &want.remap_egress,
        &mut ops,
        Op::DelRemapEgress,
    );
    del_missing(
        &cur.remap_ingress,
        &want.remap_ingress,
        &mut ops,
        Op::DelRemapIngress,
    );
    del_missing(&cur.ext_dnat, &want.ext_dnat, &mut ops, Op::DelExtDnat);
    del_missing(&cur.ext_snat, &want.ext_snat, &mut ops, Op::DelExtSnat);
    // Allowances go before the denials inside them.
    for allow in [true, false] {
        for (k, v) in &cur.dests {
            if (*v == DEST_ALLOW) == allow && !want.dests.contains_key(k) {
                ops.push(Op::DelDest(*k));
            }
        }
    }
    // 5. Peers that left: forget their metadata and counters.
    let gone: BTreeSet<u32> = cur
        .peers
        .keys()
        .filter(|id| !want.peers.contains_key(id))
        .copied()
        .collect();
    for id in gone {
        ops.push(Op::DelPeer(id));
        ops.push(Op::ResetCounters(id));
    }
    ops
}

fn set_changed<K: Ord + Clone, V: PartialEq + Clone>(
    cur: &BTreeMap<K, V>,
    want: &BTreeMap<K, V>,
    ops: &mut Vec<Op>,
    mk: impl Fn(K, V) -> Op,
) {
    for (k, v) in want {
        if cur.get(k) != Some(v) {
            ops.push(mk(k.clone(), v.clone()));
        }
    }
}

fn del_missing<K: Ord + Clone, V>(
    cur: &BTreeMap<K, V>,
    want: &BTreeMap<K, V>,
    ops: &mut Vec<Op>,
    mk: impl Fn(K) -> Op,
) {
    for k in cur.keys() {
        if !want.contains_key(k) {
            ops.push(mk(k.clone()));
        }
    }
}

/// Applies operations to a `MapState` in memory: the model the kernel writes must match.
pub fn apply_ops(s: &mut MapState, ops: &[Op]) {
    for op in ops {
        match op.clone() {
            Op::SetIface(k, v) => drop(s.ifaces.insert(k, v)),
            Op::DelIface(k) => drop(s.ifaces.remove(&k)),
            Op::SetPeer(k, v) => drop(s.peers.insert(k, v)),
            Op::DelPeer(k) => drop(s.peers.remove(&k)),
            Op::SetRemapEgress(k, v) => drop(s.remap_egress.insert(k, v)),
            Op::DelRemapEgress(k) => drop(s.remap_egress.remove(&k)),
            Op::SetRemapIngress(k, v) => drop(s.remap_ingress.insert(k, v)),
            Op::DelRemapIngress(k) => drop(s.remap_ingress.remove(&k)),
            Op::SetExtDnat(k, v) => drop(s.ext_dnat.insert(k, v)),
            Op::DelExtDnat(k) => drop(s.ext_dnat.remove(&k)),
            Op::SetExtSnat(k, v) => drop(s.ext_snat.insert(k, v)),
            Op::DelExtSnat(k) => drop(s.ext_snat.remove(&k)),
            Op::SetDest(k, v) => drop(s.dests.insert(k, v)),
            Op::DelDest(k) => drop(s.dests.remove(&k)),
            Op::ResetCounters(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::{ExternalMapping, PeerConfig, Remap};

    fn links(n: u32) -> BTreeMap<String, LinkFacts> {
        (1..=n)
            .map(|i| {
                (
                    format!("fab{i}"),
                    LinkFacts {
                        ifindex: 100 + i,
                        l3_offset: 0,
                    },
                )
            })
            .collect()
    }

    fn peer(i: u32, remote_second_octet: u8) -> PeerConfig {
        PeerConfig {
            name: format!("p{i}"),
            id: i,
            interface: format!("fab{i}"),
            mss: None,
            tunnel_addresses: vec![Ipv4Addr::new(169, 254, 0, 4 * i as u8 + 1)],
            remaps: vec![Remap {
                local: format!("10.{}.0.0/16", 70 + i).parse().unwrap(),
                remote: format!("10.{remote_second_octet}.0.0/16").parse().unwrap(),
            }],
        }
    }

    #[test]
    fn same_real_cidr_for_two_peers_gives_two_keys() {
        let cfg = DataplaneConfig {
            peers: vec![peer(1, 244), peer(2, 244)],
            ..Default::default()
        };
        let s = desired(&cfg, &links(2), &BTreeSet::new());
        assert_eq!(s.remap_ingress.len(), 2);
        let rw = s.remap_ingress[&(2, 16, u32::from_be_bytes([10, 244, 0, 0]))];
        assert_eq!(
            rw.apply(u32::from_be_bytes([10, 244, 3, 4]).to_be())
                .to_ne_bytes(),
            [10, 72, 3, 4]
        );
    }

    #[test]
    fn identity_remap_needs_no_entry_and_externals_flag_ifaces() {
        let mut p = peer(1, 71);
        p.remaps[0].remote = p.remaps[0].local;
        let cfg = DataplaneConfig {
            peers: vec![p],
            externals: vec![ExternalMapping {
                external: "10.70.0.5/32".parse().unwrap(),
                internal: "192.168.1.5/32".parse().unwrap(),
            }],
            ..Default::default()
        };
        let s = desired(&cfg, &links(1), &BTreeSet::new());
        assert!(s.remap_egress.is_empty());
        assert_eq!(s.ifaces[&101].flags, IFACE_F_EXTERNALS);
        assert_eq!(s.ext_dnat.len(), 1);
    }

    #[test]
    fn removal_orders_iface_before_rewrites_and_resets_counters() {
        let one = desired(
            &DataplaneConfig {
                local_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
                peers: vec![peer(1, 244)],
                externals: vec![],
            },
            &links(1),
            &own(),
        );
        let ops = diff(&one, &MapState::default());
        let pos = |f: &dyn Fn(&Op) -> bool| ops.iter().position(f).unwrap();
        assert!(
            pos(&|o| matches!(o, Op::DelIface(_))) < pos(&|o| matches!(o, Op::DelRemapEgress(_)))
        );
        assert!(ops.contains(&Op::ResetCounters(1)));
        // and adding orders rewrites before the interface
        let ops = diff(&MapState::default(), &one);
        let pos = |f: &dyn Fn(&Op) -> bool| ops.iter().position(f).unwrap();
        assert!(
            pos(&|o| matches!(o, Op::SetRemapEgress(..))) < pos(&|o| matches!(o, Op::SetIface(..)))
        );
        // and the destination rules: denials before the allowances around them, all of
        // them before the interface; on removal the other way round.
        let deny = pos(&|o| matches!(o, Op::SetDest(_, DEST_DENY)));
        let allow = pos(&|o| matches!(o, Op::SetDest(_, DEST_ALLOW)));
        assert!(deny < allow && allow < pos(&|o| matches!(o, Op::SetIface(..))));
        let ops = diff(&one, &MapState::default());
        let pos = |f: &dyn Fn(&Op) -> bool| ops.iter().position(f).unwrap();
        assert!(pos(&|o| matches!(o, Op::DelIface(_))) < pos(&|o| matches!(o, Op::DelDest(_))));
        let last = |v: u32| {
            ops.iter()
                .rposition(|o| matches!(o, Op::DelDest(k) if one.dests[k] == v))
                .unwrap()
        };
        assert!(last(DEST_ALLOW) < last(DEST_DENY));
    }

    /// The host's addresses in the tests: a gateway pod IP and its subnet's broadcast address
    /// inside the pod CIDR, a node address outside it, and peer 1's tunnel address.
    fn own() -> BTreeSet<Ipv4Addr> {
        ["10.244.1.1", "10.244.1.255", "192.168.0.5", "169.254.0.5"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect()
    }

    /// Longest-prefix match over a peer's rules, as the kernel's trie does it.
    fn verdict(s: &MapState, peer: u32, addr: &str) -> bool {
        let a = u32::from(addr.parse::<Ipv4Addr>().unwrap());
        let rule = s
            .dests
            .iter()
            .filter(|((p, len, net), _)| *p == peer && a & prefix_mask(*len) == *net)
            .max_by_key(|((_, len, _), _)| *len)
            .map(|(_, v)| *v);
        fabric_common::dest_allowed(rule)
    }

    #[test]
    fn a_peer_reaches_pods_and_its_tunnel_address_only() {
        let cfg = DataplaneConfig {
            local_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
            peers: vec![peer(1, 244), peer(2, 244)],
            ..Default::default()
        };
        let s = desired(&cfg, &links(2), &own());
        for (peer, addr, ok) in [
            (1, "10.244.1.10", true),   // a pod
            (1, "10.244.7.3", true),    // a pod on another node
            (1, "10.244.1.1", false),   // the gateway's own pod IP
            (1, "10.244.1.255", false), // a broadcast address
            (1, "169.254.0.5", true),   // its tunnel address
            (2, "169.254.0.5", false),  // someone else's
            (2, "169.254.0.9", true),
            (1, "169.254.169.254", false), // metadata service
            (1, "192.168.0.5", false),     // a node
            (1, "10.96.0.1", false),       // the API server's service
            (1, "10.245.0.1", false),      // outside the pod CIDR
        ] {
            assert_eq!(verdict(&s, peer, addr), ok, "peer {peer} -> {addr}");
        }
        // Nothing allowed at all without local CIDRs, but the tunnel address.
        let bare = desired(
            &DataplaneConfig {
                peers: vec![peer(1, 244)],
                ..Default::default()
            },
            &links(1),
            &own(),
        );
        assert!(!verdict(&bare, 1, "10.244.1.10"));
        assert!(verdict(&bare, 1, "169.254.0.5"));
    }

    fn cfg_strategy() -> impl Strategy<Value = DataplaneConfig> {
        proptest::collection::btree_set(1u32..8, 0..6).prop_flat_map(|ids| {
            let ids: Vec<u32> = ids.into_iter().collect();
            let n = ids.len();
            (
                Just(ids),
                proptest::collection::vec(200u8..250, n),
                any::<bool>(),
            )
                .prop_map(|(ids, octets, ext)| DataplaneConfig {
                    local_cidrs: if ext {
                        vec!["10.244.0.0/16".parse().unwrap()]
                    } else {
                        vec![]
                    },
                    peers: ids.iter().zip(octets).map(|(i, o)| peer(*i, o)).collect(),
                    externals: if ext {
                        vec![ExternalMapping {
                            external: "10.70.0.0/24".parse().unwrap(),
                            internal: "172.16.5.0/24".parse().unwrap(),
                        }]
                    } else {
                        vec![]
                    },
                })
        })
    }

    proptest! {
        /// Whatever the maps hold and whatever is asked, the ops get exactly there, and a
        /// second reconcile has nothing left to do.
        #[test]
        fn diff_converges(a in cfg_strategy(), b in cfg_strategy()) {
            let l = links(8);
            let (sa, sb) = (desired(&a, &l, &own()), desired(&b, &l, &own()));
            let mut s = sa.clone();
            apply_ops(&mut s, &diff(&sa, &sb));
            prop_assert_eq!(&s, &sb);
            prop_assert!(diff(&s, &sb).is_empty());
        }
    }
}
