//! The one HTTP server of the fabric's components: `/metrics`, `/healthz`, `/status` and the
//! like, answered by a plain function of the path. hyper does the protocol; this adds what a
//! port open to a cluster network needs: a cap on concurrent connections, a deadline for the
//! request headers and one for the whole exchange (a client that connects and says nothing
//! holds a slot for the header deadline at most), and no busy loop when `accept` fails (out of
//! file descriptors: it backs off).
//!
//! Its own crate, without kube, because the gateway serves its metrics with it too and does
//! not link the Kubernetes client; the node agent and the controllers use the same server.
//! The HTTPS server of the ports other clusters and API servers reach ([`https`]) is here for
//! the same reason, behind the feature `tls` so that the gateway does not build rustls.
use std::{convert::Infallible, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode, header, server::conn::http1, service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{net::TcpListener, sync::Semaphore};
use tracing::{debug, warn};

#[cfg(feature = "tls")]
pub mod https;

/// Content type of the Prometheus text format.
pub const PROMETHEUS: &str = "text/plain; version=0.0.4";

/// What the server tolerates from clients.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections served at once; further ones wait in the listen backlog.
    pub max_connections: usize,
    /// How long a connection may take to send its request headers.
    pub header_timeout: Duration,
    /// How long a whole connection may last, request and reply.
    pub request_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 32,
            header_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
        }
    }
}

/// An answer: status, content type and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

impl Reply {
    pub fn ok(content_type: &'static str, body: impl Into<String>) -> Self {
        Self {
            status: 200,
            content_type,
            body: body.into(),
        }
    }

    fn plain(status: u16, body: &str) -> Self {
        Self {
            status,
            content_type: "text/plain",
            body: body.to_owned(),
        }
    }
}

/// How long to wait before accepting again after `accept` failed (EMFILE and the like would
/// fail again at once).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

fn respond<H: Fn(&str) -> Option<Reply>>(handler: &H, method: &Method, path: &str) -> Reply {
    if method != Method::GET && method != Method::HEAD {
        return Reply::plain(405, "method not allowed\n");
    }
    handler(path).unwrap_or_else(|| Reply::plain(404, "not found\n"))
}

fn to_response(r: Reply, head: bool) -> Response<Full<Bytes>> {
    let len = r.body.len();
    let body = if head {
        Bytes::new()
    } else {
        Bytes::from(r.body)
    };
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() =
        StatusCode::from_u16(r.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(r.content_type),
    );
    h.insert(header::CONTENT_LENGTH, header::HeaderValue::from(len));
    resp
}

/// Serves `handler` (path -> reply, None: 404) on `listener` until the task is dropped.
pub async fn serve<H>(listener: TcpListener, limits: Limits, handler: H)
where
    H: Fn(&str) -> Option<Reply> + Send + Sync + 'static,
{
    let handler = Arc::new(handler);
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                warn!(error = %e, "metrics server: accept failed; backing off");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                let reply = respond(&*handler, req.method(), req.uri().path());
                let head = req.method() == Method::HEAD;
                async move { Ok::<_, Infallible>(to_response(reply, head)) }
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(limits.request_timeout, conn).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => debug!(error = %e, "metrics server: connection"),
                Err(_) => debug!("metrics server: connection timed out"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt},
        net::TcpStream,
    };

    use super::*;

    async fn start(limits: Limits) -> std::net::SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(serve(l, limits, |path| match path {
            "/metrics" => Some(Reply::ok(PROMETHEUS, "fabric_up 1\n")),
            _ => None,
        }));
        addr
    }

    async fn get(addr: std::net::SocketAddr, req: &str) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn answers_by_path_and_method() {
        let addr = start(Limits::default()).await;
        let r = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(
            r.contains("content-type: text/plain; version=0.0.4\r\n"),
            "{r}"
        );
        assert!(r.ends_with("\r\n\r\nfabric_up 1\n"), "{r}");
        let r = get(addr, "GET /nope HTTP/1.0\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.0 404 Not Found\r\n"), "{r}");
        let r = get(
            addr,
            "POST /metrics HTTP/1.1\r\nHost: x\r\ncontent-length: 0\r\n\r\n",
        )
        .await;
        assert!(r.starts_with("HTTP/1.1 405 "), "{r}");
        let r = get(addr, "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(
            r.starts_with("HTTP/1.1 200 OK\r\n") && r.ends_with("\r\n\r\n"),
            "{r}"
        );
    }

    #[tokio::test]
    async fn a_silent_client_is_dropped_and_frees_its_slot() {
        let limits = Limits {
            max_connections: 1,
            header_timeout: Duration::from_millis(300),
            request_timeout: Duration::from_secs(5),
        };
        let addr = start(limits).await;
        // Takes the only slot and says nothing.
        let mut idle = TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let t0 = Instant::now();
        let r = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        // Served only once the silent one had timed out.
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
        assert!(!String::from_utf8_lossy(&buf[..n]).contains("200 OK"));
    }

    #[tokio::test]
    async fn a_slow_exchange_is_cut_at_the_request_timeout() {
        let limits = Limits {
            max_connections: 4,
            header_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_millis(300),
        };
        let addr = start(limits).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        // Headers dribbling in, never finished.
        s.write_all(b"GET /metrics HTTP/1.1\r\n").await.unwrap();
        let t0 = Instant::now();
        let mut buf = Vec::new();
        tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut buf))
            .await
            .expect("closed by the server")
            .ok();
        assert!(t0.elapsed() < Duration::from_secs(2));
    }
}
