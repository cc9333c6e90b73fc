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
//! Only clients the kubelet would serve get in, checked as a kubelet with `--client-ca-file`,
//! `--authentication-token-webhook` and `--authorization-mode=Webhook` checks them ([`authn`]
//! and [`authz`], pure; [`access`], their edges): a client certificate signed by the client CA
//! ([`access::ClientCa`]: a file, or the CA the API server publishes in
//! kube-system/extension-apiserver-authentication), or, without a certificate, a bearer token
//! this cluster's API server authenticates (TokenReview; on unless
//! `--authentication-token-webhook=false`); else 401 (or no handshake, for a certificate of
//! another CA). Then the user must be allowed the request's `nodes/proxy` (or finer)
//! subresource of this Node by a SubjectAccessReview, else 403. Nothing of a refused request
//! reaches the provider. Without a client CA nothing is served at all: the API server's own
//! client certificate is the way in.
//!
//! `/metrics` serves the reflectors' metrics (per kind: syncs, failures, retries, queue depth,
//! latency) in the Prometheus text format, as a kubelet serves its own: to users allowed the
//! `nodes/metrics` subresource of this Node (`nodes/proxy` is not enough, as upstream),
//! scraped directly or through the API server's `nodes/NODE/proxy/metrics`.
//!
//! Only pods bound to this virtual node are served, and only through the ShadowPod made for
//! that very pod (same uid) in the consumer's tenant namespace: the provider paths are built
//! from the tenant namespace and the ShadowPod's name, never from the request. Anything else
//! is a 404 saying why. [`route`] holds those decisions (pure); [`proxy`] the requests.
pub mod access;
pub mod authn;
pub mod authz;
pub mod proxy;
pub mod route;
mod ttl_cache;

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, RwLock},
    time::Duration,
};

use anyhow::{Context as _, Result};
use hyper::{server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};
use tokio::{net::TcpListener, sync::Semaphore};
use tracing::{debug, info, warn};

use self::access::ClientCa;

/// Connections served at once (each exec or port-forward session holds one).
const MAX_CONNECTIONS: usize = 256;
/// How long a connection may take to send its request headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the client CA is read again (a rotated CA is taken without a restart), and how
/// soon a missing one is looked for again.
const CA_RELOAD: Duration = Duration::from_secs(60);
const CA_RETRY: Duration = Duration::from_secs(10);

/// Where and how the kubelet API is served.
#[derive(Debug, Clone)]
pub struct Config {
    /// Serving certificate and key (PEM files); None: a self-signed one for `sans`, as a
    /// kubelet makes without one (API servers do not verify kubelets unless told to).
    pub cert: Option<(PathBuf, PathBuf)>,
    pub sans: Vec<String>,
    /// The CA bundle of the client certificates let in: the one the API server's kubelet
    /// client certificate (`--kubelet-client-certificate`) chains to.
    pub client_ca: ClientCa,
    /// How long SubjectAccessReview answers are kept.
    pub authz_ttl: authz::Ttl,
    /// Bearer tokens let in, and how long their TokenReviews are kept; None: only client
    /// certificates.
    pub token_review: Option<Duration>,
    /// The VirtualNode this process stands for, and its namespace (the identity Secret's).
    pub virtual_node: String,
    pub namespace: String,
    /// What `/metrics` serves: the reflectors' metrics.
    pub metrics: Arc<fabric_reflector::Metrics>,
}

/// Where the kubelet API listens.
pub enum Listen {
    /// This address, bound as soon as it can be (another process may hold it for a while).
    At(SocketAddr),
    /// A listener bound already (port 0: the port the system chose is the Node's).
    Bound(TcpListener),
}

/// Binds `addr`, retrying while it is taken: the node's registration and heartbeat go on
/// meanwhile.
async fn bind(addr: SocketAddr) -> TcpListener {
    loop {
        match TcpListener::bind(addr).await {
            Ok(l) => return l,
            Err(e) => {
                warn!(address = %addr, error = %e, "cannot serve the kubelet API yet; retrying");
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
        }
    }
}

/// The serving certificate chain and key.
struct Serving {
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

fn serving(c: &Config) -> Result<Serving> {
    Ok(match &c.cert {
        Some((cert, key)) => Serving {
            certs: CertificateDer::pem_file_iter(cert)
                .with_context(|| format!("reading {}", cert.display()))?
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("parsing {}", cert.display()))?,
            key: PrivateKeyDer::from_pem_file(key)
                .with_context(|| format!("reading {}", key.display()))?,
        },
        None => {
            let ck = rcgen::generate_simple_self_signed(c.sans.clone())
                .context("generating a self-signed serving certificate")?;
            Serving {
                certs: vec![ck.cert.der().clone()],
                key: PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into()),
            }
        }
    })
}

/// The TLS configuration: `serving`, and client certificates verified against `client_ca`
/// (PEM) when one is presented. A client without one completes the handshake and is answered
/// 401, as by a kubelet without anonymous access; one with a certificate the CA did not sign
/// (or that is not for client authentication) fails the handshake.
fn tls(serving: &Serving, client_ca: &str) -> Result<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(client_ca.as_bytes()) {
        roots
            .add(cert.context("parsing the client CA bundle")?)
            .context("a CA of the client CA bundle")?;
    }
    anyhow::ensure!(
        !roots.is_empty(),
        "the client CA bundle holds no certificate"
    );
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider.clone())
            .allow_unauthenticated()
            .build()
            .context("the client certificate verifier")?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_client_cert_verifier(verifier)
        .with_single_cert(serving.certs.clone(), serving.key.clone_key())
        .context("serving certificate")?;
    // Upgrades (exec, port-forward) are HTTP/1.1's.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

type Acceptor = Arc<RwLock<tokio_rustls::TlsAcceptor>>;

/// The client CA as it is now, waiting for it while there is none (nothing is served without
/// one).
async fn first_ca(local: &kube::Client, source: &ClientCa) -> String {
    loop {
        match access::client_ca(local, source).await {
            Ok(pem) => return pem,
            Err(e) => {
                warn!(client_ca = %source, error = %e, "no client CA: the kubelet API is not served until there is one");
                tokio::time::sleep(CA_RETRY).await;
            }
        }
    }
}

/// Reads the client CA again now and then, and takes a changed one for new connections.
async fn follow_ca(
    local: kube::Client,
    source: ClientCa,
    serving: Serving,
    mut current: String,
    acceptor: Acceptor,
) {
    loop {
        tokio::time::sleep(CA_RELOAD).await;
        let pem = match access::client_ca(&local, &source).await {
            Ok(pem) if pem != current => pem,
            Ok(_) => continue,
            Err(e) => {
                warn!(client_ca = %source, error = %e, "reading the client CA again; keeping the last one");
                continue;
            }
        };
        match tls(&serving, &pem) {
            Ok(config) => {
                *acceptor.write().expect("not poisoned") =
                    tokio_rustls::TlsAcceptor::from(Arc::new(config));
                info!(client_ca = %source, "client CA changed: taken");
                current = pem;
            }
            Err(e) => {
                warn!(client_ca = %source, error = %e, "the new client CA is not usable; keeping the last one")
            }
        }
    }
}

/// Serves the kubelet API for ever.
pub async fn serve(local: kube::Client, config: Config, listen: Listen) -> Result<()> {
    let serve_cert = serving(&config)?;
    let ca = first_ca(&local, &config.client_ca).await;
    let acceptor: Acceptor = Arc::new(RwLock::new(tokio_rustls::TlsAcceptor::from(Arc::new(
        tls(&serve_cert, &ca).with_context(|| format!("client CA {}", config.client_ca))?,
    ))));
    tokio::spawn(follow_ca(
        local.clone(),
        config.client_ca.clone(),
        serve_cert,
        ca,
        acceptor.clone(),
    ));
    let listener = match listen {
        Listen::At(addr) => bind(addr).await,
        Listen::Bound(l) => l,
    };
    let address = listener.local_addr().context("the kubelet API's address")?;
    info!(%address, client_ca = %config.client_ca, "serving the kubelet API");
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
        let acceptor = acceptor.read().expect("not poisoned").clone();
        let proxy = proxy.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return debug!(%peer, error = %e, "TLS handshake"),
                Err(_) => return debug!(%peer, "TLS handshake timed out"),
            };
            // Verified against the client CA by the handshake; its subject is the user.
            let client = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|leaf| authz::user(leaf));
            let client = Arc::new(client);
            let svc = service_fn(move |req| {
                let (proxy, client) = (proxy.clone(), client.clone());
                async move {
                    Ok::<_, std::convert::Infallible>(proxy.handle(client.as_ref(), req).await)
                }
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
