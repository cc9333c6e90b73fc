//! Builders of a [`Config`] and its peers, for whoever writes configurations in code (the
//! gateway operator, tests, benchmarks): what they build is checked by the same validation as
//! a file, and [`ConfigBuilder::build_per_peer`] keeps the peers that are fine when one is not.
use std::{
    net::{IpAddr, SocketAddr},
    path::PathBuf,
};

use fabric_dataplane_config::{ExternalMapping, Remap};
use ipnetwork::{IpNetwork, Ipv4Network};

use super::{Config, ConfigError, InterfaceConfig, Invalid, PeerConfig};
use crate::key::PublicKey;

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
pub struct ConfigBuilder(pub(super) Config);

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
}
