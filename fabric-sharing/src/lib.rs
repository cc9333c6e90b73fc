//! The sharing layer (consumer → provider peering), see `shared/design/sharing-layer.md`:
//! what a consumer may do on its provider ([`tenant`]), the identity it holds there
//! ([`identity`]), and the controllers that build on it.
pub mod auth;
pub mod identity;
pub mod shadowpod;
pub mod tenant;
