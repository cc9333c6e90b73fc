//! Every map of the data plane, as BTF maps so `bpftool map dump` shows named fields.
//! User space pins each one by name under the pin directory.
use aya_ebpf::{
    btf_maps::{HashMap, LpmTrie, PerCpuArray, lpm_trie::Key},
    macros::btf_map,
};
use fabric_common::{
    Counters, ExtKey, IfaceConfig, MAX_DESTS, MAX_EXTERNALS, MAX_IFACES, MAX_PEERS, MAX_REMAPS,
    PeerMeta, RemapKey, Rewrite, drop,
};

/// ifindex -> what this device is (which peer, MSS clamp, header offset).
#[btf_map]
pub static FABRIC_IFACES: HashMap<u32, IfaceConfig, { MAX_IFACES as usize }> = HashMap::new();

/// peer id -> name and device, written by user space for inspection; the programs never read it.
#[btf_map]
pub static FABRIC_PEERS: HashMap<u32, PeerMeta, { MAX_PEERS as usize }> = HashMap::new();

/// (peer, this cluster's view of the peer's prefix) -> the peer's real prefix.
/// Applied to destinations leaving through the peer's device.
#[btf_map]
pub static FABRIC_REMAP_EG: LpmTrie<RemapKey, Rewrite, { MAX_REMAPS as usize }> = LpmTrie::new();

/// (peer, the peer's real prefix) -> this cluster's view of it.
/// Applied to sources arriving from the peer's device.
#[btf_map]
pub static FABRIC_REMAP_IN: LpmTrie<RemapKey, Rewrite, { MAX_REMAPS as usize }> = LpmTrie::new();

/// Local external CIDR address -> the local IP it stands for (destinations arriving).
#[btf_map]
pub static FABRIC_EXT_DNAT: LpmTrie<ExtKey, Rewrite, { MAX_EXTERNALS as usize }> = LpmTrie::new();

/// Local IP -> its address in the local external CIDR (sources leaving).
#[btf_map]
pub static FABRIC_EXT_SNAT: LpmTrie<ExtKey, Rewrite, { MAX_EXTERNALS as usize }> = LpmTrie::new();

/// (peer, destination prefix) -> `DEST_ALLOW` or `DEST_DENY`: where a peer's packets may go.
/// The longest match decides (the pod CIDR allowed, the gateway's own address in it denied);
/// no match refuses.
#[btf_map]
pub static FABRIC_DESTS: LpmTrie<RemapKey, u32, { MAX_DESTS as usize }> = LpmTrie::new();

/// Per-peer, per-direction counters, indexed by `counter_index(peer, dir)`.
#[btf_map]
pub static FABRIC_COUNTERS: PerCpuArray<Counters, { (MAX_PEERS * 2) as usize }> =
    PerCpuArray::new();

/// Drops by reason, indexed by `reason - drop::BASE`.
#[btf_map]
pub static FABRIC_DROPS: PerCpuArray<u64, { drop::COUNT as usize }> = PerCpuArray::new();

#[inline(always)]
pub fn remap(
    map: &LpmTrie<RemapKey, Rewrite, { MAX_REMAPS as usize }>,
    peer_be: u32,
    addr: u32,
) -> u32 {
    let key = Key::new(
        64,
        RemapKey {
            peer_id_be: peer_be,
            addr,
        },
    );
    match map.get(&key) {
        Some(rw) => rw.apply(addr),
        None => addr,
    }
}

/// The address an external mapping turns `addr` into, or `None` when no mapping covers it.
#[inline(always)]
pub fn external(
    map: &LpmTrie<ExtKey, Rewrite, { MAX_EXTERNALS as usize }>,
    addr: u32,
) -> Option<u32> {
    map.get(&Key::new(32, ExtKey { addr }))
        .map(|rw| rw.apply(addr))
}

/// The destination rule that decides for `addr` from the peer `peer_be`, if any.
#[inline(always)]
pub fn dest_rule(peer_be: u32, addr: u32) -> Option<u32> {
    let key = Key::new(
        64,
        RemapKey {
            peer_id_be: peer_be,
            addr,
        },
    );
    FABRIC_DESTS.get(&key).copied()
}
