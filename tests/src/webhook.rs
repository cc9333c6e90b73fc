//! The provider's ShadowPod webhook (`fabric-controller shadowpod-webhook`) for a test API
//! server on the host, registered as deploy/ registers it: kubelite calls it through its
//! Service, resolved by an EndpointSlice to 127.0.0.1 and the port it listens on, verifying
//! it against the caBundle the webhook writes itself.
use std::{net::TcpListener, path::Path, time::Duration};

use anyhow::{Context as _, Result, bail};
use fabric_api::names;
use serde_json::json;

use crate::{ChildGuard, apiserver::ApiServer, process::Bin, wait::try_eventually_blocking};

/// The ValidatingWebhookConfiguration of deploy/, as `kubectl apply -k deploy/` installs it.
pub fn deployed_config() -> Result<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/base/shadowpod-webhook.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    text.split("\n---\n")
        .find(|d| d.contains("kind: ValidatingWebhookConfiguration"))
        .map(str::to_owned)
        .context("deploy/ registers no ValidatingWebhookConfiguration")
}

/// Starts the webhook for `api` in namespace [`names::DEFAULT_NAMESPACE`] (which must
/// exist), logging to `log`; returns once it has put its CA into the configuration's
/// caBundle. The process dies with the returned guard.
pub fn start(api: &ApiServer, log: &Path) -> Result<ChildGuard> {
    let ns = names::DEFAULT_NAMESPACE;
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let service = names::webhook::SHADOWPODS_SERVICE;
    let objects = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": service, "namespace": ns},
         "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": service, "namespace": ns,
                      "labels": {"kubernetes.io/service-name": service}},
         "addressType": "IPv4",
         "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true}}],
         "ports": [{"name": "https", "port": port, "protocol": "TCP"}]},
    ]});
    for doc in [objects.to_string(), deployed_config()?] {
        let o = api.kubectl_stdin(&["apply", "-f", "-"], &doc);
        if !o.status.success() {
            bail!(
                "registering the webhook: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }
    // As its pod: its ServiceAccount's token, with the rights deploy/ gives it.
    let kubeconfig = crate::rights::component_kubeconfig(
        api,
        "fabric-shadowpod-webhook",
        log.with_extension("kubeconfig"),
    )?;
    let child = Bin::new("fabric-controller")?
        .args([
            "shadowpod-webhook",
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .kubeconfig(&kubeconfig)
        .log(log)
        .spawn()?;
    try_eventually_blocking("the webhook's caBundle", Duration::from_secs(30), || {
        let o = api.kubectl(&[
            "get",
            "validatingwebhookconfiguration",
            names::webhook::SHADOWPODS_CONFIG,
            "-o",
            "jsonpath={.webhooks[0].clientConfig.caBundle}",
        ]);
        (o.status.success() && !o.stdout.is_empty()).then_some(())
    })
    .map_err(|e| {
        anyhow::anyhow!(
            "{e}; its log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        )
    })?;
    Ok(child)
}
