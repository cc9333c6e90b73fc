//! Bad overlay settings are refused before the agent touches anything; a data-plane
//! configuration that would refuse every pod packet is warned about.
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

#[test]
fn datapath_check_warns_about_peers_without_local_cidrs() {
    let dir = std::env::temp_dir().join(format!("fabric-agent-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let peers = r#"
[[peers]]
name = "cluster-b"
id = 1
interface = "fab-b"
remaps = [ { local = "10.71.0.0/16", remote = "10.244.0.0/16" } ]
"#;
    let check = |name: &str, text: &str| {
        let file = dir.join(name);
        std::fs::write(&file, text).unwrap();
        let (ok, err) = agent(&["datapath", "check", "--config", file.to_str().unwrap()]);
        assert!(ok, "{err}");
        err
    };
    let err = check("without.toml", peers);
    assert!(
        err.contains("without.toml") && err.contains("dst-refused") && err.contains("local_cidrs"),
        "{err}"
    );
    let with = format!("local_cidrs = [\"10.99.0.0/16\"]\n{peers}");
    let err = check("with.toml", &with);
    assert!(!err.contains("warning"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
