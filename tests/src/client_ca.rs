//! What kube-apiserver publishes and the test API server does not: its client CA, in ConfigMap
//! kube-system/extension-apiserver-authentication (`client-ca-file`). Virtual kubelets read
//! it there (as delegated authentication does) to let in the API server's kubelet client
//! certificate, which that CA signed (kubelite's `certs/kubelet-client.crt`).
use anyhow::{Context as _, Result};
use fabric_offloading::virtual_node::objects::{
    CLIENT_CA_CONFIGMAP, CLIENT_CA_CONFIGMAP_NAMESPACE,
};

use crate::apiserver::ApiServer;

impl ApiServer {
    /// Publishes the cluster CA as kube-apiserver publishes its `--client-ca-file`. Against an
    /// existing cluster (`FABRIC_TEST_KUBECONFIG`), nothing: its API server publishes its own.
    pub fn publish_client_ca(&self) -> Result<()> {
        let Some(certs) = self.certs_dir() else {
            return Ok(());
        };
        let ca = std::fs::read_to_string(certs.join("ca.crt")).context("the cluster CA")?;
        let objects = serde_json::json!({
            "apiVersion": "v1", "kind": "List",
            "items": [
                { "apiVersion": "v1", "kind": "Namespace",
                  "metadata": { "name": CLIENT_CA_CONFIGMAP_NAMESPACE } },
                { "apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": { "name": CLIENT_CA_CONFIGMAP,
                                "namespace": CLIENT_CA_CONFIGMAP_NAMESPACE },
                  "data": { "client-ca-file": ca } },
            ],
        });
        crate::kube_sync::apply(&self.kubeconfig, "fabric-tests", true, &[objects])
            .context("publishing the client CA")
    }
}
