//! The HTTPS edge the provider's ports share (the authentication service, the ShadowPod
//! admission webhook): TLS, HTTP/1.1 without keep-alive, and the limits a port reachable by
//! others needs. A connection gets a deadline for its TLS handshake, for its request headers
//! and for the whole exchange; at most `max_connections` are served at once (the others wait
//! in the listen backlog); `accept` failures back off instead of spinning. Reading a body
//! ([`read_body`]) has its own deadline and a size cap. What to answer is the handler's
//! business.
use std::{convert::Infallible, future::Future, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::{Request, Response, body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{net::TcpListener, sync::Semaphore};
use tokio_rustls::TlsAcceptor;
use tracing::{debug, warn};

/// What the server tolerates from clients.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub handshake_timeout: Duration,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    /// The whole exchange, the handler's work included.
    pub request_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 32,
            handshake_timeout: Duration::from_secs(5),
            header_timeout: Duration::from_secs(5),
            body_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(60),
        }
    }
}

const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

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

/// Serves `handler` on `listener` with the TLS configuration `tls` (read for each new
/// connection, so a renewed certificate is served without a restart) until the task is
/// dropped. `name` labels the logs. The handler gets the request and the client's TLS
/// certificate (DER) when it presented one.
pub async fn serve<T, H, F>(
    name: &'static str,
    listener: TcpListener,
    tls: T,
    limits: Limits,
    handler: H,
) where
    T: Fn() -> Arc<rustls::ServerConfig> + Send + Sync + 'static,
    H: Fn(Request<Incoming>, Option<Vec<u8>>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let handler = Arc::new(handler);
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
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
            let service = service_fn(move |req| {
                let handler = handler.clone();
                let client_cert = client_cert.clone();
                async move { Ok::<_, Infallible>(handler(req, client_cert).await) }
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(limits.request_timeout, conn).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => debug!(%peer, error = %e, "{name}: connection"),
                Err(_) => debug!(%peer, "{name}: connection timed out"),
            }
        });
    }
}
