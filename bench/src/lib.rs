//! The benchmarks behind `cargo xtask bench ...` and the demo (`cargo xtask demo`), built on
//! the test beds of `fabric-tests` (network namespaces, API servers, whole clusters with
//! their sharing layers): each bench sets up what it measures there, prints its figures and
//! ratios from one run, and removes everything again. Results: docs/benchmarks.md.
pub mod apimetrics;
pub mod control;
pub mod datapath;
pub mod fabric;
pub mod offload;
pub mod operator;
pub mod peering;
pub mod reflection;
pub mod storage;
