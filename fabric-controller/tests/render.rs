//! What the gateway operator renders must be a configuration the gateway accepts, with the
//! data plane it implies: checked with the gateway's own parser and validation.
use std::{path::PathBuf, time::Duration};

use fabric_controller::gateway::{
    Election, ExternalView, Opts, PeerView, config_file, render, tunnel_addrs,
};

fn opts() -> Opts {
    Opts {
        namespace: "fabric-system".into(),
        name: "fabric".into(),
        config_path: "/etc/fabric/gateway.toml".into(),
        key_path: PathBuf::from("/etc/fabric/private.key"),
        control_dir: "/var/run/fabric-gateway".into(),
        listen_port: 51820,
        mtu: 1420,
        advertise: "192.0.2.10:31820".parse().unwrap(),
        interval: Duration::from_secs(1),
        pin_dir: None,
        busy_poll_us: 20_000,
        overlay: None,
        guard_pin_dir: None,
        gateway_ip: None,
        election: Election::new("fabric-gateway", "gw-0"),
        gateway_grace: None,
    }
}

fn peer(id: &str, n: u32, dials: bool) -> PeerView {
    PeerView {
        cluster_id: id.into(),
        peer_id: n,
        // Any valid key: the gateway checks the form, not the owner.
        public_key: "NH3rfiZZU6FZfy+lQ7SynhdEu0C5HCb4f9okbUtNOQ0="
            .replace('N', if n == 1 { "N" } else { "M" })
            .parse()
            .unwrap(),
        endpoint: dials.then(|| format!("192.168.77.{n}:51820").parse().unwrap()),
        real_pod: "10.244.0.0/16".parse().unwrap(),
        real_external: "10.70.0.0/16".parse().unwrap(),
        seen_pod: format!("10.{}.0.0/16", 63 + n).parse().unwrap(),
        seen_external: format!("10.{}.0.0/16", 73 + n).parse().unwrap(),
    }
}

#[test]
fn rendered_configuration_is_accepted_by_the_gateway() {
    let peers = [peer("cluster-b", 1, true), peer("cluster-c", 2, false)];
    let externals = [ExternalView {
        name: "db".into(),
        external: "10.70.0.1".into(),
        internal: "192.168.1.5".into(),
    }];
    let pods = ["10.244.0.0/16".parse().unwrap()];
    let rendered = render(&opts(), "cluster-a", &pods, &peers, &externals).unwrap();
    assert!(rendered.skipped.is_empty(), "{:?}", rendered.skipped);
    let rendered = rendered.config;
    let text = config_file(&rendered).unwrap();
    let cfg = fabric_gateway_api::Config::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(cfg, rendered, "{text}");
    assert_eq!(cfg.peers.len(), 2);
    let b = &cfg.peers[0];
    assert_eq!(b.id, Some(1));
    assert_eq!(
        b.endpoint.map(|e| e.to_string()).as_deref(),
        Some("192.168.77.1:51820")
    );
    // Two peers with the same real CIDR: distinct devices, distinct views.
    assert_ne!(cfg.peers[0].device_name(), cfg.peers[1].device_name());
    // The dialing side takes .2 of the pair's /30, and probes the listener's .1.
    let (server, client) = tunnel_addrs("cluster-a", "cluster-b");
    assert_eq!(b.probe_address, Some(server.into()));
    assert_eq!(b.addresses[0].ip(), std::net::IpAddr::from(client));
    let (_, dp) = cfg.dataplane().expect("peers with ids run the data plane");
    dp.validate().unwrap();
    assert_eq!(dp.peers[0].remaps[0].local.to_string(), "10.64.0.0/16");
    assert_eq!(dp.peers[0].remaps[0].remote.to_string(), "10.244.0.0/16");
    assert_eq!(dp.externals.len(), 1);
    assert_eq!(dp.externals[0].internal.to_string(), "192.168.1.5/32");
    // Peers may reach this cluster's pods and their own tunnel address.
    assert_eq!(dp.local_cidrs, pods);
    assert_eq!(dp.peers[0].tunnel_addresses, [client]);
}

#[test]
fn no_peers_is_a_valid_standby_configuration() {
    let text = config_file(&render(&opts(), "cluster-a", &[], &[], &[]).unwrap().config).unwrap();
    let cfg = fabric_gateway_api::Config::parse(&text).unwrap();
    assert!(cfg.peers.is_empty());
}
