//! The gateway's configuration file (`fabric_gateway_api::config`: TOML → `Config` +
//! validation): written by the gateway operator, or by hand.
//!
//! Input: the file's text. Checked: whatever `Config::parse` accepts passes `validate` again,
//! gives every peer a device name that fits IFNAMSIZ and is unique, a probe source when it
//! probes, and (with data-plane ids) a data-plane configuration; written back with `to_toml`
//! (as the operator writes it) it parses to the same `Config`.

use std::collections::HashSet;

use fabric_gateway_api::config::{Config, MAX_IFNAME};

pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(cfg) = Config::parse(text) else {
        return;
    };
    cfg.validate().expect("a parsed config validates");
    let mut devices = HashSet::new();
    for p in &cfg.peers {
        let d = p.device_name();
        assert!(!d.is_empty() && d.len() <= MAX_IFNAME, "device name {d:?}");
        assert!(devices.insert(d), "two peers on one device");
        if p.probe_address.is_some() {
            assert!(
                p.probe_source().is_some(),
                "probing peer {:?} without a source",
                p.name
            );
        }
    }
    let with_id = cfg.peers.iter().filter(|p| p.id.is_some()).count();
    match cfg.dataplane() {
        Some((_, dp)) => assert_eq!(dp.peers.len(), with_id),
        None => assert_eq!(with_id, 0),
    }
    let text = cfg.to_toml().expect("a parsed config serialises");
    assert_eq!(
        Config::parse(&text).ok(),
        Some(cfg),
        "written back as {text}"
    );
}
