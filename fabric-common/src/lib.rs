//! Types shared by the fabric eBPF programs (kernel side) and the loader (user space).
//!
//! Everything here is `#[repr(C)]` with explicit padding and plain integer fields, because the
//! same bytes are written by user space into BPF maps and read by the verifier-checked programs.
//! Addresses are kept in network byte order (as they sit in the packet) so that the per-packet
//! path never swaps bytes: masking and OR-ing work the same on either byte order.
#![no_std]

pub mod csum;
pub mod tcp;

/// Directory under the BPF filesystem where the maps and links live by default.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/fabric";

/// Highest peer id + 1. Peer ids index the counter array, so they stay small and dense.
pub const MAX_PEERS: u32 = 4096;
/// Interfaces with a fabric program attached (one tunnel device per peer, plus spares).
pub const MAX_IFACES: u32 = 4096;
/// Prefix remaps over all peers (each peer usually has two: pod CIDR and external CIDR).
pub const MAX_REMAPS: u32 = 16384;
/// Local external-IP mappings (an address of the local external CIDR standing for a local IP).
pub const MAX_EXTERNALS: u32 = 65536;
/// Destination rules over all peers (each peer usually has a few: the local pod CIDR, its
/// tunnel address, the gateway's own addresses inside the pod CIDR).
pub const MAX_DESTS: u32 = 16384;

/// Map names. They are also the pin file names under the pin directory.
pub mod maps {
    pub const IFACES: &str = "FABRIC_IFACES";
    pub const REMAP_EGRESS: &str = "FABRIC_REMAP_EG";
    pub const REMAP_INGRESS: &str = "FABRIC_REMAP_IN";
    pub const EXT_DNAT: &str = "FABRIC_EXT_DNAT";
    pub const EXT_SNAT: &str = "FABRIC_EXT_SNAT";
    pub const COUNTERS: &str = "FABRIC_COUNTERS";
    pub const DROPS: &str = "FABRIC_DROPS";
    pub const PEERS: &str = "FABRIC_PEERS";
    pub const DESTS: &str = "FABRIC_DESTS";
    pub const ALL: [&str; 9] = [
        IFACES,
        PEERS,
        REMAP_EGRESS,
        REMAP_INGRESS,
        EXT_DNAT,
        EXT_SNAT,
        COUNTERS,
        DROPS,
        DESTS,
    ];
}

/// Program names (the function names in the object).
pub mod progs {
    pub const EGRESS: &str = "fabric_egress";
    pub const INGRESS: &str = "fabric_ingress";
    /// Empty program, for measuring the test harness in benchmarks.
    pub const NOOP: &str = "fabric_noop";
}

/// `IfaceConfig::flags`: the local external-IP maps are non-empty, so look them up.
pub const IFACE_F_EXTERNALS: u8 = 1;
/// `IfaceConfig::flags`: the peer has more remaps than fit in `fast`: use the LPM tries.
pub const IFACE_F_LPM: u8 = 2;
/// Remaps kept inline in the interface entry, so the common case needs no trie lookup.
pub const FAST_REMAPS: usize = 4;

/// One remap in both directions: egress `(dst & mask) == local` -> `remote`, ingress
/// `(src & mask) == remote` -> `local`. All fields in network byte order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FastRemap {
    pub local: u32,
    pub remote: u32,
    pub mask: u32,
}
const _: () = assert!(core::mem::size_of::<FastRemap>() == 12);

impl FastRemap {
    #[inline(always)]
    pub const fn egress(&self, addr: u32) -> Option<u32> {
        if addr & self.mask == self.local {
            Some((addr & !self.mask) | self.remote)
        } else {
            None
        }
    }

    #[inline(always)]
    pub const fn ingress(&self, addr: u32) -> Option<u32> {
        if addr & self.mask == self.remote {
            Some((addr & !self.mask) | self.local)
        } else {
            None
        }
    }
}

/// Per-interface configuration, keyed by ifindex in [`maps::IFACES`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct IfaceConfig {
    /// The peer behind this device (index into the counters, part of the remap keys).
    pub peer_id: u32,
    /// Clamp the MSS option of TCP SYNs to this value; 0 disables clamping.
    pub mss: u16,
    /// Offset of the IPv4 header in the skb: 14 on Ethernet devices, 0 on L3 devices (TUN).
    pub l3_offset: u8,
    /// `IFACE_F_*` bits.
    pub flags: u8,
    /// Valid entries in `fast` (the peer's remaps, when they all fit).
    pub n_fast: u8,
    pub _pad: [u8; 3],
    pub fast: [FastRemap; FAST_REMAPS],
}
const _: () = assert!(core::mem::size_of::<IfaceConfig>() == 60);

/// Name and device of a peer, for inspection only (the programs never read it), keyed by peer
/// id in [`maps::PEERS`]. NUL-padded strings, so `bpftool map dump` shows them as text.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PeerMeta {
    pub name: [u8; 64],
    pub ifname: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<PeerMeta>() == 80);

impl Default for PeerMeta {
    fn default() -> Self {
        Self {
            name: [0; 64],
            ifname: [0; 16],
        }
    }
}

/// Data part of the LPM key of the per-peer remap tries: the peer id is always matched in
/// full (the stored prefix length is 32 + the address prefix length), so one trie serves every
/// peer and two peers may share the same real CIDR.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RemapKey {
    /// Big-endian, so the LPM bit order puts it first as a whole.
    pub peer_id_be: u32,
    /// IPv4 address, network byte order.
    pub addr: u32,
}
const _: () = assert!(core::mem::size_of::<RemapKey>() == 8);

/// Value of a destination rule in [`maps::DESTS`] (keyed like the remap tries: peer id, then
/// the destination prefix). The longest matching prefix decides; no match means refused.
pub const DEST_DENY: u32 = 0;
/// See [`DEST_DENY`].
pub const DEST_ALLOW: u32 = 1;

/// Whether a peer may send to a destination, given the value of the longest matching rule (or
/// `None` when no rule matches). Anything but an explicit allow is refused, so a deleted or
/// missing rule fails closed.
#[inline(always)]
pub const fn dest_allowed(rule: Option<u32>) -> bool {
    matches!(rule, Some(DEST_ALLOW))
}

/// Data part of the LPM key of the external-IP tries (local, not per peer).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ExtKey {
    /// IPv4 address, network byte order.
    pub addr: u32,
}
const _: () = assert!(core::mem::size_of::<ExtKey>() == 4);

/// What a matched prefix becomes: `new = (addr & !mask) | prefix` (host bits kept).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Rewrite {
    /// Target prefix, network byte order, host bits zero.
    pub prefix: u32,
    /// Netmask of the mapping, network byte order.
    pub mask: u32,
}
const _: () = assert!(core::mem::size_of::<Rewrite>() == 8);

impl Rewrite {
    /// A prefix of length `len` (0..=32) from a host-order address.
    pub const fn new(prefix_host: u32, len: u8) -> Self {
        let mask = prefix_mask(len);
        Self {
            prefix: (prefix_host & mask).to_be(),
            mask: mask.to_be(),
        }
    }

    /// Rewrites an address given in network byte order.
    #[inline(always)]
    pub const fn apply(&self, addr_be: u32) -> u32 {
        (addr_be & !self.mask) | self.prefix
    }

    pub const fn prefix_len(&self) -> u32 {
        u32::from_be(self.mask).count_ones()
    }
}

/// Host-order netmask for a prefix length; lengths above 32 saturate.
pub const fn prefix_mask(len: u8) -> u32 {
    if len == 0 {
        0
    } else if len >= 32 {
        u32::MAX
    } else {
        u32::MAX << (32 - len)
    }
}

/// Direction index into the counters: traffic leaving through the fabric device.
pub const DIR_EGRESS: u32 = 0;
/// Direction index into the counters: traffic arriving from the fabric device.
pub const DIR_INGRESS: u32 = 1;

/// Index of a peer's counters for one direction in [`maps::COUNTERS`].
pub const fn counter_index(peer_id: u32, dir: u32) -> u32 {
    peer_id * 2 + dir
}

/// Per-CPU, per-peer, per-direction counters.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub packets: u64,
    pub bytes: u64,
    /// Packets whose addresses were rewritten.
    pub remapped: u64,
    /// TCP SYNs whose MSS option was lowered.
    pub mss_clamped: u64,
    /// ICMP errors whose embedded header was rewritten.
    pub icmp_errors: u64,
    /// Packets dropped (the reason is counted in [`maps::DROPS`]).
    pub dropped: u64,
    /// Of `dropped`: packets from the peer to a destination it may not reach
    /// ([`drop::DST_REFUSED`]).
    pub refused: u64,
}
const _: () = assert!(core::mem::size_of::<Counters>() == 56);

impl Counters {
    pub fn add(&mut self, o: &Counters) {
        self.packets += o.packets;
        self.bytes += o.bytes;
        self.remapped += o.remapped;
        self.mss_clamped += o.mss_clamped;
        self.icmp_errors += o.icmp_errors;
        self.dropped += o.dropped;
        self.refused += o.refused;
    }
}

/// Why a packet was dropped. Codes start above every `TC_ACT_*` value so a drop reason can
/// never be mistaken for a verdict.
pub mod drop {
    pub const BASE: u32 = 128;
    /// Says IPv4 but the IPv4 header is not all there.
    pub const TRUNCATED_IP: u32 = BASE;
    /// IPv4 header with a bad version or header length.
    pub const BAD_IP_HEADER: u32 = BASE + 1;
    /// A packet to rewrite whose TCP/UDP/ICMP header is cut short.
    pub const TRUNCATED_L4: u32 = BASE + 2;
    /// An ICMP error to rewrite whose embedded IPv4 header is cut short or invalid.
    pub const BAD_ICMP_INNER: u32 = BASE + 3;
    /// A kernel helper failed while rewriting (packet may be half-written, so it must go).
    pub const REWRITE_FAILED: u32 = BASE + 4;
    /// A TCP header length that points outside the packet or below 20 bytes.
    pub const BAD_TCP_HEADER: u32 = BASE + 5;
    /// An ICMP redirect or source quench from a peer: obsolete, or an attempt to steer local
    /// routing; never honoured across the fabric.
    pub const ICMP_REFUSED: u32 = BASE + 6;
    /// A packet from a peer to a destination it may not reach: anything but the local pod
    /// CIDRs (minus the gateway's own addresses), the local IPs exposed through the external
    /// CIDR and the peer's tunnel addresses. Also every non-IPv4 packet from a peer.
    pub const DST_REFUSED: u32 = BASE + 7;
    /// A packet arriving on a device that carries our ingress program but has no
    /// configuration entry (deleted behind the loader's back): delivered untranslated, its
    /// source could pass for a local pod, so it goes.
    pub const UNCONFIGURED: u32 = BASE + 8;
    /// Number of reasons; size of the drop counter array.
    pub const COUNT: u32 = 9;

    pub const fn name(code: u32) -> &'static str {
        match code {
            TRUNCATED_IP => "truncated-ip",
            BAD_IP_HEADER => "bad-ip-header",
            TRUNCATED_L4 => "truncated-l4",
            BAD_ICMP_INNER => "bad-icmp-inner",
            REWRITE_FAILED => "rewrite-failed",
            BAD_TCP_HEADER => "bad-tcp-header",
            ICMP_REFUSED => "icmp-refused",
            DST_REFUSED => "dst-refused",
            UNCONFIGURED => "unconfigured",
            _ => "unknown",
        }
    }
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: all of these are repr(C), made of integers, with no implicit padding.
    unsafe impl aya::Pod for IfaceConfig {}
    unsafe impl aya::Pod for RemapKey {}
    unsafe impl aya::Pod for ExtKey {}
    unsafe impl aya::Pod for Rewrite {}
    unsafe impl aya::Pod for Counters {}
    unsafe impl aya::Pod for FastRemap {}
    unsafe impl aya::Pod for PeerMeta {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrite_keeps_host_bits() {
        // 10.71.0.0/16 -> 10.244.0.0/16
        let rw = Rewrite::new(u32::from_be_bytes([10, 244, 0, 0]), 16);
        let a = u32::from_be_bytes([10, 71, 2, 7]).to_be();
        assert_eq!(rw.apply(a).to_ne_bytes(), [10, 244, 2, 7]);
        assert_eq!(rw.prefix_len(), 16);
    }

    #[test]
    fn rewrite_odd_lengths() {
        let rw = Rewrite::new(u32::from_be_bytes([172, 16, 16, 0]), 20);
        let a = u32::from_be_bytes([10, 1, 47, 9]).to_be();
        assert_eq!(rw.apply(a).to_ne_bytes(), [172, 16, 31, 9]);
        let rw = Rewrite::new(u32::from_be_bytes([192, 168, 1, 5]), 32);
        assert_eq!(rw.apply(a).to_ne_bytes(), [192, 168, 1, 5]);
        let rw = Rewrite::new(u32::from_be_bytes([11, 0, 0, 0]), 8);
        assert_eq!(rw.apply(a).to_ne_bytes(), [11, 1, 47, 9]);
    }

    #[test]
    fn masks() {
        assert_eq!(prefix_mask(0), 0);
        assert_eq!(prefix_mask(8), 0xff00_0000);
        assert_eq!(prefix_mask(32), u32::MAX);
        assert_eq!(prefix_mask(40), u32::MAX);
    }

    #[test]
    fn only_an_explicit_allow_lets_a_destination_through() {
        assert!(dest_allowed(Some(DEST_ALLOW)));
        assert!(!dest_allowed(Some(DEST_DENY)));
        assert!(!dest_allowed(None), "no rule: refused");
        assert!(!dest_allowed(Some(7)), "a corrupted rule: refused");
    }

    #[test]
    fn counters_add_every_field() {
        let one = Counters {
            packets: 1,
            bytes: 2,
            remapped: 3,
            mss_clamped: 4,
            icmp_errors: 5,
            dropped: 6,
            refused: 7,
        };
        let mut sum = one;
        sum.add(&one);
        assert_eq!(sum.refused, 14);
        assert_eq!(sum.dropped, 12);
        assert_eq!(sum.packets, 2);
    }

    #[test]
    fn drop_codes_do_not_overlap_tc_actions() {
        // TC_ACT_* go from -1 (UNSPEC) to 8 (TRAP).
        for code in drop::BASE..drop::BASE + drop::COUNT {
            assert!(code > 8);
            assert_ne!(drop::name(code), "unknown");
        }
    }
}
