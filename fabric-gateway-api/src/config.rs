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
    /// A peer with nothing but its name and key; see [`PeerBuilder`].
    pub fn builder(name: impl Into<String>, public_key: PublicKey) -> PeerBuilder {
        PeerBuilder(Self {
            name: name.into(),
            public_key,
            endpoint: None,
            allowed_ips: Vec::new(),
            persistent_keepalive: None,
            device: None,
            addresses: Vec::new(),
            routes: Vec::new(),
            probe_address: None,
            id: None,
            remaps: Vec::new(),
            mss: None,
        })
    }

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

/// Builds a [`PeerConfig`]; the configuration it goes into validates it.
#[derive(Debug, Clone)]
#[must_use]
pub struct PeerBuilder(PeerConfig);

impl PeerBuilder {
    pub fn endpoint(mut self, endpoint: SocketAddr) -> Self {
        self.0.endpoint = Some(endpoint);
        self
    }
    pub fn allowed_ip(mut self, net: impl Into<IpNetwork>) -> Self {
        self.0.allowed_ips.push(net.into());
        self
    }
    pub fn allowed_ips<N: Into<IpNetwork>>(mut self, nets: impl IntoIterator<Item = N>) -> Self {
        self.0.allowed_ips.extend(nets.into_iter().map(Into::into));
        self
    }
    pub fn persistent_keepalive(mut self, seconds: u16) -> Self {
        self.0.persistent_keepalive = Some(seconds);
        self
    }
    pub fn device(mut self, device: impl Into<String>) -> Self {
        self.0.device = Some(device.into());
        self
    }
    /// An address of ours on the peer's device.
    pub fn address(mut self, net: impl Into<IpNetwork>) -> Self {
        self.0.addresses.push(net.into());
        self
    }
    pub fn route(mut self, net: impl Into<IpNetwork>) -> Self {
        self.0.routes.push(net.into());
        self
    }
    pub fn routes<N: Into<IpNetwork>>(mut self, nets: impl IntoIterator<Item = N>) -> Self {
        self.0.routes.extend(nets.into_iter().map(Into::into));
        self
    }
    pub fn probe_address(mut self, ip: impl Into<IpAddr>) -> Self {
        self.0.probe_address = Some(ip.into());
        self
    }
    pub fn id(mut self, id: u32) -> Self {
        self.0.id = Some(id);
        self
    }
    /// `local` (how this cluster sees it) stands for the peer's real prefix `remote`.
    pub fn remap(mut self, local: Ipv4Network, remote: Ipv4Network) -> Self {
        self.0.remaps.push(Remap { local, remote });
        self
    }
    pub fn mss(mut self, mss: u16) -> Self {
        self.0.mss = Some(mss);
        self
    }
    pub fn build(self) -> PeerConfig {
        self.0
    }
}

/// Builds a [`Config`], validated by [`ConfigBuilder::build`].
#[derive(Debug, Clone)]
#[must_use]
pub struct ConfigBuilder(Config);

impl ConfigBuilder {
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.0.interface.name = name.into();
        self
    }
    pub fn listen_port(mut self, port: u16) -> Self {
        self.0.interface.listen_port = port;
        self
    }
    pub fn listen_address(mut self, ip: impl Into<IpAddr>) -> Self {
        self.0.interface.listen_address = ip.into();
        self
    }
    pub fn mtu(mut self, mtu: u16) -> Self {
        self.0.interface.mtu = mtu;
        self
    }
    pub fn probe_interval(mut self, seconds: u64) -> Self {
        self.0.interface.probe_interval = seconds;
        self
    }
    pub fn dataplane_pin_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.0.interface.dataplane_pin_dir = Some(dir.into());
        self
    }
    pub fn busy_poll_us(mut self, us: u64) -> Self {
        self.0.interface.busy_poll_us = us;
        self
    }
    pub fn peer(mut self, peer: PeerConfig) -> Self {
        self.0.peers.push(peer);
        self
    }
    pub fn peers(mut self, peers: impl IntoIterator<Item = PeerConfig>) -> Self {
        self.0.peers.extend(peers);
        self
    }
    /// A pod CIDR of this cluster, which peers may reach.
    pub fn local_cidr(mut self, net: Ipv4Network) -> Self {
        self.0.local_cidrs.push(net);
        self
    }
    /// Local `internal` reachable by peers as `external` (of this cluster's external CIDR).
    pub fn external(mut self, external: Ipv4Network, internal: Ipv4Network) -> Self {
        self.0
            .externals
            .push(ExternalMapping { external, internal });
        self
    }
    pub fn build(self) -> Result<Config, ConfigError> {
        self.0.validate()?;
        Ok(self.0)
    }

    /// Builds what can run: the interface must be valid, but a peer or an exposed IP that
    /// would make the configuration invalid (alone, or beside those taken before it: a key,
    /// device, id or prefix already in use) is left out and returned with the reason, so one
    /// bad peer never takes the others down. Peers are taken in the order they were added,
    /// then the exposed IPs: give the ones that ran first first, so that a newcomer colliding
    /// with them is the one left out.
    pub fn build_per_peer(self) -> Result<(Config, Vec<LeftOut>), ConfigError> {
        let Config {
            local_cidrs,
            interface,
            peers,
            externals,
        } = self.0;
        let mut cfg = Config {
            local_cidrs,
            interface,
            peers: Vec::new(),
            externals: Vec::new(),
        };
        cfg.validate()?;
        // What every peer's data plane would share: checked once here, so that a bad local
        // CIDR is reported as the configuration's fault and not each peer's.
        fabric_dataplane_config::DataplaneConfig {
            local_cidrs: cfg.local_cidrs.clone(),
            peers: Vec::new(),
            externals: Vec::new(),
        }
        .validate()
        .map_err(Invalid::Dataplane)?;
        let mut left = Vec::new();
        for p in peers {
            cfg.peers.push(p);
            if let Err(reason) = cfg.validate() {
                let p = cfg.peers.pop().expect("just pushed");
                left.push(LeftOut::Peer {
                    name: p.name,
                    reason,
                });
            }
        }
        for e in externals {
            cfg.externals.push(e);
            if let Err(reason) = cfg.validate() {
                let mapping = cfg.externals.pop().expect("just pushed");
                left.push(LeftOut::External { mapping, reason });
            }
        }
        Ok((cfg, left))
    }
}

/// What [`ConfigBuilder::build_per_peer`] left out of a configuration, and why.
#[derive(Debug)]
pub enum LeftOut {
    Peer {
        name: String,
        reason: Invalid,
    },
    External {
        mapping: ExternalMapping,
        reason: Invalid,
    },
}

impl Config {
    /// A configuration with the interface's defaults and no peers.
    pub fn builder(private_key_file: impl Into<PathBuf>) -> ConfigBuilder {
        ConfigBuilder(Self {
            interface: InterfaceConfig::new(private_key_file),
            local_cidrs: Vec::new(),
            peers: Vec::new(),
            externals: Vec::new(),
        })
    }

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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const KEY: &str = "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=";
    const KEY2: &str = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=";

    // Hand-written on purpose: files written by people (and by older operators) keep parsing.
    fn base() -> String {
        format!(
            r#"
[interface]
private_key_file = "/etc/fabric/key"
listen_port = 51821

[[peers]]
name = "cluster-b"
public_key = "{KEY}"
endpoint = "192.168.7.2:51820"
allowed_ips = ["10.244.0.0/16", "10.70.0.0/16", "169.254.100.0/30"]
persistent_keepalive = 25
addresses = ["169.254.100.1/30"]
routes = ["10.71.0.0/16"]
probe_address = "169.254.100.2"
"#
        )
    }

    fn key(s: &str) -> PublicKey {
        PublicKey::from_base64(s).unwrap()
    }

    fn net(s: &str) -> IpNetwork {
        s.parse().unwrap()
    }

    fn v4(s: &str) -> Ipv4Network {
        s.parse().unwrap()
    }

    /// `base()`, built instead of written.
    fn built() -> Config {
        Config::builder("/etc/fabric/key")
            .listen_port(51821)
            .peer(
                PeerConfig::builder("cluster-b", key(KEY))
                    .endpoint("192.168.7.2:51820".parse().unwrap())
                    .allowed_ips(["10.244.0.0/16", "10.70.0.0/16", "169.254.100.0/30"].map(net))
                    .persistent_keepalive(25)
                    .address(net("169.254.100.1/30"))
                    .route(net("10.71.0.0/16"))
                    .probe_address("169.254.100.2".parse::<IpAddr>().unwrap())
                    .build(),
            )
            .build()
            .unwrap()
    }

    #[test]
    fn parses_full_example_with_defaults() {
        let c = Config::parse(&base()).unwrap();
        assert_eq!(c.interface.mtu, DEFAULT_MTU);
        assert_eq!(c.interface.name, "fabric");
        assert_eq!(c.interface.listen_port, 51821);
        let p = &c.peers[0];
        assert_eq!(p.device_name(), "fab-cluster-b");
        assert_eq!(p.endpoint, Some("192.168.7.2:51820".parse().unwrap()));
        assert_eq!(p.allowed_ips.len(), 3);
        assert_eq!(p.persistent_keepalive, Some(25));
        assert_eq!(p.probe_source(), Some("169.254.100.1".parse().unwrap()));
    }

    #[test]
    fn the_builders_make_what_the_file_says() {
        assert_eq!(built(), Config::parse(&base()).unwrap());
    }

    #[test]
    fn to_toml_round_trips_and_leaves_defaults_out() {
        let mut c = built();
        c.peers[0] = PeerConfig {
            id: Some(3),
            mss: Some(1300),
            device: Some("tun-b".into()),
            remaps: vec![Remap {
                local: v4("10.64.0.0/16"),
                remote: v4("10.244.0.0/16"),
            }],
            ..c.peers[0].clone()
        };
        c.externals.push(ExternalMapping {
            external: v4("10.70.0.1/32"),
            internal: v4("192.168.1.5/32"),
        });
        c.interface.dataplane_pin_dir = Some("/sys/fs/bpf/x".into());
        c.interface.busy_poll_us = 20_000;
        c.local_cidrs.push(v4("10.244.0.0/16"));
        let text = c.to_toml().unwrap();
        assert_eq!(Config::parse(&text).unwrap(), c, "{text}");
        // The data plane learns what peers may reach: the pod CIDRs and the tunnel address.
        let (_, dp) = c.dataplane().unwrap();
        assert_eq!(dp.local_cidrs, [v4("10.244.0.0/16")]);
        assert_eq!(
            dp.peers[0].tunnel_addresses,
            ["169.254.100.1".parse::<std::net::Ipv4Addr>().unwrap()]
        );
        let plain = Config::builder("/k").build().unwrap().to_toml().unwrap();
        for absent in [
            "[[peers]]",
            "dataplane_pin_dir",
            "busy_poll_us",
            "externals",
            "local_cidrs",
        ] {
            assert!(!plain.contains(absent), "{absent} in {plain}");
        }
    }

    #[test]
    fn the_builder_validates() {
        let e = Config::builder("/k").mtu(100).build().unwrap_err();
        assert!(matches!(e, ConfigError::Invalid(Invalid::Mtu(100))), "{e}");
        let peer = PeerConfig::builder("b", key(KEY)).build();
        let e = Config::builder("/k").peer(peer).build().unwrap_err();
        assert!(
            matches!(&e, ConfigError::Invalid(Invalid::NoAllowedIps(p)) if p == "b"),
            "{e}"
        );
    }

    #[test]
    fn busy_poll_defaults_off_and_is_bounded() {
        assert_eq!(Config::parse(&base()).unwrap().interface.busy_poll_us, 0);
        let on = base().replace("[interface]\n", "[interface]\nbusy_poll_us = 20000\n");
        assert_eq!(Config::parse(&on).unwrap().interface.busy_poll_us, 20_000);
        let e = err(&base().replace("[interface]\n", "[interface]\nbusy_poll_us = 5000000\n"));
        assert!(e.contains("busy_poll_us") && e.contains("at most"), "{e}");
    }

    #[test]
    fn derived_device_name_fits_ifnamsiz() {
        let c = Config::parse(&base().replace("cluster-b", "a-very-long-cluster-name.example"))
            .unwrap();
        let d = c.peers[0].device_name();
        assert_eq!(d.len(), MAX_IFNAME);
        assert_eq!(d, "fab-a-very-long");
    }

    fn err(text: &str) -> String {
        Config::parse(text).unwrap_err().to_string()
    }

    #[test]
    fn bad_key_is_reported() {
        let e = err(&base().replace(KEY, "nope"));
        assert!(e.contains("public_key") && e.contains("base64"), "{e}");
    }

    #[test]
    fn bad_cidr_is_reported() {
        let e = err(&base().replace("10.244.0.0/16", "10.244.0.0/33"));
        assert!(
            e.contains("allowed_ips") || e.contains("10.244.0.0/33"),
            "{e}"
        );
        let e = err(&base().replace("10.244.0.0/16", "10.244.1.0/16"));
        assert!(e.contains("host bits"), "{e}");
    }

    #[test]
    fn unknown_field_and_bad_endpoint_are_reported() {
        let e = err(&base().replace("persistent_keepalive", "persistant_keepalive"));
        assert!(e.contains("persistant_keepalive"), "{e}");
        let e = err(&base().replace("192.168.7.2:51820", "192.168.7.2"));
        assert!(
            e.contains("endpoint") || e.contains("socket address"),
            "{e}"
        );
    }

    #[test]
    fn duplicates_are_rejected() {
        let dup = format!(
            "{}\n[[peers]]\nname = \"cluster-b\"\npublic_key = \"{KEY2}\"\nallowed_ips = [\"10.1.0.0/16\"]\n",
            base()
        );
        assert!(err(&dup).contains("duplicate peer name"));
        let dupkey = format!(
            "{}\n[[peers]]\nname = \"c\"\npublic_key = \"{KEY}\"\nallowed_ips = [\"10.1.0.0/16\"]\n",
            base()
        );
        assert!(err(&dupkey).contains("used by another peer"));
        let dupdev = format!(
            "{}\n[[peers]]\nname = \"c\"\ndevice = \"fab-cluster-b\"\npublic_key = \"{KEY2}\"\nallowed_ips = [\"10.1.0.0/16\"]\n",
            base()
        );
        assert!(err(&dupdev).contains("device"));
    }

    #[test]
    fn probe_requires_source_and_allowed_ip() {
        let e = err(&base().replace("addresses = [\"169.254.100.1/30\"]", ""));
        assert!(e.contains("probe_address"), "{e}");
        let e = err(&base().replace(", \"169.254.100.0/30\"", ""));
        assert!(e.contains("outside allowed_ips"), "{e}");
    }

    #[test]
    fn too_long_device_and_empty_allowed_ips_rejected() {
        let e = err(&base().replace("routes =", "device = \"0123456789abcdefg\"\nroutes ="));
        assert!(e.contains("device name"), "{e}");
        let e = err(&base()
            .replace(
                "allowed_ips = [\"10.244.0.0/16\", \"10.70.0.0/16\", \"169.254.100.0/30\"]",
                "allowed_ips = []",
            )
            .replace("probe_address = \"169.254.100.2\"", ""));
        assert!(e.contains("allowed_ips is empty"), "{e}");
    }

    #[test]
    fn data_plane_checks_apply() {
        let b = PeerConfig::builder("b", key(KEY))
            .allowed_ip(net("10.244.0.0/16"))
            .id(1)
            .remap(v4("10.64.0.0/16"), v4("10.244.0.0/16"));
        let c = PeerConfig::builder("c", key(KEY2))
            .allowed_ip(net("10.244.0.0/16"))
            .id(1)
            .build();
        let e = Config::builder("/k")
            .peers([b.clone().build(), c])
            .build()
            .unwrap_err();
        assert!(
            matches!(e, ConfigError::Invalid(Invalid::Dataplane(_))),
            "{e}"
        );
        let e = Config::builder("/k")
            .peer(b.remap(v4("10.65.0.0/16"), v4("10.99.0.0/16")).build())
            .build()
            .unwrap_err();
        assert!(
            matches!(
                e,
                ConfigError::Invalid(Invalid::RemapOutsideAllowedIps { .. })
            ),
            "{e}"
        );
    }

    #[test]
    fn a_bad_peer_is_left_out_and_the_others_run() {
        const KEY3: &str = "4FKGzrAgVEc3Blh5kqt8NA1LODvMFMnZXsQ/1S3DTFA=";
        let good = |name: &str, k: &str, id: u32, seen: &str, real: &str| {
            PeerConfig::builder(name, key(k))
                .allowed_ip(net(real))
                .id(id)
                .remap(v4(seen), v4(real))
                .build()
        };
        let b = good("b", KEY, 1, "10.64.0.0/16", "10.244.0.0/16");
        // The same key as b: handshakes could not tell them apart.
        let same_key = good("x", KEY, 2, "10.66.0.0/16", "10.244.0.0/16");
        // Its pod and external CIDRs overlap: an address would stand for two.
        let overlapping = PeerConfig::builder("y", key(KEY2))
            .allowed_ips([net("10.90.0.0/16")])
            .id(3)
            .remap(v4("10.90.0.0/16"), v4("10.90.0.0/16"))
            .remap(v4("10.91.0.0/24"), v4("10.90.0.0/24"))
            .build();
        // Invalid on its own.
        let no_allowed = PeerConfig::builder("z", key(KEY3)).build();
        let c = good("c", KEY3, 4, "10.67.0.0/16", "10.244.0.0/16");
        let builder = Config::builder("/k")
            .local_cidr(v4("10.244.0.0/16"))
            .peers([b.clone(), same_key, overlapping, no_allowed, c.clone()])
            .external(v4("10.70.0.1/32"), v4("192.168.1.5/32"))
            // The same local IP exposed twice.
            .external(v4("10.70.0.2/32"), v4("192.168.1.5/32"));
        // All at once, nothing would run.
        assert!(builder.clone().build().is_err());
        let (cfg, left) = builder.build_per_peer().unwrap();
        assert_eq!(cfg.peers, [b, c]);
        assert_eq!(cfg.externals.len(), 1);
        assert_eq!(cfg.externals[0].external, v4("10.70.0.1/32"));
        let names: Vec<String> = left
            .iter()
            .map(|l| match l {
                LeftOut::Peer { name, reason } => format!("{name}: {reason}"),
                LeftOut::External { mapping, reason } => {
                    format!("{}: {reason}", mapping.external)
                }
            })
            .collect();
        assert_eq!(names.len(), 4, "{names:#?}");
        assert!(names[0].starts_with("x: ") && names[0].contains("used by another peer"));
        assert!(names[1].starts_with("y: ") && names[1].contains("overlap"));
        assert!(names[2].starts_with("z: ") && names[2].contains("allowed_ips is empty"));
        assert!(names[3].starts_with("10.70.0.2/32: ") && names[3].contains("overlap"));
        assert!(cfg.validate().is_ok());
        // The interface itself is no peer's fault: that still fails as a whole.
        let e = Config::builder("/k").mtu(1).build_per_peer().unwrap_err();
        assert!(matches!(e, ConfigError::Invalid(Invalid::Mtu(1))), "{e}");
        let e = Config::builder("/k")
            .local_cidr(v4("10.244.1.0/16"))
            .build_per_peer()
            .unwrap_err();
        assert!(e.to_string().contains("host bits"), "{e}");
    }

    fn arb_v4() -> impl Strategy<Value = Ipv4Network> {
        (any::<u32>(), 1u8..=32).prop_map(|(ip, len)| {
            let n = Ipv4Network::new(ip.into(), len).unwrap();
            Ipv4Network::new(n.network(), len).unwrap()
        })
    }

    fn arb_peer(i: usize) -> impl Strategy<Value = PeerConfig> {
        (
            any::<[u8; 32]>(),
            proptest::option::of(any::<(u32, u16)>()),
            proptest::collection::vec(arb_v4(), 0..3),
            proptest::option::of(1u16..),
            proptest::option::of("[a-z]{1,11}"),
            proptest::collection::vec(arb_v4(), 0..3),
            proptest::option::of(1u32..4095),
            proptest::option::of(88u16..9000),
        )
            .prop_map(
                move |(k, ep, allowed, keepalive, device, routes, id, mss)| {
                    let mut p = PeerConfig::builder(format!("peer-{i}"), PublicKey::from_bytes(k))
                        .allowed_ip(v4("10.0.0.0/8"))
                        .allowed_ips(allowed)
                        .routes(routes);
                    if let Some((ip, port)) = ep {
                        p = p.endpoint(SocketAddr::from((std::net::Ipv4Addr::from(ip), port)));
                    }
                    if let Some(k) = keepalive {
                        p = p.persistent_keepalive(k);
                    }
                    if let Some(d) = device {
                        p = p.device(format!("d{i}{d}"));
                    }
                    if let Some(id) = id {
                        p = p.id(id).mss(mss.unwrap_or(1380));
                    }
                    p.build()
                },
            )
    }

    proptest! {
        /// Whatever the builders make (valid or not), its TOML reads back as the same value.
        #[test]
        fn built_configurations_round_trip(
            name in "[a-z][a-z0-9._-]{0,14}",
            port in any::<u16>(),
            mtu in 576u16..=9000,
            busy in 0u64..=MAX_BUSY_POLL_US,
            probe in 1u64..60,
            pins in proptest::option::of("/[a-z]{1,8}"),
            a in arb_peer(0),
            b in arb_peer(1),
        ) {
            let mut cfg = Config::builder("/etc/fabric/key")
                .name(name)
                .listen_port(port)
                .mtu(mtu)
                .busy_poll_us(busy)
                .probe_interval(probe)
                .peers([a, b]);
            if let Some(p) = pins {
                cfg = cfg.dataplane_pin_dir(p);
            }
            let cfg = cfg.0;
            let text = cfg.to_toml().unwrap();
            let back: Config = toml::from_str(&text).unwrap();
            prop_assert_eq!(&back, &cfg, "{}", text);
            // Valid stays valid through the file, invalid stays invalid.
            prop_assert_eq!(Config::parse(&text).is_ok(), cfg.validate().is_ok());
        }
    }
}
