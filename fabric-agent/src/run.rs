//! `fabric-agent run`: the node agent proper. Watches the peer Configurations of its cluster
//! and keeps one route per remapped peer CIDR towards the gateway; repairs drift as soon as
//! the kernel reports a route change, and at least every `interval`. The gateway is a fixed
//! address, or the active gateway replica's, which its operator publishes on a Lease.
use std::{
    collections::BTreeSet,
    net::{Ipv4Addr, SocketAddr},
    str::FromStr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result};
use fabric_api::{
    names::{DEFAULT_NAMESPACE, annotation::GATEWAY_IP as GATEWAY_IP_ANNOTATION},
    networking::v1alpha1::Configuration,
};
use fabric_routing::{
    overlay::{self, Overlay},
    routes::{self, Route},
};
use futures::StreamExt;
use ipnetwork::Ipv4Network;
use kube::{
    Api, Client,
    core::{ApiResource, DynamicObject, GroupVersionKind},
    runtime::{WatchStreamExt, reflector, watcher},
};
use rtnetlink::{Handle, MulticastGroup};
use tokio::sync::{Notify, watch};
use tracing::{info, warn};

use crate::health::{Health, Part};

/// A Lease by namespace and name, written `NAMESPACE/NAME` (or `NAME` in fabric-system).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRef {
    pub namespace: String,
    pub name: String,
}

impl FromStr for LeaseRef {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (namespace, name) = s.split_once('/').unwrap_or((DEFAULT_NAMESPACE, s));
        let label = |x: &str| {
            !x.is_empty()
                && x.len() <= 253
                && x.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        };
        if !label(namespace) || !label(name) {
            return Err(format!("{s:?}: expected NAMESPACE/NAME of a Lease"));
        }
        Ok(Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    }
}

/// Where the peer CIDRs are routed.
#[derive(Debug, Clone)]
pub enum NextHop {
    Fixed(Ipv4Addr),
    /// The address the active gateway replica publishes on this Lease.
    Lease(LeaseRef),
}

/// The next hop a gateway Lease names: the holder's published address. None while nobody
/// holds it (released on shutdown, not yet taken) or when the address is missing or unreadable.
pub fn lease_next_hop(lease: &DynamicObject) -> Option<Ipv4Addr> {
    let holder = lease.data["spec"]["holderIdentity"].as_str().unwrap_or("");
    if holder.is_empty() {
        return None;
    }
    lease
        .metadata
        .annotations
        .as_ref()?
        .get(GATEWAY_IP_ANNOTATION)?
        .parse()
        .ok()
}

pub struct Opts {
    /// Next hop for every peer CIDR: the gateway (or the overlay address that reaches it).
    pub gateway: NextHop,
    /// The namespace whose Configurations are read (the fabric's).
    pub namespace: String,
    pub interval: Duration,
    pub metrics_addr: Option<SocketAddr>,
    /// Manage routes in this network namespace instead of the agent's own (the API server
    /// stays reachable through the agent's namespace).
    pub route_netns: Option<String>,
    /// Reach the gateway through the VXLAN overlay instead of directly.
    pub overlay: Option<OverlayOpts>,
    /// `/healthz` fails once a watch, the routes or the overlay has kept failing this long.
    pub unhealthy_after: Duration,
}

pub struct OverlayOpts {
    pub overlay: Overlay,
    /// This node's endpoint address.
    pub node_ip: Ipv4Addr,
    /// Where the overlay guard is pinned, so that it outlives the agent (None: it lives as
    /// long as the agent).
    pub guard_pin_dir: Option<std::path::PathBuf>,
}

#[derive(Default)]
struct Metrics {
    /// Overlay datagrams the guard refused (from sources other than the gateway).
    overlay_refused: AtomicU64,
    routes: AtomicU64,
    /// Peer CIDRs not routed (see `refusal`).
    refused: AtomicU64,
    repairs: AtomicU64,
    reconciles: AtomicU64,
    errors: AtomicU64,
    last_ok: AtomicU64,
}

/// Shortest prefix the agent routes to a peer: anything shorter is default-like and would send
/// most of the address space (the API server, the internet) into the tunnel.
pub const MIN_PEER_PREFIX: u8 = 8;

/// Why a peer CIDR is not routed, or `None` when it may be: a default-like prefix, or a range
/// that covers one of `protected` (this node's own addresses and its next hop to the
/// gateway), which would cut the node off from its own network. The API server and IPAM
/// refuse such grants too; the agent checks again because a wrong route on every node is the
/// worst outcome of a bad grant.
pub fn refusal(n: Ipv4Network, protected: &[Ipv4Addr]) -> Option<String> {
    if n.prefix() < MIN_PEER_PREFIX {
        return Some(format!(
            "default-like prefix (shorter than /{MIN_PEER_PREFIX})"
        ));
    }
    protected
        .iter()
        .find(|a| n.contains(**a))
        .map(|a| format!("covers this node's address {a}"))
}

/// The routes the Configurations ask for: each peer's pod and external CIDRs as this
/// cluster sees them (status), via the gateway (on-link through the overlay device `dev` when
/// there is one), and the CIDRs refused (see [`refusal`]) with the reason. Configurations
/// without grants yet are skipped; unreadable CIDRs are skipped with a warning (the API server
/// validates them).
pub fn desired(
    cfgs: &[Arc<Configuration>],
    via: Ipv4Addr,
    dev: Option<u32>,
    protected: &[Ipv4Addr],
) -> (BTreeSet<Route>, BTreeSet<(Ipv4Network, String)>) {
    let mut out = BTreeSet::new();
    let mut refused = BTreeSet::new();
    for c in cfgs {
        let Some(remote) = c.status.as_ref().and_then(|s| s.remote.as_ref()) else {
            continue;
        };
        for n in [remote.pod, remote.external] {
            let dst = Ipv4Network::new(n.network(), n.prefix()).expect("valid");
            match refusal(dst, protected) {
                Some(why) => {
                    refused.insert((dst, why));
                }
                None => {
                    out.insert(Route { dst, via, dev });
                }
            }
        }
    }
    (out, refused)
}

/// This node's IPv4 addresses (in the namespace the routes go to).
async fn local_addrs(h: &Handle) -> Result<Vec<Ipv4Addr>> {
    use rtnetlink::packet_route::address::{AddressAttribute, AddressMessage};
    let mut out = Vec::new();
    let mut s = h.address().get().execute();
    while let Some(m) = s.next().await {
        let m: AddressMessage = m.context("listing this node's addresses")?;
        for a in &m.attributes {
            if let AddressAttribute::Address(std::net::IpAddr::V4(ip)) = a {
                out.push(*ip);
            }
        }
    }
    Ok(out)
}

/// Opens the rtnetlink sockets, in `netns` when given: a socket stays in the namespace it was
/// created in, so only the creating thread needs to switch.
type RouteEvents = futures::channel::mpsc::UnboundedReceiver<(
    rtnetlink::packet_core::NetlinkMessage<rtnetlink::packet_route::RouteNetlinkMessage>,
    rtnetlink::sys::SocketAddr,
)>;

async fn netlink(netns: Option<String>) -> Result<(Handle, RouteEvents)> {
    let rt = tokio::runtime::Handle::current();
    let (conn, handle, _, mconn, events) = std::thread::spawn(move || -> Result<_> {
        if let Some(ns) = &netns {
            fabric_dataplane::sys::enter_netns(ns)?;
        }
        let _g = rt.enter();
        let (conn, handle, unsolicited) = rtnetlink::new_connection().context("netlink socket")?;
        let (mconn, _, events) = rtnetlink::new_multicast_connection(&[MulticastGroup::Ipv4Route])
            .context("netlink route monitor")?;
        Ok((conn, handle, unsolicited, mconn, events))
    })
    .join()
    .map_err(|_| anyhow::anyhow!("netlink thread panicked"))??;
    tokio::spawn(conn);
    tokio::spawn(mconn);
    Ok((handle, events))
}

/// Follows the gateway Lease: sends each next hop it names. A Lease that disappears or names
/// nobody keeps the last known next hop: routes to the last active gateway are the best guess
/// until another replica takes over.
fn follow_lease(
    client: Client,
    lease: &LeaseRef,
    notify: Arc<Notify>,
    health: Arc<Health>,
) -> watch::Receiver<Option<Ipv4Addr>> {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("coordination.k8s.io", "v1", "Lease"));
    let api: Api<DynamicObject> = Api::namespaced_with(client, &lease.namespace, &ar);
    // Only this Lease: RBAC may grant the agent just this name.
    let cfg = watcher::Config::default().fields(&format!("metadata.name={}", lease.name));
    let (tx, rx) = watch::channel(None);
    let name = lease.name.clone();
    tokio::spawn(async move {
        // Every event, not only objects: a watch that recovers without a change (a relist
        // that finds the same Lease) is healthy again.
        let mut s = watcher(api, cfg).default_backoff().boxed();
        while let Some(ev) = s.next().await {
            match ev {
                Ok(ev) => {
                    health.ok(Part::LeaseWatch);
                    let (watcher::Event::Apply(l) | watcher::Event::InitApply(l)) = ev else {
                        continue;
                    };
                    let Some(hop) = lease_next_hop(&l) else {
                        continue;
                    };
                    if tx.send_if_modified(|cur| cur.replace(hop) != Some(hop)) {
                        info!(lease = %name, gateway = %hop, "active gateway");
                        notify.notify_one();
                    }
                }
                Err(e) => {
                    health.failed(Part::LeaseWatch, &e, Instant::now());
                    warn!(error = %e, "watching the gateway Lease")
                }
            }
        }
    });
    rx
}

pub async fn run(client: Client, opts: Opts) -> Result<()> {
    let (handle, mut route_events) = netlink(opts.route_netns.clone()).await?;
    let metrics = Arc::new(Metrics::default());
    let health = Arc::new(Health::default());
    if let Some(addr) = opts.metrics_addr {
        serve_metrics(addr, metrics.clone(), health.clone(), opts.unhealthy_after).await?;
    }
    let changed = Arc::new(Notify::new());
    let next_hop = match &opts.gateway {
        NextHop::Fixed(ip) => watch::channel(Some(*ip)).1,
        NextHop::Lease(l) => follow_lease(client.clone(), l, changed.clone(), health.clone()),
    };
    let api: Api<Configuration> = Api::namespaced(client, &opts.namespace);
    let (reader, writer) = reflector::store();
    let notify = changed.clone();
    let watch_health = health.clone();
    tokio::spawn(async move {
        // Every event, not only objects: a watch that recovers with nothing changed (a
        // relist of no Configurations) is healthy again.
        let mut s = watcher(api, watcher::Config::default())
            .default_backoff()
            .reflect(writer)
            .boxed();
        while let Some(ev) = s.next().await {
            match ev {
                Ok(_) => {
                    watch_health.ok(Part::ConfigurationWatch);
                    notify.notify_one()
                }
                Err(e) => {
                    watch_health.failed(Part::ConfigurationWatch, &e, Instant::now());
                    warn!(error = %e, "watching Configurations")
                }
            }
        }
    });
    // Reconcile only once the first list is in, so routes of live peers are not removed
    // while the cache is still empty after a restart.
    reader
        .wait_until_ready()
        .await
        .context("listing Configurations")?;
    let mut wanted_before: BTreeSet<Route> = BTreeSet::new();
    let mut refused_before = BTreeSet::new();
    let mut overlay_via: Option<Ipv4Addr> = None;
    // The namespace whose overlay port the guard protects: where the routes and devices are.
    let netns_path = match &opts.route_netns {
        Some(ns) if ns.contains('/') => std::path::PathBuf::from(ns),
        Some(ns) => std::path::Path::new("/run/netns").join(ns),
        None => std::path::PathBuf::from("/proc/self/ns/net"),
    };
    let mut guard: Option<fabric_dataplane::guard::OverlayGuard> = None;
    let mut tick = tokio::time::interval(opts.interval);
    let mut waiting_reported = false;
    loop {
        let Some(via) = *next_hop.borrow() else {
            // No active gateway known yet: leave the routes as they are rather than remove
            // them (after a restart they still point at the last active gateway).
            if !waiting_reported {
                info!("waiting for the gateway Lease to name an active gateway");
                waiting_reported = true;
            }
            tokio::select! {
                _ = changed.notified() => {}
                Some(_) = route_events.next() => {}
                _ = tick.tick() => {}
                _ = tokio::signal::ctrl_c() => return Ok(()),
            }
            continue;
        };
        let state = reader.state();
        let mut protected = match local_addrs(&handle).await {
            Ok(a) => a,
            Err(e) => {
                metrics.errors.fetch_add(1, Ordering::Relaxed);
                health.failed(Part::Routes, format!("{e:#}"), Instant::now());
                warn!(error = format!("{e:#}"), "reading this node's addresses");
                tokio::select! {
                    _ = changed.notified() => {}
                    _ = tick.tick() => {}
                    _ = tokio::signal::ctrl_c() => return Ok(()),
                }
                continue;
            }
        };
        protected.push(via);
        // Nothing peered: the overlay device goes too, so an unpeered node carries no trace.
        let peered = !desired(&state, via, None, &protected).0.is_empty();
        let dev = match &opts.overlay {
            None => None,
            Some(o) if !peered => {
                match overlay::remove_device(&handle, &o.overlay).await {
                    Ok(true) => {
                        info!(device = %o.overlay.device, "no peers: overlay device removed")
                    }
                    Ok(false) => {}
                    Err(e) => warn!(error = %e, "removing the overlay device"),
                }
                overlay_via = None;
                guard = None;
                if let Some(dir) = &o.guard_pin_dir {
                    match fabric_dataplane::guard::remove_pinned(dir) {
                        Ok(true) => info!(pins = %dir.display(), "no peers: overlay guard removed"),
                        Ok(false) => {}
                        Err(e) => warn!(error = %e, "removing the overlay guard"),
                    }
                }
                None
            }
            Some(o) => match ensure_overlay(&handle, o, via, overlay_via).await {
                Ok((idx, repaired)) => {
                    health.ok(Part::Overlay);
                    metrics.repairs.fetch_add(repaired, Ordering::Relaxed);
                    overlay_via = Some(via);
                    // Only the gateway may send to the overlay port, and only through the
                    // interface the route to it takes. A failed pass leaves the last guard
                    // (pinned: also a previous agent's) in place.
                    match guard_sources(&handle, via).await.and_then(|sources| {
                        fabric_dataplane::guard::keep(
                            &mut guard,
                            &netns_path,
                            o.overlay.port,
                            o.guard_pin_dir.as_deref(),
                            &sources,
                        )
                        .map_err(anyhow::Error::from)
                    }) {
                        Ok(n) => metrics.overlay_refused.store(n, Ordering::Relaxed),
                        Err(e) => {
                            metrics.errors.fetch_add(1, Ordering::Relaxed);
                            warn!(error = format!("{e:#}"), "overlay guard not updated")
                        }
                    }
                    Some(idx)
                }
                Err(e) => {
                    metrics.errors.fetch_add(1, Ordering::Relaxed);
                    health.failed(Part::Overlay, &e, Instant::now());
                    warn!(error = %e, "setting up the overlay");
                    tokio::select! {
                        _ = changed.notified() => {}
                        _ = tick.tick() => {}
                        _ = tokio::signal::ctrl_c() => return Ok(()),
                    }
                    continue;
                }
            },
        };
        let (want, refused) = desired(&state, via, dev, &protected);
        if refused != refused_before {
            for (cidr, why) in &refused {
                warn!(%cidr, why, "not routing a peer CIDR");
            }
            refused_before = refused;
        }
        metrics
            .refused
            .store(refused_before.len() as u64, Ordering::Relaxed);
        match routes::reconcile(&handle, &want).await {
            Ok(pass) => {
                health.ok(Part::Routes);
                let repaired = pass
                    .added
                    .iter()
                    .filter(|r| wanted_before.contains(r))
                    .count();
                if repaired > 0 {
                    warn!(repaired, "routes had drifted; restored");
                }
                if !pass.added.is_empty() || !pass.removed.is_empty() {
                    info!(added = ?pass.added.iter().map(ToString::to_string).collect::<Vec<_>>(),
                          removed = ?pass.removed.iter().map(ToString::to_string).collect::<Vec<_>>(),
                          "routes reconciled");
                }
                metrics
                    .repairs
                    .fetch_add(repaired as u64, Ordering::Relaxed);
                metrics.routes.store(want.len() as u64, Ordering::Relaxed);
                metrics.last_ok.store(
                    SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs()),
                    Ordering::Relaxed,
                );
                wanted_before = want;
            }
            Err(e) => {
                metrics.errors.fetch_add(1, Ordering::Relaxed);
                health.failed(Part::Routes, &e, Instant::now());
                warn!(error = %e, "reconciling routes");
            }
        }
        metrics.reconciles.fetch_add(1, Ordering::Relaxed);
        tokio::select! {
            _ = changed.notified() => {}
            // Any IPv4 route change in the namespace: cheap to re-check, and it catches a
            // deleted route within milliseconds.
            Some(_) = route_events.next() => {}
            _ = tick.tick() => {}
            _ = tokio::signal::ctrl_c() => {
                info!("stopping; routes stay in place for the next agent");
                return Ok(());
            }
        }
    }
}

/// The overlay guard's allowed sources on a node: the gateway, arriving through the interface
/// the node routes to it (a pod of this node spoofing its address arrives on its own).
async fn guard_sources(h: &Handle, via: Ipv4Addr) -> Result<fabric_dataplane::guard::Sources> {
    let iif = routes::egress_ifindex(h, via)
        .await
        .with_context(|| format!("looking up the route to the gateway {via}"))?
        .with_context(|| format!("no route to the gateway {via}"))?;
    Ok([(via, iif)].into())
}

/// The overlay device towards the gateway `via`: returns its ifindex and how many things had
/// to be put back. `prev` is the gateway of the last good pass: entries for it that had to be
/// added again were removed by someone (drift); entries for a new gateway are not.
async fn ensure_overlay(
    h: &Handle,
    o: &OverlayOpts,
    via: Ipv4Addr,
    prev: Option<Ipv4Addr>,
) -> Result<(u32, u64), overlay::OverlayError> {
    let (idx, dev) = overlay::ensure_device(h, &o.overlay, o.node_ip).await?;
    let entries = overlay::sync_remotes(h, idx, &[via].into()).await?;
    if dev.any() {
        info!(device = %o.overlay.device, ?dev, "overlay device set up");
    }
    if !entries.added.is_empty() || !entries.removed.is_empty() {
        info!(gateway = %via, added = ?entries.added, removed = ?entries.removed, "overlay entries");
    }
    let mut repaired = 0;
    if let Some(p) = prev {
        repaired = u64::from(dev.any())
            + if p == via {
                entries.added.len() as u64
            } else {
                0
            };
        if repaired > 0 {
            warn!(repaired, "overlay had drifted; restored");
        }
    }
    Ok((idx, repaired))
}

impl Metrics {
    /// The Prometheus text of the counters.
    fn render(&self) -> String {
        let mut out = String::new();
        for (name, kind, v) in [
            ("fabric_agent_routes", "gauge", &self.routes),
            ("fabric_agent_routes_refused", "gauge", &self.refused),
            ("fabric_agent_route_repairs_total", "counter", &self.repairs),
            ("fabric_agent_reconciles_total", "counter", &self.reconciles),
            (
                "fabric_agent_reconcile_errors_total",
                "counter",
                &self.errors,
            ),
            (
                "fabric_agent_last_reconcile_timestamp_seconds",
                "gauge",
                &self.last_ok,
            ),
            (
                "fabric_agent_overlay_refused_total",
                "counter",
                &self.overlay_refused,
            ),
        ] {
            out += &format!(
                "# TYPE {name} {kind}\n{name} {}\n",
                v.load(Ordering::Relaxed)
            );
        }
        out
    }
}

async fn serve_metrics(
    addr: SocketAddr,
    m: Arc<Metrics>,
    health: Arc<Health>,
    grace: Duration,
) -> Result<()> {
    let l = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("metrics address {addr}"))?;
    tokio::spawn(fabric_http::serve(
        l,
        fabric_http::Limits::default(),
        move |path| match path {
            "/healthz" | "/readyz" => Some(match health.verdict(Instant::now(), grace) {
                Ok(()) => fabric_http::Reply::ok("text/plain", "ok\n"),
                Err(problems) => fabric_http::Reply {
                    status: 503,
                    content_type: "text/plain",
                    body: problems.join("\n") + "\n",
                },
            }),
            "/metrics" => Some(fabric_http::Reply::ok(fabric_http::PROMETHEUS, m.render())),
            _ => None,
        },
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>, ip: Option<&str>) -> DynamicObject {
        let ar =
            ApiResource::from_gvk(&GroupVersionKind::gvk("coordination.k8s.io", "v1", "Lease"));
        let mut l = DynamicObject::new("fabric-gateway", &ar).data(serde_json::json!({
            "spec": { "holderIdentity": holder, "leaseDurationSeconds": 4 }
        }));
        if let Some(ip) = ip {
            l.metadata.annotations =
                Some([(GATEWAY_IP_ANNOTATION.to_owned(), ip.to_owned())].into());
        }
        l
    }

    #[test]
    fn the_lease_names_the_holders_address() {
        assert_eq!(
            lease_next_hop(&lease(Some("gw-1"), Some("10.0.1.2"))),
            Some(Ipv4Addr::new(10, 0, 1, 2))
        );
        // Released (no holder): the address left on it is no longer anyone's.
        assert_eq!(lease_next_hop(&lease(None, Some("10.0.1.2"))), None);
        assert_eq!(lease_next_hop(&lease(Some(""), Some("10.0.1.2"))), None);
        assert_eq!(lease_next_hop(&lease(Some("gw-1"), None)), None);
        assert_eq!(
            lease_next_hop(&lease(Some("gw-1"), Some("gw-1.local"))),
            None
        );
    }

    #[test]
    fn metrics_name_every_counter() {
        let m = Metrics::default();
        m.routes.store(3, Ordering::Relaxed);
        m.overlay_refused.store(2, Ordering::Relaxed);
        let text = m.render();
        assert!(text.contains("# TYPE fabric_agent_routes gauge\nfabric_agent_routes 3\n"));
        assert!(text.contains("fabric_agent_overlay_refused_total 2\n"));
        assert!(text.contains("fabric_agent_routes_refused 0\n"));
        assert_eq!(text.lines().filter(|l| l.starts_with("# TYPE")).count(), 7);
    }

    #[test]
    fn lease_refs_parse() {
        assert_eq!(
            "fabric-system/fabric-gateway".parse::<LeaseRef>(),
            Ok(LeaseRef {
                namespace: "fabric-system".into(),
                name: "fabric-gateway".into()
            })
        );
        assert_eq!(
            "gw".parse::<LeaseRef>().map(|l| l.namespace),
            Ok("fabric-system".into())
        );
        for bad in ["", "/gw", "ns/", "Ns/gw", "a/b/c"] {
            assert!(bad.parse::<LeaseRef>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn default_like_and_covering_cidrs_are_not_routed() {
        let net = |s: &str| s.parse::<Ipv4Network>().unwrap();
        let node = [Ipv4Addr::new(192, 168, 7, 20), Ipv4Addr::new(10, 0, 1, 1)];
        for (cidr, refused) in [
            ("0.0.0.0/0", true),
            ("128.0.0.0/1", true),
            ("10.0.0.0/7", true),
            ("192.168.0.0/16", true),
            ("10.0.0.0/8", true),
            ("10.0.1.1/32", true),
            ("10.64.0.0/16", false),
            ("192.168.8.0/24", false),
            ("11.0.0.0/8", false),
        ] {
            assert_eq!(refusal(net(cidr), &node).is_some(), refused, "{cidr}");
        }
        let cfg: Configuration = serde_json::from_value(serde_json::json!({
            "apiVersion": "networking.fabric.io/v1alpha1",
            "kind": "Configuration",
            "metadata": { "name": "b", "namespace": "fabric-system" },
            "spec": { "clusterId": "b", "remote": { "pod": "10.244.0.0/16", "external": "10.70.0.0/16" } },
            "status": { "remote": { "pod": "10.64.0.0/16", "external": "192.168.0.0/16" } }
        }))
        .unwrap();
        let (routes, refused) = desired(&[Arc::new(cfg)], node[1], None, &node);
        assert_eq!(
            routes.iter().map(|r| r.dst).collect::<Vec<_>>(),
            [net("10.64.0.0/16")]
        );
        assert_eq!(refused.len(), 1);
        let (cidr, why) = refused.first().unwrap();
        assert_eq!(*cidr, net("192.168.0.0/16"));
        assert!(why.contains("192.168.7.20"), "{why}");
    }

    #[test]
    fn routes_follow_the_next_hop() {
        let cfg: Configuration = serde_json::from_value(serde_json::json!({
            "apiVersion": "networking.fabric.io/v1alpha1",
            "kind": "Configuration",
            "metadata": { "name": "b", "namespace": "fabric-system" },
            "spec": { "clusterId": "b", "remote": { "pod": "10.244.0.0/16", "external": "10.70.0.0/16" } },
            "status": { "remote": { "pod": "10.64.0.0/16", "external": "10.65.0.0/16" } }
        }))
        .unwrap();
        let cfgs = [Arc::new(cfg)];
        let a = desired(&cfgs, Ipv4Addr::new(10, 0, 1, 1), None, &[]).0;
        let b = desired(&cfgs, Ipv4Addr::new(10, 0, 1, 2), None, &[]).0;
        assert_eq!(a.len(), 2);
        // A takeover moves every route: all old ones go, all new ones come.
        let (add, del) = routes::diff(&a, &b);
        assert_eq!(del, a.iter().copied().collect::<Vec<_>>());
        assert_eq!(add, b.iter().copied().collect::<Vec<_>>());
    }
}
