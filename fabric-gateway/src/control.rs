//! Control-plane listeners: the WireGuard UAPI socket (for `wg`), the fabric
//! control socket (status/reload/config) and the Prometheus endpoint.

use std::{
    io,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    sync::Arc,
};

use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{TcpListener, UnixListener, UnixStream},
};

use fabric_gateway_api::control::{self as api, ControlError, Reply, Request, Response};

use crate::{device::Gateway, status::render_metrics, uapi};

/// Largest request we accept on a unix socket; `wg setconf` for thousands of
/// allowed IPs stays well below this.
const MAX_REQUEST: usize = 1 << 20;

/// A bound unix socket that is unlinked again when dropped.
#[derive(Debug)]
pub struct SocketFile {
    pub path: PathBuf,
    pub listener: UnixListener,
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds `dir/file`, refusing to steal a socket another live process answers on.
pub async fn bind_socket(dir: &Path, file: &str) -> io::Result<SocketFile> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(file);
    if path.exists() {
        if UnixStream::connect(&path).await.is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{} is served by another running process", path.display()),
            ));
        }
        std::fs::remove_file(&path)?;
    }
    let listener = UnixListener::bind(&path)?;
    // Root-only, like the kernel's netlink interface that `wg` normally talks to.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    Ok(SocketFile { path, listener })
}

/// Reads one request terminated by an empty line. None on EOF before any data.
async fn read_request<R: AsyncBufReadExt + Unpin>(r: &mut R) -> io::Result<Option<String>> {
    let mut req = String::new();
    loop {
        let mut line = String::new();
        let n = r.read_line(&mut line).await?;
        if n == 0 {
            return Ok(if req.is_empty() { None } else { Some(req) });
        }
        if line == "\n" {
            return Ok(Some(req));
        }
        req.push_str(&line);
        if req.len() > MAX_REQUEST {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "request too large",
            ));
        }
    }
}

pub async fn serve_uapi(gw: Arc<Gateway>, sock: SocketFile) {
    loop {
        let Ok((stream, _)) = sock.listener.accept().await else {
            continue;
        };
        let gw = gw.clone();
        tokio::spawn(async move {
            let (r, mut w) = stream.into_split();
            let mut r = BufReader::new(r);
            while let Ok(Some(req)) = read_request(&mut r).await {
                let resp = match uapi::parse_request(&req) {
                    Ok(uapi::Request::Get) => uapi::format_get(&gw.uapi_get()),
                    Ok(uapi::Request::Set(s)) => match gw.uapi_set(s).await {
                        Ok(()) => uapi::format_errno(0),
                        Err(e) => {
                            tracing::warn!(error = %e, "uapi set rejected");
                            uapi::format_errno(e.errno)
                        }
                    },
                    Err(e) => {
                        tracing::debug!(error = %e, "bad uapi request");
                        uapi::format_errno(e.errno)
                    }
                };
                if w.write_all(resp.as_bytes()).await.is_err() {
                    break;
                }
            }
        });
    }
}

/// The control protocol of `fabric_gateway_api::control`: one JSON request line, one JSON
/// response line, then the connection is closed.
pub async fn serve_control<F, Fut>(gw: Arc<Gateway>, sock: SocketFile, reload: F)
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<(), ControlError>> + Send,
{
    loop {
        let Ok((stream, _)) = sock.listener.accept().await else {
            continue;
        };
        let gw = gw.clone();
        let reload = reload.clone();
        tokio::spawn(async move {
            let (r, mut w) = stream.into_split();
            let mut line = String::new();
            if BufReader::new(r.take(api::MAX_REQUEST))
                .read_line(&mut line)
                .await
                .is_err()
            {
                return;
            }
            let reply = match Request::from_line(&line) {
                Ok(Request::Status) => Ok(Reply::Status(Box::new(gw.status()))),
                Ok(Request::Reload) => reload().await.map(|()| Reply::Reloaded),
                Ok(Request::Config) => Ok(Reply::Config(gw.running_config().map(Box::new))),
                Err(e) => Err(e),
            };
            match Response::from(reply).to_line() {
                Ok(resp) => {
                    let _ = w.write_all(resp.as_bytes()).await;
                }
                Err(e) => tracing::error!(error = %e, "cannot encode a control response"),
            }
        });
    }
}

/// `/metrics` (Prometheus), on the fabric's shared HTTP server. The full status (peers' keys,
/// endpoints, allowed IPs) is only on the control socket (`fabric-gateway status`): the
/// metrics port is reachable by every pod of the cluster, and through the fabric by peers'.
pub async fn serve_metrics(gw: Arc<Gateway>, listener: TcpListener) {
    fabric_http::serve(
        listener,
        fabric_http::Limits::default(),
        move |path| match path {
            "/metrics" => Some(fabric_http::Reply::ok(
                fabric_http::PROMETHEUS,
                render_metrics(&gw.status()),
            )),
            _ => None,
        },
    )
    .await
}
