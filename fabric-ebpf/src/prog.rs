//! The remap programs. One pair (egress, ingress) per fabric device; see `docs/packet-path.md`
//! for the address model.
//!
//! Egress (towards a peer): the destination, in this cluster's view of the peer, becomes the
//! peer's real address; a local source with an external-CIDR address takes that address.
//! Ingress (from a peer): the peer's real source becomes this cluster's view of it; a
//! destination in the local external CIDR becomes the local IP it stands for.
//! ICMP errors get the mirror rewrite on their embedded header, so PMTUD and traceroute work.
//!
//! Cost: headers are read and written in place (direct packet access; the verifier's unclone
//! prologue makes that safe on cloned skbs). The only helper on the common path is
//! `bpf_l4_csum_replace`, kept because it alone knows whether the skb carries a full checksum
//! or a pseudo-header seed for offload (CHECKSUM_PARTIAL). Peers with up to four remaps are
//! matched inline from the interface entry; more go through the LPM tries.
use core::mem::size_of;

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR, TC_ACT_OK, TC_ACT_SHOT},
    macros::classifier,
    programs::TcContext,
};
use fabric_common::{
    Counters, DIR_EGRESS, FAST_REMAPS, IFACE_F_EXTERNALS, IFACE_F_LPM, IfaceConfig, counter_index,
    csum, drop,
    tcp::{self, MAX_OPTIONS},
};

use crate::maps::{
    FABRIC_COUNTERS, FABRIC_DROPS, FABRIC_EXT_DNAT, FABRIC_EXT_SNAT, FABRIC_IFACES,
    FABRIC_REMAP_EG, FABRIC_REMAP_IN, dest_rule, external, remap,
};

const ETH_P_IP_BE: u32 = 0x0800u16.to_be() as u32;
const ETH_P_IPV6_BE: u32 = 0x86ddu16.to_be() as u32;
const IPPROTO_ICMP: u8 = 1;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const IP_OFFSET_MASK: u16 = 0x1fff;
/// Longest IPv4 header plus the longest TCP header: what we may need linear.
const MAX_HEADERS: u32 = 60 + 60;

/// Outcome bits for the counters.
const DID_REMAP: u32 = 1;
const DID_CLAMP: u32 = 2;
const DID_ICMP_ERR: u32 = 4;

/// IPv4 header as it sits in the packet (multi-byte fields in network order).
#[repr(C)]
#[derive(Clone, Copy)]
struct Ipv4Hdr {
    ver_ihl: u8,
    tos: u8,
    tot_len: u16,
    id: u16,
    frag_off: u16,
    ttl: u8,
    proto: u8,
    check: u16,
    saddr: u32,
    daddr: u32,
}

impl Ipv4Hdr {
    /// Header length in bytes, or `None` for a header that is not IPv4 or is too short.
    #[inline(always)]
    fn header_len(&self) -> Option<usize> {
        let ihl = (self.ver_ihl & 0x0f) as usize;
        if self.ver_ihl >> 4 != 4 || ihl < 5 {
            return None;
        }
        Some(ihl * 4)
    }

    #[inline(always)]
    fn is_later_fragment(&self) -> bool {
        u16::from_be(self.frag_off) & IP_OFFSET_MASK != 0
    }
}

/// A pointer to `T` at `off` in the linear packet data, if all of it is there.
#[inline(always)]
fn ptr_at<T>(ctx: &TcContext, off: usize) -> Option<*mut T> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + off + size_of::<T>() > end {
        return None;
    }
    Some((start + off) as *mut T)
}

#[classifier]
pub fn fabric_egress(ctx: TcContext) -> i32 {
    handle::<true>(&ctx)
}

#[classifier]
pub fn fabric_ingress(ctx: TcContext) -> i32 {
    handle::<false>(&ctx)
}

/// Does nothing: `datapath bench` runs it to measure what BPF_PROG_TEST_RUN itself costs, so
/// the programs' own cost can be read off. Never attached.
#[classifier]
pub fn fabric_noop(_ctx: TcContext) -> i32 {
    TC_ACT_OK
}

#[inline(always)]
fn handle<const EGRESS: bool>(ctx: &TcContext) -> i32 {
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    // SAFETY: map values stay valid for the whole run of the program (RCU).
    let Some(iface) = (unsafe { FABRIC_IFACES.get(&ifindex) }) else {
        if EGRESS {
            // Untranslated on the way out: the peer's own destination check refuses it.
            return TC_ACT_OK;
        }
        // Our filters sit only on peers' devices, written after their entry and removed
        // before it: a packet from a peer without one would go in untranslated, its source
        // possibly a local pod's.
        count_drop(drop::UNCONFIGURED);
        return TC_ACT_SHOT;
    };
    let dir = if EGRESS {
        DIR_EGRESS
    } else {
        fabric_common::DIR_INGRESS
    };
    let result = try_handle::<EGRESS>(ctx, iface);
    if let Some(stats) = FABRIC_COUNTERS.get_ptr_mut(counter_index(iface.peer_id, dir)) {
        // SAFETY: per-CPU slot; nothing else on this CPU runs concurrently with us.
        let stats: &mut Counters = unsafe { &mut *stats };
        stats.packets += 1;
        stats.bytes += ctx.len() as u64;
        match result {
            Ok(did) => {
                stats.remapped += (did & DID_REMAP) as u64;
                stats.mss_clamped += ((did & DID_CLAMP) >> 1) as u64;
                stats.icmp_errors += ((did & DID_ICMP_ERR) >> 2) as u64;
            }
            Err(reason) => {
                stats.dropped += 1;
                stats.refused += (reason == drop::DST_REFUSED) as u64;
            }
        }
    }
    match result {
        Ok(_) => TC_ACT_OK,
        Err(reason) => {
            count_drop(reason);
            TC_ACT_SHOT
        }
    }
}

#[inline(always)]
fn count_drop(reason: u32) {
    if let Some(n) = FABRIC_DROPS.get_ptr_mut(reason.wrapping_sub(drop::BASE)) {
        // SAFETY: per-CPU slot; nothing else on this CPU runs concurrently with us.
        unsafe { *n += 1 };
    }
}

/// Whether a packet from the peer may go to `dst` (before any external-IP translation).
#[inline(always)]
fn dest_ok(iface: &IfaceConfig, dst: u32) -> bool {
    fabric_common::dest_allowed(dest_rule(iface.peer_id.to_be(), dst))
}

/// The peer-side address of a packet in this direction, translated (or unchanged).
#[inline(always)]
fn peer_side<const EGRESS: bool>(iface: &IfaceConfig, addr: u32) -> u32 {
    if iface.flags & IFACE_F_LPM != 0 {
        let peer_be = iface.peer_id.to_be();
        return if EGRESS {
            remap(&FABRIC_REMAP_EG, peer_be, addr)
        } else {
            remap(&FABRIC_REMAP_IN, peer_be, addr)
        };
    }
    let mut i = 0;
    while i < FAST_REMAPS {
        if i >= iface.n_fast as usize {
            break;
        }
        let e = &iface.fast[i];
        let hit = if EGRESS {
            e.egress(addr)
        } else {
            e.ingress(addr)
        };
        if let Some(a) = hit {
            return a;
        }
        i += 1;
    }
    addr
}

/// The local-side address of a packet in this direction when an external mapping covers it.
#[inline(always)]
fn local_side<const EGRESS: bool>(iface: &IfaceConfig, addr: u32) -> Option<u32> {
    if iface.flags & IFACE_F_EXTERNALS == 0 {
        return None;
    }
    if EGRESS {
        external(&FABRIC_EXT_SNAT, addr)
    } else {
        external(&FABRIC_EXT_DNAT, addr)
    }
}

/// Returns the `DID_*` bits, or the drop reason.
#[inline(always)]
fn try_handle<const EGRESS: bool>(ctx: &TcContext, iface: &IfaceConfig) -> Result<u32, u32> {
    let proto = ctx.skb.protocol();
    if proto != ETH_P_IP_BE {
        // The fabric carries IPv4 only: no IPv6 destination is one a peer may reach.
        if !EGRESS && proto == ETH_P_IPV6_BE {
            return Err(drop::DST_REFUSED);
        }
        return Ok(0);
    }
    let l3 = iface.l3_offset as usize;
    if ptr_at::<Ipv4Hdr>(ctx, l3).is_none() {
        // Headers beyond the linear part (rare: most drivers pull them); make them linear.
        let want = core::cmp::min(ctx.len(), l3 as u32 + MAX_HEADERS);
        ctx.pull_data(want).map_err(|_| drop::TRUNCATED_IP)?;
    }
    let ip_ptr = ptr_at::<Ipv4Hdr>(ctx, l3).ok_or(drop::TRUNCATED_IP)?;
    // SAFETY: bounds checked by ptr_at; packet data need not be aligned.
    let ip = unsafe { ip_ptr.read_unaligned() };
    let ihl = ip.header_len().ok_or(drop::BAD_IP_HEADER)?;
    let l4 = l3 + ihl;

    // The peer's address is the destination on the way out and the source on the way in.
    let (src, dst) = if EGRESS {
        (
            local_side::<true>(iface, ip.saddr).unwrap_or(ip.saddr),
            peer_side::<true>(iface, ip.daddr),
        )
    } else {
        // A peer reaches local pods, its tunnel address and the exposed local IPs (through
        // the external CIDR), nothing else: not the gateway, nodes, the API server or
        // metadata services. ICMP errors pass when their outer destination does (that is
        // the sender of the packet they quote: a local pod for a PMTU "frag needed").
        let dst = match local_side::<false>(iface, ip.daddr) {
            Some(d) => d,
            None if dest_ok(iface, ip.daddr) => ip.daddr,
            None => return Err(drop::DST_REFUSED),
        };
        (peer_side::<false>(iface, ip.saddr), dst)
    };
    let outer = src != ip.saddr || dst != ip.daddr;
    let mut did = if outer { DID_REMAP } else { 0 };
    let diff = csum::add(csum::diff32(ip.saddr, src), csum::diff32(ip.daddr, dst));

    if ip.is_later_fragment() {
        // No L4 header here; the first fragment carries the L4 checksum for the whole datagram.
        if outer {
            write_addrs(ip_ptr, &ip, src, dst, diff);
        }
        return Ok(did);
    }

    match ip.proto {
        IPPROTO_TCP => {
            let hdr = ptr_at::<[u8; 20]>(ctx, l4).ok_or(drop::TRUNCATED_L4)?;
            // SAFETY: bounds checked.
            let off_flags = unsafe { [(*hdr)[12], (*hdr)[13]] };
            let doff = ((off_flags[0] >> 4) as usize) * 4;
            if doff < 20 {
                return Err(drop::BAD_TCP_HEADER);
            }
            if iface.mss != 0 && off_flags[1] & tcp::FLAG_SYN != 0 {
                if let Some((old, new)) = clamp_mss(ctx, l4, doff, iface.mss)? {
                    did |= DID_CLAMP;
                    // Direct writes are done; the helper below may move the packet.
                    ctx.l4_csum_replace(l4 + 16, old as u64, new as u64, 2)
                        .map_err(|_| drop::REWRITE_FAILED)?;
                }
            }
            if outer {
                let ip_ptr = ptr_at::<Ipv4Hdr>(ctx, l3).ok_or(drop::TRUNCATED_IP)?;
                write_addrs(ip_ptr, &ip, src, dst, diff);
                l4_pseudo(ctx, l4 + 16, diff, 0)?;
            }
        }
        IPPROTO_UDP => {
            if outer {
                if ptr_at::<[u8; 8]>(ctx, l4).is_none() {
                    return Err(drop::TRUNCATED_L4);
                }
                write_addrs(ip_ptr, &ip, src, dst, diff);
                // MARK_MANGLED_0: a zero UDP checksum means "none" and stays zero; a computed
                // zero is written as 0xffff.
                l4_pseudo(ctx, l4 + 6, diff, BPF_F_MARK_MANGLED_0 as u64)?;
            }
        }
        IPPROTO_ICMP => {
            let hdr = ptr_at::<[u8; 8]>(ctx, l4).ok_or(drop::TRUNCATED_L4)?;
            // SAFETY: bounds checked.
            let ty = unsafe { (*hdr)[0] };
            if !EGRESS && matches!(ty, ICMP_SOURCE_QUENCH | ICMP_REDIRECT) {
                return Err(drop::ICMP_REFUSED);
            }
            if is_icmp_error(ty) && rewrite_icmp_inner::<EGRESS>(ctx, iface, l4)? {
                did |= DID_ICMP_ERR | DID_REMAP;
            }
            if outer {
                // ICMP has no pseudo-header: only the IP checksum moves.
                let ip_ptr = ptr_at::<Ipv4Hdr>(ctx, l3).ok_or(drop::TRUNCATED_IP)?;
                write_addrs(ip_ptr, &ip, src, dst, diff);
            }
        }
        _ => {
            if outer {
                write_addrs(ip_ptr, &ip, src, dst, diff);
            }
        }
    }
    Ok(did)
}

const ICMP_SOURCE_QUENCH: u8 = 4;
const ICMP_REDIRECT: u8 = 5;

#[inline(always)]
fn is_icmp_error(ty: u8) -> bool {
    // dest unreachable (incl. frag needed), source quench, redirect, time exceeded, param problem
    matches!(ty, 3 | 4 | 5 | 11 | 12)
}

/// Writes new addresses and the IPv4 checksum in place. The two changes cancel in the
/// one's-complement sum of the header, so a CHECKSUM_COMPLETE skb stays valid.
#[inline(always)]
fn write_addrs(ip_ptr: *mut Ipv4Hdr, ip: &Ipv4Hdr, src: u32, dst: u32, diff: u32) {
    // SAFETY: `ip_ptr` was bounds-checked for a whole header by the caller.
    unsafe {
        core::ptr::addr_of_mut!((*ip_ptr).saddr).write_unaligned(src);
        core::ptr::addr_of_mut!((*ip_ptr).daddr).write_unaligned(dst);
        core::ptr::addr_of_mut!((*ip_ptr).check)
            .write_unaligned(csum::replace_by_diff(ip.check, diff));
    }
}

/// Folds an address change into a TCP/UDP checksum through the kernel helper, which also
/// keeps offload state (CHECKSUM_PARTIAL seeds, CHECKSUM_COMPLETE sums) consistent.
#[inline(always)]
fn l4_pseudo(ctx: &TcContext, off: usize, diff: u32, flags: u64) -> Result<(), u32> {
    // Size 0: `to` is a checksum difference.
    ctx.l4_csum_replace(off, 0, diff as u64, BPF_F_PSEUDO_HDR as u64 | flags)
        .map_err(|_| drop::REWRITE_FAILED)
}

/// Rewrites the IPv4 header (and the L4 checksum) embedded in an ICMP error at `l4`.
/// The embedded packet travelled the other way, so the peer's side is its source on egress
/// and its destination on ingress. Every change stays inside the ICMP message and is offset
/// by a checksum in it, so no helper is needed. Returns whether anything changed.
#[inline(always)]
fn rewrite_icmp_inner<const EGRESS: bool>(
    ctx: &TcContext,
    iface: &IfaceConfig,
    l4: usize,
) -> Result<bool, u32> {
    let inner = l4 + 8;
    let ip_ptr = ptr_at::<Ipv4Hdr>(ctx, inner).ok_or(drop::BAD_ICMP_INNER)?;
    // SAFETY: bounds checked; packet data need not be aligned.
    let ip = unsafe { ip_ptr.read_unaligned() };
    let ihl = ip.header_len().ok_or(drop::BAD_ICMP_INNER)?;
    let (src, dst) = if EGRESS {
        (
            peer_side::<true>(iface, ip.saddr),
            local_side::<true>(iface, ip.daddr).unwrap_or(ip.daddr),
        )
    } else {
        (
            local_side::<false>(iface, ip.saddr).unwrap_or(ip.saddr),
            peer_side::<false>(iface, ip.daddr),
        )
    };
    if src == ip.saddr && dst == ip.daddr {
        return Ok(false);
    }
    let diff = csum::add(csum::diff32(ip.saddr, src), csum::diff32(ip.daddr, dst));
    // Embedded addresses and embedded IP checksum move by opposite amounts: the ICMP
    // checksum over them is unchanged.
    write_addrs(ip_ptr, &ip, src, dst, diff);

    if ip.is_later_fragment() {
        return Ok(true);
    }
    let (off, is_udp) = match ip.proto {
        IPPROTO_TCP => (inner + ihl + 16, false),
        IPPROTO_UDP => (inner + ihl + 6, true),
        _ => return Ok(true),
    };
    // The quote may stop before the L4 checksum (RFC 792 only promises 8 bytes).
    let Some(l4_check) = ptr_at::<u16>(ctx, off) else {
        return Ok(true);
    };
    let icmp_check = ptr_at::<[u16; 2]>(ctx, l4).ok_or(drop::TRUNCATED_L4)?;
    // SAFETY: both bounds checked.
    unsafe {
        let old = l4_check.read_unaligned();
        if is_udp && old == 0 {
            return Ok(true);
        }
        let mut new = csum::replace_by_diff(old, diff);
        if is_udp && new == 0 {
            new = 0xffff;
        }
        l4_check.write_unaligned(new);
        // This change is inside the ICMP payload with nothing to offset it: the ICMP
        // checksum takes the opposite change.
        let check = icmp_check.read_unaligned()[1];
        core::ptr::addr_of_mut!((*icmp_check)[1]).write_unaligned(csum::replace16(check, old, new));
    }
    Ok(true)
}

/// Lowers the MSS option of a SYN to `mss`, in place. Returns the old and new option values
/// (as in the packet) for the checksum update, or `None` when nothing changed.
#[inline(always)]
fn clamp_mss(ctx: &TcContext, l4: usize, doff: usize, mss: u16) -> Result<Option<(u16, u16)>, u32> {
    let opt_len = doff - 20;
    if opt_len == 0 || opt_len > MAX_OPTIONS {
        return Ok(None);
    }
    // SYNs are rare: a helper load per option byte is cheap enough and verifies in few states.
    let base = l4 + 20;
    let Some((at, old)) = tcp::find_mss_with(opt_len, |i| ctx.load::<u8>(base + i).ok()) else {
        return Ok(None);
    };
    if old <= mss || at >= opt_len {
        return Ok(None);
    }
    let p = ptr_at::<[u8; 2]>(ctx, l4 + 20 + at).ok_or(drop::TRUNCATED_L4)?;
    let new = mss.to_be_bytes();
    // SAFETY: bounds checked.
    unsafe { *p = new };
    let (old, new) = (old.to_be(), u16::from_ne_bytes(new));
    // The checksum sums 16-bit words at even offsets of the TCP header (whose options start at
    // the even offset 20). A value at an odd offset straddles two of those words, each byte in
    // the other half of its word, so it counts byte-swapped in the sum (RFC 1071 §2(B)).
    if at % 2 == 1 {
        Ok(Some((old.swap_bytes(), new.swap_bytes())))
    } else {
        Ok(Some((old, new)))
    }
}
