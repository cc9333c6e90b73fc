//! The API-server tier of the end-to-end tests: no root, no network namespaces. Each scenario
//! is a module; its tests start their own API servers (kubelite, `fabric_tests::apiserver`) and
//! the fabric's binaries as processes on the host, as its container in deploy/ runs them where
//! that matters.
//!
//! `cargo test -p fabric-tests --test api [FILTER]`; `cargo xtask test` runs each test in a
//! process of its own. Build the binaries first (`cargo build --workspace --bins`): the tests
//! start them. The tests that need root and network namespaces are in `tests/netns`.
mod crds;
mod deploy;
mod endpoints;
mod fuzz_seeds;
mod inband;
mod namespace_offloading;
mod offload;
mod pod_placement;
mod storage;
mod tethered;
mod twins;
mod virtual_node;
