//! The configuration's parsing, builders and validation, against hand-written files.
use proptest::prelude::*;

use super::*;

const KEY: &str = "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=";
const KEY2: &str = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=";

// Hand-written on purpose: files written by people (and by older operators) keep parsing.
fn base() -> String {
    format!(
        r#"
[interface]
private_key_file = "/etc/fabric/key"
listen_port = 51821

[[peers]]
name = "cluster-b"
public_key = "{KEY}"
endpoint = "192.168.7.2:51820"
allowed_ips = ["10.244.0.0/16", "10.70.0.0/16", "169.254.100.0/30"]
persistent_keepalive = 25
addresses = ["169.254.100.1/30"]
routes = ["10.71.0.0/16"]
probe_address = "169.254.100.2"
"#
    )
}

fn key(s: &str) -> PublicKey {
    PublicKey::from_base64(s).unwrap()
}

fn net(s: &str) -> IpNetwork {
    s.parse().unwrap()
}

fn v4(s: &str) -> Ipv4Network {
    s.parse().unwrap()
}

/// `base()`, built instead of written.
fn built() -> Config {
    Config::builder("/etc/fabric/key")
        .listen_port(51821)
        .peer(
            PeerConfig::builder("cluster-b", key(KEY))
                .endpoint("192.168.7.2:51820".parse().unwrap())
                .allowed_ips(["10.244.0.0/16", "10.70.0.0/16", "169.254.100.0/30"].map(net))
                .persistent_keepalive(25)
                .address(net("169.254.100.1/30"))
                .route(net("10.71.0.0/16"))
                .probe_address("169.254.100.2".parse::<IpAddr>().unwrap())
                .build(),
        )
        .build()
        .unwrap()
}

#[test]
fn parses_full_example_with_defaults() {
    let c = Config::parse(&base()).unwrap();
    assert_eq!(c.interface.mtu, DEFAULT_MTU);
    assert_eq!(c.interface.name, "fabric");
    assert_eq!(c.interface.listen_port, 51821);
    let p = &c.peers[0];
    assert_eq!(p.device_name(), "fab-cluster-b");
    assert_eq!(p.endpoint, Some("192.168.7.2:51820".parse().unwrap()));
    assert_eq!(p.allowed_ips.len(), 3);
    assert_eq!(p.persistent_keepalive, Some(25));
    assert_eq!(p.probe_source(), Some("169.254.100.1".parse().unwrap()));
}

#[test]
fn the_builders_make_what_the_file_says() {
    assert_eq!(built(), Config::parse(&base()).unwrap());
}

#[test]
fn to_toml_round_trips_and_leaves_defaults_out() {
    let mut c = built();
    c.peers[0] = PeerConfig {
        id: Some(3),
        mss: Some(1300),
        device: Some("tun-b".into()),
        remaps: vec![Remap {
            local: v4("10.64.0.0/16"),
            remote: v4("10.244.0.0/16"),
        }],
        ..c.peers[0].clone()
    };
    c.externals.push(ExternalMapping {
        external: v4("10.70.0.1/32"),
        internal: v4("192.168.1.5/32"),
    });
    c.interface.dataplane_pin_dir = Some("/sys/fs/bpf/x".into());
    c.interface.busy_poll_us = 20_000;
    c.local_cidrs.push(v4("10.244.0.0/16"));
    let text = c.to_toml().unwrap();
    assert_eq!(Config::parse(&text).unwrap(), c, "{text}");
    // The data plane learns what peers may reach: the pod CIDRs and the tunnel address.
    let (_, dp) = c.dataplane().unwrap();
    assert_eq!(dp.local_cidrs, [v4("10.244.0.0/16")]);
    assert_eq!(
        dp.peers[0].tunnel_addresses,
        ["169.254.100.1".parse::<std::net::Ipv4Addr>().unwrap()]
    );
    let plain = Config::builder("/k").build().unwrap().to_toml().unwrap();
    for absent in [
        "[[peers]]",
        "dataplane_pin_dir",
        "busy_poll_us",
        "externals",
        "local_cidrs",
    ] {
        assert!(!plain.contains(absent), "{absent} in {plain}");
    }
}

#[test]
fn the_builder_validates() {
    let e = Config::builder("/k").mtu(100).build().unwrap_err();
    assert!(matches!(e, ConfigError::Invalid(Invalid::Mtu(100))), "{e}");
    let peer = PeerConfig::builder("b", key(KEY)).build();
    let e = Config::builder("/k").peer(peer).build().unwrap_err();
    assert!(
        matches!(&e, ConfigError::Invalid(Invalid::NoAllowedIps(p)) if p == "b"),
        "{e}"
    );
}

#[test]
fn busy_poll_defaults_off_and_is_bounded() {
    assert_eq!(Config::parse(&base()).unwrap().interface.busy_poll_us, 0);
    let on = base().replace("[interface]\n", "[interface]\nbusy_poll_us = 20000\n");
    assert_eq!(Config::parse(&on).unwrap().interface.busy_poll_us, 20_000);
    let e = err(&base().replace("[interface]\n", "[interface]\nbusy_poll_us = 5000000\n"));
    assert!(e.contains("busy_poll_us") && e.contains("at most"), "{e}");
}

#[test]
fn derived_device_name_fits_ifnamsiz() {
    let c =
        Config::parse(&base().replace("cluster-b", "a-very-long-cluster-name.example")).unwrap();
    let d = c.peers[0].device_name();
    assert_eq!(d.len(), MAX_IFNAME);
    assert_eq!(d, "fab-a-very-long");
}

fn err(text: &str) -> String {
    Config::parse(text).unwrap_err().to_string()
}

#[test]
fn bad_key_is_reported() {
    let e = err(&base().replace(KEY, "nope"));
    assert!(e.contains("public_key") && e.contains("base64"), "{e}");
}

#[test]
fn bad_cidr_is_reported() {
    let e = err(&base().replace("10.244.0.0/16", "10.244.0.0/33"));
    assert!(
        e.contains("allowed_ips") || e.contains("10.244.0.0/33"),
        "{e}"
    );
    let e = err(&base().replace("10.244.0.0/16", "10.244.1.0/16"));
    assert!(e.contains("host bits"), "{e}");
}

#[test]
fn unknown_field_and_bad_endpoint_are_reported() {
    let e = err(&base().replace("persistent_keepalive", "persistant_keepalive"));
    assert!(e.contains("persistant_keepalive"), "{e}");
    let e = err(&base().replace("192.168.7.2:51820", "192.168.7.2"));
    assert!(
        e.contains("endpoint") || e.contains("socket address"),
        "{e}"
    );
}

#[test]
fn duplicates_are_rejected() {
    let dup = format!(
        "{}\n[[peers]]\nname = \"cluster-b\"\npublic_key = \"{KEY2}\"\nallowed_ips = [\"10.1.0.0/16\"]\n",
        base()
    );
    assert!(err(&dup).contains("duplicate peer name"));
    let dupkey = format!(
        "{}\n[[peers]]\nname = \"c\"\npublic_key = \"{KEY}\"\nallowed_ips = [\"10.1.0.0/16\"]\n",
        base()
    );
    assert!(err(&dupkey).contains("used by another peer"));
    let dupdev = format!(
        "{}\n[[peers]]\nname = \"c\"\ndevice = \"fab-cluster-b\"\npublic_key = \"{KEY2}\"\nallowed_ips = [\"10.1.0.0/16\"]\n",
        base()
    );
    assert!(err(&dupdev).contains("device"));
}

#[test]
fn probe_requires_source_and_allowed_ip() {
    let e = err(&base().replace("addresses = [\"169.254.100.1/30\"]", ""));
    assert!(e.contains("probe_address"), "{e}");
    let e = err(&base().replace(", \"169.254.100.0/30\"", ""));
    assert!(e.contains("outside allowed_ips"), "{e}");
}

#[test]
fn too_long_device_and_empty_allowed_ips_rejected() {
    let e = err(&base().replace("routes =", "device = \"0123456789abcdefg\"\nroutes ="));
    assert!(e.contains("device name"), "{e}");
    let e = err(&base()
        .replace(
            "allowed_ips = [\"10.244.0.0/16\", \"10.70.0.0/16\", \"169.254.100.0/30\"]",
            "allowed_ips = []",
        )
        .replace("probe_address = \"169.254.100.2\"", ""));
    assert!(e.contains("allowed_ips is empty"), "{e}");
}

#[test]
fn data_plane_checks_apply() {
    let b = PeerConfig::builder("b", key(KEY))
        .allowed_ip(net("10.244.0.0/16"))
        .id(1)
        .remap(v4("10.64.0.0/16"), v4("10.244.0.0/16"));
    let c = PeerConfig::builder("c", key(KEY2))
        .allowed_ip(net("10.244.0.0/16"))
        .id(1)
        .build();
    let e = Config::builder("/k")
        .peers([b.clone().build(), c])
        .build()
        .unwrap_err();
    assert!(
        matches!(e, ConfigError::Invalid(Invalid::Dataplane(_))),
        "{e}"
    );
    let e = Config::builder("/k")
        .peer(b.remap(v4("10.65.0.0/16"), v4("10.99.0.0/16")).build())
        .build()
        .unwrap_err();
    assert!(
        matches!(
            e,
            ConfigError::Invalid(Invalid::RemapOutsideAllowedIps { .. })
        ),
        "{e}"
    );
}

#[test]
fn a_bad_peer_is_left_out_and_the_others_run() {
    const KEY3: &str = "4FKGzrAgVEc3Blh5kqt8NA1LODvMFMnZXsQ/1S3DTFA=";
    let good = |name: &str, k: &str, id: u32, seen: &str, real: &str| {
        PeerConfig::builder(name, key(k))
            .allowed_ip(net(real))
            .id(id)
            .remap(v4(seen), v4(real))
            .build()
    };
    let b = good("b", KEY, 1, "10.64.0.0/16", "10.244.0.0/16");
    // The same key as b: handshakes could not tell them apart.
    let same_key = good("x", KEY, 2, "10.66.0.0/16", "10.244.0.0/16");
    // Its pod and external CIDRs overlap: an address would stand for two.
    let overlapping = PeerConfig::builder("y", key(KEY2))
        .allowed_ips([net("10.90.0.0/16")])
        .id(3)
        .remap(v4("10.90.0.0/16"), v4("10.90.0.0/16"))
        .remap(v4("10.91.0.0/24"), v4("10.90.0.0/24"))
        .build();
    // Invalid on its own.
    let no_allowed = PeerConfig::builder("z", key(KEY3)).build();
    let c = good("c", KEY3, 4, "10.67.0.0/16", "10.244.0.0/16");
    let builder = Config::builder("/k")
        .local_cidr(v4("10.244.0.0/16"))
        .peers([b.clone(), same_key, overlapping, no_allowed, c.clone()])
        .external(v4("10.70.0.1/32"), v4("192.168.1.5/32"))
        // The same local IP exposed twice.
        .external(v4("10.70.0.2/32"), v4("192.168.1.5/32"));
    // All at once, nothing would run.
    assert!(builder.clone().build().is_err());
    let (cfg, left) = builder.build_per_peer().unwrap();
    assert_eq!(cfg.peers, [b, c]);
    assert_eq!(cfg.externals.len(), 1);
    assert_eq!(cfg.externals[0].external, v4("10.70.0.1/32"));
    let names: Vec<String> = left
        .iter()
        .map(|l| match l {
            LeftOut::Peer { name, reason } => format!("{name}: {reason}"),
            LeftOut::External { mapping, reason } => {
                format!("{}: {reason}", mapping.external)
            }
        })
        .collect();
    assert_eq!(names.len(), 4, "{names:#?}");
    assert!(names[0].starts_with("x: ") && names[0].contains("used by another peer"));
    assert!(names[1].starts_with("y: ") && names[1].contains("overlap"));
    assert!(names[2].starts_with("z: ") && names[2].contains("allowed_ips is empty"));
    assert!(names[3].starts_with("10.70.0.2/32: ") && names[3].contains("overlap"));
    assert!(cfg.validate().is_ok());
    // The interface itself is no peer's fault: that still fails as a whole.
    let e = Config::builder("/k").mtu(1).build_per_peer().unwrap_err();
    assert!(matches!(e, ConfigError::Invalid(Invalid::Mtu(1))), "{e}");
    let e = Config::builder("/k")
        .local_cidr(v4("10.244.1.0/16"))
        .build_per_peer()
        .unwrap_err();
    assert!(e.to_string().contains("host bits"), "{e}");
}

fn arb_v4() -> impl Strategy<Value = Ipv4Network> {
    (any::<u32>(), 1u8..=32).prop_map(|(ip, len)| {
        let n = Ipv4Network::new(ip.into(), len).unwrap();
        Ipv4Network::new(n.network(), len).unwrap()
    })
}

fn arb_peer(i: usize) -> impl Strategy<Value = PeerConfig> {
    (
        any::<[u8; 32]>(),
        proptest::option::of(any::<(u32, u16)>()),
        proptest::collection::vec(arb_v4(), 0..3),
        proptest::option::of(1u16..),
        proptest::option::of("[a-z]{1,11}"),
        proptest::collection::vec(arb_v4(), 0..3),
        proptest::option::of(1u32..4095),
        proptest::option::of(88u16..9000),
    )
        .prop_map(
            move |(k, ep, allowed, keepalive, device, routes, id, mss)| {
                let mut p = PeerConfig::builder(format!("peer-{i}"), PublicKey::from_bytes(k))
                    .allowed_ip(v4("10.0.0.0/8"))
                    .allowed_ips(allowed)
                    .routes(routes);
                if let Some((ip, port)) = ep {
                    p = p.endpoint(SocketAddr::from((std::net::Ipv4Addr::from(ip), port)));
                }
                if let Some(k) = keepalive {
                    p = p.persistent_keepalive(k);
                }
                if let Some(d) = device {
                    p = p.device(format!("d{i}{d}"));
                }
                if let Some(id) = id {
                    p = p.id(id).mss(mss.unwrap_or(1380));
                }
                p.build()
            },
        )
}

proptest! {
    /// Whatever the builders make (valid or not), its TOML reads back as the same value.
    #[test]
    fn built_configurations_round_trip(
        name in "[a-z][a-z0-9._-]{0,14}",
        port in any::<u16>(),
        mtu in 576u16..=9000,
        busy in 0u64..=MAX_BUSY_POLL_US,
        probe in 1u64..60,
        pins in proptest::option::of("/[a-z]{1,8}"),
        a in arb_peer(0),
        b in arb_peer(1),
    ) {
        let mut cfg = Config::builder("/etc/fabric/key")
            .name(name)
            .listen_port(port)
            .mtu(mtu)
            .busy_poll_us(busy)
            .probe_interval(probe)
            .peers([a, b]);
        if let Some(p) = pins {
            cfg = cfg.dataplane_pin_dir(p);
        }
        let cfg = cfg.0;
        let text = cfg.to_toml().unwrap();
        let back: Config = toml::from_str(&text).unwrap();
        prop_assert_eq!(&back, &cfg, "{}", text);
        // Valid stays valid through the file, invalid stays invalid.
        prop_assert_eq!(Config::parse(&text).is_ok(), cfg.validate().is_ok());
    }
}
