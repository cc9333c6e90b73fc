//! The IPAM controller against a real API server: grants, persistence across a restart,
//! release on delete, and bad objects refused by the schema. The API server enforces RBAC and
//! the controller runs with a token of its own ServiceAccount (`fabric-controller`) holding
//! exactly the rights `deploy/` gives it, in the namespace it is deployed to: a rule missing
//! from `deploy/` fails here, not in a user's cluster.
use std::{
    path::Path,
    time::{Duration, Instant},
};

use fabric_api::{
    names::label,
    networking::v1alpha1::{Configuration, Network},
};
use fabric_tests::{
    ChildGuard,
    apiserver::{ApiServer, require_tools},
    process::Bin,
    rights,
    wait::eventually,
};
use kube::{Api, api::ListParams};

const BIN: &str = env!("CARGO_BIN_EXE_fabric-controller");

/// The namespace `deploy/` runs the controller in, the only one its Role covers.
const NS: &str = fabric_api::names::DEFAULT_NAMESPACE;

/// The controller's ServiceAccount in `deploy/`.
const SA: &str = "fabric-controller";

/// An API server enforcing RBAC, with the fabric's CRDs and the rights of `deploy/`.
fn server(tag: &str) -> ApiServer {
    let server = ApiServer::start_with_auth(tag);
    server.install_crds();
    rights::install(&server).unwrap();
    server
}

fn start_controller(api: &ApiServer, log: &Path) -> ChildGuard {
    start_replica(api, log, "ipam-0")
}

/// One IPAM replica, as its ServiceAccount and nothing else; replicas compete for the Lease
/// fabric-ipam.
fn start_replica(api: &ApiServer, log: &Path, identity: &str) -> ChildGuard {
    let kubeconfig =
        rights::component_kubeconfig(api, SA, log.with_extension("kubeconfig")).unwrap();
    Bin::at(BIN)
        .kubeconfig(&kubeconfig)
        .args([
            "ipam",
            "--namespace",
            NS,
            "--identity",
            identity,
            "--pod-cidr",
            "10.244.0.0/16",
            "--service-cidr",
            "10.96.0.0/12",
            "--external-cidr",
            "10.70.0.0/16",
            "--pools",
            "10.64.0.0/12",
        ])
        .log(log)
        .spawn()
        .unwrap()
}

fn config_yaml(name: &str, pod: &str, ext: &str) -> String {
    format!(
        "apiVersion: networking.fabric.io/v1alpha1\nkind: Configuration\nmetadata: {{name: {name}, namespace: fabric-system}}\nspec: {{clusterId: {name}, remote: {{pod: \"{pod}\", external: \"{ext}\"}}}}\n"
    )
}

/// Waits until the Configuration's status shows grants, and returns (pod, external, id).
async fn granted(api: &Api<Configuration>, name: &str) -> (String, String, i32) {
    eventually(
        &format!("{name}'s grants"),
        Duration::from_secs(20),
        || async {
            let s = api.get(name).await.ok()?.status?;
            let (r, id) = (s.remote?, s.peer_id?);
            Some((r.pod.to_string(), r.external.to_string(), id))
        },
    )
    .await
}

#[tokio::test]
async fn ipam_grants_persist_and_release() {
    if !require_tools("ipam_grants_persist_and_release") {
        return;
    }
    let server = server("ipam");
    let logdir = std::env::temp_dir().join(format!("fabric-ctl-{}", std::process::id()));
    std::fs::create_dir_all(&logdir).unwrap();
    let client = server.client().await;
    let cfgs: Api<Configuration> = Api::namespaced(client.clone(), NS);
    let nets: Api<Network> = Api::namespaced(client.clone(), NS);

    let ctl = start_controller(&server, &logdir.join("c1.log"));
    // A Configuration outside the fabric's namespace is nobody's to serve:
    // whoever may write in one namespace must not get ranges granted.
    server.kubectl_ok(&["create", "namespace", "elsewhere"]);
    let o = server.kubectl_stdin(
        &["apply", "-f", "-"],
        &config_yaml("x", "10.40.0.0/16", "10.41.0.0/16")
            .replace("namespace: fabric-system", "namespace: elsewhere"),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // b uses our own pod and external CIDRs; c does not clash at all.
    for (n, p, e) in [
        ("b", "10.244.0.0/16", "10.70.0.0/16"),
        ("c", "10.50.0.0/16", "10.60.0.0/24"),
    ] {
        let o = server.kubectl_stdin(&["apply", "-f", "-"], &config_yaml(n, p, e));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let b = granted(&cfgs, "b").await;
    let c = granted(&cfgs, "c").await;
    assert_eq!(
        (b.0.as_str(), b.1.as_str()),
        ("10.64.0.0/16", "10.65.0.0/16")
    );
    assert_eq!(
        (c.0.as_str(), c.1.as_str()),
        ("10.50.0.0/16", "10.60.0.0/24")
    );
    assert_ne!(b.2, c.2, "peer ids are distinct");
    // Granted after x was created, so x has been seen if it is ever going to be.
    let x = Api::<Configuration>::namespaced(client.clone(), "elsewhere")
        .get("x")
        .await
        .unwrap();
    assert!(
        x.status.is_none() && x.metadata.finalizers.is_none(),
        "a Configuration outside the fabric's namespace was served: {:?}",
        x.status
    );
    let table = server.kubectl_ok(&["get", "fconfig", "-n", NS]);
    assert!(
        table.contains("SEEN AS") && table.contains("10.64.0.0/16"),
        "{table}"
    );
    assert_eq!(
        nets.list(&ListParams::default()).await.unwrap().items.len(),
        4
    );

    // Restart: nothing moves, and a new peer with b's real CIDR gets a fresh block.
    drop(ctl);
    let ctl = start_controller(&server, &logdir.join("c2.log"));
    let o = server.kubectl_stdin(
        &["apply", "-f", "-"],
        &config_yaml("d", "10.244.0.0/16", "10.71.0.0/16"),
    );
    assert!(o.status.success());
    let d = granted(&cfgs, "d").await;
    assert_eq!(
        d.0, "10.66.0.0/16",
        "restored grants are not handed out again"
    );
    assert_eq!(d.1, "10.71.0.0/16");
    assert_eq!(granted(&cfgs, "b").await, b);
    assert_eq!(granted(&cfgs, "c").await, c);

    // Unpeer b: its Networks go, the finalizer lets it go, and its block is free again.
    server.kubectl_ok(&["delete", "configuration", "b", "-n", NS, "--timeout=20s"]);
    eventually("b's Networks removed", Duration::from_secs(10), || async {
        nets.list(&ListParams::default().labels(&format!("{}=b", label::CONFIGURATION)))
            .await
            .unwrap()
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    let o = server.kubectl_stdin(
        &["apply", "-f", "-"],
        &config_yaml("e", "10.244.0.0/16", "10.80.0.0/16"),
    );
    assert!(o.status.success());
    assert_eq!(granted(&cfgs, "e").await.0, "10.64.0.0/16");

    // Bad objects never reach the controller.
    let o = server.kubectl_stdin(
        &["apply", "-f", "-"],
        &config_yaml("f", "10.244.0.0/33", "10.80.0.0/16"),
    );
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("must be an IPv4 CIDR"));
    let o = server.kubectl_stdin(
        &["apply", "-f", "-"],
        &config_yaml("Bad_Name", "10.1.0.0/16", "10.2.0.0/16"),
    );
    assert!(!o.status.success());

    // What a peer may claim is bounded: never a range covering a node (found from the Nodes),
    // never one larger than --largest-claim (a /12 by default).
    let o = server.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n",
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    server.kubectl_ok(&[
        "patch",
        "node",
        "n1",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status": {"addresses": [{"type": "InternalIP", "address": "192.168.50.10"}]}}"#,
    ]);
    let o = server.kubectl_stdin(
        &["apply", "-f", "-"],
        &config_yaml("g", "192.168.50.0/24", "192.168.51.0/24"),
    );
    assert!(o.status.success());
    let g = granted(&cfgs, "g").await;
    let node: std::net::Ipv4Addr = "192.168.50.10".parse().unwrap();
    let pod: ipnetwork::Ipv4Network = g.0.parse().unwrap();
    assert!(
        !pod.contains(node) && pod.prefix() == 24,
        "g's pod CIDR covering the node was granted as {pod}"
    );
    assert_eq!(g.1, "192.168.51.0/24", "next to the node, kept");
    let o = server.kubectl_stdin(
        &["apply", "-f", "-"],
        &config_yaml("h", "11.0.0.0/8", "10.82.0.0/16"),
    );
    assert!(o.status.success());
    let (ready, st) = eventually("h refused", Duration::from_secs(20), || async {
        let st = cfgs.get("h").await.unwrap().status.unwrap_or_default();
        let ready = st.conditions.iter().find(|c| c.type_ == "Ready")?.clone();
        Some((ready, st))
    })
    .await;
    assert_eq!(ready.status, "False");
    assert!(ready.message.contains("larger than"), "{}", ready.message);
    assert!(st.remote.is_none());
    // Two controllers and many grants later, x is still nobody's.
    let x = Api::<Configuration>::namespaced(client.clone(), "elsewhere")
        .get("x")
        .await
        .unwrap();
    assert!(
        x.status.is_none() && x.metadata.finalizers.is_none(),
        "a Configuration outside the fabric's namespace was served: {:?}",
        x.status
    );
    drop(ctl);
    let _ = std::fs::remove_dir_all(&logdir);
}

/// Two replicas: only the Lease holder allocates; when it dies the standby takes over with
/// the state restored from the API, and nothing is handed out twice.
#[tokio::test]
async fn ipam_standby_takes_over() {
    if !require_tools("ipam_standby_takes_over") {
        return;
    }
    let server = server("ipam-ha");
    let logdir = std::env::temp_dir().join(format!("fabric-ctl-ha-{}", std::process::id()));
    std::fs::create_dir_all(&logdir).unwrap();
    let cfgs: Api<Configuration> = Api::namespaced(server.client().await, NS);
    let first = start_replica(&server, &logdir.join("r0.log"), "ipam-0");
    let o = server.kubectl_stdin(
        &["apply", "-f", "-"],
        &config_yaml("b", "10.244.0.0/16", "10.70.0.0/16"),
    );
    assert!(o.status.success());
    let b = granted(&cfgs, "b").await;
    let _second = start_replica(&server, &logdir.join("r1.log"), "ipam-1");
    let holder = server.kubectl_ok(&[
        "get",
        "lease",
        "fabric-ipam",
        "-n",
        NS,
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    assert_eq!(holder, "ipam-0");

    drop(first); // SIGKILL: no release; the standby waits out the Lease
    let t0 = Instant::now();
    let o = server.kubectl_stdin(
        &["apply", "-f", "-"],
        &config_yaml("c", "10.244.0.0/16", "10.70.0.0/16"),
    );
    assert!(o.status.success());
    let c = granted(&cfgs, "c").await;
    assert!(
        t0.elapsed() < Duration::from_secs(15),
        "takeover took {:?}",
        t0.elapsed()
    );
    assert_ne!(c.0, b.0, "the new leader knows b's grant");
    assert_ne!(c.1, b.1);
    assert_ne!(c.2, b.2);
    let holder = server.kubectl_ok(&[
        "get",
        "lease",
        "fabric-ipam",
        "-n",
        NS,
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    assert_eq!(holder, "ipam-1");
    let _ = std::fs::remove_dir_all(&logdir);
}

/// Grants Configuration `key` (claiming our own pod CIDR and a /24 of our external one)
/// through `store`.
async fn grant(
    store: &fabric_controller::ipam::store::Store,
    settings: &fabric_controller::ipam::Settings,
    key: &str,
) -> fabric_controller::ipam::ledger::Grant {
    let (pod, ext) = (
        "10.244.0.0/16".parse().unwrap(),
        "10.70.0.0/24".parse().unwrap(),
    );
    store
        .update(|l| l.grant(settings, &[], key, pod, ext))
        .await
        .unwrap()
        .unwrap()
}

/// Two IPAM replicas that both believe they lead (one paused or cut off past the Lease, and
/// not yet aware of it) grant through the ledger: the stale one's write is refused, it grants
/// again from what the other wrote, and no two Configurations ever hold overlapping ranges
/// or the same peer id. (With the in-memory allocator of before, each replica granted from
/// its own copy: the stale one handed out the range the other had just granted.)
#[tokio::test]
async fn two_leaders_never_grant_the_same_range_or_address() {
    use fabric_controller::ipam::{Settings, store::Store};
    if !require_tools("two_leaders_never_grant_the_same_range_or_address") {
        return;
    }
    let server = server("ipam-fence");
    // The stores are the controller's own: its ServiceAccount writes the ledger.
    let dir = std::env::temp_dir().join(format!("fabric-ctl-fence-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let client = rights::component_client(&server, SA, dir.join("ctl.kubeconfig"))
        .await
        .unwrap();
    let settings = Settings {
        namespace: NS.into(),
        pools: vec!["10.64.0.0/12".parse().unwrap()],
        reserved: ["10.244.0.0/16", "10.96.0.0/12", "10.70.0.0/16"]
            .iter()
            .map(|c| c.parse().unwrap())
            .collect(),
        largest_claim: 12,
    };
    let stale = Store::new(client.clone(), NS);
    let fresh = Store::new(client.clone(), NS);
    // The first leader grants b; then it stalls, and the second one, leading now, grants c.
    let b = grant(&stale, &settings, "fabric-system/b").await;
    let c = grant(&fresh, &settings, "fabric-system/c").await;
    // The first one wakes up with its copy of the ledger (b only) and grants d.
    let d = grant(&stale, &settings, "fabric-system/d").await;
    let mut all = vec![
        ("fabric-system/b".to_owned(), b),
        ("fabric-system/c".to_owned(), c),
        ("fabric-system/d".to_owned(), d),
    ];
    // Both keep granting at once.
    let racing = (0..10).map(|i| {
        let (store, settings) = (if i % 2 == 0 { &stale } else { &fresh }, &settings);
        async move {
            let key = format!("fabric-system/r{i}");
            let g = grant(store, settings, &key).await;
            (key, g)
        }
    });
    all.extend(futures::future::join_all(racing).await);
    for (i, (ka, a)) in all.iter().enumerate() {
        for (kb, b) in &all[i + 1..] {
            for x in [a.pod, a.external] {
                for y in [b.pod, b.external] {
                    assert!(!x.overlaps(y), "{ka} holds {x}, {kb} holds {y}");
                }
            }
            assert_ne!(a.id, b.id, "{ka} and {kb} share a peer id");
        }
    }
    // The ledger in the API holds exactly these grants.
    let stored = stored_ledger(&client).await;
    for (k, g) in &all {
        assert_eq!(stored.ids.get(k), Some(&g.id), "{k}");
        assert_eq!(stored.grants.get(&format!("{k}/pod")), Some(&g.pod), "{k}");
    }
    assert_eq!(stored.grants.len(), all.len() * 2);

    two_leaders_never_give_the_same_address(client).await;
}

/// The ledger as stored in the API.
async fn stored_ledger(client: &kube::Client) -> fabric_controller::ipam::ledger::Ledger {
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), NS);
    let cm = cms
        .get(fabric_api::names::config_map::IPAM_LEDGER)
        .await
        .unwrap();
    fabric_controller::ipam::ledger::Ledger::from_data(cm.data.as_ref()).unwrap()
}

/// The same for `IP` addresses: two replicas that both believe they lead give out addresses
/// of the external CIDR through the ledger, never one address twice. (Before, each replica
/// allocated from a pool in its own memory, rebuilt from the statuses when it started leading:
/// the stale one handed out the address the other had just given.)
async fn two_leaders_never_give_the_same_address(client: kube::Client) {
    use fabric_controller::ipam::store::Store;
    let external: ipnetwork::Ipv4Network = "10.70.0.0/16".parse().unwrap();
    let stale = Store::new(client.clone(), NS);
    let fresh = Store::new(client.clone(), NS);
    let give = |store: &'static str, key: String| {
        let store = if store == "stale" { &stale } else { &fresh };
        async move {
            let addr = store
                .update(|l| l.grant_ip(external, &key))
                .await
                .unwrap()
                .unwrap();
            (key, addr)
        }
    };
    let mut all = vec![give("stale", "fabric-system/a".into()).await];
    all.push(give("fresh", "fabric-system/b".into()).await);
    // The first one wakes up with its copy of the ledger (a only).
    all.push(give("stale", "fabric-system/c".into()).await);
    let racing = (0..10).map(|i| {
        give(
            if i % 2 == 0 { "stale" } else { "fresh" },
            format!("fabric-system/r{i}"),
        )
    });
    all.extend(futures::future::join_all(racing).await);
    let mut addrs: Vec<_> = all.iter().map(|(_, a)| *a).collect();
    addrs.sort();
    addrs.dedup();
    assert_eq!(addrs.len(), all.len(), "an address given twice: {all:?}");
    let stored = stored_ledger(&client).await;
    for (k, a) in &all {
        assert_eq!(stored.ips.get(k), Some(a), "{k}");
    }
}
