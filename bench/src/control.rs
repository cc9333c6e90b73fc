//! `fabric-bench control`: how fast the control plane acts, and what it costs at rest.
//!
//! 1. From `fabricctl peer` to the first packet across, on two fresh clusters
//!    ([`fabric_tests::clusters::PeeredClusters`], one node each).
//! 2. From a peer's Configuration getting its grants (the status update IPAM makes) to the
//!    route being in place on a node, with 1, 10 and 100 peers: the agent against a kubelite,
//!    routes in a namespace; p50/p99/max over every peer of a round.
//! 3. Resident memory of each long-running component at rest after (1).
//! 4. The gateway operator's API requests per minute with 10 idle peers
//!    ([`crate::operator`]).
use fabric_tests::figures::percentile;
use std::{
    collections::BTreeMap,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use fabric_api::networking::v1alpha1::{
    ClusterCidrs, Configuration, ConfigurationSpec, ConfigurationStatus,
};
use kube::{
    Api,
    api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams},
};

use fabric_tests::{
    Testbed, apiserver::ApiServer, check_interrupt, clusters::PeeredClusters, process::Bin,
};

/// VmRSS in KiB of every process whose command line contains `token`.
fn rss_kib(token: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        let Ok(cmd) = std::fs::read(p.join("cmdline")) else {
            continue;
        };
        let cmd: Vec<String> = cmd
            .split(|b| *b == 0)
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect();
        if cmd.is_empty() || !cmd.iter().any(|a| a.contains(token)) || cmd[0] == "ip" {
            continue;
        }
        let status = std::fs::read_to_string(p.join("status")).unwrap_or_default();
        if let Some(kib) = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
        {
            let name = Path::new(&cmd[0])
                .file_name()
                .map_or(cmd[0].clone(), |n| n.to_string_lossy().into_owned());
            out.push((
                format!("{name} {}", cmd.get(1).cloned().unwrap_or_default()),
                kib,
            ));
        }
    }
    out
}

fn routes(tb: &Testbed, ns: &str) -> Result<String> {
    tb.ip(ns, &["route", "show", "proto", "250"])
}

/// CR change -> route latencies for `n` peers, added one after the other.
async fn route_latencies(
    tb: &Testbed,
    node: &str,
    api: &Api<Configuration>,
    round: usize,
    n: usize,
) -> Result<Vec<Duration>> {
    let mut lat = Vec::with_capacity(n);
    for k in 0..n {
        check_interrupt()?;
        let name = format!("r{round}-p{k}");
        // 10.<64+k/250>.<k%250>.0/24 keeps every peer's CIDR distinct.
        let seen = format!("10.{}.{}.0/24", 64 + k / 250, k % 250);
        let seen_cidr: ipnetwork::Ipv4Network = seen.parse()?;
        let cfg = Configuration {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            spec: ConfigurationSpec {
                cluster_id: name.clone(),
                remote: ClusterCidrs {
                    pod: "10.244.0.0/16".parse().unwrap(),
                    external: "10.70.0.0/16".parse().unwrap(),
                },
            },
            status: None,
        };
        api.create(&PostParams::default(), &cfg).await?;
        let status = serde_json::json!({
            "apiVersion": "networking.fabric.io/v1alpha1",
            "kind": "Configuration",
            "status": ConfigurationStatus {
                remote: Some(ClusterCidrs { pod: seen_cidr, external: format!("10.{}.{}.0/24", 128 + k / 250, k % 250).parse()? }),
                peer_id: Some(k as i32 + 1),
                ..Default::default()
            },
        });
        let t0 = Instant::now();
        api.patch_status(
            &name,
            &PatchParams::apply("fabric-bench").force(),
            &Patch::Apply(&status),
        )
        .await?;
        let want = seen.trim_end_matches(".0/24").to_owned() + ".0/24 via";
        loop {
            if routes(tb, node)?.contains(&want) {
                lat.push(t0.elapsed());
                break;
            }
            if t0.elapsed() > Duration::from_secs(10) {
                bail!("route for {seen} never appeared");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    // Clean up the round: the agent removes the routes.
    for k in 0..n {
        let _ = api
            .delete(&format!("r{round}-p{k}"), &DeleteParams::default())
            .await;
    }
    let t0 = Instant::now();
    while !routes(tb, node)?.trim().is_empty() {
        if t0.elapsed() > Duration::from_secs(30) {
            bail!("routes of round {round} not removed");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(lat)
}

pub fn run(peer_counts: &[usize]) -> Result<()> {
    println!("== control plane benchmark (one run; targets from the issue in brackets)\n");

    // 1 + 3: peering two fresh clusters.
    let mut cl = PeeredClusters::new(1)?;
    let t0 = Instant::now();
    let progress = cl.peer_ok()?;
    let peered = t0.elapsed();
    let remote = fabric_tests::clusters::Cluster::pod_ip(0).replacen("10.244.", "10.64.", 1);
    cl.wait_reachable(&cl.a.pods[0], &remote, Duration::from_secs(30))?;
    let to_packet = t0.elapsed();
    println!(
        "fabricctl peer -> first packet across:  {:>8.2} s   [< 5 s]",
        to_packet.as_secs_f64()
    );
    println!(
        "  (fabricctl peer itself returned after {:.2} s, once both sides reported Connected)",
        peered.as_secs_f64()
    );
    if std::env::var_os("FABRIC_BENCH_VERBOSE").is_some() {
        println!("{progress}");
    }
    check_interrupt()?;
    std::thread::sleep(Duration::from_secs(3));
    println!("\nresident memory at rest, one peer (debug builds)   [agent, gateway < 30 MiB]");
    let mut rows = BTreeMap::new();
    for (token, what) in [
        // The agents' next hop in cluster A (single gateway replica).
        ("--gateway".to_owned(), "agent"),
        (cl.a.dir.display().to_string(), "gateway + operator"),
        (fabric_tests::clusters::POOL.to_owned(), "ipam"),
    ] {
        for (name, kib) in rss_kib(&token) {
            if name.starts_with("fabric") {
                rows.insert(name, (what, kib));
            }
        }
    }
    for (name, (_, kib)) in &rows {
        println!("  {name:<32} {:>8.1} MiB", *kib as f64 / 1024.0);
    }
    // CR change -> data plane on the gateway, end to end: an `IP` created in A until a pod in
    // B reaches that host (IPAM grants the address, the operator renders it, the gateway
    // reloads and writes the external-IP maps).
    let mut samples = Vec::new();
    for k in 0..5u8 {
        check_interrupt()?;
        let host = cl.tb.add_netns(&format!("h{k}"))?;
        let dev = format!("h{k}");
        cl.tb.veth(&cl.a.gw, &dev, &host, "eth0")?;
        cl.tb.ip(
            &cl.a.gw,
            &[
                "addr",
                "add",
                &format!("192.168.{}.1/24", 10 + k),
                "dev",
                &dev,
            ],
        )?;
        cl.tb.ip(
            &host,
            &[
                "addr",
                "add",
                &format!("192.168.{}.5/24", 10 + k),
                "dev",
                "eth0",
            ],
        )?;
        cl.tb.ip(
            &host,
            &[
                "route",
                "add",
                "default",
                "via",
                &format!("192.168.{}.1", 10 + k),
            ],
        )?;
        let t0 = Instant::now();
        let o = cl.a.api.kubectl_stdin(
            &["apply", "-f", "-"],
            &format!(
                "apiVersion: networking.fabric.io/v1alpha1\nkind: IP\nmetadata: {{name: h{k}, namespace: fabric-system}}\nspec: {{ip: 192.168.{}.5}}\n",
                10 + k
            ),
        );
        if !o.status.success() {
            bail!("creating IP h{k}: {}", String::from_utf8_lossy(&o.stderr));
        }
        // Addresses are granted in order from the first free one: .1, .2, ...; B sees A's
        // external CIDR as 10.65.0.0/16.
        let dst = format!("10.65.0.{}", k + 1);
        loop {
            if cl
                .tb
                .exec_any(&cl.b.pods[0], &["ping", "-c", "1", "-W", "0.05", &dst])?
                .status
                .success()
            {
                samples.push(t0.elapsed());
                break;
            }
            if t0.elapsed() > Duration::from_secs(20) {
                bail!(
                    "host {k} never became reachable at {dst}\n{}",
                    cl.log_tails()
                );
            }
        }
    }
    samples.sort();
    println!(
        "\nIP created in A -> reachable from B (IPAM, operator, gateway reload, maps)   [p99 < 200 ms for maps]"
    );
    println!(
        "  5 samples: min {:.0} ms, median {:.0} ms, max {:.0} ms (includes kubectl and ping timing)",
        samples[0].as_secs_f64() * 1e3,
        samples[2].as_secs_f64() * 1e3,
        samples[4].as_secs_f64() * 1e3
    );
    drop(cl);
    check_interrupt()?;

    // 2: the agent's reaction time.
    let mut tb = Testbed::new()?;
    let node = tb.add_netns("node")?;
    let gw = tb.add_netns("gw")?;
    tb.veth(&node, "eth0", &gw, "eth0")?;
    tb.ip(&node, &["addr", "add", "10.9.0.2/24", "dev", "eth0"])?;
    let server = ApiServer::start("bench-control");
    server.install_crds();
    let _agent = Bin::new("fabric-agent")?
        .kubeconfig(&server.kubeconfig)
        .args([
            "run",
            "--namespace",
            "default",
            "--gateway",
            "10.9.0.1",
            "--route-netns",
            &node,
        ])
        .spawn()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    println!("\nConfiguration granted -> route on the node   [p99 < 200 ms]");
    println!(
        "  {:>6} {:>10} {:>10} {:>10}",
        "peers", "p50 ms", "p99 ms", "max ms"
    );
    rt.block_on(async {
        let api: Api<Configuration> = Api::namespaced(server.client().await, "default");
        for (round, n) in peer_counts.iter().enumerate() {
            let mut lat = route_latencies(&tb, &node, &api, round, *n).await?;
            lat.sort();
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            println!(
                "  {n:>6} {:>10.1} {:>10.1} {:>10.1}",
                ms(percentile(&lat, 0.5)),
                ms(percentile(&lat, 0.99)),
                ms(*lat.last().unwrap())
            );
        }
        anyhow::Ok(())
    })?;
    crate::operator::run_operator(10)
}
