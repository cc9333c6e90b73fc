//! The provider's side of a consumer's Services (issue 20): each ShadowEndpointSlice a
//! consumer writes in its twin (or tenant) namespace becomes a real EndpointSlice of the
//! same name there, every address remapped through this cluster's view of the consumer
//! ([`translate`], pure), written and removed by [`controller`].
pub mod controller;
pub mod translate;
