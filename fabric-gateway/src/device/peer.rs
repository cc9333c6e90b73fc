//! The peers and their lifecycle: created with their TUN device and session, updated in
//! place, removed with their device.

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::{
        Arc, Mutex, RwLock,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::Instant,
};

use boringtun::noise::{Tunn, TunnResult, rate_limiter::RateLimiter};

use super::{Gateway, GatewayError};
use crate::{
    allowed_ips::AllowedIps, config::PeerConfig, key::PublicKey, netconf, reconfig::PeerUpdate,
    timers::ProbeTimers, tun::Tun,
};

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
    /// Decrypted, but the remap data plane is not (or no longer) in place on the peer's
    /// device: delivered, the packet could go in untranslated.
    DataplaneNotReady,
}
pub(super) const PEER_DROP_NAMES: [&str; 7] = [
    "not_allowed_source",
    "no_endpoint",
    "decrypt",
    "tun_write",
    "udp_send",
    "malformed",
    "dataplane_not_ready",
];

#[derive(Default)]
pub(super) struct PeerCounters {
    pub(super) rx_bytes: AtomicU64,
    pub(super) tx_bytes: AtomicU64,
    pub(super) rx_packets: AtomicU64,
    pub(super) tx_packets: AtomicU64,
    pub(super) drops: [AtomicU64; 7],
}

impl PeerCounters {
    #[inline]
    pub(super) fn drop(&self, why: PeerDrop) {
        self.drops[why as usize].fetch_add(1, Ordering::Relaxed);
    }
}

/// The in-tunnel health probe of a peer: its addresses and its timers.
pub(super) struct Probe {
    pub(super) src: Ipv4Addr,
    pub(super) dst: Ipv4Addr,
    pub(super) timers: ProbeTimers,
}

pub struct Peer {
    pub(super) name: String,
    pub(super) public_key: PublicKey,
    pub(super) index: u32,
    pub(super) tunn: Mutex<Tunn>,
    pub(super) endpoint: RwLock<Option<SocketAddr>>,
    pub(super) allowed: RwLock<AllowedIps>,
    pub(super) tun: Tun,
    pub(super) counters: PeerCounters,
    pub(super) probe: Mutex<Option<Probe>>,
    /// The configuration in force; what may change on reload without recreating the device.
    pub(super) cfg: Mutex<PeerConfig>,
    /// Whether decrypted packets may go to the device: the remap data plane is in place on
    /// it (always, for a peer that asks for none). Cleared until the data plane is applied
    /// and whenever the drift repair finds it gone; one load per packet, no syscall.
    pub(super) dataplane_ready: AtomicBool,
    pub(super) stop: AtomicBool,
    pub(super) reader: Mutex<Option<JoinHandle<()>>>,
    /// Stamped by the reader on every pass (see `liveness`).
    pub(super) beat: super::liveness::Heartbeat,
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
pub(super) struct PeerTable {
    pub(super) by_key: HashMap<PublicKey, Arc<Peer>>,
    pub(super) by_index: HashMap<u32, Arc<Peer>>,
}

fn make_probe(cfg: &PeerConfig) -> Option<Probe> {
    match (cfg.probe_source(), cfg.probe_address) {
        (Some(IpAddr::V4(src)), Some(IpAddr::V4(dst))) => Some(Probe {
            src,
            dst,
            timers: ProbeTimers::new(Instant::now()),
        }),
        _ => None,
    }
}

/// The limiter a `Tunn` insists on, one that never limits (see `Gateway::new_tunn`).
pub(super) fn unlimited_limiter(public: &PublicKey) -> RateLimiter {
    RateLimiter::new(&public.to_dalek(), u64::MAX)
}

impl Gateway {
    fn new_tunn(&self, key: &PublicKey, keepalive: Option<u16>, index: u32) -> Tunn {
        // Handshakes are limited once, by the gateway's shared limiter before a datagram is
        // matched to a peer. The state machine insists on a limiter of its own: give it one
        // that never limits, or it would count every handshake a second time and, under load,
        // answer with cookies of its own.
        let id = self.identity();
        Tunn::new(
            id.private_key.to_dalek(),
            key.to_dalek(),
            None,
            keepalive,
            index,
            Some(Arc::new(unlimited_limiter(&id.public_key))),
        )
    }

    pub(super) async fn add_peer(self: &Arc<Self>, cfg: PeerConfig) -> Result<(), GatewayError> {
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
        if cfg.id.is_some() {
            // The kernel's own backstop while the remap program is missing (until the drift
            // repair notices): an untranslated source routes elsewhere, so strict reverse-path
            // filtering drops it.
            netconf::strict_rp_filter(&device).map_err(|e| nc(netconf::NetconfError::Sysctl(e)))?;
        }

        // 24 bits: boringtun shifts the index left by 8 for its session counter.
        let index = self.next_index.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff;
        let endpoint = crate::endpoints::starting_endpoint(
            cfg.endpoint,
            self.learnt.lock().unwrap().get(&cfg.public_key).copied(),
        );
        let peer = Arc::new(Peer {
            name: cfg.name.clone(),
            public_key: cfg.public_key,
            index,
            tunn: Mutex::new(self.new_tunn(&cfg.public_key, cfg.persistent_keepalive, index)),
            endpoint: RwLock::new(endpoint),
            allowed: RwLock::new(AllowedIps::new(cfg.allowed_ips.iter().copied())),
            tun,
            counters: PeerCounters::default(),
            probe: Mutex::new(make_probe(&cfg)),
            dataplane_ready: AtomicBool::new(super::repair::dataplane_ready(cfg.id, false)),
            cfg: Mutex::new(cfg.clone()),
            stop: AtomicBool::new(false),
            reader: Mutex::new(None),
            beat: super::liveness::Heartbeat::new(Instant::now()),
        });
        if self.busy_poll().is_none() {
            let (g, p) = (self.clone(), peer.clone());
            let h = super::spawn(format!("fgw-tun-{}", peer.tun.name()), move || {
                g.tun_loop(&p)
            })?;
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
            endpoint = ?endpoint,
            role = if cfg.endpoint.is_some() { "client" } else { "server" },
            "peer added"
        );
        // Clients dial right away instead of waiting for the first packet, and so does a
        // restarted server that remembers where its peer was (its sessions are gone).
        if endpoint.is_some() {
            self.initiate_handshake(&peer);
        }
        Ok(())
    }

    /// Remembers the learnt endpoints of the running peers for the next run (see
    /// `crate::endpoints`) when they changed. Only on an endpoint change, which takes an
    /// authenticated datagram from a new address: rare, so written where it is noticed.
    pub(super) fn remember_endpoints(&self) {
        let Some(path) = &self.endpoint_memory else {
            return;
        };
        let now = crate::endpoints::to_remember(self.peers().iter().map(|p| {
            (
                p.public_key,
                p.cfg.lock().unwrap().endpoint,
                *p.endpoint.read().unwrap(),
            )
        }));
        let mut learnt = self.learnt.lock().unwrap();
        if *learnt == now {
            return;
        }
        let tmp = path.with_extension("tmp");
        let res = std::fs::write(&tmp, crate::endpoints::render(&now))
            .and_then(|()| std::fs::rename(&tmp, path));
        match res {
            Ok(()) => *learnt = now,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "remembering learnt endpoints")
            }
        }
    }

    pub(super) fn initiate_handshake(&self, peer: &Peer) {
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

    pub(super) async fn remove_peer(&self, key: &PublicKey) {
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
    pub(super) async fn update_peer(
        &self,
        peer: &Arc<Peer>,
        cfg: PeerConfig,
    ) -> Result<(), GatewayError> {
        let old = peer.cfg.lock().unwrap().clone();
        let Some(update) = PeerUpdate::between(&old, &cfg) else {
            return Ok(());
        };
        let nc = |source| GatewayError::Netconf {
            peer: cfg.name.clone(),
            device: peer.tun.name().to_string(),
            source: Box::new(source),
        };
        let ifindex = peer.tun.ifindex();
        netconf::sync_addresses(&self.netlink, ifindex, &old.addresses, &cfg.addresses)
            .await
            .map_err(nc)?;
        netconf::sync_routes(&self.netlink, ifindex, &old.routes, &cfg.routes)
            .await
            .map_err(nc)?;
        if let Some(endpoint) = update.endpoint {
            *peer.endpoint.write().unwrap() = endpoint;
        }
        *peer.allowed.write().unwrap() = AllowedIps::new(cfg.allowed_ips.iter().copied());
        if update.new_session {
            *peer.tunn.lock().unwrap() =
                self.new_tunn(&peer.public_key, cfg.persistent_keepalive, peer.index);
        }
        if update.new_probe {
            *peer.probe.lock().unwrap() = make_probe(&cfg);
        }
        tracing::info!(peer = %peer.name, endpoint = ?cfg.endpoint, "peer updated");
        *peer.cfg.lock().unwrap() = cfg;
        if update.dial {
            self.initiate_handshake(peer);
        }
        Ok(())
    }
}
