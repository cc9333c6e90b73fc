//! `kubectl logs`, `exec`, `attach` and `port-forward` on pods offloaded through the virtual
//! node, with `kubectl` itself against the consumer's API server, which proxies them to the
//! virtual kubelet's kubelet API, which carries them to the real pods on the provider with the
//! consumer's identity. Both API servers enforce RBAC: the consumer's identity has only the
//! tenant Role on the provider. The provider is a fixture cluster (test scheduler and test
//! node run the real pods); the consumer needs no node of its own.
//!
//! The virtual kubelet's pod loop offloads the pods (ShadowPods named `<namespace>.<name>`)
//! and the provider's ShadowPod controller (`fabric-controller sharing`) runs them.
use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::TcpStream,
    path::Path,
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use fabric_api::names;
use fabric_offloading::shadowpod::forge;
use fabric_tests::{
    ChildGuard,
    apiserver::{ApiServer, require_tools},
    clusters::PeeredClusters,
    die_with_parent,
    offload_fixture::{self as fixture, CONSUMER, NODE, NS, PROVIDER},
    process::Bin,
    sharing, skip_unless_root,
    wait::eventually_blocking,
};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(40);
/// The port the `srv` pod's server listens on.
const SRV_PORT: u16 = 9090;

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[track_caller]
fn apply(api: &ApiServer, obj: &Value) {
    fixture::apply(api, obj).unwrap();
}

/// A home pod bound to the virtual node (as the consumer's scheduler would bind it).
fn home_pod(name: &str, command: &[&str], restart: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "namespace": "default" },
        "spec": {
            "nodeName": NODE,
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 1,
            "tolerations": [{ "key": names::taint::VIRTUAL_NODE, "operator": "Exists" }],
            "containers": [{ "name": "app", "image": "busybox", "command": command }],
        },
    })
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A client of the virtual kubelet's API: its certificate and key (PEM files).
type Client<'a> = Option<(&'a Path, &'a Path)>;

/// A request straight to the virtual kubelet's API (as the API server makes them) with
/// `client`'s certificate (None: without one): (HTTP status, or 0 if the TLS handshake
/// failed; body).
fn curl(client: Client<'_>, port: u16, method: &str, path: &str) -> (u16, String) {
    let cert = client.map(|(cert, key)| {
        [
            "--cert".into(),
            cert.as_os_str().to_owned(),
            "--key".into(),
            key.as_os_str().to_owned(),
        ]
    });
    curl_with(cert.iter().flatten(), port, method, path)
}

/// As [`curl`], without a certificate but with a bearer token.
fn curl_bearer(token: &str, port: u16, method: &str, path: &str) -> (u16, String) {
    let header = std::ffi::OsString::from(format!("Authorization: Bearer {token}"));
    curl_with(&["-H".into(), header], port, method, path)
}

fn curl_with<'a>(
    args: impl IntoIterator<Item = &'a std::ffi::OsString>,
    port: u16,
    method: &str,
    path: &str,
) -> (u16, String) {
    let mut c = Command::new("curl");
    c.args([
        "-sk",
        "--max-time",
        "10",
        "-w",
        "\n%{http_code}",
        "-X",
        method,
    ]);
    let o = c
        .args(args)
        .arg(format!("https://127.0.0.1:{port}{path}"))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let (body, code) = out.rsplit_once('\n').unwrap_or(("", &out));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

/// Two GETs of `path` in one curl run (which keeps a connection alive when the server lets
/// it), as `extra` (a certificate or a header) says: each one's status and whether it needed a
/// new connection.
fn twice_on_one_connection(extra: &[&std::ffi::OsStr], port: u16, path: &str) -> Vec<(u16, u32)> {
    let url = format!("https://127.0.0.1:{port}{path}");
    let o = Command::new("curl")
        .args([
            "-sk",
            "--max-time",
            "10",
            "-o",
            "/dev/null",
            "-o",
            "/dev/null",
            "-w",
        ])
        .arg("%{http_code} %{num_connects}\n")
        .args(extra)
        .args([&url, &url])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let (code, connects) = l.split_once(' ')?;
            Some((code.parse().ok()?, connects.parse().ok()?))
        })
        .collect()
}

#[test]
fn logs_exec_attach_and_port_forward_on_offloaded_pods() {
    let tag = "offloaded_streams";
    if skip_unless_root(tag) || !require_tools(tag) {
        return;
    }
    let t0 = Instant::now();
    let cl = PeeredClusters::for_sharing(1, false).unwrap();
    let provider = &cl.b.api;
    // The consumer: tunnel up and the provider's pod CIDR remapped, as the gateway operator
    // and the network layer report them.
    let consumer = fixture::start_consumer("vkstreams-c", false).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = fixture::scratch_dir(tag).unwrap();
    // The provider's ShadowPod controller, with its ServiceAccount's rights from deploy/.
    let sharing_kubeconfig = fabric_tests::rights::component_kubeconfig(
        provider,
        "fabric-sharing",
        dir.join("sharing.kubeconfig"),
    )
    .unwrap();
    let _sharing = Bin::new("fabric-controller")
        .unwrap()
        .arg("sharing")
        .kubeconfig(&sharing_kubeconfig)
        .pod_name("controller-0")
        .log(dir.join("provider-controller.log"))
        .spawn()
        .unwrap();
    rt.block_on(async {
        let creds = fixture::admit_consumer(provider).await.unwrap();
        let c = consumer.client().await;
        sharing::keep_identity(&c, NS, PROVIDER, &creds)
            .await
            .unwrap();
    });
    apply(&consumer, &fixture::virtual_node(json!({})));

    // The virtual kubelet, serving its kubelet API on the Node's address and port to the
    // consumer API server's kubelet client certificate only.
    let certs = consumer.certs_dir().unwrap();
    let port = free_port();
    let log_path = dir.join("virtual-kubelet.log");
    let ca = certs.join("ca.crt");
    let api_server = Some((
        certs.join("kubelet-client.crt"),
        certs.join("kubelet-client.key"),
    ));
    let api_server: Client<'_> = api_server.as_ref().map(|(c, k)| (c.as_path(), k.as_path()));
    let _vk = Bin::new("fabric-virtual-kubelet")
        .unwrap()
        .args([
            "--virtual-node",
            PROVIDER,
            "--namespace",
            NS,
            "--node-ip",
            "127.0.0.1",
            "--kubelet-port",
            &port.to_string(),
            "--client-ca-file",
            ca.to_str().unwrap(),
            // Denials are asked again soon: a grant below takes effect within the test.
            "--authorization-webhook-cache-unauthorized-ttl",
            "1s",
        ])
        .kubeconfig(&consumer.kubeconfig)
        .pod_name("controller-0")
        .log(&log_path)
        .spawn()
        .unwrap();
    let vk_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    eventually_blocking("the virtual node registered", T, || {
        consumer
            .kubectl(&["get", "node", NODE])
            .status
            .success()
            .then_some(())
    });

    // Home pods bound to the virtual node, running on the provider.
    // Answers each line with "got:" and the line.
    let py_server = format!(
        "import socket\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
         s.bind(('0.0.0.0',{SRV_PORT}))\ns.listen(8)\nprint('listening',flush=True)\n\
         while True:\n c,_=s.accept()\n f=c.makefile('rwb')\n for l in f:\n  \
         f.write(b'got:'+l)\n  f.flush()\n f.close()\n c.close()\n"
    );
    for (name, command, restart) in [
        ("srv", vec!["python3", "-c", py_server.as_str()], "Always"),
        (
            "ticker",
            vec![
                "sh",
                "-c",
                "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.5; done",
            ],
            "Always",
        ),
        (
            "crasher",
            vec![
                "sh",
                "-c",
                "echo run started; sleep 1; echo run ends; exit 1",
            ],
            "Always",
        ),
    ] {
        apply(&consumer, &home_pod(name, &command, restart));
    }
    let tenant = names::namespace::tenant(CONSUMER);
    let real = |name: &str| forge::name("default", name);
    for name in ["srv", "ticker"] {
        cl.b.wait_pod_running(&tenant, &real(name), T).unwrap();
    }
    // A pod the provider's policy refuses (host network) is never offloaded: not found, and
    // the virtual kubelet says why (the API server keeps a kubelet's 404 body out of what
    // kubectl prints, as upstream).
    let mut hostnet = home_pod("hostnet", &["sleep", "1000"], "Always");
    hostnet["spec"]["hostNetwork"] = json!(true);
    apply(&consumer, &hostnet);
    let (_, err) = text(&consumer.kubectl(&["logs", "hostnet"]));
    assert!(err.contains("NotFound"), "{err}");
    let (code, body) = curl(
        api_server,
        port,
        "GET",
        "/containerLogs/default/hostnet/app",
    );
    assert_eq!(code, 404);
    assert_eq!(
        body.trim(),
        "pod default/hostnet has no ShadowPod on provider cluster-b (not offloaded yet?)"
    );
    eprintln!("pods running on the provider after {:?}", t0.elapsed());

    // Logs: all, --tail, --limit-bytes, --timestamps.
    let ticks = eventually_blocking("ticks in the log", T, || {
        let o = consumer.kubectl(&["logs", "ticker"]);
        let (out, _) = text(&o);
        (o.status.success() && out.lines().count() >= 4).then_some(out)
    });
    assert!(ticks.starts_with("tick 0\ntick 1\n"), "{ticks}");
    let o = consumer.kubectl(&["logs", "ticker", "--tail=2"]);
    let (out, err) = text(&o);
    assert_eq!(out.lines().count(), 2, "{out} {err}");
    assert!(out.lines().all(|l| l.starts_with("tick ")), "{out}");
    let (out, _) = text(&consumer.kubectl(&["logs", "ticker", "--limit-bytes=6"]));
    assert_eq!(out, "tick 0");
    let (out, _) = text(&consumer.kubectl(&["logs", "ticker", "--tail=1", "--timestamps"]));
    let (stamp, line) = out.trim_end().split_once(' ').unwrap();
    assert!(
        stamp.parse::<k8s_openapi::jiff::Timestamp>().is_ok(),
        "{out}"
    );
    assert!(line.starts_with("tick "), "{out}");
    let (out, _) = text(&consumer.kubectl(&["logs", "ticker", "--since=1h"]));
    assert!(out.starts_with("tick 0\n"), "{out}");

    // logs -f: lines keep arriving after it started, through the whole chain.
    let mut follow = ChildGuard(
        die_with_parent(&mut Command::new("kubectl"))
            .env("KUBECONFIG", &consumer.kubeconfig)
            .args(["logs", "-f", "ticker", "--tail=1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(follow.0.stdout.take().unwrap()).lines();
    let number = |l: &str| -> u64 { l.trim_start_matches("tick ").parse().unwrap() };
    let first = number(&lines.next().unwrap().unwrap());
    let started = Instant::now();
    let mut last = first;
    // Five more ticks (2.5 s of them), each in order.
    while last < first + 5 {
        let n = number(&lines.next().unwrap().unwrap());
        assert_eq!(n, last + 1, "lines in order, none lost");
        last = n;
        assert!(
            started.elapsed() < T,
            "followed from {first} to {last} only"
        );
    }
    drop(follow);

    // --previous: the log of the crashed run, once there is one.
    let (_, err) = text(&consumer.kubectl(&["logs", "crasher", "--previous"]));
    eventually_blocking("crasher restarted", T, || {
        let p = cl.b.get_pod(&tenant, &real("crasher")).ok()??;
        (p["status"]["containerStatuses"][0]["restartCount"].as_i64()? >= 1).then_some(())
    });
    let o = consumer.kubectl(&["logs", "crasher", "--previous"]);
    let (out, e2) = text(&o);
    assert!(o.status.success(), "{e2} (before a restart: {err})");
    assert_eq!(out, "run started\nrun ends\n");

    // exec: output, stderr and the exit code; stdin, more than one frame of it.
    let o = consumer.kubectl(&[
        "exec",
        "srv",
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 3",
    ]);
    assert_eq!(o.status.code(), Some(3), "{:?}", text(&o));
    let (out, err) = text(&o);
    assert_eq!(out, "out\n");
    assert!(err.contains("err\n"), "{err}");
    let input: String = (0..5000).map(|i| format!("line {i}\n")).collect();
    let o = consumer.kubectl_stdin(&["exec", "-i", "srv", "--", "cat"], &input);
    assert!(o.status.success(), "{:?}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), input);
    let o = consumer.kubectl_stdin(&["exec", "-i", "srv", "--", "wc", "-l"], &input);
    assert_eq!(text(&o).0.trim(), "5000");
    // The command runs in the real pod: the provider's address, the provider's pod name.
    let srv = cl.b.get_pod(&tenant, &real("srv")).unwrap().unwrap();
    let ip = srv["status"]["podIP"].as_str().unwrap();
    let out = consumer.kubectl_ok(&["exec", "srv", "--", "ip", "-o", "-4", "addr"]);
    assert!(out.contains(&format!("inet {ip}/")), "{out}");

    // exec -it: a terminal of the command's own, sized as the client's. kubectl takes the size
    // from its own terminal, which `script` gives it (33 rows, 77 columns here), and sends it on
    // the resize stream through the virtual kubelet to the provider's node.
    let o = Command::new("script")
        .args([
            "-qec",
            "stty rows 33 cols 77; kubectl exec -it srv -- sh -c 'tty; stty size; echo \"exit $?\"'",
            "/dev/null",
        ])
        .env("KUBECONFIG", &consumer.kubeconfig)
        .stdin(Stdio::null())
        .output()
        .expect("script");
    let (out, err) = text(&o);
    assert!(o.status.success(), "exec -it: {out}{err}");
    assert!(out.contains("/dev/pts/"), "no terminal: {out}");
    assert!(out.contains("33 77\r\n"), "not the client's size: {out}");
    assert!(out.contains("exit 0"), "{out}");

    // attach: the provider's test node refuses it, and its reason comes through.
    let o = consumer.kubectl(&["attach", "srv"]);
    assert!(!o.status.success());
    assert!(text(&o).1.contains("keeps no stdio"), "{:?}", text(&o));

    // port-forward: bytes both ways, on two connections (kubectl wants the pod Running at
    // home: the pod loop reports it).
    eventually_blocking("srv Running at home", T, || {
        let p: Value =
            serde_json::from_str(&consumer.kubectl_ok(&["get", "pod", "srv", "-o", "json"]))
                .ok()?;
        (p["status"]["phase"] == "Running").then_some(())
    });
    let mut pf = ChildGuard(
        die_with_parent(&mut Command::new("kubectl"))
            .env("KUBECONFIG", &consumer.kubeconfig)
            .args(["port-forward", "pod/srv", &format!(":{SRV_PORT}")])
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.join("port-forward.err")).unwrap())
            .spawn()
            .unwrap(),
    );
    // Kept until the end: kubectl writes a line per connection, and dies of SIGPIPE if
    // nobody reads them.
    let mut pf_out = BufReader::new(pf.0.stdout.take().unwrap()).lines();
    let first = pf_out.next().and_then(Result::ok).unwrap_or_else(|| {
        panic!(
            "kubectl port-forward: {}",
            std::fs::read_to_string(dir.join("port-forward.err")).unwrap_or_default()
        )
    });
    let local: u16 = first
        .split_once("127.0.0.1:")
        .and_then(|(_, r)| r.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{first}"));
    for i in 0..2 {
        let s = TcpStream::connect(("127.0.0.1", local)).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut w = s;
        for size in [1, 20_000] {
            let payload = format!("hello {i} ").repeat(size);
            writeln!(w, "{payload}").unwrap();
            let mut answer = String::new();
            r.read_line(&mut answer).unwrap();
            assert!(
                answer == format!("got:{payload}\n"),
                "connection {i}, {size}"
            );
        }
    }
    drop((pf, pf_out));

    // Only pods bound to the virtual node, and only to the API server's kubelet client.
    apply(
        &consumer,
        &json!({ "apiVersion": "v1", "kind": "Pod",
                 "metadata": { "name": "unbound", "namespace": "default" },
                 "spec": { "containers": [{ "name": "app", "image": "x" }] } }),
    );
    let (code, body) = curl(
        api_server,
        port,
        "GET",
        "/containerLogs/default/unbound/app",
    );
    assert_eq!(code, 404, "{body}");
    assert!(
        body.contains("not bound to virtual node fabric-cluster-b"),
        "{body}"
    );
    let (code, body) = curl(api_server, port, "GET", "/containerLogs/default/nope/app");
    assert_eq!(
        (code, body.trim()),
        (404, "pod default/nope does not exist")
    );
    let (code, body) = curl(api_server, port, "GET", "/runningpods/");
    assert_eq!(code, 404, "{body}");
    let (code, _) = curl(api_server, port, "GET", "/containerLogs/default/ticker/app");
    assert_eq!(code, 200);

    // The reflectors' metrics, served as a kubelet serves its own: to the API server's kubelet
    // client, and through the API server (how Prometheus scrapes kubelets).
    let synced = |body: &str| {
        body.lines()
            .find_map(|l| l.strip_prefix("fabric_reflector_syncs_total{kind=\"pods\"} "))
            .and_then(|v| v.parse::<f64>().ok())
    };
    let (code, body) = curl(api_server, port, "GET", "/metrics");
    assert_eq!(code, 200, "{body}");
    assert!(synced(&body).is_some_and(|n| n > 0.0), "{body}");
    assert!(
        body.contains("fabric_reflector_pairs{kind=\"pods\"} 1\n"),
        "{body}"
    );
    let raw = consumer.kubectl_ok(&[
        "get",
        "--raw",
        &format!("/api/v1/nodes/{NODE}/proxy/metrics"),
    ]);
    assert!(synced(&raw).is_some_and(|n| n > 0.0), "{raw}");

    // Nobody else: no certificate -> 401; a certificate of another CA (the provider's, even
    // with the API server's user and group) -> no handshake; a certificate of this cluster's
    // CA whose user may not use the node's kubelet API -> 403. Nothing of those reaches the
    // provider: the virtual kubelet logs every request it carries there ("logs", "stream").
    let write_pem = |name: &str, (crt, key): (String, String)| {
        let (c, k) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&c, crt).unwrap();
        std::fs::write(&k, key).unwrap();
        (c, k)
    };
    let foreign = write_pem(
        "foreign",
        sharing::mint_client_cert(provider, "kube-apiserver-kubelet-client", "system:masters")
            .unwrap(),
    );
    let mallory = write_pem(
        "mallory",
        sharing::mint_client_cert(&consumer, "mallory", "dev").unwrap(),
    );
    let carried = || {
        vk_log()
            .lines()
            .filter(|l| l.contains(" logs ") || l.contains(" stream "))
            .count()
    };
    let before = carried();
    let attempts: [(&str, &str); 4] = [
        ("GET", "/containerLogs/default/ticker/app"),
        (
            "POST",
            "/exec/default/srv/app?command=sh&command=-c&command=kill+1&output=1",
        ),
        ("POST", "/attach/default/srv/app?output=1"),
        ("POST", "/portForward/default/srv"),
    ];
    for (method, path) in attempts {
        let (code, body) = curl(None, port, method, path);
        assert_eq!(
            (code, body.trim()),
            (401, "Unauthorized"),
            "{method} {path}"
        );
        let (code, body) = curl(Some((&foreign.0, &foreign.1)), port, method, path);
        assert_eq!(
            code, 0,
            "{method} {path} with a foreign certificate: {body}"
        );
        let (code, body) = curl(Some((&mallory.0, &mallory.1)), port, method, path);
        assert_eq!(code, 403, "{method} {path} as mallory: {body}");
        assert!(
            body.contains("user=mallory") && body.contains("subresource=proxy"),
            "{body}"
        );
    }
    // Without a certificate, a bearer token this cluster's API server vouches for
    // (TokenReview): a token it does not know is 401; a ServiceAccount's token is that
    // ServiceAccount, refused as any user without the grant is.
    let (code, body) = curl_bearer(
        "not-a-token",
        port,
        "GET",
        "/containerLogs/default/ticker/app",
    );
    assert_eq!(
        (code, body.trim()),
        (401, "Unauthorized"),
        "an unknown token"
    );
    consumer.kubectl_ok(&["create", "serviceaccount", "scraper", "-n", "default"]);
    let token = consumer
        .kubectl_ok(&["create", "token", "scraper", "-n", "default"])
        .trim()
        .to_owned();
    let (code, body) = curl_bearer(&token, port, "GET", "/containerLogs/default/ticker/app");
    assert_eq!(
        code, 403,
        "a ServiceAccount token without the grant: {body}"
    );
    assert!(
        body.contains("user=system:serviceaccount:default:scraper"),
        "{body}"
    );
    // A client that did not authenticate gets one request per connection: it cannot keep one
    // (a slot of the server's) open by sending request after request, each costing a
    // TokenReview. The API server's own connection stays alive.
    let bearer = std::ffi::OsString::from("Authorization: Bearer not-a-token");
    for extra in [vec![], vec![std::ffi::OsStr::new("-H"), bearer.as_os_str()]] {
        assert_eq!(
            twice_on_one_connection(&extra, port, "/containerLogs/default/ticker/app"),
            [(401, 1), (401, 1)],
            "an unauthenticated client kept its connection ({extra:?})"
        );
    }
    let (cert, key) = api_server.expect("the API server's kubelet client certificate");
    assert_eq!(
        twice_on_one_connection(
            &[
                "--cert".as_ref(),
                cert.as_os_str(),
                "--key".as_ref(),
                key.as_os_str()
            ],
            port,
            "/metrics"
        ),
        [(200, 1), (200, 0)]
    );
    // The metrics are the node's `metrics` subresource, which mallory has not either.
    let (code, body) = curl(Some((&mallory.0, &mallory.1)), port, "GET", "/metrics");
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("subresource=metrics"), "{body}");
    // A request the kubelet API does not serve is refused the same before it says so.
    let (code, body) = curl(Some((&mallory.0, &mallory.1)), port, "GET", "/runningpods/");
    assert_eq!(code, 403, "{body}");
    assert_eq!(carried(), before, "a refused request reached the provider");
    // The real pod carries on as it was (the exec above would have killed it).
    let srv_after = cl.b.get_pod(&tenant, &real("srv")).unwrap().unwrap();
    assert_eq!(srv_after["metadata"]["uid"], srv["metadata"]["uid"]);
    assert_eq!(
        srv_after["status"]["containerStatuses"][0]["restartCount"],
        srv["status"]["containerStatuses"][0]["restartCount"]
    );

    // nodes/proxy of another node is not this one's; of this node, it lets mallory in (once
    // the denial's cache time passed: the API server decides, not a fixed list).
    let grant = |node: &str| {
        apply(
            &consumer,
            &json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                     "metadata": { "name": "mallory-kubelet" },
                     "rules": [{ "apiGroups": [""], "resources": ["nodes/proxy"],
                                 "resourceNames": [node], "verbs": ["get", "create"] }] }),
        );
    };
    grant("some-other-node");
    apply(
        &consumer,
        &json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                 "metadata": { "name": "mallory-kubelet" },
                 "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                              "name": "mallory-kubelet" },
                 "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                "name": "mallory" }] }),
    );
    std::thread::sleep(Duration::from_millis(1500));
    let (code, body) = curl(
        Some((&mallory.0, &mallory.1)),
        port,
        "GET",
        "/containerLogs/default/ticker/app",
    );
    assert_eq!(code, 403, "nodes/proxy of another node: {body}");
    grant(NODE);
    let body = eventually_blocking("mallory let in once granted", T, || {
        let (code, body) = curl(
            Some((&mallory.0, &mallory.1)),
            port,
            "GET",
            "/containerLogs/default/ticker/app",
        );
        (code == 200).then_some(body)
    });
    assert!(body.starts_with("tick 0\n"), "{body}");
    // nodes/proxy is not nodes/metrics (as with a kubelet).
    let (code, body) = curl(Some((&mallory.0, &mallory.1)), port, "GET", "/metrics");
    assert_eq!(code, 403, "{body}");
    // So is the ServiceAccount, bound to the same role.
    apply(
        &consumer,
        &json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                 "metadata": { "name": "scraper-kubelet" },
                 "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                              "name": "mallory-kubelet" },
                 "subjects": [{ "kind": "ServiceAccount", "name": "scraper",
                                "namespace": "default" }] }),
    );
    let body = eventually_blocking("the ServiceAccount's token let in once granted", T, || {
        let (code, body) = curl_bearer(&token, port, "GET", "/containerLogs/default/ticker/app");
        (code == 200).then_some(body)
    });
    assert!(body.starts_with("tick 0\n"), "{body}");

    eprintln!(
        "done after {:?}\n--- virtual kubelet ---\n{}",
        t0.elapsed(),
        {
            let l = vk_log();
            l.lines().rev().take(15).collect::<Vec<_>>().join("\n")
        }
    );
    let _ = std::fs::remove_dir_all(&dir);
}
