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
use fabric_http::https::{self, Exchange};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};
use tokio::net::TcpListener;
use tracing::{info, warn};

use self::access::ClientCa;

/// What a client may hold of the server: connections served at once (each exec or
/// port-forward session holds one), and how long its TLS handshake and its request headers
/// may take. Streams have no deadline past that ([`Exchange::Streams`]), and bodies are
/// streamed to the provider, not read here. One address (a pod, a node: anyone who reaches
/// the port) holds at most a quarter of the connections before it has sent a request, so a
/// crowd of silent ones leaves the API server room; the API server's own bursts of new
/// connections stay well under that. (The API server reaches a kubelet directly, never
/// through a proxy that would make many clients one address.)
fn limits() -> https::Limits {
    https::Limits {
        max_connections: 256,
        max_pending_per_peer: Some(64),
        handshake_timeout: Duration::from_secs(10),
        header_timeout: Duration::from_secs(10),
        ..Default::default()
    }
}

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

/// The serving certificate chain and key (PEM).
struct Serving {
    cert: String,
    key: String,
}

/// Read (or made) once at start, where a bad file is reported.
fn serving(c: &Config) -> Result<Serving> {
    let read = |p: &PathBuf| {
        std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
    };
    Ok(match &c.cert {
        Some((cert_path, key_path)) => {
            let (cert, key) = (read(cert_path)?, read(key_path)?);
            CertificateDer::pem_slice_iter(cert.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("parsing {}", cert_path.display()))?;
            PrivateKeyDer::from_pem_slice(key.as_bytes())
                .with_context(|| format!("parsing {}", key_path.display()))?;
            Serving { cert, key }
        }
        None => {
            let ck = rcgen::generate_simple_self_signed(c.sans.clone())
                .context("generating a self-signed serving certificate")?;
            Serving {
                cert: ck.cert.pem(),
                key: ck.signing_key.serialize_pem(),
            }
        }
    })
}

/// The TLS configuration: `serving`, and client certificates verified against `client_ca`
/// (PEM) when one is presented. A client without one completes the handshake and is answered
/// 401, as by a kubelet without anonymous access; one with a certificate the CA did not sign
/// (or that is not for client authentication) fails the handshake.
fn tls(serving: &Serving, client_ca: &str) -> Result<Arc<rustls::ServerConfig>> {
    let cas = CertificateDer::pem_slice_iter(client_ca.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .context("parsing the client CA bundle")?;
    anyhow::ensure!(!cas.is_empty(), "the client CA bundle holds no certificate");
    let config = https::server_config(&serving.cert, &serving.key, Some(client_ca))
        .context("the serving certificate and client CA")?;
    Ok(Arc::new(config))
}

/// The TLS configuration new connections get.
type Current = Arc<RwLock<Arc<rustls::ServerConfig>>>;

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
    config: Current,
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
            Ok(new) => {
                *config.write().expect("not poisoned") = new;
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
    let current: Current = Arc::new(RwLock::new(
        tls(&serve_cert, &ca).with_context(|| format!("client CA {}", config.client_ca))?,
    ));
    tokio::spawn(follow_ca(
        local.clone(),
        config.client_ca.clone(),
        serve_cert,
        ca,
        current.clone(),
    ));
    let listener = match listen {
        Listen::At(addr) => bind(addr).await,
        Listen::Bound(l) => l,
    };
    let address = listener.local_addr().context("the kubelet API's address")?;
    info!(%address, client_ca = %config.client_ca, "serving the kubelet API");
    let proxy = Arc::new(proxy::Proxy::new(local, &config));
    https::serve(
        "kubelet API",
        listener,
        move || current.read().expect("not poisoned").clone(),
        limits(),
        Exchange::Streams,
        move |req, cert| {
            let proxy = proxy.clone();
            async move {
                // Verified against the client CA by the handshake; its subject is the user.
                let client = cert.map(|leaf| authz::user(&leaf));
                proxy.handle(&client, req).await
            }
        },
    )
    .await;
    Ok(())
}
