//! The remap programs. One pair (egress, ingress) per fabric device; see
//! `docs/datapath.md` for the address model.
//!
//! Egress (towards a peer): the destination, in this cluster's view of the peer, becomes the
//! peer's real address; a local source with an external-CIDR address takes that address.
//! Ingress (from a peer): the peer's real source becomes this cluster's view of it; a
//! destination in the local external CIDR becomes the local IP it stands for.
//! ICMP errors get the mirror rewrite on their embedded header, so PMTUD and traceroute work.
use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR, TC_ACT_OK, TC_ACT_SHOT},
    macros::classifier,
    programs::TcContext,
};
use fabric_common::{
    Counters, DIR_EGRESS, DIR_INGRESS, IFACE_F_EXTERNALS, IfaceConfig, counter_index, csum, drop,
    tcp::{self, MAX_OPTIONS},
};

use crate::maps::{
    FABRIC_COUNTERS, FABRIC_DROPS, FABRIC_EXT_DNAT, FABRIC_EXT_SNAT, FABRIC_IFACES,
    FABRIC_REMAP_EG, FABRIC_REMAP_IN, external, remap,
};

const ETH_P_IP_BE: u32 = 0x0800u16.to_be() as u32;
const IPPROTO_ICMP: u8 = 1;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const IP_OFFSET_MASK: u16 = 0x1fff;

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

#[classifier]
pub fn fabric_egress(ctx: TcContext) -> i32 {
    handle(&ctx, DIR_EGRESS)
}

#[classifier]
pub fn fabric_ingress(ctx: TcContext) -> i32 {
    handle(&ctx, DIR_INGRESS)
}

#[inline(always)]
fn handle(ctx: &TcContext, dir: u32) -> i32 {
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    // SAFETY: the value is copied out before anything else touches the map.
    let Some(iface) = (unsafe { FABRIC_IFACES.get(&ifindex) }).copied() else {
        // Not a fabric device (or being torn down): not ours to touch.
        return TC_ACT_OK;
    };
    let stats = FABRIC_COUNTERS.get_ptr_mut(counter_index(iface.peer_id, dir));
    let result = try_handle(ctx, &iface, dir);
    if let Some(stats) = stats {
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
            Err(_) => stats.dropped += 1,
        }
    }
    match result {
        Ok(_) => TC_ACT_OK,
        Err(reason) => {
            if let Some(n) = FABRIC_DROPS.get_ptr_mut(reason.wrapping_sub(drop::BASE)) {
                // SAFETY: per-CPU slot, as above.
                unsafe { *n += 1 };
            }
            TC_ACT_SHOT
        }
    }
}

/// Returns the `DID_*` bits, or the drop reason.
#[inline(always)]
fn try_handle(ctx: &TcContext, iface: &IfaceConfig, dir: u32) -> Result<u32, u32> {
    if ctx.skb.protocol() != ETH_P_IP_BE {
        return Ok(0);
    }
    let l3 = iface.l3_offset as usize;
    let ip: Ipv4Hdr = ctx.load(l3).map_err(|_| drop::TRUNCATED_IP)?;
    let ihl = ip.header_len().ok_or(drop::BAD_IP_HEADER)?;
    let l4 = l3 + ihl;
    let peer_be = iface.peer_id.to_be();
    let ext = iface.flags & IFACE_F_EXTERNALS != 0;

    let (src, dst) = if dir == DIR_EGRESS {
        let src = if ext { external(&FABRIC_EXT_SNAT, ip.saddr) } else { ip.saddr };
        (src, remap(&FABRIC_REMAP_EG, peer_be, ip.daddr))
    } else {
        let dst = if ext { external(&FABRIC_EXT_DNAT, ip.daddr) } else { ip.daddr };
        (remap(&FABRIC_REMAP_IN, peer_be, ip.saddr), dst)
    };
    let outer = src != ip.saddr || dst != ip.daddr;
    let mut did = if outer { DID_REMAP } else { 0 };

    if ip.is_later_fragment() {
        // No L4 header here; the first fragment carries the L4 checksum for the whole datagram.
        if outer {
            rewrite_addrs(ctx, l3, &ip, src, dst, None)?;
        }
        return Ok(did);
    }

    match ip.proto {
        IPPROTO_TCP => {
            // data offset + flags
            let off_flags: [u8; 2] = ctx.load(l4 + 12).map_err(|_| drop::TRUNCATED_L4)?;
            let doff = ((off_flags[0] >> 4) as usize) * 4;
            if doff < 20 {
                return Err(drop::BAD_TCP_HEADER);
            }
            if (ctx.len() as usize) < l4 + doff {
                return Err(drop::TRUNCATED_L4);
            }
            if outer {
                rewrite_addrs(ctx, l3, &ip, src, dst, Some((l4 + 16, 0)))?;
            }
            if iface.mss != 0 && off_flags[1] & tcp::FLAG_SYN != 0 && clamp_mss(ctx, l4, doff, iface.mss)? {
                did |= DID_CLAMP;
            }
        }
        IPPROTO_UDP => {
            if outer {
                if (ctx.len() as usize) < l4 + 8 {
                    return Err(drop::TRUNCATED_L4);
                }
                // MARK_MANGLED_0: a zero UDP checksum means "none" and stays zero; a computed
                // zero is written as 0xffff.
                rewrite_addrs(ctx, l3, &ip, src, dst, Some((l4 + 6, BPF_F_MARK_MANGLED_0 as u64)))?;
            }
        }
        IPPROTO_ICMP => {
            let ty: u8 = ctx.load(l4).map_err(|_| drop::TRUNCATED_L4)?;
            if is_icmp_error(ty) && rewrite_icmp_inner(ctx, l4, peer_be, ext, dir)? {
                did |= DID_ICMP_ERR | DID_REMAP;
            }
            if outer {
                // ICMP has no pseudo-header: only the IP checksum moves.
                rewrite_addrs(ctx, l3, &ip, src, dst, None)?;
            }
        }
        _ => {
            if outer {
                rewrite_addrs(ctx, l3, &ip, src, dst, None)?;
            }
        }
    }
    Ok(did)
}

#[inline(always)]
fn is_icmp_error(ty: u8) -> bool {
    // dest unreachable (incl. frag needed), source quench, redirect, time exceeded, param problem
    matches!(ty, 3 | 4 | 5 | 11 | 12)
}

/// Writes new source/destination addresses and fixes the IP checksum and, when given, the
/// L4 checksum (which covers the addresses through the pseudo-header).
#[inline(always)]
fn rewrite_addrs(
    ctx: &TcContext,
    l3: usize,
    ip: &Ipv4Hdr,
    src: u32,
    dst: u32,
    l4_csum: Option<(usize, u64)>,
) -> Result<(), u32> {
    let diff = csum::add(csum::diff32(ip.saddr, src), csum::diff32(ip.daddr, dst));
    ctx.store(l3 + 12, &[src, dst], 0)
        .map_err(|_| drop::REWRITE_FAILED)?;
    ctx.l3_csum_replace(l3 + 10, 0, diff as u64, 0)
        .map_err(|_| drop::REWRITE_FAILED)?;
    if let Some((off, flags)) = l4_csum {
        // Size 0: `to` is a checksum difference. The helper also keeps CHECKSUM_PARTIAL and
        // CHECKSUM_COMPLETE skbs consistent, which a manual write would not.
        ctx.l4_csum_replace(off, 0, diff as u64, BPF_F_PSEUDO_HDR as u64 | flags)
            .map_err(|_| drop::REWRITE_FAILED)?;
    }
    Ok(())
}

/// Rewrites the IPv4 header (and the L4 checksum) embedded in an ICMP error at `l4`.
/// The embedded packet travelled the other way, so the side that is the peer's is its source
/// on egress and its destination on ingress. Returns whether anything changed.
#[inline(always)]
fn rewrite_icmp_inner(
    ctx: &TcContext,
    l4: usize,
    peer_be: u32,
    ext: bool,
    dir: u32,
) -> Result<bool, u32> {
    let inner = l4 + 8;
    let ip: Ipv4Hdr = ctx.load(inner).map_err(|_| drop::BAD_ICMP_INNER)?;
    let ihl = ip.header_len().ok_or(drop::BAD_ICMP_INNER)?;
    let (src, dst) = if dir == DIR_EGRESS {
        let dst = if ext { external(&FABRIC_EXT_SNAT, ip.daddr) } else { ip.daddr };
        (remap(&FABRIC_REMAP_EG, peer_be, ip.saddr), dst)
    } else {
        let src = if ext { external(&FABRIC_EXT_DNAT, ip.saddr) } else { ip.saddr };
        (src, remap(&FABRIC_REMAP_IN, peer_be, ip.daddr))
    };
    if src == ip.saddr && dst == ip.daddr {
        return Ok(false);
    }
    let diff = csum::add(csum::diff32(ip.saddr, src), csum::diff32(ip.daddr, dst));
    // The embedded addresses and the embedded IP checksum change by opposite amounts, so the
    // ICMP checksum over them is unchanged.
    let check = csum::replace_by_diff(ip.check, diff);
    ctx.store(inner + 10, &check, 0)
        .map_err(|_| drop::REWRITE_FAILED)?;
    ctx.store(inner + 12, &[src, dst], 0)
        .map_err(|_| drop::REWRITE_FAILED)?;

    if ip.is_later_fragment() {
        return Ok(true);
    }
    let (off, is_udp) = match ip.proto {
        IPPROTO_TCP => (inner + ihl + 16, false),
        IPPROTO_UDP => (inner + ihl + 6, true),
        _ => return Ok(true),
    };
    // The quote may stop before the L4 checksum (RFC 792 only promises 8 bytes).
    let Ok(old) = ctx.load::<u16>(off) else {
        return Ok(true);
    };
    if is_udp && old == 0 {
        return Ok(true);
    }
    let mut new = csum::replace_by_diff(old, diff);
    if is_udp && new == 0 {
        new = 0xffff;
    }
    ctx.store(off, &new, 0).map_err(|_| drop::REWRITE_FAILED)?;
    // This change is inside the ICMP payload with nothing to offset it: fix the ICMP checksum.
    ctx.l3_csum_replace(l4 + 2, old as u64, new as u64, 2)
        .map_err(|_| drop::REWRITE_FAILED)?;
    Ok(true)
}

/// Lowers the MSS option of a SYN to `mss`. Returns whether it changed anything.
#[inline(always)]
fn clamp_mss(ctx: &TcContext, l4: usize, doff: usize, mss: u16) -> Result<bool, u32> {
    let opt_len = doff - 20;
    if opt_len == 0 || opt_len > MAX_OPTIONS {
        return Ok(false);
    }
    // Options come in 4-byte words (doff counts words), so read them a word at a time: fixed-size
    // loads keep the verifier happy where one variable-length load does not.
    let mut words = [[0u8; 4]; MAX_OPTIONS / 4];
    let n = opt_len / 4;
    for w in 0..MAX_OPTIONS / 4 {
        if w >= n {
            break;
        }
        let v: [u8; 4] = ctx.load(l4 + 20 + w * 4).map_err(|_| drop::TRUNCATED_L4)?;
        if let Some(slot) = words.get_mut(w) {
            *slot = v;
        }
    }
    // SAFETY: same size and alignment 1, plain bytes.
    let opts: [u8; MAX_OPTIONS] = unsafe { core::mem::transmute(words) };
    // Words past the header stay zero, which parses as end-of-options: a constant length keeps
    // every index provably inside the buffer for the verifier.
    let Some((at, old)) = tcp::find_mss(&opts, MAX_OPTIONS) else {
        return Ok(false);
    };
    if old <= mss {
        return Ok(false);
    }
    let old_be = old.to_be();
    let new_be = mss.to_be();
    ctx.store(l4 + 20 + at, &new_be, 0)
        .map_err(|_| drop::REWRITE_FAILED)?;
    ctx.l4_csum_replace(l4 + 16, old_be as u64, new_be as u64, 2)
        .map_err(|_| drop::REWRITE_FAILED)?;
    Ok(true)
}

// DIR_INGRESS is the other value `dir` takes; named here so the two entry points read alike.
const _: () = assert!(DIR_INGRESS != DIR_EGRESS);
