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

fn elapsed() -> String {
    format!(
        "{:.1} s",
        START.get_or_init(Instant::now).elapsed().as_secs_f64()
    )
}

fn title(s: &str) {
    println!("\n=== {s}   [{}]", elapsed());
}

fn indent(s: &str) {
    for l in s.lines() {
        println!("    {l}");
    }
}

/// Shows what a command printed, or why it failed: a display that does not work is reported
/// and the demo goes on.
fn show(r: Result<String>) {
    match r {
        Ok(s) => indent(&s),
        Err(e) => println!("    (failed: {e:#})"),
    }
}

fn kubectl(api: &ApiServer, args: &[&str]) -> Result<String> {
    let o = api.kubectl(args);
    if !o.status.success() {
        bail!(
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

fn get_json(api: &ApiServer, args: &[&str]) -> Option<Value> {
    let mut a = args.to_vec();
    a.extend(["-o", "json"]);
    serde_json::from_str(&kubectl(api, &a).ok()?).ok()
}

fn fabricctl(api: &ApiServer, args: &[&str]) -> Result<String> {
    let o = Command::new(locate_bin("fabricctl")?)
        .env("KUBECONFIG", &api.kubeconfig)
        .env_remove("FABRIC_PEERING_TOKEN")
        .args(args)
        .output()?;
    if !o.status.success() {
        bail!(
            "fabricctl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Polls `f` every 250 ms until it gives a value, for at most `timeout`.
fn wait<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Result<T> {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        check_interrupt()?;
        if t0.elapsed() > timeout {
            bail!("{what}: not within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

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

/// `pod` with claim `claim` mounted at /srv.
fn mounting(mut pod: Value, claim: &str) -> Value {
    pod["spec"]["containers"][0]["volumeMounts"] = json!([{ "name": "data", "mountPath": "/srv" }]);
    pod["spec"]["volumes"] =
        json!([{ "name": "data", "persistentVolumeClaim": { "claimName": claim } }]);
    pod
}

/// A claim of the fabric's StorageClass whose first consumer runs on a real node of A: the
/// storage provisioner makes a real claim of A's default class and binds the claim to a volume
/// over the real one; the file a pod writes there is read by the next pod.
fn stateful_at_home(d: &Demo) -> Result<()> {
    title(
        "A stateful pod at home: a claim of the fabric's StorageClass on a real node (cluster A)",
    );
    let a = &d.cl.a;
    let class = fabric_tests::manifests::Manifests::rendered(&a.api)?
        .into_iter()
        .find(|o| o["kind"] == "StorageClass" && o["metadata"]["name"] == names::storage::CLASS)
        .context("deploy/ has no StorageClass fabric")?;
    a.create(&class)?;
    let claim = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "notes", "namespace": "default"},
        "spec": {"storageClassName": names::storage::CLASS, "accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "64Mi"}}}});
    a.create(&claim)?;
    let with_claim = |pod: Value| mounting(pod, "notes");
    let text = "written on cluster A's node, through the fabric's storage class";
    println!("  a claim `notes` of class fabric, and a pod on A's node writing /srv/note:");
    a.create_pod(&on_node(
        with_claim(command_pod(
            "writer",
            &["fabric-test-pod", "write", "/srv/note", text],
        )),
        0,
    ))?;
    a.wait_pod_succeeded("default", "writer", Duration::from_secs(60))?;
    println!("  kubectl get pvc notes; the volume it is bound to (over the real one):");
    show(kubectl(
        &a.api,
        &[
            "get",
            "pvc",
            "notes",
            "-o",
            "custom-columns=NAME:.metadata.name,STATUS:.status.phase,CLASS:.spec.storageClassName,VOLUME:.spec.volumeName",
        ],
    ));
    show(kubectl(
        &a.api,
        &[
            "get",
            "pv",
            "-o",
            "custom-columns=NAME:.metadata.name,CLASS:.spec.storageClassName,CLAIM:.spec.claimRef.name,PATH:.spec.hostPath.path",
        ],
    ));
    println!(
        "  kubectl get pvc -n {} (the real claim the provisioner made):",
        names::namespace::STORAGE
    );
    show(kubectl(
        &a.api,
        &[
            "get",
            "pvc",
            "-n",
            names::namespace::STORAGE,
            "-o",
            "custom-columns=NAME:.metadata.name,STATUS:.status.phase,CLASS:.spec.storageClassName,FOR:.metadata.labels.storage\\.fabric\\.io/home-name",
        ],
    ));
    kubectl(&a.api, &["delete", "pod", "writer", "--wait=true"])?;
    a.create_pod(&with_claim(command_pod(
        "reader",
        &["fabric-test-pod", "read", "/srv/note"],
    )))?;
    a.wait_pod_succeeded("default", "reader", Duration::from_secs(60))?;
    println!("  the next pod reads it (kubectl logs reader):");
    let read = kubectl(&a.api, &["logs", "reader"])?;
    indent(read.trim());
    if read.trim() != text {
        bail!("the reader read {read:?}, not what the writer wrote");
    }
    kubectl(&a.api, &["delete", "pod", "reader", "--wait=true"])?;
    kubectl(&a.api, &["delete", "pvc", "notes", "--wait=true"])?;
    println!("  kubectl delete pvc notes: its volume, real claim and real volume are gone too.");
    Ok(())
}

/// What shop's pods wrote at home before it was offloaded: a claim `orders` of the fabric's
/// class, written by a pod on A's node (a few bytes: the demo stays quick).
const ORDERS: &str = "order 1: 3 mugs; order 2: 1 teapot";

fn orders_at_home(d: &Demo) -> Result<()> {
    let a = &d.cl.a;
    a.create(&json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "orders", "namespace": shop::NAMESPACE},
        "spec": {"storageClassName": names::storage::CLASS, "accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "16Mi"}}}}))?;
    let mut pod = command_pod(
        "orders-writer",
        &["fabric-test-pod", "write", "/srv/orders", ORDERS],
    );
    pod["metadata"]["namespace"] = json!(shop::NAMESPACE);
    a.create_pod(&mounting(pod, "orders"))?;
    a.wait_pod_succeeded(shop::NAMESPACE, "orders-writer", Duration::from_secs(60))?;
    kubectl(
        &a.api,
        &[
            "delete",
            "pod",
            "orders-writer",
            "-n",
            shop::NAMESPACE,
            "--wait=true",
        ],
    )?;
    println!("  and a claim `orders` of class fabric its pods wrote at home: {ORDERS:?}");
    Ok(())
}

/// The claim `orders` written at home moved to B with `fabricctl move volume` (offline,
/// checksummed; shop being `Remote` does not keep the sender off A's node), then read by a
/// pod that lands on the virtual node, where the data now is.
fn orders_moved(d: &Demo, b_id: &str) -> Result<()> {
    title("A volume moved: fabricctl move volume shop/orders --to B (cluster A)");
    let a = &d.cl.a;
    let out = fabricctl(
        &a.api,
        &[
            "move",
            "volume",
            &format!("{}/orders", shop::NAMESPACE),
            "--to",
            b_id,
        ],
    )?;
    // The progress lines aside: the copy and its two digests.
    let shown: Vec<&str> = out
        .lines()
        .filter(|l| !l.starts_with("sent ") || l.contains(" sha256 "))
        .collect();
    indent(&shown.join("\n"));
    let digest = |verb: &str| {
        out.lines()
            .find(|l| l.starts_with(verb) && l.contains(" sha256 "))
            .and_then(|l| l.split(" sha256 ").nth(1))
            .map(str::to_owned)
    };
    match (digest("sent "), digest("received ")) {
        (Some(s), Some(r)) if s == r => {}
        (s, r) => bail!("the move's digests differ or are missing: sent {s:?}, received {r:?}"),
    }
    let mut pod = command_pod("orders-reader", &["fabric-test-pod", "read", "/srv/orders"]);
    pod["metadata"]["namespace"] = json!(shop::NAMESPACE);
    a.create_pod(&mounting(pod, "orders"))?;
    a.wait_pod_succeeded(shop::NAMESPACE, "orders-reader", Duration::from_secs(60))?;
    let node = kubectl(
        &a.api,
        &[
            "get",
            "pod",
            "orders-reader",
            "-n",
            shop::NAMESPACE,
            "-o",
            "jsonpath={.spec.nodeName}",
        ],
    )?;
    let read = kubectl(&a.api, &["logs", "orders-reader", "-n", shop::NAMESPACE])?;
    println!(
        "  a pod of the claim ran on {} and read (kubectl logs orders-reader -n shop):",
        node.trim()
    );
    indent(read.trim());
    if read.trim() != ORDERS {
        bail!("orders-reader read {read:?}, not what was written at home");
    }
    if !node.trim().ends_with(b_id) {
        bail!("orders-reader ran on {node:?}, not on B's virtual node");
    }
    kubectl(
        &a.api,
        &[
            "delete",
            "pod",
            "orders-reader",
            "-n",
            shop::NAMESPACE,
            "--wait=true",
        ],
    )?;
    Ok(())
}

/// A claim of the fabric's StorageClass in the offloaded namespace whose first consumer runs on
/// the virtual node: the claim is made in B's twin (B's class `standard`, lent to A), the volume
/// at home is a placeholder pinned to the virtual node, so the next pod using it goes there
/// too (data gravity) and reads what the first one wrote.
fn stateful_offloaded(d: &Demo, b_id: &str, twin: &str) -> Result<()> {
    title("A stateful pod offloaded: its claim lands in cluster B, the next pod follows the data");
    let (a, b) = (&d.cl.a, &d.cl.b);
    a.create(&json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "ledger", "namespace": shop::NAMESPACE},
        "spec": {"storageClassName": names::storage::CLASS, "accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "64Mi"}}}}))?;
    let with_claim = |name: &str, command: &[&str]| {
        let mut pod = command_pod(name, command);
        pod["metadata"]["namespace"] = json!(shop::NAMESPACE);
        mounting(pod, "ledger")
    };
    let text = "written in cluster B, on a volume of B's, for a pod of A's";
    println!("  a claim `ledger` of class fabric in shop, and a pod writing /srv/ledger (shop's");
    println!("  strategy Remote sends it to the virtual node):");
    a.create_pod(&with_claim(
        "ledger-writer",
        &["fabric-test-pod", "write", "/srv/ledger", text],
    ))?;
    let done = |name: &str| a.wait_pod_succeeded(shop::NAMESPACE, name, Duration::from_secs(90));
    if let Err(e) = done("ledger-writer") {
        show(kubectl(
            &a.api,
            &["get", "pvc,pods", "-n", shop::NAMESPACE, "-o", "wide"],
        ));
        show(kubectl(&b.api, &["get", "pvc,pods,events", "-n", twin]));
        return Err(e);
    }
    println!("  kubectl get pvc ledger -n shop; its volume at home, pinned to the virtual node:");
    show(kubectl(
        &a.api,
        &[
            "get",
            "pvc",
            "ledger",
            "-n",
            shop::NAMESPACE,
            "-o",
            "custom-columns=NAME:.metadata.name,STATUS:.status.phase,CLASS:.spec.storageClassName,VOLUME:.spec.volumeName",
        ],
    ));
    let volume = kubectl(
        &a.api,
        &[
            "get",
            "pvc",
            "ledger",
            "-n",
            shop::NAMESPACE,
            "-o",
            "jsonpath={.spec.volumeName}",
        ],
    )?;
    show(kubectl(
        &a.api,
        &[
            "get",
            "pv",
            volume.trim(),
            "-o",
            "custom-columns=NAME:.metadata.name,CLASS:.spec.storageClassName,NODE:.spec.nodeAffinity.required.nodeSelectorTerms[*].matchExpressions[*].values[*]",
        ],
    ));
    println!(
        "  On cluster B, in the twin: the claim itself, of B's class standard (kubectl get pvc -n {twin}):"
    );
    show(kubectl(
        &b.api,
        &[
            "get",
            "pvc",
            "-n",
            twin,
            "-o",
            "custom-columns=NAME:.metadata.name,STATUS:.status.phase,CLASS:.spec.storageClassName,VOLUME:.spec.volumeName",
        ],
    ));
    kubectl(
        &a.api,
        &[
            "delete",
            "pod",
            "ledger-writer",
            "-n",
            shop::NAMESPACE,
            "--wait=true",
        ],
    )?;
    a.create_pod(&with_claim(
        "ledger-reader",
        &["fabric-test-pod", "read", "/srv/ledger"],
    ))?;
    done("ledger-reader")?;
    let node = kubectl(
        &a.api,
        &[
            "get",
            "pod",
            "ledger-reader",
            "-n",
            shop::NAMESPACE,
            "-o",
            "jsonpath={.spec.nodeName}",
        ],
    )?;
    println!(
        "  the next pod using it ran on {} and read (kubectl logs ledger-reader -n shop):",
        node.trim()
    );
    let read = kubectl(&a.api, &["logs", "ledger-reader", "-n", shop::NAMESPACE])?;
    indent(read.trim());
    if read.trim() != text {
        bail!("ledger-reader read {read:?}, not what ledger-writer wrote");
    }
    if !node.trim().ends_with(b_id) {
        bail!("ledger-reader ran on {node:?}, not on B's virtual node");
    }
    kubectl(
        &a.api,
        &[
            "delete",
            "pod",
            "ledger-reader",
            "-n",
            shop::NAMESPACE,
            "--wait=true",
        ],
    )?;
    Ok(())
}

/// After the unoffload the claim stays on B with its data (storageRetention Retain, the
/// default), out of A's reach but reported to it; an unpeer would be refused while it is kept;
/// `fabricctl forget volumes` deletes it.
fn retained_and_forgotten(d: &Demo, a_id: &str, b_id: &str, twin: &str) -> Result<()> {
    let (a, b) = (&d.cl.a, &d.cl.b);
    let tenant = names::namespace::tenant(a_id);
    wait(
        "the claim reported retained",
        Duration::from_secs(30),
        || {
            let out = kubectl(
                &b.api,
                &[
                    "get",
                    "namespacemap",
                    a_id,
                    "-n",
                    &tenant,
                    "-o",
                    "jsonpath={.status.retained[*].name}",
                ],
            )
            .ok()?;
            out.contains("ledger").then_some(())
        },
    )?;
    println!("  The claim stays on B with its data (storageRetention Retain, the default); A's");
    println!("  rights there are gone. fabricctl unpeer {b_id} (cluster A) now refuses:");
    match fabricctl(&a.api, &["unpeer", b_id, "--timeout-secs", "20"]) {
        Err(refused) => indent(&format!("{refused:#}")),
        Ok(out) => bail!("the unpeer went ahead with a claim retained: {out}"),
    }
    println!("  fabricctl forget volumes --peer {b_id}:");
    show(fabricctl(&a.api, &["forget", "volumes", "--peer", b_id]));
    wait("the twin gone", Duration::from_secs(30), || {
        kubectl(
            &b.api,
            &["get", "namespace", twin, "-o", "jsonpath={.status.phase}"],
        )
        .map_or(Some(()), |p| (p.trim() == "Terminating").then_some(()))
    })?;
    println!("  and B removed the twin {twin} once it held nothing.");
    Ok(())
}

/// Tethered mode: B, which offers resources to A alone, hands A control of them: both sides
/// say so, and a new workload pod of B's own is refused naming the mode; back to autonomous,
/// B's pods are welcome again.
fn tethered(d: &Demo, a_id: &str, b_id: &str) -> Result<()> {
    let (a, b) = (&d.cl.a, &d.cl.b);
    title(&format!(
        "On cluster B: fabricctl mode tethered --peer {a_id} (B offers resources to A alone)"
    ));
    show(fabricctl(&b.api, &["mode", "tethered", "--peer", a_id]));
    let said_on_a = |reason: &str| {
        get_json(&a.api, &["get", "foreigncluster", b_id])
            .and_then(|fc| {
                fc["status"]["conditions"]
                    .as_array()?
                    .iter()
                    .find(|c| c["type"] == "Tethered")
                    .map(|c| c["reason"] == reason)
            })
            .unwrap_or(false)
    };
    wait(
        "A's ForeignCluster saying Tethered",
        Duration::from_secs(30),
        || said_on_a("Tethered").then_some(()),
    )?;
    println!("  A's ForeignCluster for B says Tethered. A workload pod of B's own (kubectl create");
    println!("  --dry-run=server on cluster B) is refused:");
    let local = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "b-local", "namespace": "default"},
        "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}]}})
    .to_string();
    let try_local = || {
        let o = b.api.kubectl_stdin(
            &["create", "--dry-run=server", "-o", "name", "-f", "-"],
            &local,
        );
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stderr).trim().to_owned(),
        )
    };
    let refusal = wait("B's own pod refused", Duration::from_secs(30), || {
        let (ok, err) = try_local();
        (!ok).then_some(err)
    })?;
    indent(&refusal);
    title("On cluster B: fabricctl mode autonomous");
    show(fabricctl(&b.api, &["mode", "autonomous"]));
    wait(
        "B's own pods welcome again",
        Duration::from_secs(30),
        || try_local().0.then_some(()),
    )?;
    wait(
        "A's ForeignCluster saying Autonomous",
        Duration::from_secs(30),
        || said_on_a("Autonomous").then_some(()),
    )?;
    println!("  B's own pods are welcome again, and A's ForeignCluster says Autonomous.");
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
