//! The out-of-band peering end to end (issue 10), on the network fixture with RBAC and client
//! certificates enforced, every cluster running its sharing layer as a deployment would (see
//! `fabric_tests::peering_stack`): the provider prints `fabricctl generate peer-command`, the
//! consumer runs exactly that command (plus what it asks for), and the peering ends with a
//! tunnel pods talk through and a virtual node with the grant. Then B peers with A the same
//! way (bidirectional: one network, a virtual node on each side), A peers with a third
//! cluster C (two virtual nodes, each with its grant; cutting C's API makes only C's node
//! NotReady, and it heals), and A unpeers C. One fixture (three clusters) for every check.
//!
//! Offloading on the real network (issue 11): a pod bound to A's virtual node for B answers A's
//! pods at the address A shows for it, and keeps answering while A's virtual kubelet for B is
//! SIGKILLed and restarted by its Deployment (the data path does not go through it; nothing is
//! created twice). With C as a second provider (all three clusters on the same pod CIDR), a pod
//! on each virtual node answers. C's API cut off: C's pod goes not Ready at home but keeps
//! running and answering (the tunnel is not cut); healed, it is Ready again, the same ShadowPod
//! and real pod. `fabricctl unpeer` of C with that pod offloaded leaves nothing on either side:
//! the home pod is drained through the provider, C's tenant area goes.
//!
//! Namespace offloading (issue 20): A offloads a namespace to B with `fabricctl`; a pod
//! created there without any placement is placed on the virtual node by A's pod webhook, runs
//! in B's twin namespace under its own name, reads its ConfigMap and Secret (reflected into
//! the twin: only what it references) and answers; A's pods reach it through its Service at
//! home and it reaches the database at home through B's copy of that Service, both by cluster
//! IP (the fixture's service proxy on each node, the EndpointSlices translated on B);
//! unoffloading removes the twin.
use std::{
    collections::BTreeSet,
    process::Output,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use fabric_api::{names, offloading::v1alpha1::VirtualNode};
use fabric_offloading::{shadowpod::forge, virtual_node::objects};
use fabric_tests::{
    apiserver::{ApiServer, require_tools},
    clusters::{Cluster, NAMESPACE, PeeredClusters},
    locate_bin,
    peering_stack::{ADVERTISED_LABEL as ADVERTISED, PeeringStack},
    phase::phase,
    sharing, shop, skip_unless_root, traffic,
    wait::try_eventually_blocking,
    workloads::{self, RunningPod},
};
use serde_json::{Value, json};

struct Bed {
    cl: PeeredClusters,
    stack: PeeringStack,
    /// Clusters whose gateways run (they start once a peering created their key).
    gateways: BTreeSet<u8>,
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn get_json(api: &ApiServer, args: &[&str]) -> Option<Value> {
    api.get_args_json(args)
}

/// The journal of a hand-over of claim `claim` (fabricctl's `movevol::handover::journal_name`).
fn fabricctl_movevol_journal(claim: &str) -> String {
    names::namespace::bounded(&format!("fabric-move-{claim}"))
}

fn fabricctl(api: &ApiServer, args: &[&str]) -> Output {
    std::process::Command::new(locate_bin("fabricctl").unwrap())
        .env("KUBECONFIG", &api.kubeconfig)
        .env_remove("FABRIC_PEERING_TOKEN")
        .args(args)
        .output()
        .unwrap()
}

/// The Ready condition of a Node: (status, reason).
fn node_ready(node: &Value) -> Option<(String, String)> {
    let c = node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")?;
    Some((
        c["status"].as_str()?.to_owned(),
        c["reason"].as_str()?.to_owned(),
    ))
}

/// The Ready condition of a pod: (status, reason; empty when none).
fn pod_ready(pod: &Value) -> Option<(String, String)> {
    let c = pod["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")?;
    Some((
        c["status"].as_str()?.to_owned(),
        c["reason"].as_str().unwrap_or_default().to_owned(),
    ))
}

fn condition_true(obj: &Value, kind: &str) -> bool {
    obj["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == kind && c["status"] == "True")
    })
}

impl Bed {
    fn cluster(&self, i: u8) -> &Cluster {
        match i {
            1 => &self.cl.a,
            2 => &self.cl.b,
            _ => self.cl.c.as_ref().unwrap(),
        }
    }

    fn logs(&self) -> String {
        format!("{}{}", self.cl.log_tails(), self.stack.log_tails())
    }

    /// [`try_eventually_blocking`], failing with the components' logs.
    #[track_caller]
    fn wait<T>(&self, what: &str, timeout: Duration, f: impl FnMut() -> Option<T>) -> T {
        match try_eventually_blocking(what, timeout, f) {
            Ok(v) => v,
            Err(e) => panic!("{e}\n{}", self.logs()),
        }
    }

    /// Consumer `c` runs provider `p`'s peer command (plus `ask`) through fabricctl; the
    /// gateways not running yet start meanwhile. Returns what it printed. A consumer that is
    /// already a provider of `p` gets a command minted for its id (`--consumer-id`): `p`
    /// refuses that id to the standing token.
    fn peer(&mut self, c: u8, p: u8, ask: &[&str]) -> String {
        let c_id = self.cluster(c).id.clone();
        let provider_of_p = get_json(&self.cluster(p).api, &["get", "foreigncluster", &c_id])
            .is_some_and(|fc| fc["spec"]["role"] == "Provider");
        let extra: &[&str] = if provider_of_p {
            &["--consumer-id", &c_id]
        } else {
            &[]
        };
        let words = self
            .stack
            .peer_command(&self.cl, p, extra)
            .unwrap_or_else(|e| panic!("{e:#}"));
        let start: Vec<u8> = [c, p]
            .into_iter()
            .filter(|&i| self.gateways.insert(i))
            .collect();
        PeeringStack::run_peer_command(&mut self.cl, c, &words, ask, &start, |_| {})
            .unwrap_or_else(|e| panic!("{e:#}\n{}", self.logs()))
    }

    /// How cluster `i` sees pod `k` of `peer`: the remapped pod CIDR IPAM granted, host bits
    /// kept (both /16).
    fn remote_pod(&self, i: u8, peer: &str, k: usize) -> String {
        let cfg = self.wait(
            &format!("IPAM's CIDRs for {peer} in cluster {i}"),
            Duration::from_secs(30),
            || {
                get_json(
                    &self.cluster(i).api,
                    &["get", "configuration", peer, "-n", NAMESPACE],
                )
                .filter(|c| c["status"]["remote"]["pod"].is_string())
            },
        );
        let cidr = cfg["status"]["remote"]["pod"].as_str().unwrap();
        let net: Vec<&str> = cidr.split('.').take(2).collect();
        format!("{}.{}.{}.10", net[0], net[1], k + 1)
    }

    /// Pods of `from` reach pod 0 of `to` (ping, then a TCP connection).
    fn pods_talk(&self, from: u8, to: u8, port: u16) {
        let (a, b) = (self.cluster(from), self.cluster(to));
        let dst = self.remote_pod(from, &b.id, 0);
        self.cl
            .wait_reachable(&a.pods[0], &dst, Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("{e:#}\n{}", self.stack.log_tails()));
        traffic::tcp_probe(&a.pods[0], &b.pods[0], &dst, port)
            .unwrap_or_else(|e| panic!("TCP {} -> {}: {e:#}\n{}", a.id, b.id, self.logs()));
    }

    /// An echo pod `name` bound to A's virtual node for `provider` runs there, is Running at
    /// home at an address of the provider's remapped pod CIDR, and A's client pod reaches it
    /// there. Returns the home pod.
    fn offloaded_pod_answers(&self, provider: &str, name: &str) -> RunningPod {
        let a = &self.cl.a;
        let mut pod = workloads::echo_pod(name);
        pod["spec"]["nodeName"] = json!(names::node::virtual_node(provider));
        pod["spec"]["tolerations"] =
            json!([{ "key": names::taint::VIRTUAL_NODE, "operator": "Exists" }]);
        a.create_pod(&pod).unwrap();
        let home = a
            .wait_pod_running("default", name, Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{e:#}\n{}", self.logs()));
        let seen = self.remote_pod(1, provider, 0);
        let prefix: Vec<&str> = seen.split('.').take(2).collect();
        assert!(
            home.ip
                .starts_with(&format!("{}.{}.", prefix[0], prefix[1])),
            "the offloaded pod's IP {} is not in the remapped CIDR ({seen})",
            home.ip
        );
        let answer = self
            .answer(&home.ip)
            .unwrap_or_else(|e| panic!("{e:#}\n{}", self.logs()));
        assert!(!answer.is_empty(), "no answer from the offloaded pod");
        // Its log, read at home with kubectl (the API server -> the virtual kubelet -> the
        // provider's pod), has that very connection.
        let line = format!("connection from {}", answer.trim());
        let logs = self.wait(
            "kubectl logs of the offloaded pod",
            Duration::from_secs(30),
            || {
                let o = a.api.kubectl(&["logs", name, "-n", "default"]);
                let out = String::from_utf8_lossy(&o.stdout).into_owned();
                out.contains(&line).then_some(out)
            },
        );
        assert!(logs.starts_with("listening on"), "{logs}");
        home
    }

    /// A offloads namespace `shop` to B with `fabricctl` as a user would (pods Remote, the
    /// provider chosen by the label B advertises), its database `db` already running at home:
    /// B makes the twin `shop-<A's id>`; a pod `web` created in `shop` with nothing about
    /// placement in it is placed on A's virtual node for B by A's pod webhook and scheduler,
    /// runs in the twin under its own name, reads its ConfigMap and Secret there, answers A's
    /// client at its address in A's view, and its log reads at home. Services across clusters,
    /// by cluster IP: A's client reaches `web` through its Service at home, and `web`, on B,
    /// reaches `db` at home through the copy of db's Service B made in the twin (B's own
    /// cluster IP, endpoints translated into B's view of A). Unoffloading says what goes
    /// first, removes the twin with its pod, Services and slices, and the home pod fails there.
    fn offloaded_namespace(&self, provider: &str) {
        let (a, b) = (&self.cl.a, &self.cl.b);
        assert_eq!(b.id, provider);
        let twin = format!("shop-{}", a.id);
        let o = a.api.kubectl(&["create", "namespace", shop::NAMESPACE]);
        assert!(o.status.success(), "{}", text(&o));
        let apply = |v: Value| {
            let o = a.api.kubectl_stdin(&["apply", "-f", "-"], &v.to_string());
            assert!(o.status.success(), "{}", text(&o));
        };
        // The database, there before the namespace is offloaded: it stays at home.
        a.create_pod(&shop::db()).unwrap();
        apply(shop::service("db"));
        let db = a
            .wait_pod_running(shop::NAMESPACE, "db", Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{e:#}\n{}", self.logs()));
        assert_ne!(
            db.node,
            names::node::virtual_node(provider),
            "db runs at home"
        );

        let selector = format!("{ADVERTISED}={provider}");
        let o = fabricctl(
            &a.api,
            &[
                "offload",
                "namespace",
                shop::NAMESPACE,
                "--pod-offloading-strategy",
                "Remote",
                "--selector",
                &selector,
            ],
        );
        let out = text(&o);
        assert!(o.status.success(), "offload: {out}\n{}", self.logs());
        assert!(out.contains(provider) && out.contains("Ready"), "{out}");
        let ns = get_json(&b.api, &["get", "namespace", &twin]).expect("the twin on B");
        assert_eq!(
            ns["metadata"]["labels"][names::label::REMOTE_CLUSTER],
            a.id.as_str()
        );

        // Its configuration: what the pod references goes to the twin, nothing else.
        apply(shop::config());
        // Beside web, a container calling the home API server as an in-cluster client does.
        a.api.kubectl_ok(&[
            "create",
            "serviceaccount",
            shop::WEB_ACCOUNT,
            "-n",
            shop::NAMESPACE,
        ]);
        let web = shop::web_calling_home();
        // Nothing about placement in the pod: the webhook adds it.
        a.create_pod(&web).unwrap();
        apply(shop::service("web"));
        let stored = get_json(&a.api, &["get", "pod", "web", "-n", shop::NAMESPACE]).unwrap();
        assert_eq!(
            stored["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                ["nodeSelectorTerms"][0]["matchExpressions"]
                .as_array()
                .map(|e| e.iter().any(|r| r["key"] == names::label::NODE_TYPE)),
            Some(true),
            "{stored}"
        );
        let home = a
            .wait_pod_running(shop::NAMESPACE, "web", Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{e:#}\n{}", self.logs()));
        assert_eq!(home.node, names::node::virtual_node(provider));
        let shadow = get_json(&b.api, &["get", "shadowpod", "web", "-n", &twin])
            .expect("the ShadowPod in the twin, under the pod's own name");
        assert_eq!(shadow["spec"]["home"]["namespace"], shop::NAMESPACE);
        let answer = self
            .answer(&home.ip)
            .unwrap_or_else(|e| panic!("{e:#}\n{}", self.logs()));
        let line = format!("connection from {}", answer.trim());
        let logs = self.wait(
            "kubectl logs of the pod in the twin",
            Duration::from_secs(30),
            || {
                let o = a.api.kubectl(&["logs", "web", "-n", shop::NAMESPACE]);
                let out = String::from_utf8_lossy(&o.stdout).into_owned();
                out.contains(&line).then_some(out)
            },
        );
        // It read its ConfigMap and Secret, reflected into the twin; the unused one stayed home.
        assert!(
            logs.contains(&format!("GREETING={}", shop::GREETING))
                && logs.contains(&format!("PASSWORD={}", shop::PASSWORD)),
            "{logs}"
        );
        assert!(get_json(&b.api, &["get", "configmap", "settings", "-n", &twin]).is_some());
        assert!(get_json(&b.api, &["get", "configmap", "unused", "-n", &twin]).is_none());

        // The offloaded pod reaches A's API server as https://kubernetes.default.svc, its
        // certificate verified with A's root CA: the name resolves (host alias) to the cluster
        // IP of the twin's Service, whose endpoint is A's API server in B's view.
        let api_ip = b
            .service_ip(&twin, names::home_api::SERVICE)
            .unwrap_or_else(|e| panic!("{e:#}\n{}", self.logs()));
        let real = get_json(&b.api, &["get", "pod", "web", "-n", &twin]).expect("web on B");
        assert_eq!(
            real["spec"]["hostAliases"][0]["ip"],
            api_ip.as_str(),
            "{real}"
        );
        // As web's own ServiceAccount at home, RBAC enforced: refused, then allowed once a
        // RoleBinding says so.
        let api_logs = || {
            let o = a
                .api
                .kubectl(&["logs", "web", "-c", "api", "-n", shop::NAMESPACE]);
            String::from_utf8_lossy(&o.stdout).into_owned()
        };
        let refused = self.wait(
            "web on B refused by A's API server as shop:web",
            Duration::from_secs(60),
            || {
                let out = api_logs();
                out.contains("status 403").then_some(out)
            },
        );
        assert!(
            refused.contains("system:serviceaccount:shop:web"),
            "{refused}"
        );
        a.api.kubectl_ok(&[
            "create",
            "role",
            "web-reads",
            "--verb=list",
            "--resource=configmaps",
            "-n",
            shop::NAMESPACE,
        ]);
        a.api.kubectl_ok(&[
            "create",
            "rolebinding",
            "web-reads",
            "--role=web-reads",
            "--serviceaccount=shop:web",
            "-n",
            shop::NAMESPACE,
        ]);
        let listed = self.wait(
            "web on B answered by A's API server once allowed",
            Duration::from_secs(60),
            || {
                let out = api_logs();
                out.contains("status 200").then_some(out)
            },
        );
        assert!(listed.contains("ConfigMapList"), "{listed}");

        // A home pod -> a Service whose endpoint is offloaded, by cluster IP.
        let web_ip = a.service_ip(shop::NAMESPACE, "web").unwrap();
        let via_service = self.wait(
            "web's Service at home answering A's client",
            Duration::from_secs(60),
            || self.answer(&web_ip).ok(),
        );
        let host = |a: &str| {
            a.trim()
                .rsplit_once(':')
                .map_or(a.trim(), |(h, _)| h)
                .to_owned()
        };
        assert_eq!(
            host(&via_service),
            host(&answer),
            "through the Service, web sees the same client"
        );
        // The offloaded pod -> a Service at home, by the cluster IP B gave its copy.
        let db_remote_ip = self.wait(
            "db's Service copied into the twin",
            Duration::from_secs(60),
            || b.service_ip(&twin, "db").ok(),
        );
        let web_on_b = b
            .wait_pod_running(&twin, "web", Duration::from_secs(30))
            .unwrap();
        let t0 = Instant::now();
        let seen_by_db = loop {
            match b.connect_from(&web_on_b, &db_remote_ip, workloads::ECHO_PORT) {
                Ok(a) => break a,
                Err(e) if t0.elapsed() > Duration::from_secs(60) => {
                    let get = |api: &ApiServer, what: &str, ns: &str| {
                        text(&api.kubectl(&["get", what, "-n", ns, "-o", "yaml"]))
                    };
                    panic!(
                        "db at home does not answer web on B at {db_remote_ip} (B's copy of its \
                         Service): {e:#}\nOn B: {}\n{}\nOn A: {}\ndirect: {:?}\n{}",
                        get(
                            &b.api,
                            "services,endpointslices,shadowendpointslices",
                            &twin
                        ),
                        get(&b.api, "events", &twin),
                        get(&a.api, "endpointslices", shop::NAMESPACE),
                        db_on_b_direct(b, &web_on_b, &twin),
                        self.logs()
                    )
                }
                Err(_) => std::thread::sleep(Duration::from_millis(500)),
            }
        };
        assert_eq!(
            host(&seen_by_db),
            home.ip,
            "db sees web at the address A shows for it"
        );
        // B's real slice for db came from A's shadow, its address translated into B's view
        // of A; web's own endpoint on B is B's to list, not A's.
        let db_on_b = b.service_endpoints(&twin, "db").unwrap();
        assert_eq!(db_on_b.len(), 1, "{db_on_b:?}");
        assert_ne!(db_on_b[0], db.ip, "translated into B's view of A");
        assert_eq!(
            b.service_endpoints(&twin, "web").unwrap(),
            vec![web_on_b.ip.clone()],
            "web's endpoint on B: B's own"
        );

        let o = fabricctl(&a.api, &["unoffload", "namespace", shop::NAMESPACE]);
        let out = text(&o);
        assert!(o.status.success(), "unoffload: {out}\n{}", self.logs());
        assert!(out.contains(&twin), "says what goes: {out}");
        assert!(
            get_json(
                &a.api,
                &[
                    "get",
                    "namespaceoffloading",
                    "offloading",
                    "-n",
                    shop::NAMESPACE
                ]
            )
            .is_none(),
            "unoffloaded"
        );
        self.wait("the twin gone from B", Duration::from_secs(60), || {
            get_json(&b.api, &["get", "namespace", &twin])
                .is_none()
                .then_some(())
        });
        self.wait("the home pod failed", Duration::from_secs(60), || {
            let p = get_json(&a.api, &["get", "pod", "web", "-n", shop::NAMESPACE])?;
            (p["status"]["phase"] == "Failed").then_some(())
        });
        let o = a
            .api
            .kubectl(&["delete", "namespace", shop::NAMESPACE, "--wait=false"]);
        assert!(o.status.success(), "{}", text(&o));
    }

    /// A's client pod (created on first use).
    fn client(&self) -> RunningPod {
        let a = &self.cl.a;
        if a.get_pod("default", "offload-client").unwrap().is_none() {
            a.create_pod(&workloads::echo_pod("offload-client"))
                .unwrap();
        }
        a.wait_pod_running("default", "offload-client", Duration::from_secs(30))
            .unwrap()
    }

    /// What an echo server at `ip` in A's view answers A's client pod.
    fn answer(&self, ip: &str) -> anyhow::Result<String> {
        self.cl
            .a
            .connect_from(&self.client(), ip, workloads::ECHO_PORT)
    }

    /// On provider `p`: A's ShadowPod for home pod `default/name`, and the real pod it runs.
    fn remote_of(&self, p: u8, name: &str) -> Option<(Value, Value)> {
        let ns = names::namespace::tenant(&self.cl.a.id);
        let shadow_name = forge::name("default", name);
        let api = &self.cluster(p).api;
        Some((
            get_json(api, &["get", "shadowpod", &shadow_name, "-n", &ns])?,
            get_json(api, &["get", "pod", &shadow_name, "-n", &ns])?,
        ))
    }

    /// How many ShadowPods and pods A has in its tenant namespace on provider `p`.
    fn remote_counts(&self, p: u8) -> (usize, usize) {
        let ns = names::namespace::tenant(&self.cl.a.id);
        let api = &self.cluster(p).api;
        let count = |kind: &str| {
            get_json(api, &["get", kind, "-n", &ns])
                .and_then(|l| l["items"].as_array().map(Vec::len))
                .unwrap_or_default()
        };
        (count("shadowpods"), count("pods"))
    }

    /// A's own identity on provider `p` (its kubeconfig, from the identity Secret on A)
    /// writing a ShadowPod straight to `p`'s API server, no virtual kubelet in between, whose
    /// pod would be root on a node of `p`: the provider's webhook, deployed as deploy/ deploys
    /// it, refuses it naming the field, and nothing is made.
    fn provider_refuses_a_root_pod(&self, p: u8) {
        let (a, provider) = (&self.cl.a, self.cluster(p));
        let kubeconfig = self
            .cl
            .logs
            .join(format!("a-on-{}.kubeconfig", provider.id));
        sharing::identity_kubeconfig(&a.api, &provider.id, &kubeconfig).unwrap();
        let ns = names::namespace::tenant(&a.id);
        let o = fabric_tests::process::kubectl_stdin(
            &kubeconfig,
            &["create", "-f", "-"],
            &sharing::root_shadowpod(&a.id, "root").to_string(),
        );
        let err = text(&o);
        assert!(!o.status.success(), "a root ShadowPod admitted: {err}");
        assert!(
            err.contains("admission webhook")
                && err.contains("spec.pod.spec.hostPID: sharing the host's namespaces"),
            "{err}"
        );
        assert!(
            get_json(&provider.api, &["get", "shadowpod", "root", "-n", &ns]).is_none(),
            "nothing made"
        );
    }

    /// `fabricctl move volume` (issue 21) from A to B over the fabric: a claim of the class
    /// `fabric` in namespace `store` is provisioned on A's node, where a pod writes it; the
    /// namespace is then offloaded to B `Remote` (its pods to the virtual nodes only, yet the
    /// transfer's sender runs at home); the pod gone, `fabricctl` (A's admin, as a user runs
    /// it) copies it to B: both digests printed and equal, the claim keeps its name and is
    /// now pinned to A's virtual node for B, where the next pod of the claim lands (gravity)
    /// and reads the same bytes; the source volume at home is gone; a pod writing there then
    /// gone, its replacement lands there too and reads what it wrote. Before that, a move whose
    /// receiver is deleted mid-copy fails saying why, and leaves the claim (same UID, same
    /// volume) and its data where they were, with no transfer pod and no claim left on B.
    fn volume_moves(&self, provider: &str) {
        const NS: &str = "store";
        let (a, b) = (&self.cl.a, &self.cl.b);
        let t = Duration::from_secs(60);
        // The fabric's StorageClass, as deploy/ installs it.
        let class = fabric_tests::manifests::Manifests::rendered(&a.api)
            .unwrap()
            .into_iter()
            .find(|o| o["kind"] == "StorageClass")
            .expect("deploy/ has the fabric's StorageClass");
        a.api
            .kubectl_stdin(&["apply", "-f", "-"], &class.to_string())
            .status
            .success()
            .then_some(())
            .expect("the class applied");
        a.api.kubectl_ok(&["create", "namespace", NS]);
        let twin = format!("{NS}-{}", a.id);
        let claim = |name: &str| {
            json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": name, "namespace": NS},
                "spec": {"storageClassName": "fabric", "accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "64Mi"}}}})
        };
        let pod = |name: &str, claim: &str, command: &[&str]| {
            let mut p = workloads::command_pod(name, command);
            p["metadata"]["namespace"] = json!(NS);
            p["spec"]["containers"][0]["volumeMounts"] =
                json!([{ "name": "data", "mountPath": "/srv" }]);
            p["spec"]["volumes"] =
                json!([{ "name": "data", "persistentVolumeClaim": { "claimName": claim } }]);
            p
        };
        let done = |name: &str| {
            a.wait_pod(NS, name, t, "Succeeded", |p| {
                p["status"]["phase"] == "Succeeded"
            })
            .unwrap_or_else(|e| panic!("{e:#}\n{}", self.logs()))
        };
        // A claim written on A's node: its volume, and where the data is on the host.
        let written = |name: &str, text: &str| -> (Value, std::path::PathBuf) {
            a.create(&claim(name)).unwrap();
            let writer = format!("{name}-writer");
            a.create_pod(&workloads::on_node(
                pod(
                    &writer,
                    name,
                    &["fabric-test-pod", "write", "/srv/greeting", text],
                ),
                0,
            ))
            .unwrap();
            done(&writer);
            a.api
                .kubectl_ok(&["delete", "pod", &writer, "-n", NS, "--wait=true"]);
            let pvc = get_json(&a.api, &["get", "persistentvolumeclaim", name, "-n", NS]).unwrap();
            let volume = pvc["spec"]["volumeName"].as_str().unwrap().to_owned();
            let dir = a.api.kubectl_ok(&[
                "get",
                "persistentvolume",
                &volume,
                "-o",
                "jsonpath={.spec.hostPath.path}",
            ]);
            let dir = std::path::PathBuf::from(dir);
            assert_eq!(
                std::fs::read_to_string(dir.join("greeting")).unwrap(),
                text,
                "written at home"
            );
            (pvc, dir)
        };

        // Both claims written at home before the namespace is offloaded `Remote` (its pods to
        // the virtual nodes only): the data of a namespace that ran here, to follow it there.
        // The transfer pods are placed by fabricctl whatever the strategy (the sender at home,
        // beside the data).
        let (before, dir) = written("kept", "stays home");
        let text_home = "written at home, read on B";
        let (before_data, dir_data) = written("data", text_home);
        let selector = format!("{ADVERTISED}={provider}");
        let o = fabricctl(
            &a.api,
            &[
                "offload",
                "namespace",
                NS,
                "--pod-offloading-strategy",
                "Remote",
                "--selector",
                &selector,
            ],
        );
        assert!(o.status.success(), "offload: {}\n{}", text(&o), self.logs());

        // A failed move: the receiver deleted mid-copy (a file big enough to take a while).
        // Some bytes to check, and 2 GiB of a sparse file (nothing on the disk here; the sender
        // reads it as zeros) so that the copy takes seconds.
        let some: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.join("some"), &some).unwrap();
        std::fs::File::create(dir.join("sparse"))
            .unwrap()
            .set_len(2 << 30)
            .unwrap();
        let mut child = fabric_tests::die_with_parent(&mut std::process::Command::new(
            locate_bin("fabricctl").unwrap(),
        ))
        .env("KUBECONFIG", &a.api.kubeconfig)
        .args(["move", "volume", &format!("{NS}/kept"), "--to", provider])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut seen = String::new();
        loop {
            let mut line = String::new();
            let n = std::io::BufRead::read_line(&mut out, &mut line).unwrap();
            seen.push_str(&line);
            if n == 0 || line.starts_with("sent ") {
                break;
            }
        }
        if !seen.contains("sent ") {
            let o = child.wait_with_output().unwrap();
            panic!(
                "no progress before the end: {seen}{}\n{}",
                text(&o),
                self.logs()
            );
        }
        a.api.kubectl_ok(&[
            "delete",
            "pod",
            "move-kept-receive",
            "-n",
            NS,
            "--wait=false",
        ]);
        std::io::Read::read_to_string(&mut out, &mut seen).unwrap();
        let o = child.wait_with_output().unwrap();
        let rest = format!("{seen}{}", text(&o));
        eprintln!("the failed move said:\n{rest}");
        assert!(!o.status.success(), "{rest}");
        assert!(
            rest.contains("failed: nothing was changed, the data stays here"),
            "{rest}"
        );
        let after = get_json(&a.api, &["get", "persistentvolumeclaim", "kept", "-n", NS]).unwrap();
        assert_eq!(after["metadata"]["uid"], before["metadata"]["uid"]);
        assert_eq!(after["spec"]["volumeName"], before["spec"]["volumeName"]);
        assert_eq!(
            std::fs::read(dir.join("some")).unwrap(),
            some,
            "the source kept"
        );
        assert_eq!(
            std::fs::metadata(dir.join("sparse")).unwrap().len(),
            2 << 30
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("greeting")).unwrap(),
            "stays home"
        );
        let left = a.api.kubectl_ok(&["get", "pods", "-n", NS, "-o", "name"]);
        assert!(!left.contains("move-kept"), "transfer pods left: {left}");
        assert!(
            get_json(
                &b.api,
                &["get", "persistentvolumeclaim", "kept", "-n", &twin]
            )
            .is_none(),
            "no claim left in the twin"
        );

        // A move killed mid-copy, run again and killed mid-hand-over, run a third time: each
        // run takes up what the one before left (the copy's claim in the twin and transfer
        // pods undone, the hand-over finished from its journal), and the data arrives whole.
        let move_err = std::env::temp_dir().join(format!("fabric-move-{}.err", std::process::id()));
        let spawn_move = || {
            let mut child = fabric_tests::die_with_parent(&mut std::process::Command::new(
                locate_bin("fabricctl").unwrap(),
            ))
            .env("KUBECONFIG", &a.api.kubeconfig)
            .args(["move", "volume", &format!("{NS}/kept"), "--to", provider])
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(&move_err).unwrap())
            .spawn()
            .unwrap();
            let out = std::io::BufReader::new(child.stdout.take().unwrap());
            (child, out)
        };
        let read_until = |out: &mut std::io::BufReader<std::process::ChildStdout>,
                          seen: &mut String,
                          what: &str| {
            loop {
                let mut line = String::new();
                let n = std::io::BufRead::read_line(out, &mut line).unwrap();
                seen.push_str(&line);
                if line.starts_with(what) {
                    return;
                }
                assert!(
                    n > 0,
                    "the move ended before {what:?}: {seen}{}\n{}",
                    std::fs::read_to_string(&move_err).unwrap_or_default(),
                    self.logs()
                );
            }
        };
        let (mut child, mut out) = spawn_move();
        let mut seen = String::new();
        read_until(&mut out, &mut seen, "sent ");
        child.kill().unwrap();
        child.wait().unwrap();
        // Its sender streams on without it: the big file cut short ends that (the sender
        // fails on it) rather than gigabytes through the tunnel until the next run.
        std::fs::File::options()
            .write(true)
            .open(dir.join("sparse"))
            .unwrap()
            .set_len(0)
            .unwrap();
        eprintln!("the move killed mid-copy said:\n{seen}");
        assert!(
            get_json(
                &b.api,
                &["get", "persistentvolumeclaim", "kept", "-n", &twin]
            )
            .is_some(),
            "the killed copy's claim in the twin"
        );
        // The next copy short; the home claim held by a finalizer (as pvc-protection holds
        // a claim a pod still mounts), so that the hand-over waits for it with its journal
        // written: killed there.
        std::fs::remove_file(dir.join("sparse")).unwrap();
        let finalizers = |f: Value| {
            a.api.kubectl_ok(&[
                "patch",
                "persistentvolumeclaim",
                "kept",
                "-n",
                NS,
                "--type=merge",
                "-p",
                &json!({"metadata": {"finalizers": f}}).to_string(),
            ]);
        };
        finalizers(json!(["example.com/hold"]));
        let (mut child, mut out) = spawn_move();
        let mut seen = String::new();
        read_until(&mut out, &mut seen, "checksums match");
        let journal = fabricctl_movevol_journal("kept");
        self.wait(
            "the source claim being deleted, its journal written",
            t,
            || {
                let c = get_json(&a.api, &["get", "persistentvolumeclaim", "kept", "-n", NS])?;
                (c["metadata"]["deletionTimestamp"].is_string()
                    && a.api
                        .kubectl(&["get", "configmap", &journal, "-n", NS])
                        .status
                        .success())
                .then_some(())
            },
        );
        child.kill().unwrap();
        child.wait().unwrap();
        finalizers(Value::Null);
        eprintln!("the move killed mid-hand-over said:\n{seen}");
        assert!(
            seen.contains("are left from an earlier move: removing them")
                && seen.contains("did not finish its copy: removing it and its transfer pods"),
            "{seen}"
        );
        let _ = std::fs::remove_file(&move_err);
        let o = fabricctl(
            &a.api,
            &["move", "volume", &format!("{NS}/kept"), "--to", provider],
        );
        let rest = text(&o);
        eprintln!("the move run a third time said:\n{rest}");
        assert!(o.status.success(), "{rest}\n{}", self.logs());
        assert!(
            rest.contains("did not finish handing it over; finishing it"),
            "{rest}"
        );
        assert!(
            !a.api
                .kubectl(&["get", "configmap", &journal, "-n", NS])
                .status
                .success(),
            "the journal left"
        );
        let left = a.api.kubectl_ok(&["get", "pods", "-n", NS, "-o", "name"]);
        assert!(!left.contains("move-kept"), "transfer pods left: {left}");
        // Handed over: the claim made again is the one the filled claim on B is marked for
        // (its data checked by the second run's digests), pinned to the virtual node.
        let kept = get_json(&a.api, &["get", "persistentvolumeclaim", "kept", "-n", NS]).unwrap();
        let filled = get_json(
            &b.api,
            &["get", "persistentvolumeclaim", "kept", "-n", &twin],
        )
        .unwrap();
        assert_eq!(
            filled["metadata"]["annotations"][names::storage::HOME_UID],
            kept["metadata"]["uid"],
            "{filled}"
        );
        let kept_pv = get_json(
            &a.api,
            &[
                "get",
                "persistentvolume",
                kept["spec"]["volumeName"].as_str().unwrap(),
            ],
        )
        .unwrap();
        assert_eq!(
            kept_pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"]
                [0]["values"][0],
            names::node::virtual_node(provider).as_str(),
            "{kept_pv}"
        );

        // The move: digests equal, the claim pinned to the virtual node, the data there.
        let (before, dir) = (before_data, dir_data);
        let o = fabricctl(
            &a.api,
            &["move", "volume", &format!("{NS}/data"), "--to", provider],
        );
        let out = text(&o);
        eprintln!("the move said:\n{out}");
        assert!(o.status.success(), "move: {out}\n{}", self.logs());
        let digest = |verb: &str| {
            out.lines()
                .find(|l| l.starts_with(verb) && l.contains(" sha256 "))
                .and_then(|l| l.split(" sha256 ").nth(1))
                .unwrap_or_else(|| panic!("no {verb} digest in {out}"))
                .to_owned()
        };
        assert_eq!(digest("sent "), digest("received "), "{out}");
        assert!(out.contains("checksums match"), "{out}");
        let moved = get_json(&a.api, &["get", "persistentvolumeclaim", "data", "-n", NS]).unwrap();
        assert_ne!(moved["metadata"]["uid"], before["metadata"]["uid"]);
        let pv = get_json(
            &a.api,
            &[
                "get",
                "persistentvolume",
                moved["spec"]["volumeName"].as_str().unwrap(),
            ],
        )
        .unwrap();
        let vnode = names::node::virtual_node(provider);
        assert_eq!(
            pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"]
                [0],
            vnode.as_str(),
            "{pv}"
        );
        assert!(!dir.join("greeting").exists(), "the source removed at home");
        // Gravity: the next pod of the claim lands on the virtual node and reads the data.
        a.create_pod(&pod(
            "reader",
            "data",
            &["fabric-test-pod", "read", "/srv/greeting"],
        ))
        .unwrap();
        let p = done("reader");
        assert_eq!(p["spec"]["nodeName"], vnode.as_str());
        let read = self.wait("the reader's log through the virtual kubelet", t, || {
            let o = a.api.kubectl(&["logs", "reader", "-n", NS]);
            o.status
                .success()
                .then(|| String::from_utf8_lossy(&o.stdout).trim().to_owned())
                .filter(|l| !l.is_empty())
        });
        assert_eq!(read, text_home);
        // Written on the provider, read by a replacement: a pod of the claim writes there (a
        // StatefulSet's pod), goes, and the next one lands on the same virtual node (gravity)
        // and reads what it wrote.
        let text_there = "written on the provider";
        a.create_pod(&pod(
            "writer-there",
            "data",
            &["fabric-test-pod", "write", "/srv/greeting", text_there],
        ))
        .unwrap();
        let p = done("writer-there");
        assert_eq!(p["spec"]["nodeName"], vnode.as_str());
        a.api.kubectl_ok(&[
            "delete",
            "pod",
            "writer-there",
            "reader",
            "-n",
            NS,
            "--wait=true",
        ]);
        a.create_pod(&pod(
            "replacement",
            "data",
            &["fabric-test-pod", "read", "/srv/greeting"],
        ))
        .unwrap();
        let p = done("replacement");
        assert_eq!(p["spec"]["nodeName"], vnode.as_str(), "gravity");
        let read = self.wait(
            "the replacement's log through the virtual kubelet",
            t,
            || {
                let o = a.api.kubectl(&["logs", "replacement", "-n", NS]);
                o.status
                    .success()
                    .then(|| String::from_utf8_lossy(&o.stdout).trim().to_owned())
                    .filter(|l| !l.is_empty())
            },
        );
        assert_eq!(read, text_there);

        // Home again (`--to local`): the sender on the provider listens, the receiver here
        // fills a landing claim on A's node, digests equal; the claim keeps its name, now
        // over a volume on A's node kept off virtual nodes, holding what was written on B;
        // nothing of the move left, and the claim on B gone with the old one.
        a.api
            .kubectl_ok(&["delete", "pod", "replacement", "-n", NS, "--wait=true"]);
        let before = get_json(&a.api, &["get", "persistentvolumeclaim", "data", "-n", NS]).unwrap();
        let o = fabricctl(
            &a.api,
            &["move", "volume", &format!("{NS}/data"), "--to", "local"],
        );
        let out = text(&o);
        eprintln!("the move home said:\n{out}");
        assert!(o.status.success(), "move home: {out}\n{}", self.logs());
        assert!(
            out.contains("sender move-data-send running on provider"),
            "{out}"
        );
        assert!(out.contains("checksums match"), "{out}");
        let home = get_json(&a.api, &["get", "persistentvolumeclaim", "data", "-n", NS]).unwrap();
        assert_ne!(home["metadata"]["uid"], before["metadata"]["uid"]);
        let pv = get_json(
            &a.api,
            &[
                "get",
                "persistentvolume",
                home["spec"]["volumeName"].as_str().unwrap(),
            ],
        )
        .unwrap();
        let terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"].to_string();
        assert!(
            terms.contains("NotIn") && !terms.contains(vnode.as_str()),
            "{pv}"
        );
        let dir = std::path::PathBuf::from(pv["spec"]["hostPath"]["path"].as_str().unwrap());
        assert_eq!(
            std::fs::read_to_string(dir.join("greeting")).unwrap(),
            text_there,
            "what was written on B, home"
        );
        assert!(
            get_json(
                &a.api,
                &["get", "persistentvolumeclaim", "data-landing", "-n", NS]
            )
            .is_none(),
            "the landing claim left"
        );
        assert!(
            !a.api
                .kubectl(&[
                    "get",
                    "configmap",
                    &fabricctl_movevol_journal("data"),
                    "-n",
                    NS
                ])
                .status
                .success(),
            "the journal left"
        );
        let left = a.api.kubectl_ok(&["get", "pods", "-n", NS, "-o", "name"]);
        assert!(!left.contains("move-data"), "transfer pods left: {left}");
        self.wait("the claim on B gone with the old one", t, || {
            get_json(
                &b.api,
                &["get", "persistentvolumeclaim", "data", "-n", &twin],
            )
            .is_none()
            .then_some(())
        });
    }

    /// The virtual node of `provider` on cluster `c`, once it is Ready.
    fn ready_node(&self, c: u8, provider: &str) -> Value {
        self.wait(
            &format!("virtual node {provider} Ready on cluster {c}"),
            Duration::from_secs(60),
            || {
                let node = names::node::virtual_node(provider);
                let n = get_json(&self.cluster(c).api, &["get", "node", &node])?;
                (node_ready(&n)? == ("True".into(), "VirtualKubeletReady".into())).then_some(n)
            },
        )
    }

    /// The virtual node of `provider` on cluster `c` is what the provider granted: capacity
    /// and allocatable, the fabric's labels, the advertised one, the taint.
    fn check_virtual_node(&self, c: u8, provider: &str) -> Value {
        let api = &self.cluster(c).api;
        let node = self.ready_node(c, provider);
        let slice = get_json(api, &["get", "resourceslice", provider, "-n", NAMESPACE]).unwrap();
        let granted = slice["status"]["granted"].as_object().cloned().unwrap();
        assert!(!granted.is_empty(), "{slice}");
        // Storage granted is the VirtualNode's `spec.storage`, not the Node's: no pod asks for it.
        for (res, q) in granted
            .iter()
            .filter(|(r, _)| fabric_api::offloading::lent::class_of(r).is_none())
        {
            assert_eq!(
                &node["status"]["capacity"][res], q,
                "capacity {res}: {node}"
            );
            assert_eq!(&node["status"]["allocatable"][res], q, "allocatable {res}");
        }
        let labels = &node["metadata"]["labels"];
        assert_eq!(
            labels[names::label::NODE_TYPE],
            names::label::VIRTUAL_NODE_TYPE
        );
        assert_eq!(labels[names::label::REMOTE_CLUSTER], provider);
        assert_eq!(labels[ADVERTISED], provider, "the advertised label");
        assert_eq!(slice["status"]["nodeLabels"][ADVERTISED], provider);
        let taints = node["spec"]["taints"].as_array().unwrap();
        assert!(
            taints
                .iter()
                .any(|t| t["key"] == names::taint::VIRTUAL_NODE && t["effect"] == "NoExecute"),
            "{taints:?}"
        );
        node
    }

    /// When the Lease of `provider`'s virtual node on cluster `c` was last renewed.
    fn lease_renew_time(&self, c: u8, provider: &str) -> Option<String> {
        let node = names::node::virtual_node(provider);
        get_json(
            &self.cluster(c).api,
            &["get", "lease", &node, "-n", "kube-node-lease"],
        )?["spec"]["renewTime"]
            .as_str()
            .map(str::to_owned)
    }
}

#[test]
fn out_of_band_peering_end_to_end() {
    const T: &str = "out_of_band_peering_end_to_end";
    if skip_unless_root(T) || !require_tools(T) {
        return;
    }
    // The runtime lives as long as the test, as it did before the phases.
    let (_rt, mut bed, t0, a_id, b_id, c_id) = phase(
        "the bed: three clusters, each with its sharing layer",
        || {
            let t0 = Instant::now();
            let rt = tokio::runtime::Runtime::new().unwrap();
            let cl = PeeredClusters::for_sharing(1, true).unwrap();
            let stack = rt
                .block_on(PeeringStack::start(&cl))
                .unwrap_or_else(|e| panic!("{e:#}\n{}", cl.log_tails()));
            let bed = Bed {
                cl,
                stack,
                gateways: BTreeSet::new(),
            };
            eprintln!("fixture up after {:?}", t0.elapsed());
            let (a_id, b_id) = (bed.cl.a.id.clone(), bed.cl.b.id.clone());
            let c_id = bed.cl.c.as_ref().unwrap().id.clone();
            (rt, bed, t0, a_id, b_id, c_id)
        },
    );
    // A's virtual nodes for B and C.
    let (vnode_b, vnode_c) = (
        names::node::virtual_node(&b_id),
        names::node::virtual_node(&c_id),
    );

    phase("A peers with B", || {
        // B's admin lends storage of its class `standard` (deploy/ ships the ConfigMap
        // lending nothing): A asks for some, for the volume it moves there below.
        bed.cl
            .b
            .lend_storage("standard=1Gi")
            .unwrap_or_else(|e| panic!("{e:#}"));
        // A (consumer) peers with B (provider) with the command B printed.
        let out = bed.peer(
            1,
            2,
            &[
                "--cpu",
                "1",
                "--memory",
                "2Gi",
                "--pods",
                "20",
                "--resource",
                "storage.fabric.io/standard=512Mi",
            ],
        );
        for step in [
            "✓ authenticated",
            "✓ asked cluster-b for resources",
            "✓ network: tunnel up",
            "✓ resources:",
            "✓ virtual node:",
            "Peered with cluster-b",
        ] {
            assert!(out.contains(step), "{step:?} missing in:\n{out}");
        }
        eprintln!("A peered with B after {:?}", t0.elapsed());
    });

    let renewed = phase("pods talk; A's virtual node for B", || {
        // The tunnel is up and pods talk.
        bed.pods_talk(1, 2, 7101);

        // A's virtual node for B: the grant, the labels, the taint; its Lease renews.
        let node = bed.check_virtual_node(1, &b_id);
        assert_eq!(node["status"]["capacity"]["cpu"], "1", "what A asked for");
        bed.lease_renew_time(1, &b_id)
            .expect("the virtual node's Lease")
    });

    let web_b = phase("a pod offloaded to B answers", || {
        // A pod bound to A's virtual node runs on B and answers A's pods at the address A shows
        // for it (B's pod IP through the CIDR A's IPAM granted for B).
        let web_b = bed.offloaded_pod_answers(&b_id, "offloaded");
        eprintln!("pod offloaded to B after {:?}", t0.elapsed());
        web_b
    });

    phase("B's webhook refuses what A may not run there", || {
        bed.provider_refuses_a_root_pod(2);
    });

    phase("A offloads a namespace to B", || {
        bed.offloaded_namespace(&b_id);
        eprintln!("namespace offloaded and back after {:?}", t0.elapsed());
    });

    phase("a volume moves from A to B", || {
        bed.volume_moves(&b_id);
        eprintln!("volume moved after {:?}", t0.elapsed());
    });

    phase("A's virtual kubelet killed mid-traffic", || {
        // A's virtual kubelet for B SIGKILLed mid-traffic: the pod answers throughout, the
        // virtual kubelet comes back and resynchronises, nothing is created twice.
        bed.vk_killed_mid_traffic(2, &web_b);
        eprintln!("virtual kubelet killed and back after {:?}", t0.elapsed());
    });

    phase(
        "credentials as deploy/ gives them; fabricctl info peer; B knows A",
        || {
            // All of it with the users, groups and capabilities deploy/ gives each container (the
            // fixtures start them so): the manifests work as written, the sharing layer's too.
            bed.cl.check_credentials().unwrap();
            bed.stack.check_credentials().unwrap();

            // `fabricctl info peer` on A: every module up.
            let o = fabricctl(&bed.cl.a.api, &["info", "peer", &b_id, "-o", "json"]);
            assert!(o.status.success(), "{}", text(&o));
            let info: Value = serde_json::from_slice(&o.stdout).unwrap();
            for module in ["authentication", "network", "resources", "virtual_node"] {
                assert_eq!(info[module]["status"], "True", "{module}: {info:#}");
            }
            assert_eq!(info["network_detail"]["tunnel"], "Connected", "{info:#}");
            assert_eq!(
                info["virtual_node_detail"]["node"],
                names::node::virtual_node(&b_id),
                "{info:#}"
            );

            // B knows A as an authenticated consumer.
            let fc = get_json(&bed.cl.b.api, &["get", "foreigncluster", &a_id]).unwrap();
            assert_eq!(fc["spec"]["role"], "Consumer", "{fc}");
            assert!(condition_true(&fc, "Authenticated"), "{fc}");
        },
    );

    phase("B peers with A too", || {
        // Bidirectional: B peers with A the same way (a token from A) while A -> B stays up.
        let out = bed.peer(2, 1, &["--cpu", "500m", "--memory", "1Gi", "--pods", "10"]);
        for step in [
            "✓ authenticated",
            "✓ network:",
            "✓ resources:",
            "✓ virtual node:",
        ] {
            assert!(out.contains(step), "{step:?} missing in:\n{out}");
        }
        eprintln!("B peered with A after {:?}", t0.elapsed());
        let node = bed.check_virtual_node(2, &a_id);
        assert_eq!(
            node["status"]["capacity"]["cpu"], "500m",
            "what B asked for"
        );
        bed.ready_node(1, &b_id);
        // One network peering between the two: A dials, B listens, one Configuration each;
        // the only PeeringNetwork is A's (on B).
        bed.one_network(1, 2);
        for (i, peer) in [(1, &b_id), (2, &a_id)] {
            let fc = get_json(&bed.cluster(i).api, &["get", "foreigncluster", peer]).unwrap();
            assert_eq!(fc["spec"]["role"], "ConsumerAndProvider", "{fc}");
        }
        bed.pods_talk(1, 2, 7102);
        bed.pods_talk(2, 1, 7103);
        bed.wait("the node Lease renewed", Duration::from_secs(30), || {
            bed.lease_renew_time(1, &b_id).filter(|r| *r != renewed)
        });
    });

    phase("A peers with C", || {
        // Three clusters: A peers with C too, and asks for something else.
        let out = bed.peer(1, 3, &["--cpu", "2", "--memory", "3Gi", "--pods", "30"]);
        assert!(out.contains("✓ virtual node:"), "{out}");
        eprintln!("A peered with C after {:?}", t0.elapsed());
        let node_c = bed.check_virtual_node(1, &c_id);
        assert_eq!(node_c["status"]["capacity"]["cpu"], "2");
        let node_b = bed.check_virtual_node(1, &b_id);
        assert_eq!(node_b["status"]["capacity"]["cpu"], "1");
        bed.pods_talk(1, 3, 7104);
    });

    let (web_c, shadow_c, real_c) = phase("a pod on each provider answers", || {
        // Two providers: a pod on each of A's virtual nodes answers A's pods at the address A
        // shows for it, the three clusters using the same pod CIDR.
        let web_c = bed.offloaded_pod_answers(&c_id, "offloaded-c");
        bed.answer(&web_b.ip)
            .unwrap_or_else(|e| panic!("B's pod with C's: {e:#}\n{}", bed.logs()));
        assert_ne!(
            web_b.ip, web_c.ip,
            "each provider has its own remapped CIDR in A"
        );
        let client = bed.client();
        let net = |ip: &str| ip.split('.').take(2).collect::<Vec<_>>().join(".");
        for (p, name) in [(2, "offloaded"), (3, "offloaded-c")] {
            let (_, real) = bed.remote_of(p, name).expect("the real pod");
            let ip = real["status"]["podIP"].as_str().unwrap_or_default();
            assert_eq!(
                net(ip),
                net(&client.ip),
                "cluster {p}'s pods use A's pod CIDR: {real}"
            );
        }
        let (shadow_c, real_c) = bed.remote_of(3, "offloaded-c").unwrap();
        eprintln!("a pod on each provider answers after {:?}", t0.elapsed());
        (web_c, shadow_c, real_c)
    });

    phase("C's API cut and healed", || {
        // C's API cannot be reached from outside its network (what peers use is cut; its own
        // components go on): only C's node goes NotReady, with the reason, and it heals.
        let c_api_ns = bed.cl.c.as_ref().unwrap().api_ns.clone();
        let cut = "table inet fabric_test_cut {\n chain input { type filter hook input priority 0; \
                   iifname \"lo\" tcp dport 6443 drop; }\n}\n";
        nft(&bed, &c_api_ns, cut);
        bed.wait("C's node NotReady", Duration::from_secs(60), || {
            let n = get_json(&bed.cl.a.api, &["get", "node", &vnode_c])?;
            (node_ready(&n)? == ("False".into(), "ProviderUnreachable".into())).then_some(())
        });
        let b_ready = node_ready(&get_json(&bed.cl.a.api, &["get", "node", &vnode_b]).unwrap());
        assert_eq!(
            b_ready,
            Some(("True".into(), "VirtualKubeletReady".into())),
            "B's node is not affected"
        );
        // C's pod: not Ready at home (Services stop sending it traffic), yet still running on C
        // and answering (the tunnel is not cut); B's pod is not affected.
        let home_c = bed.wait("C's pod not Ready at home", Duration::from_secs(60), || {
            let p = bed.cl.a.get_pod("default", "offloaded-c").ok()??;
            (pod_ready(&p)? == ("False".into(), "ProviderUnreachable".into())).then_some(p)
        });
        assert_eq!(home_c["status"]["phase"], "Running", "{home_c}");
        bed.answer(&web_c.ip)
            .unwrap_or_else(|e| panic!("C's pod while C's API is cut: {e:#}\n{}", bed.logs()));
        let home_b = bed.cl.a.get_pod("default", "offloaded").unwrap().unwrap();
        assert_eq!(
            pod_ready(&home_b).map(|r| r.0),
            Some("True".into()),
            "{home_b}"
        );
        nft(&bed, &c_api_ns, "delete table inet fabric_test_cut\n");
        bed.ready_node(1, &c_id);
        // Healed: Ready again, the same ShadowPod and real pod, nothing duplicated.
        bed.wait(
            "C's pod Ready again at home",
            Duration::from_secs(60),
            || {
                let p = bed.cl.a.get_pod("default", "offloaded-c").ok()??;
                (pod_ready(&p)?.0 == "True").then_some(())
            },
        );
        let (shadow, real) = bed.remote_of(3, "offloaded-c").unwrap();
        assert_eq!(shadow["metadata"]["uid"], shadow_c["metadata"]["uid"]);
        assert_eq!(real["metadata"]["uid"], real_c["metadata"]["uid"]);
        assert_eq!(
            shadow["status"]["recreations"].as_u64().unwrap_or_default(),
            0
        );
        assert_eq!(bed.remote_counts(3), (1, 1), "{}", bed.logs());
        eprintln!("C's node healed after {:?}", t0.elapsed());
    });

    phase("A unpeers C; A and B stay peered", || {
        // A unpeers C with `fabricctl unpeer`, a pod still offloaded there: the pod is drained
        // (deleted through C), and nothing is left of the peering on either side; the network of
        // A and C goes; A and B stay peered.
        let real_c_uid = real_c["metadata"]["uid"].as_str().unwrap().to_owned();
        assert!(Cluster::pod_netns(&real_c_uid).is_some(), "C's pod runs");
        let c_kubeconfig = bed.cluster(3).api.kubeconfig.display().to_string();
        let o = fabricctl(
            &bed.cl.a.api,
            &[
                "unpeer",
                &c_id,
                "--remote-kubeconfig",
                &c_kubeconfig,
                "--timeout-secs",
                "90",
            ],
        );
        assert!(o.status.success(), "{}\n{}", text(&o), bed.logs());
        eprintln!("A unpeered C after {:?}", t0.elapsed());
        let tenant_ns = names::namespace::tenant(&a_id);
        bed.wait("nothing of A and C left", Duration::from_secs(60), || {
            let gone = |i: u8, args: &[&str]| get_json(&bed.cluster(i).api, args).is_none();
            let none_left = |i: u8, kind: &str| {
                get_json(&bed.cluster(i).api, &["get", kind, "-A"]).is_some_and(|l| {
                    !l["items"].as_array().unwrap().iter().any(|o| {
                        o["metadata"]["namespace"] == tenant_ns.as_str()
                            || o["spec"]["nodeName"] == vnode_c.as_str()
                            || o["metadata"]["name"] == c_id.as_str()
                    })
                })
            };
            // On A: no node, no home pod bound to it, no VirtualNode, slice, identity,
            // ForeignCluster, network objects.
            (gone(1, &["get", "node", &vnode_c])
                && gone(1, &["get", "pod", "offloaded-c", "-n", "default"])
                && none_left(1, "pods")
                && gone(1, &["get", "virtualnode", &c_id, "-n", NAMESPACE])
                && gone(1, &["get", "resourceslice", &c_id, "-n", NAMESPACE])
                && gone(1, &["get", "identity", &c_id, "-n", NAMESPACE])
                && gone(1, &["get", "foreigncluster", &c_id])
                && gone(1, &["get", "configuration", &c_id, "-n", NAMESPACE])
                && gone(1, &["get", "gatewayclient", &c_id, "-n", NAMESPACE])
                // On C: no tenant namespace, ShadowPod or pod of A's, no ForeignCluster for A,
                // no network objects.
                && gone(3, &["get", "namespace", &tenant_ns])
                && none_left(3, "shadowpods")
                && none_left(3, "pods")
                && gone(3, &["get", "foreigncluster", &a_id])
                && gone(3, &["get", "configuration", &a_id, "-n", NAMESPACE])
                && gone(3, &["get", "gatewayserver", &a_id, "-n", NAMESPACE]))
            .then_some(())
        });
        assert!(
            Cluster::pod_netns(&real_c_uid).is_none(),
            "C's pod stopped with the unpeer"
        );
        bed.answer(&web_b.ip)
            .unwrap_or_else(|e| panic!("B's pod after the unpeer of C: {e:#}\n{}", bed.logs()));
        bed.one_network(1, 2);
        bed.ready_node(1, &b_id);
        bed.ready_node(2, &a_id);
        bed.pods_talk(1, 2, 7105);
        eprintln!("done after {:?}", t0.elapsed());
    });
}

#[track_caller]
fn nft(bed: &Bed, ns: &str, script: &str) {
    use std::io::Write;
    let mut c = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let o = c.wait_with_output().unwrap();
    assert!(o.status.success(), "nft: {}\n{}", text(&o), bed.logs());
}

impl Bed {
    /// A's virtual kubelet for provider `p` SIGKILLed while A's client pod talks to `pod`,
    /// offloaded there: every connection is answered (the data path does not go through the
    /// virtual kubelet), its Deployment restarts it, it resynchronises (a label put on the
    /// pod afterwards reaches the real pod), and nothing is created again on the provider.
    fn vk_killed_mid_traffic(&self, p: u8, pod: &RunningPod) {
        let a = &self.cl.a;
        let provider = self.cluster(p).id.clone();
        let (shadow, real) = self.remote_of(p, &pod.name).expect("the real pod");
        let counts = self.remote_counts(p);
        let vn: VirtualNode = serde_json::from_value(
            get_json(&a.api, &["get", "virtualnode", &provider, "-n", NAMESPACE]).unwrap(),
        )
        .unwrap();
        let vk = objects::name(&vn);
        let deployments = &self.stack.member(&a.id).deployments;
        let restarts = deployments.restarts(NAMESPACE, &vk);
        let netns = Cluster::pod_netns(&self.client().uid).unwrap();
        let bin = locate_bin("fabric-test-pod").unwrap();
        let dst = format!("{}:{}", pod.ip, workloads::ECHO_PORT);
        let stop = AtomicBool::new(false);
        let (answered, failed) = std::thread::scope(|s| {
            let traffic = s.spawn(|| {
                let (mut answered, mut failed) = (0u32, Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    let o = std::process::Command::new("ip")
                        .args(["netns", "exec", &netns])
                        .arg(&bin)
                        .args(["connect", &dst])
                        .output()
                        .unwrap();
                    if o.status.success() {
                        answered += 1;
                    } else {
                        failed.push(text(&o));
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                (answered, failed)
            });
            std::thread::sleep(Duration::from_millis(500));
            deployments
                .kill(NAMESPACE, &vk)
                .unwrap_or_else(|e| panic!("{e:#}\n{}", self.logs()));
            self.wait(
                "the virtual kubelet restarted",
                Duration::from_secs(30),
                || {
                    (deployments.restarts(NAMESPACE, &vk) > restarts
                        && deployments.pid(NAMESPACE, &vk).is_some())
                    .then_some(())
                },
            );
            a.api.kubectl_ok(&[
                "label",
                "pod",
                &pod.name,
                "-n",
                &pod.namespace,
                "after-restart=yes",
            ]);
            self.wait(
                "the label on the real pod (the restarted virtual kubelet at work)",
                Duration::from_secs(60),
                || {
                    let (_, real) = self.remote_of(p, &pod.name)?;
                    (real["metadata"]["labels"]["after-restart"] == "yes").then_some(())
                },
            );
            stop.store(true, Ordering::Relaxed);
            traffic.join().unwrap()
        });
        assert!(
            failed.is_empty() && answered >= 3,
            "{answered} answered, failed: {failed:?}"
        );
        let (shadow_now, real_now) = self.remote_of(p, &pod.name).unwrap();
        assert_eq!(shadow_now["metadata"]["uid"], shadow["metadata"]["uid"]);
        assert_eq!(real_now["metadata"]["uid"], real["metadata"]["uid"]);
        assert_eq!(
            shadow_now["status"]["recreations"]
                .as_u64()
                .unwrap_or_default(),
            0
        );
        assert_eq!(self.remote_counts(p), counts, "{}", self.logs());
        let home = a.get_pod(&pod.namespace, &pod.name).unwrap().unwrap();
        assert_eq!(home["metadata"]["uid"], pod.uid.as_str());
        assert_eq!(pod_ready(&home).map(|r| r.0), Some("True".into()), "{home}");
    }

    /// Consumer `c` and provider `p`, peered both ways, share one network peering: `c`
    /// dials (GatewayClient), `p` listens (GatewayServer), one Configuration for the other on
    /// each side, and the only PeeringNetwork is `c`'s, on `p`.
    #[track_caller]
    fn one_network(&self, c: u8, p: u8) {
        let (cc, pc) = (self.cluster(c), self.cluster(p));
        let names_of = |i: u8, kind: &str, ns: &str| -> Vec<String> {
            let list = get_json(&self.cluster(i).api, &["get", kind, "-n", ns]).unwrap();
            list["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| o["metadata"]["name"].as_str().unwrap().to_owned())
                .collect()
        };
        let on = |i: u8, kind: &str| names_of(i, kind, NAMESPACE);
        assert!(on(c, "configuration").contains(&pc.id), "{}", self.logs());
        assert!(on(p, "configuration").contains(&cc.id));
        assert!(on(c, "gatewayclient").contains(&pc.id));
        assert!(!on(c, "gatewayserver").contains(&pc.id), "{}", self.logs());
        assert!(on(p, "gatewayserver").contains(&cc.id));
        assert!(!on(p, "gatewayclient").contains(&cc.id), "{}", self.logs());
        let pn_on =
            |i: u8, peer: &str| names_of(i, "peeringnetwork", &names::namespace::tenant(peer));
        assert_eq!(pn_on(p, &cc.id), std::slice::from_ref(&cc.id));
        assert!(pn_on(c, &pc.id).is_empty(), "{}", self.logs());
    }
}

/// What each of db's endpoints on B answers `web` there, bypassing the Service (for a
/// failure's message).
fn db_on_b_direct(
    b: &fabric_tests::clusters::Cluster,
    web: &RunningPod,
    twin: &str,
) -> Vec<(String, String)> {
    b.service_endpoints(twin, "db")
        .unwrap_or_default()
        .into_iter()
        .map(|ip| {
            let r = b.connect_from(web, &ip, workloads::ECHO_PORT);
            (ip, format!("{r:?}"))
        })
        .collect()
}
