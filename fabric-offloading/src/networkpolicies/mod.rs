//! The provider's side of a consumer's NetworkPolicies (issue 20): each ShadowNetworkPolicy
//! a consumer writes in its twin (or tenant) namespace becomes a real NetworkPolicy of the
//! same name there ([`translate`], pure: address blocks remapped through this cluster's view
//! of the consumer, whatever is not the consumer's own refused), written and removed by
//! [`controller`].
pub mod controller;
pub mod translate;
