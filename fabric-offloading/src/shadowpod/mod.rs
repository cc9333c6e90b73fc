//! Offloaded pods (issue 11, provider side): the ShadowPod a consumer's pod becomes
//! ([`forge`], called by the consumer's virtual kubelet) and the provider's controller that
//! runs its real pod ([`decide`], [`controller`]); what the provider lets a tenant's pod do
//! ([`policy`], judged by the webhook and again by the controller); what its admission
//! webhook admits ([`admission`]) and the webhook itself ([`webhook`]); the opt-in at-most-once semantics
//! that stop a silent consumer's pods ([`partition`], pure, and [`fence`]); how long a
//! tenant's ShadowPods stay once drained or finished ([`lifetime`], pure, [`drainer`] and
//! [`controller`]).
//!
//! The real pod lives in the ShadowPod's own namespace, under the same name: the tenant
//! namespace today; twin namespaces (offloaded namespaces, a later issue) carry the
//! consumer's label and Role the same way.
pub mod admission;
pub mod claims;
pub mod controller;
pub mod decide;
pub mod drainer;
pub mod fence;
pub mod forge;
pub mod lifetime;
pub mod partition;
pub mod policy;
pub mod quota;
pub mod resize;
pub mod webhook;
