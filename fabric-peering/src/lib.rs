//! Peering two clusters through the fabric, as a library over two `kube::Client`s: used by
//! `fabricctl peer`/`unpeer` and by the peering controllers.
//!
//! [`peer`] reads both clusters' identity (the `fabric-cluster` ConfigMap), makes sure each
//! gateway has a key (Secret `fabric-gateway-key`), waits for each gateway operator to publish
//! its public key and endpoint (`fabric-gateway-identity`), creates on each side what
//! [`plan::plan`] says (a `Configuration` with the peer's real CIDRs, its `PublicKey`, and a
//! `GatewayClient` or `GatewayServer`), then waits for each IPAM to grant the CIDRs the peer is
//! seen under and for the tunnel to be up in both directions. [`unpeer`] deletes them and waits
//! until IPAM and the gateways have let go. Progress is reported as [`Event`]s to a
//! [`Progress`]; failures are [`Error`]s that say what to check.
//!
//! What to create is a pure function ([`plan`]); the API calls live in [`cluster`].
use std::fmt;

pub mod cluster;
mod error;
mod peering;
pub mod plan;

pub use cluster::Cluster;
pub use error::{Action, Error, Wait};
pub use peering::{PeerOptions, Peered, peer, unpeer};

/// Which of the two clusters: the one the caller acts from, or its peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    Local,
    Remote,
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::Local => "local",
            Side::Remote => "remote",
        })
    }
}

/// A step of [`peer`] or [`unpeer`], reported when it starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    GatewayKeys,
    CreatingObjects,
    WaitingForIpam,
    WaitingForTunnel,
    Releasing(Side),
}

/// What [`peer`] and [`unpeer`] report as they go.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Started(Step),
    /// Both gateways have a key and have published it with their endpoint.
    GatewaysKnown {
        local: fabric_api::identity::GatewayIdentity,
        remote: fabric_api::identity::GatewayIdentity,
    },
    /// Configuration, PublicKey and gateway endpoint exist on both sides.
    ObjectsCreated,
    /// Each IPAM granted the CIDRs the other side's networks are seen under.
    Granted(Views),
    /// The tunnel is up as seen from both sides, with each side's probe latency.
    Connected {
        local_latency: Option<String>,
        remote_latency: Option<String>,
    },
    /// One side holds nothing about the other any more.
    Released(Side),
}

/// How each side sees the other's networks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Views {
    /// The remote cluster's CIDRs as seen in the local one.
    pub local: fabric_api::networking::v1alpha1::ClusterCidrs,
    /// The local cluster's CIDRs as seen in the remote one.
    pub remote: fabric_api::networking::v1alpha1::ClusterCidrs,
}

/// Receives the [`Event`]s of a peering (a CLI prints them, a controller records them).
pub trait Progress {
    fn event(&mut self, event: &Event);
}

impl<F: FnMut(&Event)> Progress for F {
    fn event(&mut self, event: &Event) {
        self(event)
    }
}

/// Ignores every event.
pub struct Quiet;

impl Progress for Quiet {
    fn event(&mut self, _: &Event) {}
}
