//! Typed gateway configuration (TOML) and its validation.

use std::{
    collections::HashSet,
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
};

use ipnetwork::IpNetwork;
use serde::Deserialize;

use crate::key::PublicKey;

/// 1500-byte underlay minus the worst-case WireGuard overhead (IPv6 40 + UDP 8 + WG 32 = 80).
pub const DEFAULT_MTU: u16 = 1420;
pub const DEFAULT_PORT: u16 = 51820;
pub const DEFAULT_NAME: &str = "fabric";
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
    #[error("invalid config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid config: {0}")]
    Invalid(String),
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub interface: InterfaceConfig,
    #[serde(default)]
    pub peers: Vec<PeerConfig>,
    /// Local IPs exposed to peers under an address of this cluster's external CIDR.
    #[serde(default)]
    pub externals: Vec<fabric_dataplane::ExternalMapping>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
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
    #[serde(default)]
    pub dataplane_pin_dir: Option<PathBuf>,
    /// When non-zero, one thread serves every tunnel and keeps polling for this many
    /// microseconds after traffic before it sleeps: lower latency for more CPU.
    /// 0 (default): a reader thread per direction that sleeps until packets come.
    #[serde(default)]
    pub busy_poll_us: u64,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PeerConfig {
    pub name: String,
    #[serde(deserialize_with = "de_public_key")]
    pub public_key: PublicKey,
    #[serde(default)]
    pub endpoint: Option<SocketAddr>,
    #[serde(default)]
    pub allowed_ips: Vec<IpNetwork>,
    #[serde(default)]
    pub persistent_keepalive: Option<u16>,
    #[serde(default)]
    pub device: Option<String>,
    #[serde(default)]
    pub addresses: Vec<IpNetwork>,
    #[serde(default)]
    pub routes: Vec<IpNetwork>,
    /// The peer gateway's own tunnel address; when set, an ICMP echo is sent
    /// to it through the tunnel (from our first `addresses` entry) to decide Up/Down.
    #[serde(default)]
    pub probe_address: Option<IpAddr>,
    /// Data-plane id of this peer (1..4095, stable): keys its remaps and counters. Needed
    /// when the gateway runs the remap data plane on the peer's device.
    #[serde(default)]
    pub id: Option<u32>,
    /// How this cluster sees the peer's prefixes: `local` (routed to this device, unique
    /// here) stands for `remote` (the peer's real prefix, inside `allowed_ips`).
    #[serde(default)]
    pub remaps: Vec<fabric_dataplane::Remap>,
    /// TCP MSS clamp on the device; default: the MTU minus 40.
    #[serde(default)]
    pub mss: Option<u16>,
}

impl InterfaceConfig {
    /// Where the data plane's maps are pinned.
    pub fn pin_dir(&self) -> PathBuf {
        self.dataplane_pin_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("/sys/fs/bpf/fabric-gw-{}", self.name)))
    }
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
    1
}

fn de_public_key<'de, D: serde::Deserializer<'de>>(d: D) -> Result<PublicKey, D::Error> {
    let s = String::deserialize(d)?;
    PublicKey::from_base64(&s).map_err(|_| {
        serde::de::Error::custom(format!(
            "public_key {s:?} is not a base64-encoded 32-byte WireGuard key"
        ))
    })
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
    pub fn dataplane(&self) -> Option<(PathBuf, fabric_dataplane::DataplaneConfig)> {
        if self.peers.iter().all(|p| p.id.is_none()) {
            return None;
        }
        let pin_dir = self.interface.pin_dir();
        let peers = self
            .peers
            .iter()
            .filter_map(|p| {
                Some(fabric_dataplane::PeerConfig {
                    name: p.name.clone(),
                    id: p.id?,
                    interface: p.device_name(),
                    mss: Some(p.mss.unwrap_or(self.interface.mtu.saturating_sub(40))),
                    remaps: p.remaps.clone(),
                })
            })
            .collect();
        Some((
            pin_dir,
            fabric_dataplane::DataplaneConfig {
                peers,
                externals: self.externals.clone(),
            },
        ))
    }

    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut cfg = Self::parse(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_path_buf(),
                message,
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
        let cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::from("<string>"),
            message: e.to_string(),
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let inv = |m: String| Err(ConfigError::Invalid(m));
        let i = &self.interface;
        if i.name.is_empty()
            || i.name.len() > MAX_IFNAME
            || !i
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return inv(format!(
                "interface.name {:?} must be 1-{MAX_IFNAME} characters of [A-Za-z0-9-_.]",
                i.name
            ));
        }
        if !(576..=9000).contains(&i.mtu) {
            return inv(format!("interface.mtu {} must be within 576..=9000", i.mtu));
        }
        if i.busy_poll_us > MAX_BUSY_POLL_US {
            return inv(format!(
                "interface.busy_poll_us {} must be at most {MAX_BUSY_POLL_US} (1 s); \
                 it is how long to keep polling after traffic, 0 turns it off",
                i.busy_poll_us
            ));
        }
        if i.probe_interval == 0 {
            return inv("interface.probe_interval must be at least 1 second".into());
        }
        let mut names = HashSet::new();
        let mut keys = HashSet::new();
        let mut devices = HashSet::new();
        for p in &self.peers {
            if p.name.is_empty() {
                return inv("peer name must not be empty".into());
            }
            if !names.insert(p.name.as_str()) {
                return inv(format!("duplicate peer name {:?}", p.name));
            }
            if !keys.insert(p.public_key) {
                return inv(format!(
                    "peer {:?}: public key {} is used by another peer",
                    p.name, p.public_key
                ));
            }
            let dev = p.device_name();
            if dev.is_empty()
                || dev.len() > MAX_IFNAME
                || dev.contains('/')
                || dev.contains(char::is_whitespace)
            {
                return inv(format!(
                    "peer {:?}: device name {dev:?} must be 1-{MAX_IFNAME} characters without '/' or spaces",
                    p.name
                ));
            }
            if !devices.insert(dev.clone()) {
                return inv(format!(
                    "peer {:?}: device {dev:?} is used by another peer",
                    p.name
                ));
            }
            if p.allowed_ips.is_empty() {
                return inv(format!(
                    "peer {:?}: allowed_ips is empty, so no packet from it would ever be accepted",
                    p.name
                ));
            }
            for net in p.allowed_ips.iter().chain(&p.routes) {
                if net.network() != net.ip() {
                    return inv(format!(
                        "peer {:?}: {net} has host bits set (did you mean {}/{}?)",
                        p.name,
                        net.network(),
                        net.prefix()
                    ));
                }
            }
            if p.persistent_keepalive == Some(0) {
                return inv(format!(
                    "peer {:?}: persistent_keepalive = 0; omit it to disable keepalives",
                    p.name
                ));
            }
            if let Some(dst) = p.probe_address {
                if p.probe_source().is_none() {
                    return inv(format!(
                        "peer {:?}: probe_address {dst} needs an address of the same family in `addresses` to probe from",
                        p.name
                    ));
                }
                if !p.allowed_ips.iter().any(|n| n.contains(dst)) {
                    return inv(format!(
                        "peer {:?}: probe_address {dst} is outside allowed_ips, so probe replies would be dropped",
                        p.name
                    ));
                }
            }
            if p.id.is_none() && (!p.remaps.is_empty() || p.mss.is_some()) {
                return inv(format!(
                    "peer {:?}: remaps and mss need a data-plane `id` (1..4095, stable for the peer)",
                    p.name
                ));
            }
            for r in &p.remaps {
                // The tunnel only accepts the peer's real addresses: a remote prefix outside
                // allowed_ips could never arrive.
                if !p.allowed_ips.iter().any(|n| match n {
                    IpNetwork::V4(n) => n.is_supernet_of(r.remote),
                    IpNetwork::V6(_) => false,
                }) {
                    return inv(format!(
                        "peer {:?}: remap remote prefix {} is not inside allowed_ips",
                        p.name, r.remote
                    ));
                }
            }
        }
        if let Some((_, dp)) = self.dataplane() {
            dp.validate()
                .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=";
    const KEY2: &str = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=";

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
}
