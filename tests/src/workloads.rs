//! Pods in the fixture's clusters: each cluster runs a test scheduler and a test node per node
//! (see [`crate::testnode`]), so a test creates Pod objects and they run for real, as processes
//! in network namespaces of their own with addresses from their node's pod range. These are the
//! helpers to create them, wait for them and reach into them.
use std::{
    process::Output,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use crate::{clusters::Cluster, locate_bin};

/// Port the echo pods of [`echo_pod`] listen on.
pub const ECHO_PORT: u16 = 8080;

/// A pod that runs `command` (the first element is looked up next to the test node, where
/// `fabric-test-pod` is, then in PATH), in namespace `default`, restart policy `Never`.
pub fn command_pod(name: &str, command: &[&str]) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": "default", "labels": { "app": name } },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "containers": [{ "name": "app", "image": "fabric-test-pod", "command": command }],
        },
    })
}

/// A pod whose TCP server on [`ECHO_PORT`] answers each connection with the client address
/// it sees (`fabric-test-pod echo`), restarted if it exits. It dies of SIGTERM at once; the
/// grace period is the default 30 s, so a deletion that waits for it shows.
pub fn echo_pod(name: &str) -> Value {
    let mut p = command_pod(
        name,
        &["fabric-test-pod", "echo", "--port", &ECHO_PORT.to_string()],
    );
    p["spec"]["restartPolicy"] = json!("Always");
    p["spec"]["terminationGracePeriodSeconds"] = json!(30);
    p
}

/// A ClusterIP Service `ns/name` over the pods labelled `selector` (`key=value`), TCP `port`
/// to the same target port. The fixture's EndpointSlice controller gives it a slice and the
/// test nodes' service proxy DNATs its cluster IP (see [`crate::endpoints`],
/// [`crate::testnode::proxy`]).
pub fn service(name: &str, ns: &str, selector: &[(&str, &str)], port: u16) -> Value {
    let selector: serde_json::Map<String, Value> = selector
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(v)))
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": { "name": name, "namespace": ns },
        "spec": {
            "selector": selector,
            "ports": [{ "name": "main", "protocol": "TCP", "port": port, "targetPort": port }],
        },
    })
}

/// The pod, placed on node `k` (by its hostname label).
pub fn on_node(mut pod: Value, k: usize) -> Value {
    pod["spec"]["nodeSelector"] = json!({ "kubernetes.io/hostname": Cluster::node_name(k) });
    pod
}

/// What a running pod got.
#[derive(Debug, Clone)]
pub struct RunningPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub ip: String,
    pub node: String,
}

impl Cluster {
    /// Creates a pod from its manifest.
    pub fn create_pod(&self, pod: &Value) -> Result<()> {
        self.create(pod)
    }

    /// Creates any object from its manifest (`kubectl create`).
    pub fn create(&self, obj: &Value) -> Result<()> {
        crate::kube_sync::create(&self.api.kubeconfig, obj).map(drop)
    }

    /// The Service's cluster IP (allocated by the API server at creation).
    pub fn service_ip(&self, ns: &str, name: &str) -> Result<String> {
        let o = self.api.kubectl(&[
            "get",
            "service",
            name,
            "-n",
            ns,
            "-o",
            "jsonpath={.spec.clusterIP}",
        ]);
        if !o.status.success() {
            bail!(
                "getting service {ns}/{name}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&o.stdout).trim().to_owned())
    }

    /// The ready endpoint addresses of the Service, from all its EndpointSlices (whoever
    /// wrote them), sorted.
    pub fn service_endpoints(&self, ns: &str, name: &str) -> Result<Vec<String>> {
        let slices = crate::kube_sync::list(
            &self.api.kubeconfig,
            "endpointslices.discovery.k8s.io",
            Some(ns),
            &format!("{}={name}", crate::endpoints::SERVICE_NAME_LABEL),
        )
        .with_context(|| format!("listing the slices of {ns}/{name}"))?;
        let mut ready: Vec<String> = slices
            .iter()
            .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
            // Unset means ready.
            .filter(|e| e["conditions"]["ready"] != false)
            .flat_map(|e| e["addresses"].as_array().cloned().unwrap_or_default())
            .filter_map(|a| a.as_str().map(str::to_owned))
            .collect();
        ready.sort();
        Ok(ready)
    }

    /// Waits until the Service has exactly `n` ready endpoints; returns their addresses.
    pub fn wait_service_endpoints(
        &self,
        ns: &str,
        name: &str,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<String>> {
        let t0 = Instant::now();
        loop {
            let eps = self.service_endpoints(ns, name)?;
            if eps.len() == n {
                return Ok(eps);
            }
            if t0.elapsed() > timeout {
                bail!(
                    "service {ns}/{name}: {} ready endpoints after {timeout:?}, not {n}: {eps:?}",
                    eps.len()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The pod as JSON; None when it does not exist.
    pub fn get_pod(&self, ns: &str, name: &str) -> Result<Option<Value>> {
        crate::kube_sync::get_json(&self.api.kubeconfig, "pods", Some(ns), name)
            .with_context(|| format!("getting pod {ns}/{name}"))
    }

    /// Waits until `ok` holds for the pod (polling); returns it. `what` names the wait in the
    /// error, which shows the pod's last status.
    pub fn wait_pod(
        &self,
        ns: &str,
        name: &str,
        timeout: Duration,
        what: &str,
        ok: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        let t0 = Instant::now();
        loop {
            let p = self.get_pod(ns, name)?;
            if let Some(p) = &p
                && ok(p)
            {
                return Ok(p.clone());
            }
            if t0.elapsed() > timeout {
                let status = p.map(|p| p["status"].to_string()).unwrap_or("gone".into());
                bail!("pod {ns}/{name} not {what} after {timeout:?}; status: {status}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the pod has run to completion (phase `Succeeded`); returns it.
    pub fn wait_pod_succeeded(&self, ns: &str, name: &str, timeout: Duration) -> Result<Value> {
        self.wait_pod(ns, name, timeout, "Succeeded", |p| {
            p["status"]["phase"] == "Succeeded"
        })
    }

    /// Waits until the pod runs with every container ready; returns its address and node.
    pub fn wait_pod_running(&self, ns: &str, name: &str, timeout: Duration) -> Result<RunningPod> {
        let p = self.wait_pod(ns, name, timeout, "Running and Ready", |p| {
            p["status"]["phase"] == "Running"
                && p["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
        })?;
        let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        Ok(RunningPod {
            namespace: ns.to_owned(),
            name: name.to_owned(),
            uid: s(&p["metadata"]["uid"]),
            ip: s(&p["status"]["podIP"]),
            node: s(&p["spec"]["nodeName"]),
        })
    }

    /// Waits until the pod object is gone.
    pub fn wait_pod_gone(&self, ns: &str, name: &str, timeout: Duration) -> Result<()> {
        let t0 = Instant::now();
        while self.get_pod(ns, name)?.is_some() {
            if t0.elapsed() > timeout {
                bail!("pod {ns}/{name} still exists after {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// The network namespace the test node made for the pod with this uid, if it exists.
    pub fn pod_netns(uid: &str) -> Option<String> {
        let suffix = format!("-pod-{uid}");
        std::fs::read_dir(fabric_netns::NETNS_RUN_DIR)
            .ok()?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|n| n.starts_with(fabric_netns::testbed::NETNS_PREFIX) && n.ends_with(&suffix))
    }

    /// Runs `argv` inside the pod's network namespace (as `kubectl exec` would, without the
    /// kubelet API).
    pub fn exec_in_pod(&self, pod: &RunningPod, argv: &[&str]) -> Result<Output> {
        let ns = Self::pod_netns(&pod.uid)
            .with_context(|| format!("no network namespace for pod {}", pod.name))?;
        Ok(std::process::Command::new("ip")
            .args(["netns", "exec", &ns])
            .args(argv)
            .output()?)
    }

    /// From inside `pod`: a TCP connection to `addr:port` and the server's answer (for an
    /// echo pod, the client address it saw).
    pub fn connect_from(&self, pod: &RunningPod, addr: &str, port: u16) -> Result<String> {
        let bin = locate_bin("fabric-test-pod")?.display().to_string();
        let o = self.exec_in_pod(pod, &[&bin, "connect", &format!("{addr}:{port}")])?;
        if !o.status.success() {
            bail!(
                "{} -> {addr}:{port}: {}",
                pod.name,
                String::from_utf8_lossy(&o.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&o.stdout).trim().to_owned())
    }
}
