//! The fabric demo (`cargo xtask demo`): two Kubernetes clusters, each with its own API server
//! and its own network, both using pod CIDR 10.244.0.0/16 (the same pod addresses even), peer
//! as a user peers them: the provider prints `fabricctl generate peer-command`, the consumer
//! runs it asking for resources, and gets a tunnel its pods talk through (the eBPF double NAT)
//! and a virtual node with the grant. A pod bound to the virtual node runs on the provider and
//! answers the consumer's pods at the address the consumer sees it at. A stateful pod of the
//! consumer keeps its data on the fabric's StorageClass, provisioned on the real node it runs
//! on. Everything is removed at the end, also on Ctrl-C or failure.
use std::{
    process::{Command, ExitCode},
    sync::OnceLock,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use fabric_api::names;
use fabric_tests::{
    apiserver::{ApiServer, require_tools},
    check_interrupt,
    clusters::{self, Cluster, POD_CIDR},
    install_interrupt_handler, is_root, locate_bin,
    peering_stack::{ADVERTISED_LABEL, PeeringStack, SharingClusters},
    sharing, shop, traffic,
    workloads::{ECHO_PORT, command_pod, echo_pod, on_node},
};
use ipnetwork::Ipv4Network;
use serde_json::{Value, json};

/// When the demo started: each section's title says how far in it is, so a run's log (CI's
/// too) shows where the time goes.
static START: OnceLock<Instant> = OnceLock::new();

mod show;
mod storage;
mod tethered;

use show::*;
use storage::*;
use tethered::*;

/// The demo's clusters and their sharing layers.
type Demo = SharingClusters;

fn demo() -> Result<()> {
    title("Two clusters, one pod CIDR, each with the fabric's sharing layer");
    println!(
        "Cluster A and cluster B both use {POD_CIDR}; each has a pod {} on its node.",
        Cluster::pod_ip(0)
    );
    println!("Each cluster has its own API server (kubelite, RBAC and client certificates on),");
    println!("a gateway, a node, and runs the fabric's real binaries: IPAM controller, gateway");
    println!("operator, WireGuard gateway (boringtun) with the eBPF remap programs, a node agent,");
    println!("and the sharing layer: the authentication service, `fabric-controller sharing`");
    println!("(negotiation, ShadowPods) and `virtual-nodes` (which deploys a virtual kubelet).");
    let mut d = SharingClusters::start(1, false)?;
    check_interrupt()?;
    let r = peer_and_offload(&mut d);
    if r.is_err() {
        eprintln!("{}", d.logs());
    }
    r?;
    println!("\nCleaning up (namespaces, processes, API servers)...");
    Ok(())
}

fn peer_and_offload(d: &mut Demo) -> Result<()> {
    let (a_id, b_id) = (d.cl.a.id.clone(), d.cl.b.id.clone());

    title("On cluster B (the provider): fabricctl generate peer-command");
    let words = d.stack.peer_command(&d.cl, 2, &[])?;
    indent(&words.join(" "));

    println!("  B lends storage too: 1Gi of its StorageClass standard (ConfigMap fabric-storage):");
    d.cl.b.lend_storage("standard=1Gi")?;
    let ask = [
        "--cpu",
        "1",
        "--memory",
        "2Gi",
        "--pods",
        "20",
        "--resource",
        "storage.fabric.io/standard=1Gi",
    ];
    title(&format!(
        "On cluster A (the consumer): that command, plus {}",
        ask.join(" ")
    ));
    // Its progress lines as they come, while the gateways come up here.
    PeeringStack::run_peer_command(&mut d.cl, 1, &words, &ask, &[1, 2], |l| println!("    {l}"))?;
    check_interrupt()?;

    title("On cluster A: kubectl get nodes -o wide");
    wait(
        &format!("the virtual node {b_id} Ready"),
        Duration::from_secs(60),
        || {
            let n = get_json(
                &d.cl.a.api,
                &["get", "node", &names::node::virtual_node(&b_id)],
            )?;
            n["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
                .then_some(())
        },
    )?;
    show(kubectl(&d.cl.a.api, &["get", "nodes", "-o", "wide"]));
    // kubelite prints only NAME and CREATED AT for built-in types: the columns that matter
    // here, from the objects.
    println!("  ... and its status, capacity and taint:");
    show(kubectl(
        &d.cl.a.api,
        &[
            "get",
            "nodes",
            "-o",
            "custom-columns=NAME:.metadata.name,\
             READY:.status.conditions[?(@.type==\"Ready\")].status,\
             REASON:.status.conditions[?(@.type==\"Ready\")].reason,\
             CPU:.status.capacity.cpu,MEMORY:.status.capacity.memory,\
             PODS:.status.capacity.pods,TAINTS:.spec.taints[*].key",
        ],
    ));

    title(&format!("On cluster A: fabricctl info peer {b_id}"));
    show(fabricctl(&d.cl.a.api, &["info", "peer", &b_id]));
    check_interrupt()?;

    title("Pods talking across the tunnel (TCP; the server reports the client address it sees)");
    let a_sees_b = d.cl.a.remote_pod_cidr(&b_id, Duration::from_secs(30))?;
    let b_sees_a = d.cl.b.remote_pod_cidr(&a_id, Duration::from_secs(30))?;
    let pod = Cluster::pod_ip(0);
    let remap = |addr: &str, cidr: &Ipv4Network| {
        clusters::remap(addr.parse().expect("a pod address"), *cidr).to_string()
    };
    d.cl.wait_reachable(
        &d.cl.a.pods[0],
        &remap(&pod, &a_sees_b),
        Duration::from_secs(30),
    )?;
    for (from, to, view, fname, tname) in [
        (&d.cl.a, &d.cl.b, &a_sees_b, "A", "B"),
        (&d.cl.b, &d.cl.a, &b_sees_a, "B", "A"),
    ] {
        let dst = remap(&pod, view);
        let saw = traffic::tcp_probe(&from.pods[0], &to.pods[0], &dst, 8080)?
            .server_saw
            .ip();
        println!(
            "  {fname} pod {pod} connects to {dst}  =>  {tname} pod {pod} sees the client as {saw}"
        );
    }
    println!("  (A sees B's {POD_CIDR} as {a_sees_b}, B sees A's as {b_sees_a}: the gateways");
    println!("   rewrite the prefix and keep the host bits, with no connection tracking.)");
    check_interrupt()?;

    title("On cluster A: a pod for the virtual node (toleration + node selector)");
    let mut pod_json = echo_pod("echo");
    pod_json["spec"]["nodeSelector"] = json!({ ADVERTISED_LABEL: b_id });
    pod_json["spec"]["tolerations"] =
        json!([{ "key": names::taint::VIRTUAL_NODE, "operator": "Exists" }]);
    indent(&serde_json::to_string_pretty(&pod_json["spec"])?);
    d.cl.a.create_pod(&pod_json)?;
    let echo =
        d.cl.a
            .wait_pod_running("default", "echo", Duration::from_secs(90))?;
    println!(
        "  Running on {} after {}; kubectl get pod echo -o wide:",
        echo.node,
        elapsed()
    );
    show(kubectl(&d.cl.a.api, &["get", "pod", "echo", "-o", "wide"]));
    show(kubectl(
        &d.cl.a.api,
        &[
            "get",
            "pod",
            "echo",
            "-o",
            "custom-columns=NAME:.metadata.name,STATUS:.status.phase,\
             IP:.status.podIP,NODE:.spec.nodeName",
        ],
    ));
    let tenant = names::namespace::tenant(&a_id);
    println!("  On cluster B, the pod that runs it (kubectl get pods -n {tenant}):");
    show(kubectl(
        &d.cl.b.api,
        &[
            "get",
            "pods",
            "-n",
            &tenant,
            "-o",
            "custom-columns=NAME:.metadata.name,STATUS:.status.phase,\
             IP:.status.podIP,NODE:.spec.nodeName",
        ],
    ));

    title("A pod of cluster A reaches the offloaded pod at its IP (the echo names the client)");
    let bin = locate_bin("fabric-test-pod")?.display().to_string();
    let target = format!("{}:{ECHO_PORT}", echo.ip);
    let answer = wait(
        &format!("an answer from {target}"),
        Duration::from_secs(30),
        || {
            d.cl.tb
                .exec(&d.cl.a.pods[0], &[&bin, "connect", &target])
                .ok()
        },
    );
    match answer {
        Ok(answer) => {
            println!(
                "  A pod {pod} connects to {target}  =>  the echo answers: the client is {}",
                answer.trim()
            );
            println!(
                "  (the offloaded pod runs in cluster B, where A's pod {pod} is {}: B's view)",
                remap(&pod, &b_sees_a)
            );
        }
        Err(e) => {
            // What fails, and whether the pod answers inside its own cluster.
            println!("  A pod {pod} -> {target}: FAILED ({e:#})");
            let real = get_json(&d.cl.b.api, &["get", "pods", "-n", &tenant])
                .and_then(|l| l["items"][0]["status"]["podIP"].as_str().map(str::to_owned));
            if let Some(ip) = real {
                let inside = format!("{ip}:{ECHO_PORT}");
                match d.cl.tb.exec(&d.cl.b.pods[0], &[&bin, "connect", &inside]) {
                    Ok(a) => println!("  inside B, B pod {pod} -> {inside}: {}", a.trim()),
                    Err(e) => println!("  inside B, B pod {pod} -> {inside}: FAILED ({e:#})"),
                }
            }
        }
    }
    check_interrupt()?;

    title(
        "On cluster A: kubectl logs and exec on the offloaded pod (the virtual kubelet carries them to B)",
    );
    println!("  kubectl logs echo (the echo's log: the clients it saw, in B's view):");
    show(kubectl(&d.cl.a.api, &["logs", "echo", "--tail", "3"]));
    println!(
        "  kubectl exec echo -- ip -4 -br addr show scope global (the pod's address inside B):"
    );
    show(kubectl(
        &d.cl.a.api,
        &[
            "exec", "echo", "--", "ip", "-4", "-br", "addr", "show", "scope", "global",
        ],
    ));
    println!(
        "  (A shows the pod as {}: B's pod CIDR as A sees it)",
        echo.ip
    );

    title("Cluster B decides what runs on it: A's own identity writing a root pod straight to B");
    let kubeconfig = d.cl.logs.join("a-on-b.kubeconfig");
    sharing::identity_kubeconfig(&d.cl.a.api, &b_id, &kubeconfig)?;
    println!(
        "  kubectl create (as A's identity on B) a ShadowPod with hostPID and a privileged container:"
    );
    let o = fabric_tests::process::kubectl_stdin(
        &kubeconfig,
        &["create", "-f", "-"],
        &sharing::root_shadowpod(&a_id, "root").to_string(),
    );
    if o.status.success() {
        bail!("cluster B admitted a root pod from A's identity");
    }
    indent(String::from_utf8_lossy(&o.stderr).trim());
    println!("  (B's ShadowPod webhook holds every tenant to B's policy: Pod Security baseline by");
    println!(
        "   default, B's scheduling, B's quota; A's own check at home is only early feedback.)"
    );
    check_interrupt()?;

    stateful_at_home(d)?;
    check_interrupt()?;

    title("A namespace offloaded whole: fabricctl offload namespace shop (cluster A)");
    kubectl(&d.cl.a.api, &["create", "namespace", shop::NAMESPACE])?;
    let apply = |v: serde_json::Value| -> Result<()> {
        let o =
            d.cl.a
                .api
                .kubectl_stdin(&["apply", "-f", "-"], &v.to_string());
        if !o.status.success() {
            bail!("{}", String::from_utf8_lossy(&o.stderr));
        }
        Ok(())
    };
    println!("  Its database db runs at home already, behind Service db:");
    d.cl.a.create_pod(&shop::db())?;
    apply(shop::service("db"))?;
    let db =
        d.cl.a
            .wait_pod_running(shop::NAMESPACE, "db", Duration::from_secs(60))?;
    println!("  db Running on {} at {}", db.node, db.ip);
    orders_at_home(d)?;
    let selector = format!("{ADVERTISED_LABEL}={b_id}");
    println!(
        "  fabricctl offload namespace shop --pod-offloading-strategy Remote --selector {selector}"
    );
    show(fabricctl(
        &d.cl.a.api,
        &[
            "offload",
            "namespace",
            shop::NAMESPACE,
            "--pod-offloading-strategy",
            "Remote",
            "--selector",
            &selector,
        ],
    ));
    let twin = format!("shop-{a_id}");
    println!(
        "  On cluster B, the twin namespace B made for it (kubectl get namespace {twin} --show-labels):"
    );
    show(kubectl(
        &d.cl.b.api,
        &["get", "namespace", &twin, "--show-labels"],
    ));
    println!("  Its configuration: ConfigMap settings (greeting) and Secret db (password).");
    apply(shop::config())?;
    println!("  A pod web created in shop with nothing about placement (A's pod webhook adds it),");
    println!("  its environment from them, a container api calling A's API server with the token");
    println!("  of its own ServiceAccount web, and Service web for it:");
    kubectl(
        &d.cl.a.api,
        &[
            "create",
            "serviceaccount",
            shop::WEB_ACCOUNT,
            "-n",
            shop::NAMESPACE,
        ],
    )?;
    d.cl.a.create_pod(&shop::web_calling_home())?;
    apply(shop::service("web"))?;
    show(kubectl(
        &d.cl.a.api,
        &[
            "get",
            "pod",
            "web",
            "-n",
            shop::NAMESPACE,
            "-o",
            "jsonpath={.spec.tolerations}{\"\\n\"}{.spec.affinity}",
        ],
    ));
    let web =
        d.cl.a
            .wait_pod_running(shop::NAMESPACE, "web", Duration::from_secs(90))?;
    println!(
        "  Running on {} after {}; on cluster B, in the twin, under its own name:",
        web.node,
        elapsed()
    );
    show(kubectl(
        &d.cl.b.api,
        &[
            "get",
            "shadowpods,pods",
            "-n",
            &twin,
            "-o",
            "custom-columns=KIND:.kind,NAME:.metadata.name,STATUS:.status.phase",
        ],
    ));
    let web_svc = d.cl.a.service_ip(shop::NAMESPACE, "web")?;
    let target = format!("{web_svc}:{ECHO_PORT}");
    let answer = wait(
        &format!("an answer from {target}"),
        Duration::from_secs(30),
        || {
            d.cl.tb
                .exec(&d.cl.a.pods[0], &[&bin, "connect", &target])
                .ok()
        },
    )?;
    println!(
        "  A pod {pod} connects to Service shop/web at its cluster IP {target}  =>  {} (web runs in B)",
        answer.trim()
    );
    println!(
        "  kubectl logs web -n shop (it read its ConfigMap and Secret, reflected into the twin):"
    );
    show(kubectl(
        &d.cl.a.api,
        &["logs", "web", "-n", shop::NAMESPACE, "--tail", "4"],
    ));
    println!(
        "  On cluster B, the Services A's virtual kubelet copied into the twin (B's own cluster IPs)"
    );
    println!("  and the EndpointSlices: db's translated into B's view of A, web's B's own:");
    let db_remote = wait("db's Service in the twin", Duration::from_secs(30), || {
        d.cl.b.service_ip(&twin, "db").ok()
    })?;
    show(kubectl(
        &d.cl.b.api,
        &[
            "get",
            "services",
            "-n",
            &twin,
            "-o",
            "custom-columns=SERVICE:.metadata.name,CLUSTER-IP:.spec.clusterIP",
        ],
    ));
    show(kubectl(
        &d.cl.b.api,
        &[
            "get",
            "endpointslices",
            "-n",
            &twin,
            "-o",
            "custom-columns=ENDPOINTSLICE:.metadata.name,SERVICE:.metadata.labels.kubernetes\\.io/service-name,ADDRESSES:.endpoints[*].addresses[*],MANAGED-BY:.metadata.labels.endpointslice\\.kubernetes\\.io/managed-by",
        ],
    ));
    let web_b =
        d.cl.b
            .wait_pod_running(&twin, "web", Duration::from_secs(30))?;
    let seen = wait(
        "db answering web through B's copy of its Service",
        Duration::from_secs(30),
        || d.cl.b.connect_from(&web_b, &db_remote, ECHO_PORT).ok(),
    )?;
    println!(
        "  web, in cluster B, connects to Service db at B's cluster IP {db_remote}:{ECHO_PORT}  =>  {seen}"
    );
    println!(
        "  (db, at home in A, sees web at {}: the address A shows for it)",
        web.ip
    );
    println!(
        "  web's container api, in cluster B, calls https://kubernetes.default.svc: A's API server"
    );
    println!(
        "  (B's Service fabric-home-apiserver in the twin, its endpoint A's API server in B's view),"
    );
    println!(
        "  with a token A issued to shop:web, bound to the home pod, delivered into the twin:"
    );
    let api_logs = || {
        kubectl(
            &d.cl.a.api,
            &[
                "logs",
                "web",
                "-c",
                "api",
                "-n",
                shop::NAMESPACE,
                "--tail",
                "2",
            ],
        )
        .unwrap_or_default()
    };
    let refused = wait(
        "A's API server refusing shop:web",
        Duration::from_secs(60),
        || {
            let out = api_logs();
            out.contains("status 403").then_some(out)
        },
    )?;
    indent(refused.lines().last().unwrap_or_default());
    println!("  kubectl create role + rolebinding web-reads (list configmaps) for shop:web in A:");
    kubectl(
        &d.cl.a.api,
        &[
            "create",
            "role",
            "web-reads",
            "--verb=list",
            "--resource=configmaps",
            "-n",
            shop::NAMESPACE,
        ],
    )?;
    kubectl(
        &d.cl.a.api,
        &[
            "create",
            "rolebinding",
            "web-reads",
            "--role=web-reads",
            &format!("--serviceaccount={}:{}", shop::NAMESPACE, shop::WEB_ACCOUNT),
            "-n",
            shop::NAMESPACE,
        ],
    )?;
    let listed = wait(
        "A's API server answering shop:web",
        Duration::from_secs(60),
        || {
            let out = api_logs();
            out.contains("status 200").then_some(out)
        },
    )?;
    let first = listed
        .lines()
        .find(|l| l.contains("status 200"))
        .unwrap_or_default();
    println!("  {first} (a ConfigMapList from A, read by a pod running in B)");
    println!("  kubectl apply (in A) a NetworkPolicy: web takes connections from db's pods only:");
    d.cl.a.create(
        &json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "web-from-db", "namespace": shop::NAMESPACE},
        "spec": {"podSelector": {"matchLabels": {"app": "web"}},
                 "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "db"}}}],
                              "ports": [{"port": ECHO_PORT}]}]}}),
    )?;
    let cidrs = ".spec.ingress[*].from[*].ipBlock.cidr";
    let reflected = wait(
        "the NetworkPolicy in the twin",
        Duration::from_secs(30),
        || {
            let out = kubectl(
                &d.cl.b.api,
                &[
                    "get",
                    "networkpolicy",
                    "web-from-db",
                    "-n",
                    &twin,
                    "-o",
                    &format!("jsonpath={{{cidrs}}}"),
                ],
            )
            .ok()?;
            (!out.trim().is_empty()).then_some(out)
        },
    );
    let reflected = match reflected {
        Ok(r) => r,
        Err(e) => {
            show(kubectl(
                &d.cl.b.api,
                &[
                    "get",
                    "shadownetworkpolicies,networkpolicies,events",
                    "-n",
                    &twin,
                    "-o",
                    "yaml",
                ],
            ));
            show(kubectl(
                &d.cl.a.api,
                &[
                    "get",
                    "pods",
                    "-n",
                    shop::NAMESPACE,
                    "-o",
                    "wide",
                    "--show-labels",
                ],
            ));
            return Err(e);
        }
    };
    println!(
        "  On cluster B, in the twin: db (at home in A) is an address block, in B's view of A:"
    );
    show(kubectl(
        &d.cl.b.api,
        &[
            "get",
            "networkpolicy",
            "-n",
            &twin,
            "-o",
            &format!(
                "custom-columns=NAME:.metadata.name,POD-SELECTOR:.spec.podSelector.matchLabels,FROM:{cidrs}"
            ),
        ],
    ));
    println!(
        "  (the consumer writes a ShadowNetworkPolicy; B's controller writes this one, cut to A's"
    );
    println!(
        "   own addresses: {}; enforcing it is B's network plugin's job)",
        reflected.trim()
    );
    check_interrupt()?;
    stateful_offloaded(d, &b_id, &twin)?;
    check_interrupt()?;
    orders_moved(d, &b_id)?;
    title("fabricctl unoffload namespace shop (cluster A; it says what goes first)");
    show(fabricctl(&d.cl.a.api, &["unoffload", "namespace", "shop"]));
    retained_and_forgotten(d, &a_id, &b_id, &twin)?;
    check_interrupt()?;
    tethered(d, &a_id, &b_id)?;
    check_interrupt()?;

    title("fabricctl status (cluster A)");
    show(fabricctl(&d.cl.a.api, &["status"]));

    title("The tunnel, as the standard `wg` tool sees gateway A (wg show)");
    // `wg` only looks in /var/run/wireguard; the demo's gateways keep their sockets in the
    // demo's directory, so link one in for the moment.
    let link = std::path::Path::new("/var/run/wireguard")
        .join(format!("fabdemo{}.sock", std::process::id() % 10000));
    let name = link.file_stem().unwrap().to_string_lossy().into_owned();
    let _ = std::fs::create_dir_all("/var/run/wireguard");
    let _ = std::fs::remove_file(&link);
    if std::os::unix::fs::symlink(d.cl.a.dir.join("gw1.sock"), &link).is_ok() {
        match Command::new("wg").args(["show", &name]).output() {
            Ok(o) if o.status.success() => indent(&String::from_utf8_lossy(&o.stdout)),
            _ => println!("  (wg not available)"),
        }
        let _ = std::fs::remove_file(&link);
    }
    Ok(())
}

fn main() -> ExitCode {
    if !is_root() {
        eprintln!("the demo creates network namespaces and loads eBPF programs: run it as root");
        return ExitCode::FAILURE;
    }
    if !require_tools("demo") {
        return ExitCode::FAILURE;
    }
    install_interrupt_handler();
    START.get_or_init(Instant::now);
    match demo() {
        Ok(()) => {
            println!("done in {} (cleanup included).", elapsed());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("demo failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}
