//! The checks behind the fuzz targets in `fuzz_targets/`, one module per target. Each
//! `check(data)` feeds arbitrary bytes to a parser of the gateway, of `fabric-common`, of
//! discovery, of the authentication service or of the kubelet API and panics when an invariant breaks, not only when the code under test panics. The libFuzzer
//! binaries call them (`cargo xtask fuzz TARGET`), and the main workspace's
//! `tests/tests/api/fuzz_seeds.rs` replays the committed seeds (`seeds/TARGET/`) through them.

pub mod auth_request;
pub mod coalesce;
pub mod config;
pub mod discovery;
pub mod packet;
pub mod remap;
pub mod segment;
pub mod spdy;
pub mod tcp_options;
mod tcpip;
pub mod uapi;

/// Every target: its name (the libFuzzer binary and the directory of its seeds) and its check.
pub const TARGETS: &[(&str, fn(&[u8]))] = &[
    ("packet", packet::check),
    ("segment", segment::check),
    ("coalesce", coalesce::check),
    ("uapi", uapi::check),
    ("config", config::check),
    ("tcp_options", tcp_options::check),
    ("remap", remap::check),
    ("discovery", discovery::check),
    ("auth_request", auth_request::check),
    ("spdy", spdy::check),
];
