//! The virtual kubelet: one process per `VirtualNode` (run as a Deployment by the VirtualNode
//! controller of `fabric-offloading`), standing for a provider cluster as a Node of this one.
//!
//! - [`conditions`]: whether the node is Ready (pure, injected clock);
//! - [`node`]: the Node and its Lease as written (pure);
//! - [`provider`]: the provider's API through this cluster's identity, and its probe;
//! - [`run`]: the watches, registration, status and Lease heartbeat;
//! - [`heartbeat`]: at-most-once semantics (opt-in): the heartbeat Lease on the provider, and
//!   when the pods there may be declared stopped;
//! - [`pods`]: pods bound to the node run on the provider as ShadowPods, status home;
//! - [`configs`], [`services`], [`endpointslices`], [`networkpolicies`]: what offloaded
//!   namespaces hold, reflected into their twins; [`home_api`]: the home API server's Service there;
//! - [`storage`]: claims of offloaded namespaces whose first consumer lands on the node,
//!   provisioned in their twins, a placeholder volume at home pinning later consumers here;
//! - [`tokens`]: the service-account tokens of offloaded pods, requested at home and kept as
//!   Secrets in the twins;
//! - [`server`]: the kubelet API (logs, exec, attach, port-forward) proxied to the provider.
pub mod conditions;
pub mod configs;
pub mod custom;
pub mod endpointslices;
pub mod events;
pub mod heartbeat;
pub mod home_api;
pub mod networkpolicies;
pub mod node;
pub mod pods;
pub mod provider;
pub mod run;
pub mod server;
pub mod services;
pub mod storage;
pub mod tokens;

/// The one field manager of everything the virtual kubelet writes (its Node, Lease and the
/// status of its pods).
pub const FIELD_MANAGER: fabric_kube::FieldManager =
    fabric_kube::FieldManager(fabric_api::names::field_manager::VIRTUAL_KUBELET);
