//! `fabricctl network dump` on a gateway host: it finds the data plane's pinned maps and shows
//! the peer, its counters and remaps, and the fabric's routes, inside a network namespace.
use anyhow::Result;
use fabric_tests::{Addressing, TwoClusters, addr, locate_bin, skip_unless_root, traffic};

#[test]
fn network_dump_shows_maps_counters_and_routes() -> Result<()> {
    if skip_unless_root("network_dump_shows_maps_counters_and_routes") {
        return Ok(());
    }
    let t = TwoClusters::new(Addressing::Overlapping)?;
    t.apply()?;
    assert!(traffic::ping(&t.bed, &t.a_pod, addr::B_POD_FROM_A, 2, "0.2", &[])?.received > 0);
    // A route the agent would own (protocol 250), next to one it would not.
    t.bed.ip(
        &t.a_gw,
        &[
            "route",
            "add",
            "10.99.0.0/16",
            "via",
            "192.168.100.2",
            "proto",
            "250",
        ],
    )?;
    let out = std::process::Command::new(locate_bin("fabricctl")?)
        .args(["network", "dump", "--netns", &t.a_gw, "--pin-dir"])
        .arg(&t.a_pin)
        .args(["-o", "json"])
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let snap = &v["dataplanes"][0][1];
    assert_eq!(snap["peers"][0]["name"], "cluster-b", "{v:#}");
    assert!(
        snap["peers"][0]["egress"]["remapped"].as_u64().unwrap() > 0,
        "{v:#}"
    );
    assert_eq!(snap["remaps"][0]["local"], "10.71.0.0/16");
    assert_eq!(snap["remaps"][0]["remote"], "10.244.0.0/16");
    let routes: Vec<String> = serde_json::from_value(v["routes"].clone())?;
    assert_eq!(routes.len(), 1, "only routes of protocol 250: {routes:?}");
    assert!(
        routes[0].starts_with("10.99.0.0/16 via 192.168.100.2"),
        "{routes:?}"
    );
    // The human view has the same.
    let out = std::process::Command::new(locate_bin("fabricctl")?)
        .args(["network", "dump", "--netns", &t.a_gw, "--pin-dir"])
        .arg(&t.a_pin)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("cluster-b")
            && text.contains("10.71.0.0/16 -> 10.244.0.0/16")
            && text.contains("10.99.0.0/16"),
        "{text}"
    );
    Ok(())
}
