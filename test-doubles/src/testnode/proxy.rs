//! The test node's service proxy (the test clusters run no kube-proxy): each ClusterIP Service
//! port (TCP, UDP) is DNATed to one of its ready endpoints, picked at random per connection,
//! from ALL the Service's EndpointSlices (label `kubernetes.io/service-name`), whoever wrote
//! them — the fabric's translated slices on a provider count as much as the stand-in
//! controller's. A port without ready endpoints is refused (TCP reset, ICMP port unreachable)
//! rather than left to time out, as kube-proxy does. Headless and ExternalName Services get
//! nothing.
//!
//! One nftables table of its own, [`TABLE`], in the node's namespace: NAT at prerouting (the
//! node's pods come in through their veths) and output (the node's own processes), rebuilt
//! whole in one `nft -f` transaction after each burst of changes; conntrack reverses the DNAT
//! on replies. Pure: [`programme`] (which backends each Service port gets) and
//! [`Programme::script`] (the nft transaction); the watch loop is [`run`].
//!
//! Not done: session affinity, NodePorts, external IPs and load balancers, traffic policies,
//! topology, hairpin (a pod reaching itself through its Service), IPv6, and flushing UDP
//! conntrack entries of endpoints that went.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
    sync::Arc,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use kube::{Api, Client, ResourceExt, runtime::watcher};
use tokio::sync::Notify;
use tracing::{debug, info, warn};

use fabric_kube::cache::notifying;

use crate::endpoints::SERVICE_NAME_LABEL;

/// The proxy's nftables table (family `ip`).
pub const TABLE: &str = "fabt-proxy";

/// One Service port as the proxy programs it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Entry {
    /// `namespace/name:port-name`, for the rules' comments.
    pub service: String,
    pub cluster_ip: Ipv4Addr,
    pub port: u16,
    /// `tcp` or `udp`.
    pub protocol: &'static str,
    /// Ready endpoints (address, port), in order; empty: refused.
    pub backends: Vec<(Ipv4Addr, u16)>,
}

/// What the proxy programs: one entry per ClusterIP Service port.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Programme {
    pub entries: Vec<Entry>,
}

fn protocol(p: Option<&str>) -> Option<&'static str> {
    match p.unwrap_or("TCP") {
        "TCP" => Some("tcp"),
        "UDP" => Some("udp"),
        _ => None,
    }
}

/// The entries for `services` from `slices` (of any writer; those of other Services, other
/// address types, and endpoints not ready are left out). Endpoints count by port name, as
/// kube-proxy matches a slice's ports to the Service's.
pub fn programme(services: &[&Service], slices: &[&EndpointSlice]) -> Programme {
    let mut by_service: BTreeMap<(String, String), Vec<&EndpointSlice>> = BTreeMap::new();
    for s in slices.iter().filter(|s| s.address_type == "IPv4") {
        if let Some(svc) = s.labels().get(SERVICE_NAME_LABEL) {
            by_service
                .entry((s.namespace().unwrap_or_default(), svc.clone()))
                .or_default()
                .push(s);
        }
    }
    let mut entries = Vec::new();
    for svc in services {
        let Some(spec) = &svc.spec else { continue };
        if spec.type_.as_deref() == Some("ExternalName") {
            continue;
        }
        let Some(cluster_ip) = spec
            .cluster_ip
            .as_deref()
            .and_then(|ip| ip.parse::<Ipv4Addr>().ok())
        else {
            // Headless ("None"), not allocated yet, or IPv6.
            continue;
        };
        let (ns, name) = (svc.namespace().unwrap_or_default(), svc.name_any());
        let mine = by_service
            .get(&(ns.clone(), name.clone()))
            .map(Vec::as_slice)
            .unwrap_or_default();
        for sp in spec.ports.iter().flatten() {
            let Some(proto) = protocol(sp.protocol.as_deref()) else {
                continue;
            };
            let Ok(port) = u16::try_from(sp.port) else {
                continue;
            };
            let port_name = sp.name.clone().unwrap_or_default();
            let mut backends = BTreeSet::new();
            for slice in mine {
                let Some(target) = slice.ports.iter().flatten().find_map(|p| {
                    (p.name.clone().unwrap_or_default() == port_name
                        && protocol(p.protocol.as_deref()) == Some(proto))
                    .then_some(p.port)
                    .flatten()
                    .and_then(|n| u16::try_from(n).ok())
                }) else {
                    continue;
                };
                for e in slice.endpoints.iter().flatten() {
                    // Unset means ready (the API's convention).
                    if e.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                        continue;
                    }
                    backends.extend(
                        e.addresses
                            .iter()
                            .filter_map(|a| a.parse::<Ipv4Addr>().ok())
                            .map(|a| (a, target)),
                    );
                }
            }
            entries.push(Entry {
                service: format!("{ns}/{name}:{port_name}"),
                cluster_ip,
                port,
                protocol: proto,
                backends: backends.into_iter().collect(),
            });
        }
    }
    entries.sort();
    Programme { entries }
}

impl Programme {
    /// Services with at least one port programmed.
    pub fn services(&self) -> usize {
        self.entries
            .iter()
            .map(|e| e.service.rsplit_once(':').map_or("", |(s, _)| s))
            .collect::<BTreeSet<_>>()
            .len()
    }

    /// The nft transaction replacing [`TABLE`] with this programme (creating it first so
    /// that deleting it cannot fail): applied at once, or not at all.
    pub fn script(&self) -> String {
        let mut nat = String::new();
        let mut refuse = String::new();
        for e in &self.entries {
            let (ip, proto, port) = (e.cluster_ip, e.protocol, e.port);
            let comment = format!("comment \"{}\"", e.service.replace('"', ""));
            let m = format!("ip daddr {ip} {proto} dport {port}");
            if e.backends.is_empty() {
                let how = if proto == "tcp" {
                    "reject with tcp reset"
                } else {
                    "reject"
                };
                refuse += &format!("\t\t{m} {how} {comment}\n");
            } else {
                let map = e
                    .backends
                    .iter()
                    .enumerate()
                    .map(|(i, (a, p))| format!("{i} : {a} . {p}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                nat += &format!(
                    "\t\t{m} dnat to numgen random mod {} map {{ {map} }} {comment}\n",
                    e.backends.len()
                );
            }
        }
        format!(
            "table ip {TABLE}\n\
             delete table ip {TABLE}\n\
             table ip {TABLE} {{\n\
             \tchain services {{\n{nat}\t}}\n\
             \tchain no-endpoints {{\n{refuse}\t}}\n\
             \tchain nat-prerouting {{\n\
             \t\ttype nat hook prerouting priority -100; policy accept;\n\
             \t\tjump services\n\
             \t}}\n\
             \tchain nat-output {{\n\
             \t\ttype nat hook output priority -100; policy accept;\n\
             \t\tjump services\n\
             \t}}\n\
             \tchain filter-prerouting {{\n\
             \t\ttype filter hook prerouting priority -90; policy accept;\n\
             \t\tjump no-endpoints\n\
             \t}}\n\
             \tchain filter-output {{\n\
             \t\ttype filter hook output priority 0; policy accept;\n\
             \t\tjump no-endpoints\n\
             \t}}\n\
             }}\n"
        )
    }
}

async fn nft(script: &str) -> Result<()> {
    use tokio::io::AsyncWriteExt as _;
    let mut child = tokio::process::Command::new("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running nft")?;
    let mut stdin = child.stdin.take().context("nft's stdin")?;
    stdin.write_all(script.as_bytes()).await?;
    drop(stdin);
    let out = child.wait_with_output().await?;
    if !out.status.success() {
        bail!("nft -f: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Removes [`TABLE`] from this namespace (on shutdown); missing is fine.
pub fn remove() {
    let r = std::process::Command::new("nft")
        .args(["delete", "table", "ip", TABLE])
        .output();
    match r {
        Ok(o) if o.status.success() => info!(table = TABLE, "service proxy table removed"),
        Ok(o) if String::from_utf8_lossy(&o.stderr).contains("No such file") => {}
        Ok(o) => {
            warn!(table = TABLE, error = %String::from_utf8_lossy(&o.stderr).trim(), "removing")
        }
        Err(e) => warn!(table = TABLE, error = %e, "running nft"),
    }
}

/// Watches Services and EndpointSlices and keeps [`TABLE`] in this process's network
/// namespace programmed; returns only when programming fails to start at all.
pub async fn run(client: Client) -> Result<()> {
    let changed = Arc::new(Notify::new());
    let services = notifying(
        Api::<Service>::all(client.clone()),
        watcher::Config::default(),
        changed.clone(),
    )
    .0;
    let slices = notifying(
        Api::<EndpointSlice>::all(client),
        watcher::Config::default().labels(SERVICE_NAME_LABEL),
        changed.clone(),
    )
    .0;
    services.wait_until_ready().await.context("service watch")?;
    slices.wait_until_ready().await.context("slice watch")?;
    let mut last: Option<Programme> = None;
    loop {
        let (svcs, sl) = (services.state(), slices.state());
        let p = programme(
            &svcs.iter().map(|s| &**s).collect::<Vec<_>>(),
            &sl.iter().map(|s| &**s).collect::<Vec<_>>(),
        );
        let mut failed = false;
        if last.as_ref() != Some(&p) {
            let script = p.script();
            match nft(&script).await {
                Ok(()) => {
                    info!(
                        services = p.services(),
                        ports = p.entries.len(),
                        refused = p.entries.iter().filter(|e| e.backends.is_empty()).count(),
                        "service proxy programmed"
                    );
                    debug!("{script}");
                    last = Some(p);
                }
                // The table stays as it was (one transaction); retried below.
                Err(e) => {
                    warn!(error = %format!("{e:#}"), "programming the service proxy");
                    failed = true;
                }
            }
        }
        if !failed {
            changed.notified().await;
        } else {
            // Failed: tried again on the next change, or soon.
            let _ = tokio::time::timeout(Duration::from_secs(2), changed.notified()).await;
        }
        // Debounce: one rebuild per burst of events.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn svc(ns: &str, name: &str, ip: &str, ports: Value) -> Service {
        serde_json::from_value(json!({
            "metadata": { "name": name, "namespace": ns },
            "spec": { "clusterIP": ip, "ports": ports },
        }))
        .unwrap()
    }

    fn slice(ns: &str, svc: &str, ports: Value, endpoints: Value) -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": { "name": format!("{svc}-x"), "namespace": ns,
                          "labels": { SERVICE_NAME_LABEL: svc, "endpointslice.kubernetes.io/managed-by": "anyone" } },
            "addressType": "IPv4", "ports": ports, "endpoints": endpoints,
        }))
        .unwrap()
    }

    fn ep(ip: &str, ready: Option<bool>) -> Value {
        match ready {
            Some(r) => json!({ "addresses": [ip], "conditions": { "ready": r } }),
            None => json!({ "addresses": [ip] }),
        }
    }

    fn backends(p: &Programme, service: &str) -> Vec<String> {
        p.entries
            .iter()
            .find(|e| e.service == service)
            .unwrap_or_else(|| panic!("no {service} in {p:?}"))
            .backends
            .iter()
            .map(|(a, p)| format!("{a}:{p}"))
            .collect()
    }

    #[test]
    fn ready_endpoints_of_every_slice_of_the_service_by_port_name() {
        let web = svc(
            "app",
            "web",
            "10.96.0.10",
            json!([{ "name": "http", "port": 80 }, { "name": "dns", "port": 53, "protocol": "UDP" }]),
        );
        let ours = slice(
            "app",
            "web",
            json!([{ "name": "http", "port": 8080, "protocol": "TCP" }, { "name": "dns", "port": 5353, "protocol": "UDP" }]),
            json!([
                ep("10.244.1.5", Some(true)),
                ep("10.244.2.5", Some(false)),
                ep("10.244.2.6", None)
            ]),
        );
        // Another writer's slice (the fabric's translated one), its own port numbers.
        let theirs = slice(
            "app",
            "web",
            json!([{ "name": "http", "port": 9090 }]),
            json!([ep("10.64.1.7", Some(true))]),
        );
        // Same name elsewhere, and an IPv6 slice: not this Service's endpoints.
        let other_ns = slice(
            "other",
            "web",
            json!([{ "name": "http", "port": 1 }]),
            json!([ep("10.244.9.9", Some(true))]),
        );
        let mut v6 = slice(
            "app",
            "web",
            json!([{ "name": "http", "port": 1 }]),
            json!([ep("fd00::1", Some(true))]),
        );
        v6.address_type = "IPv6".into();
        let p = programme(&[&web], &[&ours, &theirs, &other_ns, &v6]);
        assert_eq!(
            backends(&p, "app/web:http"),
            ["10.64.1.7:9090", "10.244.1.5:8080", "10.244.2.6:8080"]
        );
        assert_eq!(
            backends(&p, "app/web:dns"),
            ["10.244.1.5:5353", "10.244.2.6:5353"]
        );
        let dns = p
            .entries
            .iter()
            .find(|e| e.service == "app/web:dns")
            .unwrap();
        assert_eq!(
            (dns.cluster_ip, dns.port, dns.protocol),
            ("10.96.0.10".parse().unwrap(), 53, "udp")
        );
        assert_eq!(p.services(), 1);
    }

    #[test]
    fn headless_external_name_and_unallocated_services_get_nothing() {
        let ports = json!([{ "port": 80 }]);
        let headless = svc("app", "h", "None", ports.clone());
        let unallocated = svc("app", "u", "", ports.clone());
        let mut ext = svc("app", "e", "10.96.0.3", ports.clone());
        ext.spec.as_mut().unwrap().type_ = Some("ExternalName".into());
        let sctp = svc(
            "app",
            "s",
            "10.96.0.4",
            json!([{ "port": 80, "protocol": "SCTP" }]),
        );
        let s = slice(
            "app",
            "h",
            json!([{ "port": 80 }]),
            json!([ep("10.244.1.5", Some(true))]),
        );
        let p = programme(&[&headless, &unallocated, &ext, &sctp], &[&s]);
        assert!(p.entries.is_empty(), "{p:?}");
        assert_eq!(p.services(), 0);
    }

    #[test]
    fn the_script_replaces_the_table_at_once_and_refuses_ports_without_endpoints() {
        let web = svc("app", "web", "10.96.0.10", json!([{ "port": 80 }]));
        let empty = svc(
            "app",
            "empty",
            "10.96.0.11",
            json!([{ "port": 80 }, { "name": "u", "port": 53, "protocol": "UDP" }]),
        );
        let s = slice(
            "app",
            "web",
            json!([{ "port": 8080 }]),
            json!([ep("10.244.1.5", Some(true)), ep("10.244.2.5", Some(true))]),
        );
        let script = programme(&[&web, &empty], &[&s]).script();
        let lines: Vec<&str> = script.lines().map(str::trim).collect();
        // Created, deleted and written again in one transaction: no window without rules,
        // and nothing left of the previous programme.
        assert_eq!(
            lines[..3],
            [
                "table ip fabt-proxy",
                "delete table ip fabt-proxy",
                "table ip fabt-proxy {"
            ]
        );
        assert!(lines.contains(
            &"ip daddr 10.96.0.10 tcp dport 80 dnat to numgen random mod 2 map { 0 : 10.244.1.5 . 8080, 1 : 10.244.2.5 . 8080 } comment \"app/web:\""
        ), "{script}");
        assert!(
            lines.contains(
                &"ip daddr 10.96.0.11 tcp dport 80 reject with tcp reset comment \"app/empty:\""
            ),
            "{script}"
        );
        assert!(
            lines.contains(&"ip daddr 10.96.0.11 udp dport 53 reject comment \"app/empty:u\""),
            "{script}"
        );
        for hook in [
            "type nat hook prerouting",
            "type nat hook output",
            "type filter hook prerouting",
            "type filter hook output",
        ] {
            assert!(
                lines.iter().any(|l| l.starts_with(hook)),
                "{hook}: {script}"
            );
        }
        // Nothing programmed: still a valid, empty table.
        let none = Programme::default().script();
        assert!(none.contains("chain services {\n\t}"), "{none}");
    }
}
