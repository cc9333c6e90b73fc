//! Exec and attach over SPDY, protocol `v4.channel.k8s.io`, server side. The query says which
//! streams the client opens ([`Options`]); each stream names itself in its `streamType` header
//! (`error`, `stdin`, `stdout`, `stderr`, `resize`); the outcome goes back as a `metav1.Status`
//! in JSON on the error stream (an exit code as the cause `ExitCode` of reason
//! `NonZeroExitCode`, which is how `kubectl exec` learns it), then everything is closed.
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncWriteExt as _, DuplexStream};

use crate::conn::{Incoming, Stream};

pub const V4: &str = "v4.channel.k8s.io";
/// The protocols served, in preference order (only v4: kubectl and API servers of the last
/// years all offer it).
pub const PROTOCOLS: &[&str] = &[V4];

/// What the client asked for, from the request's query.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Options {
    /// Exec only; repeated `command=` parameters.
    pub command: Vec<String>,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OptionsError {
    #[error("you must specify at least 1 of stdin, stdout, stderr")]
    NoStreams,
    #[error("you must specify at least one command for the container")]
    NoCommand,
}

impl Options {
    /// Parses the query of `/exec/...` (`exec`: a command is required) or `/attach/...`.
    pub fn from_query(query: &str, exec: bool) -> Result<Self, OptionsError> {
        let mut o = Options::default();
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            let on = v == "1" || v.eq_ignore_ascii_case("true");
            match &*k {
                "command" => o.command.push(v.into_owned()),
                "input" | "stdin" => o.stdin = on,
                "output" | "stdout" => o.stdout = on,
                "error" | "stderr" => o.stderr = on,
                "tty" => o.tty = on,
                _ => {}
            }
        }
        // A terminal merges stderr into stdout: there is no stderr stream.
        if o.tty {
            o.stderr = false;
        }
        if !(o.stdin || o.stdout || o.stderr) {
            return Err(OptionsError::NoStreams);
        }
        if exec && o.command.is_empty() {
            return Err(OptionsError::NoCommand);
        }
        if !exec {
            o.command.clear();
        }
        Ok(o)
    }

    /// The stream types the client will open.
    pub fn expected(&self) -> Vec<StreamType> {
        let mut v = vec![StreamType::Error];
        for (on, t) in [
            (self.stdin, StreamType::Stdin),
            (self.stdout, StreamType::Stdout),
            (self.stderr, StreamType::Stderr),
            (self.tty, StreamType::Resize),
        ] {
            if on {
                v.push(t);
            }
        }
        v
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamType {
    Error,
    Stdin,
    Stdout,
    Stderr,
    Resize,
}

impl StreamType {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "error" => Self::Error,
            "stdin" => Self::Stdin,
            "stdout" => Self::Stdout,
            "stderr" => Self::Stderr,
            "resize" => Self::Resize,
            _ => return None,
        })
    }
}

/// A terminal size as the resize stream carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TerminalSize {
    #[serde(rename = "Width")]
    pub width: u16,
    #[serde(rename = "Height")]
    pub height: u16,
}

/// Splits the resize stream (JSON objects one after the other) into sizes.
#[derive(Debug, Default)]
pub struct ResizeDecoder {
    buf: Vec<u8>,
}

/// A resize stream that holds more than this without a complete object is garbage.
const MAX_RESIZE_PENDING: usize = 4096;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ResizeError {
    #[error("the resize stream is not a sequence of terminal sizes")]
    Garbage,
}

impl ResizeDecoder {
    pub fn push(&mut self, data: &[u8]) -> Result<Vec<TerminalSize>, ResizeError> {
        self.buf.extend_from_slice(data);
        let mut out = Vec::new();
        let mut it = serde_json::Deserializer::from_slice(&self.buf).into_iter::<TerminalSize>();
        let consumed = loop {
            match it.next() {
                Some(Ok(s)) => out.push(s),
                Some(Err(e)) if e.is_eof() => break it.byte_offset(),
                Some(Err(_)) => return Err(ResizeError::Garbage),
                None => break it.byte_offset(),
            }
        };
        self.buf.drain(..consumed);
        if self.buf.len() > MAX_RESIZE_PENDING {
            return Err(ResizeError::Garbage);
        }
        Ok(out)
    }
}

/// `metav1.Status`, as much of it as the error stream carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub kind: String,
    pub api_version: String,
    pub metadata: serde_json::Map<String, serde_json::Value>,
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Details>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Details {
    pub causes: Vec<Cause>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cause {
    pub reason: String,
    pub message: String,
}

impl Status {
    fn new(status: &str, reason: &str, message: String, details: Option<Details>) -> Self {
        Status {
            kind: "Status".into(),
            api_version: "v1".into(),
            metadata: Default::default(),
            status: status.into(),
            message,
            reason: reason.into(),
            details,
        }
    }

    pub fn success() -> Self {
        Self::new("Success", "", String::new(), None)
    }

    /// How a command's exit code is reported (0 is success).
    pub fn exit(code: i32) -> Self {
        if code == 0 {
            return Self::success();
        }
        Self::new(
            "Failure",
            "NonZeroExitCode",
            format!("command terminated with non-zero exit code: exit status {code}"),
            Some(Details {
                causes: vec![Cause {
                    reason: "ExitCode".into(),
                    message: code.to_string(),
                }],
            }),
        )
    }

    /// A failure to run at all (no such command, no such container, ...).
    pub fn failure(message: impl Into<String>) -> Self {
        Self::new("Failure", "InternalError", message.into(), None)
    }

    /// The exit code a client derives from this status: 0 for success, the ExitCode cause,
    /// None for other failures.
    pub fn exit_code(&self) -> Option<i32> {
        if self.status == "Success" {
            return Some(0);
        }
        self.details
            .as_ref()?
            .causes
            .iter()
            .find(|c| c.reason == "ExitCode")?
            .message
            .parse()
            .ok()
    }
}

/// The streams of one exec or attach.
#[derive(Debug)]
pub struct Streams {
    pub stdin: Option<DuplexStream>,
    pub stdout: Option<DuplexStream>,
    pub stderr: Option<DuplexStream>,
    /// The raw resize stream (feed it to a [`ResizeDecoder`]).
    pub resize: Option<DuplexStream>,
    error: DuplexStream,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CollectError {
    #[error("timed out waiting for the client's streams ({got} of {want})")]
    Timeout { got: usize, want: usize },
    #[error("the client went away before opening its streams")]
    Gone,
    #[error("stream of unexpected type {0:?}")]
    Unexpected(String),
}

impl Streams {
    /// Waits (at most `timeout`) for the streams `opts` announce.
    pub async fn collect(
        incoming: &mut Incoming,
        opts: &Options,
        timeout: Duration,
    ) -> Result<Streams, CollectError> {
        let want = opts.expected();
        let mut got: Vec<(StreamType, Stream)> = Vec::new();
        let deadline = tokio::time::Instant::now() + timeout;
        while got.len() < want.len() {
            let s = match tokio::time::timeout_at(deadline, incoming.next()).await {
                Err(_) => {
                    return Err(CollectError::Timeout {
                        got: got.len(),
                        want: want.len(),
                    });
                }
                Ok(None) => return Err(CollectError::Gone),
                Ok(Some(s)) => s,
            };
            let name = s.headers.get("streamType").unwrap_or_default().to_owned();
            match StreamType::parse(&name) {
                Some(t) if want.contains(&t) && !got.iter().any(|(g, _)| *g == t) => {
                    got.push((t, s))
                }
                _ => return Err(CollectError::Unexpected(name)),
            }
        }
        let mut take = |t: StreamType| {
            got.iter()
                .position(|(g, _)| *g == t)
                .map(|i| got.swap_remove(i).1.io)
        };
        Ok(Streams {
            stdin: take(StreamType::Stdin),
            stdout: take(StreamType::Stdout),
            stderr: take(StreamType::Stderr),
            resize: take(StreamType::Resize),
            error: take(StreamType::Error).expect("the error stream is always expected"),
        })
    }

    /// Closes the output streams and reports `status` on the error stream.
    pub async fn finish(self, status: &Status) -> std::io::Result<()> {
        finish_error(self.stdout, self.stderr, self.error, status).await
    }

    /// Takes the error stream out, for a handler that moves the others into tasks; report
    /// with [`report`].
    pub fn into_error(self) -> DuplexStream {
        self.error
    }
}

/// Reports `status` on an error stream and closes it.
pub async fn report(mut error: DuplexStream, status: &Status) -> std::io::Result<()> {
    let json = serde_json::to_vec(status).map_err(std::io::Error::other)?;
    error.write_all(&json).await?;
    error.shutdown().await
}

async fn finish_error(
    stdout: Option<DuplexStream>,
    stderr: Option<DuplexStream>,
    error: DuplexStream,
    status: &Status,
) -> std::io::Result<()> {
    for mut s in [stdout, stderr].into_iter().flatten() {
        let _ = s.shutdown().await;
    }
    report(error, status).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_from_queries() {
        let o = Options::from_query(
            "command=sh&command=-c&command=exit%203&input=1&output=1&error=1",
            true,
        )
        .unwrap();
        assert_eq!(o.command, ["sh", "-c", "exit 3"]);
        assert!(o.stdin && o.stdout && o.stderr && !o.tty);
        assert_eq!(
            o.expected(),
            [
                StreamType::Error,
                StreamType::Stdin,
                StreamType::Stdout,
                StreamType::Stderr
            ]
        );
        // A terminal: no stderr, a resize stream.
        let o = Options::from_query(
            "command=sh&stdin=true&stdout=true&stderr=true&tty=true",
            true,
        )
        .unwrap();
        assert_eq!(
            o.expected(),
            [
                StreamType::Error,
                StreamType::Stdin,
                StreamType::Stdout,
                StreamType::Resize
            ]
        );
        assert_eq!(
            Options::from_query("command=ls", true),
            Err(OptionsError::NoStreams)
        );
        assert_eq!(
            Options::from_query("output=1", true),
            Err(OptionsError::NoCommand)
        );
        assert!(
            Options::from_query("output=1&command=x", false)
                .unwrap()
                .command
                .is_empty()
        );
    }

    #[test]
    fn statuses_as_clients_read_them() {
        // What client-go's v4 error decoder parses for an exit code.
        let v = serde_json::to_value(Status::exit(3)).unwrap();
        assert_eq!(v["status"], "Failure");
        assert_eq!(v["reason"], "NonZeroExitCode");
        assert_eq!(v["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(v["details"]["causes"][0]["message"], "3");
        assert_eq!(Status::exit(3).exit_code(), Some(3));
        assert_eq!(
            serde_json::to_value(Status::exit(0)).unwrap(),
            serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"})
        );
        assert_eq!(Status::failure("no such container").exit_code(), None);
        // As the fake kubelet (Go) writes it.
        let go: Status = serde_json::from_str(
            r#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: exit status 7","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"7"}]},"kind":"","apiVersion":""}"#,
        )
        .unwrap();
        assert_eq!(go.exit_code(), Some(7));
    }

    #[test]
    fn resize_stream_split_anywhere() {
        let wire = b"{\"Width\":80,\"Height\":24}\n{\"Width\":120,\"Height\":40}\n";
        for cut in 0..wire.len() {
            let mut d = ResizeDecoder::default();
            let mut got = d.push(&wire[..cut]).unwrap();
            got.extend(d.push(&wire[cut..]).unwrap());
            assert_eq!(
                got,
                [
                    TerminalSize {
                        width: 80,
                        height: 24
                    },
                    TerminalSize {
                        width: 120,
                        height: 40
                    }
                ]
            );
        }
        assert_eq!(
            ResizeDecoder::default().push(b"\"big\""),
            Err(ResizeError::Garbage)
        );
        assert_eq!(
            ResizeDecoder::default()
                .push(&vec![b' '; 5000])
                .map(|v| v.len()),
            Ok(0)
        );
        assert_eq!(
            ResizeDecoder::default().push(&[b"{\"Width\":".as_slice(), &vec![b'1'; 5000]].concat()),
            Err(ResizeError::Garbage)
        );
    }
}
