//! The fabric data plane: stateless double NAT between clusters at tc hooks.
//! See `prog.rs` for the packet path and `maps.rs` for the state it reads.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

#[cfg(target_arch = "bpf")]
mod guard;
#[cfg(target_arch = "bpf")]
mod maps;
#[cfg(target_arch = "bpf")]
mod prog;

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    // The verifier rejects any program with a reachable panic, so this never runs.
    loop {}
}

#[cfg(target_arch = "bpf")]
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

// Host builds (clippy, `cargo build --workspace`) get an empty binary.
#[cfg(not(target_arch = "bpf"))]
fn main() {}
