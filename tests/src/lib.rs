//! Test beds for the fabric: network namespaces, the two-cluster topology of
//! docs/packet-path.md, traffic probes, API servers and whole clusters with their Kubernetes
//! test doubles (the benchmarks and the demo build on them in `fabric-bench`).
//!
//! Everything runs inside namespaces this crate creates (unique names `fabt-<pid>-<n>-*`) and is
//! removed again when the [`netns::Testbed`] drops, also when a test fails. It needs root; the
//! integration tests skip themselves (with a message) otherwise.
//!
//! The `fabric-agent` binary is driven as a subprocess (see [`agent`] for how it is found):
//! build it first with `cargo build --workspace --bins`, or use `cargo xtask test`.
pub mod agent;
pub mod apiserver;
pub mod auth_service;
pub mod blips;
pub mod client_ca;
pub mod clusters;
pub mod deployments;
pub mod etcd_seed;
pub mod figures;
pub mod host_kubelets;
pub mod kube_sync;
pub mod kubectl;
pub mod manifests;
pub mod netns;
pub mod offload_fixture;
pub mod other_gateways;
pub mod peering_stack;
pub mod phase;
pub mod process;
/// Resource quantities, as the provider's offer policy reads them.
pub use fabric_api::quantity;
/// The Kubernetes test doubles (test node, scheduler, EndpointSlice controller, storage), under
/// the names the tests know them by, with what starts each against an [`apiserver::ApiServer`].
mod doubles;
pub use doubles::{endpoints, sched, storage};
pub use fabric_test_doubles::testnode;
pub mod rights;
pub mod sharing;
pub mod shop;
pub mod topo;
pub mod traffic;
pub mod wait;
pub mod webhook;
pub mod workloads;

pub use agent::{Agent, peer_counter};
pub use netns::{Testbed, is_root};
pub use process::{ChildGuard, die_with_parent, locate_bin};
pub use topo::{Addressing, TwoClusters, addr};

/// For tests: returns true (after printing why) when the environment cannot run netns tests.
pub fn skip_unless_root(test: &str) -> bool {
    if is_root() {
        return false;
    }
    eprintln!(
        "skipping {test}: needs root (network namespaces, eBPF); run `sudo cargo xtask test`"
    );
    true
}

static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// For the demo and the benchmark: Ctrl-C (SIGINT/SIGTERM) only sets a flag, which
/// [`check_interrupt`] turns into an error between steps, so the program unwinds normally and
/// every test bed is cleaned up by its `Drop`. Child processes (ping, iperf3) get the SIGINT
/// from the terminal as well and end early, so no step blocks for long.
pub fn install_interrupt_handler() {
    let _ = ctrlc::set_handler(|| {
        if INTERRUPTED.swap(true, std::sync::atomic::Ordering::SeqCst) {
            eprintln!("\ninterrupted again; still cleaning up, please wait");
        } else {
            eprintln!("\ninterrupted: cleaning up");
        }
    });
}

/// Fails once Ctrl-C was pressed (see [`install_interrupt_handler`]).
pub fn check_interrupt() -> anyhow::Result<()> {
    if INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst) {
        anyhow::bail!("interrupted");
    }
    Ok(())
}
