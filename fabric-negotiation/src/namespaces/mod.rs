//! Namespace offloading in the sharing layer: a consumer's namespace offloaded whole to its
//! providers. The consumer writes one `NamespaceMap` on each provider (in its tenant
//! namespace, with its identity) listing the namespaces offloaded there, and reads back each
//! provider's answer per twin namespace.
//!
//! - [`consumer`]: the consumer's NamespaceOffloading controller (the maps it writes, the
//!   status, the namespaces' scheduling label, unoffloading); [`offloading`] is its pure part.
//! - [`twins`]: the provider's side, pure: which twin namespace each mapping of a map gets
//!   (reserved names, names it did not make, duplicates, a limit per tenant), which twins go,
//!   the map's status; the objects of a twin (the tenant's rights bound there as in its tenant
//!   namespace); [`provider`] is its I/O edge, the NamespaceMap controller (twins made, kept,
//!   removed; the map's finalizer), also used by the unpeering of a consumer.
pub mod consumer;
pub mod offloading;
pub mod provider;
pub mod retention;
pub mod twins;
