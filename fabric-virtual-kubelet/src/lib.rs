//! The virtual kubelet: one process per `VirtualNode` (run as a Deployment by the VirtualNode
//! controller of `fabric-sharing`), standing for a provider cluster as a Node of this one.
//!
//! - [`conditions`]: whether the node is Ready (pure, injected clock);
//! - [`node`]: the Node and its Lease as written (pure);
//! - [`provider`]: the provider's API through this cluster's identity, and its probe;
//! - [`run`]: the watches, registration, status and Lease heartbeat.
//!
//! Pod offloading (ShadowPods) and the kubelet API server for logs and exec come as modules
//! of their own beside [`run`], on the same watches and provider client.
pub mod conditions;
pub mod node;
pub mod provider;
pub mod run;
