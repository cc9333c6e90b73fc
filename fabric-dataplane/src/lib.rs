//! Loader and typed control of the fabric eBPF data plane, shared by the agent and the gateway.
//!
//! - [`Dataplane::load`] loads the programs embedded in this crate, reusing maps pinned under
//!   the pin directory (so a restart keeps state and traffic).
//! - [`Dataplane::apply`] reconciles attachments and maps with a [`DataplaneConfig`]: pure diff
//!   in [`state`], kernel writes here. Programs go on as clsact filters at a fixed priority
//!   and handle, which outlive the process (the README's "Why clsact filters and not TCX"); a
//!   reload swaps the program inside the existing filter atomically.
//! - [`Maps::open_pinned`] + [`Maps::snapshot`] read everything without loading anything.
//!
//! Without the default `programs` feature the crate neither builds nor embeds the programs
//! (no nightly, no bpf-linker): what is left reads and writes pinned maps ([`Maps`],
//! [`Snapshot`]) and enters network namespaces ([`sys`]), which is all an inspecting tool such
//! as `fabricctl network dump` needs. The configuration types live in
//! `fabric-dataplane-config`, so the gateway's contract carries them without aya at all.

#[cfg(feature = "programs")]
pub mod bench;
mod error;
#[cfg(feature = "programs")]
pub mod guard;
#[cfg(feature = "programs")]
mod loader;
mod maps;
#[cfg(feature = "programs")]
mod pins;
mod snapshot;
pub mod state;
pub mod sys;

pub use error::Error;
pub use fabric_common::DEFAULT_PIN_DIR;
pub use fabric_dataplane_config::{DataplaneConfig, ExternalMapping, PeerConfig, Remap};
#[cfg(feature = "programs")]
pub use loader::{ADOPTED, ApplyReport, Dataplane, EBPF_OBJECT};
pub use maps::Maps;
pub use snapshot::{ExternalStatus, PeerStatus, RemapStatus, Snapshot};

/// Where our filters sit in the clsact hooks (`tc filter show dev X egress`: pref 1, handle
/// 0xfab). Fixed, so a reload finds and replaces them and a checker can tell they are there.
pub const FILTER_PRIORITY: u16 = 1;
pub const FILTER_HANDLE: u32 = 0xfab;
