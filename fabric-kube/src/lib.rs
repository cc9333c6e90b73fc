//! The controllers' kit: what every fabric controller (and the coming peering controllers and
//! virtual kubelet) needs from the Kubernetes API besides its own reconcile logic.
//!
//! - [`controller`]: a kube-runtime `Controller` run with signal shutdown, a per-object
//!   back-off and uniform logs; finalizers that return the reconcile's own error.
//! - [`cache`]: reflector-backed watch caches.
//! - [`election`]: Lease leader election. The policy ([`election::verdict`]) is a pure
//!   function of what was observed and an injected clock; [`lease`] is its thin I/O edge,
//!   and runs work only while this replica leads ([`lease::run_elected`]).
//! - [`status`]: server-side apply of objects and status subresources under one field manager
//!   per controller, and conditions decided as typed verdicts ([`status::Verdict`]).
//! - [`events`]: Kubernetes Events on the objects a controller reports about.
//! - [`written`]: our own writes standing in for a watch cache that has not shown them yet.
//! - [`meta`]: finalizers added and removed safely, deletes where "gone" is fine, how long an
//!   object has been deleting or alive.
//!
//! The metrics/health HTTP server is not here but in `fabric-http`: the gateway serves it
//! too and must not link kube.
pub mod cache;
pub mod client_ca;
pub mod controller;
pub mod election;
pub mod events;
pub mod lease;
pub mod meta;
pub mod status;
pub mod written;

pub use lease::Election;
pub use status::FieldManager;
