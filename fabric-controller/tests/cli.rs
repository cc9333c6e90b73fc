//! Command-line behaviour without an API server: errors are messages, never backtraces.
use std::process::Command;

#[test]
fn unreachable_api_is_a_message_not_a_backtrace() {
    let dir = std::env::temp_dir().join(format!("fabric-ctl-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("missing-kubeconfig");
    let out = Command::new(env!("CARGO_BIN_EXE_fabric-controller"))
        .args([
            "ipam",
            "--pod-cidr",
            "10.244.0.0/16",
            "--service-cidr",
            "10.96.0.0/12",
            "--external-cidr",
            "10.70.0.0/16",
        ])
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_BACKTRACE", "1")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("error: connecting to the Kubernetes API"),
        "{err}"
    );
    assert!(!err.contains("acktrace"), "printed a backtrace: {err}");
    assert!(!err.contains("panicked"), "{err}");
}
