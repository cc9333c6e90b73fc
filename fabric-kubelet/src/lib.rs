//! The streaming side of the kubelet API, for the fabric's test node and its virtual kubelet:
//! what an API server sends to a kubelet for `kubectl exec`, `attach` and `port-forward`.
//! Kubernetes proxies these to the kubelet as HTTP/1.1 upgrades to **SPDY/3.1** (kubectl's
//! WebSocket requests are translated to SPDY by the API server), with a sub-protocol on top.
//!
//! - [`frame`]: SPDY/3.1 frames and their zlib-compressed header blocks ([`dictionary`]),
//!   pure, with hard limits on what a peer may send (fuzzed: `fuzz/fuzz_targets/spdy.rs`).
//! - [`session`]: the server's session state (streams, replies, pings, resets), pure.
//! - [`conn`]: that session over an upgraded connection, each stream an in-memory duplex.
//! - [`upgrade`]: the HTTP upgrade and the sub-protocol negotiation.
//! - [`remotecommand`]: exec/attach, `v4.channel.k8s.io` (stream types, exit status).
//! - [`portforward`]: `portforward.k8s.io` (data/error stream pairs per request).
//!
//! No crate on crates.io serves this: `spdy-mux` is a young client-side multiplexer for
//! WebSocket transports, so the protocol is written here, after the SPDY/3.1 draft and the
//! behaviour of Kubernetes' own implementation (spdystream).
pub mod conn;
pub mod dictionary;
pub mod frame;
pub mod portforward;
pub mod remotecommand;
pub mod session;
pub mod upgrade;
