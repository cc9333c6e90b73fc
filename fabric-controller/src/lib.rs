//! Cluster-level controllers of the fabric.
pub mod gateway;
pub mod ipam;
pub mod ips;
