//! What the gateway operator costs the API server at rest: requests per minute with idle
//! peers, read from the API server's own `apiserver_request_total` counters (kubelite is a
//! real kube-apiserver library build, so they count every request it served).
//!
//! One operator runs against a fresh API server holding `peers` peered clusters
//! (Configurations with grants, PublicKeys, GatewayClients for half of them) and no gateway:
//! its reloads and status requests fail, so every Connection settles in `Error` and nothing
//! changes any more. Long-running requests (WATCH) are left out: they are open streams, not a
//! rate.
use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use fabric_tests::{apiserver::ApiServer, check_interrupt, process::Bin};

/// `apiserver_request_total` by "VERB resource[/subresource]", from the Prometheus text
/// ([`crate::apimetrics::parse`] with the status codes folded together). Non-resource
/// requests (`/metrics`, `/readyz`) and long-running WATCHes are left out.
pub fn request_counts(metrics: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (key, value) in crate::apimetrics::parse(metrics) {
        let mut words = key.split(' ');
        let (Some(verb), Some(what)) = (words.next(), words.next()) else {
            continue;
        };
        if verb != "WATCH" {
            *out.entry(format!("{verb} {what}")).or_insert(0.0) += value;
        }
    }
    out
}

fn counts(api: &ApiServer) -> BTreeMap<String, f64> {
    request_counts(&api.kubectl_ok(&["get", "--raw", "/metrics"]))
}

/// A valid WireGuard public key, distinct per `n`.
fn key(n: usize) -> String {
    const B64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let base = "NH3rfiZZU6FZfy+lQ7SynhdEu0C5HCb4f9okbUtNOQ0=";
    format!(
        "{}{}{}",
        B64[n / 64 % 64] as char,
        B64[n % 64] as char,
        &base[2..]
    )
}

fn apply(api: &ApiServer, yaml: &str) -> Result<()> {
    let o = api.kubectl_stdin(&["apply", "--server-side", "-f", "-"], yaml);
    if !o.status.success() {
        bail!("kubectl apply: {}", String::from_utf8_lossy(&o.stderr));
    }
    Ok(())
}

/// Requests per minute the operator makes with `peers` idle peers, measured over `window`
/// after `settle`; returns (total, per verb and resource).
pub fn operator_requests(
    peers: usize,
    settle: Duration,
    window: Duration,
) -> Result<(f64, BTreeMap<String, f64>)> {
    let api = ApiServer::start("bench-operator");
    api.install_crds();
    api.kubectl_ok(&["create", "namespace", "fabric-system"]);
    apply(
        &api,
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: fabric-cluster, namespace: fabric-system}\n\
         data: {FABRIC_CLUSTER_ID: cluster-a, FABRIC_POD_CIDR: 10.244.0.0/16, FABRIC_SERVICE_CIDR: 10.96.0.0/12, \
         FABRIC_EXTERNAL_CIDR: 10.70.0.0/16, FABRIC_RESERVED: '', FABRIC_POOLS: 10.64.0.0/10, \
         FABRIC_GATEWAY_ENDPOINT: '192.0.2.10:31820'}\n",
    )?;
    api.kubectl_ok(&[
        "create",
        "secret",
        "generic",
        "fabric-gateway-key",
        "-n",
        "fabric-system",
        "--from-literal=privateKey=YNqHwpcAmVj0lVzPASz9vuxsb/hLJ+J+zd69PaUgB2Y=",
    ]);
    // The operator's own pod, which it labels active.
    let mut objects = String::from(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: gw-0, namespace: fabric-system}\n\
         spec: {containers: [{name: gateway, image: fabric-gateway}]}\n",
    );
    for k in 0..peers {
        let id = format!("peer-{k}");
        objects += &format!(
            "---\napiVersion: networking.fabric.io/v1alpha1\nkind: Configuration\n\
             metadata: {{name: {id}, namespace: fabric-system}}\n\
             spec: {{clusterId: {id}, remote: {{pod: 10.244.0.0/16, external: 10.70.0.0/16}}}}\n\
             ---\napiVersion: networking.fabric.io/v1alpha1\nkind: PublicKey\n\
             metadata: {{name: {id}, namespace: fabric-system}}\n\
             spec: {{clusterId: {id}, publicKey: \"{}\"}}\n",
            key(k)
        );
        if k % 2 == 0 {
            objects += &format!(
                "---\napiVersion: networking.fabric.io/v1alpha1\nkind: GatewayClient\n\
                 metadata: {{name: {id}, namespace: fabric-system}}\n\
                 spec: {{clusterId: {id}, endpoint: {{addresses: [192.0.2.{}], port: 51820}}}}\n",
                k + 20
            );
        }
    }
    apply(&api, &objects)?;
    // The grants IPAM would make.
    for k in 0..peers {
        let status = format!(
            "{{\"status\": {{\"remote\": {{\"pod\": \"10.{}.0.0/16\", \"external\": \"10.{}.0.0/16\"}}, \"peerId\": {}}}}}",
            64 + k,
            64 + peers + k,
            k + 1
        );
        api.kubectl_ok(&[
            "patch",
            "configuration",
            &format!("peer-{k}"),
            "-n",
            "fabric-system",
            "--subresource=status",
            "--type=merge",
            "-p",
            &status,
        ]);
    }
    let dir = std::env::temp_dir().join(format!("fabric-bench-operator-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let operator = Bin::new("fabric-controller")?
        .kubeconfig(&api.kubeconfig)
        .pod_name("gw-0")
        // No gateway: the active operator's requests are what is measured.
        .args([
            "gateway",
            "--advertise",
            "192.0.2.10:31820",
            "--ignore-gateway-health",
        ])
        .arg("--config")
        .arg(dir.join("gateway.toml"))
        .arg("--key-file")
        .arg(dir.join("private.key"))
        .arg("--control-dir")
        .arg(&dir)
        .log(dir.join("operator.log"))
        .spawn()
        .context("starting the gateway operator")?;
    // Settled once every peer has its Connection.
    let t0 = Instant::now();
    loop {
        check_interrupt()?;
        let n = api
            .kubectl_ok(&["get", "connections", "-n", "fabric-system", "-o", "name"])
            .lines()
            .count();
        if n == peers {
            break;
        }
        if t0.elapsed() > Duration::from_secs(30) {
            bail!("the operator reported {n} of {peers} Connections");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(settle);
    let before = counts(&api);
    let t0 = Instant::now();
    while t0.elapsed() < window {
        check_interrupt()?;
        std::thread::sleep(Duration::from_millis(200));
    }
    let after = counts(&api);
    let minutes = t0.elapsed().as_secs_f64() / 60.0;
    drop(operator);
    let _ = std::fs::remove_dir_all(&dir);
    let mut per = BTreeMap::new();
    for (k, v) in &after {
        let d = v - before.get(k).copied().unwrap_or(0.0);
        if d > 0.0 {
            per.insert(k.clone(), d / minutes);
        }
    }
    // The read of the counters themselves is not a resource request; nothing else runs.
    Ok((per.values().sum(), per))
}

/// Prints the operator's request rate at rest (`fabric-bench control`, and alone as
/// `fabric-bench operator`).
pub fn run_operator(peers: usize) -> Result<()> {
    println!("\ngateway operator at rest, {peers} idle peers: API requests per minute");
    let (total, per) = operator_requests(peers, Duration::from_secs(5), Duration::from_secs(60))?;
    println!("  total {total:>8.0} /min");
    for (k, v) in &per {
        println!("  {k:<40} {v:>8.0} /min");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_resource_requests_but_not_watches() {
        let text = "# TYPE apiserver_request_total counter\n\
apiserver_request_total{code=\"200\",component=\"\",dry_run=\"\",group=\"\",resource=\"\",scope=\"\",subresource=\"/readyz\",verb=\"GET\",version=\"\"} 4\n\
apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"coordination.k8s.io\",resource=\"leases\",scope=\"resource\",subresource=\"\",verb=\"GET\",version=\"v1\"} 10\n\
apiserver_request_total{code=\"404\",component=\"apiserver\",dry_run=\"\",group=\"coordination.k8s.io\",resource=\"leases\",scope=\"resource\",subresource=\"\",verb=\"GET\",version=\"v1\"} 1\n\
apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"networking.fabric.io\",resource=\"connections\",scope=\"resource\",subresource=\"status\",verb=\"APPLY\",version=\"v1alpha1\"} 2.5e+01\n\
apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"pods\",scope=\"cluster\",subresource=\"\",verb=\"WATCH\",version=\"v1\"} 3\n";
        let c = request_counts(text);
        assert_eq!(c.len(), 2, "{c:?}");
        assert_eq!(c["GET leases"], 11.0);
        assert_eq!(c["APPLY connections/status"], 25.0);
    }
}
