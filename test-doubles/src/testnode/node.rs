//! The Node object and the node Lease, as the kubelet keeps them: registration (created when
//! missing, with labels, taints and pod CIDR; left alone when someone created it already, as
//! node IPAM or a test may), the status (addresses, kubelet endpoint, capacity, Ready) and the
//! Lease in `kube-node-lease`, renewed every tenth of its duration.
use std::{collections::BTreeMap, time::Duration};

use anyhow::{Context as _, Result};
use k8s_openapi::{
    api::{
        coordination::v1::Lease,
        core::v1::{Namespace, Node},
    },
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;
use tracing::{info, warn};

pub const LEASE_NAMESPACE: &str = "kube-node-lease";

/// What the node registers.
#[derive(Debug, Clone)]
pub struct Registration {
    pub name: String,
    pub ip: String,
    pub kubelet_port: u16,
    /// Resource name → quantity (cpu, memory, pods, extended resources).
    pub capacity: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
    /// `key[=value]:Effect`, only applied when this process creates the Node.
    pub taints: Vec<serde_json::Value>,
    /// Published as `spec.podCIDRs` when this process creates the Node.
    pub pod_cidr: Option<String>,
    pub lease_duration: Duration,
}

/// Parses `key[=value]:Effect` into a taint.
pub fn parse_taint(s: &str) -> Result<serde_json::Value> {
    let (kv, effect) = s
        .rsplit_once(':')
        .with_context(|| format!("taint {s:?}: want key[=value]:Effect"))?;
    anyhow::ensure!(
        matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute"),
        "taint {s:?}: unknown effect {effect}"
    );
    let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
    let mut t = json!({ "key": key, "effect": effect });
    if !value.is_empty() {
        t["value"] = json!(value);
    }
    Ok(t)
}

/// Creates the Node if it does not exist, then writes its status.
pub async fn register(client: &Client, r: &Registration) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    if nodes
        .get_opt(&r.name)
        .await
        .context("reading the Node")?
        .is_none()
    {
        let mut labels = r.labels.clone();
        labels.insert("kubernetes.io/hostname".into(), r.name.clone());
        labels.insert("kubernetes.io/os".into(), "linux".into());
        labels.insert(
            "kubernetes.io/arch".into(),
            std::env::consts::ARCH.replace("x86_64", "amd64"),
        );
        let mut spec = json!({ "taints": r.taints });
        if let Some(c) = &r.pod_cidr {
            spec["podCIDR"] = json!(c);
            spec["podCIDRs"] = json!([c]);
        }
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": { "name": r.name, "labels": labels },
            "spec": spec,
        }))?;
        match nodes.create(&PostParams::default(), &node).await {
            Ok(_) => info!(node = r.name, "registered"),
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e).context("creating the Node"),
        }
    }
    let now = Timestamp::now();
    let status = json!({ "status": {
        "addresses": [
            { "type": "InternalIP", "address": r.ip },
            { "type": "Hostname", "address": r.name },
        ],
        "daemonEndpoints": { "kubeletEndpoint": { "Port": r.kubelet_port } },
        "capacity": r.capacity,
        "allocatable": r.capacity,
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "fabric-test-node is posting ready status",
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }],
        "nodeInfo": {
            "kubeletVersion": "fabric-test-node", "operatingSystem": "linux",
            "architecture": std::env::consts::ARCH, "containerRuntimeVersion": "fabric-test-node://0",
            "kernelVersion": "", "osImage": "", "kubeProxyVersion": "", "machineID": "",
            "systemUUID": "", "bootID": "",
        },
    }});
    nodes
        .patch_status(&r.name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .context("writing the Node's status")?;
    Ok(())
}

/// Renews the node Lease for ever (creating it, and its namespace, when missing).
pub async fn keep_lease(client: Client, r: Registration) {
    let ns: Api<Namespace> = Api::all(client.clone());
    let want_ns: Namespace =
        serde_json::from_value(json!({ "metadata": { "name": LEASE_NAMESPACE } }))
            .expect("a namespace object");
    if let Err(e) = ns.create(&PostParams::default(), &want_ns).await
        && !matches!(&e, kube::Error::Api(s) if s.code == 409)
    {
        warn!(error = %e, "creating {LEASE_NAMESPACE}");
    }
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let nodes: Api<Node> = Api::all(client);
    let every = (r.lease_duration / 10).max(Duration::from_millis(200));
    loop {
        if let Err(e) = renew(&leases, &nodes, &r).await {
            warn!(error = %format!("{e:#}"), "renewing the node Lease");
        }
        tokio::time::sleep(every).await;
    }
}

async fn renew(leases: &Api<Lease>, nodes: &Api<Node>, r: &Registration) -> Result<()> {
    let now = MicroTime(Timestamp::now());
    let patch = json!({ "spec": { "holderIdentity": r.name, "renewTime": now,
                                  "leaseDurationSeconds": r.lease_duration.as_secs() } });
    match leases
        .patch(&r.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => return Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(e).context("patching the Lease"),
    }
    // Owned by the Node, so that deleting the Node deletes its Lease (with a garbage collector).
    let uid = nodes
        .get(&r.name)
        .await
        .context("reading the Node")?
        .metadata
        .uid;
    let lease: Lease = serde_json::from_value(json!({
        "metadata": { "name": r.name, "namespace": LEASE_NAMESPACE,
                      "ownerReferences": [{ "apiVersion": "v1", "kind": "Node",
                                            "name": r.name, "uid": uid }] },
        "spec": { "holderIdentity": r.name, "renewTime": now,
                  "leaseDurationSeconds": r.lease_duration.as_secs() },
    }))?;
    leases
        .create(&PostParams::default(), &lease)
        .await
        .context("creating the Lease")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taints_parse() {
        assert_eq!(
            parse_taint("virtual-node.fabric.io/not-allowed=true:NoExecute").unwrap(),
            json!({"key": "virtual-node.fabric.io/not-allowed", "value": "true", "effect": "NoExecute"})
        );
        assert_eq!(
            parse_taint("dedicated:NoSchedule").unwrap(),
            json!({"key": "dedicated", "effect": "NoSchedule"})
        );
        assert!(parse_taint("k=v").is_err());
        assert!(parse_taint("k=v:Sometimes").is_err());
    }
}
