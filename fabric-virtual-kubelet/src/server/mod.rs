//! The kubelet API of the virtual node: what the consumer's API server calls for `kubectl
//! logs`, `exec`, `attach` and `port-forward` on a pod bound to this node (the Node's InternalIP
//! and `daemonEndpoints.kubeletEndpoint.Port`), served over HTTPS and carried to the pod's
//! real pod on the provider with the consumer's identity (the identity Secret's kubeconfig):
//!
//! - `containerLogs` becomes the provider's `pods/log` with the same options, its body streamed
//!   back as it comes (a `-f` lasts as long as the client and the container do: no idle
//!   timeout here; the provider's client has no read timeout either).
//! - `exec`, `attach` and `portForward` are HTTP upgrades (SPDY/3.1 from an API server; the
//!   consumer's API server translates kubectl's WebSocket to SPDY): the same upgrade is made
//!   to the provider's `pods/exec|attach|portforward`, whose API server passes it on to its
//!   kubelet, and once both sides switched protocols the two connections are joined byte for
//!   byte. The kubelet at the far end and the client at this end speak the stream protocol to
//!   each other, so stdin and its end, stdout, stderr, terminal resizes, the exit status on the
//!   error stream and every port-forward stream pair arrive as the kubelet sent them; closing
//!   either end closes the other.
//!
//! Only pods bound to this virtual node are served, and only through the ShadowPod made for
//! that very pod (same uid) in the consumer's tenant namespace: the provider paths are built
//! from the tenant namespace and the ShadowPod's name, never from the request. Anything else
//! is a 404 saying why. [`route`] holds those decisions (pure); [`proxy`] the requests.
pub mod proxy;
pub mod route;

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use anyhow::{Context as _, Result};
use hyper::{server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};
use tokio::{net::TcpListener, sync::Semaphore};
use tracing::{debug, info, warn};

/// Connections served at once (each exec or port-forward session holds one).
const MAX_CONNECTIONS: usize = 256;
/// How long a connection may take to send its request headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where and how the kubelet API is served.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    /// Serving certificate and key (PEM files); None: a self-signed one for `sans`, as a
    /// kubelet makes without one (API servers do not verify kubelets unless told to).
    pub cert: Option<(PathBuf, PathBuf)>,
    pub sans: Vec<String>,
    /// CA (PEM file) of the client certificates allowed in: the API server's kubelet client
    /// certificate (`--kubelet-client-certificate`) chains to it. None: any client.
    pub client_ca: Option<PathBuf>,
    /// The VirtualNode this process stands for, and its namespace (the identity Secret's).
    pub virtual_node: String,
    pub namespace: String,
}

fn tls(c: &Config) -> Result<rustls::ServerConfig> {
    let (certs, key) = match &c.cert {
        Some((cert, key)) => (
            CertificateDer::pem_file_iter(cert)
                .with_context(|| format!("reading {}", cert.display()))?
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("parsing {}", cert.display()))?,
            PrivateKeyDer::from_pem_file(key)
                .with_context(|| format!("reading {}", key.display()))?,
        ),
        None => {
            let ck = rcgen::generate_simple_self_signed(c.sans.clone())
                .context("generating a self-signed serving certificate")?;
            (
                vec![ck.cert.der().clone()],
                PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into()),
            )
        }
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS versions")?;
    let builder = match &c.client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(path)
                .with_context(|| format!("reading {}", path.display()))?
            {
                roots
                    .add(cert.with_context(|| format!("parsing {}", path.display()))?)
                    .with_context(|| format!("a CA of {}", path.display()))?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .context("the client certificate verifier")?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .context("serving certificate")?;
    // Upgrades (exec, port-forward) are HTTP/1.1's.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Serves the kubelet API for ever; a port that cannot be bound (taken by another process) is
/// retried, since the node's registration and heartbeat go on without it.
pub async fn serve(local: kube::Client, config: Config) -> Result<()> {
    if config.client_ca.is_none() {
        warn!(
            "no --client-ca-file: the kubelet API accepts any client that reaches {} (give it \
             the CA of the API server's kubelet client certificate)",
            config.listen
        );
    }
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls(&config)?));
    let listener = loop {
        match TcpListener::bind(config.listen).await {
            Ok(l) => break l,
            Err(e) => {
                warn!(address = %config.listen, error = %e, "cannot serve the kubelet API yet; retrying");
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
        }
    };
    info!(address = %config.listen, "serving the kubelet API");
    let proxy = Arc::new(proxy::Proxy::new(local, &config));
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = slots.clone().acquire_owned().await.expect("never closed");
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "accept");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (acceptor, proxy) = (acceptor.clone(), proxy.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return debug!(%peer, error = %e, "TLS handshake"),
                Err(_) => return debug!(%peer, "TLS handshake timed out"),
            };
            let svc = service_fn(move |req| {
                let proxy = proxy.clone();
                async move { Ok::<_, std::convert::Infallible>(proxy.handle(req).await) }
            });
            if let Err(e) = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), svc)
                .with_upgrades()
                .await
            {
                debug!(%peer, error = %e, "connection");
            }
        });
    }
}
