//! The contract between the fabric gateway and whoever drives it (the gateway operator, the
//! CLI, tests and benchmarks): its configuration (TOML, with builders and validation), its
//! status, WireGuard key types and the typed control protocol spoken on its control socket.
//!
//! Nothing here links boringtun: a controller can build, check and send what the gateway
//! runs without carrying the gateway itself.

pub mod config;
pub mod control;
pub mod key;
pub mod status;

pub use config::{Config, ConfigError, InterfaceConfig, Invalid, LeftOut, PeerConfig};
pub use control::{ControlError, ErrorKind, Reply, Request, Response};
pub use key::{KeyError, PrivateKey, PublicKey};
pub use status::Status;
