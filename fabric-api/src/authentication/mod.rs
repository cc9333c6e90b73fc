//! API group `authentication.fabric.io`: who a peer is to this cluster (its `Tenant` on a
//! provider, the `Identity` a consumer holds), and what it asked for and got
//! (`ResourceSlice`).
pub mod v1alpha1;

pub const GROUP: &str = "authentication.fabric.io";
pub mod mode;
