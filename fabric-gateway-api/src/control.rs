//! The gateway's control protocol: one JSON line each way on the unix socket
//! `<control_dir>/<name>.ctl`, then the gateway closes the connection.
//!
//! ```text
//! → {"request":"status"}
//! ← {"ok":{"status":{"name":"fabric",…}}}
//! → {"request":"reload"}
//! ← {"ok":"reloaded"}      or      {"error":{"kind":"config","message":"…"}}
//! → {"request":"config"}
//! ← {"ok":{"config":{"interface":{…},"peers":[…]}}}      or      {"ok":{"config":null}}
//! ```

use std::{
    fmt,
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{Deserialize, Serialize};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::UnixStream,
};

use crate::status::Status;

/// Longest request line the gateway reads; every request is far shorter.
pub const MAX_REQUEST: u64 = 4096;
/// How long a client waits for an answer by default; a reload of hundreds of peers is well
/// inside it.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The control socket of the gateway named `name` (its `interface.name`) in `dir`.
pub fn socket_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.ctl"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
pub enum Request {
    /// The running gateway's [`Status`].
    Status,
    /// Read the configuration file again and apply what changed.
    Reload,
    /// The configuration the gateway runs: the one it last started or reloaded with, all
    /// of it applied. A restarted operator compares it with what it renders, so that an
    /// unchanged configuration is neither written nor reloaded.
    Config,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Response {
    Ok(Reply),
    Error(ControlError),
}

/// What a request succeeded with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    Status(Box<Status>),
    Reloaded,
    /// None when the last start or reload was not applied in full (what runs is then a mix).
    Config(Option<Box<crate::config::Config>>),
}

/// Why the gateway refused or failed a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct ControlError {
    pub kind: ErrorKind,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// Not a request this gateway understands.
    BadRequest,
    /// The configuration file is unreadable or invalid: nothing was changed.
    Config,
    /// The configuration is valid but the gateway could not apply all of it.
    Apply,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::BadRequest => "bad request",
            Self::Config => "invalid configuration",
            Self::Apply => "applying the configuration failed",
        })
    }
}

impl ControlError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// `error` and its sources, outermost first, as the message.
    pub fn from_error(kind: ErrorKind, error: &(dyn std::error::Error + 'static)) -> Self {
        let mut message = error.to_string();
        let mut source = error.source();
        while let Some(s) = source {
            let text = s.to_string();
            // Errors that print their source themselves would repeat it.
            if !message.ends_with(&text) {
                message.push_str(": ");
                message.push_str(&text);
            }
            source = s.source();
        }
        Self { kind, message }
    }
}

impl Request {
    /// The request as sent: one JSON line.
    pub fn to_line(&self) -> String {
        let mut s = serde_json::to_string(self).expect("a unit variant serializes");
        s.push('\n');
        s
    }

    /// Reads a request line; what is not one is a [`ErrorKind::BadRequest`].
    pub fn from_line(line: &str) -> Result<Self, ControlError> {
        serde_json::from_str(line.trim()).map_err(|e| {
            ControlError::new(
                ErrorKind::BadRequest,
                format!("{:?} is not a control request: {e}", line.trim()),
            )
        })
    }
}

impl Response {
    /// The response as sent: one JSON line.
    pub fn to_line(&self) -> Result<String, serde_json::Error> {
        let mut s = serde_json::to_string(self)?;
        s.push('\n');
        Ok(s)
    }

    pub fn from_line(line: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(line.trim())
    }
}

impl From<Result<Reply, ControlError>> for Response {
    fn from(r: Result<Reply, ControlError>) -> Self {
        match r {
            Ok(reply) => Self::Ok(reply),
            Err(e) => Self::Error(e),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{}: {source} (is the gateway running?)", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no answer on {} within {after:?}", path.display())]
    Timeout { path: PathBuf, after: Duration },
    #[error("unreadable answer on {}: {source}", path.display())]
    Malformed {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{request:?}: {error}")]
    Refused {
        request: Request,
        #[source]
        error: ControlError,
    },
    #[error("{request:?} answered with {reply:?}")]
    Unexpected { request: Request, reply: Box<Reply> },
}

/// Talks to one gateway's control socket; each request is a connection of its own.
#[derive(Debug, Clone)]
pub struct Client {
    path: PathBuf,
    timeout: Duration,
}

impl Client {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The client of the gateway named `name` whose control socket is in `dir`.
    pub fn for_gateway(dir: &Path, name: &str) -> Self {
        Self::new(socket_path(dir, name))
    }

    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub async fn status(&self) -> Result<Status, ClientError> {
        match self.request(Request::Status).await? {
            Reply::Status(s) => Ok(*s),
            reply => Err(ClientError::Unexpected {
                request: Request::Status,
                reply: Box::new(reply),
            }),
        }
    }

    pub async fn reload(&self) -> Result<(), ClientError> {
        match self.request(Request::Reload).await? {
            Reply::Reloaded => Ok(()),
            reply => Err(ClientError::Unexpected {
                request: Request::Reload,
                reply: Box::new(reply),
            }),
        }
    }

    /// The configuration the gateway runs in full (see [`Request::Config`]).
    pub async fn config(&self) -> Result<Option<crate::config::Config>, ClientError> {
        match self.request(Request::Config).await? {
            Reply::Config(c) => Ok(c.map(|c| *c)),
            reply => Err(ClientError::Unexpected {
                request: Request::Config,
                reply: Box::new(reply),
            }),
        }
    }

    /// Sends `request` and waits (at most the timeout) for the answer.
    pub async fn request(&self, request: Request) -> Result<Reply, ClientError> {
        let answer = tokio::time::timeout(self.timeout, self.exchange(request))
            .await
            .map_err(|_| ClientError::Timeout {
                path: self.path.clone(),
                after: self.timeout,
            })?
            .map_err(|source| ClientError::Io {
                path: self.path.clone(),
                source,
            })?;
        match Response::from_line(&answer).map_err(|source| ClientError::Malformed {
            path: self.path.clone(),
            source,
        })? {
            Response::Ok(reply) => Ok(reply),
            Response::Error(error) => Err(ClientError::Refused { request, error }),
        }
    }

    async fn exchange(&self, request: Request) -> std::io::Result<String> {
        let mut s = UnixStream::connect(&self.path).await?;
        s.write_all(request.to_line().as_bytes()).await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use tokio::io::{AsyncBufReadExt, BufReader};

    use super::*;

    fn status() -> Status {
        Status {
            name: "fabric".into(),
            public_key: "pk".into(),
            listen_port: 51820,
            uptime_seconds: 1.5,
            drops: BTreeMap::new(),
            cookie_replies_sent: 0,
            repairs: 0,
            peers: vec![],
            problems: vec![crate::status::Problem::ThreadStopped {
                thread: "fgw-timers".into(),
            }],
        }
    }

    #[test]
    fn the_wire_format_is_stable() {
        assert_eq!(Request::Status.to_line(), "{\"request\":\"status\"}\n");
        assert_eq!(Request::Reload.to_line(), "{\"request\":\"reload\"}\n");
        assert_eq!(
            Response::Ok(Reply::Reloaded).to_line().unwrap(),
            "{\"ok\":\"reloaded\"}\n"
        );
        let e = Response::Error(ControlError::new(ErrorKind::Config, "mtu"));
        assert_eq!(
            e.to_line().unwrap(),
            "{\"error\":{\"kind\":\"config\",\"message\":\"mtu\"}}\n"
        );
        let s = Response::Ok(Reply::Status(Box::new(status())));
        assert_eq!(Response::from_line(&s.to_line().unwrap()).unwrap(), s);
        assert_eq!(Request::Config.to_line(), "{\"request\":\"config\"}\n");
        assert_eq!(
            Response::Ok(Reply::Config(None)).to_line().unwrap(),
            "{\"ok\":{\"config\":null}}\n"
        );
    }

    #[test]
    fn a_running_configuration_crosses_the_wire_unchanged() {
        // A peer with everything a rendered one has, so that the operator's comparison of
        // what it renders with what the gateway runs is not fooled by the encoding.
        let text = r#"
[interface]
name = "fabric"
private_key_file = "/run/fabric/private.key"
listen_port = 51820
mtu = 1420

[[peers]]
name = "cluster-b"
public_key = "dcGFsj+IrOEu7gw0p9y+wFYwusT1g7EmFh5fhfi6UFA="
endpoint = "192.168.77.2:51820"
allowed_ips = ["10.244.0.0/16", "10.99.0.2/32"]
persistent_keepalive = 25
addresses = ["10.99.0.1/32"]
routes = ["10.64.0.0/16"]
probe_address = "10.99.0.2"
id = 1
mss = 1380
remaps = [{ local = "10.64.0.0/16", remote = "10.244.0.0/16" }]
"#;
        let cfg = crate::config::Config::parse(text).unwrap();
        let r = Response::Ok(Reply::Config(Some(Box::new(cfg.clone()))));
        match Response::from_line(&r.to_line().unwrap()).unwrap() {
            Response::Ok(Reply::Config(Some(back))) => assert_eq!(*back, cfg),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn what_is_not_a_request_is_a_bad_request() {
        for line in ["status", "{\"request\":\"shutdown\"}", "", "{}"] {
            let e = Request::from_line(line).unwrap_err();
            assert_eq!(e.kind, ErrorKind::BadRequest, "{line}");
        }
        assert_eq!(
            Request::from_line("{\"request\":\"reload\"}\n").unwrap(),
            Request::Reload
        );
    }

    #[test]
    fn error_messages_carry_their_sources_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] std::io::Error);
        let e = Outer(std::io::Error::other("inner"));
        assert_eq!(
            ControlError::from_error(ErrorKind::Apply, &e).message,
            "outer: inner"
        );
        #[derive(Debug, thiserror::Error)]
        #[error("outer: {0}")]
        struct Repeats(#[source] std::io::Error);
        let e = Repeats(std::io::Error::other("inner"));
        assert_eq!(
            ControlError::from_error(ErrorKind::Apply, &e).message,
            "outer: inner"
        );
    }

    /// A server answering each connection with the reply `answer` gives for its request.
    async fn serve(answer: fn(Request) -> Response) -> (PathBuf, tokio::task::JoinHandle<()>) {
        let dir = std::env::temp_dir().join(format!(
            "fgw-api-ctl-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = socket_path(&dir, "t");
        let _ = std::fs::remove_file(&path);
        let l = tokio::net::UnixListener::bind(&path).unwrap();
        let task = tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                let (r, mut w) = s.into_split();
                let mut line = String::new();
                BufReader::new(r).read_line(&mut line).await.unwrap();
                let resp = match Request::from_line(&line) {
                    Ok(req) => answer(req),
                    Err(e) => Response::Error(e),
                };
                w.write_all(resp.to_line().unwrap().as_bytes())
                    .await
                    .unwrap();
            }
        });
        (path, task)
    }

    #[tokio::test]
    async fn the_client_gets_replies_and_typed_refusals() {
        let (path, task) = serve(|r| match r {
            Request::Status => Response::Ok(Reply::Status(Box::new(status()))),
            Request::Reload => Response::Error(ControlError::new(ErrorKind::Config, "bad mtu")),
            Request::Config => Response::Ok(Reply::Config(None)),
        })
        .await;
        let c = Client::new(&path);
        assert_eq!(c.status().await.unwrap(), status());
        assert_eq!(c.config().await.unwrap(), None);
        match c.reload().await.unwrap_err() {
            ClientError::Refused { request, error } => {
                assert_eq!(request, Request::Reload);
                assert_eq!(error.kind, ErrorKind::Config);
                assert_eq!(error.message, "bad mtu");
            }
            e => panic!("{e}"),
        }
        task.abort();
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[tokio::test]
    async fn a_missing_or_silent_gateway_is_reported() {
        let dir = std::env::temp_dir().join(format!("fgw-api-none-{}", std::process::id()));
        let e = Client::for_gateway(&dir, "nope")
            .status()
            .await
            .unwrap_err();
        assert!(matches!(e, ClientError::Io { .. }), "{e}");
        assert!(e.to_string().contains("is the gateway running"), "{e}");
        std::fs::create_dir_all(&dir).unwrap();
        let path = socket_path(&dir, "silent");
        let _ = std::fs::remove_file(&path);
        let _l = tokio::net::UnixListener::bind(&path).unwrap();
        let e = Client::new(&path)
            .with_timeout(Duration::from_millis(100))
            .status()
            .await
            .unwrap_err();
        assert!(matches!(e, ClientError::Timeout { .. }), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
