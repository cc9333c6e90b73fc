//! Cluster-level controllers of the fabric.
pub mod ipam;
