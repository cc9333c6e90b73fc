//! Building the clusters: the networks in namespaces, the API servers, and every component
//! of each cluster started as a process with the credentials deploy/ gives its container.
use super::*;

impl PeeredClusters {
    pub(super) fn build_with(
        nodes: usize,
        replicas_a: usize,
        replicas_b: usize,
        overlay: bool,
        lb: bool,
        third: bool,
    ) -> Result<Self> {
        anyhow::ensure!(
            (1..=9).contains(&replicas_a) && (1..=9).contains(&replicas_b),
            "1 to 9 gateway replicas (one digit in names and addresses)"
        );
        let mut tb = Testbed::new()?;
        let logs = std::env::temp_dir().join(format!("{}-clusters", tb.id()));
        std::fs::create_dir_all(&logs)?;
        // The underlay: one bridge every gateway replica of both clusters is plugged into, as
        // the nodes' network between two sites would be.
        let ul = tb.add_netns("ul")?;
        tb.ip(&ul, &["link", "add", "br0", "type", "bridge"])?;
        tb.ip(&ul, &["link", "set", "br0", "up"])?;
        let mut which: Vec<(u8, &str, usize)> =
            vec![(1, "cluster-a", replicas_a), (2, "cluster-b", replicas_b)];
        if third {
            which.push((3, "cluster-c", 1));
        }
        let sites = which
            .iter()
            .map(|&(i, id, _)| Self::site(&mut tb, i, id, &logs))
            .collect::<Result<Vec<_>>>()?;
        // Each API server takes seconds to start and to take the CRDs: all at once.
        let tb_id = tb.id().to_owned();
        let apis = std::thread::scope(|s| {
            let started: Vec<_> = sites
                .iter()
                .zip(&which)
                .map(|(site, &(_, id, _))| s.spawn(|| Self::control_plane(site, id, &tb_id)))
                .collect();
            started
                .into_iter()
                .map(|h| h.join().expect("an API server's start panicked"))
                .collect::<Result<Vec<_>>>()
        })?;
        let mut built = Vec::new();
        for ((site, api), &(i, id, replicas)) in sites.into_iter().zip(apis).zip(&which) {
            built.push(Self::build_cluster(
                &mut tb, &ul, i, id, nodes, replicas, overlay, &logs, site, api,
            )?);
        }
        let mut built = built.into_iter();
        let (a, b) = (built.next().unwrap(), built.next().unwrap());
        let c = built.next();
        let lb = if lb {
            Some(LoadBalancer::start(&mut tb, &ul, &b)?)
        } else {
            None
        };
        let containers = Containers::from_manifests(&a.api)?;
        let mut me = Self {
            lb,
            a,
            b,
            c,
            procs: Vec::new(),
            containers,
            logs,
            tb,
        };
        for which in me.indices() {
            let (kc, nodes, i, replicas) = {
                let c = me.cluster(which);
                (
                    c.api.in_cluster_kubeconfig.display().to_string(),
                    c.nodes.clone(),
                    c.index,
                    c.replicas.clone(),
                )
            };
            // The stand-ins for the scheduler, the EndpointSlice controller, the kubelets and
            // kube-proxy are the cluster's, not the fabric's: they hold the admin's
            // credentials. Each fabric component holds a token of its own ServiceAccount, with
            // the rights deploy/ gives it, and nothing else.
            let env = vec![("KUBECONFIG".to_owned(), kc)];
            crate::rights::install(&me.cluster(which).api)?;
            let own = |me: &Self, c: &Container| -> Result<Vec<(String, String)>> {
                let api = &me.cluster(which).api;
                let out = me
                    .logs
                    .join(format!("{}-{i}.kubeconfig", c.service_account));
                crate::rights::token_kubeconfig(
                    &api.kubeconfig,
                    &api.in_cluster_kubeconfig,
                    NAMESPACE,
                    &c.service_account,
                    &out,
                )?;
                Ok(vec![("KUBECONFIG".to_owned(), out.display().to_string())])
            };
            // The controller Deployment's pod: any namespace on the cluster network will do.
            let ipam = me.containers.ipam.clone();
            me.spawn_as(
                &format!("ipam{i}"),
                &replicas[0].ns,
                &ipam,
                vec![
                    bin("fabric-controller")?,
                    "ipam".into(),
                    "--pod-cidr".into(),
                    POD_CIDR.into(),
                    "--service-cidr".into(),
                    SERVICE_CIDR.into(),
                    "--external-cidr".into(),
                    EXTERNAL_CIDR.into(),
                    "--pools".into(),
                    POOL.into(),
                ],
                own(&me, &ipam)?,
            )?;
            me.spawn(
                &format!("scheduler{i}"),
                vec![
                    "ip".into(),
                    "netns".into(),
                    "exec".into(),
                    replicas[0].ns.clone(),
                    bin("fabric-test-scheduler")?,
                ],
                env.clone(),
            )?;
            // No controller manager either: the stand-in for its EndpointSlice controller and
            // root CA publisher (the API server's serving certificate, self-signed, is the
            // root pods verify it with).
            let mut endpoints_env = env.clone();
            if let Some(certs) = me.cluster(which).api.certs_dir() {
                endpoints_env.push((
                    "FABRIC_TEST_ROOT_CA".to_owned(),
                    certs.join("apiserver.crt").display().to_string(),
                ));
            }
            me.spawn(
                &format!("endpoints{i}"),
                vec![
                    "ip".into(),
                    "netns".into(),
                    "exec".into(),
                    replicas[0].ns.clone(),
                    bin("fabric-test-endpoints")?,
                ],
                endpoints_env,
            )?;
            // Nor a PV controller or provisioner: the stand-in makes the default class
            // `standard`, binds claims and gives their PVs a directory of the test's scratch
            // space.
            let volumes = me.logs.join(format!("volumes{i}"));
            me.spawn(
                &format!("storage{i}"),
                vec![
                    "ip".into(),
                    "netns".into(),
                    "exec".into(),
                    replicas[0].ns.clone(),
                    bin("fabric-test-storage")?,
                    "--root".into(),
                    volumes.display().to_string(),
                    "--default-class".into(),
                ],
                env.clone(),
            )?;
            for (k, node) in nodes.iter().enumerate() {
                let root = me.logs.join(format!("testnode{i}-{k}"));
                me.spawn(
                    &format!("testnode{i}-{k}"),
                    vec![
                        bin("fabric-test-node")?,
                        "--netns".into(),
                        node.clone(),
                        "--node-name".into(),
                        Cluster::node_name(k),
                        "--node-ip".into(),
                        Cluster::node_ip(i, k),
                        "--pod-cidr".into(),
                        Cluster::node_pod_cidr(k),
                        "--reserve".into(),
                        Cluster::pod_ip(k),
                        "--root-dir".into(),
                        root.display().to_string(),
                        // Restarts within a test's patience (the kubelet starts at 10 s).
                        "--restart-backoff".into(),
                        "200ms".into(),
                        "--lease-duration".into(),
                        "10s".into(),
                        // No kube-proxy: the test node is the node's service proxy.
                        "--service-proxy".into(),
                    ],
                    env.clone(),
                )?;
            }
            let behind_lb = me.lb.is_some() && which == 2;
            for (r, rep) in replicas.iter().enumerate() {
                let dir = rep.dir.display().to_string();
                let pins = me.tb.pin_dir(&rep.ns, &format!("gw{i}r{r}"));
                // The operator's overlay guard, pinned on the host's BPF filesystem (which
                // `Container::enter` keeps: `ip netns exec` mounts a private one that dies
                // with the process).
                let guard_pins = me.tb.pin_dir(&rep.ns, &format!("guard{i}r{r}"));
                let advertise = if behind_lb {
                    format!("{LB_VIP}:51820")
                } else {
                    format!("{}:51820", rep.underlay_ip)
                };
                let operator = me.containers.operator.clone();
                let mut env = own(&me, &operator)?;
                if behind_lb {
                    // The replica's pod, which its operator labels active or standby for the
                    // Service's selector.
                    let pod = serde_json::json!({
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": { "name": rep.identity, "namespace": "fabric-system",
                                      "labels": { "app.kubernetes.io/name": "fabric-gateway" } },
                        // The fixture runs the replica itself: not for the test scheduler.
                        "spec": { "schedulerName": FIXTURE_SCHEDULER,
                                  "containers": [{ "name": "gateway", "image": "fabric-gateway" }] },
                    });
                    let f = rep.dir.join("pod.json");
                    std::fs::write(&f, pod.to_string())?;
                    me.cluster(which)
                        .api
                        .kubectl_ok(&["create", "-f", &f.display().to_string()]);
                    env.push(("POD_NAME".into(), rep.identity.clone()));
                }
                me.spawn_as(
                    &rep.operator,
                    &rep.ns,
                    &operator,
                    vec![
                        bin("fabric-controller")?,
                        "gateway".into(),
                        "--name".into(),
                        Self::gateway_name(i, r),
                        "--interval".into(),
                        "300ms".into(),
                        "--advertise".into(),
                        advertise,
                        "--config".into(),
                        format!("{dir}/gateway.toml"),
                        "--key-file".into(),
                        format!("{dir}/private.key"),
                        "--control-dir".into(),
                        dir.clone(),
                        "--pin-dir".into(),
                        pins.display().to_string(),
                        "--identity".into(),
                        rep.identity.clone(),
                        "--gateway-ip".into(),
                        rep.ip.clone(),
                        "--guard-pin-dir".into(),
                        guard_pins.display().to_string(),
                    ]
                    .into_iter()
                    .chain(overlay.then(|| "--overlay".to_owned()))
                    .collect(),
                    env.clone(),
                )?;
            }
            // One replica: a fixed next hop, as before replicas existed; more: follow the Lease.
            let next_hop: Vec<String> = if replicas.len() == 1 {
                vec!["--gateway".into(), replicas[0].ip.clone()]
            } else {
                vec![
                    "--gateway-from-lease".into(),
                    format!("{NAMESPACE}/{GATEWAY_LEASE}"),
                ]
            };
            for (k, node) in nodes.iter().enumerate() {
                // In the node's namespace the agent's routes land there without --route-netns.
                // The fixture enters the namespace for it before dropping to the manifest's
                // credentials (setns takes CAP_SYS_ADMIN, which the agent's container lacks),
                // keeping the host's BPF filesystem, where its overlay guard stays pinned
                // across restarts (as the DaemonSet's bpffs hostPath does).
                let guard_pins = me.tb.pin_dir(node, &format!("guard{i}n{k}"));
                let mut argv = vec![
                    bin("fabric-agent")?,
                    "run".into(),
                    "--guard-pin-dir".into(),
                    guard_pins.display().to_string(),
                ];
                argv.extend(next_hop.iter().cloned());
                argv.extend(["--interval".into(), "500ms".into()]);
                if overlay {
                    argv.extend([
                        "--overlay".into(),
                        "--node-ip".into(),
                        Cluster::node_ip(i, k),
                    ]);
                }
                let agent = me.containers.agent.clone();
                let env = own(&me, &agent)?;
                me.spawn_as(&format!("agent{i}-{k}"), node, &agent, argv, env)?;
            }
        }
        Ok(me)
    }

    /// Names of replica `r`'s things: the first replica keeps the names from before replicas
    /// existed (`gw1`, `operator1`, `gateway1`, ...), later ones get `r<N>` appended.
    fn suffix(r: usize) -> String {
        if r == 0 {
            String::new()
        } else {
            format!("r{r}")
        }
    }

    fn gateway_name(i: u8, r: usize) -> String {
        format!("gw{i}{}", Self::suffix(r))
    }

    /// The cluster's network namespaces for its API server and its webhook, before anything
    /// runs in them.
    fn site(tb: &mut Testbed, i: u8, id: &str, logs: &Path) -> Result<Site> {
        // The cluster network: a bridge of its own, so that gateway replicas come and go on it
        // like pods on a node network.
        let lan = tb.add_netns(&format!("lan{i}"))?;
        tb.ip(&lan, &["link", "add", "br0", "type", "bridge"])?;
        tb.ip(&lan, &["link", "set", "br0", "up"])?;
        let api_ns = tb.add_netns(&format!("api{i}"))?;
        let api_ip = format!("10.0.{i}.100");
        tb.veth(&api_ns, "lan", &lan, "api")?;
        tb.ip(&lan, &["link", "set", "api", "master", "br0"])?;
        tb.ip(
            &api_ns,
            &["addr", "add", &format!("{api_ip}/24"), "dev", "lan"],
        )?;
        // The API server presents a client certificate to the ShadowPod webhook, as a
        // provider's admin configures kube-apiserver for deploy/'s webhook. Its serving
        // certificate names what a cluster's does: its address and the `kubernetes`
        // Service's names, by which pods (offloaded ones too) reach it.
        let caller = crate::webhook::Caller::new(&logs.join(id).join("webhook-caller"))?;
        let hook_ns = tb.add_netns(&format!("hook{i}"))?;
        let hook_ip = format!("10.0.{i}.50");
        tb.veth(&hook_ns, "lan", &lan, "hook")?;
        tb.ip(&lan, &["link", "set", "hook", "master", "br0"])?;
        tb.ip(
            &hook_ns,
            &["addr", "add", &format!("{hook_ip}/24"), "dev", "lan"],
        )?;
        Ok(Site {
            lan,
            api_ns,
            api_ip,
            hook_ns,
            hook_ip,
            caller,
        })
    }

    /// Its API server with the fabric's CRDs, namespace and identity: the slow part of a
    /// cluster, started for every cluster at once.
    fn control_plane(site: &Site, id: &str, tb_id: &str) -> Result<ApiServer> {
        let Site {
            api_ns,
            api_ip,
            caller,
            ..
        } = site;
        let sans: Vec<&str> = std::iter::once(api_ip.as_str())
            .chain(names::home_api::NAMES)
            .collect();
        let api = ApiServer::start_in_netns_with_args(
            &format!("{id}-{tb_id}"),
            api_ns,
            api_ip,
            true,
            &format!("{} --tls-sans={}", caller.kubelite_args(), sans.join(",")),
        )?;
        // (Waited for below, after the other objects.)
        api.start_installing_crds();
        api.create_namespaces(&[NAMESPACE, fabric_api::names::namespace::IDENTITIES]);
        api.create_config_map(
            NAMESPACE,
            names::config_map::CLUSTER,
            &[
                (cluster_key::CLUSTER_ID, id),
                (cluster_key::POD_CIDR, POD_CIDR),
                (cluster_key::SERVICE_CIDR, SERVICE_CIDR),
                (cluster_key::EXTERNAL_CIDR, EXTERNAL_CIDR),
            ],
        );
        api.wait_crds_established();
        // deploy/'s rights (its components' tokens need them): the longest apply of all.
        crate::rights::install(&api)?;
        Ok(api)
    }

    #[allow(clippy::too_many_arguments)]
    fn build_cluster(
        tb: &mut Testbed,
        ul: &str,
        i: u8,
        id: &str,
        nodes: usize,
        replicas: usize,
        overlay: bool,
        logs: &Path,
        site: Site,
        api: ApiServer,
    ) -> Result<Cluster> {
        let Site {
            lan,
            api_ns,
            hook_ns,
            hook_ip,
            caller,
            ..
        } = site;
        let dir = logs.join(id);
        std::fs::create_dir_all(&dir)?;
        if overlay {
            // The gateways' own subnet, on a second bridge, and the router between the two.
            tb.ip(&lan, &["link", "add", "br1", "type", "bridge"])?;
            tb.ip(&lan, &["link", "set", "br1", "up"])?;
            let rt = tb.add_netns(&format!("rt{i}"))?;
            for (leg, br, addr) in [
                ("nodes", "br0", format!("10.0.{i}.254/24")),
                ("gws", "br1", format!("10.1.{i}.254/24")),
            ] {
                let port = format!("rt{leg}");
                tb.veth(&rt, leg, &lan, &port)?;
                tb.ip(&lan, &["link", "set", &port, "master", br])?;
                tb.ip(&rt, &["addr", "add", &addr, "dev", leg])?;
            }
            tb.sysctl(&rt, "net.ipv4.ip_forward", "1")?;
            tb.ip(
                &api_ns,
                &[
                    "route",
                    "add",
                    &format!("10.1.{i}.0/24"),
                    "via",
                    &format!("10.0.{i}.254"),
                ],
            )?;
        }
        let mut reps = Vec::new();
        for r in 0..replicas {
            let sfx = Self::suffix(r);
            let gw = tb.add_netns(&format!("gw{i}{sfx}"))?;
            let subnet = if overlay { 1 } else { 0 };
            let ip = format!("10.{subnet}.{i}.{}", 1 + r);
            let underlay_ip = format!("192.168.77.{}", usize::from(i) + 10 * r);
            let port = format!("g{r}");
            tb.veth(&gw, "lan", &lan, &port)?;
            tb.ip(
                &lan,
                &[
                    "link",
                    "set",
                    &port,
                    "master",
                    if overlay { "br1" } else { "br0" },
                ],
            )?;
            tb.ip(&gw, &["addr", "add", &format!("{ip}/24"), "dev", "lan"])?;
            if overlay {
                // The API server and the nodes are behind the router.
                tb.ip(
                    &gw,
                    &[
                        "route",
                        "add",
                        &format!("10.0.{i}.0/24"),
                        "via",
                        &format!("10.1.{i}.254"),
                    ],
                )?;
            }
            let port = format!("c{i}g{r}");
            tb.veth(&gw, "ul", ul, &port)?;
            tb.ip(ul, &["link", "set", &port, "master", "br0"])?;
            tb.ip(
                &gw,
                &["addr", "add", &format!("{underlay_ip}/24"), "dev", "ul"],
            )?;
            tb.sysctl(&gw, "net.ipv4.ip_forward", "1")?;
            tb.sysctl(&gw, "net.ipv4.conf.all.rp_filter", "0")?;
            let rdir = if r == 0 { dir.clone() } else { dir.join(&sfx) };
            std::fs::create_dir_all(&rdir)?;
            // What the kubelet makes an emptyDir: writable by any user of the pod.
            std::fs::set_permissions(&rdir, std::os::unix::fs::PermissionsExt::from_mode(0o777))?;
            reps.push(Replica {
                ns: gw,
                identity: format!("gateway{i}{sfx}"),
                operator: format!("operator{i}{sfx}"),
                ip,
                underlay_ip,
                dir: rdir,
            });
        }
        if !overlay {
            // Peers' pods reach the API server through the gateway (exposed with an `IP`:
            // offloaded pods calling their home API server), under addresses of the pool the
            // peers' CIDRs are remapped into; its answers go back the same way.
            tb.ip(&api_ns, &["route", "add", POOL, "via", &reps[0].ip])?;
        }
        let (mut node_ns, mut pod_ns) = (Vec::new(), Vec::new());
        for k in 0..nodes {
            let node = tb.add_netns(&format!("n{i}{k}"))?;
            let pod = tb.add_netns(&format!("p{i}{k}"))?;
            let port = format!("n{k}");
            tb.veth(&lan, &port, &node, "lan")?;
            tb.ip(&lan, &["link", "set", &port, "master", "br0"])?;
            let node_ip = Cluster::node_ip(i, k);
            tb.ip(
                &node,
                &["addr", "add", &format!("{node_ip}/24"), "dev", "lan"],
            )?;
            tb.veth(&node, "pod", &pod, "eth0")?;
            tb.ip(
                &node,
                &[
                    "addr",
                    "add",
                    &format!("10.244.{}.1/24", k + 1),
                    "dev",
                    "pod",
                ],
            )?;
            tb.ip(
                &pod,
                &[
                    "addr",
                    "add",
                    &format!("{}/24", Cluster::pod_ip(k)),
                    "dev",
                    "eth0",
                ],
            )?;
            tb.ip(
                &pod,
                &[
                    "route",
                    "add",
                    "default",
                    "via",
                    &format!("10.244.{}.1", k + 1),
                ],
            )?;
            if overlay {
                // The node network's router: the gateways' subnet is reachable through it.
                tb.ip(
                    &node,
                    &[
                        "route",
                        "add",
                        &format!("10.1.{i}.0/24"),
                        "via",
                        &format!("10.0.{i}.254"),
                    ],
                )?;
                // The Node object as the kubelet and node IPAM leave it. The second node has
                // no pod CIDR (as with CNIs that allocate otherwise): its pod is known from
                // its Pod object instead.
                let cidr = format!("10.244.{}.0/24", k + 1);
                let spec = if k == 1 {
                    serde_json::json!({})
                } else {
                    serde_json::json!({ "podCIDR": cidr, "podCIDRs": [cidr] })
                };
                let node_obj = serde_json::json!({
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": { "name": format!("node{k}") },
                    "spec": spec,
                });
                let f = dir.join(format!("node{k}.json"));
                std::fs::write(&f, node_obj.to_string())?;
                api.kubectl_ok(&["create", "-f", &f.display().to_string()]);
                let status = serde_json::json!({ "status": { "addresses": [
                    { "type": "InternalIP", "address": node_ip },
                    { "type": "Hostname", "address": format!("node{k}") },
                ] } });
                api.kubectl_ok(&[
                    "patch",
                    "node",
                    &format!("node{k}"),
                    "--subresource=status",
                    "--type=merge",
                    "-p",
                    &status.to_string(),
                ]);
                let pod_obj = serde_json::json!({
                    "apiVersion": "v1",
                    "kind": "Pod",
                    // The fixture wires this pod up itself: a mirror pod, which the node's
                    // test node leaves alone.
                    "metadata": { "name": format!("pod{k}"), "namespace": "default",
                                  "annotations": { crate::testnode::MIRROR_ANNOTATION: "fixture" } },
                    "spec": { "nodeName": format!("node{k}"),
                              "containers": [{ "name": "app", "image": "app" }] },
                });
                let f = dir.join(format!("pod{k}.json"));
                std::fs::write(&f, pod_obj.to_string())?;
                api.kubectl_ok(&["create", "-f", &f.display().to_string()]);
                let status = serde_json::json!({ "status": {
                    "phase": "Running",
                    "hostIP": node_ip,
                    "podIP": Cluster::pod_ip(k),
                    "podIPs": [{ "ip": Cluster::pod_ip(k) }],
                } });
                api.kubectl_ok(&[
                    "patch",
                    "pod",
                    &format!("pod{k}"),
                    "-n",
                    "default",
                    "--subresource=status",
                    "--type=merge",
                    "-p",
                    &status.to_string(),
                ]);
            }
            // What the CNI would do on a flat network: every node's pod subnet is reachable
            // through that node, from every gateway replica (the overlay does it otherwise).
            for rep in reps.iter().filter(|_| !overlay) {
                tb.ip(
                    &rep.ns,
                    &[
                        "route",
                        "add",
                        &format!("10.244.{}.0/24", k + 1),
                        "via",
                        &node_ip,
                    ],
                )?;
            }
            tb.sysctl(&node, "net.ipv4.ip_forward", "1")?;
            tb.sysctl(&node, "net.ipv4.conf.all.rp_filter", "0")?;
            // The fixed pod sees the whole /24 on its link; the test node's pods in that range
            // hang off veths of their own, so the node answers ARP for them.
            tb.sysctl(&node, "net.ipv4.conf.pod.proxy_arp", "1")?;
            node_ns.push(node);
            pod_ns.push(pod);
        }
        // What the CNI does between nodes: each node's pod range through that node.
        for (k, ns) in node_ns.iter().enumerate() {
            for j in (0..nodes).filter(|&j| j != k) {
                tb.ip(
                    ns,
                    &[
                        "route",
                        "add",
                        &format!("10.244.{}.0/24", j + 1),
                        "via",
                        &Cluster::node_ip(i, j),
                    ],
                )?;
            }
        }
        Ok(Cluster {
            index: i,
            id: id.to_owned(),
            api,
            api_ns,
            gw: reps[0].ns.clone(),
            replicas: reps,
            lan,
            nodes: node_ns,
            pods: pod_ns,
            dir,
            webhook: WebhookSite {
                ns: hook_ns,
                ip: hook_ip,
                caller,
            },
        })
    }
}
