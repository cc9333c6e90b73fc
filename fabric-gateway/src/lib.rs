//! fabric-gateway: a userspace WireGuard gateway for the fabric multi-cluster
//! network, built on boringtun's `noise::Tunn`, with one TUN device per peer so
//! that peers with overlapping real CIDRs stay distinguishable.

// The contract (configuration, keys, status) lives in fabric-gateway-api, under its old paths.
pub use fabric_gateway_api::{config, key, status};

pub mod allowed_ips;
pub mod control;
pub mod daemon;
pub mod device;
pub mod endpoints;
pub mod handshake_limit;
pub mod netconf;
pub mod offload;
pub mod packet;
pub mod probe;
pub mod reconfig;
pub mod roam;
pub mod timers;
pub mod tun;
pub mod uapi;
pub mod udp;
