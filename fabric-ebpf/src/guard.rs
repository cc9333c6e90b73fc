//! The overlay guard: an sk_lookup program for a network namespace that refuses overlay
//! (VXLAN) datagrams from any source but the known endpoints. Linux VXLAN devices without
//! learning accept encapsulated packets from anyone who knows the VNI and port; the guard
//! runs in the UDP socket lookup, before the VXLAN socket sees the datagram.
//!
//! An allowed source is also bound to the interface its datagrams must arrive on (the one the
//! route back to it leaves through, as strict reverse-path filtering would check): a pod on
//! this host that sends with the gateway's address as its source comes in on its own
//! interface and is refused like any stranger.
use aya_ebpf::{
    btf_maps::{Array, HashMap, PerCpuArray},
    macros::{btf_map, sk_lookup},
    programs::SkLookupContext,
};

const AF_INET: u32 = 2;
const IPPROTO_UDP: u32 = 17;
const SK_DROP: u32 = 0;
const SK_PASS: u32 = 1;

/// Remote endpoints allowed to reach the overlay port: IPv4 in network order -> the ifindex
/// their datagrams arrive on (0: any, when user space could not tell).
#[btf_map]
pub static FABRIC_OVERLAY_SOURCES: HashMap<u32, u32, 4096> = HashMap::new();

/// [0]: the guarded UDP port (host order); 0 guards nothing.
#[btf_map]
pub static FABRIC_OVERLAY_PORT: Array<u32, 1> = Array::new();

/// [0]: datagrams refused.
#[btf_map]
pub static FABRIC_OVERLAY_DROPS: PerCpuArray<u64, 1> = PerCpuArray::new();

#[sk_lookup]
pub fn fabric_overlay_guard(ctx: SkLookupContext) -> u32 {
    // SAFETY: the kernel passes a valid bpf_sk_lookup for the program's lifetime.
    let l = unsafe { &*ctx.lookup };
    if l.family != AF_INET || l.protocol != IPPROTO_UDP {
        return SK_PASS;
    }
    let port = FABRIC_OVERLAY_PORT.get(0).copied().unwrap_or(0);
    if port == 0 || l.local_port != port {
        return SK_PASS;
    }
    // The helper wants the key on the stack, not in the context.
    let remote = core::hint::black_box(l.remote_ip4);
    // SAFETY: a plain map read, copied out at once.
    if let Some(iif) = unsafe { FABRIC_OVERLAY_SOURCES.get(&remote) }.copied()
        && (iif == 0 || iif == l.ingress_ifindex)
    {
        return SK_PASS;
    }
    if let Some(c) = FABRIC_OVERLAY_DROPS.get_ptr_mut(0) {
        // SAFETY: per-CPU slot of this CPU.
        unsafe { *c += 1 };
    }
    SK_DROP
}
