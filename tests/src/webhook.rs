//! The provider's ShadowPod webhook (`fabric-controller shadowpod-webhook`, which also places
//! a consumer's pods of offloaded namespaces) for a test API server on the host, registered
//! as deploy/ registers it (both its configurations): kubelite calls it through its
//! Service, resolved by an EndpointSlice to 127.0.0.1 and the port it listens on, verifying
//! it against the caBundle the webhook writes itself, and presents the client certificate
//! the webhook requires of it ([`Caller`]).
use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, Result};
use fabric_api::names;
use serde_json::json;

use crate::{ChildGuard, apiserver::ApiServer, process::Bin, wait::try_eventually_blocking};

/// The ValidatingWebhookConfiguration of deploy/, as `kubectl apply -k deploy/` installs it.
pub fn deployed_config() -> Result<String> {
    deployed("ValidatingWebhookConfiguration")
}

/// The MutatingWebhookConfiguration of deploy/ (a consumer's pods of offloaded namespaces).
pub fn deployed_pods_config() -> Result<String> {
    deployed("MutatingWebhookConfiguration")
}

fn deployed(kind: &str) -> Result<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/base/shadowpod-webhook.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    text.split("\n---\n")
        .find(|d| d.contains(&format!("kind: {kind}\n")))
        .map(str::to_owned)
        .with_context(|| format!("deploy/ registers no {kind}"))
}

/// The API server as the webhook's caller: a CA, a client certificate it signed for
/// [`CALLER_NAME`], and the AdmissionConfiguration that makes kubelite present it to the
/// webhook's Service (`KUBELITE_ARGS`, see kubelite's README), as a provider's admin
/// configures kube-apiserver.
pub struct Caller {
    pub dir: PathBuf,
}

/// The CommonName of the API server's certificate (the webhook's `--client-name` default).
pub const CALLER_NAME: &str = "kube-apiserver";

impl Caller {
    /// Writes the CA, the certificate and the configuration into `dir`.
    pub fn new(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let ca_key = rcgen::KeyPair::generate()?;
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "webhook-callers-ca");
        let ca_cert = ca.self_signed(&ca_key)?;
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let caller = Self {
            dir: dir.to_owned(),
        };
        std::fs::write(caller.ca(), ca_cert.pem())?;
        for (name, cn) in [
            ("caller", CALLER_NAME),
            ("stranger", "fabric.io:consumer:alpha"),
        ] {
            let key = rcgen::KeyPair::generate()?;
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, cn);
            params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
            let cert = params.signed_by(&key, &issuer)?;
            std::fs::write(dir.join(format!("{name}.crt")), cert.pem())?;
            std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem())?;
        }
        let host = format!(
            "{}.{}.svc:443",
            names::webhook::SHADOWPODS_SERVICE,
            names::DEFAULT_NAMESPACE
        );
        let kubeconfig = json!({
            "apiVersion": "v1", "kind": "Config",
            "users": [{ "name": host, "user": {
                "client-certificate": dir.join("caller.crt"),
                "client-key": dir.join("caller.key"),
            } }],
        });
        std::fs::write(dir.join("webhook-kubeconfig"), kubeconfig.to_string())?;
        let webhook = json!({
            "apiVersion": "apiserver.config.k8s.io/v1", "kind": "WebhookAdmissionConfiguration",
            "kubeConfigFile": dir.join("webhook-kubeconfig"),
        });
        let admission = json!({
            "apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
            "plugins": [
                { "name": "ValidatingAdmissionWebhook", "configuration": webhook },
                { "name": "MutatingAdmissionWebhook", "configuration": webhook },
            ],
        });
        std::fs::write(dir.join("admission.json"), admission.to_string())?;
        Ok(caller)
    }

    /// kubelite's arguments that make it present the certificate.
    pub fn kubelite_args(&self) -> String {
        format!(
            "--admission-control-config-file={}",
            self.dir.join("admission.json").display()
        )
    }

    /// The CA the webhook trusts (`--client-ca`).
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// The API server's certificate and key, as curl's `--cert`/`--key` take them.
    pub fn cert_and_key(&self) -> (PathBuf, PathBuf) {
        (self.dir.join("caller.crt"), self.dir.join("caller.key"))
    }

    /// A certificate from the same CA for another name (a consumer's), and its key.
    pub fn stranger(&self) -> (PathBuf, PathBuf) {
        (self.dir.join("stranger.crt"), self.dir.join("stranger.key"))
    }
}

/// Registers the webhook on `api` as deploy/ does, its Service resolved by an EndpointSlice
/// to `address:port` (where its pod listens), in namespace [`names::DEFAULT_NAMESPACE`]
/// (which must exist).
pub fn register(api: &ApiServer, address: &str, port: u16) -> Result<()> {
    let ns = names::DEFAULT_NAMESPACE;
    let service = names::webhook::SHADOWPODS_SERVICE;
    let objects = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": service, "namespace": ns},
         "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": service, "namespace": ns,
                      "labels": {"kubernetes.io/service-name": service}},
         "addressType": "IPv4",
         "endpoints": [{"addresses": [address], "conditions": {"ready": true}}],
         "ports": [{"name": "https", "port": port, "protocol": "TCP"}]},
    ]});
    let mut docs = vec![objects];
    for yaml in [deployed_config()?, deployed_pods_config()?] {
        docs.push(serde_saphyr::from_str(&yaml).context("deploy/'s webhook configuration")?);
    }
    crate::kube_sync::apply(&api.kubeconfig, "fabric-tests", true, &docs)
        .context("registering the webhook")
}

/// The webhook's arguments (after the binary): listening on `listen`, letting in the API
/// server's certificate of `caller`.
pub fn args(listen: &str, caller: &Caller) -> Vec<String> {
    vec![
        "shadowpod-webhook".to_owned(),
        "--listen".to_owned(),
        listen.to_owned(),
        "--client-ca".to_owned(),
        caller.ca().display().to_string(),
    ]
}

/// Waits until the webhook (logging to `log`) has put its CA into both configurations'
/// caBundle: from then on the API server calls it.
pub fn wait_ready(api: &ApiServer, log: &Path) -> Result<()> {
    try_eventually_blocking("the webhook's caBundle", Duration::from_secs(30), || {
        published(api).then_some(())
    })
    .map_err(|e| {
        anyhow::anyhow!(
            "{e}; its log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        )
    })
}

/// Whether the webhook's CA is in both configurations' caBundle.
fn published(api: &ApiServer) -> bool {
    let published = |kind: &str, name: &str| {
        let o = api.kubectl(&[
            "get",
            kind,
            name,
            "-o",
            "jsonpath={.webhooks[0].clientConfig.caBundle}",
        ]);
        o.status.success() && !o.stdout.is_empty()
    };
    published(
        "validatingwebhookconfiguration",
        names::webhook::SHADOWPODS_CONFIG,
    ) && published("mutatingwebhookconfiguration", names::webhook::PODS_CONFIG)
}

/// Starts the webhook for `api` (started with `caller`'s [`Caller::kubelite_args`]) on the
/// host loopback, registered by [`register`], logging to `log`; returns once it has put its CA
/// into the configuration's caBundle. The process dies with the returned guard.
pub fn start(api: &ApiServer, caller: &Caller, log: &Path) -> Result<ChildGuard> {
    // As its pod: its ServiceAccount's token, with the rights deploy/ gives it.
    let kubeconfig = crate::rights::component_kubeconfig(
        api,
        "fabric-shadowpod-webhook",
        log.with_extension("kubeconfig"),
    )?;
    // The port is free when looked at, not when the webhook binds it: a test beside this one
    // may take it in between (an API server's etcd), and the webhook then exits before it
    // publishes its CA. Then it starts again on another.
    let mut tries = 3;
    loop {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        register(api, "127.0.0.1", port)?;
        let mut child = Bin::new("fabric-controller")?
            .args(args(&format!("127.0.0.1:{port}"), caller))
            .kubeconfig(&kubeconfig)
            .log(log)
            .spawn()?;
        match ready_or_exited(api, log, &mut child)? {
            None => return Ok(child),
            Some(e) if tries > 1 => {
                tries -= 1;
                eprintln!("the webhook did not start on port {port}, trying another: {e}");
            }
            Some(e) => return Err(e),
        }
    }
}

/// [`wait_ready`] while `child` runs: `None` once the webhook is ready, why it exited if it
/// did first.
fn ready_or_exited(
    api: &ApiServer,
    log: &Path,
    child: &mut ChildGuard,
) -> Result<Option<anyhow::Error>> {
    let mut exited = None;
    let waited = try_eventually_blocking("the webhook's caBundle", Duration::from_secs(30), || {
        if let Ok(Some(st)) = child.0.try_wait() {
            exited = Some(st);
            return Some(());
        }
        published(api).then_some(())
    });
    let log_text = || std::fs::read_to_string(log).unwrap_or_default();
    match (waited, exited) {
        (_, Some(st)) => Ok(Some(anyhow::anyhow!(
            "the webhook exited ({st}); its log:\n{}",
            log_text()
        ))),
        (Ok(()), None) => Ok(None),
        (Err(e), None) => Err(anyhow::anyhow!("{e}; its log:\n{}", log_text())),
    }
}
