//! Map contents as plain data, and the pure reconciliation between what the maps hold and what
//! the configuration asks for. The loader reads `MapState` from the kernel, computes
//! `diff(current, desired)` here, and writes the resulting operations back.
use std::collections::{BTreeMap, BTreeSet};

use fabric_common::{
    FAST_REMAPS, FastRemap, IFACE_F_EXTERNALS, IFACE_F_LPM, IfaceConfig, Rewrite, prefix_mask,
};

use crate::config::DataplaneConfig;

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
    /// A peer id left the configuration: its counters must not leak into the next peer
    /// that gets the id.
    ResetCounters(u32),
}

/// Builds the map contents for a validated configuration. `links` maps interface names to
/// what the kernel says about them; every configured interface must be present.
pub fn desired(cfg: &DataplaneConfig, links: &BTreeMap<String, LinkFacts>) -> MapState {
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
            Op::ResetCounters(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::config::{ExternalMapping, PeerConfig, Remap};

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
            externals: vec![],
        };
        let s = desired(&cfg, &links(2));
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
        };
        let s = desired(&cfg, &links(1));
        assert!(s.remap_egress.is_empty());
        assert_eq!(s.ifaces[&101].flags, IFACE_F_EXTERNALS);
        assert_eq!(s.ext_dnat.len(), 1);
    }

    #[test]
    fn removal_orders_iface_before_rewrites_and_resets_counters() {
        let one = desired(
            &DataplaneConfig {
                peers: vec![peer(1, 244)],
                externals: vec![],
            },
            &links(1),
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
            let (sa, sb) = (desired(&a, &l), desired(&b, &l));
            let mut s = sa.clone();
            apply_ops(&mut s, &diff(&sa, &sb));
            prop_assert_eq!(&s, &sb);
            prop_assert!(diff(&s, &sb).is_empty());
        }
    }
}
