//! The gateway's end of the VXLAN overlay (`--overlay`): a `fabric.vx` device in the gateway's
//! network namespace with an endpoint for every node, and a route for each node's pod CIDRs
//! to that node through it. Nodes and their pod CIDRs come from the Node objects (InternalIP,
//! spec.podCIDRs); the agents set up the nodes' ends towards the active gateway.
//!
//! Many CNIs hand out pod addresses without `spec.podCIDRs` (Calico's IPAM blocks, Cilium's
//! cluster pool, cloud VPC CNIs). For a node without them, each of its pods gets a /32 route
//! to the node instead, from the Pod objects (status.podIP on spec.nodeName).
use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
};

use fabric_routing::{
    overlay::{self, Overlay},
    routes::{self, Route},
};
use ipnetwork::Ipv4Network;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{ResourceExt, runtime::watcher};
use rtnetlink::Handle;
use tracing::{info, warn};

/// A node as the overlay needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub name: String,
    pub ip: Ipv4Addr,
    pub pod_cidrs: Vec<Ipv4Network>,
}

/// Where pods with addresses of their own run: a compact view of the Pod objects, kept from a
/// watch (only the address and the node of each pod, not the objects).
#[derive(Debug, Default, Clone)]
pub struct PodPlaces {
    /// namespace/name -> (pod IP, node name).
    pods: BTreeMap<String, (Ipv4Addr, String)>,
    /// Filled during a (re)list, swapped in when it is complete.
    relist: Option<BTreeMap<String, (Ipv4Addr, String)>>,
    /// A complete list has been seen.
    pub ready: bool,
}

/// A pod's own IPv4 address and node; None for pods without one (pending, finished, host
/// network, IPv6 only).
fn place(p: &Pod) -> Option<(Ipv4Addr, String)> {
    let spec = p.spec.as_ref()?;
    if spec.host_network == Some(true) {
        return None;
    }
    let st = p.status.as_ref()?;
    if matches!(st.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return None;
    }
    let ip: Ipv4Addr = st.pod_ip.as_deref()?.parse().ok()?;
    if st.host_ip.as_deref() == Some(&ip.to_string()) {
        return None;
    }
    Some((ip, spec.node_name.clone()?))
}

impl PodPlaces {
    /// Takes one watch event; returns whether the view changed.
    pub fn apply(&mut self, ev: watcher::Event<Pod>) -> bool {
        let key = |p: &Pod| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any());
        match ev {
            watcher::Event::Init => {
                self.relist = Some(BTreeMap::new());
                false
            }
            watcher::Event::InitApply(p) => {
                if let (Some(l), Some(pl)) = (self.relist.as_mut(), place(&p)) {
                    l.insert(key(&p), pl);
                }
                false
            }
            watcher::Event::InitDone => {
                let new = self.relist.take().unwrap_or_default();
                let changed = new != self.pods || !self.ready;
                self.pods = new;
                self.ready = true;
                changed
            }
            watcher::Event::Apply(p) => match place(&p) {
                Some(pl) => self.pods.insert(key(&p), pl.clone()) != Some(pl),
                None => self.pods.remove(&key(&p)).is_some(),
            },
            watcher::Event::Delete(p) => self.pods.remove(&key(&p)).is_some(),
        }
    }

    /// The pod addresses on node `name`.
    pub fn on_node(&self, name: &str) -> Vec<Ipv4Addr> {
        let mut v: Vec<Ipv4Addr> = self
            .pods
            .values()
            .filter(|(_, n)| n == name)
            .map(|(ip, _)| *ip)
            .collect();
        v.sort();
        v.dedup();
        v
    }
}

/// The nodes that can be reached, and for the others why not. A node without pod CIDRs is
/// reached for its pods' own addresses (from `pods`).
pub fn endpoints<'a>(
    nodes: impl IntoIterator<Item = &'a Node>,
    pods: &PodPlaces,
) -> (Vec<Endpoint>, BTreeMap<String, String>) {
    let mut ok = Vec::new();
    let mut skipped = BTreeMap::new();
    for n in nodes {
        let name = n.name_any();
        let ip = n
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
            .and_then(|a| a.address.parse::<Ipv4Addr>().ok());
        let Some(ip) = ip else {
            skipped.insert(name, "no IPv4 InternalIP in status.addresses".into());
            continue;
        };
        let spec = n.spec.clone().unwrap_or_default();
        let mut cidrs: Vec<String> = spec.pod_cidrs.unwrap_or_default();
        if cidrs.is_empty() {
            cidrs.extend(spec.pod_cidr);
        }
        let pod_cidrs: Vec<Ipv4Network> = cidrs
            .iter()
            .filter_map(|c| c.parse::<Ipv4Network>().ok())
            .map(|c| Ipv4Network::new(c.network(), c.prefix()).expect("valid prefix"))
            .collect();
        let pod_cidrs = if pod_cidrs.is_empty() {
            pods.on_node(&name)
                .into_iter()
                .map(|ip| Ipv4Network::new(ip, 32).expect("a /32"))
                .collect()
        } else {
            pod_cidrs
        };
        ok.push(Endpoint {
            name,
            ip,
            pod_cidrs,
        });
    }
    ok.sort_by(|a, b| a.name.cmp(&b.name));
    (ok, skipped)
}

/// Each node's pod CIDRs via that node, on-link through the overlay device `dev`.
pub fn desired_routes(eps: &[Endpoint], dev: u32) -> BTreeSet<Route> {
    eps.iter()
        .flat_map(|e| {
            e.pod_cidrs.iter().map(move |c| Route {
                dst: *c,
                via: e.ip,
                dev: Some(dev),
            })
        })
        .collect()
}

/// The gateway's overlay, kept in line with the Node objects.
pub struct GatewayOverlay {
    pub overlay: Overlay,
    /// The gateway's own address on the cluster network (the nodes' tunnel endpoint).
    pub local: Ipv4Addr,
    pub handle: Handle,
    reported: BTreeMap<String, String>,
    /// Lets only the nodes reach the overlay port (see fabric_dataplane::guard).
    guard: Option<fabric_dataplane::guard::OverlayGuard>,
    /// Where the guard is pinned to outlive the operator (None: it lives with it).
    guard_pin_dir: Option<std::path::PathBuf>,
    refused: u64,
}

impl GatewayOverlay {
    pub fn new(
        overlay: Overlay,
        local: Ipv4Addr,
        handle: Handle,
        guard_pin_dir: Option<std::path::PathBuf>,
    ) -> Self {
        Self {
            overlay,
            local,
            handle,
            reported: BTreeMap::new(),
            guard: None,
            guard_pin_dir,
            refused: 0,
        }
    }

    /// One pass: device, node endpoints, routes; with nothing peered, no device at all.
    pub async fn sync<'a>(
        &mut self,
        nodes: impl IntoIterator<Item = &'a Node>,
        pods: &PodPlaces,
        peered: bool,
    ) -> anyhow::Result<()> {
        if !peered {
            self.guard = None;
            if let Some(dir) = &self.guard_pin_dir
                && fabric_dataplane::guard::remove_pinned(dir)?
            {
                info!(pins = %dir.display(), "no peers: overlay guard removed");
            }
            if overlay::remove_device(&self.handle, &self.overlay).await? {
                info!(device = %self.overlay.device, "no peers: overlay device removed");
            }
            return Ok(());
        }
        let (eps, skipped) = endpoints(nodes, pods);
        for (n, why) in &skipped {
            if self.reported.get(n) != Some(why) {
                warn!(node = %n, why, "node not reachable through the overlay");
            }
        }
        self.reported = skipped;
        let (idx, dev) = overlay::ensure_device(&self.handle, &self.overlay, self.local).await?;
        if dev.any() {
            info!(device = %self.overlay.device, ?dev, "overlay device set up");
        }
        let remotes: BTreeSet<Ipv4Addr> = eps.iter().map(|e| e.ip).collect();
        self.guard_sources(&remotes).await;
        let entries = overlay::sync_remotes(&self.handle, idx, &remotes).await?;
        if !entries.added.is_empty() || !entries.removed.is_empty() {
            info!(added = ?entries.added, removed = ?entries.removed, "overlay node entries");
        }
        let pass = routes::reconcile(&self.handle, &desired_routes(&eps, idx)).await?;
        if !pass.added.is_empty() || !pass.removed.is_empty() {
            info!(
                added = ?pass.added.iter().map(ToString::to_string).collect::<Vec<_>>(),
                removed = ?pass.removed.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "overlay routes to the nodes' pods"
            );
        }
        Ok(())
    }

    /// Keeps the guard on with the nodes as the allowed sources, each through the interface
    /// the route to it takes, and reports refusals. A node without a route is left out (its
    /// overlay traffic could not come back anyway). A failed pass leaves the last guard (when
    /// pinned, also a previous operator's) in place.
    async fn guard_sources(&mut self, nodes: &BTreeSet<Ipv4Addr>) {
        let mut sources = fabric_dataplane::guard::Sources::new();
        for ip in nodes {
            match routes::egress_ifindex(&self.handle, *ip).await {
                Ok(Some(iif)) => {
                    sources.insert(*ip, iif);
                }
                Ok(None) => {
                    warn!(node = %ip, "no route to the node: not admitted to the overlay port")
                }
                Err(e) => {
                    warn!(node = %ip, error = %e, "looking up the route to a node; overlay guard not updated");
                    return;
                }
            }
        }
        let netns = std::path::Path::new("/proc/self/ns/net");
        match fabric_dataplane::guard::keep(
            &mut self.guard,
            netns,
            self.overlay.port,
            self.guard_pin_dir.as_deref(),
            &sources,
        ) {
            Ok(n) if n > self.refused => {
                warn!(
                    refused = n - self.refused,
                    total = n,
                    "overlay guard refused datagrams from sources that are not nodes"
                );
                self.refused = n;
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "overlay guard not updated"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, ip: Option<&str>, cidrs: &[&str]) -> Node {
        let addresses = match ip {
            Some(ip) => serde_json::json!([
                { "type": "Hostname", "address": name },
                { "type": "InternalIP", "address": ip },
            ]),
            None => serde_json::json!([]),
        };
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": name },
            "spec": { "podCIDRs": cidrs },
            "status": { "addresses": addresses }
        }))
        .unwrap()
    }

    fn pod(ns: &str, name: &str, node: &str, ip: &str, host_network: bool) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "namespace": ns },
            "spec": { "nodeName": node, "hostNetwork": host_network,
                      "containers": [{ "name": "c" }] },
            "status": { "phase": "Running", "podIP": ip, "hostIP": "10.0.1.13" }
        }))
        .unwrap()
    }

    #[test]
    fn pod_places_follow_the_watch() {
        let mut pp = PodPlaces::default();
        assert!(!pp.apply(watcher::Event::Init));
        assert!(!pp.apply(watcher::Event::InitApply(pod(
            "a", "p1", "n4", "10.9.0.5", false
        ))));
        // Host-network pods have no address of their own.
        pp.apply(watcher::Event::InitApply(pod(
            "a",
            "h",
            "n4",
            "10.0.1.13",
            true,
        )));
        assert!(
            !pp.ready && pp.on_node("n4").is_empty(),
            "nothing before the list is complete"
        );
        assert!(pp.apply(watcher::Event::InitDone));
        assert_eq!(
            pp.on_node("n4"),
            vec!["10.9.0.5".parse::<Ipv4Addr>().unwrap()]
        );
        assert!(pp.apply(watcher::Event::Apply(pod(
            "a", "p2", "n4", "10.9.0.6", false
        ))));
        assert!(!pp.apply(watcher::Event::Apply(pod(
            "a", "p2", "n4", "10.9.0.6", false
        ))));
        assert!(pp.apply(watcher::Event::Delete(pod(
            "a", "p1", "n4", "10.9.0.5", false
        ))));
        assert_eq!(
            pp.on_node("n4"),
            vec!["10.9.0.6".parse::<Ipv4Addr>().unwrap()]
        );
        // A relist drops what it no longer lists.
        pp.apply(watcher::Event::Init);
        assert!(pp.apply(watcher::Event::InitDone));
        assert!(pp.on_node("n4").is_empty());
    }

    #[test]
    fn endpoints_need_an_address_and_a_pod_cidr_or_pods() {
        let mut pods = PodPlaces::default();
        pods.apply(watcher::Event::Init);
        pods.apply(watcher::Event::InitApply(pod(
            "a", "p", "n4", "10.9.0.5", false,
        )));
        pods.apply(watcher::Event::InitDone);
        let (ok, skipped) = endpoints(
            &[
                node("n2", Some("10.0.1.11"), &["10.244.2.0/24", "fd00::/64"]),
                node("n1", Some("10.0.1.10"), &["10.244.1.0/24"]),
                node("n3", None, &["10.244.3.0/24"]),
                node("n4", Some("10.0.1.13"), &[]),
            ],
            &pods,
        );
        assert_eq!(
            ok.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
            ["n1", "n2", "n4"]
        );
        assert_eq!(ok[1].pod_cidrs, vec!["10.244.2.0/24".parse().unwrap()]);
        // Without pod CIDRs, the node's pods one by one.
        assert_eq!(ok[2].pod_cidrs, vec!["10.9.0.5/32".parse().unwrap()]);
        assert_eq!(skipped.len(), 1);
        assert!(skipped["n3"].contains("InternalIP"));
        let r = desired_routes(&ok, 9);
        assert_eq!(r.len(), 3);
        assert!(r.iter().all(|r| r.dev == Some(9)));
        assert!(r.contains(&Route {
            dst: "10.244.1.0/24".parse().unwrap(),
            via: "10.0.1.10".parse().unwrap(),
            dev: Some(9)
        }));
    }
}
