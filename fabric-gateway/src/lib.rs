//! fabric-gateway: a userspace WireGuard gateway for the fabric multi-cluster
//! network, built on boringtun's `noise::Tunn`, with one TUN device per peer so
//! that peers with overlapping real CIDRs stay distinguishable.

pub mod allowed_ips;
pub mod config;
pub mod control;
pub mod daemon;
pub mod device;
pub mod key;
pub mod netconf;
pub mod offload;
pub mod packet;
pub mod probe;
pub mod reconfig;
pub mod status;
pub mod timers;
pub mod tun;
pub mod uapi;
pub mod udp;
