//! The kubelet API of the test node, over HTTPS on the node's address: `GET
//! /containerLogs/NS/POD/CONTAINER` (with `follow`, `tailLines`, `sinceSeconds`/`sinceTime`,
//! `timestamps`, `previous`, `limitBytes`), which the API server proxies `kubectl logs` to,
//! `/exec`, `/attach` and `/portForward` (see [`super::stream`]), and `/healthz`. The serving certificate is the one given, or a self-signed one for the
//! node's address and name, as the kubelet makes when it has none (the API server does not
//! verify kubelets by default).
use std::{convert::Infallible, net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use anyhow::{Context as _, Result};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, StreamBody, combinators::BoxBody};
use hyper::{Request, Response, StatusCode, body::Frame, service::service_fn};
use k8s_openapi::jiff::Timestamp;
use tokio::{io::AsyncReadExt as _, net::TcpListener, sync::mpsc};
use tracing::{debug, warn};

use super::{
    logs::{Entry, Query, decode_lines},
    pods::{LogIndex, LogRef},
};

pub(super) type Body = BoxBody<Bytes, Infallible>;

/// PEM files of a serving certificate and its key; None: self-signed.
pub struct Tls {
    pub cert: Option<(PathBuf, PathBuf)>,
    /// Names and addresses of the self-signed certificate.
    pub sans: Vec<String>,
}

fn tls_config(tls: &Tls) -> Result<rustls::ServerConfig> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};
    let (certs, key) = match &tls.cert {
        Some((c, k)) => (
            CertificateDer::pem_file_iter(c)
                .with_context(|| format!("reading {}", c.display()))?
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("parsing {}", c.display()))?,
            PrivateKeyDer::from_pem_file(k).with_context(|| format!("reading {}", k.display()))?,
        ),
        None => {
            let ck = rcgen::generate_simple_self_signed(tls.sans.clone())
                .context("generating a self-signed serving certificate")?;
            (
                vec![ck.cert.der().clone()],
                PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into()),
            )
        }
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("serving certificate")
}

/// Serves the kubelet API on `addr` for ever.
pub async fn serve(addr: SocketAddr, tls: Tls, logs: LogIndex) -> Result<()> {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls_config(&tls)?));
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr}"))?;
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "accept");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (acceptor, logs) = (acceptor.clone(), logs.clone());
        tokio::spawn(async move {
            let stream = match acceptor.accept(tcp).await {
                Ok(s) => s,
                Err(e) => {
                    debug!(%peer, error = %e, "TLS handshake");
                    return;
                }
            };
            let svc = service_fn(move |req| {
                let logs = logs.clone();
                async move { Ok::<_, Infallible>(handle(req, logs).await) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                .with_upgrades()
                .await
            {
                debug!(%peer, error = %e, "connection");
            }
        });
    }
}

fn plain(code: StatusCode, text: impl Into<String>) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "text/plain")
        .body(Full::new(Bytes::from(text.into())).boxed())
        .expect("a valid response")
}

async fn handle(req: Request<hyper::body::Incoming>, logs: LogIndex) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or_default().to_owned();
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    // The streaming requests come as upgrades, with POST (exec, attach) or GET.
    let streaming = matches!(parts.first(), Some(&"exec" | &"attach" | &"portForward"));
    let method_ok =
        req.method() == hyper::Method::GET || (streaming && req.method() == hyper::Method::POST);
    if !method_ok {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "only GET is served");
    }
    if path == "/healthz" {
        return plain(StatusCode::OK, "ok");
    }
    match parts.as_slice() {
        ["exec", ns, pod, ctr] => super::stream::exec(req, &logs, ns, pod, ctr, &query).await,
        ["attach", ns, pod, ctr] => super::stream::attach(ns, pod, ctr),
        ["portForward", ns, pod] => super::stream::port_forward(req, &logs, ns, pod).await,
        ["containerLogs", ns, pod, ctr] => {
            let q = match Query::parse(&query, Timestamp::now()) {
                Ok(q) => q,
                Err(e) => return plain(StatusCode::BAD_REQUEST, e.to_string()),
            };
            let key = (ns.to_string(), pod.to_string(), ctr.to_string());
            let found = logs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&key)
                .cloned();
            let Some(lr) = found else {
                return plain(
                    StatusCode::NOT_FOUND,
                    format!("container {ctr} of pod {ns}/{pod} not found on this node"),
                );
            };
            let run = if q.previous { lr.run - 1 } else { lr.run };
            if run < 0 || !lr.file(run).exists() {
                return plain(
                    StatusCode::BAD_REQUEST,
                    format!("previous terminated container {ctr} in pod {pod} not found"),
                );
            }
            let (tx, rx) = mpsc::channel::<Bytes>(16);
            tokio::spawn(stream_log(lr, run, q, key, logs, tx));
            let body = StreamBody::new(futures::stream::unfold(rx, |mut rx| async move {
                rx.recv()
                    .await
                    .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
            }));
            Response::builder()
                .header("content-type", "text/plain")
                .body(body.boxed())
                .expect("a valid response")
        }
        _ => plain(StatusCode::NOT_FOUND, format!("{path} is not served")),
    }
}

/// Sends the selected lines of run `run`, then, with `follow`, what is appended while that run
/// is the container's current one and alive.
async fn stream_log(
    lr: LogRef,
    run: i32,
    q: Query,
    key: (String, String, String),
    logs: LogIndex,
    tx: mpsc::Sender<Bytes>,
) {
    let Ok(mut f) = tokio::fs::File::open(lr.file(run)).await else {
        return;
    };
    let mut budget = q.limit_bytes.unwrap_or(usize::MAX);
    let mut buf = Vec::new();
    if f.read_to_end(&mut buf).await.is_err() {
        return;
    }
    let (entries, used) = decode_lines(&buf);
    buf.drain(..used);
    if !send(&tx, q.select(&entries), q.timestamps, &mut budget).await || !q.follow || budget == 0 {
        return;
    }
    loop {
        let live = logs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .is_some_and(|l| l.run == run && l.running);
        let n = match f.read_to_end(&mut buf).await {
            Ok(n) => n,
            Err(_) => return,
        };
        let (entries, used) = decode_lines(&buf);
        buf.drain(..used);
        let new: Vec<Entry> = entries.into_iter().filter(|e| q.admits(e)).collect();
        if !send(&tx, &new, q.timestamps, &mut budget).await || budget == 0 {
            return;
        }
        // Everything written before the run ended has been read: the follow is over.
        if !live && n == 0 {
            return;
        }
        if n == 0 {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                _ = tx.closed() => return,
            }
        }
    }
}

/// Sends the rendered lines within what is left of `limitBytes`; false once the client is gone.
async fn send(
    tx: &mpsc::Sender<Bytes>,
    entries: &[Entry],
    timestamps: bool,
    budget: &mut usize,
) -> bool {
    let mut out = Vec::new();
    for e in entries {
        out.extend(e.render(timestamps));
    }
    out.truncate(*budget);
    *budget -= out.len();
    out.is_empty() || tx.send(Bytes::from(out)).await.is_ok()
}
