//! API group `networking.fabric.io`: the tunnels between clusters and how each sees the other's
//! networks ([`remap`]: the address translation a peer's Configuration records).
pub mod remap;
pub mod v1alpha1;

pub const GROUP: &str = "networking.fabric.io";
