//! Namespace offloading in the sharing layer: a consumer's namespace offloaded whole to its
//! providers. The consumer writes one `NamespaceMap` on each provider (in its tenant
//! namespace, with its identity) listing the namespaces offloaded there, and reads back each
//! provider's answer per twin namespace.
//!
//! - [`consumer`]: the consumer's NamespaceOffloading controller (the maps it writes, the
//!   status, the namespaces' scheduling label, unoffloading); [`offloading`] is its pure part.
pub mod consumer;
pub mod offloading;
