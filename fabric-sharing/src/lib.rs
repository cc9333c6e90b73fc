//! The sharing layer (consumer → provider peering), see `shared/design/sharing-layer.md`:
//! what a consumer may do on its provider ([`tenant`]), the identity it holds there
//! ([`identity`]), and the negotiation over that identity ([`negotiation`]): the network
//! ([`network`]) and resources ([`slices`], decided by the provider's [`policy`]), and its end ([`unpeer`]).
pub mod auth;
pub mod identity;
pub mod kit;
pub mod negotiation;
pub mod network;
pub mod policy;
pub mod shadowpod;
pub mod slices;
pub mod tenant;
pub mod unpeer;
pub mod virtual_node;
