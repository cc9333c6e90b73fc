//! The API server refuses bad fabric objects with a message that says what is wrong, before any
//! controller sees them (CEL rules in the generated CRDs, against a real kube-apiserver).
use fabric_tests::apiserver::{ApiServer, require_tools};

fn configuration(name: &str, pod: &str, external: &str) -> String {
    format!(
        "apiVersion: networking.fabric.io/v1alpha1\nkind: Configuration\n\
         metadata: {{name: {name}, namespace: default}}\n\
         spec: {{clusterId: {name}, remote: {{pod: \"{pod}\", external: \"{external}\"}}}}\n"
    )
}

/// A peer's announced CIDRs end up as routes on every node: anything default-like, not
/// unicast, or not a network address is refused.
#[test]
fn peer_cidrs_that_are_not_pod_networks_are_refused() {
    if !require_tools("peer_cidrs_that_are_not_pod_networks_are_refused") {
        return;
    }
    let server = ApiServer::start("crds");
    server.install_crds();
    let cases = [
        ("0.0.0.0/0", "must be a /8 or longer prefix"),
        ("128.0.0.0/1", "must be a /8 or longer prefix"),
        ("10.0.0.0/7", "must be a /8 or longer prefix"),
        ("224.0.0.0/8", "must be a unicast range"),
        ("239.1.0.0/16", "must be a unicast range"),
        ("127.0.0.0/8", "must be a unicast range"),
        ("169.254.0.0/16", "must be a unicast range"),
        ("0.0.0.0/8", "must be a unicast range"),
        ("10.244.1.10/16", "has host bits set"),
        ("10.244.0.0/33", "must be an IPv4 CIDR"),
    ];
    for (i, (cidr, why)) in cases.iter().enumerate() {
        for (pod, external) in [(*cidr, "10.80.0.0/16"), ("10.244.0.0/16", *cidr)] {
            let o = server.kubectl_stdin(
                &["apply", "-f", "-"],
                &configuration(&format!("bad-{i}"), pod, external),
            );
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(!o.status.success(), "{pod} / {external} was accepted");
            assert!(err.contains(why), "{pod} / {external}: {err}");
        }
    }
    // What clusters really use still goes through.
    for (i, (pod, external)) in [
        ("10.244.0.0/16", "10.70.0.0/16"),
        ("10.0.0.0/8", "192.168.10.0/24"),
        ("172.16.0.0/12", "100.64.0.0/10"),
        ("10.244.1.0/32", "10.70.0.0/31"),
    ]
    .iter()
    .enumerate()
    {
        let o = server.kubectl_stdin(
            &["apply", "-f", "-"],
            &configuration(&format!("good-{i}"), pod, external),
        );
        assert!(
            o.status.success(),
            "{pod} / {external} refused: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// The gateway dials addresses: a hostname in a GatewayClient is refused by the API server with
/// a message, not left to stop the gateway's configuration.
#[test]
fn gateway_client_addresses_are_ip_addresses() {
    if !require_tools("gateway_client_addresses_are_ip_addresses") {
        return;
    }
    let server = ApiServer::start("crds-endpoints");
    server.install_crds();
    let client = |name: &str, address: &str| {
        format!(
            "apiVersion: networking.fabric.io/v1alpha1\nkind: GatewayClient\n\
             metadata: {{name: {name}, namespace: default}}\n\
             spec: {{clusterId: {name}, endpoint: {{addresses: [\"{address}\"], port: 51820}}}}\n"
        )
    };
    for (i, bad) in ["gw.example.com", "192.0.2.7:51820", "192.0.2.300", ""]
        .iter()
        .enumerate()
    {
        let o = server.kubectl_stdin(&["apply", "-f", "-"], &client(&format!("bad-{i}"), bad));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{bad:?} was accepted");
        assert!(err.contains("must be IP addresses"), "{bad:?}: {err}");
    }
    for (i, good) in ["192.0.2.7", "fd00::7"].iter().enumerate() {
        let o = server.kubectl_stdin(&["apply", "-f", "-"], &client(&format!("good-{i}"), good));
        assert!(
            o.status.success(),
            "{good}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// What identifies a peer never changes under the controllers' feet, and where a consumer
/// sends its token is always TLS.
#[test]
fn peer_identities_are_immutable_and_auth_urls_https() {
    if !require_tools("peer_identities_are_immutable_and_auth_urls_https") {
        return;
    }
    let server = ApiServer::start("crds-sharing");
    server.install_crds();
    let fc = |id: &str, url: &str| {
        format!(
            "apiVersion: core.fabric.io/v1alpha1\nkind: ForeignCluster\n\
             metadata: {{name: peer}}\nspec: {{clusterId: {id}, authUrl: \"{url}\"}}\n"
        )
    };
    let apply = |yaml: &str| server.kubectl_stdin(&["apply", "-f", "-"], yaml);
    let o = apply(&fc("beta", "http://auth.beta.example:8443"));
    assert!(!o.status.success(), "an http:// auth URL was accepted");
    assert!(String::from_utf8_lossy(&o.stderr).contains("must be an https:// URL"));
    let o = apply(&fc("beta", "https://auth.beta.example:8443"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = apply(&fc("gamma", "https://auth.beta.example:8443"));
    assert!(!o.status.success(), "the cluster id changed");
    assert!(String::from_utf8_lossy(&o.stderr).contains("is immutable"));
    let o = apply(&fc("Not_A_Label", "https://auth.beta.example:8443"));
    assert!(
        !o.status.success(),
        "a cluster id that is no DNS label was accepted"
    );
    // The peer's printer columns are there for `kubectl get foreignclusters`.
    let o = server.kubectl(&["get", "foreignclusters"]);
    let out = String::from_utf8_lossy(&o.stdout);
    for column in ["ROLE", "FOUND", "AUTH", "NETWORK", "RESOURCES", "NODE"] {
        assert!(out.contains(column), "{out}");
    }
}

/// `fabricctl status` against a cluster without the fabric says so, and how to install it,
/// instead of the API server's bare "404 page not found".
#[test]
fn status_without_the_fabric_says_how_to_install_it() {
    if !require_tools("status_without_the_fabric_says_how_to_install_it") {
        return;
    }
    let server = ApiServer::start_bare("no-fabric");
    let out = std::process::Command::new(fabric_tests::locate_bin("fabricctl").unwrap())
        .arg("--kubeconfig")
        .arg(&server.kubeconfig)
        .arg("status")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "status succeeded without the fabric");
    assert!(
        err.contains("the fabric is not installed") && err.contains("kubectl apply -k deploy/"),
        "{err}"
    );
}
