//! Authentication in the sharing layer (consumer → provider peering), see
//! `shared/design/sharing-layer.md` and `docs/authentication.md`: how a consumer gets an
//! identity of its own on a provider, what that identity is, and what it may do there.
//!
//! - [`protocol`]: the typed request, answer and refusals, and the request parser;
//! - [`validate`]: the token and CSR checks (pure); [`token`]: peering tokens and the peer
//!   command that carries one;
//! - [`server`], [`provider`], [`run`]: the provider's HTTPS service (on
//!   `fabric_http::https`, with its limits) that checks a request and creates the consumer's
//!   tenant area; [`tls`]: its certificate and how a consumer trusts it (pinned);
//!   [`approver`]: the controller, in a process that faces no one, that approves its CSRs;
//! - [`consumer`], [`renewal`]: the consumer's client, and its certificate renewed in time;
//! - [`identity`]: the identity a consumer holds (a kubeconfig in a Secret) and a client from
//!   it; [`tenant`]: the consumer's area on its provider and what its identity may do there.
//!
//! The bottom of the sharing crates: `fabric-negotiation` reaches a provider with the
//! identities held here and removes the tenant areas made here; `fabric-offloading` needs
//! none of it (the virtual kubelet, which does, uses both).
pub mod approver;
pub mod consumer;
pub mod identity;
pub mod protocol;
pub mod provider;
pub mod renewal;
pub mod run;
pub mod server;
pub mod tenant;
pub mod tls;
pub mod token;
pub mod validate;
