//! The network-namespace tier of the end-to-end tests: root, network namespaces, eBPF, real
//! traffic (only inside the namespaces they create). Each scenario is a module; most build two
//! whole clusters (`fabric_tests::clusters::PeeredClusters`: API servers, networks, every
//! component as a process with the credentials deploy/ gives its container). Without root each
//! test says why and passes.
//!
//! `cargo test -p fabric-tests --test netns [FILTER]`; `cargo xtask test` runs each test in a
//! process of its own. Build the binaries first (`cargo build --workspace --bins`): the tests
//! start them. The tests that need only API servers are in `tests/api`.
mod agent_health;
mod datapath;
mod discovery;
mod failover;
mod hitless;
mod kubelet_streams;
mod network_dump;
mod offloaded_streams;
mod overlay;
mod peering;
mod peering_e2e;
mod pods;
mod reaper;
mod services;
mod sharing_e2e;
mod testbed;
