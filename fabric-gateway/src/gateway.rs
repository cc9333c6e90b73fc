//! The running gateway: one UDP socket, one TUN device and one boringtun `Tunn`
//! per peer.
//!
//! Data plane runs on plain OS threads (a reader per TUN, one UDP reader, one
//! timer thread) with buffers allocated once per thread, so the per-packet path
//! does no heap allocation and never waits on the async control plane. The
//! control plane (reload, UAPI, netlink) runs on tokio and only takes short locks.

use std::{
    collections::{BTreeMap, HashMap},
    io,
    net::{IpAddr, SocketAddr, UdpSocket},
    os::fd::AsRawFd,
    sync::{
        Arc, Mutex, RwLock,
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant, SystemTime},
};

use boringtun::noise::{
    Packet, Tunn, TunnResult, errors::WireGuardError, handshake::parse_handshake_anon,
    rate_limiter::RateLimiter,
};
use ipnetwork::IpNetwork;

use crate::{
    allowed_ips::AllowedIps,
    config::{Config, InterfaceConfig, PeerConfig},
    key::{PrivateKey, PublicKey},
    netconf,
    offload::{self, VNET_HDR_LEN, VnetHdr},
    packet,
    probe::ProbeState,
    status::{PeerStatus, Status},
    tun::Tun,
    uapi, udp,
};

/// Handshakes per second before cookies are demanded. Every handshake message
/// is checked twice against the shared limiter (once to find the peer, once
/// inside `Tunn::decapsulate`), so this is twice the effective limit of 100/s.
const HANDSHAKE_RATE_LIMIT: u64 = 200;
const TIMER_TICK: Duration = Duration::from_millis(100);
/// While probes fail, a new handshake this often. Shorter than WireGuard's REKEY_TIMEOUT (5 s):
/// the peer behind a Service may have been replaced by a replica that only waits for our
/// handshake, and one initiation every 2 s per dead peer is still no load.
const FORCED_REKEY_EVERY: Duration = Duration::from_secs(2);
/// A peer without a session in its first 30 s is dialled again every second.
const FRESH_PEER_WINDOW: Duration = Duration::from_secs(30);
const FRESH_PEER_RETRY: Duration = Duration::from_secs(1);
/// Probe pace between a new session and the first probe reply.
const FIRST_PROBE_EVERY: Duration = Duration::from_millis(200);
const POLL_TIMEOUT: Duration = Duration::from_millis(250);
/// Largest datagram/packet we handle (a TSO super-packet or a GRO batch is at most 64 KiB).
const BUF: usize = 65_536;
/// WireGuard data overhead plus room for handshake messages.
const BUF_OUT: usize = BUF + 256;
/// Encrypted segments of one super-packet: 64 KiB of payload plus per-segment
/// headers and WireGuard overhead, which stays below this down to an MSS of 88.
const SEG_OUT: usize = 256 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error(transparent)]
    Key(#[from] crate::key::KeyError),
    #[error("cannot listen on UDP {addr}: {source}{hint}")]
    Bind {
        addr: SocketAddr,
        source: io::Error,
        hint: &'static str,
    },
    #[error("cannot create TUN device {device:?} for peer {peer:?}: {source}")]
    Tun {
        peer: String,
        device: String,
        source: io::Error,
    },
    #[error("configuring device {device:?} for peer {peer:?}: {source}")]
    Netconf {
        peer: String,
        device: String,
        // Boxed: netlink errors are large and every Result<_, GatewayError> would carry the size.
        source: Box<netconf::NetconfError>,
    },
    #[error("{0}")]
    Other(String),
}

/// Indices into `PeerCounters::drops`; names are metric label values.
#[derive(Clone, Copy, Debug)]
#[repr(usize)]
pub enum PeerDrop {
    NotAllowedSource = 0,
    NoEndpoint,
    Decrypt,
    TunWrite,
    UdpSend,
    Malformed,
}
const PEER_DROP_NAMES: [&str; 6] = [
    "not_allowed_source",
    "no_endpoint",
    "decrypt",
    "tun_write",
    "udp_send",
    "malformed",
];

#[derive(Default)]
struct PeerCounters {
    rx_bytes: AtomicU64,
    tx_bytes: AtomicU64,
    rx_packets: AtomicU64,
    tx_packets: AtomicU64,
    drops: [AtomicU64; 6],
}

impl PeerCounters {
    fn drop(&self, why: PeerDrop) {
        self.drops[why as usize].fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Clone, Copy)]
#[repr(usize)]
enum GlobalDrop {
    UnknownPeer = 0,
    Invalid,
    UnderLoad,
}
const GLOBAL_DROP_NAMES: [&str; 3] = ["unknown_peer", "invalid", "under_load"];

struct Probe {
    src: std::net::Ipv4Addr,
    dst: std::net::Ipv4Addr,
    state: ProbeState,
    last_sent: Option<Instant>,
    last_forced_handshake: Option<Instant>,
    created: Instant,
}

/// Settings that can change on reload without recreating the TUN device.
struct PeerSettings {
    cfg: PeerConfig,
    keepalive: Option<u16>,
}

pub struct Peer {
    name: String,
    public_key: PublicKey,
    index: u32,
    tunn: Mutex<Tunn>,
    endpoint: RwLock<Option<SocketAddr>>,
    allowed: RwLock<AllowedIps>,
    tun: Tun,
    counters: PeerCounters,
    probe: Mutex<Option<Probe>>,
    settings: Mutex<PeerSettings>,
    stop: AtomicBool,
    reader: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer")
            .field("name", &self.name)
            .field("public_key", &self.public_key)
            .field("device", &self.tun.name())
            .finish_non_exhaustive()
    }
}

impl Peer {
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn device(&self) -> &str {
        self.tun.name()
    }
    pub fn ifindex(&self) -> u32 {
        self.tun.ifindex()
    }
}

#[derive(Default)]
struct PeerTable {
    by_key: HashMap<PublicKey, Arc<Peer>>,
    by_index: HashMap<u32, Arc<Peer>>,
}

pub struct Gateway {
    iface: InterfaceConfig,
    private_key: PrivateKey,
    public_key: PublicKey,
    udp: UdpSocket,
    /// Cleared when the kernel refuses UDP_SEGMENT; we then send datagram by datagram.
    udp_gso: AtomicBool,
    rate_limiter: Arc<RateLimiter>,
    peers: RwLock<PeerTable>,
    /// Bumped on every peer add/remove, so the poll loop knows to rebuild its fd set.
    peers_gen: AtomicU64,
    next_index: AtomicU32,
    stop: AtomicBool,
    started: Instant,
    drops: [AtomicU64; 3],
    cookies_sent: AtomicU64,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Serialises control-plane mutations (reload, UAPI set).
    control: tokio::sync::Mutex<()>,
    netlink: rtnetlink::Handle,
    /// The loaded remap programs and their maps, kept between reloads so a configuration
    /// change costs map writes, not another program load and verification.
    dataplane: Mutex<Option<fabric_dataplane::Dataplane>>,
    /// What the data plane was last set to, for the periodic drift repair.
    dataplane_cfg: Mutex<Option<(std::path::PathBuf, fabric_dataplane::DataplaneConfig)>>,
    /// Things put back by the drift repair: device state, addresses, routes, filters, map
    /// entries.
    repairs: AtomicU64,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("name", &self.iface.name)
            .field("public_key", &self.public_key)
            .finish_non_exhaustive()
    }
}

impl Gateway {
    /// Binds the socket, creates all peers and starts the data-plane threads.
    /// Must run inside a tokio runtime (netlink).
    pub async fn start(cfg: Config, netlink: rtnetlink::Handle) -> Result<Arc<Self>, GatewayError> {
        let private_key = PrivateKey::read_file(&cfg.interface.private_key_file)?;
        let public_key = private_key.public_key();
        let addr = SocketAddr::new(cfg.interface.listen_address, cfg.interface.listen_port);
        let udp = UdpSocket::bind(addr).map_err(|source| GatewayError::Bind {
            addr,
            hint: if source.kind() == io::ErrorKind::AddrInUse {
                " (is another gateway or WireGuard interface using this port?)"
            } else {
                ""
            },
            source,
        })?;
        udp.set_read_timeout(Some(POLL_TIMEOUT))
            .map_err(|e| GatewayError::Other(format!("UDP socket timeout: {e}")))?;
        let gro = udp::tune(&udp);
        tracing::debug!(gro, "UDP socket tuned");
        let rate_limiter = Arc::new(RateLimiter::new(
            &public_key.to_dalek(),
            HANDSHAKE_RATE_LIMIT,
        ));
        let gw = Arc::new(Self {
            iface: cfg.interface.clone(),
            private_key,
            public_key,
            udp,
            udp_gso: AtomicBool::new(true),
            rate_limiter,
            peers: RwLock::default(),
            peers_gen: AtomicU64::new(0),
            // Random start, so a restarted gateway does not reuse the session
            // indices its peers may still be sending to.
            next_index: AtomicU32::new(random_u32() & 0x00ff_ffff),
            stop: AtomicBool::new(false),
            started: Instant::now(),
            drops: Default::default(),
            cookies_sent: AtomicU64::new(0),
            threads: Mutex::default(),
            dataplane: Mutex::default(),
            dataplane_cfg: Mutex::default(),
            repairs: AtomicU64::new(0),
            control: tokio::sync::Mutex::new(()),
            netlink,
        });
        let dataplane = cfg.dataplane();
        for p in cfg.peers {
            if let Err(e) = gw.add_peer(p).await {
                gw.shutdown().await;
                return Err(e);
            }
        }
        if let Err(e) = gw.apply_dataplane(dataplane) {
            gw.shutdown().await;
            return Err(e);
        }
        let g = gw.clone();
        let spin = gw.busy_poll();
        let udp_thread = std::thread::Builder::new()
            .name(
                if spin.is_some() {
                    "fgw-poll"
                } else {
                    "fgw-udp"
                }
                .into(),
            )
            .spawn(move || match spin {
                Some(spin) => g.poll_loop(spin),
                None => g.udp_loop(),
            })
            .map_err(|e| GatewayError::Other(format!("spawn: {e}")))?;
        let g = gw.clone();
        let timer_thread = std::thread::Builder::new()
            .name("fgw-timers".into())
            .spawn(move || g.timer_loop())
            .map_err(|e| GatewayError::Other(format!("spawn: {e}")))?;
        gw.threads
            .lock()
            .unwrap()
            .extend([udp_thread, timer_thread]);
        tracing::info!(
            name = %gw.iface.name,
            public_key = %gw.public_key,
            listen = %addr,
            peers = gw.peers.read().unwrap().by_key.len(),
            "gateway started"
        );
        Ok(gw)
    }

    pub fn name(&self) -> &str {
        &self.iface.name
    }

    /// Some(spin window) when one polling thread serves all devices.
    fn busy_poll(&self) -> Option<Duration> {
        (self.iface.busy_poll_us > 0).then(|| Duration::from_micros(self.iface.busy_poll_us))
    }

    pub fn public_key(&self) -> PublicKey {
        self.public_key
    }

    pub fn listen_port(&self) -> u16 {
        self.udp
            .local_addr()
            .map(|a| a.port())
            .unwrap_or(self.iface.listen_port)
    }

    pub fn peers(&self) -> Vec<Arc<Peer>> {
        let mut v: Vec<_> = self
            .peers
            .read()
            .unwrap()
            .by_key
            .values()
            .cloned()
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    fn peer_by_key(&self, k: &PublicKey) -> Option<Arc<Peer>> {
        self.peers.read().unwrap().by_key.get(k).cloned()
    }

    fn new_tunn(&self, key: &PublicKey, keepalive: Option<u16>, index: u32) -> Tunn {
        Tunn::new(
            self.private_key.to_dalek(),
            key.to_dalek(),
            None,
            keepalive,
            index,
            Some(self.rate_limiter.clone()),
        )
    }

    async fn add_peer(self: &Arc<Self>, cfg: PeerConfig) -> Result<(), GatewayError> {
        let device = cfg.device_name();
        let tun = Tun::create(&device, true).map_err(|source| GatewayError::Tun {
            peer: cfg.name.clone(),
            device: device.clone(),
            source,
        })?;
        let nc = |source| GatewayError::Netconf {
            peer: cfg.name.clone(),
            device: device.clone(),
            source: Box::new(source),
        };
        let ifindex = tun.ifindex();
        netconf::link_up(&self.netlink, ifindex, self.iface.mtu)
            .await
            .map_err(nc)?;
        netconf::sync_addresses(&self.netlink, ifindex, &[], &cfg.addresses)
            .await
            .map_err(nc)?;
        netconf::sync_routes(&self.netlink, ifindex, &[], &cfg.routes)
            .await
            .map_err(nc)?;

        // 24 bits: boringtun shifts the index left by 8 for its session counter.
        let index = self.next_index.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff;
        let peer = Arc::new(Peer {
            name: cfg.name.clone(),
            public_key: cfg.public_key,
            index,
            tunn: Mutex::new(self.new_tunn(&cfg.public_key, cfg.persistent_keepalive, index)),
            endpoint: RwLock::new(cfg.endpoint),
            allowed: RwLock::new(AllowedIps::new(cfg.allowed_ips.iter().copied())),
            tun,
            counters: PeerCounters::default(),
            probe: Mutex::new(make_probe(&cfg)),
            settings: Mutex::new(PeerSettings {
                keepalive: cfg.persistent_keepalive,
                cfg: cfg.clone(),
            }),
            stop: AtomicBool::new(false),
            reader: Mutex::new(None),
        });
        if self.busy_poll().is_none() {
            let (g, p) = (self.clone(), peer.clone());
            let h = std::thread::Builder::new()
                .name(format!("fgw-tun-{}", peer.tun.name()))
                .spawn(move || g.tun_loop(&p))
                .map_err(|e| GatewayError::Other(format!("spawn: {e}")))?;
            *peer.reader.lock().unwrap() = Some(h);
        }
        {
            let mut t = self.peers.write().unwrap();
            t.by_index.insert(index, peer.clone());
            t.by_key.insert(cfg.public_key, peer.clone());
            self.peers_gen.fetch_add(1, Ordering::Release);
        }
        tracing::info!(
            peer = %peer.name,
            public_key = %peer.public_key,
            device = %peer.tun.name(),
            ifindex,
            endpoint = ?cfg.endpoint,
            role = if cfg.endpoint.is_some() { "client" } else { "server" },
            "peer added"
        );
        // Clients dial right away instead of waiting for the first packet.
        if cfg.endpoint.is_some() {
            self.initiate_handshake(&peer);
        }
        Ok(())
    }

    fn initiate_handshake(&self, peer: &Peer) {
        let mut buf = [0u8; 256];
        let res = peer
            .tunn
            .lock()
            .unwrap()
            .format_handshake_initiation(&mut buf, false);
        if let TunnResult::WriteToNetwork(pkt) = res {
            self.send_to_peer(peer, pkt);
        }
    }

    async fn remove_peer(&self, key: &PublicKey) {
        let peer = {
            let mut t = self.peers.write().unwrap();
            let Some(p) = t.by_key.remove(key) else {
                return;
            };
            t.by_index.remove(&p.index);
            self.peers_gen.fetch_add(1, Ordering::Release);
            p
        };
        peer.stop.store(true, Ordering::Relaxed);
        let h = peer.reader.lock().unwrap().take();
        if let Some(h) = h {
            let _ = tokio::task::spawn_blocking(move || h.join()).await;
        }
        tracing::info!(peer = %peer.name, device = %peer.tun.name(), "peer removed");
        // The TUN fd closes (and the kernel deletes the device and its routes)
        // when the last Arc goes, i.e. once in-flight UDP processing finished.
    }

    /// Applies changes that keep the device: endpoint, allowed IPs, keepalive, addresses, routes.
    async fn update_peer(&self, peer: &Arc<Peer>, cfg: PeerConfig) -> Result<(), GatewayError> {
        let (old_cfg, keepalive_changed) = {
            let s = peer.settings.lock().unwrap();
            (s.cfg.clone(), s.keepalive != cfg.persistent_keepalive)
        };
        if old_cfg == cfg {
            return Ok(());
        }
        let nc = |source| GatewayError::Netconf {
            peer: cfg.name.clone(),
            device: peer.tun.name().to_string(),
            source: Box::new(source),
        };
        let ifindex = peer.tun.ifindex();
        netconf::sync_addresses(&self.netlink, ifindex, &old_cfg.addresses, &cfg.addresses)
            .await
            .map_err(nc)?;
        netconf::sync_routes(&self.netlink, ifindex, &old_cfg.routes, &cfg.routes)
            .await
            .map_err(nc)?;
        if old_cfg.endpoint != cfg.endpoint {
            *peer.endpoint.write().unwrap() = cfg.endpoint;
        }
        *peer.allowed.write().unwrap() = AllowedIps::new(cfg.allowed_ips.iter().copied());
        if keepalive_changed {
            // boringtun cannot change keepalive on a live Tunn; a fresh one re-handshakes (~1 RTT).
            *peer.tunn.lock().unwrap() =
                self.new_tunn(&peer.public_key, cfg.persistent_keepalive, peer.index);
        }
        if old_cfg.probe_address != cfg.probe_address || old_cfg.addresses != cfg.addresses {
            *peer.probe.lock().unwrap() = make_probe(&cfg);
        }
        let dial =
            cfg.endpoint.is_some() && (old_cfg.endpoint != cfg.endpoint || keepalive_changed);
        tracing::info!(peer = %peer.name, endpoint = ?cfg.endpoint, "peer updated");
        {
            let mut s = peer.settings.lock().unwrap();
            s.keepalive = cfg.persistent_keepalive;
            s.cfg = cfg;
        }
        if dial {
            self.initiate_handshake(peer);
        }
        Ok(())
    }

    /// Makes the running peer set match `cfg`. Untouched peers keep their
    /// sessions and devices, so their traffic is not disturbed.
    pub async fn reload(self: &Arc<Self>, cfg: Config) -> Result<(), GatewayError> {
        let _guard = self.control.lock().await;
        let i = &cfg.interface;
        if i.listen_port != self.iface.listen_port
            || i.listen_address != self.iface.listen_address
            || i.mtu != self.iface.mtu
            || i.name != self.iface.name
            || i.busy_poll_us != self.iface.busy_poll_us
        {
            tracing::warn!("interface settings changed; they take effect only after a restart");
        }
        if PrivateKey::read_file(&i.private_key_file)?.public_key() != self.public_key {
            tracing::warn!(
                "private key file changed; the new key takes effect only after a restart"
            );
        }
        let wanted: HashMap<PublicKey, &PeerConfig> =
            cfg.peers.iter().map(|p| (p.public_key, p)).collect();
        let current = self.peers();
        // Removals first so a device name can move from an old peer to a new one.
        for p in &current {
            let same_dev = wanted
                .get(&p.public_key)
                .is_some_and(|c| c.device_name() == p.tun.name() && c.name == p.name);
            if !same_dev {
                self.remove_peer(&p.public_key).await;
            }
        }
        let mut errors = Vec::new();
        for pc in &cfg.peers {
            let res = match self.peer_by_key(&pc.public_key) {
                Some(p) => self.update_peer(&p, pc.clone()).await,
                None => self.add_peer(pc.clone()).await,
            };
            if let Err(e) = res {
                tracing::error!(peer = %pc.name, error = %e, "reload: peer not applied");
                errors.push(e.to_string());
            }
        }
        if let Err(e) = self.apply_dataplane(cfg.dataplane()) {
            tracing::error!(error = %e, "reload: data plane not applied");
            errors.push(e.to_string());
        }
        if errors.is_empty() {
            tracing::info!(peers = cfg.peers.len(), "configuration reloaded");
            Ok(())
        } else {
            Err(GatewayError::Other(errors.join("; ")))
        }
    }

    // ---------------------------------------------------------------- UAPI

    pub fn uapi_get(&self) -> uapi::DeviceSnapshot {
        let now = SystemTime::now();
        uapi::DeviceSnapshot {
            listen_port: self.listen_port(),
            peers: self
                .peers()
                .iter()
                .map(|p| {
                    let (hs, ..) = p.tunn.lock().unwrap().stats();
                    uapi::PeerSnapshot {
                        public_key: p.public_key,
                        endpoint: *p.endpoint.read().unwrap(),
                        last_handshake: hs.and_then(|d| now.checked_sub(d)),
                        tx_bytes: p.counters.tx_bytes.load(Ordering::Relaxed),
                        rx_bytes: p.counters.rx_bytes.load(Ordering::Relaxed),
                        persistent_keepalive: p.settings.lock().unwrap().keepalive,
                        allowed_ips: p.allowed.read().unwrap().nets().to_vec(),
                    }
                })
                .collect(),
        }
    }

    /// Applies a `wg set`. Changes are live only: a reload restores the file's state.
    pub async fn uapi_set(self: &Arc<Self>, req: uapi::SetRequest) -> Result<(), uapi::UapiError> {
        let err = |errno, m: String| uapi::UapiError { errno, message: m };
        if req.private_key_given {
            return Err(err(
                uapi::EOPNOTSUPP,
                "the private key comes from private_key_file; change it there and restart".into(),
            ));
        }
        if req.listen_port.is_some_and(|p| p != self.listen_port()) {
            return Err(err(
                uapi::EOPNOTSUPP,
                "listen port changes need a restart".into(),
            ));
        }
        if req.fwmark.is_some_and(|m| m != 0) {
            return Err(err(uapi::EOPNOTSUPP, "fwmark is not supported".into()));
        }
        if req.peers.iter().any(|p| p.preshared_key_given) {
            return Err(err(
                uapi::EOPNOTSUPP,
                "preshared keys are not supported".into(),
            ));
        }
        if req.replace_peers {
            let keep: Vec<_> = req.peers.iter().map(|p| p.public_key).collect();
            for p in self.peers() {
                if !keep.contains(&p.public_key) {
                    let _g = self.control.lock().await;
                    self.remove_peer(&p.public_key).await;
                }
            }
        }
        for ps in req.peers {
            let _g = self.control.lock().await;
            let existing = self.peer_by_key(&ps.public_key);
            if ps.remove {
                self.remove_peer(&ps.public_key).await;
                continue;
            }
            let mut cfg = match &existing {
                Some(p) => p.settings.lock().unwrap().cfg.clone(),
                None if ps.update_only => continue,
                None => {
                    // Peers created over UAPI get a device named after their key.
                    let hex = ps.public_key.to_hex();
                    PeerConfig {
                        name: format!("uapi-{}", &hex[..8]),
                        public_key: ps.public_key,
                        endpoint: None,
                        allowed_ips: vec![],
                        persistent_keepalive: None,
                        device: Some(format!("fab-{}", &hex[..8])),
                        addresses: vec![],
                        routes: vec![],
                        probe_address: None,
                        id: None,
                        remaps: vec![],
                        mss: None,
                    }
                }
            };
            if let Some(e) = ps.endpoint {
                cfg.endpoint = Some(e);
            } else if let Some(p) = &existing {
                // Keep the roamed endpoint rather than the configured one.
                cfg.endpoint = *p.endpoint.read().unwrap();
            }
            if let Some(k) = ps.persistent_keepalive {
                cfg.persistent_keepalive = (k != 0).then_some(k);
            }
            if ps.replace_allowed_ips {
                cfg.allowed_ips.clear();
            }
            for n in ps.allowed_ips {
                let n = IpNetwork::new(n.network(), n.prefix()).expect("valid prefix");
                if !cfg.allowed_ips.contains(&n) {
                    cfg.allowed_ips.push(n);
                }
            }
            let res = match existing {
                Some(p) => self.update_peer(&p, cfg).await,
                None => self.add_peer(cfg).await,
            };
            res.map_err(|e| err(uapi::EINVAL, e.to_string()))?;
        }
        Ok(())
    }

    // -------------------------------------------------------------- status

    pub fn status(&self) -> Status {
        let now = Instant::now();
        let interval = Duration::from_secs(self.iface.probe_interval);
        // The remap programs' counters, when this gateway runs the data plane.
        let maps = fabric_dataplane::Maps::open_pinned(&self.iface.pin_dir()).ok();
        let peers = self
            .peers()
            .iter()
            .map(|p| {
                let (hs, ..) = p.tunn.lock().unwrap().stats();
                let probe = p.probe.lock().unwrap();
                let up = match probe.as_ref() {
                    Some(pr) => pr.state.is_up(now, interval),
                    // Without a probe the best evidence is a session younger than REJECT_AFTER_TIME.
                    None => hs.is_some_and(|d| d < Duration::from_secs(180)),
                };
                let c = &p.counters;
                PeerStatus {
                    name: p.name.clone(),
                    public_key: p.public_key.to_base64(),
                    device: p.tun.name().to_string(),
                    ifindex: p.tun.ifindex(),
                    endpoint: p.endpoint.read().unwrap().map(|e| e.to_string()),
                    allowed_ips: p
                        .allowed
                        .read()
                        .unwrap()
                        .nets()
                        .iter()
                        .map(|n| n.to_string())
                        .collect(),
                    up,
                    probe_enabled: probe.is_some(),
                    probe_rtt_seconds: probe
                        .as_ref()
                        .and_then(|p| p.state.last_rtt())
                        .map(|d| d.as_secs_f64()),
                    probe_sent: probe.as_ref().map_or(0, |p| p.state.sent()),
                    probe_received: probe.as_ref().map_or(0, |p| p.state.received()),
                    probe_lost: probe
                        .as_ref()
                        .map_or(0, |p| p.state.lost(now, interval * 3)),
                    latest_handshake_age_seconds: hs.map(|d| d.as_secs_f64()),
                    rx_bytes: c.rx_bytes.load(Ordering::Relaxed),
                    tx_bytes: c.tx_bytes.load(Ordering::Relaxed),
                    rx_packets: c.rx_packets.load(Ordering::Relaxed),
                    tx_packets: c.tx_packets.load(Ordering::Relaxed),
                    drops: PEER_DROP_NAMES
                        .iter()
                        .zip(&c.drops)
                        .map(|(n, v)| (n.to_string(), v.load(Ordering::Relaxed)))
                        .collect(),
                    dataplane: maps.as_ref().and_then(|m| {
                        let id = p.settings.lock().unwrap().cfg.id?;
                        let (eg, ing) = m.peer_counters(id).ok()?;
                        Some(crate::status::DataplaneCounters::from_counters(&eg, &ing))
                    }),
                }
            })
            .collect();
        Status {
            name: self.iface.name.clone(),
            public_key: self.public_key.to_base64(),
            listen_port: self.listen_port(),
            uptime_seconds: self.started.elapsed().as_secs_f64(),
            drops: GLOBAL_DROP_NAMES
                .iter()
                .zip(&self.drops)
                .map(|(n, v)| (n.to_string(), v.load(Ordering::Relaxed)))
                .collect::<BTreeMap<_, _>>(),
            cookie_replies_sent: self.cookies_sent.load(Ordering::Relaxed),
            repairs: self.repairs.load(Ordering::Relaxed),
            peers,
        }
    }

    /// Stops all threads and removes every TUN device.
    pub async fn shutdown(self: &Arc<Self>) {
        self.stop.store(true, Ordering::Relaxed);
        for p in self.peers() {
            self.remove_peer(&p.public_key).await;
        }
        let threads: Vec<_> = std::mem::take(&mut *self.threads.lock().unwrap());
        let _ = tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        })
        .await;
        // The devices (and the filters on them) are gone; drop the maps too. After a crash
        // they stay pinned and the next start reuses them.
        let pin_dir = self.iface.pin_dir();
        if let Err(e) = fabric_dataplane::Dataplane::reset(&pin_dir) {
            tracing::warn!(pin_dir = %pin_dir.display(), error = %e, "removing data-plane pins");
        }
        tracing::info!("gateway stopped");
    }

    // ---------------------------------------------------------- data plane

    fn send_to_peer(&self, peer: &Peer, pkt: &[u8]) {
        let ep = *peer.endpoint.read().unwrap();
        match ep {
            Some(ep) => self.send_to(peer, pkt, ep),
            None => peer.counters.drop(PeerDrop::NoEndpoint),
        }
    }

    fn send_to(&self, peer: &Peer, pkt: &[u8], ep: SocketAddr) {
        match self.udp.send_to(pkt, ep) {
            Ok(n) => {
                peer.counters
                    .tx_bytes
                    .fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e) => {
                peer.counters.drop(PeerDrop::UdpSend);
                tracing::trace!(peer = %peer.name, error = %e, "udp send failed");
            }
        }
    }

    /// Sends encrypted datagrams laid out back to back in `buf` (`lens` gives their
    /// sizes), grouping runs of equal size into UDP_SEGMENT sends.
    fn send_batch(&self, peer: &Peer, buf: &[u8], lens: &[usize], ep: SocketAddr) {
        let gso = self.udp_gso.load(Ordering::Relaxed);
        let (mut i, mut off) = (0, 0);
        while i < lens.len() {
            let seg = lens[i];
            let (mut j, mut total) = (i + 1, seg);
            // A run: equal sizes, optionally ending with one shorter datagram.
            while gso
                && j < lens.len()
                && j - i < udp::MAX_SEGMENTS
                && lens[j] <= seg
                && lens[j - 1] == seg
                && total + lens[j] <= udp::MAX_GSO_BYTES
            {
                total += lens[j];
                j += 1;
            }
            let run = &buf[off..off + total];
            match udp::send_segments(&self.udp, run, seg, ep) {
                Ok(n) => {
                    peer.counters
                        .tx_bytes
                        .fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(e)
                    if j - i > 1
                        && matches!(
                            e.raw_os_error(),
                            Some(libc::EIO | libc::EINVAL | libc::ENOPROTOOPT)
                        ) =>
                {
                    tracing::warn!(error = %e, "UDP segmentation offload refused; sending datagrams one by one");
                    self.udp_gso.store(false, Ordering::Relaxed);
                    let mut o = off;
                    for &l in &lens[i..j] {
                        self.send_to(peer, &buf[o..o + l], ep);
                        o += l;
                    }
                }
                Err(e) => {
                    for _ in i..j {
                        peer.counters.drop(PeerDrop::UdpSend);
                    }
                    tracing::trace!(peer = %peer.name, error = %e, "udp send failed");
                }
            }
            off += total;
            i = j;
        }
    }

    /// TUN -> (segment) -> encrypt -> UDP for one peer, a reader thread per device.
    fn tun_loop(&self, peer: &Peer) {
        let mut bufs = TunBufs::new();
        while !peer.stop.load(Ordering::Relaxed) && !self.stop.load(Ordering::Relaxed) {
            match peer.tun.recv_timeout(&mut bufs.src, POLL_TIMEOUT) {
                Ok(Some(n)) => self.tun_packet(peer, n, &mut bufs),
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(peer = %peer.name, error = %e, "TUN read failed; stopping reader");
                    return;
                }
            }
        }
    }

    /// One read from a peer's TUN (`n` bytes in `bufs.src`). It may be a 64 KiB TSO
    /// super-packet; its segments are encrypted under one lock and leave in a few
    /// UDP_SEGMENT sends.
    fn tun_packet(&self, peer: &Peer, n: usize, bufs: &mut TunBufs) {
        let TunBufs {
            src,
            scratch,
            dst,
            lens,
        } = bufs;
        let Some(ep) = *peer.endpoint.read().unwrap() else {
            // A server-side peer that never contacted us: nowhere to send, and
            // queueing inside Tunn would only deliver stale packets later.
            peer.counters.drop(PeerDrop::NoEndpoint);
            return;
        };
        let (hdr, pkt) = if peer.tun.vnet_hdr() {
            if n < VNET_HDR_LEN {
                peer.counters.drop(PeerDrop::Malformed);
                return;
            }
            let (h, p) = src[..n].split_at_mut(VNET_HDR_LEN);
            (
                VnetHdr::parse((&*h).try_into().expect("split at VNET_HDR_LEN")),
                p,
            )
        } else {
            (VnetHdr::default(), &mut src[..n])
        };
        lens.clear();
        let mut used = 0;
        let mut inner = 0u64;
        let res = {
            let mut tunn = peer.tunn.lock().unwrap();
            offload::segment(&hdr, pkt, scratch, |p| {
                let room = &mut dst[used..];
                if room.len() < p.len() + 64 {
                    peer.counters.drop(PeerDrop::Malformed);
                    return;
                }
                match tunn.encapsulate(p, room) {
                    TunnResult::WriteToNetwork(out) => {
                        used += out.len();
                        lens.push(out.len());
                        inner += 1;
                    }
                    TunnResult::Done => {}
                    TunnResult::Err(e) => {
                        tracing::debug!(peer = %peer.name, error = ?e, "encapsulate failed")
                    }
                    TunnResult::WriteToTunnelV4(..) | TunnResult::WriteToTunnelV6(..) => {}
                }
            })
        };
        if let Err(e) = res {
            peer.counters.drop(PeerDrop::Malformed);
            tracing::debug!(peer = %peer.name, error = ?e, "unusable packet from TUN");
        }
        peer.counters.tx_packets.fetch_add(inner, Ordering::Relaxed);
        self.send_batch(peer, &dst[..used], lens, ep);
    }

    /// UDP -> find peer -> decrypt -> TUN, on its own thread.
    fn udp_loop(&self) {
        let mut bufs = UdpBufs::new(&self.private_key, &self.public_key);
        while !self.stop.load(Ordering::Relaxed) {
            self.udp_receive(&mut bufs);
        }
    }

    /// One receive from the UDP socket. With UDP GRO it may carry many datagrams
    /// of the same sender, cut at the reported segment size. Returns whether
    /// anything arrived.
    fn udp_receive(&self, bufs: &mut UdpBufs) -> bool {
        let (n, from, seg) = match udp::recv_segments(&self.udp, &mut bufs.buf) {
            Ok(r) => r,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                return false;
            }
            Err(e) => {
                // ICMP port unreachable from a dead endpoint surfaces here; not fatal.
                tracing::trace!(error = %e, "udp recv error");
                return true;
            }
        };
        if n == 0 {
            self.drops[GlobalDrop::Invalid as usize].fetch_add(1, Ordering::Relaxed);
            return true;
        }
        let UdpBufs {
            buf,
            out,
            gro,
            static_private,
            static_public,
        } = bufs;
        for datagram in buf[..n].chunks(seg.max(1)) {
            self.handle_datagram(datagram, from, out, gro, static_private, static_public);
        }
        // Never hold packets past the batch they came in: no added latency.
        gro.flush();
        true
    }

    /// Both directions of every peer on one thread, for `busy_poll_us` > 0: after
    /// traffic it keeps polling without sleeping for that long, so a reply that
    /// comes back within the window costs no thread wake-up. Trades CPU for latency.
    fn poll_loop(&self, spin: Duration) {
        let mut tb = TunBufs::new();
        let mut ub = UdpBufs::new(&self.private_key, &self.public_key);
        let mut seen_gen = u64::MAX;
        let mut peers: Vec<Arc<Peer>> = Vec::new();
        let mut fds: Vec<libc::pollfd> = Vec::new();
        let mut last_traffic = Instant::now();
        while !self.stop.load(Ordering::Relaxed) {
            let g = self.peers_gen.load(Ordering::Acquire);
            if g != seen_gen {
                seen_gen = g;
                peers = self.peers();
                fds.clear();
                fds.push(pollfd(self.udp.as_raw_fd()));
                fds.extend(peers.iter().map(|p| pollfd(p.tun.as_raw_fd())));
            }
            let spinning = last_traffic.elapsed() < spin;
            let timeout = if spinning {
                0
            } else {
                POLL_TIMEOUT.as_millis() as libc::c_int
            };
            // SAFETY: fds is a live array of pollfd of the given length.
            let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
            if r <= 0 {
                if r < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                    tracing::error!(error = %io::Error::last_os_error(), "poll failed");
                    std::thread::sleep(Duration::from_millis(10));
                }
                if spinning {
                    // Give way to whatever else wants this CPU (a woken peer thread, the
                    // application): spinning must never delay the packets it waits for.
                    // SAFETY: sched_yield has no preconditions.
                    unsafe { libc::sched_yield() };
                }
                continue;
            }
            last_traffic = Instant::now();
            if fds[0].revents != 0 {
                self.udp_receive(&mut ub);
            }
            for (pfd, peer) in fds[1..].iter_mut().zip(&peers) {
                if pfd.revents == 0 || peer.stop.load(Ordering::Relaxed) {
                    continue;
                }
                match peer.tun.recv(&mut tb.src) {
                    Ok(Some(n)) => self.tun_packet(peer, n, &mut tb),
                    Ok(None) => {}
                    Err(e) => {
                        // As the threaded reader does: stop reading a broken device (poll
                        // skips negative fds) rather than spin on its error.
                        tracing::error!(peer = %peer.name, error = %e, "TUN read failed; no longer reading it");
                        pfd.fd = -1;
                    }
                }
            }
        }
    }

    fn handle_datagram(
        &self,
        datagram: &[u8],
        from: SocketAddr,
        out: &mut [u8],
        gro: &mut TunGro,
        static_private: &boringtun::x25519::StaticSecret,
        static_public: &boringtun::x25519::PublicKey,
    ) {
        let peer = {
            let packet = match self
                .rate_limiter
                .verify_packet(Some(from.ip()), datagram, out)
            {
                Ok(p) => p,
                Err(TunnResult::WriteToNetwork(cookie)) => {
                    self.cookies_sent.fetch_add(1, Ordering::Relaxed);
                    let _ = self.udp.send_to(cookie, from);
                    return;
                }
                Err(TunnResult::Err(WireGuardError::UnderLoad)) => {
                    self.drops[GlobalDrop::UnderLoad as usize].fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Err(_) => {
                    self.drops[GlobalDrop::Invalid as usize].fetch_add(1, Ordering::Relaxed);
                    return;
                }
            };
            let t = self.peers.read().unwrap();
            let found = match packet {
                Packet::HandshakeInit(ref p) => {
                    match parse_handshake_anon(static_private, static_public, p) {
                        Ok(hh) => t
                            .by_key
                            .get(&PublicKey::from_bytes(hh.peer_static_public))
                            .cloned(),
                        Err(_) => None,
                    }
                }
                Packet::HandshakeResponse(ref p) => t.by_index.get(&(p.receiver_idx >> 8)).cloned(),
                Packet::PacketCookieReply(ref p) => t.by_index.get(&(p.receiver_idx >> 8)).cloned(),
                Packet::PacketData(ref p) => t.by_index.get(&(p.receiver_idx >> 8)).cloned(),
            };
            match found {
                Some(p) => p,
                None => {
                    self.drops[GlobalDrop::UnknownPeer as usize].fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
        };
        self.handle_peer_datagram(&peer, datagram, from, out, gro);
    }

    fn handle_peer_datagram(
        &self,
        peer: &Arc<Peer>,
        datagram: &[u8],
        from: SocketAddr,
        out: &mut [u8],
        gro: &mut TunGro,
    ) {
        let mut tunn = peer.tunn.lock().unwrap();
        let res = tunn.decapsulate(Some(from.ip()), datagram, out);
        let authenticated = !matches!(res, TunnResult::Err(_));
        match res {
            TunnResult::Err(e) => {
                drop(tunn);
                peer.counters.drop(PeerDrop::Decrypt);
                tracing::trace!(peer = %peer.name, error = ?e, "decapsulate failed");
                return;
            }
            TunnResult::Done => {}
            TunnResult::WriteToNetwork(pkt) => {
                // Handshake response or cookie for the sender, then flush packets
                // that were queued while the session was being established.
                let _ = self.udp.send_to(pkt, from).map(|n| {
                    peer.counters
                        .tx_bytes
                        .fetch_add(n as u64, Ordering::Relaxed)
                });
                while let TunnResult::WriteToNetwork(pkt) = tunn.decapsulate(None, &[], out) {
                    peer.counters.tx_packets.fetch_add(1, Ordering::Relaxed);
                    let _ = self.udp.send_to(pkt, from).map(|n| {
                        peer.counters
                            .tx_bytes
                            .fetch_add(n as u64, Ordering::Relaxed)
                    });
                }
            }
            TunnResult::WriteToTunnelV4(pkt, src) => {
                drop(tunn);
                self.deliver(peer, pkt, IpAddr::V4(src), gro);
            }
            TunnResult::WriteToTunnelV6(pkt, src) => {
                drop(tunn);
                self.deliver(peer, pkt, IpAddr::V6(src), gro);
            }
        }
        if authenticated {
            peer.counters
                .rx_bytes
                .fetch_add(datagram.len() as u64, Ordering::Relaxed);
            // Roaming: only authenticated datagrams may move the endpoint.
            let cur = *peer.endpoint.read().unwrap();
            if cur != Some(from) {
                tracing::info!(peer = %peer.name, old = ?cur, new = %from, "peer endpoint changed");
                *peer.endpoint.write().unwrap() = Some(from);
            }
        }
    }

    fn deliver(&self, peer: &Arc<Peer>, pkt: &[u8], src: IpAddr, gro: &mut TunGro) {
        if packet::src_addr(pkt).is_none() {
            peer.counters.drop(PeerDrop::Malformed);
            return;
        }
        if !peer.allowed.read().unwrap().contains(src) {
            peer.counters.drop(PeerDrop::NotAllowedSource);
            tracing::trace!(peer = %peer.name, %src, "source outside allowed IPs");
            return;
        }
        {
            let mut probe = peer.probe.lock().unwrap();
            if let Some(pr) = probe.as_mut()
                && let Some(seq) = packet::parse_probe_reply_v4(pkt, pr.src)
            {
                pr.state.on_reply(seq, Instant::now());
                return;
            }
        }
        peer.counters.rx_packets.fetch_add(1, Ordering::Relaxed);
        gro.push(peer, pkt);
    }

    /// Rekey/keepalive timers, rate-limiter reset, health probes.
    fn timer_loop(&self) {
        let mut out = vec![0u8; BUF_OUT];
        let mut probe_buf = [0u8; packet::PROBE_LEN];
        let mut last_reset = Instant::now();
        let interval = Duration::from_secs(self.iface.probe_interval);
        while !self.stop.load(Ordering::Relaxed) {
            std::thread::sleep(TIMER_TICK);
            let now = Instant::now();
            if now.duration_since(last_reset) >= Duration::from_secs(1) {
                // The shared limiter is not reset by the Tunns (they were given it), so do it here.
                self.rate_limiter.reset_count();
                last_reset = now;
            }
            for peer in self.peers() {
                let (res, connected) = {
                    let mut t = peer.tunn.lock().unwrap();
                    (t.update_timers(&mut out), t.stats().0.is_some())
                };
                match res {
                    TunnResult::WriteToNetwork(pkt) => self.send_to_peer(&peer, pkt),
                    TunnResult::Err(WireGuardError::ConnectionExpired)
                        // Dialing peers keep trying; a silent server peer just waits.
                        if peer.endpoint.read().unwrap().is_some() => {
                            let mut t = peer.tunn.lock().unwrap();
                            if let TunnResult::WriteToNetwork(pkt) =
                                t.format_handshake_initiation(&mut out, true)
                            {
                                drop(t);
                                self.send_to_peer(&peer, pkt);
                            }
                        }
                    _ => {}
                }
                let (probe_len, force) = {
                    let mut probe = peer.probe.lock().unwrap();
                    // A restarted peer silently drops our old session's packets and
                    // WireGuard alone would notice only after ~15 s; failing probes
                    // prove the session is dead, so re-handshake at REKEY_TIMEOUT pace.
                    // A new peer that has not answered yet is most likely still being set up
                    // on its side (its gateway reloading): ask again soon rather than after
                    // REKEY_TIMEOUT, so a peering is up within a second of both sides being ready.
                    let fresh = |pr: &Probe| {
                        !connected && now.duration_since(pr.created) < FRESH_PEER_WINDOW
                    };
                    let force = match probe.as_mut() {
                        Some(pr)
                            if (fresh(pr)
                                || (pr.state.sent() >= 3 && !pr.state.is_up(now, interval)))
                                && pr.last_forced_handshake.is_none_or(|t| {
                                    now.duration_since(t)
                                        >= if fresh(pr) {
                                            FRESH_PEER_RETRY
                                        } else {
                                            FORCED_REKEY_EVERY
                                        }
                                }) =>
                        {
                            pr.last_forced_handshake = Some(now);
                            true
                        }
                        _ => false,
                    };
                    // Until the first reply, probe every few ticks once a session exists: the
                    // tunnel is reported up as soon as it is, not a probe interval later.
                    let every = |pr: &Probe| {
                        if connected && pr.state.received() == 0 {
                            FIRST_PROBE_EVERY.min(interval)
                        } else {
                            interval
                        }
                    };
                    let len = match probe.as_mut() {
                        Some(pr)
                            if pr
                                .last_sent
                                .is_none_or(|t| now.duration_since(t) >= every(pr)) =>
                        {
                            pr.last_sent = Some(now);
                            let seq = pr.state.on_send(now);
                            packet::build_probe_v4(&mut probe_buf, pr.src, pr.dst, seq)
                        }
                        _ => 0,
                    };
                    (len, force)
                };
                if force && peer.endpoint.read().unwrap().is_some() {
                    tracing::debug!(peer = %peer.name, "probes failing; forcing a new handshake");
                    let res = peer
                        .tunn
                        .lock()
                        .unwrap()
                        .format_handshake_initiation(&mut out, true);
                    if let TunnResult::WriteToNetwork(pkt) = res {
                        self.send_to_peer(&peer, pkt);
                    }
                }
                if probe_len > 0 && peer.endpoint.read().unwrap().is_some() {
                    let res = peer
                        .tunn
                        .lock()
                        .unwrap()
                        .encapsulate(&probe_buf[..probe_len], &mut out);
                    if let TunnResult::WriteToNetwork(pkt) = res {
                        self.send_to_peer(&peer, pkt);
                    }
                }
            }
        }
    }
}

/// Per-thread buffers of the TUN -> UDP direction, allocated once.
struct TunBufs {
    src: Vec<u8>,
    scratch: Vec<u8>,
    dst: Vec<u8>,
    lens: Vec<usize>,
}

impl TunBufs {
    fn new() -> Self {
        Self {
            src: vec![0u8; VNET_HDR_LEN + BUF],
            scratch: vec![0u8; BUF],
            dst: vec![0u8; SEG_OUT],
            lens: Vec::with_capacity(1024),
        }
    }
}

/// Per-thread state of the UDP -> TUN direction.
struct UdpBufs {
    buf: Vec<u8>,
    out: Vec<u8>,
    gro: TunGro,
    static_private: boringtun::x25519::StaticSecret,
    static_public: boringtun::x25519::PublicKey,
}

impl UdpBufs {
    fn new(private: &PrivateKey, public: &PublicKey) -> Self {
        Self {
            buf: vec![0u8; BUF],
            out: vec![0u8; BUF_OUT],
            gro: TunGro::default(),
            static_private: private.to_dalek(),
            static_public: public.to_dalek(),
        }
    }
}

fn pollfd(fd: std::os::fd::RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// Decrypted packets on their way to a peer's TUN, merged where possible
/// (see `offload::Coalescer`). Holds packets of one peer at a time.
#[derive(Default)]
struct TunGro {
    co: offload::Coalescer,
    peer: Option<Arc<Peer>>,
}

fn tun_write(peer: &Peer, hdr: &[u8; VNET_HDR_LEN], pkt: &[u8]) {
    if let Err(e) = peer.tun.send_with_hdr(hdr, pkt) {
        peer.counters.drop(PeerDrop::TunWrite);
        tracing::trace!(peer = %peer.name, error = %e, "TUN write failed");
    }
}

impl TunGro {
    fn push(&mut self, peer: &Arc<Peer>, pkt: &[u8]) {
        if !peer.tun.vnet_hdr() {
            tun_write(peer, &[0; VNET_HDR_LEN], pkt);
            return;
        }
        if self.peer.as_ref().is_some_and(|p| !Arc::ptr_eq(p, peer)) {
            self.flush();
        }
        let p = self.peer.get_or_insert_with(|| peer.clone());
        self.co.push(pkt, &mut |h, b| tun_write(p, h, b));
    }

    fn flush(&mut self) {
        if let Some(p) = self.peer.take() {
            self.co.flush(&mut |h, b| tun_write(&p, h, b));
        }
    }
}

impl Gateway {
    /// Puts the remap programs on the peers' devices and makes their maps match. The devices
    /// exist by now; filters on them go away with them, so a restarted gateway re-applies.
    fn apply_dataplane(
        &self,
        dp: Option<(std::path::PathBuf, fabric_dataplane::DataplaneConfig)>,
    ) -> Result<(), GatewayError> {
        let Some((pin_dir, cfg)) = dp else {
            return Ok(());
        };
        let err = |e: fabric_dataplane::Error| {
            let mut msg = format!("data plane: {e}");
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg.push_str(&format!(": {s}"));
                src = s.source();
            }
            GatewayError::Other(msg)
        };
        let mut slot = self.dataplane.lock().unwrap();
        let plane = match slot.as_mut() {
            Some(p) => p,
            None => slot.insert(fabric_dataplane::Dataplane::load(Some(&pin_dir)).map_err(err)?),
        };
        let report = plane.apply(&cfg).map_err(err)?;
        tracing::info!(pin_dir = %pin_dir.display(), ?report, "data plane applied");
        *self.dataplane_cfg.lock().unwrap() = Some((pin_dir, cfg));
        Ok(())
    }

    /// Puts back what someone changed under the tunnels since they were configured: a peer
    /// device set down, its addresses or routes deleted, a remap filter detached from it, map
    /// entries deleted or overwritten. Cheap when nothing drifted: a few dumps per device and
    /// one map read.
    pub async fn repair(self: &Arc<Self>) {
        let _guard = self.control.lock().await;
        let snap = match netconf::snapshot(&self.netlink).await {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "reading links, addresses and routes");
                None
            }
        };
        for p in self.peers().iter().filter(|_| snap.is_some()) {
            let cfg = p.settings.lock().unwrap().cfg.clone();
            let ifindex = p.tun.ifindex();
            if !snap.as_ref().expect("filtered").up.contains_key(&ifindex) {
                // The device was deleted: the peer is set up again from its configuration
                // (a new device, a new session); the data-plane pass below attaches to it.
                tracing::warn!(peer = %p.name, device = %p.tun.name(), "tunnel device gone; recreating the peer");
                self.remove_peer(&p.public_key).await;
                match self.add_peer(cfg).await {
                    Ok(()) => {
                        self.repairs.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => tracing::error!(peer = %p.name, error = %e, "recreating the peer"),
                }
                continue;
            }
            let drift =
                snap.as_ref()
                    .expect("filtered")
                    .drift(ifindex, &cfg.addresses, &cfg.routes);
            if drift.count() == 0 {
                continue;
            }
            tracing::warn!(device = %p.tun.name(), ?drift, "tunnel device had drifted; restoring");
            let res = async {
                if drift.down {
                    netconf::link_up(&self.netlink, ifindex, self.iface.mtu).await?;
                }
                netconf::sync_addresses(&self.netlink, ifindex, &[], &drift.addresses).await?;
                netconf::sync_routes(&self.netlink, ifindex, &[], &drift.routes).await
            }
            .await;
            match res {
                Ok(()) => {
                    self.repairs
                        .fetch_add(drift.count() as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::error!(device = %p.tun.name(), error = %e, "restoring the device")
                }
            }
        }
        self.repair_dataplane().await;
    }

    async fn repair_dataplane(&self) {
        let Some((pin_dir, cfg)) = self.dataplane_cfg.lock().unwrap().clone() else {
            return;
        };
        let mut detached = Vec::new();
        for p in self.peers() {
            if !cfg.peers.iter().any(|d| d.interface == p.tun.name()) {
                continue;
            }
            match netconf::dataplane_filters_present(&self.netlink, p.tun.ifindex()).await {
                Ok(true) => {}
                Ok(false) => detached.push(p.tun.name().to_string()),
                Err(e) => tracing::warn!(device = %p.tun.name(), error = %e, "checking filters"),
            }
        }
        if !detached.is_empty() {
            tracing::warn!(devices = ?detached, "remap filters missing; attaching them again");
            match self.apply_dataplane(Some((pin_dir, cfg))) {
                Ok(()) => {
                    self.repairs
                        .fetch_add(detached.len() as u64, Ordering::Relaxed);
                }
                Err(e) => tracing::error!(error = %e, "repairing the data plane"),
            }
            return;
        }
        let res = match self.dataplane.lock().unwrap().as_mut() {
            Some(plane) => plane.repair_maps(&cfg),
            None => return,
        };
        match res {
            Ok(0) => {}
            Ok(n) => {
                tracing::warn!(entries = n, "data-plane map entries had drifted; rewritten");
                self.repairs.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e) => tracing::error!(error = %e, "repairing data-plane maps"),
        }
    }
}

fn make_probe(cfg: &PeerConfig) -> Option<Probe> {
    match (cfg.probe_source(), cfg.probe_address) {
        (Some(IpAddr::V4(src)), Some(IpAddr::V4(dst))) => Some(Probe {
            src,
            dst,
            state: ProbeState::default(),
            last_sent: None,
            // The dialing side sends its first initiation when the peer is added.
            last_forced_handshake: Some(Instant::now()),
            created: Instant::now(),
        }),
        _ => None,
    }
}

fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: b is valid for 4 bytes. A short read leaves zeros, which is still a valid start.
    unsafe { libc::getrandom(b.as_mut_ptr().cast(), 4, 0) };
    u32::from_ne_bytes(b)
}
