//! The out-of-band authentication of a consumer to a provider (issue 10):
//! - [`protocol`]: the typed request, answer and refusals, and the request parser;
//! - [`validate`]: the token and CSR checks (pure);
pub mod consumer;
pub mod protocol;
pub mod provider;
pub mod renewal;
pub mod run;
pub mod server;
pub mod tls;
pub mod token;
pub mod validate;
