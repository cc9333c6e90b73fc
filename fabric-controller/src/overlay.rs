//! The gateway's end of the VXLAN overlay (`--overlay`): a `fabric.vx` device in the gateway's
//! network namespace with an endpoint for every node, and a route for each node's pod CIDRs
//! to that node through it. Nodes and their pod CIDRs come from the Node objects (InternalIP,
//! spec.podCIDRs); the agents set up the nodes' ends towards the active gateway.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
};

use fabric_routing::{
    overlay::{self, Overlay},
    routes::{self, Route},
};
use ipnetwork::Ipv4Network;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use rtnetlink::Handle;
use tracing::{info, warn};

/// A node as the overlay needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub name: String,
    pub ip: Ipv4Addr,
    pub pod_cidrs: Vec<Ipv4Network>,
}

/// The nodes that can be reached, and for the others why not.
pub fn endpoints(nodes: &[Node]) -> (Vec<Endpoint>, BTreeMap<String, String>) {
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
        if pod_cidrs.is_empty() {
            skipped.insert(name, "no IPv4 spec.podCIDRs".into());
            continue;
        }
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
}

impl GatewayOverlay {
    pub fn new(overlay: Overlay, local: Ipv4Addr, handle: Handle) -> Self {
        Self {
            overlay,
            local,
            handle,
            reported: BTreeMap::new(),
        }
    }

    /// One pass: device, node endpoints, routes; with nothing peered, no device at all.
    pub async fn sync(&mut self, nodes: &[Node], peered: bool) -> anyhow::Result<()> {
        if !peered {
            if overlay::remove_device(&self.handle, &self.overlay).await? {
                info!(device = %self.overlay.device, "no peers: overlay device removed");
            }
            return Ok(());
        }
        let (eps, skipped) = endpoints(nodes);
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

    #[test]
    fn endpoints_need_an_address_and_a_pod_cidr() {
        let (ok, skipped) = endpoints(&[
            node("n2", Some("10.0.1.11"), &["10.244.2.0/24", "fd00::/64"]),
            node("n1", Some("10.0.1.10"), &["10.244.1.0/24"]),
            node("n3", None, &["10.244.3.0/24"]),
            node("n4", Some("10.0.1.13"), &[]),
        ]);
        assert_eq!(
            ok.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
            ["n1", "n2"]
        );
        assert_eq!(ok[1].pod_cidrs, vec!["10.244.2.0/24".parse().unwrap()]);
        assert_eq!(skipped.len(), 2);
        assert!(skipped["n3"].contains("InternalIP"));
        assert!(skipped["n4"].contains("podCIDRs"));
        let r = desired_routes(&ok, 9);
        assert_eq!(r.len(), 2);
        assert!(r.iter().all(|r| r.dev == Some(9)));
        assert!(r.contains(&Route {
            dst: "10.244.1.0/24".parse().unwrap(),
            via: "10.0.1.10".parse().unwrap(),
            dev: Some(9)
        }));
    }
}
