//! The sharing layer (consumer → provider peering), see `shared/design/sharing-layer.md`:
//! what a consumer may do on its provider ([`tenant`]), and the controllers that build on it.
pub mod tenant;
