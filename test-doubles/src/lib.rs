//! Kubernetes test doubles: what a real cluster's kubelet, scheduler and controllers do and the
//! test API server does not, for the fixture's clusters. Each is a pure part here (decisions
//! free of I/O, unit-tested against upstream's rules) and a binary around it:
//! - [`testnode`], `fabric-test-node`: a kubelet stand-in that runs pods for real in network
//!   namespaces (`fabric-test-pod` is what runs in them), serves logs/exec/attach/port-forward,
//!   and a per-node service proxy;
//! - [`sched`], `fabric-test-scheduler`: kube-scheduler's filters that the fabric relies on;
//! - [`endpoints`], `fabric-test-endpoints`: the EndpointSlice controller;
//! - [`storage`], `fabric-test-storage`: the PV binder and a hostpath provisioner behind the
//!   default class.
//!
//! `fabric-tests` re-exports them under the same names and starts them with its clusters.
pub mod endpoints;
pub mod sched;
pub mod storage;
pub mod testnode;
