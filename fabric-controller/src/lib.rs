//! Cluster-level controllers of the fabric. What they share with other controllers (Lease
//! election, status writing, Events) is in `fabric-kube`.
pub mod discovery;
pub mod gateway;
pub mod ipam;
pub mod ips;
pub mod overlay;
