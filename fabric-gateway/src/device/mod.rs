//! The running gateway, the I/O side of the split: one UDP socket, one TUN device and one
//! boringtun `Tunn` per peer. The decisions it executes are pure and live elsewhere: the
//! timer policy in `timers`, reconfiguration in `reconfig` and `uapi`, packet parsing and
//! offloads in `packet` and `offload`.
//!
//! Data plane runs on plain OS threads (a reader per TUN, one UDP reader, one timer thread;
//! or one polling thread for everything, see `poll`) with buffers allocated once per
//! thread, so the per-packet path does no heap allocation and never waits on the async
//! control plane. The control plane (reload, UAPI, netlink, repair) runs on tokio and only
//! takes short locks.
//!
//! - `peer`: the peers and their lifecycle (add, update, remove)
//! - `tx`, `rx`, `poll`: the packet loops and their batching (GSO out, GRO in)
//! - `timers`: the timer thread, executing `crate::timers`
//! - `reconfig`: reload and the UAPI (`wg`)
//! - `status`: the status snapshot
//! - `repair`: the data plane's programs and maps, and drift repair

mod liveness;
mod peer;
mod poll;
mod reconfig;
mod repair;
mod rx;
mod status;
mod timers;
mod tx;

use std::{
    io,
    net::{SocketAddr, UdpSocket},
    sync::{
        Arc, Mutex, RwLock,
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use boringtun::noise::rate_limiter::RateLimiter;

pub use self::peer::{Peer, PeerDrop};
use self::peer::{PeerTable, unlimited_limiter};
use crate::handshake_limit::SourceLimiter;
use crate::{
    config::{Config, InterfaceConfig},
    key::{PrivateKey, PublicKey},
    netconf, udp,
};

/// Handshakes per second before cookies are demanded. Every handshake message
/// is counted once, by the shared limiter (the peers' state machines get limiters
/// that never limit).
const HANDSHAKE_RATE_LIMIT: u64 = 200;
/// How long a blocking read waits before the loops look at their stop flags again.
const POLL_TIMEOUT: Duration = Duration::from_millis(250);

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
    #[error("UDP socket timeout: {0}")]
    SocketTimeout(#[source] io::Error),
    #[error("spawning thread {name}: {source}")]
    Spawn { name: String, source: io::Error },
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
    // The message carries the whole chain: reload joins the messages of several errors.
    #[error("data plane: {}", chain(.0.as_ref()))]
    Dataplane(#[source] Box<fabric_dataplane::Error>),
    /// What a reload could not apply (the rest was applied).
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Reload(Vec<GatewayError>),
}

/// `e: its source: its source's source …`
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

/// Indices into `Gateway::drops`; names are metric label values.
#[derive(Clone, Copy)]
#[repr(usize)]
enum GlobalDrop {
    UnknownPeer = 0,
    Invalid,
    UnderLoad,
    /// A handshake message over its source's share while the gateway is under load.
    HandshakeFlood,
}
const GLOBAL_DROP_NAMES: [&str; 4] = ["unknown_peer", "invalid", "under_load", "handshake_flood"];

/// The gateway's static key pair and the handshake limiter made for its public key (cookies
/// are keyed by it). Replaced whole when the key file holds a new key (see `rotate_key`).
pub(super) struct Identity {
    pub(super) private_key: PrivateKey,
    pub(super) public_key: PublicKey,
    pub(super) rate_limiter: Arc<RateLimiter>,
}

impl Identity {
    fn new(private_key: PrivateKey) -> Arc<Self> {
        let public_key = private_key.public_key();
        Arc::new(Self {
            rate_limiter: Arc::new(RateLimiter::new(
                &public_key.to_dalek(),
                HANDSHAKE_RATE_LIMIT,
            )),
            private_key,
            public_key,
        })
    }
}

pub struct Gateway {
    iface: InterfaceConfig,
    /// Read by the packet threads once per receive through `identity_gen`, not per datagram.
    identity: RwLock<Arc<Identity>>,
    /// Bumped when the identity is replaced.
    identity_gen: AtomicU64,
    udp: UdpSocket,
    /// Cleared when the kernel refuses UDP_SEGMENT; we then send datagram by datagram.
    udp_gso: AtomicBool,
    peers: RwLock<PeerTable>,
    /// Bumped on every peer add/remove, so the poll loop knows to rebuild its fd set.
    peers_gen: AtomicU64,
    next_index: AtomicU32,
    stop: AtomicBool,
    started: Instant,
    drops: [AtomicU64; 4],
    /// Per-source handshake limits under load (see `handshake_limit`); taken for handshake
    /// messages only, never for data.
    sources: Mutex<SourceLimiter>,
    cookies_sent: AtomicU64,
    /// The UDP (or poll) thread and the timer thread, with the heartbeat each stamps.
    threads: Mutex<Vec<(JoinHandle<()>, Arc<liveness::Heartbeat>)>>,
    /// Serialises control-plane mutations (reload, UAPI set, repair).
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
    /// The configuration last started or reloaded with when all of it was applied (None
    /// after a reload that failed in part): what a restarted operator compares with.
    running: Mutex<Option<Config>>,
    /// Where learnt endpoints are remembered across restarts (see `crate::endpoints`), and
    /// what it holds.
    endpoint_memory: Option<std::path::PathBuf>,
    learnt: Mutex<crate::endpoints::Learnt>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("name", &self.iface.name)
            .field("public_key", &self.public_key())
            .finish_non_exhaustive()
    }
}

impl Gateway {
    /// Binds the socket, creates all peers and starts the data-plane threads.
    /// Must run inside a tokio runtime (netlink).
    /// Starts the gateway with `cfg`. With `endpoint_memory`, peers without a configured
    /// endpoint are dialled at the endpoint they were last seen at (remembered there by an
    /// earlier run), and learnt endpoints are remembered there.
    pub async fn start(
        cfg: Config,
        netlink: rtnetlink::Handle,
        endpoint_memory: Option<std::path::PathBuf>,
    ) -> Result<Arc<Self>, GatewayError> {
        let learnt = endpoint_memory
            .as_deref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .map(|t| crate::endpoints::parse(&t))
            .unwrap_or_default();
        if !learnt.is_empty() {
            tracing::info!(
                peers = learnt.len(),
                "endpoints learnt by the previous run: dialling them"
            );
        }
        let identity = Identity::new(PrivateKey::read_file(&cfg.interface.private_key_file)?);
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
            .map_err(GatewayError::SocketTimeout)?;
        let gro = udp::tune(&udp);
        tracing::debug!(gro, "UDP socket tuned");
        let gw = Arc::new(Self {
            iface: cfg.interface.clone(),
            identity: RwLock::new(identity),
            identity_gen: AtomicU64::new(0),
            udp,
            udp_gso: AtomicBool::new(true),
            peers: RwLock::default(),
            peers_gen: AtomicU64::new(0),
            // Random start, so a restarted gateway does not reuse the session
            // indices its peers may still be sending to.
            next_index: AtomicU32::new(random_u32() & 0x00ff_ffff),
            stop: AtomicBool::new(false),
            started: Instant::now(),
            drops: Default::default(),
            sources: Mutex::new(SourceLimiter::new(HANDSHAKE_RATE_LIMIT, Instant::now())),
            cookies_sent: AtomicU64::new(0),
            threads: Mutex::default(),
            dataplane: Mutex::default(),
            dataplane_cfg: Mutex::default(),
            repairs: AtomicU64::new(0),
            control: tokio::sync::Mutex::new(()),
            netlink,
            running: Mutex::new(Some(cfg.clone())),
            endpoint_memory,
            learnt: Mutex::new(learnt),
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
        // Also drops those of peers removed while no gateway ran.
        gw.sync_fallbacks().await;
        let g = gw.clone();
        let spin = gw.busy_poll();
        let (udp_beat, timer_beat) = (
            Arc::new(liveness::Heartbeat::new(Instant::now())),
            Arc::new(liveness::Heartbeat::new(Instant::now())),
        );
        let beat = udp_beat.clone();
        let udp_thread = spawn(
            if spin.is_some() {
                "fgw-poll"
            } else {
                "fgw-udp"
            },
            move || match spin {
                Some(spin) => g.poll_loop(spin, &beat),
                None => g.udp_loop(&beat),
            },
        )?;
        let (g, beat) = (gw.clone(), timer_beat.clone());
        let timer_thread = spawn("fgw-timers", move || g.timer_loop(&beat))?;
        gw.threads
            .lock()
            .unwrap()
            .extend([(udp_thread, udp_beat), (timer_thread, timer_beat)]);
        tracing::info!(
            name = %gw.iface.name,
            public_key = %gw.public_key(),
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
        self.identity().public_key
    }

    pub(super) fn identity(&self) -> Arc<Identity> {
        self.identity.read().unwrap().clone()
    }

    /// Takes a new static key up without a restart: every tunnel is re-keyed (boringtun drops
    /// its sessions) and starts a handshake with the new key; the peers accept it once they
    /// have learnt the new public key (their `PublicKey` of this cluster), and until then
    /// refuse it as from an unknown peer.
    pub(super) fn rotate_key(&self, private_key: PrivateKey) {
        let id = Identity::new(private_key);
        let public = id.public_key;
        *self.identity.write().unwrap() = id.clone();
        self.identity_gen.fetch_add(1, Ordering::Release);
        for peer in self.peers() {
            peer.tunn.lock().unwrap().set_static_private(
                id.private_key.to_dalek(),
                public.to_dalek(),
                Some(Arc::new(unlimited_limiter(&public))),
            );
            self.initiate_handshake(&peer);
        }
        tracing::info!(public_key = %public, "private key rotated: tunnels re-keyed");
    }

    pub fn listen_port(&self) -> u16 {
        self.udp
            .local_addr()
            .map(|a| a.port())
            .unwrap_or(self.iface.listen_port)
    }

    /// The running peers, by name.
    pub fn peers(&self) -> Vec<Arc<Peer>> {
        let mut v: Vec<_> = self
            .peers
            .read()
            .unwrap()
            .by_key
            .values()
            .cloned()
            .collect();
        v.sort_by(|a, b| a.name().cmp(b.name()));
        v
    }

    fn peer_by_key(&self, k: &PublicKey) -> Option<Arc<Peer>> {
        self.peers.read().unwrap().by_key.get(k).cloned()
    }

    /// Stops all threads and removes every TUN device.
    pub async fn shutdown(self: &Arc<Self>) {
        self.stop.store(true, Ordering::Relaxed);
        for p in self.peers() {
            self.remove_peer(&p.public_key).await;
        }
        let threads: Vec<_> = std::mem::take(&mut *self.threads.lock().unwrap());
        let _ = tokio::task::spawn_blocking(move || {
            for (t, _) in threads {
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
}

fn spawn(
    name: impl Into<String>,
    f: impl FnOnce() + Send + 'static,
) -> Result<JoinHandle<()>, GatewayError> {
    let name = name.into();
    std::thread::Builder::new()
        .name(name.clone())
        .spawn(f)
        .map_err(|source| GatewayError::Spawn { name, source })
}

fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: b is valid for 4 bytes. A short read leaves zeros, which is still a valid start.
    unsafe { libc::getrandom(b.as_mut_ptr().cast(), 4, 0) };
    u32::from_ne_bytes(b)
}
