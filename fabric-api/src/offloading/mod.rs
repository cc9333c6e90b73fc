//! API group `offloading.fabric.io`: running this cluster's workloads on its providers (the
//! virtual nodes that stand for them, and which of a provider's labels they carry).
pub mod at_most_once;
pub mod lent;
pub mod namespaces;
pub mod node_labels;
pub mod v1alpha1;
pub mod volumes;

pub const GROUP: &str = "offloading.fabric.io";
