//! The sharing layer (consumer → provider peering), see `shared/design/sharing-layer.md`:
//! what a consumer may do on its provider ([`tenant`]), the identity it holds there
//! ([`identity`]), the provider's offer policy ([`policy`]), and the controllers that build on
//! it.
pub mod auth;
pub mod identity;
pub mod policy;
pub mod quantity;
pub mod shadowpod;
pub mod tenant;
