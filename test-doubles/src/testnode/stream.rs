//! The kubelet API's streaming requests on the test node, over `fabric-kubelet`'s SPDY:
//! `/exec/NS/POD/CONTAINER?command=...` runs the command in the pod's network namespace with
//! the streams asked for (with `tty`, on a terminal of its own: see `tty`),
//! and `/portForward/NS/POD` connects each request to 127.0.0.1:PORT inside the pod's
//! namespace. Attach is refused: the test node gives its containers no stdin and writes their
//! output to log files, so there is no live stdio to attach to.
use std::{net::SocketAddr, process::Stdio, time::Duration};

use anyhow::Context as _;
use bytes::Bytes;
use fabric_kubelet::{
    frame::Limits,
    portforward::{self, Pairer},
    remotecommand::{self, Options, Status, Streams},
    upgrade,
};
use http_body_util::BodyExt as _;
use hyper::{Request, Response, StatusCode};
use tokio::io::AsyncWriteExt as _;
use tracing::{debug, info, warn};

use super::{pods::LogIndex, server::Body};

/// How long a client has to open the streams it announced (the kubelet's default).
const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);

fn text(code: StatusCode, msg: String) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "text/plain")
        .body(
            http_body_util::Full::new(Bytes::from(msg))
                .map_err(|e| match e {})
                .boxed(),
        )
        .expect("a valid response")
}

fn boxed(r: Response<http_body_util::Full<Bytes>>) -> Response<Body> {
    r.map(|b| b.map_err(|e| match e {}).boxed())
}

/// The pod's network namespace, from any of its running containers.
fn netns_of(logs: &LogIndex, ns: &str, pod: &str, ctr: Option<&str>) -> Option<String> {
    logs.lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .find(|((n, p, c), l)| n == ns && p == pod && ctr.is_none_or(|want| want == c) && l.running)
        .map(|(_, l)| l.netns.clone())
}

pub async fn exec<B: Send + 'static>(
    mut req: Request<B>,
    logs: &LogIndex,
    ns: &str,
    pod: &str,
    ctr: &str,
    query: &str,
) -> Response<Body> {
    let opts = match Options::from_query(query, true) {
        Ok(o) => o,
        Err(e) => return text(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let Some(netns) = netns_of(logs, ns, pod, Some(ctr)) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("container {ctr} of pod {ns}/{pod} is not running on this node"),
        );
    };
    let (_, resp, session) =
        match upgrade::accept(&mut req, remotecommand::PROTOCOLS, Limits::default()) {
            Ok(x) => x,
            Err(r) => return boxed(*r),
        };
    let name = format!("{ns}/{pod}/{ctr}");
    tokio::spawn(async move {
        let mut incoming = match session.await {
            Ok(i) => i,
            Err(e) => return debug!(error = %e, "exec upgrade"),
        };
        let streams = match Streams::collect(&mut incoming, &opts, STREAM_CREATION_TIMEOUT).await {
            Ok(s) => s,
            Err(e) => return warn!(container = name, error = %e, "exec streams"),
        };
        info!(container = name, command = ?opts.command, "exec");
        run(netns, opts, streams).await;
        // Dropping the session sends what is left, then GOAWAY.
        drop(incoming);
    });
    boxed(resp)
}

/// Runs the command with the client's streams and reports its exit status.
async fn run(netns: String, opts: Options, mut s: Streams) {
    if opts.tty {
        return super::tty::run(netns, opts, s).await;
    }
    let mut cmd = tokio::process::Command::new("ip");
    cmd.args(["netns", "exec", &netns])
        .args(&opts.command)
        .stdin(if s.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(if s.stdout.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stderr(if s.stderr.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let _ = s
                .finish(&Status::failure(format!("running {:?}: {e}", opts.command)))
                .await;
            return;
        }
    };
    let mut copies = Vec::new();
    if let (Some(mut from), Some(mut to)) = (s.stdin.take(), child.stdin.take()) {
        // Not waited for: a command that ends without reading its input must not hang on it.
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut from, &mut to).await;
            let _ = to.shutdown().await;
        });
    }
    if let (Some(mut from), Some(mut to)) = (child.stdout.take(), s.stdout.take()) {
        copies.push(tokio::spawn(async move {
            let _ = tokio::io::copy(&mut from, &mut to).await;
            let _ = to.shutdown().await;
        }));
    }
    if let (Some(mut from), Some(mut to)) = (child.stderr.take(), s.stderr.take()) {
        copies.push(tokio::spawn(async move {
            let _ = tokio::io::copy(&mut from, &mut to).await;
            let _ = to.shutdown().await;
        }));
    }
    let status = exit_status(child.wait().await, &opts);
    // All output is sent before the status, as the client expects.
    for c in copies {
        let _ = c.await;
    }
    if let Err(e) = remotecommand::report(s.into_error(), &status).await {
        debug!(error = %e, "reporting the exit status");
    }
}

/// The status to report for a command that ended (or could not be waited for): its exit code,
/// or 128 + the signal that ended it, as a shell says.
pub(super) fn exit_status(
    waited: std::io::Result<std::process::ExitStatus>,
    opts: &Options,
) -> Status {
    match waited {
        Ok(st) => {
            let code = st
                .code()
                .or_else(|| std::os::unix::process::ExitStatusExt::signal(&st).map(|s| 128 + s))
                .unwrap_or(255);
            Status::exit(code)
        }
        Err(e) => Status::failure(format!("waiting for {:?}: {e}", opts.command)),
    }
}

pub fn attach(ns: &str, pod: &str, ctr: &str) -> Response<Body> {
    text(
        StatusCode::BAD_REQUEST,
        format!(
            "attach to {ns}/{pod}/{ctr}: the test node keeps no stdio of its containers (their \
             output is in the logs: kubectl logs -f)"
        ),
    )
}

pub async fn port_forward<B: Send + 'static>(
    mut req: Request<B>,
    logs: &LogIndex,
    ns: &str,
    pod: &str,
) -> Response<Body> {
    let Some(netns) = netns_of(logs, ns, pod, None) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("pod {ns}/{pod} has no running container on this node"),
        );
    };
    let (_, resp, session) =
        match upgrade::accept(&mut req, portforward::PROTOCOLS, Limits::default()) {
            Ok(x) => x,
            Err(r) => return boxed(*r),
        };
    let name = format!("{ns}/{pod}");
    tokio::spawn(async move {
        let mut incoming = match session.await {
            Ok(i) => i,
            Err(e) => return debug!(error = %e, "port-forward upgrade"),
        };
        let mut pairer = Pairer::default();
        loop {
            let pair = match portforward::next_request(&mut incoming, &mut pairer).await {
                Ok(Some(p)) => p,
                Ok(None) => break,
                Err(e) => {
                    warn!(pod = name, error = %e, "port-forward");
                    break;
                }
            };
            let (netns, name) = (netns.clone(), name.clone());
            tokio::spawn(async move {
                let port = pair.port;
                match connect(&netns, port).await {
                    Ok(mut tcp) => {
                        debug!(pod = name, port, request = pair.request_id, "forwarding");
                        let mut p = pair;
                        let _ = tokio::io::copy_bidirectional(&mut p.data, &mut tcp).await;
                        let _ = p.error.shutdown().await;
                    }
                    Err(e) => {
                        let msg = format!("error forwarding port {port} to pod {name}: {e:#}");
                        pair.fail(&msg).await;
                    }
                }
            });
        }
    });
    boxed(resp)
}

/// A TCP connection to 127.0.0.1:`port` inside network namespace `netns` (the socket is made
/// by a thread that entered it, and stays there).
async fn connect(netns: &str, port: u16) -> anyhow::Result<tokio::net::TcpStream> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let h = fabric_netns::spawn_in(netns, move || {
        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .with_context(|| format!("connecting to {addr}"))
    });
    let ns = netns.to_owned();
    let tcp = tokio::task::spawn_blocking(move || fabric_netns::join_as(&ns, h))
        .await
        .context("joining the connecting thread")???;
    tcp.set_nonblocking(true)?;
    Ok(tokio::net::TcpStream::from_std(tcp)?)
}
