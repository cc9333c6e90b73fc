//! The gateway's configuration: a TOML file, built by the operator, tests and benchmarks
//! with the builders here and checked by the same validation the gateway applies.

use std::{
    collections::HashSet,
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
};

use fabric_dataplane_config::{ExternalMapping, Remap};
use ipnetwork::{IpNetwork, Ipv4Network};
use serde::{Deserialize, Serialize};

use crate::key::PublicKey;

mod builder;
#[cfg(test)]
mod tests;

pub use builder::{ConfigBuilder, LeftOut, PeerBuilder};

/// 1500-byte underlay minus the worst-case WireGuard overhead (IPv6 40 + UDP 8 + WG 32 = 80).
pub const DEFAULT_MTU: u16 = 1420;
pub const DEFAULT_PORT: u16 = 51820;
pub const DEFAULT_NAME: &str = "fabric";
pub const DEFAULT_PROBE_INTERVAL: u64 = 1;
/// Linux IFNAMSIZ - 1.
pub const MAX_IFNAME: usize = 15;
/// Longest busy-poll window: beyond it a sleeping thread costs nothing measurable.
pub const MAX_BUSY_POLL_US: u64 = 1_000_000;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid config {path}: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("invalid config: {0}")]
    Invalid(#[from] Invalid),
    /// Only paths that are not UTF-8 cannot be written as TOML.
    #[error("cannot write config as TOML: {0}")]
    Serialize(#[from] toml::ser::Error),
}

/// What validation refuses, naming the offending part and what would fix it.
#[derive(Debug, thiserror::Error)]
pub enum Invalid {
    #[error("interface.name {0:?} must be 1-{MAX_IFNAME} characters of [A-Za-z0-9-_.]")]
    InterfaceName(String),
    #[error("interface.mtu {0} must be within 576..=9000")]
    Mtu(u16),
    #[error(
        "interface.busy_poll_us {0} must be at most {MAX_BUSY_POLL_US} (1 s); \
         it is how long to keep polling after traffic, 0 turns it off"
    )]
    BusyPoll(u64),
    #[error("interface.probe_interval must be at least 1 second")]
    ProbeInterval,
    #[error("peer name must not be empty")]
    EmptyPeerName,
    #[error("duplicate peer name {0:?}")]
    DuplicatePeerName(String),
    #[error("peer {peer:?}: public key {key} is used by another peer")]
    DuplicateKey { peer: String, key: PublicKey },
    #[error(
        "peer {peer:?}: device name {device:?} must be 1-{MAX_IFNAME} characters without '/' or spaces"
    )]
    DeviceName { peer: String, device: String },
    #[error("peer {peer:?}: device {device:?} is used by another peer")]
    DuplicateDevice { peer: String, device: String },
    #[error("peer {0:?}: allowed_ips is empty, so no packet from it would ever be accepted")]
    NoAllowedIps(String),
    #[error("peer {peer:?}: {net} has host bits set (did you mean {}/{}?)", net.network(), net.prefix())]
    HostBits { peer: String, net: IpNetwork },
    #[error("peer {0:?}: persistent_keepalive = 0; omit it to disable keepalives")]
    ZeroKeepalive(String),
    #[error(
        "peer {peer:?}: probe_address {probe} needs an address of the same family in `addresses` to probe from"
    )]
    ProbeWithoutSource { peer: String, probe: IpAddr },
    #[error(
        "peer {peer:?}: probe_address {probe} is outside allowed_ips, so probe replies would be dropped"
    )]
    ProbeOutsideAllowedIps { peer: String, probe: IpAddr },
    #[error("peer {0:?}: remaps and mss need a data-plane `id` (1..4095, stable for the peer)")]
    DataplaneWithoutId(String),
    #[error("peer {peer:?}: remap remote prefix {remote} is not inside allowed_ips")]
    RemapOutsideAllowedIps { peer: String, remote: Ipv4Network },
    /// The data plane's own checks (ids, overlapping prefixes, externals).
    #[error("{0}")]
    Dataplane(#[source] fabric_dataplane_config::Error),
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// This cluster's pod CIDRs: what peers of the remap data plane may reach, besides the
    /// exposed local IPs (`externals`) and their tunnel addresses. The gateway's own addresses
    /// inside them stay out of reach.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub local_cidrs: Vec<Ipv4Network>,
    pub interface: InterfaceConfig,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<PeerConfig>,
    /// Local IPs exposed to peers under an address of this cluster's external CIDR.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub externals: Vec<ExternalMapping>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct InterfaceConfig {
    /// Name of the UAPI socket (`wg show <name>`) and of the control socket.
    #[serde(default = "default_name")]
    pub name: String,
    pub private_key_file: PathBuf,
    #[serde(default = "default_port")]
    pub listen_port: u16,
    #[serde(default = "default_listen_address")]
    pub listen_address: IpAddr,
    #[serde(default = "default_mtu")]
    pub mtu: u16,
    /// Seconds between in-tunnel health probes.
    #[serde(default = "default_probe_interval")]
    pub probe_interval: u64,
    /// Where the remap data plane pins its maps. Default: /sys/fs/bpf/fabric-gw-<name>.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataplane_pin_dir: Option<PathBuf>,
    /// When non-zero, one thread serves every tunnel and keeps polling for this many
    /// microseconds after traffic before it sleeps: lower latency for more CPU.
    /// 0 (default): a reader thread per direction that sleeps until packets come.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub busy_poll_us: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PeerConfig {
    pub name: String,
    pub public_key: PublicKey,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<SocketAddr>,
    #[serde(default)]
    pub allowed_ips: Vec<IpNetwork>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_keepalive: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<IpNetwork>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<IpNetwork>,
    /// The peer gateway's own tunnel address; when set, an ICMP echo is sent
    /// to it through the tunnel (from our first `addresses` entry) to decide Up/Down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_address: Option<IpAddr>,
    /// Data-plane id of this peer (1..4095, stable): keys its remaps and counters. Needed
    /// when the gateway runs the remap data plane on the peer's device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u32>,
    /// How this cluster sees the peer's prefixes: `local` (routed to this device, unique
    /// here) stands for `remote` (the peer's real prefix, inside `allowed_ips`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remaps: Vec<Remap>,
    /// TCP MSS clamp on the device; default: the MTU minus 40.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mss: Option<u16>,
}

fn default_name() -> String {
    DEFAULT_NAME.to_string()
}
fn default_port() -> u16 {
    DEFAULT_PORT
}
fn default_listen_address() -> IpAddr {
    IpAddr::from([0, 0, 0, 0])
}
fn default_mtu() -> u16 {
    DEFAULT_MTU
}
fn default_probe_interval() -> u64 {
    DEFAULT_PROBE_INTERVAL
}
fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl InterfaceConfig {
    /// The interface with every default (what a file naming only the key file gets).
    pub fn new(private_key_file: impl Into<PathBuf>) -> Self {
        Self {
            name: default_name(),
            private_key_file: private_key_file.into(),
            listen_port: DEFAULT_PORT,
            listen_address: default_listen_address(),
            mtu: DEFAULT_MTU,
            probe_interval: DEFAULT_PROBE_INTERVAL,
            dataplane_pin_dir: None,
            busy_poll_us: 0,
        }
    }

    /// Where the data plane's maps are pinned.
    pub fn pin_dir(&self) -> PathBuf {
        self.dataplane_pin_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("/sys/fs/bpf/fabric-gw-{}", self.name)))
    }
}

impl PeerConfig {
    /// TUN device name: explicit, or `fab-` + the peer name squeezed to fit IFNAMSIZ.
    pub fn device_name(&self) -> String {
        if let Some(d) = &self.device {
            return d.clone();
        }
        let mut s: String = "fab-".into();
        for c in self.name.chars() {
            if s.len() >= MAX_IFNAME {
                break;
            }
            s.push(if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            });
        }
        s
    }

    /// Source address for health probes (our side of the tunnel).
    pub fn probe_source(&self) -> Option<IpAddr> {
        let dst = self.probe_address?;
        self.addresses
            .iter()
            .map(|a| a.ip())
            .find(|ip| ip.is_ipv4() == dst.is_ipv4())
    }
}

impl Config {
    /// The remap data plane this configuration asks for: on when any peer has an id (its
    /// device then gets the remap programs, MSS clamping and counters). Returns the pin
    /// directory and the data-plane configuration.
    pub fn dataplane(&self) -> Option<(PathBuf, fabric_dataplane_config::DataplaneConfig)> {
        if self.peers.iter().all(|p| p.id.is_none()) {
            return None;
        }
        let pin_dir = self.interface.pin_dir();
        let peers = self
            .peers
            .iter()
            .filter_map(|p| {
                Some(fabric_dataplane_config::PeerConfig {
                    name: p.name.clone(),
                    id: p.id?,
                    interface: p.device_name(),
                    mss: Some(p.mss.unwrap_or(self.interface.mtu.saturating_sub(40))),
                    tunnel_addresses: p
                        .addresses
                        .iter()
                        .filter_map(|a| match a {
                            IpNetwork::V4(a) => Some(a.ip()),
                            IpNetwork::V6(_) => None,
                        })
                        .collect(),
                    remaps: p.remaps.clone(),
                })
            })
            .collect();
        Some((
            pin_dir,
            fabric_dataplane_config::DataplaneConfig {
                local_cidrs: self.local_cidrs.clone(),
                peers,
                externals: self.externals.clone(),
            },
        ))
    }

    /// What this configuration runs as written but probably does not mean (usually nothing):
    /// for `fabric-gateway check` and the gateway's log at start and reload.
    pub fn warnings(&self) -> Vec<fabric_dataplane_config::Warning> {
        self.dataplane()
            .map(|(_, dp)| dp.warnings())
            .unwrap_or_default()
    }

    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut cfg = Self::parse(&text).map_err(|e| match e {
            ConfigError::Parse { source, .. } => ConfigError::Parse {
                path: path.to_path_buf(),
                source,
            },
            other => other,
        })?;
        // Relative key paths are relative to the config file, not the cwd of whoever started us.
        if cfg.interface.private_key_file.is_relative()
            && let Some(dir) = path.parent()
        {
            cfg.interface.private_key_file = dir.join(&cfg.interface.private_key_file);
        }
        Ok(cfg)
    }

    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|source| ConfigError::Parse {
            path: PathBuf::from("<string>"),
            source,
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The configuration file's text; [`Config::parse`] reads it back as the same value.
    pub fn to_toml(&self) -> Result<String, ConfigError> {
        Ok(toml::to_string_pretty(self)?)
    }

    pub fn validate(&self) -> Result<(), Invalid> {
        let i = &self.interface;
        if i.name.is_empty()
            || i.name.len() > MAX_IFNAME
            || !i
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(Invalid::InterfaceName(i.name.clone()));
        }
        if !(576..=9000).contains(&i.mtu) {
            return Err(Invalid::Mtu(i.mtu));
        }
        if i.busy_poll_us > MAX_BUSY_POLL_US {
            return Err(Invalid::BusyPoll(i.busy_poll_us));
        }
        if i.probe_interval == 0 {
            return Err(Invalid::ProbeInterval);
        }
        let mut names = HashSet::new();
        let mut keys = HashSet::new();
        let mut devices = HashSet::new();
        for p in &self.peers {
            let peer = || p.name.clone();
            if p.name.is_empty() {
                return Err(Invalid::EmptyPeerName);
            }
            if !names.insert(p.name.as_str()) {
                return Err(Invalid::DuplicatePeerName(peer()));
            }
            if !keys.insert(p.public_key) {
                return Err(Invalid::DuplicateKey {
                    peer: peer(),
                    key: p.public_key,
                });
            }
            let device = p.device_name();
            if device.is_empty()
                || device.len() > MAX_IFNAME
                || device.contains('/')
                || device.contains(char::is_whitespace)
            {
                return Err(Invalid::DeviceName {
                    peer: peer(),
                    device,
                });
            }
            if !devices.insert(device.clone()) {
                return Err(Invalid::DuplicateDevice {
                    peer: peer(),
                    device,
                });
            }
            if p.allowed_ips.is_empty() {
                return Err(Invalid::NoAllowedIps(peer()));
            }
            for net in p.allowed_ips.iter().chain(&p.routes) {
                if net.network() != net.ip() {
                    return Err(Invalid::HostBits {
                        peer: peer(),
                        net: *net,
                    });
                }
            }
            if p.persistent_keepalive == Some(0) {
                return Err(Invalid::ZeroKeepalive(peer()));
            }
            if let Some(probe) = p.probe_address {
                if p.probe_source().is_none() {
                    return Err(Invalid::ProbeWithoutSource {
                        peer: peer(),
                        probe,
                    });
                }
                if !p.allowed_ips.iter().any(|n| n.contains(probe)) {
                    return Err(Invalid::ProbeOutsideAllowedIps {
                        peer: peer(),
                        probe,
                    });
                }
            }
            if p.id.is_none() && (!p.remaps.is_empty() || p.mss.is_some()) {
                return Err(Invalid::DataplaneWithoutId(peer()));
            }
            for r in &p.remaps {
                // The tunnel only accepts the peer's real addresses: a remote prefix outside
                // allowed_ips could never arrive.
                if !p.allowed_ips.iter().any(|n| match n {
                    IpNetwork::V4(n) => n.is_supernet_of(r.remote),
                    IpNetwork::V6(_) => false,
                }) {
                    return Err(Invalid::RemapOutsideAllowedIps {
                        peer: peer(),
                        remote: r.remote,
                    });
                }
            }
        }
        if let Some((_, dp)) = self.dataplane() {
            dp.validate().map_err(Invalid::Dataplane)?;
        }
        Ok(())
    }
}
