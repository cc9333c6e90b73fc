//! The provider's authentication service (`fabric-controller auth`) run against a test API
//! server on the host loopback, for the sharing layer's tests: consumers reach it and the
//! provider's API server at 127.0.0.1 (the API server URL handed out is the host kubeconfig's).
use std::{
    net::TcpStream,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};

use crate::{
    ChildGuard, apiserver::ApiServer, manifests::Container, process::Bin, wait::try_eventually,
};

/// Creates namespaces fabric-system (with the `fabric-cluster` ConfigMap naming `cluster_id`,
/// what `fabricctl` reads to know which cluster it is on), the peering tokens' and the
/// identities'.
pub fn prepare_cluster(api: &ApiServer, cluster_id: &str) {
    let ns = fabric_api::names::DEFAULT_NAMESPACE;
    // With the peering tokens' and the identities' namespaces, as deploy/ creates them.
    api.create_namespaces(&[
        ns,
        fabric_api::names::namespace::PEERING_TOKENS,
        fabric_api::names::namespace::IDENTITIES,
    ]);
    api.create_config_map(
        ns,
        fabric_api::names::config_map::CLUSTER,
        &[
            ("FABRIC_CLUSTER_ID", cluster_id),
            ("FABRIC_POD_CIDR", "10.244.0.0/16"),
            ("FABRIC_SERVICE_CIDR", "10.96.0.0/12"),
            ("FABRIC_EXTERNAL_CIDR", "10.70.0.0/16"),
        ],
    );
}

/// The API server URL and CA file of a kubeconfig's current cluster.
pub fn api_server_of(kubeconfig: &Path) -> Result<(String, PathBuf)> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let cluster = kc
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .context("kubeconfig without a cluster")?;
    Ok((
        cluster.server.clone().context("no server")?,
        cluster
            .certificate_authority
            .clone()
            .context("no certificate-authority file")?
            .into(),
    ))
}

/// Asserts that the provider (client `p`) made nothing for consumer `id`: no Tenant, no CSR,
/// and no tenant namespace unless `namespace_was_there` (the test made it itself).
pub async fn nothing_made_for(p: &kube::Client, id: &str, namespace_was_there: bool) {
    use fabric_api::{authentication::v1alpha1::Tenant, names};
    use k8s_openapi::api::{certificates::v1::CertificateSigningRequest, core::v1::Namespace};
    use kube::{Api, api::ListParams};
    let ns = names::namespace::tenant(id);
    if !namespace_was_there {
        let namespace = Api::<Namespace>::all(p.clone()).get_opt(&ns).await.unwrap();
        assert!(namespace.is_none(), "namespace {ns} was created");
    }
    let tenant = Api::<Tenant>::namespaced(p.clone(), &ns)
        .get_opt(id)
        .await
        .unwrap();
    assert!(tenant.is_none(), "Tenant {id} was created");
    let csrs = Api::<CertificateSigningRequest>::all(p.clone())
        .list(&ListParams::default().labels(&format!("{}={id}", names::label::REMOTE_CLUSTER)))
        .await
        .unwrap();
    assert!(csrs.items.is_empty(), "a CSR for {id} was created");
}

/// An HTTP/1.1 answer read to the end of the stream (the service closes each connection),
/// waiting at most `timeout`: its status (0 when none came) and body.
pub async fn read_answer(
    s: &mut (impl tokio::io::AsyncRead + Unpin),
    timeout: Duration,
) -> (u16, String) {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(timeout, s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// A running authentication service.
pub struct AuthService {
    /// `https://127.0.0.1:PORT`
    pub url: String,
    /// The pin of its (self-signed) certificate.
    pub pin: String,
    pub log: PathBuf,
    _child: ChildGuard,
    /// The approver of its CSRs (`fabric-controller csr-approver`, as fabric-sharing's
    /// ServiceAccount), when this service's tests run no `sharing`, which approves them too.
    _approver: Option<ChildGuard>,
}

impl AuthService {
    /// Starts the service of `cluster_id` against `provider` (its CRDs installed and
    /// [`prepare_cluster`] done), with the approver of its CSRs, and waits until it listens.
    pub async fn start(provider: &ApiServer, cluster_id: &str) -> Result<Self> {
        Self::start_as(provider, cluster_id, None, true).await
    }

    /// [`AuthService::start`], run as `container` of deploy/ runs (its user, groups and
    /// capabilities) when given; without an approver unless `approver` (a `sharing` the
    /// caller runs approves its CSRs).
    pub async fn start_as(
        provider: &ApiServer,
        cluster_id: &str,
        container: Option<&Container>,
        approver: bool,
    ) -> Result<Self> {
        let (api_url, ca) = api_server_of(&provider.kubeconfig)?;
        let log = fabric_netns::testbed::scratch_dir(&format!("auth-{cluster_id}.log"));
        // The cluster CA, which signs the consumers' certificates, where the API server
        // publishes it: the service verifies renewals against it, as deploy/ runs it.
        provider.publish_client_ca()?;
        // As its pod: the token of its ServiceAccount, with the rights deploy/ gives it.
        let kubeconfig = crate::rights::component_kubeconfig(
            provider,
            "fabric-auth",
            fabric_netns::testbed::scratch_dir(&format!("auth-{cluster_id}.kubeconfig")),
        )?;
        // The port is free when looked at, not when the service binds it: a test beside this
        // one may take it in between (an API server's etcd). The service then exits, and
        // starts again on another port.
        let mut tries = 3;
        let (port, child) = loop {
            let port = std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            let bin = match container {
                Some(container) => Bin::as_container("fabric-controller", container)?,
                None => Bin::new("fabric-controller")?,
            };
            let mut child = bin
                .kubeconfig(&kubeconfig)
                .args(["auth", "--cluster-id", cluster_id])
                .args(["--listen", &format!("127.0.0.1:{port}")])
                .args(["--api-server-url", &api_url])
                .arg("--api-server-ca")
                .arg(&ca)
                .args(["--tls-hosts", "127.0.0.1", "--certificate-ttl", "1h"])
                .log(&log)
                .spawn()?;
            // Exited (and then why), or listening: exited is asked first, so that another
            // process holding the port is not taken for the service.
            let exited = try_eventually(
                "fabric-controller auth listening",
                Duration::from_secs(30),
                || {
                    let r = match child.0.try_wait().ok().flatten() {
                        Some(status) => Some(Some(status)),
                        None => TcpStream::connect(("127.0.0.1", port))
                            .is_ok()
                            .then_some(None),
                    };
                    async move { r }
                },
            )
            .await?;
            match exited {
                None => break (port, child),
                Some(status) if tries > 1 => {
                    tries -= 1;
                    eprintln!(
                        "fabric-controller auth exited ({status}) on port {port}, trying another: {}",
                        std::fs::read_to_string(&log).unwrap_or_default()
                    );
                }
                Some(status) => bail!(
                    "fabric-controller auth exited ({status}): {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                ),
            }
        };
        let approver = match approver {
            false => None,
            true => {
                let kubeconfig = crate::rights::component_kubeconfig(
                    provider,
                    "fabric-sharing",
                    fabric_netns::testbed::scratch_dir(&format!(
                        "approver-{cluster_id}.kubeconfig"
                    )),
                )?;
                Some(
                    Bin::new("fabric-controller")?
                        .kubeconfig(&kubeconfig)
                        .args(["csr-approver", "--consumer-certificate-max-ttl", "1h"])
                        .log(log.with_extension("approver.log"))
                        .spawn()?,
                )
            }
        };
        let pin = fabric_auth::run::published_pin(
            &provider.client().await,
            fabric_api::names::DEFAULT_NAMESPACE,
        )
        .await?
        .context("the service listens but published no certificate")?;
        Ok(Self {
            url: format!("https://127.0.0.1:{port}"),
            pin,
            log,
            _child: child,
            _approver: approver,
        })
    }

    /// The service's process id (for its memory).
    pub fn pid(&self) -> Option<u32> {
        Some(self._child.0.id())
    }

    /// What the service (and its approver) logged so far.
    pub fn logs(&self) -> String {
        let approver = std::fs::read_to_string(self.log.with_extension("approver.log"))
            .map(|l| format!("\n--- approver ---\n{l}"))
            .unwrap_or_default();
        std::fs::read_to_string(&self.log).unwrap_or_default() + &approver
    }
}

impl Drop for AuthService {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.log);
        let _ = std::fs::remove_file(self.log.with_extension("approver.log"));
    }
}
