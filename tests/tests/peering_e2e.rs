//! The out-of-band peering end to end (issue 10), on the network fixture with RBAC and client
//! certificates enforced, every cluster running its sharing layer as a deployment would (see
//! `fabric_tests::peering_stack`): the provider prints `fabricctl generate peer-command`, the
//! consumer runs exactly that command (plus what it asks for), and the peering ends with a
//! tunnel pods talk through and a virtual node with the grant. One fixture for every check.
use std::{
    collections::BTreeSet,
    process::Output,
    time::{Duration, Instant},
};

use fabric_api::names;
use fabric_tests::{
    apiserver::{ApiServer, require_tools},
    clusters::{Cluster, NAMESPACE, PeeredClusters},
    locate_bin,
    peering_stack::{ADVERTISED_LABEL as ADVERTISED, PeeringStack},
    skip_unless_root, traffic,
};
use serde_json::Value;

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
    let mut a = args.to_vec();
    a.extend(["-o", "json"]);
    let o = api.kubectl(&a);
    o.status
        .success()
        .then(|| serde_json::from_slice(&o.stdout).ok())
        .flatten()
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

    #[track_caller]
    fn wait<T>(&self, what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
        let t0 = Instant::now();
        loop {
            if let Some(v) = f() {
                return v;
            }
            if t0.elapsed() > timeout {
                panic!("{what}: not within {timeout:?}\n{}", self.logs());
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The words of the command `fabricctl generate peer-command` prints on provider `p`.
    fn peer_command(&self, p: u8) -> Vec<String> {
        let provider = self.cluster(p);
        let svc = &self.stack.member(&provider.id).auth;
        let o = fabricctl(
            &provider.api,
            &["generate", "peer-command", "--auth-url", &svc.url],
        );
        assert!(o.status.success(), "{}", text(&o));
        let line = String::from_utf8(o.stdout).unwrap();
        let words: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        assert_eq!(words[..3], ["fabricctl", "peer", "out-of-band"], "{line}");
        words
    }

    /// Consumer `c` runs provider `p`'s peer command (plus `ask`) through fabricctl; the
    /// gateways not running yet start meanwhile. Returns what it printed.
    fn peer(&mut self, c: u8, p: u8, ask: &[&str]) -> String {
        let words = self.peer_command(p);
        let kubeconfig = self.cluster(c).api.kubeconfig.clone();
        let mut args: Vec<String> = words[1..].to_vec();
        args.extend(ask.iter().map(|s| (*s).to_owned()));
        args.extend(["--timeout-secs".into(), "90".into()]);
        let ctl = locate_bin("fabricctl").unwrap();
        let run = std::thread::spawn(move || {
            fabric_tests::die_with_parent(&mut std::process::Command::new(ctl))
                .env("KUBECONFIG", kubeconfig)
                .env_remove("FABRIC_PEERING_TOKEN")
                .args(&args)
                .output()
        });
        for i in [c, p] {
            if self.gateways.insert(i) {
                self.cl
                    .start_gateways_of(i)
                    .unwrap_or_else(|e| panic!("{e:#}\n{}", self.stack.log_tails()));
            }
        }
        let o = run.join().unwrap().unwrap();
        let out = text(&o);
        assert!(
            o.status.success(),
            "peer out-of-band failed:\n{out}\n{}",
            self.logs()
        );
        out
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

    /// The virtual node of `provider` on cluster `c`, once it is Ready.
    fn ready_node(&self, c: u8, provider: &str) -> Value {
        self.wait(
            &format!("virtual node {provider} Ready on cluster {c}"),
            Duration::from_secs(60),
            || {
                let n = get_json(&self.cluster(c).api, &["get", "node", provider])?;
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
        for (res, q) in &granted {
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

    fn lease_renew_time(&self, c: u8, node: &str) -> Option<String> {
        get_json(
            &self.cluster(c).api,
            &["get", "lease", node, "-n", "kube-node-lease"],
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
    let t0 = Instant::now();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cl = PeeredClusters::for_sharing(1, false).unwrap();
    let stack = rt
        .block_on(PeeringStack::start(&cl))
        .unwrap_or_else(|e| panic!("{e:#}\n{}", cl.log_tails()));
    let mut bed = Bed {
        cl,
        stack,
        gateways: BTreeSet::new(),
    };
    eprintln!("fixture up after {:?}", t0.elapsed());
    let (a_id, b_id) = (bed.cl.a.id.clone(), bed.cl.b.id.clone());

    // A (consumer) peers with B (provider) with the command B printed.
    let out = bed.peer(1, 2, &["--cpu", "1", "--memory", "2Gi", "--pods", "20"]);
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

    // The tunnel is up and pods talk.
    bed.pods_talk(1, 2, 7101);

    // A's virtual node for B: the grant, the labels, the taint; its Lease renews.
    let node = bed.check_virtual_node(1, &b_id);
    assert_eq!(node["status"]["capacity"]["cpu"], "1", "what A asked for");
    let renewed = bed
        .lease_renew_time(1, &b_id)
        .expect("the virtual node's Lease");

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
        b_id.as_str(),
        "{info:#}"
    );

    // B knows A as an authenticated consumer.
    let fc = get_json(&bed.cl.b.api, &["get", "foreigncluster", &a_id]).unwrap();
    assert_eq!(fc["spec"]["role"], "Consumer", "{fc}");
    assert!(condition_true(&fc, "Authenticated"), "{fc}");

    bed.wait("the node Lease renewed", Duration::from_secs(30), || {
        bed.lease_renew_time(1, &b_id).filter(|r| *r != renewed)
    });
    eprintln!("done after {:?}", t0.elapsed());
}
