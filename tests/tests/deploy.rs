//! The manifests under deploy/ against a real API server with RBAC enforced: the kustomization
//! applies (server-side dry run, then for real), and each component's ServiceAccount can do
//! what its code does and nothing more.
use std::path::Path;

use fabric_tests::apiserver::{ApiServer, require_tools};

fn can(api: &ApiServer, who: &str, verb: &str, what: &str) -> bool {
    let sa = format!("system:serviceaccount:fabric-system:{who}");
    let o = api.kubectl(&[
        "auth",
        "can-i",
        verb,
        what,
        "-n",
        "fabric-system",
        "--as",
        &sa,
    ]);
    String::from_utf8_lossy(&o.stdout).trim() == "yes"
}

#[test]
fn manifests_apply_with_least_privilege() {
    if !require_tools("manifests_apply_with_least_privilege") {
        return;
    }
    let api = ApiServer::start_with_auth("deploy");
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let deploy = deploy.to_str().unwrap();
    // A server-side dry run cannot create objects in a namespace that does not exist yet
    // (the namespace itself is only dry-run created), as on any cluster.
    api.kubectl_ok(&["create", "namespace", "fabric-system"]);
    let out = api.kubectl_ok(&["apply", "--dry-run=server", "-k", deploy]);
    for kind in [
        "customresourcedefinition",
        "clusterrole",
        "role",
        "serviceaccount",
        "deployment",
        "daemonset",
        "service",
        "configmap",
    ] {
        assert!(
            out.contains(&format!("{kind}.")) || out.contains(&format!("{kind}/")),
            "{kind} missing from:\n{out}"
        );
    }
    api.kubectl_ok(&["apply", "-k", deploy]);
    api.kubectl_ok(&[
        "wait",
        "--for",
        "condition=established",
        "crd",
        "--all",
        "--timeout=30s",
    ]);

    let allowed = [
        (
            "fabric-agent",
            "watch",
            "configurations.networking.fabric.io",
        ),
        (
            "fabric-controller",
            "patch",
            "configurations.networking.fabric.io/status",
        ),
        (
            "fabric-controller",
            "update",
            "configurations.networking.fabric.io",
        ),
        (
            "fabric-controller",
            "delete",
            "networks.networking.fabric.io",
        ),
        ("fabric-gateway", "get", "secrets/fabric-gateway-key"),
        ("fabric-gateway", "update", "leases.coordination.k8s.io"),
        (
            "fabric-gateway",
            "patch",
            "connections.networking.fabric.io/status",
        ),
        ("fabric-gateway", "watch", "publickeys.networking.fabric.io"),
        (
            "fabric-gateway",
            "patch",
            "configmaps/fabric-gateway-identity",
        ),
    ];
    for (who, verb, what) in allowed {
        assert!(
            can(&api, who, verb, what),
            "{who} should be allowed to {verb} {what}"
        );
    }
    let denied = [
        (
            "fabric-agent",
            "patch",
            "configurations.networking.fabric.io",
        ),
        ("fabric-agent", "get", "secrets"),
        ("fabric-agent", "create", "pods"),
        ("fabric-controller", "get", "secrets"),
        ("fabric-controller", "delete", "nodes"),
        ("fabric-gateway", "get", "secrets/some-other-secret"),
        (
            "fabric-gateway",
            "delete",
            "configurations.networking.fabric.io",
        ),
        ("fabric-gateway", "list", "secrets"),
        ("fabric-gateway", "patch", "configmaps/fabric-cluster"),
    ];
    for (who, verb, what) in denied {
        assert!(
            !can(&api, who, verb, what),
            "{who} must not be allowed to {verb} {what}"
        );
    }
}
