//! API group `core.fabric.io`: the clusters this one knows, and what it does with each.
pub mod v1alpha1;

pub const GROUP: &str = "core.fabric.io";
