//! The data plane's error type: every failure names what it was doing (map, program,
//! interface or file) so that the agent's and the gateway's logs say where it went wrong.
use std::{io, path::PathBuf};

use aya::maps::MapError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("interface {name}: {reason}")]
    Interface { name: String, reason: String },
    #[error("BPF filesystem: {0}")]
    BpfFs(String),
    #[error("loading the eBPF object")]
    Load(#[from] aya::EbpfError),
    #[error("map {map}")]
    Map {
        map: &'static str,
        #[source]
        source: MapError,
    },
    #[error("{what}")]
    Program {
        what: String,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("pinning {what}")]
    Pin {
        what: String,
        #[source]
        source: aya::pin::PinError,
    },
    #[error("no fabric data plane is pinned at {0}; run `fabric-agent datapath apply` first")]
    NotLoaded(PathBuf),
    #[error(transparent)]
    Netns(#[from] fabric_netns::Error),
}

impl Error {
    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }
    pub(crate) fn map(map: &'static str) -> impl FnOnce(MapError) -> Self {
        move |source| Error::Map { map, source }
    }
    #[cfg(feature = "programs")]
    pub(crate) fn prog(
        what: impl Into<String>,
    ) -> impl FnOnce(aya::programs::ProgramError) -> Self {
        let what = what.into();
        move |source| Error::Program { what, source }
    }
}

/// Validation refusing a configuration reads as it always did: `invalid configuration: ...`.
impl From<fabric_dataplane_config::Error> for Error {
    fn from(fabric_dataplane_config::Error(m): fabric_dataplane_config::Error) -> Self {
        Error::Config(m)
    }
}
