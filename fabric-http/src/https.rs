//! The HTTPS server of the ports that others reach (feature `tls`): the authentication
//! service and the ShadowPod admission webhook on a provider, the virtual kubelet's kubelet
//! API on a consumer. TLS (rustls with ring, as kube's client uses), HTTP/1.1, and the limits
//! such a port needs: a connection gets a deadline for its TLS handshake and for its request
//! headers; at most `max_connections` are served at once (the others wait in the listen
//! backlog), and one client address may hold at most `max_pending_per_peer` of them before it has
//! sent a whole request (further ones are closed at once: a crowd of silent connections from
//! one place cannot take every slot while the legitimate client waits for the deadlines);
//! `accept` failures back off instead of spinning. How a connection's requests are
//! served is its [`Exchange`]: one request within a deadline for the whole exchange, or
//! keep-alive and HTTP upgrades for streams (exec, port-forward) that last as long as both
//! ends. Reading a body ([`read_body`]) has its own deadline and a size cap. What to answer is
//! the handler's business.
//!
//! The TLS configuration is asked for at each new connection, so a renewed certificate or a
//! rotated client CA is taken without a restart, and the client's certificate (verified by
//! the handshake against the configuration's client CA, when it has one) reaches the handler.
use std::{
    collections::{HashMap, hash_map::Entry},
    convert::Infallible,
    future::Future,
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::{Request, Response, body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::{
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
};
use tokio::{net::TcpListener, sync::Semaphore};
use tokio_rustls::TlsAcceptor;
use tracing::{debug, warn};

use crate::ACCEPT_BACKOFF;

/// What the server tolerates from clients.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections served at once; further ones wait in the listen backlog.
    pub max_connections: usize,
    pub handshake_timeout: Duration,
    pub header_timeout: Duration,
    /// For [`read_body`], by the handler.
    pub body_timeout: Duration,
    /// The whole exchange, the handler's work included ([`Exchange::Once`] only).
    pub request_timeout: Duration,
    /// Connections from one client address that have not sent a whole request yet (in their
    /// TLS handshake or their headers); beyond, a new one is closed at once. None (the
    /// default): no cap of its own, for a port reached through a proxy or a load balancer,
    /// where one address is many clients.
    pub max_pending_per_peer: Option<usize>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 32,
            handshake_timeout: Duration::from_secs(5),
            header_timeout: Duration::from_secs(5),
            body_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(60),
            max_pending_per_peer: None,
        }
    }
}

/// Connections per client address that have not sent a whole request yet.
#[derive(Debug, Default)]
struct Pending(Mutex<HashMap<IpAddr, usize>>);

impl Pending {
    /// A place for one more connection from `peer`, unless it holds `max` already.
    fn enter(self: &Arc<Self>, peer: IpAddr, max: usize) -> Option<Waiting> {
        let peer = peer.to_canonical();
        let mut counts = self.0.lock().expect("not poisoned");
        let n = counts.entry(peer).or_default();
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(Waiting {
            pending: self.clone(),
            peer,
        })
    }

    #[cfg(test)]
    fn of(&self, peer: IpAddr) -> usize {
        let counts = self.0.lock().expect("not poisoned");
        counts.get(&peer.to_canonical()).copied().unwrap_or(0)
    }
}

/// A connection's place among its address's pending ones, given back when dropped.
#[derive(Debug)]
struct Waiting {
    pending: Arc<Pending>,
    peer: IpAddr,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut counts = self.pending.0.lock().expect("not poisoned");
        if let Entry::Occupied(mut e) = counts.entry(self.peer) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }
}

/// How a connection's requests are served once its handshake is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exchange {
    /// One request per connection (no keep-alive), within [`Limits::request_timeout`].
    Once,
    /// Keep-alive and HTTP upgrades, with no deadline past the headers: a stream (logs `-f`,
    /// exec, port-forward) lasts as long as both ends do.
    Streams,
}

/// Why a body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("the request body did not arrive within {0:?}")]
    Timeout(Duration),
    #[error("the request body is larger than {0} bytes")]
    TooLarge(usize),
    #[error("reading the request body: {0}")]
    Read(String),
}

/// The body of `req`, at most `max` bytes, within `timeout`.
pub async fn read_body(body: Incoming, max: usize, timeout: Duration) -> Result<Bytes, BodyError> {
    match tokio::time::timeout(timeout, Limited::new(body, max).collect()).await {
        Err(_) => Err(BodyError::Timeout(timeout)),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            Err(BodyError::TooLarge(max))
        }
        Ok(Err(e)) => Err(BodyError::Read(e.to_string())),
        Ok(Ok(b)) => Ok(b.to_bytes()),
    }
}

/// The JSON media type.
pub const JSON: &str = "application/json";

/// Whether `content_type` (a header value) is JSON, parameters (`; charset=utf-8`) aside.
pub fn is_json(content_type: Option<&str>) -> bool {
    content_type
        .and_then(|c| c.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case(JSON))
}

/// A TLS configuration that cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("no certificate in the PEM")]
    NoCertificate,
    #[error("the PEM does not parse: {0}")]
    Pem(#[from] rustls::pki_types::pem::Error),
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("the client CA: {0}")]
    ClientCa(String),
}

/// The crypto of every TLS connection here: ring, as kube's own client uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The server side: serves `cert_pem` (chain) with `key_pem`, HTTP/1.1 only (upgrades are
/// HTTP/1.1's). With `client_ca` (PEM), a client certificate chaining to it is asked for but
/// not required: a client without one completes the handshake (the handler decides what it
/// may do), one with a certificate the CA did not sign fails it.
pub fn server_config(
    cert_pem: &str,
    key_pem: &str,
    client_ca: Option<&str>,
) -> Result<rustls::ServerConfig, TlsError> {
    let certs =
        CertificateDer::pem_slice_iter(cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>()?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate);
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                roots.add(cert?)?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                roots.into(),
                provider(),
            )
            .allow_unauthenticated()
            .build()
            .map_err(|e| TlsError::ClientCa(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Serves `handler` on `listener` with the TLS configuration `tls` (asked for at each new
/// connection) until the task is dropped. `name` labels the logs. The handler gets the
/// request and the client's TLS certificate (DER) when it presented one.
pub async fn serve<T, H, F, B>(
    name: &'static str,
    listener: TcpListener,
    tls: T,
    limits: Limits,
    exchange: Exchange,
    handler: H,
) where
    T: Fn() -> Arc<rustls::ServerConfig> + Send + Sync + 'static,
    H: Fn(Request<Incoming>, Option<Vec<u8>>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let handler = Arc::new(handler);
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let pending = Arc::new(Pending::default());
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "{name}: accept failed; backing off");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let max = limits.max_pending_per_peer.unwrap_or(usize::MAX).max(1);
        let Some(waiting) = pending.enter(peer.ip(), max) else {
            debug!(%peer, "{name}: too many connections from this address without a request; closed");
            continue;
        };
        let handler = handler.clone();
        let acceptor = TlsAcceptor::from(tls());
        tokio::spawn(async move {
            let _slot = slot;
            let stream =
                match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(stream)).await
                {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        debug!(%peer, error = %e, "{name}: TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        debug!(%peer, "{name}: TLS handshake timed out");
                        return;
                    }
                };
            let client_cert = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|c| c.as_ref().to_vec());
            // Its place among the pending is given back with its first whole request.
            let waiting = Mutex::new(Some(waiting));
            let service = service_fn(move |req| {
                waiting.lock().expect("not poisoned").take();
                let handler = handler.clone();
                let client_cert = client_cert.clone();
                async move { Ok::<_, Infallible>(handler(req, client_cert).await) }
            });
            let mut http = http1::Builder::new();
            http.timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout);
            let io = TokioIo::new(stream);
            let done = match exchange {
                Exchange::Once => {
                    let conn = http.keep_alive(false).serve_connection(io, service);
                    match tokio::time::timeout(limits.request_timeout, conn).await {
                        Ok(done) => done,
                        Err(_) => return debug!(%peer, "{name}: connection timed out"),
                    }
                }
                Exchange::Streams => http.serve_connection(io, service).with_upgrades().await,
            };
            if let Err(e) = done {
                debug!(%peer, error = %e, "{name}: connection");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use http_body_util::Full;
    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt},
        net::TcpStream,
    };

    use super::*;

    fn self_signed() -> (String, String) {
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        (ck.cert.pem(), ck.signing_key.serialize_pem())
    }

    /// A client trusting `server_cert`, presenting `identity` when given.
    fn client(server_cert: &str, identity: Option<(&str, &str)>) -> tokio_rustls::TlsConnector {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(server_cert.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let b = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let config = match identity {
            None => b.with_no_client_auth(),
            Some((cert, key)) => b
                .with_client_auth_cert(
                    CertificateDer::pem_slice_iter(cert.as_bytes())
                        .collect::<Result<Vec<_>, _>>()
                        .unwrap(),
                    PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
                )
                .unwrap(),
        };
        tokio_rustls::TlsConnector::from(Arc::new(config))
    }

    /// Serves, answering each request with the length of the client's certificate (0: none).
    async fn start(
        config: rustls::ServerConfig,
        limits: Limits,
        exchange: Exchange,
    ) -> std::net::SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let config = Arc::new(config);
        tokio::spawn(serve(
            "test",
            l,
            move || config.clone(),
            limits,
            exchange,
            |_req, cert: Option<Vec<u8>>| async move {
                let n = cert.map_or(0, |c| c.len());
                Response::new(Full::new(Bytes::from(n.to_string())))
            },
        ));
        addr
    }

    /// Sends `requests` requests on one connection (the last asks to close) and reads what
    /// comes back until the server closes.
    async fn get(
        addr: std::net::SocketAddr,
        connector: &tokio_rustls::TlsConnector,
        requests: usize,
    ) -> String {
        get_on(TcpStream::connect(addr).await.unwrap(), connector, requests).await
    }

    /// [`get`] on a connection made already.
    async fn get_on(
        tcp: TcpStream,
        connector: &tokio_rustls::TlsConnector,
        requests: usize,
    ) -> String {
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut s = connector.connect(name, tcp).await.unwrap();
        let mut req = "GET / HTTP/1.1\r\nHost: x\r\n\r\n".repeat(requests - 1);
        req.push_str("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        // An unclean close still leaves what was read in `out`.
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn the_client_certificate_reaches_the_handler() {
        let (cert, key) = self_signed();
        let (ca, ca_key) = self_signed();
        let addr = start(
            server_config(&cert, &key, Some(&ca)).unwrap(),
            Limits::default(),
            Exchange::Once,
        )
        .await;
        let r = get(addr, &client(&cert, None), 1).await;
        assert!(
            r.starts_with("HTTP/1.1 200 OK\r\n") && r.ends_with("\r\n\r\n0"),
            "{r}"
        );
        // The CA's own (self-signed) certificate chains to it.
        let r = get(addr, &client(&cert, Some((&ca, &ca_key))), 1).await;
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(!r.ends_with("\r\n\r\n0"), "{r}");
    }

    #[tokio::test]
    async fn one_request_per_connection_or_streams() {
        let (cert, key) = self_signed();
        let connector = client(&cert, None);
        let once = start(
            server_config(&cert, &key, None).unwrap(),
            Limits::default(),
            Exchange::Once,
        )
        .await;
        let r = get(once, &connector, 2).await;
        assert_eq!(r.matches("HTTP/1.1 200 OK").count(), 1, "{r}");
        let streams = start(
            server_config(&cert, &key, None).unwrap(),
            Limits::default(),
            Exchange::Streams,
        )
        .await;
        let r = get(streams, &connector, 2).await;
        assert_eq!(r.matches("HTTP/1.1 200 OK").count(), 2, "{r}");
    }

    #[tokio::test]
    async fn a_silent_client_loses_its_slot_at_the_handshake_deadline() {
        let (cert, key) = self_signed();
        let limits = Limits {
            max_connections: 1,
            handshake_timeout: Duration::from_millis(300),
            ..Limits::default()
        };
        let addr = start(
            server_config(&cert, &key, None).unwrap(),
            limits,
            Exchange::Once,
        )
        .await;
        // Takes the only slot and never starts its handshake.
        let mut idle = TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let t0 = Instant::now();
        let r = get(addr, &client(&cert, None), 1).await;
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(
            t0.elapsed() >= Duration::from_millis(200),
            "{:?}",
            t0.elapsed()
        );
        let mut buf = Vec::new();
        let n = tokio::time::timeout(Duration::from_secs(2), idle.read_to_end(&mut buf))
            .await
            .expect("the silent connection is closed")
            .unwrap_or(0);
        assert_eq!(n, 0);
    }

    #[tokio::test]
    async fn one_address_cannot_hold_every_slot_with_silent_connections() {
        let (cert, key) = self_signed();
        let limits = Limits {
            max_connections: 4,
            // Longer than the client below waits: only the cap lets it in.
            handshake_timeout: Duration::from_secs(30),
            max_pending_per_peer: Some(2),
            ..Limits::default()
        };
        let addr = start(
            server_config(&cert, &key, None).unwrap(),
            limits,
            Exchange::Once,
        )
        .await;
        // Four silent connections from 127.0.0.1: two held, two closed at once.
        let mut crowd = Vec::new();
        for _ in 0..4 {
            crowd.push(TcpStream::connect(addr).await.unwrap());
        }
        let mut closed = 0;
        for s in &mut crowd {
            let mut buf = [0u8; 8];
            if let Ok(r) = tokio::time::timeout(Duration::from_millis(500), s.read(&mut buf)).await
            {
                assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");
                closed += 1;
            }
        }
        assert_eq!(closed, 2);
        // Another address is served meanwhile.
        let other = tokio::net::TcpSocket::new_v4().unwrap();
        other.bind(([127, 0, 0, 2], 0).into()).unwrap();
        let tcp = other.connect(addr).await.unwrap();
        let r = get_on(tcp, &client(&cert, None), 1).await;
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
    }

    #[test]
    fn a_pending_place_is_given_back_and_addresses_are_counted_apart() {
        let p = Arc::new(Pending::default());
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = p.enter(a, 2).unwrap();
        let _second = p.enter(mapped, 2).unwrap();
        assert!(
            p.enter(a, 2).is_none(),
            "an IPv4-mapped address is the same client"
        );
        let _other = p.enter(b, 2).unwrap();
        drop(first);
        assert_eq!(p.of(a), 1);
        assert!(p.enter(a, 2).is_some());
    }

    #[test]
    fn json_is_json_whatever_its_parameters() {
        assert!(is_json(Some("application/json")));
        assert!(is_json(Some("Application/JSON; charset=utf-8")));
        assert!(!is_json(Some("text/plain")));
        assert!(!is_json(None));
    }

    #[test]
    fn a_server_config_needs_a_certificate_and_a_usable_client_ca() {
        let (cert, key) = self_signed();
        server_config(&cert, &key, None).unwrap();
        server_config(&cert, &key, Some(&cert)).unwrap();
        assert!(matches!(
            server_config("", &key, None),
            Err(TlsError::NoCertificate)
        ));
        assert!(server_config(&cert, &key, Some("")).is_err());
    }
}
