//! Gateway status snapshot: served as JSON (`fabric-gateway status`, `/status`)
//! and rendered as Prometheus text exposition (`/metrics`).

use std::{collections::BTreeMap, fmt::Write as _};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Status {
    pub name: String,
    pub public_key: String,
    pub listen_port: u16,
    pub uptime_seconds: f64,
    /// Datagrams that could not be attributed to any peer, by reason.
    pub drops: BTreeMap<String, u64>,
    pub cookie_replies_sent: u64,
    /// Things put back after someone changed them: tunnel devices set up again, their
    /// addresses and routes, remap filters, data-plane map entries.
    #[serde(default)]
    pub repairs: u64,
    pub peers: Vec<PeerStatus>,
    /// What keeps this gateway from serving; empty while it can. The operator gives the
    /// gateway Lease up (and does not take it) while its gateway reports any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<Problem>,
}

/// Why a running gateway cannot serve.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "problem", rename_all = "snake_case")]
pub enum Problem {
    /// A packet thread (the UDP reader or poller, the timer thread, a tunnel device's
    /// reader) ended while the gateway runs: what it carried goes nowhere.
    ThreadStopped { thread: String },
    /// A packet thread still exists but has not come round its loop for `seconds` (blocked in
    /// a lock, a send or a device): what it carries is stuck.
    ThreadStuck { thread: String, seconds: u64 },
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ThreadStopped { thread } => write!(f, "packet thread {thread} stopped"),
            Self::ThreadStuck { thread, seconds } => {
                write!(f, "packet thread {thread} stuck for {seconds} s")
            }
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PeerStatus {
    pub name: String,
    pub public_key: String,
    /// TUN device carrying this peer's traffic (for attaching eBPF programs).
    pub device: String,
    pub ifindex: u32,
    pub endpoint: Option<String>,
    pub allowed_ips: Vec<String>,
    pub up: bool,
    pub probe_enabled: bool,
    pub probe_rtt_seconds: Option<f64>,
    pub probe_sent: u64,
    pub probe_received: u64,
    pub probe_lost: u64,
    pub latest_handshake_age_seconds: Option<f64>,
    /// Encrypted bytes on the UDP socket, like `wg show` transfer.
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    /// Inner (tunnelled) packets.
    pub rx_packets: u64,
    pub tx_packets: u64,
    pub drops: BTreeMap<String, u64>,
    /// What the eBPF remap programs on the peer's device counted (when the data plane runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataplane: Option<DataplaneCounters>,
}

/// Per-direction counters of the remap programs on a peer's device.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct DataplaneCounters {
    pub egress: BTreeMap<String, u64>,
    pub ingress: BTreeMap<String, u64>,
}

impl DataplaneCounters {
    pub fn from_counters(
        egress: &fabric_common::Counters,
        ingress: &fabric_common::Counters,
    ) -> Self {
        let m = |c: &fabric_common::Counters| {
            BTreeMap::from([
                ("packets".to_owned(), c.packets),
                ("bytes".to_owned(), c.bytes),
                ("remapped".to_owned(), c.remapped),
                ("mss_clamped".to_owned(), c.mss_clamped),
                ("icmp_errors".to_owned(), c.icmp_errors),
                ("dropped".to_owned(), c.dropped),
                ("refused".to_owned(), c.refused),
            ])
        };
        Self {
            egress: m(egress),
            ingress: m(ingress),
        }
    }
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Prometheus text format 0.0.4.
pub fn render_metrics(s: &Status) -> String {
    let mut o = String::with_capacity(1024 + s.peers.len() * 1024);
    let gw = format!("gateway=\"{}\"", esc(&s.name));
    let family = |o: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(o, "# HELP fabric_gateway_{name} {help}");
        let _ = writeln!(o, "# TYPE fabric_gateway_{name} {kind}");
    };
    family(
        &mut o,
        "uptime_seconds",
        "gauge",
        "Seconds since the gateway started.",
    );
    let _ = writeln!(
        o,
        "fabric_gateway_uptime_seconds{{{gw}}} {}",
        s.uptime_seconds
    );
    family(&mut o, "peers", "gauge", "Configured peers.");
    let _ = writeln!(o, "fabric_gateway_peers{{{gw}}} {}", s.peers.len());
    family(
        &mut o,
        "cookie_replies_sent_total",
        "counter",
        "Cookie replies sent because of handshake load.",
    );
    let _ = writeln!(
        o,
        "fabric_gateway_cookie_replies_sent_total{{{gw}}} {}",
        s.cookie_replies_sent
    );
    family(
        &mut o,
        "repairs_total",
        "counter",
        "Tunnel device state, addresses, routes, remap filters and map entries put back after \
         they were changed by hand.",
    );
    let _ = writeln!(o, "fabric_gateway_repairs_total{{{gw}}} {}", s.repairs);
    family(
        &mut o,
        "unattributed_drops_total",
        "counter",
        "Datagrams dropped before a peer was known, by reason.",
    );
    for (r, v) in &s.drops {
        let _ = writeln!(
            o,
            "fabric_gateway_unattributed_drops_total{{{gw},reason=\"{}\"}} {v}",
            esc(r)
        );
    }

    type Get = fn(&PeerStatus) -> Option<f64>;
    let per_peer: [(&str, &str, &str, Get); 11] = [
        (
            "peer_up",
            "gauge",
            "1 if in-tunnel probes (or, without probes, recent handshakes) succeed.",
            |p| Some(p.up as u8 as f64),
        ),
        (
            "peer_rx_bytes_total",
            "counter",
            "Encrypted bytes received from the peer.",
            |p| Some(p.rx_bytes as f64),
        ),
        (
            "peer_tx_bytes_total",
            "counter",
            "Encrypted bytes sent to the peer.",
            |p| Some(p.tx_bytes as f64),
        ),
        (
            "peer_rx_packets_total",
            "counter",
            "Tunnelled packets received from the peer.",
            |p| Some(p.rx_packets as f64),
        ),
        (
            "peer_tx_packets_total",
            "counter",
            "Tunnelled packets sent to the peer.",
            |p| Some(p.tx_packets as f64),
        ),
        (
            "peer_handshake_age_seconds",
            "gauge",
            "Seconds since the latest handshake.",
            |p| p.latest_handshake_age_seconds,
        ),
        (
            "peer_probe_rtt_seconds",
            "gauge",
            "Round-trip time of the latest in-tunnel probe.",
            |p| p.probe_rtt_seconds,
        ),
        (
            "peer_probe_sent_total",
            "counter",
            "In-tunnel probes sent.",
            |p| p.probe_enabled.then_some(p.probe_sent as f64),
        ),
        (
            "peer_probe_received_total",
            "counter",
            "In-tunnel probe replies received.",
            |p| p.probe_enabled.then_some(p.probe_received as f64),
        ),
        (
            "peer_probe_lost_total",
            "counter",
            "In-tunnel probes never answered.",
            |p| p.probe_enabled.then_some(p.probe_lost as f64),
        ),
        (
            "peer_ifindex",
            "gauge",
            "Interface index of the peer's TUN device.",
            |p| Some(p.ifindex as f64),
        ),
    ];
    for (name, kind, help, get) in per_peer {
        family(&mut o, name, kind, help);
        for p in &s.peers {
            if let Some(v) = get(p) {
                let _ = writeln!(o, "fabric_gateway_{name}{{{gw},{}}} {v}", peer_labels(p));
            }
        }
    }
    family(
        &mut o,
        "peer_drops_total",
        "counter",
        "Packets of a peer dropped, by reason.",
    );
    for p in &s.peers {
        for (r, v) in &p.drops {
            let _ = writeln!(
                o,
                "fabric_gateway_peer_drops_total{{{gw},{},reason=\"{}\"}} {v}",
                peer_labels(p),
                esc(r)
            );
        }
    }
    family(
        &mut o,
        "dataplane_total",
        "counter",
        "Counters of the eBPF remap programs on a peer's device, by direction and kind.",
    );
    for p in &s.peers {
        let Some(d) = &p.dataplane else { continue };
        for (dir, m) in [("egress", &d.egress), ("ingress", &d.ingress)] {
            for (what, v) in m {
                let _ = writeln!(
                    o,
                    "fabric_gateway_dataplane_total{{{gw},{},direction=\"{dir}\",counter=\"{what}\"}} {v}",
                    peer_labels(p)
                );
            }
        }
    }
    o
}

/// The peer's name and device only: metrics are scraped from a port every pod (and, through
/// the fabric, every peer's pod) can reach, so keys and endpoints stay on the control socket.
fn peer_labels(p: &PeerStatus) -> String {
    format!("peer=\"{}\",device=\"{}\"", esc(&p.name), esc(&p.device))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Status {
        Status {
            name: "fabric".into(),
            public_key: "pk".into(),
            listen_port: 51820,
            uptime_seconds: 1.5,
            drops: BTreeMap::from([("unknown_peer".into(), 3)]),
            cookie_replies_sent: 0,
            repairs: 2,
            peers: vec![PeerStatus {
                name: "b\"x".into(),
                public_key: "k".into(),
                device: "fab-b".into(),
                ifindex: 7,
                endpoint: None,
                allowed_ips: vec![],
                up: true,
                probe_enabled: true,
                probe_rtt_seconds: Some(0.002),
                probe_sent: 5,
                probe_received: 4,
                probe_lost: 1,
                latest_handshake_age_seconds: None,
                rx_bytes: 100,
                tx_bytes: 200,
                rx_packets: 1,
                tx_packets: 2,
                drops: BTreeMap::from([("not_allowed_source".into(), 9)]),
                dataplane: Some(DataplaneCounters::from_counters(
                    &fabric_common::Counters {
                        packets: 10,
                        remapped: 7,
                        ..Default::default()
                    },
                    &fabric_common::Counters::default(),
                )),
            }],
            problems: vec![],
        }
    }

    #[test]
    fn problems_are_typed_and_absent_when_there_are_none() {
        let ok = sample();
        let json = serde_json::to_string(&ok).unwrap();
        assert!(!json.contains("problems"), "{json}");
        assert_eq!(serde_json::from_str::<Status>(&json).unwrap(), ok);
        let broken = Status {
            problems: vec![Problem::ThreadStopped {
                thread: "fgw-udp".into(),
            }],
            ..ok
        };
        let json = serde_json::to_string(&broken).unwrap();
        assert!(
            json.contains(r#""problems":[{"problem":"thread_stopped","thread":"fgw-udp"}]"#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<Status>(&json).unwrap(), broken);
        assert_eq!(
            broken.problems[0].to_string(),
            "packet thread fgw-udp stopped"
        );
    }

    #[test]
    fn metrics_contain_expected_series_and_escape_labels() {
        let m = render_metrics(&sample());
        let labels = r#"gateway="fabric",peer="b\"x",device="fab-b""#;
        for line in [
            format!("fabric_gateway_peer_up{{{labels}}} 1"),
            format!("fabric_gateway_peer_rx_bytes_total{{{labels}}} 100"),
            format!("fabric_gateway_peer_probe_rtt_seconds{{{labels}}} 0.002"),
            format!("fabric_gateway_peer_drops_total{{{labels},reason=\"not_allowed_source\"}} 9"),
            format!(
                "fabric_gateway_dataplane_total{{{labels},direction=\"egress\",counter=\"remapped\"}} 7"
            ),
            "fabric_gateway_unattributed_drops_total{gateway=\"fabric\",reason=\"unknown_peer\"} 3"
                .to_string(),
            "fabric_gateway_repairs_total{gateway=\"fabric\"} 2".to_string(),
        ] {
            assert!(m.contains(&line), "missing {line}\n{m}");
        }
        assert!(
            !m.contains("peer_handshake_age_seconds{"),
            "absent values are not exported"
        );
        // Every sample line belongs to a declared family.
        for l in m.lines().filter(|l| !l.starts_with('#')) {
            let fam = l.split('{').next().unwrap();
            assert!(m.contains(&format!("# TYPE {fam} ")), "{fam} undeclared");
        }
    }

    #[test]
    fn status_json_roundtrips() {
        let s = sample();
        let j = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<Status>(&j).unwrap(), s);
    }
}
