//! The API server's client CA, as kube-apiserver publishes it for delegated authentication
//! (ConfigMap kube-system/extension-apiserver-authentication, `client-ca-file`; aggregated API
//! servers and metrics-server read it there), or a PEM file: what a component that verifies
//! the cluster's client certificates itself trusts (a virtual kubelet, the API server's
//! kubelet client certificate; the authentication service, consumers' renewals).
use std::path::PathBuf;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;

/// The namespace of [`CONFIGMAP`].
pub const NAMESPACE: &str = "kube-system";
/// Where the API server publishes its client CA.
pub const CONFIGMAP: &str = "extension-apiserver-authentication";
/// The key of [`CONFIGMAP`] holding it.
pub const KEY: &str = "client-ca-file";

/// Where the client CA bundle comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientCa {
    /// A PEM file (e.g. mounted from a ConfigMap or Secret).
    File(PathBuf),
    /// [`KEY`] of ConfigMap [`NAMESPACE`]/[`CONFIGMAP`]: the CA of the API server's
    /// `--client-ca-file`, which in kubeadm and most distributions also signs its
    /// `--kubelet-client-certificate` and the certificates its CSR signer issues.
    Cluster,
}

impl std::fmt::Display for ClientCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientCa::File(p) => write!(f, "{}", p.display()),
            ClientCa::Cluster => write!(f, "{KEY} of ConfigMap {NAMESPACE}/{CONFIGMAP}"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("reading {0}: {1}")]
    File(PathBuf, std::io::Error),
    #[error("reading the client CA ConfigMap: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0} is not there")]
    Missing(ClientCa),
}

/// The client CA bundle (PEM) as it is now.
pub async fn read(client: &kube::Client, source: &ClientCa) -> Result<String, CaError> {
    match source {
        ClientCa::File(p) => std::fs::read_to_string(p).map_err(|e| CaError::File(p.clone(), e)),
        ClientCa::Cluster => {
            let cm = Api::<ConfigMap>::namespaced(client.clone(), NAMESPACE)
                .get_opt(CONFIGMAP)
                .await?;
            cm.and_then(|cm| cm.data?.remove(KEY))
                .filter(|pem| !pem.trim().is_empty())
                .ok_or(CaError::Missing(ClientCa::Cluster))
        }
    }
}
