//! Virtual nodes (consumer side): for each `VirtualNode`, a virtual kubelet Deployment with
//! its ServiceAccount and least-privilege RBAC ([`objects`], pure), the VirtualNode's and the
//! ForeignCluster's conditions from the Node it registers ([`status`], pure), and the
//! controller that applies both and removes everything when the VirtualNode goes
//! ([`controller`]), the pods bound to the node first ([`drain`], pure); it applies the
//! objects again only when they would differ ([`applied`], pure).
pub mod applied;
pub mod controller;
pub mod drain;
pub mod objects;
pub mod status;
