//! Bad overlay settings are refused before the agent touches anything.
use std::process::Command;

fn agent(args: &[&str]) -> (bool, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_fabric-agent"))
        .args(args)
        .env_remove("NODE_IP")
        .env_remove("FABRIC_OVERLAY")
        .output()
        .unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn overlay_settings_are_checked() {
    let (ok, err) = agent(&["run", "--gateway", "10.0.0.1", "--overlay"]);
    assert!(!ok && err.contains("--node-ip"), "{err}");
    let (ok, err) = agent(&[
        "run",
        "--gateway",
        "10.0.0.1",
        "--overlay",
        "--node-ip",
        "10.0.0.2",
        "--overlay-vni",
        "16777216",
    ]);
    assert!(
        !ok && err.contains("--overlay-vni") && err.contains("16777215"),
        "{err}"
    );
    let (ok, err) = agent(&[
        "run",
        "--gateway",
        "10.0.0.1",
        "--overlay",
        "--node-ip",
        "10.0.0.2",
        "--overlay-port",
        "0",
    ]);
    assert!(!ok && err.contains("--overlay-port"), "{err}");
}
